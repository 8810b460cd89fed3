"""What a vLLM step costs as a function of the tokens it verifies, measured inside the running engine.

A step of vLLM's engine runs the target once over every scheduled token: each decoding request's last
sampled token plus the draft tokens proposed for it. Its time is a curve g(N) over N, the step's
total token count, whose shape depends on the model, the device, the kernels and the batch: flat
while the forward is bound by reading weights (a GPU at small batches), steep once it is bound by
arithmetic (a CPU, or a busy GPU). The proposer times the interval between two of its own calls (the
rest of the step: scheduling, the forward, sampling and rejection) and files it under the step's N.

`seconds(N)`: the median of the last `WINDOW` steps of that N once it has `MIN_SAMPLES`, joined linearly
between such N and never below the median of a smaller one (noise must not make more tokens look cheaper);
past the largest, rising at the slope of the measured N near it (a busy CPU step is arithmetic-bound: a
line fitted mostly to lone requests' steps would make its extra tokens look almost free); elsewhere a line
fitted to the medians (until two N are measured, a prior that makes each extra token cost `EXPLORE_SLOPE`
of a step's per-token time, so that drafting starts and the curve gets measured). The
curve is a cached array, refitted when a new N is measured and every `REFIT_EVERY` steps: `CostCurve`'s "line"
policy (costs/curve.py), which the batched loop's verify clock (`BatchClock`) uses too.
"""

from __future__ import annotations

import statistics

import numpy as np

from .curve import CostCurve

WINDOW = 32  # steps kept per token count
REFIT_EVERY = 64  # observations between refits of the curve (a fit per step would cost more than the lookup)
MIN_SAMPLES = 3  # steps of one token count before their median stands for it
EXPLORE_SLOPE = 0.1  # before two token counts are measured: each extra token costs this share of the measured step


class StepCosts(CostCurve):
    """Online g(N): seconds of an engine step that verifies N tokens in all (decoding rows plus drafts), a
    `CostCurve` over N with no base and the "line" policy."""

    def __init__(self, window: int = WINDOW, min_samples: int = MIN_SAMPLES):
        super().__init__(None, "engine", fit="line", window=window, min_samples=min_samples, refit_every=REFIT_EVERY,
                         explore_slope=EXPLORE_SLOPE)

    def observe(self, tokens: int, seconds: float) -> None:
        if tokens >= 1:
            super().observe(tokens, seconds)

    def curve(self, size: int) -> np.ndarray:
        """g(0..m) for some m >= size, as one array (what `allocate` reads)."""
        return self.values(size)

    def seconds(self, tokens: int) -> float:
        """g(tokens); 1.0 per token before anything is measured (decisions then see a flat curve)."""
        return float(self.values(tokens)[tokens])

    def table(self) -> dict[int, dict]:
        """{N: {"median_s", "steps"}} of the measured token counts (stats and docs)."""
        return {n: {"median_s": statistics.median(w), "steps": len(w)} for n, w in sorted(self.samples.items())}

    def measured(self, tokens: int) -> bool:
        """Whether g(tokens) rests on its own steps (`min_samples` of them) rather than on other sizes."""
        return len(self.samples.get(tokens, ())) >= self.min_samples

    def token_can_pay(self, rows: int) -> bool:
        """Whether a draft token accepted for sure (survival 1) would raise tokens per second at this batch: when
        not, no draft can, and the lookups can be skipped."""
        return (rows + 1) / self.seconds(rows + 1) > rows / self.seconds(rows)


class BatchClock:
    """One batched call's measured costs, for the batch-wide stop (`loops/batch_loop.py`): seconds of a verify
    forward in the tokens it verifies (`verify_curve`, the "line" policy StepCosts uses: a line through the
    per-width medians, the medians themselves where measured), exponential averages of a lockstep draft step and of
    a pre-verifier call."""

    def __init__(self):
        self.verify_curve = CostCurve(None, "batch", fit="line", window=WINDOW, min_samples=MIN_SAMPLES,
                                      refit_every=REFIT_EVERY // 4)
        self.draft_step = self.preverifier_call = None

    def verify(self, tokens: int, seconds: float) -> None:
        self.verify_curve.observe(tokens, seconds)

    @staticmethod
    def average(old: float | None, seconds: float) -> float:
        return seconds if old is None else 0.8 * old + 0.2 * seconds

    def ready(self) -> bool:
        return len(self.verify_curve.samples) >= 2 and self.draft_step is not None and self.preverifier_call is not None

    def verify_seconds(self, tokens: int) -> float:
        return self.verify_curve.at(tokens)
