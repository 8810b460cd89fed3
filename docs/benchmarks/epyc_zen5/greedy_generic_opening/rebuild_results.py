"""results.json of this folder, rebuilt from calls.jsonl: the run's own write failed (its --out folder did not exist)
after it printed output.txt. compare_stop_rules.py runs, per category, one 4-token warm-up call per setting, then each
prompt under every setting in the order below; a setting's tokens_per_s is its new tokens over its seconds across the
category's timed calls, mean_draft the mean over those calls of their mean draft length, as the script computes them.
check(): every figure output.txt printed is reproduced at the precision it was printed with.

    python rebuild_results.py > results.json
"""
import json
import math
import re
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SETTINGS = ["ar", "sd-fixed-2", "sd-fixed-4", "sd-fixed-6", "sd-fixed-8", "hub_cards/qwen-coder-preverifier", "oracle",
            "oracle-trim", "hf-confidence", "hf-heuristic"]
CATEGORIES = ["chat-humaneval", "chat-docstring", "chat-edit"]
PROMPTS = 3

calls = [json.loads(line) for line in (HERE / "calls.jsonl").read_text().splitlines()]
per_category = len(SETTINGS) * (1 + PROMPTS)
assert len(calls) == per_category * len(CATEGORIES), len(calls)
results: dict = {name: {} for name in SETTINGS}
for c, category in enumerate(CATEGORIES):
    timed = calls[c * per_category + len(SETTINGS):(c + 1) * per_category]
    for s, name in enumerate(SETTINGS):
        mine = timed[s::len(SETTINGS)]
        assert len(mine) == PROMPTS
        drafts = [statistics.mean(row["draft_lengths"]) if row.get("draft_lengths") else 0.0 for row in mine]
        hf = name.startswith("hf-")
        results[name][category] = {"tokens_per_s": sum(row["new"] for row in mine) / sum(row["seconds"] for row in mine),
                                   "mean_draft": math.nan if hf else statistics.mean(drafts)}
    for name in SETTINGS:
        results[name][category]["vs_ar"] = results[name][category]["tokens_per_s"] / results["ar"][category]["tokens_per_s"]
    best = max(results[n][category]["vs_ar"] for n in SETTINGS if n.startswith("sd-fixed"))
    gap = results["oracle-trim"][category]["vs_ar"] - best
    for name in SETTINGS:
        row = results[name][category]
        row.update(vs_best_fixed=row["vs_ar"] / best, capture=(row["vs_ar"] - best) / gap)


def check() -> None:
    line = re.compile(r"^(\S+)\s+(\S+)\s+([\d.]+) tok/s\s+([\d.]+)x ar\s+([\d.]+)x best fixed\s+capture ([+-][\d.]+)\s+"
                      r"mean draft (\S+)")
    seen = 0
    for text in (HERE / "output.txt").read_text().splitlines():
        match = line.match(text)
        if not match:
            continue
        category, name, tps, vs_ar, vs_best, capture, draft = match.groups()
        row = results[name][category]
        assert f"{row['tokens_per_s']:.1f}" == tps and f"{row['vs_ar']:.3f}" == vs_ar, text
        assert f"{row['vs_best_fixed']:.3f}" == vs_best and f"{row['capture']:+.2f}" == capture, text
        assert draft == "nan" if name.startswith("hf-") else f"{row['mean_draft']:.2f}" == draft, text
        seen += 1
    assert seen == len(SETTINGS) * len(CATEGORIES), seen
    print(f"all {seen} printed rows reproduced", file=sys.stderr)


check()
print(json.dumps(results, indent=1))
