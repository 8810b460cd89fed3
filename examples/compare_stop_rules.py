"""Interleaved A/B of stop rules on the benchmark's greedy prompts: fixed γ against pre-verifiers.

    python examples/compare_stop_rules.py hub_cards/demo-preverifier /path/to/other-preverifier --runs 2

Every setting decodes every prompt once per run, interleaved (so machine load hits them alike), and every
output is checked against plain decoding (`pacer_hf.training.validate.compare_in_generate`). Prints tokens/s and speed over the target alone per category,
the median over categories, and each pre-verifier's speed over the best fixed γ of the same category;
writes them as JSON with --out.
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

import pacer_hf
from pacer_hf.bench.prompts import CATEGORIES, build_prompts
from pacer_hf.pairs import load_pair
from pacer_hf.training.validate import compare_in_generate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("preverifiers", nargs="*", help="pre-verifier folders")
    parser.add_argument("--gammas", default="1,2,3,4")
    parser.add_argument("--prompts", type=int, default=3, help="prompts per category")
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--out", help="write the results as JSON here")
    args = parser.parse_args()
    torch.set_num_threads(1)
    pair = load_pair("stdlib")
    prompts, _ = build_prompts(list(CATEGORIES), lambda text: pair.tokenizer(text).input_ids, args.prompts, 256,
                               target_dir=pair.target.name_or_path)
    settings = {f"sd-fixed-{g}": f"sd-fixed-{g}" for g in args.gammas.split(",")}
    settings.update({path: pacer_hf.PacerPreVerifier.from_pretrained(path) for path in args.preverifiers})
    results: dict[str, dict] = {}
    for category, chosen in prompts.items():
        rows = compare_in_generate(pair.target, pair.draft, [list(p.ids) for p in chosen], settings, args.runs,
                                   args.max_new_tokens)
        best_fixed = max(row["vs_ar"] for name, row in rows.items() if name.startswith("sd-fixed"))
        for name, row in rows.items():
            results.setdefault(name, {})[category] = {**row, "vs_best_fixed": row["vs_ar"] / best_fixed}
            print(f"{category:<20} {name:<40} {row['tokens_per_s']:6.1f} tok/s  {row['vs_ar']:.3f}x ar  "
                  f"{row['vs_ar'] / best_fixed:.3f}x best fixed  mean draft {row['mean_draft']:.2f}")
    print("median over categories (x ar, x best fixed γ of the category):")
    for name, rows in results.items():
        print(f"  {name:<40} {statistics.median(r['vs_ar'] for r in rows.values()):.3f}x  "
              f"{statistics.median(r['vs_best_fixed'] for r in rows.values()):.3f}x")
    if args.out:
        with open(args.out, "w") as handle:
            json.dump(results, handle, indent=1)


if __name__ == "__main__":
    main()
