"""A pair's costs relative to one target decoding step, as calibration measures them and a calibrated
pre-verifier records them (`config.calibration`): the simulator's and the benchmark's cost model. Its tables
(`verify_cost`, `round_cost`) stay the bare lists `config.calibration` stores and the Hub-loadable
`modeling_pacer.py` reads; they are read as `CostCurve`s (`verify_curve`, `round_curve`: one lookup, one
extrapolation rule)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .curve import CostCurve


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
        """The cost model a calibrated pre-verifier's `config.calibration` recorded (its tables bare lists, or
        `CostCurve.to_dict` dicts)."""
        round_cost = calibration.get("round_cost")
        return cls(calibration["draft_cost"], CostCurve.from_dict(calibration["verify_cost"]).base,
                   calibration.get("preverifier_cost", 0.0), calibration.get("round_overhead", 0.0),
                   calibration.get("ar_overhead", 0.0),
                   round_cost=None if round_cost is None else CostCurve.from_dict(round_cost).base)

    @property
    def verify_curve(self) -> CostCurve:
        """verify(k): a target forward over k + 1 tokens, in target steps."""
        return CostCurve(self.verify_cost, "calibration")

    @property
    def round_curve(self) -> CostCurve | None:
        """A whole round drafting k tokens, in target steps, when measured inside generate."""
        return None if self.round_cost is None else CostCurve(self.round_cost, "calibration")

    def round_time(self, lengths: np.ndarray) -> np.ndarray:
        """Time of rounds drafting `lengths` tokens, without pre-verifier calls (target steps)."""
        lengths = np.asarray(lengths)
        if self.round_cost is None:
            return lengths * self.draft_cost + self.verify(lengths) + self.round_overhead
        return self.round_curve.at(lengths)

    def verify(self, k: np.ndarray) -> np.ndarray:
        return self.verify_curve.at(k)


FAVOURED_ACCEPTANCE = (0.6, 0.8, 0.9, 0.97)  # per-token acceptance: uncertain, typical, easy and copied stretches of code


def favoured_lengths(round_time, acceptance=FAVOURED_ACCEPTANCE, max_length: int = 16) -> tuple[int, ...]:
    """The fixed draft lengths a machine's curve favours: for each per-token acceptance a, the length k in
    1..max_length with the most expected tokens, (1 - a^(k+1)) / (1 - a), per unit of `round_time[k]` (a round
    drafting k tokens, any unit; extrapolated linearly past its end). Why: the best fixed length depends on where
    the verify curve steps up (2-3 tokens per step on one CPU, 4 on another), so a comparison against fixed lengths
    picked on one machine says little on another. Distinct, increasing."""
    curve = CostCurve(list(round_time), "given")
    lengths = np.arange(1, max_length + 1)
    seconds = curve.at(lengths)
    return tuple(sorted({int(lengths[np.argmax((1 - a ** (lengths + 1)) / (1 - a) / seconds)]) for a in acceptance}))


def recorded_calibration(path: str | Path) -> dict | None:
    """The calibration a curve recorded by `scripts/record_cost_curve.py` prices rounds with (its `costs`, a
    pre-verifier cost of 0 where it has none), or None for a curve without a draft step, which prices no round."""
    costs = json.loads(Path(path).read_text())["costs"]
    if costs.get("draft_cost") is None:
        return None
    return {**costs, "preverifier_cost": costs.get("preverifier_cost") or 0.0}
