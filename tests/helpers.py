"""Helpers shared by several test modules (fixtures live in conftest.py)."""

from __future__ import annotations

import torch
from scipy.stats import chisquare

import pacer_hf

VOCAB = 10  # the sampling pair's vocabulary: small, so the exact two-token distribution is cheap
TEMPERATURE = 0.9
SAMPLES = 2000
PROMPT = torch.tensor([[1, 7, 3, 3, 8]])


def prompt(length: int = 6, seed: int = 0, vocab: int = 96) -> torch.Tensor:
    return torch.randint(0, vocab, (1, length), generator=torch.Generator().manual_seed(seed))


def round_budgets(stats, prompt_len: int, max_new_tokens: int, cap: int) -> list[int]:
    """The draft length each round may use: the cap, or what max_new_tokens leaves (minus the bonus token)."""
    budgets, length = [], prompt_len
    for accepted in stats.accepted:
        budgets.append(max(0, min(cap, prompt_len + max_new_tokens - length - 1)))
        length += accepted + 1
    return budgets


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


def sample_counts(target, draft, pacer, seed: int, samples: int = SAMPLES, **kwargs):
    """Counts of the first token and of the first two tokens over `samples` sampled generate calls."""
    torch.manual_seed(seed)
    first, joint, accepted = torch.zeros(VOCAB), torch.zeros(VOCAB, VOCAB), []
    for _ in range(samples):
        out = target.generate(PROMPT, max_new_tokens=4, do_sample=True, temperature=TEMPERATURE, top_k=0,
                              assistant_model=draft, pacer=pacer, **kwargs)
        t1, t2 = out[0, PROMPT.shape[1]:PROMPT.shape[1] + 2].tolist()
        first[t1] += 1
        joint[t1, t2] += 1
        accepted += pacer_hf.last_stats(target).accepted
    return first, joint, accepted
