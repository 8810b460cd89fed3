"""Per category and as medians over the categories, from results.json (examples/compare_stop_rules.py --out): the
fitted pre-verifier (refit/), the same with online_calibration on, the default one and the stop-only oracles, each
over the target alone and the best fixed γ of 2/4/8; and the fitted one over the default.

    python docs/benchmarks/xeon/fit_qwen05_int8/oracle/ratios.py docs/benchmarks/xeon/fit_qwen05_int8/oracle
"""

import json
import statistics
import sys

folder = sys.argv[1]
results = json.load(open(f"{folder}/results.json"))
names = {"/tmp/s16/fit": "fitted", "/tmp/s18/fit05-online": "fitted, online map", "default": "default",
         "oracle": "oracle", "oracle-trim": "oracle-trim"}
out = {"what": "x the target alone and x the best fixed γ of 2/4/8 per category; fitted_over_default per category; "
               "medians over the categories", "categories": {}}
for category in results["ar"]:
    best = max(results[g][category]["vs_ar"] for g in results if g.startswith("sd-fixed"))
    row = {label: {"vs_ar": round(results[name][category]["vs_ar"], 3),
                   "vs_best_fixed": round(results[name][category]["vs_ar"] / best, 3)} for name, label in names.items()}
    row["fitted_over_default"] = round(row["fitted"]["vs_ar"] / row["default"]["vs_ar"], 3)
    out["categories"][category] = row
rows = out["categories"].values()
out["median"] = {label: {key: round(statistics.median(r[label][key] for r in rows), 3) for key in ("vs_ar", "vs_best_fixed")}
                 for label in names.values()}
out["median"]["fitted_over_default"] = round(statistics.median(r["fitted_over_default"] for r in rows), 3)
json.dump(out, open(f"{folder}/ratios.json", "w"), indent=1)
print(json.dumps(out["median"], indent=1))
