"""The expected-gain rule with other estimates of an undrafted token's acceptance, replayed on recorded rounds.

    OMP_NUM_THREADS=1 python scripts/future_estimate_replay.py runs/curve_replay/traces hub_cards/qwen-coder-preverifier \
        docs/benchmarks/qwen_coder/cost_curves/intel_xeon.json docs/benchmarks/qwen_coder/cost_curves/amd_epyc.json
    OMP_NUM_THREADS=1 python scripts/future_estimate_replay.py runs/default_pv/traces/demo-greedy hub_cards/default-preverifier

After n drafted tokens the rule (`modeling_pacer.rows_continue`) predicts the tokens not drafted yet accepted with the
last block's mean ("last"). The alternatives: the round's mean so far ("mean"), the first-token acceptance of the
rounds replayed ("prior"), and the midpoint of "last" and "prior" ("blend"). Each rule's speed is simulated
(`training.simulate`, target steps, no loop overheads) under the pre-verifier's stored calibration and under each
recorded curve given (`scripts/record_cost_curve.py`). Traces: `scripts/curve_replay.py` (the Qwen pair) or
`recipes/default_preverifier_data.py` (the demo pairs).
"""

from __future__ import annotations

import json
import math
import sys

import numpy as np
import torch

from pacer_hf.costs import CostModel
from pacer_hf.modeling_pacer import PacerPreVerifier, calibrated_round_time, expected_tokens
from pacer_hf.training import simulate
from pacer_hf.training.traces import load_traces
from pacer_hf.training.train import predict_probs, prepare

ESTIMATES = ("last", "mean", "prior", "blend")


def continues(probs: list[float], max_tokens: int, time, future: float) -> bool:
    """`rows_continue` for one row and block size 1, with `future` for every undrafted token."""
    n, tokens, survival = len(probs), expected_tokens(probs)[-1], math.prod(probs)
    rate_now = tokens / time(n)
    for extra in range(1, max_tokens - n + 1):
        survival *= future
        tokens += survival
        if tokens / time(n + extra) > rate_now:
            return True
    return False


def lengths(probs: np.ndarray, cap: int, calibration: dict, estimate: str, prior: float) -> np.ndarray:
    time = calibrated_round_time(calibration)
    out = np.full(len(probs), cap, dtype=np.int64)
    for r, row in enumerate(probs[:, :cap].tolist()):
        for end in range(1, cap + 1):
            p = row[:end]
            future = {"last": p[-1], "mean": sum(p) / len(p), "prior": prior, "blend": 0.5 * (p[-1] + prior)}[estimate]
            if not continues(p, cap, time, future):
                out[r] = end
                break
    return out


def main() -> None:
    traces, folder, curves = sys.argv[1], sys.argv[2], sys.argv[3:]
    torch.set_num_threads(1)
    preverifier = PacerPreVerifier.from_pretrained(folder).eval()
    probs, labels = predict_probs(preverifier, prepare(load_traces(traces)))
    acc = simulate.acceptance_matrix(labels)
    cap = min(preverifier.config.max_draft_tokens, probs.shape[1])
    prior = float(acc[:, 0].mean())
    print(f"{traces}: {len(acc)} rounds, cap {cap}, first-token acceptance {prior:.3f}")
    calibrations = [("the pre-verifier's calibration", preverifier.config.calibration)]
    calibrations += [(path, json.loads(open(path).read())["costs"]) for path in curves]
    for name, calibration in calibrations:
        costs = CostModel.from_calibration({**calibration, "preverifier_cost": calibration.get("preverifier_cost") or 0.0})
        fixed = {g: round(simulate.speedup(acc, simulate.fixed_lengths(acc, g), costs), 3) for g in (2, 4, 6, 8)}
        speed = {e: round(simulate.speedup(acc, lengths(probs, cap, costs.as_calibration(), e, prior), costs,
                                           preverifier=True), 4) for e in ESTIMATES}
        relative = {e: f"{speed[e] / speed['last'] - 1:+.1%}" for e in ESTIMATES[1:]}
        print(f"  {name}: fixed γ {fixed}; rule {speed}; against 'last' {relative}")


if __name__ == "__main__":
    main()
