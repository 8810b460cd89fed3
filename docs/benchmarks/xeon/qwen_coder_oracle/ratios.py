"""Per category and as medians over the categories, from results.json (examples/compare_stop_rules.py --out):
the shipped pre-verifier's speed over HF's dynamic schedule and over the best fixed γ, the stop-only oracles' the
same, the share of oracle-trim's gain over the best fixed γ each captures, and the same weights with
online_calibration on over the shipped ones.

    python docs/benchmarks/xeon/qwen_coder_oracle/ratios.py docs/benchmarks/xeon/qwen_coder_oracle
"""

import json
import statistics
import sys

folder = sys.argv[1]
results = json.load(open(f"{folder}/results.json"))
pacer, online = "hub_cards/qwen-coder-preverifier", "/tmp/s18/qwen-online"
out = {"what": "per category: x HF's dynamic schedule (hf-confidence), x the best fixed γ of 2/4/8, and the share of "
               "oracle-trim's gain over the best fixed γ captured; medians over the categories",
       "categories": {}}
for category in results["ar"]:
    row = {name: results[name][category] for name in results}
    best = max(row[g]["vs_ar"] for g in row if g.startswith("sd-fixed"))
    gap = row["oracle-trim"]["vs_ar"] - best
    hf = row["hf-confidence"]["vs_ar"]
    out["categories"][category] = {
        name: {"vs_ar": round(row[name]["vs_ar"], 3), "vs_hf_confidence": round(row[name]["vs_ar"] / hf, 3),
               "vs_best_fixed": round(row[name]["vs_ar"] / best, 3), "capture": round((row[name]["vs_ar"] - best) / gap, 2)}
        for name in (pacer, online, "oracle", "oracle-trim")}
out["median"] = {name: {key: round(statistics.median(c[name][key] for c in out["categories"].values()), 3)
                        for key in ("vs_ar", "vs_hf_confidence", "vs_best_fixed", "capture")}
                 for name in (pacer, online, "oracle", "oracle-trim")}
out["online_over_shipped"] = {category: round(results[online][category]["vs_ar"] / results[pacer][category]["vs_ar"], 3)
                             for category in results["ar"]}
json.dump(out, open(f"{folder}/ratios.json", "w"), indent=1)
print(json.dumps(out["median"], indent=1))
