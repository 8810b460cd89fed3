"""Is the stop rule or the pre-verifier's prediction what limits Pacer? A check on held-out traces.

Simulates, on one traces folder and the costs in the pre-verifier's `config.calibration`, the best fixed
lengths, the shipped `expected_gain` rule (continue while some longer round has a higher rate than stopping
now) and the renewal-reward rule (continue while the expected extra tokens exceed the long-run rate R times
the extra time; R iterated to its fixed point, the rate that rule itself achieves). Equal results mean the rule
is not the bound: the prediction is.

    python scripts/stop_rule_bound.py --preverifier hub_cards/demo-preverifier \
        --traces runs/demo_pair/onpolicy/traces-heldout
"""

from __future__ import annotations

import argparse

import numpy as np

from pacer_hf.generation import load_preverifier
from pacer_hf.modeling_pacer import calibrated_round_time
from pacer_hf.training import simulate
from pacer_hf.training.calibrate import prepare
from pacer_hf.training.traces import load_traces
from pacer_hf.training.train import predict_probs


def renewal_lengths(probs: np.ndarray, rate: float, time) -> np.ndarray:
    """Draft lengths under the renewal-reward rule at long-run rate `rate` (tokens per target step); tokens not
    drafted yet are predicted accepted with the last token's probability, as `expected_gain_continues` does."""
    cap = probs.shape[1]
    lengths = np.full(len(probs), cap, dtype=np.int64)
    for r, row in enumerate(probs.tolist()):
        survival, tokens = 1.0, 1.0
        for n in range(1, cap + 1):
            survival *= row[n - 1]
            tokens += survival
            more, extra = survival, tokens
            for m in range(n + 1, cap + 1):
                more *= row[n - 1]
                extra += more
                if (extra - tokens) - rate * (time(m) - time(n)) > 0:
                    break
            else:
                lengths[r] = n
                break
    return lengths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preverifier", required=True)
    parser.add_argument("--traces", required=True)
    parser.add_argument("--iterations", type=int, default=5)
    args = parser.parse_args()
    preverifier = load_preverifier(args.preverifier).eval()
    probs, labels = predict_probs(preverifier, prepare(load_traces(args.traces)))
    acc = simulate.acceptance_matrix(labels)
    calibration = dict(preverifier.config.calibration)
    costs = simulate.CostModel.from_calibration(calibration)
    time = calibrated_round_time(calibration)
    cap = probs.shape[1]
    print(f"{len(acc)} rounds of up to {cap} drafted tokens")
    fixed = {g: simulate.speedup(acc, simulate.fixed_lengths(acc, g), costs) for g in range(1, cap + 1)}
    best = max(fixed, key=fixed.get)
    print(f"best fixed gamma={best}: {fixed[best]:.3f}x")
    lengths, hard = simulate.oracle_lengths(acc)
    print(f"oracle: {simulate.speedup(hard, lengths, costs):.3f}x")
    shipped = simulate.pacer_lengths(probs, 1, None, "expected_gain", cap, costs)
    print(f"expected_gain (shipped rule): {simulate.speedup(acc, shipped, costs, True):.3f}x, mean draft {shipped.mean():.2f}")
    rate = fixed[best]  # a start; the loop below moves it to the rule's own long-run rate
    for i in range(args.iterations):
        lengths = renewal_lengths(probs, rate, time)
        tokens = simulate.expected_accepted(acc, lengths) + 1.0
        rate = float(tokens.sum() / (costs.round_time(lengths) + lengths * costs.preverifier_cost).sum())
        print(f"renewal-reward, iteration {i}: {simulate.speedup(acc, lengths, costs, True):.3f}x, "
              f"mean draft {lengths.mean():.2f}, R = {rate:.3f}")


if __name__ == "__main__":
    main()
