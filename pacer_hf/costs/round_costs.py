"""What a round costs where the call runs: the numbers behind every expected-gain decision.

A stop rule compares expected tokens per unit of time across proposal lengths, so it needs the cost of
a round that proposes k tokens with this model, device, dtype and thread count, never the machine a
gate or pre-verifier was trained on: matrix kernels change the curve's shape between CPUs (on one,
2-3 rows of a large output layer are the slow widths; on another, 4 and more are) and a GPU's is flat.
Costs come from, best last:

- `prior`:  a table shipped in the gate's or pre-verifier's config (the training machine's), used only
            when asked for (`pacer_costs="prior"`);
- `probe`:  on first use, a short timing of the target's cached forwards of every verify width (and,
            for a draft, its step and the pre-verifier's per-token cost), interleaved, minimum over
            passes; cached for the process and, when `$PACER_HF_COST_CACHE` names a file, on disk,
            keyed by what it measured;
- `online`: the loop's own round timings (from handing out the candidates to receiving the verdict), refining
            the probe as the call runs and across calls: seconds(k) = a * probe(k) + b fitted to them, so the
            probe keeps the curve's shape (which widths this machine's kernels make slow) and the rounds supply
            its scale and the per-round work the probe leaves out. Per-length medians of the rounds alone are
            no curve: each length is chosen in different contexts and seen a handful of times, and a rule fed
            such a table (k = 6 at 1.14 plain steps, k = 7 at 2.25 in one run here) prefers lengths by noise.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

import torch
from transformers import PreTrainedModel

from .curve import CostCurve
from .measure import model_key, processor_name, time_forwards

COST_MODES = ("measure", "probe", "prior")  # pacer_costs=...; or a list of relative costs k = 0..K
COST_CACHE_ENV = "PACER_HF_COST_CACHE"
MIN_ROUNDS = 8  # online rounds before they refine the probe
REFIT_EVERY = 16  # rounds between refits after that (a fit costs ≈ 0.3 ms, a small model's round ≈ 15 ms)
WINDOW = 64  # the latest online rounds kept per proposal length


def check_cost_mode(value) -> str | list[float]:
    """generate's pacer_costs=: where expected-gain rules take round costs. "measure" (default: a probe on first
    use, refined by the call's own rounds), "probe", "prior" (the config's table, measured where the gate or
    pre-verifier was trained), or a list of relative costs for k = 0, 1, ... proposed tokens."""
    if isinstance(value, (list, tuple)):
        if not value or not all(isinstance(v, (int, float)) and v > 0 for v in value):
            raise ValueError(f"pacer_costs={value!r}: a cost list needs positive numbers, one per proposed-token "
                             "count k = 0, 1, ... (k = 0: one plain decoding step).")
        return [float(v) for v in value]
    if value not in COST_MODES:
        raise ValueError(f"pacer_costs={value!r}: choose one of {COST_MODES} (default 'measure') or pass a list of "
                         "relative round costs.")
    return value


class RoundCosts(CostCurve):
    """Seconds of a round proposing k = 0..K tokens: a `CostCurve` over k with the probe (or a given table) as its
    base and the "scale" policy (without `online`, none). From `MIN_ROUNDS` observed rounds on (refitted every
    `REFIT_EVERY`), seconds(k) = a * probe[k] + b with a > 0, b >= 0 fitted (least squares, weighted by rounds) to
    the medians of the observed rounds per length: the probe's shape, the rounds' scale, and b for the per-round
    work a bare forward does not include. Decisions compare rates across lengths, so only the curve's shape and
    that offset matter."""

    def __init__(self, probe: list[float], source: str, describe: dict | None = None, probe_seconds: float = 0.0,
                 online: bool = True, per_token: float | None = None):
        if not probe or min(probe) <= 0:
            raise ValueError(f"round costs must be positive numbers, one per proposal length k = 0..K; got {probe!r}.")
        super().__init__(probe, source, describe, fit="scale" if online else None, window=WINDOW,
                         min_samples=MIN_ROUNDS, refit_every=REFIT_EVERY)
        self.probe_seconds = probe_seconds
        self.online = online
        self.per_token = per_token  # the drafting share of the base curve per proposed token (a draft's; None: lookup)

    @property
    def probe(self) -> list[float]:
        return self.base

    @property
    def fit(self) -> tuple[float, float]:
        """(a, b) of the current estimate ((1, 0) before the rounds refine it)."""
        self.values()
        return self.params or (1.0, 0.0)

    def seconds(self) -> list[float]:
        """The current estimate per k (refitted lazily once `observe` has made a fit due)."""
        return self.values().tolist()

    def token_seconds(self) -> float | None:
        """What one drafted token adds to a round in the current estimate (the base's per-token share, scaled as the
        rounds refine it); None where the base does not say (prompt lookup)."""
        return None if self.per_token is None else self.fit[0] * self.per_token

    def table(self) -> list[float]:
        """The estimate relative to k = 0 (one plain decoding step for prompt lookup)."""
        return self.relative().tolist()

    def summary(self) -> dict:
        """What decided the call, for `last_stats(model).costs`."""
        online = self.refined()
        scale, offset = self.fit
        return {"source": self.source + ("+online" if online else ""), "table": [round(v, 4) for v in self.table()],
                "probe_seconds": round(self.probe_seconds, 3), "online_rounds": self.kept if online else 0,
                "fit": {"scale": round(scale, 4), "offset_ms": round(1000 * offset, 3)}, **self.describe}


class RoundClock:
    """A candidate generator's round timing for its `RoundCosts`: from handing out the candidates (`handed_out`)
    to the verdict (`verdict`). The call's first round, which also reads the prompt, is handed out untimed."""

    def __init__(self, costs: RoundCosts | None):
        self.costs = costs
        self.start: float | None = None
        self.proposed = 0  # tokens proposed by the round in flight

    def handed_out(self, proposed: int, start: float | None) -> None:
        self.start, self.proposed = start, proposed

    def verdict(self) -> None:
        if self.start is not None and self.costs is not None:
            self.costs.observe(self.proposed, time.perf_counter() - self.start)
        self.start = None


_PROCESS: dict[str, RoundCosts] = {}  # one per key: online refinements carry over between calls
_FORWARDS: dict[str, tuple[list[float], float]] = {}  # key -> (seconds per verify width, probe wall time)


def resolve_costs(mode, *, prior: list[float] | None, what: str, probe, prior_per_token: float | None = None
                  ) -> RoundCosts:
    """The RoundCosts a call decides with. `mode`: "measure" (probe + online), "probe", "prior" (`prior`, the
    config's table), or a list of relative costs k = 0..K. `probe()` returns (key, describe, seconds, wall,
    per_token): per_token is the probe's seconds of one drafted token (None where nothing is drafted).
    `prior_per_token`: a drafted token's cost in the units of `prior` and of a given list (one target step), from
    the config's calibration."""
    mode = check_cost_mode(mode)
    if isinstance(mode, list):
        return RoundCosts(mode, "given", online=False, per_token=prior_per_token)
    if mode == "prior":
        if not prior:
            raise ValueError(f"pacer_costs='prior': {what} has no cost table in its config; pass pacer_costs="
                             "'measure' (the default) to measure this machine's.")
        return RoundCosts(list(prior), "prior", online=False, per_token=prior_per_token)
    key, describe, seconds, wall, per_token = probe()
    key = f"{mode}:{key}"
    if key not in _PROCESS:
        _PROCESS[key] = RoundCosts(seconds, "probe", describe, wall, online=mode == "measure", per_token=per_token)
    return _PROCESS[key]


def lookup_costs(model: PreTrainedModel, max_tokens: int, mode, prior: list[float] | None) -> RoundCosts:
    """Prompt lookup proposing k = 0..max_tokens tokens: a target forward over k + 1 tokens per round."""
    return resolve_costs(mode, prior=prior, what="the lookup gate", probe=lambda: (*forward_costs(model, max_tokens + 1), None))


def cached_probe(key: str, measure) -> tuple[list[float], float]:
    """(`measure()`, its wall time), measured once per process for `key`."""
    if key not in _FORWARDS:
        start = time.perf_counter()
        value = measure()
        _FORWARDS[key] = (value, time.perf_counter() - start)
    return _FORWARDS[key]


def forward_costs(model: PreTrainedModel, widths: int) -> tuple[str, dict, list[float], float]:
    """(key, description, seconds of a cached forward over 1..widths tokens, probe wall time): from this
    process's earlier probe, the disk cache, or a new probe (`time_forwards`)."""
    key = model_key(model) + f"|w{widths}"
    describe = {"device": str(model.device), "dtype": str(model.dtype).replace("torch.", ""),
                "threads": torch.get_num_threads(), "processor": processor_name()}
    if key not in _FORWARDS:
        cached = _read_disk(key)
        if cached is not None:
            _FORWARDS[key] = (cached, 0.0)
        else:
            start = time.perf_counter()
            seconds = time_forwards(model, widths)
            _FORWARDS[key] = (seconds, time.perf_counter() - start)
            _write_disk(key, describe, seconds)
    seconds, wall = _FORWARDS[key]
    return hashlib.sha1(key.encode()).hexdigest()[:16], describe, list(seconds), wall


def _read_disk(key: str) -> list[float] | None:
    path = os.environ.get(COST_CACHE_ENV)
    if not path or not Path(path).is_file():
        return None
    try:
        entry = json.loads(Path(path).read_text()).get(key)
    except (OSError, ValueError):
        return None
    return entry["seconds"] if entry else None


def _write_disk(key: str, describe: dict, seconds: list[float]) -> None:
    path = os.environ.get(COST_CACHE_ENV)
    if not path:
        return
    file = Path(path)
    try:
        entries = json.loads(file.read_text()) if file.is_file() else {}
    except ValueError:
        entries = {}
    entries[key] = {**describe, "seconds": seconds, "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    file.parent.mkdir(parents=True, exist_ok=True)
    tmp = file.with_suffix(file.suffix + ".tmp")
    tmp.write_text(json.dumps(entries, indent=1))
    tmp.replace(file)
