"""ratios.json from results.json: the default pre-verifier against the shipped one and fixed γ = 8, per category,
medians, and over the 9 requests (each category 3 x 64 tokens, so a setting's time is the sum of 1 / tokens_per_s).

    python docs/benchmarks/qwen_coder/default_v4/ratios.py docs/benchmarks/qwen_coder/default_v4
"""
import json
import statistics
import sys

folder = sys.argv[1]
r = json.load(open(f"{folder}/results.json"))
own, default, fixed, ar = (r["hub_cards/qwen-coder-preverifier"], r["hub_cards/default-preverifier"], r["sd-fixed-8"],
                           r["ar"])


def ratio(a, b):
    return {c: round(a[c]["tokens_per_s"] / b[c]["tokens_per_s"], 3) for c in ar}


out = {"default_speedup_vs_own_preverifier": ratio(default, own), "default_speedup_vs_fixed_8": ratio(default, fixed),
       "own_speedup_vs_fixed_8": ratio(own, fixed), "default_speedup_vs_ar": ratio(default, ar),
       "own_speedup_vs_ar": ratio(own, ar)}
for key in list(out):
    out[key + "_median"] = round(statistics.median(out[key].values()), 3)
time = {k: sum(1 / v[c]["tokens_per_s"] for c in ar) for k, v in r.items()}
out["default_speedup_vs_own_preverifier_total"] = round(time["hub_cards/qwen-coder-preverifier"]
                                                        / time["hub_cards/default-preverifier"], 3)
json.dump(out, open(f"{folder}/ratios.json", "w"), indent=1)
