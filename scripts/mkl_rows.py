"""Time torch's float32 linear layer for a few rows, at the Qwen2.5-Coder-1.5B target's shapes, under whichever MKL
path this process runs (`pacer_hf.costs.blas`): what a verify of k tokens pays per weight matrix.

    OMP_NUM_THREADS=1 python scripts/mkl_rows.py --out docs/benchmarks/mkl_path/rows_generic.json
    LD_PRELOAD=$(pacer-hf mkl-shim --print-path) OMP_NUM_THREADS=1 python scripts/mkl_rows.py \\
        --out docs/benchmarks/mkl_path/rows_intel_path.json

Interleaved: every row count of a shape is timed once per pass, the median over passes kept.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

from pacer_hf.costs import cpu_name
from pacer_hf.costs.blas import cpu_vendor, mkl_code_path

# (rows of the weight, its input width): attention q/o, k/v, MLP gate/up, MLP down, the output head
SHAPES = {"q_o": (1536, 1536), "k_v": (256, 1536), "gate_up": (8960, 1536), "down": (1536, 8960),
          "head": (151936, 1536)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="1,2,3,4,5,6,8,12,16,24")
    parser.add_argument("--passes", type=int, default=9)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    rows = [int(r) for r in args.rows.split(",")]
    result: dict = {"command": " ".join(["OMP_NUM_THREADS=1", "python", *sys.argv]),
                    "ld_preload": os.environ.get("LD_PRELOAD", ""),
                    "machine": {"cpu": cpu_name(), "cpu_vendor": cpu_vendor(), "mkl_path": mkl_code_path(),
                                "torch": torch.__version__, "torch_threads": 1},
                    "uptime_before": subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip(),
                    "ms": {}}
    for name, (out_features, in_features) in SHAPES.items():
        weight = torch.randn(out_features, in_features)
        inputs = {m: torch.randn(m, in_features) for m in rows}
        times: dict[int, list[float]] = {m: [] for m in rows}
        for m in rows:
            F.linear(inputs[m], weight)
        for _ in range(args.passes):
            for m in rows:
                began = time.perf_counter()
                F.linear(inputs[m], weight)
                times[m].append(1000 * (time.perf_counter() - began))
        result["ms"][name] = {str(m): round(statistics.median(t), 3) for m, t in times.items()}
        print(name, result["ms"][name], flush=True)
    per_layer = {str(m): round(sum(result["ms"][n][str(m)] * k for n, k in
                                  (("q_o", 2), ("k_v", 2), ("gate_up", 2), ("down", 1))), 3) for m in rows}
    result["decoder_layer_linears_ms"] = per_layer
    result["over_one_row"] = {n: {m: round(v / t["1"], 2) for m, v in t.items()} for n, t in result["ms"].items()}
    result["uptime_after"] = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print("one decoder layer's linears, ms:", per_layer)


if __name__ == "__main__":
    main()
