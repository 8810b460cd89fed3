"""Totals over the prompts (tokens over seconds) per strategy from pacer-hf bench calls.json files -> one json.

    python docs/benchmarks/fit/totals.py docs/benchmarks/fit/cand_totals.json docs/benchmarks/fit/cand_smol ...
"""
import json, sys
from collections import defaultdict
out = {"what": "totals over every call (new tokens over seconds) per strategy, from each folder's calls.json; per category the same within the category; ratios of those totals"}
for folder in sys.argv[2:]:
    calls = json.load(open(f"{folder}/calls.json"))
    sec, tok = defaultdict(float), defaultdict(int)
    csec, ctok = defaultdict(lambda: defaultdict(float)), defaultdict(lambda: defaultdict(int))
    for c in calls:
        sec[c["strategy"]] += c["seconds"]; tok[c["strategy"]] += c["new_tokens"]
        csec[c["category"]][c["strategy"]] += c["seconds"]; ctok[c["category"]][c["strategy"]] += c["new_tokens"]
    speed = {s: tok[s] / sec[s] for s in sec}
    fixed = {s: v for s, v in speed.items() if s.startswith("sd-fixed")}
    best = max(fixed, key=fixed.get) if fixed else None
    entry = {"tokens_per_s": {s: round(v, 3) for s, v in speed.items()},
             "speed_vs_ar": {s: round(v / speed["ar"], 3) for s, v in speed.items()}}
    for p in ("pacer", "pacer-default"):
        if p not in speed: continue
        r = {}
        if best: r["best_fixed"], r["vs_best_fixed"] = best, round(speed[p] / speed[best], 3)
        if "hf-confidence" in speed: r["vs_hf_confidence"] = round(speed[p] / speed["hf-confidence"], 3)
        r["by_category_vs_ar"] = {k: round((ctok[k][p] / csec[k][p]) / (ctok[k]["ar"] / csec[k]["ar"]), 3) for k in csec}
        entry[p] = r
    if "pacer" in speed and "pacer-default" in speed:
        entry["pacer_vs_pacer_default"] = round(speed["pacer"] / speed["pacer-default"], 3)
    out[folder.rstrip("/").split("/")[-1]] = entry
json.dump(out, open(sys.argv[1], "w"), indent=1)
print(json.dumps(out, indent=1))
