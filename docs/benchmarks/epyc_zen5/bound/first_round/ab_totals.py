"""Totals of a first_round_ab.py calls log (or another A/B of one variant against "shipped" written the same way, e.g.
../future_window/window_ab.py): per setting, new tokens over seconds over every timed call; the calls whose rounds
differ between the two settings (each prompt runs shipped, then the variant). Each category opens with one
untimed 4-token warm-up call per setting (validate.compare_in_generate; the first setting's also pays the pair's
cost probe), left out here. python ab_totals.py CALLS.jsonl PROMPTS_PER_CATEGORY CATEGORY,CATEGORY,..."""
import json
import sys

SETTINGS = 3  # ar, shipped, the variant (first-round here)
logged = [json.loads(line) for line in open(sys.argv[1])]
VARIANT = next(row["setting"] for row in logged if row["setting"] not in ("ar", "shipped"))
KEY = VARIANT.replace("-", "_")
per_category = SETTINGS * (1 + int(sys.argv[2]))
rows = [row for i, row in enumerate(logged) if i % per_category >= SETTINGS]
names = sys.argv[3].split(",")
timed = per_category - SETTINGS


def speed(calls: list[dict], setting: str) -> float:
    chosen = [row for row in calls if row["setting"] == setting]
    return sum(row["new"] for row in chosen) / sum(row["seconds"] for row in chosen)


by_category = {name: round(speed(rows[i * timed:(i + 1) * timed], VARIANT)
                           / speed(rows[i * timed:(i + 1) * timed], "shipped"), 3) for i, name in enumerate(names)}
totals: dict[str, list[float]] = {}
for row in rows:
    seconds, new = totals.setdefault(row["setting"], [0.0, 0])
    totals[row["setting"]] = [seconds + row["seconds"], new + row["new"]]
pairs = [(a, b) for a, b in zip(rows, rows[1:]) if a["setting"] == "shipped" and b["setting"] == VARIANT]
changed = [{"shipped_s": round(a["seconds"], 3), f"{KEY}_s": round(b["seconds"], 3),
            "shipped_rounds": list(zip(a["draft_lengths"], a["accepted"]))[:8],
            f"{KEY}_rounds": list(zip(b["draft_lengths"], b["accepted"]))[:8]}
           for a, b in pairs if a["draft_lengths"] != b["draft_lengths"]]
totals_speed = {name: round(new / seconds, 3) for name, (seconds, new) in totals.items()}
print(json.dumps({"tokens_per_s": totals_speed,
                  f"{KEY}_over_shipped_speed": round(totals_speed[VARIANT] / totals_speed["shipped"], 4),
                  f"by_category_{KEY}_over_shipped_speed": by_category, "calls": len(pairs),
                  "calls_changed": changed}, indent=1))
