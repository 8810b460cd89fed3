"""A pair's costs relative to one target decoding step, as calibration measures them and a calibrated
pre-verifier records them (`config.calibration`): the simulator's and the benchmark's cost model."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class CostModel:
    """Measured costs of a pair on some hardware, relative to one target decoding step."""

    draft_cost: float = 0.1
    verify_cost: list[float] = field(default_factory=lambda: [1.0 + 0.05 * k for k in range(33)])
    preverifier_cost: float = 0.0  # per drafted token scored: features, scorer, decision (preverifier_token_timer)
    # Measured inside `generate` (calibrate.measure_loop_costs): the speculative loop's cost per round
    # beyond the forwards, and plain decoding's per token. Without them the model prefers short drafts:
    # it misses that every extra round pays the loop again.
    round_overhead: float = 0.0
    ar_overhead: float = 0.0
    step_seconds: float = 0.0  # one target step, when measured (the unit of everything above)
    # Measured inside `generate` (calibrate.measure_loop_costs): round_cost[k] = the time of a whole round
    # that drafts k tokens (draft steps, verification, the loop), k = 1.. When present it replaces
    # k*draft_cost + verify(k) + round_overhead, whose sum bare-forward timings get wrong on small pairs.
    round_cost: list[float] | None = None

    def as_calibration(self) -> dict:
        """The costs as a calibrated pre-verifier records them (`config.calibration`), for `expected_gain`."""
        costs = {"draft_cost": self.draft_cost, "verify_cost": list(self.verify_cost),
                 "preverifier_cost": self.preverifier_cost, "round_overhead": self.round_overhead}
        return costs if self.round_cost is None else {**costs, "round_cost": list(self.round_cost)}

    @classmethod
    def from_calibration(cls, calibration: dict) -> CostModel:
        """The cost model a calibrated pre-verifier's `config.calibration` recorded."""
        return cls(calibration["draft_cost"], list(calibration["verify_cost"]), calibration.get("preverifier_cost", 0.0),
                   calibration.get("round_overhead", 0.0), calibration.get("ar_overhead", 0.0),
                   round_cost=calibration.get("round_cost"))

    def round_time(self, lengths: np.ndarray) -> np.ndarray:
        """Time of rounds drafting `lengths` tokens, without pre-verifier calls (target steps)."""
        lengths = np.asarray(lengths)
        if self.round_cost is None:
            return lengths * self.draft_cost + self.verify(lengths) + self.round_overhead
        return _lookup(self.round_cost, lengths)

    def verify(self, k: np.ndarray) -> np.ndarray:
        return _lookup(self.verify_cost, k)


def _lookup(values: list[float], k: np.ndarray) -> np.ndarray:
    """`values[k]` elementwise, extrapolated linearly past the measured range."""
    table = np.asarray(values, dtype=np.float64)
    k = np.asarray(k)
    if int(k.max(initial=0)) >= len(table):
        slope = table[-1] - table[-2] if len(table) > 1 else 0.0
        return np.where(k < len(table), table[np.minimum(k, len(table) - 1)], table[-1] + slope * (k - len(table) + 1))
    return table[k]
