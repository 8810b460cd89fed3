"""The draft of `pacer-hf build-draft` (module `smollm2_draft`): building it from the target, distilling
it on the target's own answers, measuring it and shipping it.

The draft is a plain `LlamaForCausalLM` of the target's width: the target's embedding (tied to the
`lm_head`, so the full vocabulary and exact token ids), a few of the target's layers (copied, then
trained) and the target's final norm. Embedding and head stay frozen (they are the target's); the
layers and the norm are trained on teacher-forced (prompt, answer) records against the target's top-k
log-probabilities (soft cross-entropy) plus cross-entropy on the target's greedy token.
"""

from __future__ import annotations

import json
import math
import os
import random
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from .smollm2_draft_card import write_card

TRAIN_DIR = "train"
CHECKPOINT = "checkpoint.pt"
BEST = "best"
CONTEXT = 512  # prompt tokens the draft sees in training (at their real positions); evaluation: all
LAYER_CANDIDATES = ((0, 1, 2), (0, 1, 29), (0, 28, 29))


def build_draft(target, layers: list[int]):
    """A Llama draft: the target's embedding (tied head), its `layers` (copied, in order) and final norm."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig.from_dict(target.config.to_dict())
    config.num_hidden_layers = len(layers)
    config.tie_word_embeddings = True
    if getattr(config, "layer_types", None) is not None:
        config.layer_types = [config.layer_types[i] for i in layers]
    config.name_or_path = ""
    config.architectures = ["LlamaForCausalLM"]
    draft = LlamaForCausalLM(config)
    source = target.state_dict()
    state = {"model.embed_tokens.weight": source["model.embed_tokens.weight"],
             "model.norm.weight": source["model.norm.weight"]}
    for i, layer in enumerate(layers):
        prefix = f"model.layers.{layer}."
        state.update({f"model.layers.{i}.{k[len(prefix):]}": v for k, v in source.items() if k.startswith(prefix)})
    missing, unexpected = draft.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    draft.tie_weights()
    draft.generation_config.eos_token_id = target.generation_config.eos_token_id
    draft.generation_config.pad_token_id = target.generation_config.pad_token_id
    return draft.float().eval()


def example(record: dict, context: int = CONTEXT):
    """(input ids, position ids, number of leading context-only tokens, top ids, top log-probs, greedy
    tokens) of one record, the prompt cut to its last `context` tokens (kept at their real positions).
    Positions from the prompt's last token on predict the answer's tokens."""
    prompt, response = record["prompt"], record["response"]
    cut = max(0, len(prompt) - context)
    ids = torch.tensor(prompt[cut:] + response[:-1])
    positions = torch.arange(cut, cut + len(ids))
    return (ids[None], positions[None], len(prompt) - cut - 1, torch.tensor(record["top_ids"]),
            torch.tensor(record["top_logp"]), torch.tensor(response))


def draft_logp(draft, ids, positions, lead: int):
    """Log-probs of the positions after the first `lead` tokens; those are run without gradient into a
    KV cache (a third of their cost: the context still shapes attention, only their own K/V get no
    gradient)."""
    from .._hf_compat import CACHE_KWARG, new_cache

    cache = new_cache(draft.config)
    if lead:
        with torch.no_grad():
            draft.model(input_ids=ids[:, :lead], position_ids=positions[:, :lead], use_cache=True,
                        **{CACHE_KWARG: cache})
    hidden = draft.model(input_ids=ids[:, lead:], position_ids=positions[:, lead:], use_cache=True,
                         **{CACHE_KWARG: cache}).last_hidden_state[0]
    return draft.lm_head(hidden).float().log_softmax(-1)  # the head module: int8 and vocabulary-subset heads too


def loss_of(draft, batch) -> tuple[torch.Tensor, int, int]:
    """(soft top-k cross-entropy + greedy-token cross-entropy, agreeing positions, positions)."""
    ids, positions, lead, top_ids, top_logp, greedy = batch
    logp = draft_logp(draft, ids, positions, lead)
    soft = top_logp.softmax(-1)  # the target's top-k, renormalized
    loss = -(soft * logp.gather(-1, top_ids)).sum(-1).mean() + F.nll_loss(logp, greedy)
    return loss, int((logp.argmax(-1) == greedy).sum()), len(greedy)


@torch.no_grad()
def agreement(draft, records: list[dict], context: int = 1 << 20) -> float:
    """Greedy agreement: how often the draft's top-1 is the target's greedy token, teacher-forced on the
    target's answers with their whole prompts (all positions of all records)."""
    hits = total = 0
    for record in records:
        ids, positions, lead, _, _, greedy = example(record, context)
        hits += int((draft_logp(draft, ids, positions, lead).argmax(-1) == greedy).sum())
        total += len(greedy)
    return hits / max(total, 1)


def split_records(work: Path, files: tuple[str, ...] = ("responses.jsonl",)) -> tuple[list[dict], list[dict]]:
    """(training, held-out) records of the answer files in `work` that exist (the first one must)."""
    records = [r for name in files for r in read_records(work / name) if len(r["response"]) > 0]
    if not records:
        raise FileNotFoundError(f"{work / files[0]} holds no answers; run the responses stage first.")
    return [r for r in records if not r["heldout"]], [r for r in records if r["heldout"]]


def choose_layers(target, work: Path, candidates=LAYER_CANDIDATES, trial_s: float = 150.0,
                  schedule_s: float = 1800.0, **kwargs) -> Path:
    """Train a draft from each candidate layer set for `trial_s` seconds (work/trial-<layers>/, resumable),
    then move the one with the best held-out agreement to work/train/ so training continues from it.
    Returns work/train. Skipped when work/train/ exists."""
    final = work / TRAIN_DIR
    if (final / CHECKPOINT).is_file():
        return final
    scores = {}
    for layers in candidates:
        name = "trial-" + "-".join(map(str, layers))
        stage_train(target, work, layers=list(layers), budget_s=trial_s, checkpoint_every=trial_s,
                    schedule_s=schedule_s, subdir=name, **kwargs)
        scores[name] = max(h["agreement"] for h in json.loads((work / name / "history.json").read_text())["history"])
    print("trial agreement by layer set: " + ", ".join(f"{k} {v:.3f}" for k, v in scores.items()), flush=True)
    winner = max(scores, key=scores.get)
    (work / winner / "trials.json").write_text(json.dumps({"trial_s": trial_s, "agreement": scores}, indent=1))
    os.replace(work / winner, final)
    return final


def _save_atomic(obj, path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def stage_train(target, work: Path, *, layers: list[int] | None = None, budget_s: float = 1800.0,
                checkpoint_every: float = 240.0, lr: float = 3e-4, accumulate: int = 4, seed: int = 0,
                eval_records: int = 80, progress: bool = True, schedule_s: float | None = None,
                subdir: str = TRAIN_DIR, draft=None, files: tuple[str, ...] = ("responses.jsonl",)) -> Path:
    """Distil a draft on the answers in `files` (in `work`) for `budget_s` seconds of training (over restarts:
    the checkpoint keeps the elapsed time), checkpointing and evaluating every `checkpoint_every` seconds.
    The draft is built from the target's `layers` (a checkpoint's layer set wins; embedding and head frozen),
    or is a copy of `draft` with every weight trained. The learning rate warms up over 30 steps, then decays
    linearly to 10% at `schedule_s` (default `budget_s`) seconds. Returns the folder of the best draft."""
    from tqdm.auto import tqdm

    out = work / subdir
    out.mkdir(parents=True, exist_ok=True)
    schedule_s = schedule_s or budget_s
    train_records, heldout = split_records(work, files)
    heldout = heldout[:eval_records]
    draft, layers, whole, params, optimizer, state = _start(target, out, layers, draft, lr, train_records, heldout)
    order = list(range(len(train_records)))
    random.Random(seed + state["epoch"]).shuffle(order)
    draft.train()
    bar = tqdm(total=round(budget_s / 60, 1), initial=round(state["elapsed"] / 60, 1), unit="min", desc="train",
               disable=not progress, dynamic_ncols=True, bar_format="{l_bar}{bar}| {n:.1f}/{total:.1f} min {postfix}")
    since_ckpt, mark = 0.0, time.perf_counter()
    running, hits, seen = None, 0, 0
    while state["elapsed"] < budget_s:
        frac = min(1.0, state["elapsed"] / schedule_s)
        for group in optimizer.param_groups:
            group["lr"] = lr * min(1.0, (state["step"] + 1) / 30) * (1.0 - 0.9 * frac)
        total_loss = 0.0
        for _ in range(accumulate):
            if state["cursor"] >= len(order):
                state["epoch"], state["cursor"] = state["epoch"] + 1, 0
                random.Random(seed + state["epoch"]).shuffle(order)
            loss, agree, count = loss_of(draft, example(train_records[order[state["cursor"]]]))
            (loss / accumulate).backward()
            state["cursor"] += 1
            total_loss += loss.item() / accumulate
            hits, seen = hits + agree, seen + count
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        state["step"] += 1
        running = total_loss if running is None else 0.95 * running + 0.05 * total_loss
        now = time.perf_counter()
        state["elapsed"] += now - mark
        since_ckpt += now - mark
        mark = now
        bar.n = round(min(state["elapsed"], budget_s) / 60, 1)
        bar.set_postfix_str(f"step {state['step']} ep {state['epoch']} loss {running:.3f} "
                            f"train-agree {hits / max(seen, 1):.3f} best {state['best']:.3f}")
        bar.refresh()
        if since_ckpt >= checkpoint_every or state["elapsed"] >= budget_s:
            score = _evaluate(draft, heldout, state, hits / max(seen, 1), running)
            hits = seen = 0
            _save_checkpoint(draft, optimizer, state, out, layers, whole, score)
            tqdm.write(f"[{state['elapsed'] / 60:.1f} min] step {state['step']} held-out agreement {score:.3f} "
                       f"(best {state['best']:.3f})")
            since_ckpt, mark = 0.0, time.perf_counter()  # evaluation time is not training time
    bar.close()
    return out / BEST


def _start(target, out: Path, layers: list[int] | None, draft, lr: float, train_records: list[dict],
           heldout: list[dict]):
    """(draft, layers, whole, trained parameters, optimizer, state) of `stage_train`: resumed from out's checkpoint
    when there is one, else a fresh draft (built from `layers`, or a copy of `draft` trained whole) scored once."""
    import copy

    ckpt_path = out / CHECKPOINT
    state = torch.load(ckpt_path, weights_only=False) if ckpt_path.is_file() else None
    if draft is not None:
        draft, layers = copy.deepcopy(draft).float(), None
    elif state is not None:
        layers = state["layers"]
    elif layers is None:
        raise ValueError(f"{ckpt_path} does not exist: pass layers= (or run choose_layers first).")
    whole = draft is not None
    draft = draft if whole else build_draft(target, layers)
    for name, param in draft.named_parameters():
        param.requires_grad_(whole or name.startswith("model.layers.") or name == "model.norm.weight")
    params = [p for p in draft.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.0, betas=(0.9, 0.98))
    if state is None:
        state = {"layers": layers, "elapsed": 0.0, "step": 0, "epoch": 0, "cursor": 0, "best": -1.0,
                 "history": [{"elapsed": 0.0, "step": 0, "agreement": agreement(draft, heldout)}],
                 "records": len(train_records)}
        state["best"] = state["history"][0]["agreement"]
        draft.save_pretrained(out / BEST)
        print(f"layers {layers}: held-out agreement before training {state['best']:.3f} "
              f"({len(train_records)} training / {len(heldout)} held-out answers)", flush=True)
    else:
        draft.load_state_dict(state["model"], strict=False)
        optimizer.load_state_dict(state["optimizer"])
        print(f"resumed at {state['elapsed']:.0f} s, step {state['step']}, best agreement {state['best']:.3f}",
              flush=True)
    return draft, layers, whole, params, optimizer, state


def _evaluate(draft, heldout: list[dict], state: dict, train_agreement: float, running: float) -> float:
    """Held-out agreement now (the draft back in training mode after), appended to the state's history."""
    draft.eval()
    score = agreement(draft, heldout)
    draft.train()
    state["history"].append({"elapsed": round(state["elapsed"], 1), "step": state["step"],
                             "epoch": state["epoch"], "agreement": score,
                             "train_agreement": train_agreement, "loss": running})
    return score


def _save_checkpoint(draft, optimizer, state: dict, out: Path, layers: list[int] | None, whole: bool,
                     score: float) -> None:
    """out/best when `score` beats the best so far, then the checkpoint (trained weights, optimizer) and history."""
    if score > state["best"]:
        state["best"] = score
        draft.save_pretrained(out / BEST)
    state["model"] = {k: v for k, v in draft.state_dict().items() if whole or k.startswith("model.layers.")
                      or k == "model.norm.weight"}
    state["optimizer"] = optimizer.state_dict()
    _save_atomic(state, out / CHECKPOINT)
    (out / "history.json").write_text(json.dumps({"layers": layers, "history": state["history"]}, indent=1))


# -- measuring and shipping ----------------------------------------------------------------------------------


def median(values):
    values = sorted(values)
    return values[len(values) // 2]


def step_costs(target, draft, repeats: int = 30, context: int = 128) -> dict:
    """Median ms of a draft step (pacer_hf's drafting forward) and of target forwards of 1 and 4 tokens."""
    from ..costs import cached_forward_timer, interleaved
    from ..loops.draft_forwards import draft_step_timer

    timers = {"draft_ms": draft_step_timer(draft, context), "target_ms": cached_forward_timer(target, 1, context),
              "verify4_ms": cached_forward_timer(target, 4, context)}
    out = {k: round(1000 * v, 2) for k, v in interleaved(timers, repeats, warmup=3, reduce=median).items()}
    out["c"] = round(out["draft_ms"] / out["target_ms"], 3)
    return out


def end_to_end(target, draft, prompts: list[list[int]], max_new_tokens: int = 64,
               strategies=("sd-fixed-2", "sd-fixed-3")) -> dict:
    """tokens/s of plain greedy decoding and of each strategy (each prompt once per strategy, interleaved, after
    a warm-up; min_new_tokens = max_new_tokens), every output checked equal to plain greedy decoding."""
    from ..training.validate import compare_in_generate

    rows = compare_in_generate(target, draft, prompts, {s: s for s in strategies}, runs=1,
                               max_new_tokens=max_new_tokens, warmup=True, min_new_tokens=max_new_tokens)
    result = {"ar": {"tok_s": round(rows["ar"]["tokens_per_s"], 2)}}
    for s in strategies:
        result[s] = {"tok_s": round(rows[s]["tokens_per_s"], 2), "tau": round(rows[s]["tau"], 3),
                     "alpha": round(rows[s]["alpha"], 3), "speedup": round(rows[s]["vs_ar"], 3)}
    return result


def check_shipped(target, folder: Path, prompts: list[list[int]], max_new_tokens: int = 24):
    """Load `folder` as a draft of `target` and assert greedy generation with it equals the target alone."""
    from transformers import AutoModelForCausalLM

    import pacer_hf

    from ..generate_checks import check_vocabularies

    draft = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    check_vocabularies(target, draft, "the shipped draft must use the target's vocabulary")
    pacer_hf.enable(target)
    for prompt in prompts:
        ids = torch.tensor([prompt])
        kwargs = dict(max_new_tokens=max_new_tokens, do_sample=False)
        reference = target.generate(ids, **kwargs)
        for strategy in ("sd-fixed-2", "sd-fixed-3"):
            if not torch.equal(target.generate(ids, assistant_model=draft, pacer=strategy, **kwargs), reference):
                raise AssertionError(f"greedy output with the shipped draft ({strategy}) differs from the target's")
        if not torch.equal(target.generate(ids, assistant_model=draft, **kwargs), reference):
            raise AssertionError("greedy output with the shipped draft (transformers' assisted decoding) differs")
    return draft


def stage_ship(target, tokenizer, work: Path, out: Path, *, prompts: list[list[int]] | None = None,
               command: dict | None = None, measure: bool = True, max_new_tokens: int = 64) -> Path:
    """Save the best draft in bf16 with the tokenizer to `out` (via a temporary folder), check it loads and
    is exact, measure it (step cost c, end to end on `prompts`) and write the model card."""
    import shutil

    from transformers import AutoModelForCausalLM

    best = work / TRAIN_DIR / BEST
    history = json.loads((work / TRAIN_DIR / "history.json").read_text())
    if prompts is None:
        from ..data.chat_prompts import chat_prompts

        prompts = [list(chat_prompts(tokenizer, c, split="bench", n=1)[0].ids)
                   for c in ("chat-humaneval", "chat-rewrite", "chat-summarize")]
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    draft = AutoModelForCausalLM.from_pretrained(best, dtype=torch.bfloat16)
    draft.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    loaded = check_shipped(target, tmp, prompts)
    measured = {"agreement": history, "size_mb": round(sum(p.stat().st_size for p in tmp.iterdir()) / 2**20, 1),
                "parameters": sum(p.numel() for p in loaded.parameters()), "command": command}
    if measure:
        measured["costs"] = step_costs(target, loaded)
        measured["end_to_end"] = end_to_end(target, loaded, prompts, max_new_tokens)
    (work / "measured.json").write_text(json.dumps(measured, indent=1))
    write_card(tmp / "README.md", measured)
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)
    print(json.dumps({k: v for k, v in measured.items() if k != "agreement"}, indent=1), flush=True)
    return out


def training_minutes(history: list[dict]) -> float:
    return math.ceil(10 * max(h["elapsed"] for h in history) / 60) / 10


def read_records(path: Path) -> list[dict]:
    """The complete records of a responses file (a torn last line from a killed run is ignored)."""
    records = []
    if path.is_file():
        with path.open() as handle:
            for line in handle:
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError:
                    break
    return records
