"""Ratios the docs quote for the Zen 5 EPYC (command.txt): python ratios.py > ratios.json

greedy_intel/, greedy_generic/: examples/compare_stop_rules.py (MKL's Intel kernels preloaded, and without);
greedy_generic_synced/, greedy_intel_synced/: greedy_generic's and greedy_intel's commands with gammas 2,4,6,8 after the
draft-cache fix (commit ee481a6, eaea119; calls.jsonl: every timed call's rounds); greedy_generic_split/: the generic
command again with a round's first drafted token judged apart (commit e5396df); greedy_generic_opening/: the same with a
call's opening round no evidence about the call (commit b8a4ec1);
t1_intel/, t1_generic/: pacer-hf bench at T = 1 (the same two paths); bound/compare_costs.json:
compare_stop_rules.py --gammas 8,16,24 --costs (generic kernels; bound/command.txt)."""
import json
import statistics
from pathlib import Path

HERE = Path(__file__).resolve().parent
PACER = "hub_cards/qwen-coder-preverifier"


def median_of(r: dict) -> dict:
    r["median"] = round(statistics.median(v for k, v in r.items() if k != "median"), 4)
    return r


def greedy(results: dict) -> dict:
    cats = list(results["ar"])
    fixed = [s for s in results if s.startswith("sd-fixed-")]
    tps = {s: {c: results[s][c]["tokens_per_s"] for c in cats} for s in results}
    best = {c: max(tps[s][c] for s in fixed) for c in cats}

    def ratio(a, b):
        return median_of({c: round(a[c] / b[c], 4) for c in cats})

    def capture(low):
        return median_of({c: round((tps[PACER][c] - low[c]) / (tps["oracle"][c] - low[c]), 4) for c in cats})

    return {
        "speed_vs_ar": {s: {c: round(results[s][c]["vs_ar"], 3) for c in cats} for s in results},
        "mean_draft": {s: {c: round(results[s][c]["mean_draft"], 1) for c in cats} for s in results
                       if s not in ("ar", "hf-confidence", "hf-heuristic")},
        "best_fixed": {c: max(fixed, key=lambda s: tps[s][c]) for c in cats},
        "pacer_over_best_fixed_ratio": ratio(tps[PACER], best),
        "pacer_over_hf_confidence_ratio": ratio(tps[PACER], tps["hf-confidence"]),
        "pacer_over_hf_heuristic_ratio": ratio(tps[PACER], tps["hf-heuristic"]),
        "oracle_over_hf_confidence_ratio": ratio(tps["oracle"], tps["hf-confidence"]),
        "oracle_over_best_fixed_ratio": ratio(tps["oracle"], best),
        "capture_of_best_fixed_to_stop_only_oracle_gap": capture(best),
        "capture_of_hf_confidence_to_stop_only_oracle_gap": capture(tps["hf-confidence"]),
        "tokens_per_s": {s: {c: round(v, 3) for c, v in t.items()} for s, t in tps.items()},
    }


def sampled(records: list) -> dict:
    tps = {}
    for r in records:
        tps.setdefault(r["strategy"], {})[r["category"]] = r["tokens_per_s"]
    cats = list(tps["ar"])
    fixed = [s for s in tps if s.startswith("sd-fixed-")]
    best = {c: max(tps[s][c] for s in fixed) for c in cats}
    return {
        "speed_vs_ar": {s: median_of({c: round(t[c] / tps["ar"][c], 3) for c in cats}) for s, t in tps.items()},
        "best_fixed": {c: max(fixed, key=lambda s: tps[s][c]) for c in cats},
        "pacer_over_best_fixed_ratio": median_of({c: round(tps["pacer"][c] / best[c], 4) for c in cats}),
        "pacer_over_hf_confidence_ratio": median_of({c: round(tps["pacer"][c] / tps["hf-confidence"][c], 4)
                                                     for c in cats}),
        "tokens_per_s": {s: {c: round(v, 3) for c, v in t.items()} for s, t in tps.items()},
    }


def main() -> None:
    report = {"what": "ratios the docs quote; intel: MKL's Intel kernels preloaded, generic: without (same Zen 5 EPYC)"}
    for name in ("greedy_intel", "greedy_generic", "greedy_generic_synced", "greedy_intel_synced", "greedy_generic_split",
                 "greedy_generic_opening"):
        if (HERE / name / "results.json").exists():
            report[name] = greedy(json.loads((HERE / name / "results.json").read_text()))
    for name in ("t1_intel", "t1_generic"):
        if (HERE / name / "results.json").exists():
            report[name] = sampled(json.loads((HERE / name / "results.json").read_text()))
    if "greedy_intel" in report and "greedy_generic" in report:
        i, g = (json.loads((HERE / n / "results.json").read_text()) for n in ("greedy_intel", "greedy_generic"))
        report["greedy_intel_path_over_generic_speed"] = {
            s: median_of({c: round(i[s][c]["tokens_per_s"] / g[s][c]["tokens_per_s"], 3) for c in i[s]}) for s in i if s in g}
        report["greedy_pacer_intel_path_over_best_generic_setting"] = median_of({
            c: round(i[PACER][c]["tokens_per_s"] / max(g[s][c]["tokens_per_s"] for s in g), 3) for c in i[PACER]})
    if (HERE / "bound" / "compare_costs.json").exists():
        b = json.loads((HERE / "bound" / "compare_costs.json").read_text())
        report["bound_compare_costs"] = {
            f"pacer_over_{s}_ratio": median_of({c: round(b["pacer"][c]["tokens_per_s"] / b[s][c]["tokens_per_s"], 3)
                                                for c in b["pacer"]}) for s in ("sd-fixed-8", "sd-fixed-24")}
        report["bound_compare_costs"]["stop_only_oracle_of_greedy_generic_over_sd-fixed-24_ratio"] = median_of({
            c: round(g["oracle"][c]["vs_ar"] / b["sd-fixed-24"][c]["vs_ar"], 3) for c in b["pacer"]})
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
