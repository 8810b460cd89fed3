"""Totals over the 9 requests from compare_stop_rules' results (each category: 3 requests x 64 tokens, so the time of a
setting is the sum over categories of 1 / tokens_per_s) and their ratios -> totals.json.

    python docs/benchmarks/fit/qwen_fit/totals.py docs/benchmarks/fit/qwen_fit/bench_results.json docs/benchmarks/fit/qwen_fit/totals.json
    python docs/benchmarks/fit/qwen_fit/totals.py docs/benchmarks/fit/qwen_fit/run2/bench_results.json docs/benchmarks/fit/qwen_fit/run2/totals.json
"""
import json
import sys

NAMES = {"hub_cards/qwen-coder-preverifier": "shipped", "/tmp/qfitwork/qwen-pv": "fitted", "default": "default"}
results = json.load(open(sys.argv[1]))
time = {NAMES.get(k, k): sum(1 / row["tokens_per_s"] for row in v.values()) for k, v in results.items()}
ratios = {name: {f"vs_{other}": round(time[other] / t, 3) for other in ("ar", "hf-confidence", "sd-fixed-8", "shipped", "default")
                 if other in time} for name, t in time.items()}
json.dump({"what": "speed over the 9 requests (time summed) relative to each column's setting", "totals": ratios},
          open(sys.argv[2], "w"), indent=1)
