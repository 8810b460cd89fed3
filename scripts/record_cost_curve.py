"""Record this machine's cost curve for a pair: one target step, a verify of 2..K+1 tokens, the draft's step and
the pre-verifier's work per drafted token, relative to one target step (1 thread unless told), as a JSON file
`docs/benchmarks/qwen_coder/cost_curves/` keeps one of per CPU kind and `--costs` of replay/simulation reads.

    OMP_NUM_THREADS=1 python scripts/record_cost_curve.py --pair qwen2.5-coder --max-k 23 --repeats 7 \
        --out docs/benchmarks/qwen_coder/cost_curves/amd_epyc.json

Interleaved medians on a 128-token cached prefix (`loops.probes.measure_costs`, the benchmark's cost model), the
draft through the forward the drafting loop uses. Why a file per machine kind: the stop rule's choices follow the
curve (tests/test_cost_curves.py), and two CPU kinds of this project have curves that want different rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time

import torch

from pacer_hf.costs import cpu_name
from pacer_hf.costs.blas import cpu_vendor, mkl_code_path
from pacer_hf.loops.probes import measure_costs
from pacer_hf.pairs import load_pair


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", default="qwen2.5-coder")
    parser.add_argument("--max-k", type=int, default=23, help="verify widths 2..max_k + 1")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    started = time.time()
    load = os.getloadavg()
    pair = load_pair(args.pair)
    loaded = time.time()
    costs = measure_costs(pair.target, pair.draft, pair.preverifier, context=args.context, max_k=args.max_k,
                          repeats=args.repeats)
    step_ms = 1000 * costs.step_seconds
    record = {
        "pair": args.pair,
        "machine": {"cpu": cpu_name(), "logical_cpus": os.cpu_count(), "torch_threads": args.threads,
                    "torch": torch.__version__, "platform": platform.platform(),
                    "cpu_vendor": cpu_vendor(), "mkl_path": mkl_code_path()},
        "command": " ".join(["OMP_NUM_THREADS=1", "python", *sys.argv]),
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "load_average_before": [round(x, 2) for x in load],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "uptime_after": subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip(),
        "load_seconds": round(loaded - started, 1),
        "dtype": {"target": str(pair.target.dtype), "draft": "shipped cheap draft (int8 linears and head)"},
        "context": args.context, "repeats": args.repeats,
        "step_ms": round(step_ms, 2),
        "verify_ms": {str(k + 1): round(step_ms * v, 2) for k, v in enumerate(costs.verify_cost)},
        "draft_step_ms": round(step_ms * costs.draft_cost, 2),
        # the calibration form (config.calibration, CostModel.from_calibration, replay --costs):
        "costs": {"draft_cost": costs.draft_cost, "verify_cost": [round(v, 4) for v in costs.verify_cost],
                  "preverifier_cost": costs.preverifier_cost, "round_overhead": 0.0, "ar_overhead": 0.0,
                  "step_seconds": costs.step_seconds},
    }
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as handle:
        json.dump(record, handle, indent=1)
    print(json.dumps({k: record[k] for k in ("step_ms", "draft_step_ms", "verify_ms")}))


if __name__ == "__main__":
    main()
