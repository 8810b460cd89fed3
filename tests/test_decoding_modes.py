"""Pre-verifiers per decoding mode: `config.decoding` from the traces, one attached per mode, generate picking by
`do_sample`, and the benchmark's sampling runs reading the one trained for them."""

from __future__ import annotations

import pytest
import torch
from conftest import make_preverifier, plain_greedy
from helpers import prompt

import pacer_hf
from pacer_hf import PacerConfig
from pacer_hf.attached import attached_preverifier
from pacer_hf.bench.runner import preverifier_variants


def test_decoding_is_validated():
    with pytest.raises(ValueError, match="decoding='beam'"):
        PacerConfig(decoding="beam")
    assert PacerConfig().decoding is None and PacerConfig(decoding="sampling").decoding == "sampling"


def test_attached_per_mode_and_chosen_by_do_sample(pair):
    """A greedy call runs the pre-verifier attached for greedy decoding, a sampled one the one for sampling; each
    mode falls back on the other's. Told apart by their rules: one stops after every first token, one never."""
    target, draft = pair("llama", "noisy")
    stops = make_preverifier(draft, block_size=1, threshold=1.0, max_draft_tokens=5, decoding="greedy")
    drafts_on = make_preverifier(draft, block_size=1, threshold=0.0, max_draft_tokens=5, decoding="sampling")
    ids = prompt(12)
    try:
        pacer_hf.attach(draft, stops)
        pacer_hf.attach(draft, drafts_on)
        assert attached_preverifier(draft, False) is stops and attached_preverifier(draft, True) is drafts_on
        out = target.generate(ids, assistant_model=draft, pacer=True, do_sample=False, max_new_tokens=16)
        assert torch.equal(out, plain_greedy(target, ids, max_new_tokens=16))
        assert max(pacer_hf.last_stats(target).draft_lengths) == 1
        torch.manual_seed(0)
        target.generate(ids, assistant_model=draft, pacer=True, do_sample=True, max_new_tokens=16)
        assert max(pacer_hf.last_stats(target).draft_lengths) == 5
        del draft._pacer_preverifier  # only the sampling one left: greedy calls use it
        out = target.generate(ids, assistant_model=draft, pacer=True, do_sample=False, max_new_tokens=16)
        assert torch.equal(out, plain_greedy(target, ids, max_new_tokens=16))
        assert max(pacer_hf.last_stats(target).draft_lengths) == 5
    finally:
        for slot in ("_pacer_preverifier", "_pacer_preverifier_sampling"):
            draft.__dict__.pop(slot, None)


def test_bench_sampling_runs_use_the_sampling_preverifier(pair):
    _, draft = pair("llama", "noisy")
    greedy = make_preverifier(draft, block_size=2, trim_failed_block=True)
    sampling = make_preverifier(draft, seed=1, block_size=3, decoding="sampling")
    variants = preverifier_variants(greedy, sampling)
    assert variants["pacer"] is greedy and variants["pacer-b1"].config.block_size == 1
    assert variants["pacer@sampling"].layer is sampling.layer and variants["pacer@sampling"].config.block_size == 3
    assert variants["pacer-b1@sampling"].layer is sampling.layer and variants["pacer-b1@sampling"].config.block_size == 1
    assert not any(v.config.trim_failed_block for k, v in variants.items() if k.endswith("@sampling"))
    alone = preverifier_variants(greedy)  # without one: the same weights, trimming off
    assert alone["pacer@sampling"].layer is greedy.layer and not alone["pacer@sampling"].config.trim_failed_block
