"""The shipped greedy rule's rounds replayed with each stopped round's best prefix proposed, none included, only where
the round drafted at most m tokens (m = 1: `trim_first_block` at block size 1), beside the stop-only rule and trimming
every stopped round, under recorded cost curves; capture: the share of the gap from the best fixed γ of 2/4/6/8 to the
stop-only oracle.

    OMP_NUM_THREADS=1 python docs/benchmarks/epyc_zen3/first_block_replay.py hub_cards/qwen-coder-preverifier \
        TRACES docs/benchmarks/qwen_coder/cost_curves/amd_epyc_zen3_mkl_generic.json ... --out variants.json

TRACES: `scripts/curve_replay.py --work W` writes them to W/traces.
"""
import argparse
import json

import numpy as np

from pacer_hf.costs import CostModel
from pacer_hf.costs.cost_model import recorded_calibration
from pacer_hf.generation import load_preverifier
from pacer_hf.training import simulate
from pacer_hf.training.traces import load_traces
from pacer_hf.training.train import predict_probs, prepare


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("preverifier")
    parser.add_argument("traces")
    parser.add_argument("curves", nargs="+")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    preverifier = load_preverifier(args.preverifier)
    probs, labels = predict_probs(preverifier, prepare(load_traces(args.traces)))
    acc = simulate.acceptance_matrix(labels)
    cap = preverifier.config.max_draft_tokens
    out = {}
    for path in args.curves:
        costs = CostModel.from_calibration(recorded_calibration(path))
        lengths = simulate.pacer_lengths(probs, 1, None, "expected_gain", cap, costs)
        trimmed = simulate.trimmed_lengths(probs, lengths, costs)
        speed = {"shipped": simulate.speedup(acc, lengths, costs, preverifier=True),
                 "trim_all": simulate.speedup(acc, lengths, costs, preverifier=True, proposed=trimmed)}
        plain = {}
        for m in (1, 2, 3, 4):
            proposed = np.where(lengths <= m, trimmed, lengths)
            speed[f"trim_if_drafted<={m}"] = simulate.speedup(acc, lengths, costs, preverifier=True, proposed=proposed)
            plain[f"trim_if_drafted<={m}"] = int(((lengths <= m) & (trimmed == 0)).sum())
        fixed = max(simulate.speedup(acc, simulate.fixed_lengths(acc, g), costs) for g in (2, 4, 6, 8))
        accepted, hard = simulate.oracle_lengths(acc)
        oracle = simulate.speedup(hard, np.minimum(accepted + 1, cap), costs)
        speed = {k: round(v, 4) for k, v in speed.items()}
        out[path.split("/")[-1]] = row = {
            "speedup": speed, "plain_rounds": plain,
            "capture": {k: round((v - fixed) / (oracle - fixed), 3) for k, v in speed.items()},
            "best_fixed_2468_speedup": round(fixed, 4), "oracle_speedup": round(oracle, 4)}
        print(path, json.dumps(row))
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
