"""Where a Pacer round's time goes on a CUDA GPU: the demo pair, one greedy call per setting under torch.profiler.

    python scripts/gpu_profile_round.py --out profile.json     # the GPU lane runs it (scripts/gpu_check.sh)
    python scripts/gpu_profile_round.py --device cpu           # the same on the CPU (the compiled scorer there)

For Pacer (its pre-verifier on the device, the CUDA-graph scoring path), Pacer with the eager torch scoring
(PACER_HF_CUDA_GRAPHS=0) and sd-fixed-6 it records per call: wall seconds, new tokens, rounds, the stop rule's
own seconds (`last_stats(...).preverifier_seconds`) and its share, and the profiler's top operators by host time.
Each setting is warmed up first (graph capture and cost probes happen there), then timed over `--repeats` calls.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch

import pacer_hf
from pacer_hf.costs import synchronize
from pacer_hf.pairs import load_pair

PROMPT = "def parse_args(argv):\n    parser = argparse.ArgumentParser("


def run(pair, device: torch.device, strategy: str, graphs: bool, repeats: int, tokens: int) -> dict:
    os.environ["PACER_HF_CUDA_GRAPHS"] = "1" if graphs else "0"
    inputs = pair.tokenizer(PROMPT, return_tensors="pt").to(device)

    def call():
        return pair.target.generate(**inputs, assistant_model=pair.draft, pacer=strategy, do_sample=False,
                                    max_new_tokens=tokens)

    call()  # warm-up: captures, probes, kernels
    walls, shares = [], []
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        call()
        synchronize(device)
        wall = time.perf_counter() - start
        stats = pacer_hf.last_stats(pair.target)
        walls.append(wall)
        shares.append(stats.preverifier_seconds / wall)
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as profile:
        call()
    stats = pacer_hf.last_stats(pair.target)
    table = profile.key_averages().table(sort_by="self_cpu_time_total", row_limit=15)
    return {"strategy": strategy, "cuda_graphs": graphs, "wall_s_median": statistics.median(walls),
            "tokens_per_s": stats.new_tokens / statistics.median(walls), "rounds": len(stats.draft_lengths),
            "mean_draft": statistics.mean(stats.draft_lengths) if stats.draft_lengths else 0.0,
            "preverifier_share_median": statistics.median(shares), "top_ops": table}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--out", help="write the records as JSON here")
    args = parser.parse_args()
    device = torch.device(args.device)
    pair = load_pair("stdlib")
    pair.target.to(device)
    pair.draft.to(device)
    pacer_hf.attach(pair.draft, pair.preverifier.to(device))  # greedy calls only: the greedy pre-verifier
    settings = [("pacer", True), ("pacer", False), ("sd-fixed-6", True)]
    records = [run(pair, device, strategy, graphs, args.repeats, args.max_new_tokens) for strategy, graphs in settings]
    for record in records:
        head = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in record.items() if k != "top_ops"}
        print(json.dumps(head))
        print(record["top_ops"])
    if args.out:
        with open(args.out, "w") as handle:
            json.dump({"device": str(device), "gpu": torch.cuda.get_device_name(0) if device.type == "cuda" else None,
                       "records": records}, handle, indent=1)


if __name__ == "__main__":
    main()
