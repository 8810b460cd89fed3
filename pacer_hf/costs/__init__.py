"""Costs: what work costs where the call runs, measured once and kept as curves (below loops/ and strategies/).

- `measure`:     the one timing loop (`timed`, CUDA synchronized; `timer` repeats it) and what is built on it:
                 cached-forward timers, the probe of every verify width, interleaved medians, the fastest of repeats; where a
                 measurement was taken (`model_key`, `processor_name`).
- `curve`:       `CostCurve`, the one cost-curve type: cost as a function of a proposal length, verify width or
                 step tokens, from a base table (prior, probe, given; `describe`: where it was measured) refined
                 online by one policy ("scale": a * base + b; "line": a line through per-x medians, never
                 decreasing past a measured point), extrapolated linearly past its table, stored as a dict.
                 Every curve below is one:
- `round_costs`: `RoundCosts`, the seconds of a round proposing k tokens, prior -> probed -> refined online by
                 the call's rounds ("scale"; `resolve_costs`, `pacer_costs=`), cached per model and machine.
- `cost_model`:  `CostModel`, a pair's costs relative to one target step as calibration records them
                 (`config.calibration`, bare lists), its tables read as curves, for the simulator and the benchmark.
- `step_costs`:  online curves over the tokens one forward verifies ("line"): vLLM's engine step (`StepCosts`)
                 and the batched loop's verify curve with its draft/pre-verifier averages (`BatchClock`).
The decision rules that read these costs stay in the Hub-loadable `modeling_*.py`; the loop's pieces (a draft
step, the pre-verifier's work per token) are timed by `loops/probes.py` through `measure.timer`.
"""

from .cost_model import CostModel
from .curve import CostCurve
from .measure import (
    cached_forward_timer,
    cpu_name,
    fastest,
    interleaved,
    model_key,
    processor_name,
    synchronize,
    time_forwards,
    timed,
    timer,
)
from .round_costs import (
    COST_MODES,
    RoundClock,
    RoundCosts,
    cached_probe,
    check_cost_mode,
    forward_costs,
    lookup_costs,
    resolve_costs,
)
from .step_costs import BatchClock, StepCosts

__all__ = ["COST_MODES", "BatchClock", "CostCurve", "CostModel", "RoundClock", "RoundCosts", "StepCosts",
           "cached_forward_timer", "cached_probe", "check_cost_mode", "cpu_name", "fastest", "forward_costs",
           "interleaved", "lookup_costs",
           "model_key", "processor_name", "resolve_costs", "synchronize", "time_forwards", "timed", "timer"]
