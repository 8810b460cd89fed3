"""Ratios docs/CPU.md quotes, from the two interleaved runs (intel/results.json: MKL's Intel kernels preloaded;
generic/results.json: the same command without): python ratios.py > ratios.json"""
import json
import statistics
from pathlib import Path

HERE = Path(__file__).resolve().parent
PACER = "hub_cards/qwen-coder-preverifier"


def one(results):
    cats = list(results["ar"])
    fixed = [s for s in results if s.startswith("sd-fixed-")]
    out = {"speed_vs_ar": {s: {c: round(results[s][c]["vs_ar"], 3) for c in cats} for s in results},
           "mean_draft": {s: {c: round(results[s][c]["mean_draft"], 1) for c in cats} for s in results
                          if s not in ("ar", "hf-confidence", "hf-heuristic")}}
    best = {c: max(results[s][c]["tokens_per_s"] for s in fixed) for c in cats}
    out["best_fixed"] = {c: max(fixed, key=lambda s: results[s][c]["tokens_per_s"]) for c in cats}
    tps = {s: {c: results[s][c]["tokens_per_s"] for c in cats} for s in results}

    def ratio(a, b):
        r = {c: round(a[c] / b[c], 4) for c in cats}
        r["median"] = round(statistics.median(r[c] for c in cats), 4)
        return r

    def capture(low):
        r = {c: round((tps[PACER][c] - low[c]) / (tps["oracle"][c] - low[c]), 4) for c in cats}
        r["median"] = round(statistics.median(r[c] for c in cats), 4)
        return r

    out["pacer_over_best_fixed_ratio"] = ratio(tps[PACER], best)
    out["pacer_over_hf_confidence_ratio"] = ratio(tps[PACER], tps["hf-confidence"])
    out["pacer_over_hf_heuristic_ratio"] = ratio(tps[PACER], tps["hf-heuristic"])
    out["oracle_over_hf_confidence_ratio"] = ratio(tps["oracle"], tps["hf-confidence"])
    out["oracle_over_best_fixed_ratio"] = ratio(tps["oracle"], best)
    out["capture_of_best_fixed_to_stop_only_oracle_gap"] = capture(best)
    out["capture_of_hf_confidence_to_stop_only_oracle_gap"] = capture(tps["hf-confidence"])
    out["tokens_per_s"] = {s: {c: round(v, 3) for c, v in t.items()} for s, t in tps.items()}
    return out


runs = {name: json.loads((HERE / name / "results.json").read_text()) for name in ("intel", "generic")
        if (HERE / name / "results.json").exists()}
report = {"what": "ratios docs/CPU.md quotes; intel: MKL's Intel kernels preloaded, generic: without (same EPYC)"}
report.update({name: one(r) for name, r in runs.items()})
if len(runs) == 2:
    i, g = runs["intel"], runs["generic"]
    cats = list(i["ar"])
    report["intel_path_over_generic_speed"] = {
        s: {c: round(i[s][c]["tokens_per_s"] / g[s][c]["tokens_per_s"], 4) for c in cats} for s in i if s in g}
    best_generic = {c: max(g[s][c]["tokens_per_s"] for s in g if not s.startswith("oracle")) for c in cats}
    report["pacer_intel_path_over_best_generic_setting"] = {
        c: round(i[PACER][c]["tokens_per_s"] / best_generic[c], 4) for c in cats}
print(json.dumps(report, indent=1))
