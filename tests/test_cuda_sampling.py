"""Sampling on CUDA keeps the target's distribution, for every strategy: chi-square on the first one and two
tokens of the 10-token sampling pair (float64, built from a config) and on the first token of the demo pair.

Sample counts are small (a GPU call is dominated by Python, not by the device): enough to catch a sampler that
ignores the target, not a subtle bias; tests/test_core_sampling.py and the conformance suite carry the power on
CPU. Marked `cuda`; skipped where torch sees no CUDA device.
"""

from __future__ import annotations

import pytest
import torch
from conftest import build_draft, build_model
from cuda_support import CASES, DEVICE, needs_cuda, ready, speculative, uses_preverifier
from helpers import PROMPT, TEMPERATURE, VOCAB, goodness_of_fit

import pacer_hf

pytestmark = needs_cuda
SAMPLES = 240  # per strategy on the sampling pair
DEMO_SAMPLES = 120  # per strategy on the demo pair
DEMO_TEXT = "import os\nimport sys\n\n\ndef main("


@pytest.fixture(scope="module")
def sampling_pair():
    """conftest's sampling pair (10 tokens, a noisy draft partly accepted under sampling) on the device."""
    target = build_model("llama", vocab_size=VOCAB, hidden=32, seed=3).double()
    draft = build_draft(target, "noisy", noise=0.3)
    return pacer_hf.enable(target.to(DEVICE)), draft.to(DEVICE)


def exact(target, prompt: torch.Tensor, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """p(t1) and p(t1, t2) of the target after `prompt` (on the device) at `temperature`, on the CPU."""
    vocab = target.get_output_embeddings().weight.shape[0]
    with torch.no_grad():
        first = torch.softmax(target(prompt).logits[0, -1].double() / temperature, -1)
        extended = torch.cat([prompt.repeat(vocab, 1), torch.arange(vocab, device=prompt.device)[:, None]], 1)
        second = torch.softmax(target(extended).logits[:, -1].double() / temperature, -1)
    return first.cpu(), (first[:, None] * second).cpu()


@pytest.mark.parametrize("case", CASES)
def test_sampling_keeps_the_distribution_on_config_models(sampling_pair, case):
    target, draft = sampling_pair
    prompt = PROMPT.to(DEVICE)
    p1, p12 = exact(target, prompt, TEMPERATURE)
    first, joint, accepted = torch.zeros(VOCAB), torch.zeros(VOCAB, VOCAB), 0
    torch.manual_seed(0)
    with ready(target, draft, case, block_size=2, threshold=0.3, max_draft_tokens=4):
        for _ in range(SAMPLES):
            out = speculative(target, draft, case, prompt, 4, do_sample=True, temperature=TEMPERATURE, top_k=0)
            t1, t2 = out[0, prompt.shape[1]:prompt.shape[1] + 2].tolist()
            first[t1] += 1
            joint[t1, t2] += 1
            accepted += sum(pacer_hf.last_stats(target).accepted)
    if "lookup" not in case:  # a 5-token prompt rarely repeats: lookup may propose nothing
        assert accepted > 0, "drafts must be partly accepted for the test to mean much"
    assert goodness_of_fit(first, p1) > 1e-3
    assert goodness_of_fit(joint, p12) > 1e-3


@pytest.fixture(scope="module")
def demo():
    from pacer_hf.pairs import load_pair

    pair = load_pair("stdlib")
    pair.target.to(DEVICE), pair.draft.to(DEVICE)
    ids = pair.tokenizer(DEMO_TEXT, return_tensors="pt")["input_ids"].to(DEVICE)
    return pair, ids


@pytest.mark.parametrize("case", CASES)
def test_sampling_keeps_the_distribution_on_the_demo_pair(demo, case):
    """The first sampled token at T = 1 against the target's exact distribution (cells under 5 expected pooled)."""
    pair, ids = demo
    with torch.no_grad():
        p1 = torch.softmax(pair.target(ids).logits[0, -1].double(), -1).cpu()
    counts = torch.zeros_like(p1)
    preverifier = pair.sampling_preverifier if uses_preverifier(case) else None
    torch.manual_seed(1)
    with ready(pair.target, pair.draft, case, preverifier=preverifier):
        for _ in range(DEMO_SAMPLES):
            out = speculative(pair.target, pair.draft, case, ids, 3, do_sample=True, temperature=1.0, top_k=0)
            counts[int(out[0, ids.shape[1]])] += 1
    assert goodness_of_fit(counts, p1) > 1e-3
