"""Stage `onpolicy` of `pacer-hf build-demo-pair`: fit the demo draft to the demo target on the target's own text.

DistillSpec's recipe on the stdlib pair: the target writes greedy and T = 1 continuations of TRAIN-split
prompts (with its top-k log-probabilities at every step), and the draft is trained on them (soft top-k
cross-entropy + cross-entropy on the target's token) under a wall-clock budget. The draft then agrees with
the target where the loop actually queries it, along the target's own path, and acceptance ranges from
nothing to long runs: the variation a stop rule exploits.

Steps (each resumable: results under WORK/onpolicy/ are appended or checkpointed and picked up again):
  responses   greedy answers, then T = 1 answers, batched (`smollm2_draft.stage_responses`)
  train       the draft (all its weights) distilled on them (`smollm2_draft_train.stage_train`)
  measure     held-out greedy agreement along the target's greedy path on HumanEval prompts (never trained
              on), mean accepted tokens per round at gamma = 8, c = draft step / target step
  ship        the best draft in bf16 to OUT/demo-draft with a card whose numbers come from `measure`

Prompts come from files the benchmark never draws from: windows, function signatures + docstrings and literal
tables of the TRAIN split, and `def test_` windows of stdlib test suites outside the benchmark's tenth.
The models are the work dir's `target` and `distill` stages when they exist, else the shipped demo pair in
OUT (so the stage can re-fit the shipped draft without rebuilding the target).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
from pathlib import Path

import torch

from ..pairs import load_demo_pair
from .demo_onpolicy_card import draft_card
from .ship_preverifier import train_calibrate_ship

WORK_SUBDIR = "onpolicy"
REPORT = "report.json"


def onpolicy_prompts(tokenizer, splits_file: Path, n: int, prompt_tokens: int = 256, seed: int = 0,
                     root: Path | None = None) -> list[tuple[str, str, list[int]]]:
    """(key, category, prompt ids) of `n` prompts shaped like the benchmark's categories, from files it never
    uses: 40 % docstring prompts and 10 % literal tables of TRAIN-split files, 30 % windows of TRAIN-split
    files (64..prompt_tokens tokens), 20 % `def test_` windows of test suites outside the benchmark's tenth."""
    import sysconfig

    from ..data.prompts import boilerplate_texts, docstring_texts, stdlib_test_files

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    root = Path(root or stdlib)
    train = [root / rel for rel in json.loads(Path(splits_file).read_text())["train"]]
    benchmarked = set(stdlib_test_files())
    tests = [p for p in sorted((stdlib / "test").glob("test_*.py")) if p not in benchmarked]
    rng = random.Random(seed)
    if n // 4 < len(train):  # few prompts (a smoke build): read a sample of the files only
        train, tests = rng.sample(train, max(4, n // 4)), rng.sample(tests, min(len(tests), max(4, n // 4)))

    def encoded(category: str, texts: list[tuple[str, str]], count: int) -> list[tuple[str, str, list[int]]]:
        rng.shuffle(texts)
        out = []
        for key, text in texts:
            ids = tokenizer(text)["input_ids"][-prompt_tokens:]
            if len(ids) >= 24:
                out.append((f"{category}/{key}", category, ids))
            if len(out) == count:
                break
        return out

    windows = []
    for path in train:
        ids = tokenizer(path.read_text(encoding="utf-8", errors="replace"))["input_ids"]
        for _ in range(max(1, len(ids) // 2000)):
            if len(ids) > prompt_tokens + 64:
                length = rng.randrange(64, prompt_tokens + 1)
                start = rng.randrange(0, len(ids) - length - 32)
                windows.append((f"{path.relative_to(root).as_posix()}@{start}", ids[start:start + length]))
    rng.shuffle(windows)
    test_windows = [t for t in boilerplate_texts(tests) if not t[0].split(":")[0].startswith("_")]
    tables = [t for t in boilerplate_texts(train)]
    out = encoded("docstring", docstring_texts(train), int(0.4 * n))
    out += encoded("tables", tables, int(0.1 * n))
    out += encoded("tests", test_windows, int(0.2 * n))
    out += [(f"window/{key}", "window", ids) for key, ids in windows[: n - len(out)]]
    seen: dict[str, int] = {}
    for i, (key, category, ids) in enumerate(out):  # two functions of one name in one file: keys stay unique
        seen[key] = seen.get(key, 0) + 1
        if seen[key] > 1:
            out[i] = (f"{key}#{seen[key]}", category, ids)
    return out


def load_models(args: argparse.Namespace, work: Path):
    """(target, starting draft, tokenizer, source): the work dir's trained stages, else the shipped pair in
    args.out. The starting draft is saved to WORK/onpolicy/start on first use and read from there afterwards,
    so a rerun after shipping starts from the same draft (not from the shipped, already fitted one)."""

    from .demo_data import load_stage_model

    target, draft, tokenizer, source = _load_pair(args, work)
    start = work / WORK_SUBDIR / "start"
    if (start / "config.json").is_file():
        draft, source = load_stage_model(start).eval(), f"{source} (starting draft from {start})"
    else:
        draft.save_pretrained(start)
    return target, draft, tokenizer, source


def _load_pair(args: argparse.Namespace, work: Path):
    from transformers import AutoTokenizer

    from .demo_data import load_stage_model

    if (work / "target" / "final").is_dir():
        draft_stage = "distill" if (work / "distill" / "final").is_dir() else "draft"
        target, draft = load_stage_model(work / "target" / "final"), load_stage_model(work / draft_stage / "final")
        return target.eval(), draft.eval(), AutoTokenizer.from_pretrained(work / "tokenizer"), f"{work}/{{target,{draft_stage}}}"
    out = Path(args.out)
    for role in ("target", "draft"):
        if not (out / f"demo-{role}" / "config.json").is_file():
            raise FileNotFoundError(f"Stage onpolicy needs the pair: neither {work}/target/final nor {out}/demo-{role} "
                                    "exists. Run the earlier stages first (--stage all) or pass --out with a built pair.")
    target, draft, tokenizer = load_demo_pair(out)
    return target, draft, tokenizer, f"{out}/demo-{{target,draft}}"


def splits_file(args: argparse.Namespace, work: Path) -> Path:
    """The pair's corpus split: the work dir's when it built the pair, else the shipped target's."""
    from .demo_data import SPLITS_FILE

    return work / SPLITS_FILE if (work / SPLITS_FILE).is_file() else Path(args.out) / "demo-target" / SPLITS_FILE


def stage_responses(args: argparse.Namespace, work: Path, target, tokenizer) -> None:
    from .smollm2_draft import stage_responses as generate

    folder = work / WORK_SUBDIR
    splits = splits_file(args, work)
    prompts = onpolicy_prompts(tokenizer, splits, args.onpolicy_prompts, seed=args.seed, root=Path(args.corpus_root))
    budget = 60 * args.onpolicy_generate_minutes
    start = time.perf_counter()
    generate(target, tokenizer, prompts, folder, max_new_tokens=args.onpolicy_new_tokens, batch_size=32,
             top_k=32, budget_s=budget * 2 / 3)
    sampled = prompts[::3]  # a third of the prompts again, sampled at T = 1
    generate(target, tokenizer, sampled, folder, max_new_tokens=args.onpolicy_new_tokens, batch_size=32, top_k=32,
             budget_s=max(0.0, budget - (time.perf_counter() - start)), do_sample=True)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The stage's options (part of `pacer-hf build-demo-pair`)."""
    parser.add_argument("--onpolicy-prompts", type=int, default=3000, help="TRAIN-split prompts the target answers")
    parser.add_argument("--onpolicy-new-tokens", type=int, default=128, help="answer length cap")
    parser.add_argument("--onpolicy-generate-minutes", type=float, default=14,
                        help="wall-clock budget for the answers (2/3 greedy, then T = 1 answers of a third of the prompts)")
    parser.add_argument("--onpolicy-train-minutes", type=float, default=15, help="0 skips the stage")
    parser.add_argument("--onpolicy-lr", type=float, default=1e-3)
    parser.add_argument("--onpolicy-eval-prompts", type=int, default=40, help="HumanEval prompts for the measurements")
    parser.add_argument("--preverifier-max-tokens", type=int, default=12, help="drafted tokens per round in the traces")
    parser.add_argument("--preverifier-epochs", type=float, default=8)
    parser.add_argument("--calibrate-threads", type=int, default=1,
                        help="torch threads while the pre-verifier's costs are measured (as the demo runs)")


def stage_train(args: argparse.Namespace, work: Path, target, draft) -> Path:
    from .smollm2_draft import RESPONSES, SAMPLED_RESPONSES
    from .smollm2_draft_train import stage_train as distil

    return distil(target, work / WORK_SUBDIR, draft=draft, files=(RESPONSES, SAMPLED_RESPONSES),
                  budget_s=60 * args.onpolicy_train_minutes, checkpoint_every=120.0, lr=args.onpolicy_lr,
                  accumulate=8, seed=args.seed, eval_records=120)


@torch.no_grad()
def measure(target, draft, tokenizer, prompts: int = 40, new_tokens: int = 128, cap: int = 8) -> dict:
    """What the issue's targets name, on HumanEval prompts (code the pair never trained on): greedy agreement
    of the draft along the target's own greedy path (teacher-forced), mean accepted draft tokens per round of
    fixed length `cap`, the decode step costs and c (interleaved rounds, lowest median)."""
    from ..data.prompts import humaneval_prompts
    from ..training.fit_data import answer_batch
    from .demo_export import decode_costs, oracle_lengths
    from .smollm2_draft_train import agreement

    texts = humaneval_prompts(prompts)
    ids = [tokenizer(t)["input_ids"] for t in texts]
    eos = {tokenizer.eos_token_id}
    answers = []
    for i in range(0, len(ids), 8):
        answers += answer_batch(target, ids[i:i + 8], new_tokens, tokenizer.eos_token_id, eos, False, top_k=1)
    records = [{"prompt": p, **a} for p, a in zip(ids, answers) if a["response"]]
    timing = {k: round(v, 3) for k, v in decode_costs({"target": target, "draft": draft}).items()}
    return {"prompts": f"HumanEval/0..{prompts - 1}", "new_tokens": new_tokens,
            "agreement_greedy_path": round(agreement(draft, records), 4),
            "rounds_at_cap": oracle_lengths(target, draft, tokenizer, texts[:max(1, prompts // 2)], new_tokens, cap),
            "decode_step_ms": timing, "c": round(timing["draft"] / timing["target"], 4),
            "torch_threads": torch.get_num_threads()}


def stage_onpolicy(args: argparse.Namespace, work: Path) -> None:
    """The stage: responses, train, measure before/after, ship (each step skipped when its result exists)."""
    import shutil

    from transformers import AutoModelForCausalLM, GenerationConfig

    from .demo_data import SPLITS_FILE, load_stage_model
    from .smollm2_draft import RESPONSES, SAMPLED_RESPONSES
    from .smollm2_draft_train import read_records

    if args.onpolicy_train_minutes <= 0:
        print("[onpolicy] skipped (--onpolicy-train-minutes 0)")
        return
    folder = work / WORK_SUBDIR
    target, draft, tokenizer, source = load_models(args, work)
    print(f"[onpolicy] pair: {source}", flush=True)
    stage_responses(args, work, target, tokenizer)
    best = stage_train(args, work, target, draft)
    report_path = folder / REPORT
    report = json.loads(report_path.read_text()) if report_path.is_file() else {}
    sizes = {"prompts": args.onpolicy_eval_prompts, "new_tokens": args.onpolicy_new_tokens}
    if "before" not in report:
        report["before"] = measure(target, draft, tokenizer, **sizes)
    fitted = load_stage_model(best).eval()
    report["after"] = measure(target, fitted, tokenizer, **sizes)
    records = {name: read_records(folder / name) for name in (RESPONSES, SAMPLED_RESPONSES)}
    history = json.loads((best.parent / "history.json").read_text())["history"]
    report.update({
        "source": source, "command": args.command_line, "history": history,
        "data": {name: {"answers": len(rs), "tokens": sum(len(r["response"]) for r in rs),
                        "held_out_answers": sum(r["heldout"] for r in rs)} for name, rs in records.items()},
        "train_minutes": args.onpolicy_train_minutes, "lr": args.onpolicy_lr,
        "parameters": sum(p.numel() for p in fitted.parameters())})
    report_path.write_text(json.dumps(report, indent=1))
    print(f"[onpolicy] before {json.dumps(report['before'])}\n[onpolicy] after {json.dumps(report['after'])}", flush=True)
    out = Path(args.out) / "demo-draft"
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    fitted.to(torch.bfloat16).save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    generation = GenerationConfig(bos_token_id=tokenizer.eos_token_id, eos_token_id=tokenizer.eos_token_id,
                                  pad_token_id=tokenizer.eos_token_id, do_sample=False, num_assistant_tokens=20,
                                  num_assistant_tokens_schedule="constant", assistant_confidence_threshold=0.4)
    generation.save_pretrained(tmp)  # HF's assisted generation reads these from the draft: set explicitly
    splits = splits_file(args, work)
    shutil.copy(splits, tmp / SPLITS_FILE)
    (tmp / "README.md").write_text(draft_card(report))
    AutoModelForCausalLM.from_pretrained(tmp)  # loads before it replaces anything
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)
    print(f"[onpolicy] wrote {out}")


def stage_preverifier(args: argparse.Namespace, work: Path) -> None:
    """A pre-verifier for the fitted draft: traces along the target's greedy answers with the loop's state
    (`collect_along_answers`; held-out answers apart), `train_preverifier` (Trainer), then costs measured on this
    machine and the stop rule chosen on the held-out traces (`calibrate_preverifier`); written to
    OUT/demo-preverifier with its card. Each step is skipped when its result exists."""
    from ..training.collect import read_manifest
    from ..training.collect_answers import collect_along_answers
    from .smollm2_draft import RESPONSES
    from .smollm2_draft_train import read_records

    folder = work / WORK_SUBDIR
    out = Path(args.out)
    target, draft, _ = load_demo_pair(out)  # the fitted draft the onpolicy stage shipped
    records = read_records(folder / RESPONSES)
    traces = {}
    for split, rows in (("train", [r for r in records if not r["heldout"]]), ("heldout", [r for r in records if r["heldout"]])):
        path = folder / f"traces-{split}"
        manifest = read_manifest(path) if (path / "manifest.json").is_file() else {}
        if not manifest.get("complete"):
            collect_along_answers(draft, rows, path, max_draft_tokens=args.preverifier_max_tokens,
                                  source=f"{folder / RESPONSES} ({split})", draft_name=str(out / "demo-draft"),
                                  target_name=str(out / "demo-target"), overwrite=True)
        traces[split] = path
    _train_and_ship(args, target, draft, traces, folder / "preverifier", out / "demo-preverifier", (
        "python-stdlib (local; the demo target's greedy answers to TRAIN-split prompts, decoded round by round "
        "with the fitted demo draft, see docs/DEMO_PAIR.md)"))


def stage_preverifier_sampling(args: argparse.Namespace, work: Path) -> None:
    """The same for sampling (T = 1): rounds of the fitted draft sampled at positions of the target's T = 1 answers
    and their prompts, each drafted token labelled with its acceptance probability min(1, p/q) by one batched target
    forward (`collect`, soft labels), Trainer, costs and the stop rule as above; written to
    OUT/demo-preverifier-sampling (`config.decoding == "sampling"`). A pre-verifier trained on greedy rounds
    predicts greedy agreement, which a sampled token rarely has though the target often accepts it."""
    from ..training.collect import CollectConfig, collect
    from .smollm2_draft import SAMPLED_RESPONSES
    from .smollm2_draft_train import read_records

    folder = work / WORK_SUBDIR
    out = Path(args.out)
    target, draft, _ = load_demo_pair(out)
    records = [r for r in read_records(folder / SAMPLED_RESPONSES) if r["response"]]
    config = CollectConfig(max_draft_tokens=args.preverifier_max_tokens, temperature=1.0, positions_per_text=8,
                           min_prefix=16, context=256, batch_size=32, shard_size=256, seed=args.seed)
    heldout = [r for r in records if r["heldout"]] or records[::10]  # a smoke build may sample no held-out prompt
    held = {id(r) for r in heldout}
    traces = {}
    for split, chosen in (("train", [r for r in records if id(r) not in held]), ("heldout", heldout)):
        rows = [r["prompt"] + r["response"] for r in chosen]
        traces[split] = collect(target, draft, folder / f"traces-sampled-{split}", token_ids=rows, config=config,
                                source=f"{folder / SAMPLED_RESPONSES} ({split})", draft_name=str(out / "demo-draft"),
                                target_name=str(out / "demo-target"))
    _train_and_ship(args, target, draft, traces, folder / "preverifier-sampling", out / "demo-preverifier-sampling", (
        "python-stdlib (local; rounds of the fitted demo draft sampled at T = 1 inside the demo target's T = 1 "
        "answers to TRAIN-split prompts, labelled by the target, see docs/DEMO_PAIR.md)"))


def _train_and_ship(args: argparse.Namespace, target, draft, traces: dict, trained: Path, shipped: Path,
                    dataset: str) -> None:
    train_calibrate_ship(target, draft, traces, trained, shipped, dataset, draft_name="hub_cards/demo-draft",
                         target_name="hub_cards/demo-target", epochs=args.preverifier_epochs, seed=args.seed,
                         threads=args.calibrate_threads)  # costs as `pacer-hf demo` and the benchmark run
