"""Pacer against HF's confidence schedule and the best fixed gamma, per category and the median, from this folder's
bench results (greedy and T = 1): `python docs/benchmarks/gpu_h200_lane/ratios.py` writes ratios.json beside it."""

import json
import statistics
from pathlib import Path

HERE = Path(__file__).parent


def ratios(records: list[dict]) -> dict:
    by = {(r["strategy"], r["category"]): r for r in records}
    out = {}
    for category in sorted({r["category"] for r in records}):
        pacer = by[("pacer", category)]["tokens_per_s"]
        out[category] = {
            "pacer_over_hf_confidence": round(pacer / by[("hf-confidence", category)]["tokens_per_s"], 3),
            "pacer_vs_best_fixed": round(by[("pacer", category)]["speedup_vs_best_fixed"], 3),
        }
    for key in ("pacer_over_hf_confidence", "pacer_vs_best_fixed"):
        out.setdefault("median", {})[key] = round(statistics.median(v[key] for k, v in out.items() if k != "median"), 3)
    return out


if __name__ == "__main__":
    result = {name: ratios(json.loads((HERE / f"{name}_results.json").read_text())) for name in ("bench", "bench-t1")}
    (HERE / "ratios.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
