"""ratios.json from the A/B outputs here: per category min-rounds over shipped (x the target alone, printed by
min_rounds_ab.py), and the timed calls whose rounds differ between the two settings (from the calls logs). The
`both_variant` files are a first run of the 0.5B pair in which both settings were the same object (the package's
cached default pre-verifier, marked once): the same rule twice, kept as a measure of what one run varies.

    python docs/benchmarks/epyc_zen5/bound/min_rounds/ratios.py
"""
import ast
import json
from pathlib import Path

HERE = Path(__file__).parent
out = {}
for name in ("qwen15", "qwen05", "qwen05_both_variant"):
    output = HERE / f"{name}_output.txt" if name != "qwen05_both_variant" else HERE / "qwen05_output_both_variant.txt"
    rows = {}
    for line in output.read_text().splitlines():
        category, _, rest = line.partition(" ")
        if category.startswith("chat-") and rest.startswith("{"):
            speeds = ast.literal_eval(rest)
            second = "min-rounds" if "min-rounds" in speeds else None
            if second:
                rows[category] = round(speeds["min-rounds"][0] / speeds["shipped"][0], 3)
    calls = HERE / (f"{name}_calls.jsonl" if name != "qwen05_both_variant" else "qwen05_calls_both_variant.jsonl")
    logged = [json.loads(line) for line in calls.read_text().splitlines()]
    timed = [r for r in logged if r["new"] > 8 and "draft_lengths" in r]
    shipped = [r for r in timed if r["setting"] == "shipped"]
    variant = [r for r in timed if r["setting"] == "min-rounds"]
    if not variant:  # both settings one object: the log names both "shipped", in the order they ran per prompt
        shipped, variant = shipped[0::2], shipped[1::2]
    differ = [{"shipped": [a["seconds"], list(zip(a["draft_lengths"], a["accepted"]))],
               "min_rounds": [b["seconds"], list(zip(b["draft_lengths"], b["accepted"]))]}
              for a, b in zip(shipped, variant) if a["draft_lengths"] != b["draft_lengths"]]
    out[name] = {"min_rounds_over_shipped": rows, "timed_calls": len(shipped), "calls_whose_rounds_differ": differ}
(HERE / "ratios.json").write_text(json.dumps(out, indent=1) + "\n")
print(json.dumps({k: {"min_rounds_over_shipped": v["min_rounds_over_shipped"], "differ": len(v["calls_whose_rounds_differ"])}
                  for k, v in out.items()}, indent=1))
