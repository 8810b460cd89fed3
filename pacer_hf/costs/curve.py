"""One cost curve: what a round or a step costs as a function of an integer x (a proposal length k, a verify width,
the tokens N of an engine step), prior -> probed -> refined online, and where it was measured.

A `CostCurve` starts from a base table (`source`: "prior" shipped in a config, "probe" timed on first use, "given"
by the caller, ...; `describe`: device, dtype, threads, processor, key) or from nothing, keeps a bounded window of
observations per x (`observe`) and refines the base by one policy, `fit`:

- `None`:    the base as it is; observations are ignored.
- `"scale"`: cost(x) = a * base[x] + b, a > 0 and b >= 0 least squares over the per-x medians weighted by their
             counts, once `min_samples` observations are kept in all, refitted every `refit_every` after that. The
             base keeps the curve's shape (which widths this machine's kernels make slow), the observations supply
             its scale and the per-round work the base leaves out (costs/round_costs.py says why medians per x
             alone are no curve for a round). x = 0 is a round that proposes nothing, a plain step without the
             verification's per-round work: once it and the x >= 1 rounds each hold `min_samples` observations,
             the latter at two lengths or more, the fit runs over x >= 1 and cost(0) is its own median. At one
             proposing length the line runs through both medians unless that needs b < 0: then cost(0) is its own
             median and the proposing length sets the scale. Inside one fit a plain step could only be as cheap as the
             base says, and where the base prices a proposing round near a plain step (a probe whose one-token forward
             came out slow) the rule would keep drafting on the base's ratio.
- `"line"`:  a weighted least-squares line through the per-x medians (slope >= 0); where x's with `min_samples`
             observations exist, their medians (never below the median of a smaller such x: noise must not make
             more tokens look cheaper), joined linearly, and past the largest of them a rise at the line's slope
             or, if steeper, the slope of the measured points in the upper half of their range (`rising_slope`).
             With one x measured, a prior line through it whose extra token costs `explore_slope` of its per-token
             cost. Refitted when a new x is seen, when an x reaches `min_samples`,
             and every `refit_every` observations. The table extends on demand to any x.

Before any refinement the base decides; with no base and nothing observed, cost(x) = x (one unit per token, flat
per token: nothing pays). Past the table's end, costs extrapolate linearly from its last two entries: the one
extrapolation rule. `relative(unit)` divides by the cost at x = 0 (or by a unit, such as one target step);
`to_dict`/`from_dict` store the current table with its source and description.
"""

from __future__ import annotations

import statistics
from collections import deque

import numpy as np

FITS = (None, "scale", "line")


class CostCurve:
    """cost(x) for x = 0, 1, ...: a base table refined online by one policy (module docstring)."""

    def __init__(self, base: list[float] | None = None, source: str = "given", describe: dict | None = None, *,
                 fit: str | None = None, window: int = 64, min_samples: int = 3, refit_every: int = 64,
                 explore_slope: float = 0.1):
        if fit not in FITS:
            raise ValueError(f"fit={fit!r}: choose one of {FITS}.")
        if base is not None and len(base) == 0:
            raise ValueError("a cost table needs a value per x = 0, 1, ...; got an empty one.")
        if fit == "scale" and base is None:
            raise ValueError("fit='scale' scales a base table: pass one.")
        self.base = None if base is None else [float(v) for v in base]
        self.source = source
        self.describe = dict(describe or {})
        self.policy = fit
        self.window, self.min_samples, self.refit_every = window, min_samples, refit_every
        self.explore_slope = explore_slope
        self.samples: dict[int, deque] = {}  # x -> the latest `window` observations at x
        self.observed = 0  # observations in all (the windows keep the latest)
        self.params = (1.0, 0.0) if fit == "scale" else None  # "scale": (a, b); "line": (intercept, slope)
        self._refit_at = min_samples if fit == "scale" else refit_every
        self._table: np.ndarray | None = None

    # observations

    def observe(self, x: int, seconds: float) -> None:
        """Keep one observation of cost(x); a refit falls due as the policy says (done lazily, on the next read)."""
        if self.policy is None or x < 0 or not seconds > 0 or (self.policy == "scale" and x >= len(self.base)):
            return
        window = self.samples.get(x)
        new = window is None
        if new:
            window = self.samples[x] = deque(maxlen=self.window)
        window.append(seconds)
        self.observed += 1
        due = self.observed >= self._refit_at
        if self.policy == "line":  # a new x, or one reaching min_samples, changes the line's shape at once
            due = due or new or len(window) == self.min_samples
        if due:
            self._refit_at = self.observed + self.refit_every
            self._table = None

    @property
    def kept(self) -> int:
        """Observations in the windows."""
        return sum(len(window) for window in self.samples.values())

    def refined(self) -> bool:
        """Whether observations have replaced the base (the "+online" of a summary)."""
        if self.policy == "scale":
            return self.kept >= self.min_samples
        return self.policy == "line" and bool(self.samples)

    def medians(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(x, median, count) of the observed x, in increasing x."""
        xs = sorted(self.samples)
        return (np.array(xs, dtype=np.int64), np.array([statistics.median(self.samples[x]) for x in xs]),
                np.array([len(self.samples[x]) for x in xs], dtype=np.float64))

    # the estimate

    def values(self, upto: int = 0) -> np.ndarray:
        """The current table cost(0..m), m >= upto for the line policy (else the table's end); refitted when due."""
        table = self._table
        open_ended = self.base is None or (self.policy == "line" and bool(self.samples))
        if table is None or (open_ended and upto >= len(table)):
            table = self._table = self._fit(upto)
        return table

    def _fit(self, upto: int) -> np.ndarray:
        alone = None  # the median of x = 0, when it stands apart from the fit
        if self.policy == "scale" and self.refined():
            xs, medians, counts = self.medians()
            proposing = xs > 0
            base = np.asarray(self.base)
            apart = xs[0] == 0 and counts[0] >= self.min_samples and counts[proposing].sum() >= self.min_samples
            if apart and proposing.sum() == 1:  # one proposing length: the line through both, unless it needs b < 0
                scale, offset = fit_scale(base[xs], medians, counts)
                apart = not np.allclose(scale * base[xs] + offset, medians, rtol=1e-6, atol=0.0)
            if apart:
                alone, xs, medians, counts = medians[0], xs[proposing], medians[proposing], counts[proposing]
            self.params = fit_scale(base[xs], medians, counts)
        elif self.policy == "line" and self.samples:
            return self._fit_line(max(2 * upto, 64))
        if self.base is None:
            return np.arange(max(2 * upto, 64), dtype=np.float64)  # one unit per x
        scale, offset = self.params or (1.0, 0.0)
        table = scale * np.asarray(self.base) + offset
        if alone is not None:
            table[0] = alone
        return table

    def _fit_line(self, size: int) -> np.ndarray:
        xs, medians, counts = self.medians()
        if len(xs) >= 2:  # weighted least squares, closed form
            mean_x, mean_y = np.average(xs, weights=counts), np.average(medians, weights=counts)
            slope = max(float(np.sum(counts * (xs - mean_x) * (medians - mean_y))
                              / np.sum(counts * (xs - mean_x) ** 2)), 0.0)
            intercept = float(mean_y - slope * mean_x)
        else:
            slope = self.explore_slope * float(medians[0]) / max(int(xs[0]), 1)
            intercept = float(medians[0]) - slope * int(xs[0])
        self.params = (intercept, slope)
        size = max(size, int(xs[-1]) + 1)
        grid = np.arange(size, dtype=np.float64)
        table = intercept + slope * grid
        trusted = counts >= self.min_samples
        if trusted.any():
            known, cost = xs[trusted], np.maximum.accumulate(medians[trusted])  # never cheaper than a smaller x
            table[: known[0]] = np.minimum(table[: known[0]], cost[0])
            table[known[0]: known[-1] + 1] = np.interp(grid[known[0]: known[-1] + 1], known, cost)
            table[known[-1] + 1:] = cost[-1] + rising_slope(known, cost, slope) * (grid[known[-1] + 1:] - known[-1])
        return np.maximum(table, 1e-9)

    def at(self, x):
        """cost(x) for an int (a float back) or an array of them, extrapolated linearly past the table."""
        xs = np.asarray(x)
        table = self.values(int(xs.max(initial=0)))
        out = extrapolate(table, xs)
        return float(out) if out.ndim == 0 else out

    def relative(self, unit: float | None = None) -> np.ndarray:
        """The table divided by `unit` (default: the cost at x = 0, one plain decoding step for a round)."""
        table = self.values()
        return table / (table[0] if unit is None else unit)

    # storage

    def to_dict(self) -> dict:
        """The current table with where it came from: {"values", "source", "describe"}."""
        return {"values": [float(v) for v in self.values()], "source": self.source, "describe": dict(self.describe)}

    @classmethod
    def from_dict(cls, stored, **policy) -> CostCurve:
        """A curve from `to_dict`'s dict, or from a bare list of values (how `config.calibration` and the shipped
        configs store a curve: `verify_cost`, `round_cost`); `policy`: the constructor's keywords (fit, window...)."""
        if isinstance(stored, dict):
            return cls(list(stored["values"]), stored.get("source", "given"), stored.get("describe"), **policy)
        return cls(list(stored), "given", **policy)


def fit_scale(base: np.ndarray, medians: np.ndarray, counts: np.ndarray) -> tuple[float, float]:
    """(a, b) with a > 0, b >= 0 minimising sum_x n_x (median_x - a * base_x - b)^2 (n_x observations, median_x their
    median); one x alone, or a fit that would need b < 0, gives b = 0."""
    if len(base) > 1:
        design = np.stack([base, np.ones_like(base)], 1) * np.sqrt(counts)[:, None]
        (scale, offset), *_ = np.linalg.lstsq(design, medians * np.sqrt(counts), rcond=None)
        if scale > 0 and offset >= 0:
            return float(scale), float(offset)
    return float((counts * medians * base).sum() / (counts * base * base).sum()), 0.0


def rising_slope(known: np.ndarray, cost: np.ndarray, slope: float) -> float:
    """What each x past the largest measured one adds: the line's slope, or the slope of the measured points in the
    upper half of the measured range (the two largest at least) where that is steeper. A curve flat at small x (a
    forward bound by reading weights) and steep at large x (bound by arithmetic) gives a line too flat for its top;
    charging the next x the line's slope, or nothing, would make tokens past a busy step look almost free."""
    if len(known) < 2:
        return slope
    upper = known >= min(known[-1] / 2, known[-2])  # the upper half, and the two largest at least
    x, y = known[upper].astype(np.float64), cost[upper]
    local = float(np.sum((x - x.mean()) * (y - y.mean())) / np.sum((x - x.mean()) ** 2))
    return max(slope, local)


def extrapolate(table, x) -> np.ndarray:
    """`table[x]` elementwise, extended linearly past the table's end by its last two entries."""
    table = np.asarray(table, dtype=np.float64)
    x = np.asarray(x)
    if int(x.max(initial=0)) >= len(table):
        slope = table[-1] - table[-2] if len(table) > 1 else 0.0
        return np.where(x < len(table), table[np.minimum(x, len(table) - 1)], table[-1] + slope * (x - len(table) + 1))
    return table[x]
