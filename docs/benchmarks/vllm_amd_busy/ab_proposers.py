"""A/B helper (not part of the repository): PacerLookupProposer with the step-cost curve as it was before fe15502
(past a measured N, flat at its median until the global line crosses it)."""
import numpy as np

from pacer_hf.costs.step_costs import StepCosts
from pacer_hf.vllm.proposer import PacerLookupProposer


class OldCurve(StepCosts):
    def _fit_line(self, size):
        xs, medians, counts = self.medians()
        if len(xs) >= 2:
            mean_x, mean_y = np.average(xs, weights=counts), np.average(medians, weights=counts)
            slope = max(float(np.sum(counts * (xs - mean_x) * (medians - mean_y))
                              / np.sum(counts * (xs - mean_x) ** 2)), 0.0)
            intercept = float(mean_y - slope * mean_x)
        else:
            slope = self.explore_slope * float(medians[0]) / max(int(xs[0]), 1)
            intercept = float(medians[0]) - slope * int(xs[0])
        self.params = (intercept, slope)
        size = max(size, int(xs[-1]) + 1)
        table = intercept + slope * np.arange(size, dtype=np.float64)
        floor = np.full(size, -np.inf)
        trusted = counts >= self.min_samples
        table[xs[trusted]] = floor[xs[trusted]] = medians[trusted]
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
