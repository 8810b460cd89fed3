"""Sampling through Pacer keeps the target's distribution (stop-only rule, DESIGN §5).

The exact target distribution of the first one and two new tokens is computed from the target's
logits; Pacer samples are compared with it by a chi-square goodness-of-fit test (fixed seeds, so
the test is deterministic). A deliberately lossy strategy must fail the same test: the test has
the power to catch a biased sampler.
"""

from __future__ import annotations

import pytest
import torch
from conftest import build_draft, build_model, make_preverifier
from scipy.stats import chisquare

import pacer_hf
from pacer_hf.candidate_generator import PacerCandidateGenerator
from pacer_hf.generation import STRATEGIES, StrategyCall
from pacer_hf.stats import PacerStats

VOCAB = 10
TEMPERATURE = 0.9
SAMPLES = 2000
PROMPT = torch.tensor([[1, 7, 3, 3, 8]])


@pytest.fixture(scope="module")
def sampling_pair():
    target = build_model("llama", vocab_size=VOCAB, hidden=32, seed=3).double()
    draft = build_draft(target, "noisy", noise=0.3)
    pacer_hf.enable(target)
    return target, draft


def exact_distributions(target) -> tuple[torch.Tensor, torch.Tensor]:
    """p(t1) and p(t1, t2) of the target at TEMPERATURE after PROMPT."""
    with torch.no_grad():
        first = torch.softmax(target(PROMPT).logits[0, -1] / TEMPERATURE, -1)
        extended = torch.cat([PROMPT.repeat(VOCAB, 1), torch.arange(VOCAB)[:, None]], 1)
        second = torch.softmax(target(extended).logits[:, -1] / TEMPERATURE, -1)
    return first, first[:, None] * second


def goodness_of_fit(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Chi-square p-value, pooling cells whose expected count is below 5."""
    expected = probs.flatten() * counts.sum()
    counts = counts.flatten().double()
    small = expected < 5
    observed = torch.cat([counts[~small], counts[small].sum(0, keepdim=True)])
    wanted = torch.cat([expected[~small], expected[small].sum(0, keepdim=True)])
    keep = wanted > 0
    return float(chisquare(observed[keep].numpy(), wanted[keep].numpy()).pvalue)


def sample_counts(target, draft, pacer, seed: int, samples: int = SAMPLES) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    torch.manual_seed(seed)
    first, joint, accepted = torch.zeros(VOCAB), torch.zeros(VOCAB, VOCAB), []
    for _ in range(samples):
        out = target.generate(PROMPT, max_new_tokens=4, do_sample=True, temperature=TEMPERATURE, top_k=0,
                              assistant_model=draft, pacer=pacer)
        t1, t2 = out[0, PROMPT.shape[1]:PROMPT.shape[1] + 2].tolist()
        first[t1] += 1
        joint[t1, t2] += 1
        accepted += pacer_hf.last_stats(target).accepted
    return first, joint, accepted


def test_pacer_sampling_matches_target_distribution(sampling_pair):
    target, draft = sampling_pair
    p1, p12 = exact_distributions(target)
    pv = make_preverifier(draft, block_size=2, threshold=0.4, max_draft_tokens=4)
    first, joint, accepted = sample_counts(target, draft, pv, seed=0)
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


def test_distribution_test_detects_a_lossy_sampler(sampling_pair):
    target, draft = sampling_pair
    p1, p12 = exact_distributions(target)

    def lossy(model, draft_model, kwargs):
        stats = PacerStats(strategy="lossy")
        return StrategyCall("lossy", lambda **kw: _GreedyDraftClaimingSampling(**kw, max_draft_tokens=3,
                                                                                stats=stats), stats)

    STRATEGIES["lossy-test"] = lossy
    try:
        first, joint, _ = sample_counts(target, draft, "lossy-test", seed=0, samples=600)
    finally:
        del STRATEGIES["lossy-test"]
    assert min(goodness_of_fit(first, p1), goodness_of_fit(joint, p12)) < 1e-3
