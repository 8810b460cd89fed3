"""Is the stop rule or the pre-verifier's prediction what limits Pacer? A check on held-out traces.

Simulates, on one traces folder and the costs in the pre-verifier's `config.calibration`, the best fixed
lengths, the shipped `expected_gain` rule (continue while some longer round has a higher rate than stopping
now) and the renewal-reward rule (continue while the expected extra tokens exceed the long-run rate R times
the extra time; R iterated to its fixed point, the rate that rule itself achieves). Equal results mean the rule
is not the bound: the prediction is. `--offsets` also replays the shipped rule with every prediction moved by a
constant in log-odds, chosen in hindsight: if no offset helps, the pre-verifier's calibration is not the bound either,
its discrimination is. `--curves` replays under recorded machine curves (`scripts/record_cost_curve.py`) instead of
the stored calibration; "capture" is the share of the gap from the best fixed γ of 2/4/6/8 to the stop-only oracle
(drafts up to and including the first miss, as `examples/compare_stop_rules.py --oracle` runs it).

    python scripts/stop_rule_bound.py --preverifier hub_cards/demo-preverifier \
        --traces runs/demo_pair/onpolicy/traces-heldout
    python scripts/stop_rule_bound.py --preverifier hub_cards/qwen-coder-preverifier --traces runs/curve_replay/traces \
        --curves docs/benchmarks/qwen_coder/cost_curves/*.json --offsets=-1,-0.5,0.5,1,2 --out bound.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from pacer_hf.costs import CostModel
from pacer_hf.costs.cost_model import recorded_calibration
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


def renewal(probs: np.ndarray, acc: np.ndarray, costs: CostModel, time, start: float, iterations: int):
    """The renewal-reward rule's lengths at its own long-run rate (iterated from `start`) and that rate."""
    rate = start
    for _ in range(iterations):
        lengths = renewal_lengths(probs, rate, time)
        tokens = simulate.expected_accepted(acc, lengths) + 1.0
        rate = float(tokens.sum() / (costs.round_time(lengths) + lengths * costs.preverifier_cost).sum())
    return lengths, rate


def bound(probs: np.ndarray, acc: np.ndarray, calibration: dict, offsets: list[float], iterations: int) -> dict:
    """Every rule's simulated speedup over the target alone (target steps) under one calibration."""
    costs, time, cap = CostModel.from_calibration(calibration), calibrated_round_time(calibration), probs.shape[1]
    fixed = {g: simulate.speedup(acc, simulate.fixed_lengths(acc, g), costs) for g in range(1, cap + 1)}
    best = max(fixed[g] for g in (2, 4, 6, 8) if g <= cap)
    accepted, hard = simulate.oracle_lengths(acc)
    oracle = simulate.speedup(hard, np.minimum(accepted + 1, cap), costs)

    def row(lengths: np.ndarray, speed: float | None = None) -> dict:
        speed = simulate.speedup(acc, lengths, costs, True) if speed is None else speed
        return {"speedup": round(speed, 4), "mean_draft": round(float(lengths.mean()), 2),
                "capture": round((speed - best) / (oracle - best), 3)}

    shipped = simulate.pacer_lengths(probs, 1, None, "expected_gain", cap, costs)
    lengths, rate = renewal(probs, acc, costs, time, best, iterations)
    logits = np.log(np.clip(probs, 1e-6, 1 - 1e-6)) - np.log(np.clip(1 - probs, 1e-6, 1.0))
    moved = {f"{d:+g}": row(simulate.pacer_lengths(1 / (1 + np.exp(-(logits + d))), 1, None, "expected_gain", cap, costs))
             for d in offsets}
    return {"best_fixed_2468_speedup": round(best, 4), "best_fixed_any": {"gamma": max(fixed, key=fixed.get),
            "speedup": round(max(fixed.values()), 4)}, "stop_only_oracle_speedup": round(oracle, 4),
            "shipped": row(shipped), "renewal_reward": {**row(lengths), "long_run_rate": round(rate, 4)},
            "shipped_with_logit_offset": moved}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preverifier", required=True)
    parser.add_argument("--traces", required=True)
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--curves", nargs="*", default=[], help="recorded cost curves (default: the stored calibration)")
    parser.add_argument("--offsets", default="", help="comma-separated log-odds offsets, e.g. -1,-0.5,0.5,1")
    parser.add_argument("--out", help="write the results here as JSON")
    args = parser.parse_args()
    preverifier = load_preverifier(args.preverifier).eval()
    probs, labels = predict_probs(preverifier, prepare(load_traces(args.traces)))
    acc = simulate.acceptance_matrix(labels)
    offsets = [float(x) for x in args.offsets.split(",") if x]
    calibrations = {"stored calibration": dict(preverifier.config.calibration)}
    if args.curves:
        recorded = {path: recorded_calibration(path) for path in args.curves}
        calibrations = {path: c for path, c in recorded.items() if c is not None}  # a verify-only curve prices no round
    print(f"{len(acc)} rounds of up to {probs.shape[1]} drafted tokens")
    result = {"command": " ".join(["python", *sys.argv]), "rounds": len(acc), "curves": {}}
    for name, calibration in calibrations.items():
        row = result["curves"][name] = bound(probs, acc, calibration, offsets, args.iterations)
        print(f"{name}: best fixed 2/4/6/8 {row['best_fixed_2468_speedup']}x, "
              f"stop-only oracle {row['stop_only_oracle_speedup']}x")
        for rule in ("shipped", "renewal_reward"):
            print(f"  {rule}: {row[rule]}")
        for offset, moved in row["shipped_with_logit_offset"].items():
            print(f"  shipped, log-odds {offset}: {moved}")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
