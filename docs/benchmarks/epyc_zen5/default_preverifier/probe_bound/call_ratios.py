"""Per-call Pacer / target-alone ratios of the benches of pairs whose draft cannot pay (calls.json): the calls that
drafted (the pair's first calls and the probes) and those that drafted nothing.

    python docs/benchmarks/epyc_zen5/default_preverifier/probe_bound/call_ratios.py
"""
import json
import statistics
from pathlib import Path

HERE = Path(__file__).parent
FOLDERS = {"before (../demo-drop10)": (HERE.parent / "demo-drop10", "pacer"), "run1": (HERE / "run1", "pacer"),
           "run2": (HERE / "run2", "pacer"), "../drop10_synced": (HERE.parent / "drop10_synced", "pacer"),
           "../smol_int8_synced": (HERE.parent / "smol_int8_synced", "pacer-default"),
           "../drop10_split": (HERE.parent / "drop10_split", "pacer"),
           "../smol_int8_split": (HERE.parent / "smol_int8_split", "pacer-default")}
out = {}
for name, (folder, strategy) in FOLDERS.items():
    calls = json.loads((folder / "calls.json").read_text())
    alone = {(c["category"], c["run"], c["prompt"]): c["seconds"] for c in calls if c["strategy"] == "ar"}
    drafted, plain = [], []
    for c in calls:
        if c["strategy"] != strategy:
            continue
        ratio = round(alone[(c["category"], c["run"], c["prompt"])] / c["seconds"], 3)
        if c["draft_forwards"]:
            drafted.append({"category": c["category"], "run": c["run"], "prompt": c["prompt"],
                            "draft_forwards": c["draft_forwards"], "ratio": ratio})
        else:
            plain.append(ratio)
    out[name] = {"calls_that_drafted": drafted,
                 "calls_that_drafted_nothing": {"count": len(plain), "ratio_mean": round(statistics.mean(plain), 3),
                                                "ratio_min": min(plain), "ratio_max": max(plain)}}
(HERE / "call_ratios.json").write_text(json.dumps(out, indent=1) + "\n")
print(json.dumps(out, indent=1))
