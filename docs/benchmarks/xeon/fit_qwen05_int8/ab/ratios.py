"""ratios.json from results.json (examples/compare_stop_rules.py --out) of the A/B in this folder: per category the
pre-verifier fitted on traces from the target's prompt states ("new") against the one fitted on the draft's own
("old") and the default, each over the best fixed gamma (no oracle in this run); medians over the categories.

    python docs/benchmarks/xeon/fit_qwen05_int8/ab/ratios.py
"""
import json
import statistics
from pathlib import Path

HERE = Path(__file__).parent
r = json.loads((HERE / "results.json").read_text())
new, old = "/tmp/s16/fit", "/tmp/s16/fit_old"  # the fitted pre-verifiers' folders, as the run named them
cats = list(r["ar"])
best = {c: max(r[k][c]["vs_ar"] for k in r if k.startswith("sd-fixed")) for c in cats}
out = {"what": "from results.json: per category, speed ratios; *_vs_best_fixed over the best fixed gamma (2 or 8); "
               "medians over the 7 categories",
       "new_over_old": {c: round(r[new][c]["vs_ar"] / r[old][c]["vs_ar"], 3) for c in cats},
       "new_over_default": {c: round(r[new][c]["vs_ar"] / r["default"][c]["vs_ar"], 3) for c in cats},
       "old_over_default": {c: round(r[old][c]["vs_ar"] / r["default"][c]["vs_ar"], 3) for c in cats}}
for name, key in (("new", new), ("old", old), ("default", "default")):
    out[f"{name}_vs_best_fixed"] = {c: round(r[key][c]["vs_ar"] / best[c], 3) for c in cats}
    out[f"{name}_vs_ar"] = {c: round(r[key][c]["vs_ar"], 3) for c in cats}
for key in list(out)[1:]:
    out[key]["median"] = round(statistics.median(out[key][c] for c in cats), 3)
(HERE / "ratios.json").write_text(json.dumps(out, indent=1) + "\n")
print(json.dumps(out, indent=1))
