"""Replay the expected-gain rule (scripts/stop_rule_bound.py's replay) with the acceptance of the tokens not drafted
yet estimated from the mean of the last W drafted tokens (W = 1: the shipped rule at block size 1).

    python docs/benchmarks/epyc_zen5/bound/opening_calibration/window_replay.py PREVERIFIER TRACES [CURVE.json ...]
"""
import math
import sys

import numpy as np

import pacer_hf.modeling_pacer as mp
from pacer_hf.costs import CostModel
from pacer_hf.costs.cost_model import recorded_calibration
from pacer_hf.generation import load_preverifier
from pacer_hf.training import simulate
from pacer_hf.training.traces import load_traces
from pacer_hf.training.train import predict_probs, prepare

W = [1]


def rows_continue(probs, open_rows, block_size, max_tokens, time, rate_now=None):
    n = max(len(p) for p in probs)
    survival, future, tokens = [], [], 0.0
    for p, open_row in zip(probs, open_rows):
        tokens += mp.expected_tokens(p)[-1]
        survival.append(math.prod(p) if open_row else 0.0)
        w = p[-max(block_size, W[0]):]
        future.append(sum(w) / max(len(w), 1))
    rate_now = tokens / time(n) if rate_now is None else rate_now
    for extra in range(1, (max_tokens - n) // block_size + 1):
        for _ in range(block_size):
            for b in range(len(survival)):
                survival[b] *= future[b]
                tokens += survival[b]
        if tokens / time(n + extra * block_size) > rate_now:
            return True
    return False


mp.rows_continue = rows_continue
pv = load_preverifier(sys.argv[1]).eval()
probs, labels = predict_probs(pv, prepare(load_traces(sys.argv[2])))
acc = simulate.acceptance_matrix(labels)
curves = sys.argv[3:] or [None]
for curve in curves:
    calibration = recorded_calibration(curve) if curve else dict(pv.config.calibration)
    costs, cap = CostModel.from_calibration(calibration), probs.shape[1]
    best = max(simulate.speedup(acc, simulate.fixed_lengths(acc, g), costs) for g in (2, 4, 6, 8) if g <= cap)
    accepted, hard = simulate.oracle_lengths(acc)
    oracle = simulate.speedup(hard, np.minimum(accepted + 1, cap), costs)
    out = []
    for w in (1, 2, 3, 4, 6, 24):
        W[0] = w
        lengths = simulate.pacer_lengths(probs, 1, None, "expected_gain", cap, costs)
        s = simulate.speedup(acc, lengths, costs, True)
        out.append(f"W={w}: {s:.3f} (draft {lengths.mean():.1f}, cap {(s - best) / (oracle - best):.2f})")
    print(f"{curve or 'stored'}: rounds {len(acc)} best fixed {best:.3f} oracle {oracle:.3f} | " + " | ".join(out))
