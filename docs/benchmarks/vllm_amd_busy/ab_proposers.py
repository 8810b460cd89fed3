"""A/B proposers for the busy-engine runs: PacerLookupProposer with the step-cost curve as it was before fe15502
(past a measured N, flat at its median until the fitted line crosses it; the runs used a verbatim copy of the old
method, this is the same computation on top of the current line fit), and a proposer that proposes nothing."""
import numpy as np

from pacer_hf.costs.step_costs import StepCosts
from pacer_hf.vllm.proposer import PacerLookupProposer


class OldCurve(StepCosts):
    def _fit_line(self, size):
        super()._fit_line(size)  # sets self.params: the same weighted line (intercept, slope) as before the change
        intercept, slope = self.params
        xs, medians, counts = self.medians()
        size = max(size, int(xs[-1]) + 1)
        table = intercept + slope * np.arange(size, dtype=np.float64)
        floor = np.full(size, -np.inf)
        trusted = counts >= self.min_samples
        table[xs[trusted]] = floor[xs[trusted]] = medians[trusted]  # measured sizes; flat after them
        return np.maximum(np.maximum(table, np.maximum.accumulate(floor)), 1e-9)


class OldProposer(PacerLookupProposer):
    def __init__(self, vllm_config, gate=None):
        super().__init__(vllm_config, gate)
        self.costs = OldCurve()


class OldFresh(OldProposer):
    """Without the cache of earlier requests, as the benchmark's pacer-fresh."""

    def __init__(self, vllm_config, gate=None):
        super().__init__(vllm_config, gate)
        self.suffix_cache = None


class Nothing:
    """Proposes nothing, ever: what vLLM's speculative path costs by itself."""

    def __init__(self, vllm_config, *args, **kwargs):
        pass

    def load_model(self, *args, **kwargs):
        pass

    def propose(self, sampled_token_ids, *args, **kwargs):
        return [[] for _ in sampled_token_ids]
