"""The demo-pair build's last stage: evaluate the pair and write the two Hub folders with model cards.

Stage `export` of `pacer-hf build-demo-pair` (pacer_hf.recipes.demo_pair): held-out losses, greedy
agreement, decode step costs, oracle draft lengths, then bf16 safetensors, tokenizer, generation config,
corpus_splits.json and a model card (every number from this build's report.json) per model.
"""

from __future__ import annotations

import argparse
import json
import math
import os
from collections import Counter
from pathlib import Path

import torch
import torch.nn.functional as F

from ..costs import cached_forward_timer, interleaved
from ..data.prompts import humaneval_prompts
from .demo_data import SPLITS_FILE, Blocks, load_stage_model, require_stage, update_report


@torch.no_grad()
def heldout_loss(model, blocks: torch.Tensor, batch_size: int = 8) -> float:
    """Mean next-token cross-entropy (nats) over `blocks`."""
    model.eval()
    total, count = 0.0, 0
    for i in range(0, blocks.shape[0], batch_size):
        x = blocks[i : i + batch_size].long()
        logits = model(input_ids=x).logits[:, :-1].float()
        total += F.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1), reduction="sum").item()
        count += x[:, 1:].numel()
    return total / count


@torch.no_grad()
def argmax_agreement(draft, target, blocks: torch.Tensor, batch_size: int = 8) -> float:
    """Fraction of positions where the draft's greedy token equals the target's (teacher-forced on text)."""
    same, count = 0, 0
    for i in range(0, blocks.shape[0], batch_size):
        x = blocks[i : i + batch_size].long()
        same += (draft(input_ids=x).logits.argmax(-1) == target(input_ids=x).logits.argmax(-1)).sum().item()
        count += x.numel()
    return same / count


@torch.no_grad()
def decode_step_ms(model, prompt_len: int = 128, steps: int = 48) -> float:
    """Median time of one single-token forward with a KV cache, batch 1: the call pacer_hf's drafting
    loop makes per draft token, and the call plain decoding makes per target token."""
    model.eval()
    once = cached_forward_timer(model, 1, prompt_len, logits_to_keep=1)
    return 1000 * interleaved({"step": once}, steps, warmup=0)["step"]


def decode_costs(models: dict, rounds: int = 7, steps: int = 32) -> dict[str, float]:
    """Per-model decode step (ms), measured in interleaved rounds; the lowest round median is kept,
    because on a shared CPU the noise (other processes taking the cores) only ever adds time."""
    times: dict[str, list[float]] = {name: [] for name in models}
    for _ in range(rounds):
        for name, model in models.items():
            times[name].append(decode_step_ms(model, steps=steps))
    return {name: min(values) for name, values in times.items()}


@torch.no_grad()
def oracle_lengths(target, draft, tokenizer, prompts: list[str], max_new_tokens: int, cap: int) -> dict:
    """Greedy SD with a fixed draft of `cap` tokens: the accepted count of each round is the oracle
    draft length (stop exactly before the first rejection), capped at `cap`."""
    import pacer_hf

    pacer_hf.enable(target)
    accepted, drafted = [], 0
    for prompt in prompts:
        ids = tokenizer(prompt, return_tensors="pt").input_ids
        target.generate(ids, assistant_model=draft, pacer=f"sd-fixed-{cap}", do_sample=False,
                        max_new_tokens=max_new_tokens)
        stats = pacer_hf.last_stats(target)
        accepted += stats.accepted
        drafted += sum(stats.draft_lengths)
    hist = Counter(accepted)
    return {"cap": cap, "rounds": len(accepted), "mean": round(sum(accepted) / len(accepted), 3),
            "alpha_fixed_cap": round(sum(accepted) / max(drafted, 1), 4),
            "histogram": {str(k): hist[k] for k in range(cap + 1)}}



# ---------------------------------------------------------------------------------------------- export


def stage_export(args: argparse.Namespace, work: Path) -> None:
    """Measure the final pair and write both Hub folders (bf16 safetensors, tokenizer, model cards)."""
    from transformers import AutoTokenizer, GenerationConfig

    tokenizer = AutoTokenizer.from_pretrained(work / "tokenizer")
    for name in ("target", "draft"):
        require_stage(work, name)
    draft_dir = work / ("distill" if (work / "distill" / "final" / "stage.json").exists() else "draft") / "final"
    models = {"target-base": load_stage_model(work / "target-base" / "final"),
              "target": load_stage_model(work / "target" / "final"),
              "draft-ce": load_stage_model(work / "draft" / "final"), "draft": load_stage_model(draft_dir)}
    test = Blocks(work / "data" / "test.pt", args.eval_tokens).blocks
    val = Blocks(work / "data" / "validation.pt", args.eval_tokens).blocks
    losses = {}
    for name, model in models.items():
        lt, lv = heldout_loss(model, test), heldout_loss(model, val)
        losses[name] = {"test_loss": round(lt, 4), "test_ppl": round(math.exp(lt), 2),
                        "validation_loss": round(lv, 4), "validation_ppl": round(math.exp(lv), 2)}
        print(f"[export] {name}: held-out test loss {lt:.4f} (ppl {math.exp(lt):.1f}), validation {lv:.4f}")
    target, draft = models["target"], models["draft"]
    agreement = {n: round(argmax_agreement(models[n], target, test), 4) for n in ("draft-ce", "draft")}
    timing = {n: round(ms, 3) for n, ms in decode_costs({n: models[n] for n in ("target", "draft")}).items()}
    timing["c"] = round(timing["draft"] / timing["target"], 4)
    print(f"[export] decode step ms {timing}, greedy agreement on test text {agreement}")
    prompts = humaneval_prompts(args.eval_prompts)
    oracle = oracle_lengths(target, draft, tokenizer, prompts, args.eval_new_tokens, args.oracle_cap)
    print(f"[export] oracle draft lengths: {oracle}")
    stages = {n: json.loads((work / n / "final" / "stage.json").read_text())
              for n in ("target-base", "target", "draft", "distill") if (work / n / "final" / "stage.json").exists()}
    report = update_report(work, {"losses": losses, "argmax_agreement_test_text": agreement,
                                   "decode_step_ms": timing, "oracle": oracle, "stages": stages,
                                   "torch_threads": torch.get_num_threads(), "command": args.command_line})
    out = Path(args.out)
    splits = json.loads((work / SPLITS_FILE).read_text())
    for role, model in (("target", target), ("draft", draft)):
        folder = out / f"demo-{role}"
        folder.mkdir(parents=True, exist_ok=True)
        model.to(torch.bfloat16).save_pretrained(folder, safe_serialization=True)
        model.to(torch.float32)
        tokenizer.save_pretrained(folder)
        gen = GenerationConfig(bos_token_id=tokenizer.eos_token_id, eos_token_id=tokenizer.eos_token_id,
                               pad_token_id=tokenizer.eos_token_id, do_sample=False)
        if role == "draft":  # HF's assisted generation reads these from the draft: set explicitly
            gen.num_assistant_tokens = 20
            gen.num_assistant_tokens_schedule = "constant"
            gen.assistant_confidence_threshold = 0.4
        gen.save_pretrained(folder)
        (folder / SPLITS_FILE).write_text(json.dumps({k: splits[k] for k in ("train", "validation", "test")}, indent=0))
        (folder / "README.md").write_text(model_card(role, model, report))
    print(f"[export] wrote {out / 'demo-target'} and {out / 'demo-draft'}")


def model_card(role: str, model, report: dict) -> str:
    """A Hub model card whose every number comes from this build's report.json."""
    cfg = model.config
    params = sum(p.numel() for p in model.parameters())
    key = "target" if role == "target" else "draft"
    loss = report["losses"][key]
    stages = report["stages"]
    trained = ["target-base", "target"] if role == "target" else [s for s in ("draft", "distill") if s in stages]
    tokens = sum(stages[s]["tokens_seen"] for s in trained)
    minutes = sum(stages[s]["training_seconds"] for s in trained) / 60
    data = report["data"]
    yaml = "\n".join([
        "---", "library_name: transformers", "license: apache-2.0", "pipeline_tag: text-generation",
        "tags:", "- pacer_hf", "- speculative-decoding", f"- demo-{role}",
        "datasets:", "- python-stdlib-3.11 (local, see corpus_splits.json)",
        "model-index:", f"- name: pacer_hf-demo-{role}", "  results:", "  - task: {type: text-generation}",
        "    dataset: {name: python stdlib held-out files, type: local}",
        "    metrics:", f"    - {{type: loss, value: {loss['test_loss']}}}",
        f"    - {{type: perplexity, value: {loss['test_ppl']}}}",
        "---", ""])
    rows = "\n".join(f"| {s} | {stages[s]['params']:,} | {stages[s]['steps_done']} | {stages[s]['tokens_seen']:,} | "
                     f"{stages[s]['training_seconds'] / 60:.1f} | {stages[s]['train_loss']} |" for s in trained)
    other = "draft" if role == "target" else "target"
    device = stages[trained[0]].get("device", "cpu")
    hardware = f"{os.cpu_count()}-core CPU, fp32, {stages[trained[0]].get('torch_threads')} torch thread(s) per process" \
        if device == "cpu" else "CUDA GPU, bf16 mixed precision"
    return yaml + f"""# pacer_hf demo {role}

The {role} half of pacer_hf's embedded demo pair: a Llama-architecture model ({cfg.num_hidden_layers} layers,
width {cfg.hidden_size}, {params:,} parameters, vocabulary {cfg.vocab_size}) trained from scratch on this
machine's Python {'.'.join(map(str, __import__('sys').version_info[:2]))} standard library. Its partner is `demo-{other}`
(same tokenizer). It exists so that `pacer-hf demo` runs speculative decoding on a real pair offline; it is a
toy, not a useful code model.

- Data: {data['train']['files']} training files ({data['train']['tokens']:,} tokens); split by file from the
  SHA-256 of the relative path; `corpus_splits.json` lists every split. Test suites and data-like modules are excluded.
- Tokenizer: byte-level BPE, {cfg.vocab_size} tokens, trained on the training files only.
- Training: {tokens:,} tokens in {minutes:.1f} min of wall time ({hardware}, `transformers.Trainer`).
- Held-out loss (test files, nats/token): {loss['test_loss']} (perplexity {loss['test_ppl']});
  validation {loss['validation_loss']} (perplexity {loss['validation_ppl']}).
- Pair: target {report['losses']['target']['test_loss']} vs draft {report['losses']['draft']['test_loss']};
  decode step target {report['decode_step_ms']['target']} ms, draft {report['decode_step_ms']['draft']} ms
  (c = {report['decode_step_ms']['c']}); greedy agreement on test text {report['argmax_agreement_test_text']['draft']};
  mean oracle draft length {report['oracle']['mean']} (cap {report['oracle']['cap']}).

| stage | parameters | steps | tokens | minutes | mean train loss (distill: 0.7 KL + 0.3 CE) |
|---|---|---|---|---|---|
{rows}

Rebuilt with:

```
{report['command']}
```

Load with `AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)`.
"""
