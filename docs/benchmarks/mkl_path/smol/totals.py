"""Totals over the prompts (new tokens over seconds, seconds = tokens / tokens_per_s of each category's record,
one run) per strategy from the bench's results.json, and the ratios docs/CPU.md quotes: python totals.py"""
import json
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
records = json.loads((HERE / "bench" / "results.json").read_text())
sec, tok = defaultdict(float), defaultdict(int)
by_cat = defaultdict(dict)
for r in records:
    sec[r["strategy"]] += r["new_tokens"] / r["tokens_per_s"]
    tok[r["strategy"]] += r["new_tokens"]
    by_cat[r["category"]][r["strategy"]] = r["tokens_per_s"]
speed = {s: tok[s] / sec[s] for s in sec}
fixed = {s: v for s, v in speed.items() if s.startswith("sd-fixed")}
best = max(fixed, key=fixed.get)
out = {"what": "totals over every prompt per strategy (tokens over seconds), EPYC with MKL's Intel kernels",
       "tokens_per_s": {s: round(v, 3) for s, v in speed.items()},
       "speed_vs_ar": {s: round(v / speed["ar"], 3) for s, v in speed.items()}, "best_fixed": best}
for p in ("pacer", "pacer-default"):
    out[p] = {"vs_best_fixed": round(speed[p] / speed[best], 3),
              "vs_hf_confidence": round(speed[p] / speed["hf-confidence"], 3),
              "by_category_vs_ar": {c: round(v[p] / v["ar"], 3) for c, v in by_cat.items()}}
out["pacer_vs_pacer_default"] = round(speed["pacer"] / speed["pacer-default"], 3)
print(json.dumps(out, indent=1))
