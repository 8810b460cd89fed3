"""PEARL on this machine: real draft/target overlap vs the same generator run sequentially.

    python examples/pearl_overlap.py                      # synthetic 8x512 target + 1-layer draft
    python examples/pearl_overlap.py --pair demo          # the shipped demo pair, HumanEval prompts
    python examples/pearl_overlap.py --pair tiny          # the tiny pair in runs/tiny (scripts/train_tiny_pair.py builds it)
    python examples/pearl_overlap.py --pair tiny --pacer-pearl --pv runs/tiny/runs/pv
    python examples/pearl_overlap.py --repeats 5 --gammas 3,auto --out docs/pearl_overlap.json

Methods, interleaved per repeat (rotating order), greedy, same prompts: the target alone,
sd-fixed-<g> for a few g (best reported), PEARL with each worker in --workers (`@process`: the
forked worker process, the CPU default; `@thread`: a worker thread) and PEARL sequential (same
generator, same gamma, job run in the caller's thread) for a few gammas, the same with
`resync_tokens`, and optionally pacer+pearl. Prints medians and saves
JSON with every run, the machine load (`uptime`) before and after, and PEARL's modelled time
(sum over rounds of max(draft job, target window) + serial overhead, from the sequential runs).

The synthetic pair makes the target expensive but predictable by the draft: the draft is the
target's first layer (same embeddings, final norm and head); the target's other layers have their
residual outputs scaled by --residual-scale, which sets how often the two agree.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import threading
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

import pacer_hf
from pacer_hf import PearlConfig
from pacer_hf._hf_compat import CACHE_KWARG, output_cache
from pacer_hf.strategies import StrategyConfig
from pacer_hf.strategies.pearl import measure_gamma


def synthetic_pair(layers: int, hidden: int, residual_scale: float, seed: int = 0):
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=1024, hidden_size=hidden, intermediate_size=int(hidden * 2.6875),
                         num_hidden_layers=layers, num_attention_heads=8, num_key_value_heads=8,
                         max_position_embeddings=2048, initializer_range=0.05, bos_token_id=None,
                         eos_token_id=None, pad_token_id=None)
    target = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for layer in target.model.layers[1:]:
            layer.self_attn.o_proj.weight.mul_(residual_scale)
            layer.mlp.down_proj.weight.mul_(residual_scale)
    draft_config = LlamaConfig(**{**config.to_dict(), "num_hidden_layers": 1})
    draft = LlamaForCausalLM(draft_config).eval()
    state = {k: v for k, v in target.state_dict().items() if ".layers." not in k or ".layers.0." in k}
    missing, unexpected = draft.load_state_dict(state, strict=False)
    assert not missing and not unexpected, (missing, unexpected)
    prompts = [torch.randint(0, 1024, (1, 16), generator=torch.Generator().manual_seed(100 + i)) for i in range(8)]
    return target, draft, prompts


def tiny_pair(root: Path):
    target = AutoModelForCausalLM.from_pretrained(root / "target").eval()
    draft = AutoModelForCausalLM.from_pretrained(root / "draft").eval()
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(root / "tokenizer")
    lines = [line for line in (root / "heldout.txt").read_text().splitlines() if line.strip()]
    prompts = [tokenizer(line, return_tensors="pt").input_ids[:, :24] for line in lines[:8]]
    return target, draft, prompts


def demo_pair(folder: Path):
    """The shipped demo pair and HumanEval prompts (what the PEARL issue reports on)."""
    from pacer_hf.data.prompts import humaneval_prompts
    from pacer_hf.pairs import load_demo_pair

    target, draft, tokenizer = load_demo_pair(folder)
    prompts = [tokenizer(text, return_tensors="pt", add_special_tokens=False).input_ids for text in humaneval_prompts(8)]
    return target, draft, prompts


@torch.no_grad()
def _forward_loop(model, steps: int, tokens: int, seconds: list[float], threads: int | None = None) -> None:
    if threads is not None:
        torch.set_num_threads(threads)
    cache = output_cache(model(torch.arange(32)[None], use_cache=True))
    step = torch.arange(tokens)[None]
    start = time.perf_counter()
    for _ in range(steps):
        model(step, use_cache=True, **{CACHE_KWARG: cache})
        cache.crop(32 - cache.get_seq_length())
    seconds.append(time.perf_counter() - start)


def capacity(target, draft, gamma: int, steps: int = 10) -> dict:
    """Does the machine give us a second core right now? Target verify steps and gamma*steps draft
    steps, alone and then concurrently (draft on a worker thread): parallelism = (alone sum) / concurrent."""
    alone_t, alone_d, conc_t, conc_d = [], [], [], []
    _forward_loop(target, steps, gamma, alone_t)
    _forward_loop(draft, gamma * steps, 1, alone_d)
    worker = threading.Thread(target=_forward_loop, args=(draft, gamma * steps, 1, conc_d, 1))
    start = time.perf_counter()
    worker.start()
    _forward_loop(target, steps, gamma, conc_t)
    worker.join()
    wall = time.perf_counter() - start
    return {"target_alone_s": alone_t[0], "draft_alone_s": alone_d[0], "concurrent_wall_s": wall,
            "target_concurrent_s": conc_t[0], "draft_concurrent_s": conc_d[0],
            "parallelism": (alone_t[0] + alone_d[0]) / wall}


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def run(target, draft, prompts, pacer, new_tokens: int, eos_free: dict) -> dict:
    tokens, seconds, stats = 0, 0.0, []
    for ids in prompts:
        start = time.perf_counter()
        out = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                              min_new_tokens=new_tokens, do_sample=False, assistant_model=None if pacer is None
                              else draft, pacer=pacer, **eos_free)
        seconds += time.perf_counter() - start
        tokens += out.shape[1] - ids.shape[1]
        last = pacer_hf.last_stats(target) if pacer is not None else None
        stats.append(last.to_dict() if last is not None else None)
    return {"tokens": tokens, "seconds": seconds, "tok_s": tokens / seconds, "stats": stats}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pair", choices=["synthetic", "tiny", "demo"], default="synthetic",
                        help="demo: the shipped hub_cards pair on HumanEval prompts")
    parser.add_argument("--demo-folder", type=Path, default=Path(__file__).resolve().parents[1] / "hub_cards")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--residual-scale", type=float, default=0.05)
    parser.add_argument("--tiny-root", type=Path, default=Path("runs/tiny"))
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads of the caller (target)")
    parser.add_argument("--gammas", default="3,5,auto", help="PEARL gammas ('auto' = measured step-time ratio)")
    parser.add_argument("--fixed", default="2,4,6", help="sd-fixed gammas to compare")
    parser.add_argument("--resync", type=int, default=2, help="also run PEARL with resync_tokens=N (0: skip)")
    parser.add_argument("--pacer-pearl", action="store_true", help="also run pacer+pearl")
    parser.add_argument("--pv", default=None, help="pre-verifier for pacer+pearl (default: an untrained one)")
    parser.add_argument("--workers", default="process,thread", help="PEARL draft workers to compare")
    parser.add_argument("--out", type=Path, default=Path("pearl_overlap.json"))
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    if args.pair == "synthetic":
        target, draft, prompts = synthetic_pair(args.layers, args.hidden, args.residual_scale)
    elif args.pair == "demo":
        target, draft, prompts = demo_pair(args.demo_folder)
    else:
        target, draft, prompts = tiny_pair(args.tiny_root)
    prompts = prompts[: args.prompts]
    pacer_hf.enable(target)
    eos_free = {"eos_token_id": None, "pad_token_id": 0} if args.pair == "synthetic" else {}
    auto = measure_gamma(target, draft)
    gammas = sorted({auto if g == "auto" else int(g) for g in args.gammas.split(",")})
    workers = args.workers.split(",")
    methods: dict[str, str | StrategyConfig | None] = {"target": None}

    def add(name: str, **options) -> None:  # one sequential method plus one per worker
        methods[f"{name}-seq"] = PearlConfig(parallel=False, **options)
        for worker in workers:
            methods[f"{name}@{worker}"] = PearlConfig(worker=worker, **options)

    for g in gammas:
        add(f"pearl-{g}", gamma=g)
        if args.resync:
            add(f"pearl-{g}-resync", gamma=g, resync_tokens=args.resync)
    methods.update({f"sd-fixed-{g}": f"sd-fixed-{g}" for g in map(int, args.fixed.split(","))})
    if args.pacer_pearl:
        from pacer_hf import PacerPreVerifier

        torch.manual_seed(0)
        pv = (pacer_hf.load_preverifier(args.pv) if args.pv else
              PacerPreVerifier.from_draft(draft, block_size=2, threshold=0.5, max_draft_tokens=2 * auto)).eval()
        pacer_hf.attach(draft, pv)
        add("pacer+pearl", gamma=max(auto, pv.config.max_draft_tokens), use_preverifier=True)

    print(f"pair={args.pair} auto gamma={auto} threads={args.threads} | {uptime()}")
    cap_before = capacity(target, draft, auto)
    print(f"machine parallelism now (target+draft forwards, thread): {cap_before['parallelism']:.2f}x")
    for pacer in methods.values():  # warm-up: allocator, first-call paths
        run(target, draft, prompts[:1], pacer, 8, eos_free)
    load = [uptime()]
    runs: dict[str, list[dict]] = {name: [] for name in methods}
    names = list(methods)
    for rep in range(args.repeats):
        order = names[rep % len(names):] + names[: rep % len(names)]
        for name in order:
            runs[name].append(run(target, draft, prompts, methods[name], args.new_tokens, eos_free))
        load.append(uptime())
        print(f"repeat {rep + 1}/{args.repeats}: " + ", ".join(f"{n} {runs[n][-1]['tok_s']:.1f}" for n in names))
    cap_after = capacity(target, draft, auto)

    summary = {}
    for name in names:
        rates = [r["tok_s"] for r in runs[name]]
        summary[name] = {"median_tok_s": statistics.median(rates), "min": min(rates), "max": max(rates)}
        stats = [s for r in runs[name] for s in r["stats"] if s]
        if stats:
            summary[name]["tau"] = sum(s["new_tokens"] for s in stats) / sum(s["target_forwards"] for s in stats)
    for name in names:  # perfect-overlap model and real overlap of each parallel method vs its sequential twin
        if not name.endswith("-seq"):
            continue
        modelled = [sum(s["new_tokens"] for s in r["stats"]) / sum(s["modelled_seconds"] for s in r["stats"])
                    for r in runs[name]]
        for worker in workers:
            par = f"{name.removesuffix('-seq')}@{worker}"
            overlap = [s["seconds"] / p["seconds"] for p, s in zip(runs[par], runs[name])]
            par_stats = [s for r in runs[par] for s in r["stats"]]
            summary[par].update({
                "modelled_tok_s": statistics.median(modelled),
                "real_overlap_per_repeat": overlap,
                "real_overlap_median": statistics.median(overlap),
                "wait_fraction": sum(s["wait_seconds"] for s in par_stats) / sum(s["seconds"] for s in par_stats),
                "jobs_kept_fraction": sum(s["jobs_kept"] for s in par_stats) / max(1, sum(s["jobs"] for s in par_stats)),
            })
    target_rate = summary["target"]["median_tok_s"]
    fixed = {n: v for n, v in summary.items() if n.startswith("sd-fixed")}
    best_fixed = max(fixed, key=lambda n: fixed[n]["median_tok_s"])
    result = {
        "machine": {"platform": platform.platform(), "processor": platform.processor(), "cpus": os.cpu_count(),
                    "torch": torch.__version__, "threads": args.threads, "load": load},
        "command": "python examples/pearl_overlap.py " + " ".join(os.sys.argv[1:]),
        "pair": args.pair, "auto_gamma": auto, "new_tokens": args.new_tokens, "prompts": len(prompts),
        "capacity": [cap_before, cap_after],
        "summary": summary,
        "best_fixed": best_fixed,
        "runs": runs,
    }
    args.out.write_text(json.dumps(result, indent=1))
    print(f"\n{'method':<26}{'tok/s':>7}{'min':>7}{'max':>7}{'x tgt':>7}{'tau':>6}{'overlap':>9}{'modelled':>9}"
          f"{'kept':>6}")
    for name in names:
        row = summary[name]
        extra = (f"{row['real_overlap_median']:9.2f}{row['modelled_tok_s']:9.1f}{row['jobs_kept_fraction']:6.2f}"
                 if "modelled_tok_s" in row else "")
        print(f"{name:<26}{row['median_tok_s']:7.1f}{row['min']:7.1f}{row['max']:7.1f}"
              f"{row['median_tok_s'] / target_rate:7.2f}{row.get('tau', 1.0):6.2f}{extra}")
    print("\noverlap = sequential time / parallel time of the same generator (median over repeats); modelled = "
          "tok/s with perfect overlap, from the sequential runs' per-round timings")
    print(f"machine parallelism (forward loops alone vs concurrent) before/after: {cap_before['parallelism']:.2f}x / "
          f"{cap_after['parallelism']:.2f}x | best sd-fixed: {best_fixed} | {uptime()}\nsaved {args.out}")


if __name__ == "__main__":
    main()
