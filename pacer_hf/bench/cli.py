"""`pacer-hf bench`: argument parsing and the command's flow (validate everything, then load, run, write)."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from .prompts import CATEGORIES, check_categories
from .strategies import available_strategy_names, resolve_strategies

REPO_ROOT = Path(__file__).resolve().parents[2]
DEMO = {"target": REPO_ROOT / "hub_cards" / "demo-target", "draft": REPO_ROOT / "hub_cards" / "demo-draft",
        "preverifier": REPO_ROOT / "hub_cards" / "demo-preverifier"}
QUICK = {"prompts": 2, "runs": 1, "max_new_tokens": 32, "prompt_tokens": 128, "cost_repeats": 15}
FULL = {"prompts": 6, "runs": 3, "max_new_tokens": 128, "prompt_tokens": 256, "cost_repeats": 30}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    pair = parser.add_argument_group("pair (default: the shipped demo pair in hub_cards/)")
    pair.add_argument("--target", help="target model folder or Hub id (default hub_cards/demo-target)")
    pair.add_argument("--draft", help="draft model folder or Hub id (default hub_cards/demo-draft)")
    pair.add_argument("--preverifier", help="pre-verifier folder (default hub_cards/demo-preverifier if present)")
    pair.add_argument("--tokenizer", help="tokenizer folder (default: the target's)")
    pair.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16", "float64"])
    what = parser.add_argument_group("what to run")
    what.add_argument("--strategies", help="comma-separated names (default: all available); "
                      "'sd-fixed' / 'hf-fixed' sweep γ = 1..8; see --list-strategies")
    what.add_argument("--categories", default=",".join(CATEGORIES), help=f"comma-separated, of {', '.join(CATEGORIES)}")
    what.add_argument("--temperatures", default="0,1", help="comma-separated; 0 = greedy (default 0,1)")
    what.add_argument("--prompts", type=int, help="prompts per category (quick 2, full 6)")
    what.add_argument("--runs", type=int, help="timed runs (quick 1, full 3)")
    what.add_argument("--max-new-tokens", type=int, help="tokens generated per prompt (quick 32, full 128)")
    what.add_argument("--prompt-tokens", type=int, help="prompts keep their last N tokens (quick 128, full 256)")
    what.add_argument("--heldout-files", help="text file listing held-out source files (one path per line)")
    what.add_argument("--threads", type=int, help="torch.set_num_threads (default: physical cores)")
    what.add_argument("--seed", type=int, default=0)
    what.add_argument("--quick", action="store_true", help="few prompts, one run, a few γ: under 5 minutes on a CPU")
    out = parser.add_argument_group("output")
    out.add_argument("--out", default="bench-results", help="results folder (default ./bench-results)")
    out.add_argument("--overwrite", action="store_true", help="replace results (and a hand-written docs file)")
    out.add_argument("--write-docs", nargs="?", const="docs/BENCHMARKS.md", metavar="PATH",
                     help="also generate docs/BENCHMARKS.md (or PATH) from the results")
    out.add_argument("--report-only", action="store_true",
                     help="do not run: regenerate results.md, plots and (with --write-docs) the docs from --out")
    out.add_argument("--no-plots", action="store_true")
    out.add_argument("--list-strategies", action="store_true", help="print the available strategy names and exit")
    out.add_argument("--no-progress", action="store_true")


def _command(args: argparse.Namespace) -> str:
    if Path(sys.argv[0]).name in ("pacer-hf", "cli.py") and "bench" in sys.argv:
        return shlex.join(["pacer-hf", *sys.argv[1:]])
    skip = {"command", "_module"}
    parts = ["pacer-hf", "bench"]
    for key, value in vars(args).items():
        if key in skip or value in (None, False) or (key == "categories" and value == ",".join(CATEGORIES)):
            continue
        flag = "--" + key.replace("_", "-")
        parts += [flag] if value is True else [flag, str(value)]
    return shlex.join(parts)


def _split(text: str | None) -> list[str] | None:
    return [t.strip() for t in text.split(",") if t.strip()] if text else None


def run(args: argparse.Namespace) -> int:
    from . import report

    if args.list_strategies:
        print("\n".join(available_strategy_names()))
        return 0
    try:
        if args.report_only:
            records, meta = report.load_results(args.out)
            print(f"wrote {report.write_markdown(records, meta, Path(args.out))}")
            if not args.no_plots:
                from .plots import draft_length_histograms, speedup_bars

                speedup_bars(records, Path(args.out))
                draft_length_histograms(records, Path(args.out))
            if args.write_docs:
                print(f"wrote {report.write_docs(records, meta, args.out, args.write_docs, args.overwrite)}")
            return 0
        return _run(args, report)
    except (ValueError, FileExistsError, FileNotFoundError) as error:
        print(f"pacer-hf bench: error: {error}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace, report) -> int:
    import torch
    import transformers

    import pacer_hf

    from ..training.common import check_pair, load_causal_lm, load_tokenizer
    from .prompts import build_prompts
    from .runner import BenchConfig, BenchmarkMismatch, run_benchmark

    preset = QUICK if args.quick else FULL
    categories = check_categories(_split(args.categories) or [])
    temperatures = tuple(float(t) for t in _split(args.temperatures) or ["0"])
    if any(t < 0 for t in temperatures):
        raise ValueError("--temperatures must be >= 0 (0 = greedy).")
    if args.target is None and args.draft is None:
        missing = [str(DEMO[k]) for k in ("target", "draft") if not DEMO[k].is_dir()]
        if missing:
            raise ValueError(f"The demo pair is not there yet ({', '.join(missing)} missing); pass --target and "
                             "--draft (and --tokenizer if the target folder has none).")
        target_path, draft_path = str(DEMO["target"]), str(DEMO["draft"])
        preverifier_path = args.preverifier or (str(DEMO["preverifier"]) if DEMO["preverifier"].is_dir() else None)
    elif args.target is None or args.draft is None:
        raise ValueError("Pass both --target and --draft (or neither, for the demo pair).")
    else:
        target_path, draft_path, preverifier_path = args.target, args.draft, args.preverifier
    strategies = _split(args.strategies)
    resolve_strategies(strategies or ["ar"], preverifier_path is not None)  # name errors before any loading
    report.check_out_dir(args.out, args.overwrite)
    if args.write_docs:
        docs = Path(args.write_docs)
        if docs.exists() and not args.overwrite and not docs.read_text().startswith(report.DOCS_MARKER):
            raise FileExistsError(f"{docs} exists and was not generated by `pacer-hf bench`; pass --overwrite.")

    transformers.logging.set_verbosity_error()  # HF's per-round deprecation notes would drown the progress bar
    target = load_causal_lm(target_path, args.dtype)
    draft = load_causal_lm(draft_path, args.dtype)
    tokenizer = load_tokenizer(args.tokenizer or target_path)
    check_pair(target, draft, tokenizer)
    preverifier = pacer_hf.load_preverifier(preverifier_path).to(draft.dtype) if preverifier_path else None
    config = BenchConfig(
        strategies=strategies, categories=categories, temperatures=temperatures,
        prompts_per_category=args.prompts or preset["prompts"], runs=args.runs or preset["runs"],
        max_new_tokens=args.max_new_tokens or preset["max_new_tokens"],
        prompt_tokens=args.prompt_tokens or preset["prompt_tokens"], threads=args.threads, seed=args.seed,
        quick=args.quick, cost_repeats=preset["cost_repeats"],
    )
    limit = getattr(target.config, "max_position_embeddings", None)
    if limit and config.prompt_tokens + config.max_new_tokens > limit:
        raise ValueError(f"--prompt-tokens + --max-new-tokens = {config.prompt_tokens + config.max_new_tokens} "
                         f"exceeds the target's max_position_embeddings ({limit}).")

    def encode(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    prompts, origin = build_prompts(categories, encode, config.prompts_per_category, config.prompt_tokens,
                                    args.heldout_files, target_path)
    try:
        result = run_benchmark(target, draft, prompts, config, preverifier=preverifier,
                               progress=not args.no_progress)
    except BenchmarkMismatch as error:
        print(f"pacer-hf bench: FAILED: {error}", file=sys.stderr)
        return 1
    result.meta.update(command=_command(args), heldout_origin=origin,
                       pair={"target": target_path, "draft": draft_path, "preverifier": preverifier_path},
                       dtype=str(torch.tensor([], dtype=target.dtype).dtype))
    written = report.write_outputs(result, args.out, overwrite=args.overwrite, plots=not args.no_plots)
    print(f"wrote {', '.join(str(p) for p in written)}")
    if args.write_docs:
        records, meta = report.load_results(args.out)
        print(f"wrote {report.write_docs(records, meta, args.out, args.write_docs, overwrite=True)}")
    print((Path(args.out) / "results.md").read_text())
    return 0
