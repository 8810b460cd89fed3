"""Sampling through Pacer keeps the target's distribution (stop-only rule; docs/ALGORITHM.md).

The exact target distribution of the first one and two new tokens is computed from the target's
logits; Pacer samples are compared with it by a chi-square goodness-of-fit test (fixed seeds, so
the test is deterministic). A deliberately lossy strategy must fail the same test: the test has
the power to catch a biased sampler.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from conftest import make_preverifier
from helpers import TEMPERATURE, exact_distributions, goodness_of_fit, sample_counts

from pacer_hf.loops.draft_loop import PacerCandidateGenerator
from pacer_hf.stats import PacerStats
from pacer_hf.strategies import STRATEGY_TYPES, StrategyCall, StrategyConfig, register_strategy


def test_pacer_sampling_matches_target_distribution(sampling_pair):
    """The expected-gain rule under given costs. The block rule's test on this pair is the strategy matrix's
    "pacer" (test_strategies_conformance.py), and on five other model families test_families.py's."""
    target, draft = sampling_pair
    p1, p12 = exact_distributions(target)
    costs = {"draft_cost": 0.1, "verify_cost": [1.0 + 0.05 * k for k in range(9)], "round_overhead": 0.1}
    pv = make_preverifier(draft, block_size=2, threshold=0.4, max_draft_tokens=4, decision_rule="expected_gain",
                          calibration=costs)
    # the costs above, not this machine's
    first, joint, accepted = sample_counts(target, draft, pv, seed=0, pacer_costs="prior")
    assert 0 < sum(accepted) < 2 * len(accepted), "drafts must be partly accepted for the test to mean much"
    assert goodness_of_fit(first, p1) > 1e-3
    assert goodness_of_fit(joint, p12) > 1e-3


class _GreedyDraftClaimingSampling(PacerCandidateGenerator):
    """Lossy on purpose: drafts greedily but reports the sampling distribution as q."""

    def get_candidates(self, input_ids, **kwargs):
        self.do_sample = False
        candidates, _ = super().get_candidates(input_ids, **kwargs)
        if candidates.shape[1] == input_ids.shape[1]:
            return candidates, None
        with torch.no_grad():
            logits = self.draft(candidates).logits[:, input_ids.shape[1] - 1:-1] / TEMPERATURE
        return candidates, logits


@dataclass(frozen=True)
class _LossyConfig(StrategyConfig):
    strategy_type: ClassVar[str] = "lossy-test"
    use_preverifier: bool = False


def _lossy(config, context) -> StrategyCall:
    stats = PacerStats(strategy="lossy")
    return StrategyCall("lossy", lambda generation_config, processors: _GreedyDraftClaimingSampling(
        context.draft, generation_config, processors, max_draft_tokens=3, stats=stats), stats)


def test_distribution_test_detects_a_lossy_sampler(sampling_pair):
    target, draft = sampling_pair
    p1, p12 = exact_distributions(target)
    register_strategy(_LossyConfig, _lossy)
    try:
        first, joint, _ = sample_counts(target, draft, _LossyConfig(), seed=0, samples=600)
    finally:
        del STRATEGY_TYPES["lossy-test"]
    assert min(goodness_of_fit(first, p1), goodness_of_fit(joint, p12)) < 1e-3
