"""ratios.json from results.json (examples/compare_stop_rules.py --out): per category the fitted and the default
pre-verifier and the stop-only oracle over the best fixed gamma, the fitted over the default; medians. Both files in
FOLDER (default: this one).

    python docs/benchmarks/epyc_zen5/fit_qwen05_int8/oracle/ratios.py
    python docs/benchmarks/epyc_zen5/fit_qwen05_int8/oracle/ratios.py docs/benchmarks/epyc_zen5/fit_qwen05_int8/shared_prompt/oracle
"""
import json
import statistics
import sys
from pathlib import Path

HERE = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent
r = json.loads((HERE / "results.json").read_text())
fit = "/tmp/s11/q05/fit"  # the fitted pre-verifier's folder, as the run named it
cats = list(r["ar"])
best = {c: max(r[k][c]["vs_ar"] for k in r if k.startswith("sd-fixed")) for c in cats}
out = {"what": "from results.json: per category, the fitted and the default pre-verifier and the stop-only oracle over the "
               "best fixed gamma (4 or 8), the fitted over the default; medians over the 7 categories",
       "fitted_over_default": {c: round(r[fit][c]["vs_ar"] / r["default"][c]["vs_ar"], 3) for c in cats},
       "fitted_vs_best_fixed": {c: round(r[fit][c]["vs_ar"] / best[c], 3) for c in cats},
       "default_vs_best_fixed": {c: round(r["default"][c]["vs_ar"] / best[c], 3) for c in cats},
       "oracle_vs_best_fixed": {c: round(r["oracle"][c]["vs_ar"] / best[c], 3) for c in cats},
       "oracle_speed_vs_ar": {c: round(r["oracle"][c]["vs_ar"], 3) for c in cats}}
for key in list(out)[1:5]:
    out[key]["median"] = round(statistics.median(out[key][c] for c in cats), 3)
(HERE / "ratios.json").write_text(json.dumps(out, indent=1) + "\n")
print(json.dumps(out, indent=1))
