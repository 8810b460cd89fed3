"""Ratios the docs quote for the Zen 3 EPYC (command.txt): python ratios.py > ratios.json

greedy_generic/: examples/compare_stop_rules.py with MKL's generic kernels (what torch runs on this CPU as installed);
first_block/: the same command with the shipped pre-verifier as it runs now (`trim_first_block`) and a copy with
`trim_first_block=False` ("stop-only"), fixed γ = 6 and 8;
t1_generic/: pacer-hf bench at T = 1; t1_prior/: the same command once a known pair's recent shares took its long-run
shares as their prior. The same arithmetic as the Zen 5 EPYC's (../epyc_zen5/ratios.py)."""
import importlib.util
import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("zen5_ratios", HERE.parent / "epyc_zen5" / "ratios.py")
zen5 = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(zen5)

report = {"what": "ratios the docs quote; generic: MKL's generic kernels (Zen 3 EPYC, CPU family 25 model 1)"}
for name in ("greedy_generic",):
    if (HERE / name / "results.json").exists():
        results = json.loads((HERE / name / "results.json").read_text())
        report[name] = zen5.greedy(results)
        if "default" in results:  # the default pre-verifier (what pacer=True uses for a draft without one)
            tps = report[name]["tokens_per_s"]
            report[name]["default_over_shipped_ratio"] = zen5.median_of(
                {c: round(tps["default"][c] / tps[zen5.PACER][c], 4) for c in tps["ar"]})
if (HERE / "first_block" / "results.json").exists():  # the shipped rule (trim_first_block) and stop-only beside it
    results = json.loads((HERE / "first_block" / "results.json").read_text())
    report["first_block"] = zen5.greedy(results)
    tps = report["first_block"]["tokens_per_s"]
    report["first_block"]["shipped_over_stop_only_ratio"] = zen5.median_of(
        {c: round(tps[zen5.PACER][c] / tps["stop-only"][c], 4) for c in tps["ar"]})
for name in ("t1_generic", "t1_prior"):
    if (HERE / name / "results.json").exists():
        report[name] = zen5.sampled(json.loads((HERE / name / "results.json").read_text()))
if (HERE / "probe_vs_curve" / "results.json").exists():
    results = json.loads((HERE / "probe_vs_curve" / "results.json").read_text())
    report["probe_vs_curve"] = {s: zen5.median_of({c: round(v["vs_ar"], 3) for c, v in cats.items()})
                                for s, cats in results.items()}
print(json.dumps(report, indent=1))
