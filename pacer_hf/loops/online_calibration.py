"""Online recalibration of a learned acceptance predictor to the pair that runs it (lookup gates, and pre-verifiers
whose `config.online_calibration` asks for it: the default one).

The lookup gate was trained on other targets' answers (the default gate on none of the user's), and in vLLM
without the target's confidence, an input vLLM does not give a proposer; the default pre-verifier learned other
pairs' acceptance. Every round tells the caller how many
of the proposed tokens the target accepted: tokens before the first rejection are accepted, the first rejected
one is not, the rest are unseen (the gate's own training labels). A two-parameter logistic map of the gate's
log-odds, p = sigmoid(scale * logit + shift), is refitted to the most recent of those labels, so the stop rule
weighs proposals with this target's acceptance, not the training set's. Three users: vLLM's
`PacerLookupProposer` (one map per engine), `generate`'s gated lookup (one map per model and mode, greedy
or sampling, kept on the model across calls: `model_state.py`) and the single-row stop rule (one map per pair,
mode and pre-verifier: `loops/recent_acceptance.py`).
"""

from __future__ import annotations

import numpy as np

WINDOW = 2048  # most recent labelled drafts the map is fitted to
REFIT_EVERY = 64  # new labels between fits
PRIOR_WEIGHT = 20.0  # ridge pull toward the gate as trained (scale 1, shift 0), in labels' worth
MAX_LOGIT = 20.0


class OnlineCalibration:
    """p = sigmoid(scale * z + shift) over the gate's log-odds z, refitted (a few Newton steps of ridge-penalised
    logistic regression) to the last `WINDOW` observed drafts every `REFIT_EVERY` new ones."""

    def __init__(self, window: int = WINDOW):
        self.scale = 1.0
        self.shift = 0.0
        self.z = np.zeros(window)
        self.y = np.zeros(window)
        self.labels = 0  # labelled drafts seen in all
        self._since_fit = 0
        self._next = 0
        self._filled = 0

    def apply(self, logits: np.ndarray) -> np.ndarray:
        return 1.0 / (1.0 + np.exp(-np.clip(self.scale * logits + self.shift, -MAX_LOGIT, MAX_LOGIT)))

    def summary(self) -> dict:
        """The map as it stands and the labels it has seen (`PacerStats.online_calibration`)."""
        return {"scale": round(self.scale, 4), "shift": round(self.shift, 4), "labels": int(self.labels)}

    def update(self, logits: np.ndarray, accepted: int) -> None:
        """One row's outcome: its proposed drafts' gate log-odds and how many of them the target accepted."""
        accepted = min(accepted, len(logits))
        seen = min(accepted + 1, len(logits))
        at = self._next if self._next + seen <= len(self.z) else 0  # a ring of whole rows
        self.z[at: at + seen] = logits[:seen]
        self.y[at: at + seen] = 0.0
        self.y[at: at + accepted] = 1.0
        self._next = at + seen
        self._filled = max(self._filled, self._next)
        self.labels += seen
        self._since_fit += seen
        if self._since_fit >= REFIT_EVERY:
            self.fit()

    def fit(self) -> None:
        self._since_fit = 0
        n = self._filled
        x = np.stack([self.z[:n], np.ones(n)], axis=1)
        y = self.y[:n]
        theta = np.array([self.scale, self.shift])
        prior = np.array([1.0, 0.0])
        for _ in range(4):
            p = 1.0 / (1.0 + np.exp(-np.clip(x @ theta, -MAX_LOGIT, MAX_LOGIT)))
            gradient = x.T @ (p - y) + PRIOR_WEIGHT * (theta - prior)
            hessian = (x * (p * (1 - p))[:, None]).T @ x + PRIOR_WEIGHT * np.eye(2)
            theta = theta - np.linalg.solve(hessian, gradient)
        self.scale, self.shift = float(theta[0]), float(theta[1])
