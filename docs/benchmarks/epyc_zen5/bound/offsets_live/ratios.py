"""ratios.json: each offset pre-verifier over the shipped one and every setting over fixed γ = 24, per category, from
run1/, humaneval_rerun/, run2/ and run3_synced/ (after the draft-cache fix; each category 3 x 64 tokens).

    python docs/benchmarks/epyc_zen5/bound/offsets_live/ratios.py
"""
import json
from pathlib import Path

here = Path(__file__).parent
shipped = "hub_cards/qwen-coder-preverifier"
out = {"what": "tokens/s ratios: offset_speedup_vs_shipped (the shipped pre-verifier with every acceptance logit moved "
               "by +0.5 or +1.0, over the shipped one) and speedup_vs_fixed_24, per run and category"}
for run in ("run1", "humaneval_rerun", "run2", "run3_synced"):
    r = json.loads((here / run / "results.json").read_text())
    entry = {}
    for name in (n for n in r if "offset" in n):
        label = name.rsplit("offset", 1)[1]
        entry[f"offset{label}_speedup_vs_shipped"] = {c: round(v["tokens_per_s"] / r[shipped][c]["tokens_per_s"], 3)
                                                      for c, v in r[name].items()}
    for name in r:
        entry[f"{name.split('/')[-1]}_speedup_vs_fixed_24"] = {
            c: round(v["tokens_per_s"] / r["sd-fixed-24"][c]["tokens_per_s"], 3) for c, v in r[name].items()}
    out[run] = entry
(here / "ratios.json").write_text(json.dumps(out, indent=1))
print(json.dumps(out, indent=1))
