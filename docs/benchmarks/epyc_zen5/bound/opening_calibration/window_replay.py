"""Replay the expected-gain rule (scripts/stop_rule_bound.py's replay) with the acceptance of the tokens not drafted
yet estimated from the mean of the last W drafted tokens (W = 1: the shipped rule at block size 1).

    python docs/benchmarks/epyc_zen5/bound/opening_calibration/window_replay.py PREVERIFIER TRACES [CURVE.json ...]
"""
import inspect
import sys
import textwrap

import numpy as np

import pacer_hf.modeling_pacer as mp
from pacer_hf.costs import CostModel
from pacer_hf.costs.cost_model import recorded_calibration
from pacer_hf.generation import load_preverifier
from pacer_hf.training import simulate
from pacer_hf.training.traces import load_traces
from pacer_hf.training.train import predict_probs, prepare

W = [1]
SHIPPED = "future.append(sum(p[-block_size:]) / max(len(p[-block_size:]), 1))"


def windowed(function):
    """`function` (modeling_pacer.rows_continue) with its estimate of the coming tokens read from the last W."""
    source = inspect.getsource(function)
    if SHIPPED not in source:
        raise SystemExit("modeling_pacer.rows_continue no longer estimates the coming tokens as this script expects.")
    source = source.replace(SHIPPED, "future.append(sum(p[-max(block_size, W[0]):]) / len(p[-max(block_size, W[0]):]))")
    namespace = {**vars(mp), "W": W}
    exec(textwrap.dedent(source), namespace)
    return namespace[function.__name__]


mp.rows_continue = windowed(mp.rows_continue)
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
        out.append(f"W={w}: {s:.3f}x (draft {lengths.mean():.1f}, cap {(s - best) / (oracle - best):.2f})")
    print(f"{curve or 'stored'}: rounds {len(acc)} best fixed {best:.3f}x oracle {oracle:.3f}x | " + " | ".join(out))
