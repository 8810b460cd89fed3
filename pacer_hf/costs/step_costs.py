"""What a vLLM step costs as a function of the tokens it verifies, measured inside the running engine.

A step of vLLM's engine runs the target once over every scheduled token: each decoding request's last
sampled token plus the draft tokens proposed for it. Its time is a curve g(N) over N, the step's
total token count, whose shape depends on the model, the device, the kernels and the batch: flat
while the forward is bound by reading weights (a GPU at small batches), steep once it is bound by
arithmetic (a CPU, or a busy GPU). The proposer times the interval between two of its own calls (the
rest of the step: scheduling, the forward, sampling and rejection) and files it under the step's N.

`seconds(N)`: the median of the last `WINDOW` steps of that N once it has `MIN_SAMPLES`, else a line
fitted to the medians of the measured N (until two N are measured, a prior that makes each extra token
cost `EXPLORE_SLOPE` of a step's per-token time, so that drafting starts and the curve gets measured),
never below the median of a smaller measured N (noise must not make more tokens look cheaper). The
curve is a cached array, refitted when a new N is measured and every `REFIT_EVERY` steps.
"""

from __future__ import annotations

import statistics
from collections import deque

import numpy as np

WINDOW = 32  # steps kept per token count
REFIT_EVERY = 64  # observations between refits of the curve (a fit per step would cost more than the lookup)
MIN_SAMPLES = 3  # steps of one token count before their median stands for it
EXPLORE_SLOPE = 0.1  # before two token counts are measured: each extra token costs this share of the measured step


class StepCosts:
    """Online g(N): seconds of an engine step that verifies N tokens in all (decoding rows plus drafts)."""

    def __init__(self, window: int = WINDOW, min_samples: int = MIN_SAMPLES):
        self.window = window
        self.min_samples = min_samples
        self.samples: dict[int, deque] = {}
        self._curve: np.ndarray | None = None  # g(0..len-1), rebuilt by _refit
        self._since_fit = 0

    def observe(self, tokens: int, seconds: float) -> None:
        if tokens < 1 or not seconds > 0:
            return
        window = self.samples.get(tokens)
        new = window is None
        if new:
            window = self.samples[tokens] = deque(maxlen=self.window)
        window.append(seconds)
        self._since_fit += 1
        # a new token count, or one reaching MIN_SAMPLES, changes the curve's shape at once; else refit now and then
        if new or len(window) == self.min_samples or self._since_fit >= REFIT_EVERY:
            self._curve = None

    def _refit(self, size: int) -> np.ndarray:
        self._since_fit = 0
        sizes = np.array(sorted(self.samples), dtype=np.float64)
        medians = np.array([statistics.median(self.samples[int(n)]) for n in sizes])
        weights = np.array([len(self.samples[int(n)]) for n in sizes], dtype=np.float64)
        if len(sizes) >= 2:  # weighted least squares, closed form
            mean_x, mean_y = np.average(sizes, weights=weights), np.average(medians, weights=weights)
            slope = max(float(np.sum(weights * (sizes - mean_x) * (medians - mean_y))
                              / np.sum(weights * (sizes - mean_x) ** 2)), 0.0)
            intercept = mean_y - slope * mean_x
        else:
            slope = EXPLORE_SLOPE * float(medians[0]) / float(sizes[0])
            intercept = float(medians[0]) - slope * float(sizes[0])
        size = max(size, int(sizes[-1]) + 1)
        curve = intercept + slope * np.arange(size, dtype=np.float64)
        floor = np.full(size, -np.inf)
        trusted = weights >= self.min_samples
        index = sizes[trusted].astype(np.int64)
        curve[index] = medians[trusted]
        floor[index] = medians[trusted]
        # non-decreasing from the measured points on: never cheaper than a smaller measured step
        curve = np.maximum(curve, np.maximum.accumulate(floor))
        self._curve = np.maximum(curve, 1e-9)
        return self._curve

    def curve(self, size: int) -> np.ndarray:
        """g(0..m) for some m >= size, as one array (what `allocate` reads)."""
        if not self.samples:
            return np.arange(size + 1, dtype=np.float64)
        curve = self._curve
        if curve is None or size >= len(curve):
            curve = self._refit(max(2 * size, 64))
        return curve

    def seconds(self, tokens: int) -> float:
        """g(tokens); 1.0 per token before anything is measured (decisions then see a flat curve)."""
        return float(self.curve(tokens)[tokens])

    def table(self) -> dict[int, dict]:
        """{N: {"median_s", "steps"}} of the measured token counts (stats and docs)."""
        return {n: {"median_s": statistics.median(w), "steps": len(w)} for n, w in sorted(self.samples.items())}

    def token_can_pay(self, rows: int) -> bool:
        """Whether a draft token accepted for sure (survival 1) would raise tokens per second at this batch: when
        not, no draft can, and the lookups can be skipped."""
        return (rows + 1) / self.seconds(rows + 1) > rows / self.seconds(rows)


class BatchClock:
    """One batched call's measured costs, for the batch-wide stop (`loops/batch_loop.py`): seconds of a verify forward as a line in the
    tokens it verifies (least squares over the timed rounds), of a lockstep draft step, of a pre-verifier call."""

    def __init__(self):
        self.sums = [0, 0.0, 0.0, 0.0, 0.0]  # n, Σx, Σy, Σxx, Σxy over (tokens, seconds) of verify forwards
        self.widths: set[int] = set()
        self.draft_step = self.preverifier_call = None

    def verify(self, tokens: int, seconds: float) -> None:
        n, sx, sy, sxx, sxy = self.sums
        self.sums = [n + 1, sx + tokens, sy + seconds, sxx + tokens * tokens, sxy + tokens * seconds]
        self.widths.add(tokens)

    @staticmethod
    def average(old: float | None, seconds: float) -> float:
        return seconds if old is None else 0.8 * old + 0.2 * seconds

    def ready(self) -> bool:
        return len(self.widths) >= 2 and self.draft_step is not None and self.preverifier_call is not None

    def verify_seconds(self, tokens: int) -> float:
        n, sx, sy, sxx, sxy = self.sums
        slope = max(0.0, (n * sxy - sx * sy) / max(n * sxx - sx * sx, 1e-12))
        return (sy - slope * sx) / n + slope * tokens
