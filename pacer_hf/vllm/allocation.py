"""How the vLLM proposer spends an engine step's cost curve (`pacer_hf.costs.StepCosts`, measured inside the
running engine) on the rows' scored tokens."""

from __future__ import annotations

import numpy as np

from ..costs.step_costs import StepCosts
from .kernels import best_prefixes


def allocate(survival: np.ndarray, rows: int, costs: StepCosts) -> np.ndarray:
    """How many scored tokens each row proposes (`kernels.best_prefixes`, which the proposer runs on the gate's
    calibrated survival): `survival[r, j]` is the chance the target accepts row r's first j + 1 tokens
    (non-increasing in j; 0 past the row's proposal), `rows` the step's decoding rows."""
    positive = survival > 0
    owner = np.nonzero(positive)[0].astype(np.int64)  # row-major: row by row, each row's tokens in order
    counts = np.zeros(survival.shape[0], dtype=np.int64)
    best_prefixes(-survival[positive].astype(np.float64), owner, costs.curve(rows + len(owner)), rows, counts)
    return counts
