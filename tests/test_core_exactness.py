"""Greedy decoding through Pacer is token-identical to the target alone (docs/ALGORITHM.md).

Pacer's own settings (block sizes, thresholds, decision rules, trimming) over architectures and draft
kinds; EOS, length and logits-processor edges for every strategy are in test_strategies_conformance.py.
"""

from __future__ import annotations

import pytest
import torch
from conftest import ARCHITECTURES, DRAFT_KINDS, make_preverifier, plain_greedy
from helpers import prompt, round_budgets
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pacer_hf

# A cost model for decision_rule="expected_gain" under which untrained pre-verifiers both stop and continue.
EXPECTED_GAIN_COSTS = {"draft_cost": 0.1, "verify_cost": [1.0 + 0.05 * k for k in range(17)], "round_overhead": 0.1}


@pytest.mark.parametrize("arch", ARCHITECTURES)
@pytest.mark.parametrize("kind", DRAFT_KINDS)
@pytest.mark.parametrize("threshold", [0.0, 0.5, 1.0])
def test_greedy_identical_over_block_sizes(pair, arch, kind, threshold):
    target, draft = pair(arch, kind)
    ids = prompt(seed=sum(map(ord, arch + kind)))
    expected = plain_greedy(target, ids, max_new_tokens=19)
    decisions = set()
    for block_size in range(1, 9) if arch == "llama" else (1, 2, 5, 8):
        cap = 2 * block_size
        pv = make_preverifier(draft, block_size=block_size, threshold=threshold, max_draft_tokens=cap)
        out = target.generate(ids, max_new_tokens=19, do_sample=False, assistant_model=draft, pacer=pv)
        assert torch.equal(out, expected), f"block_size={block_size}"
        stats = pacer_hf.last_stats(target)
        assert stats.new_tokens == 19 and len(stats.draft_lengths) == len(stats.accepted) == stats.target_forwards
        assert all(a <= d for a, d in zip(stats.accepted, stats.draft_lengths))
        budgets = round_budgets(stats, ids.shape[1], 19, cap)
        if threshold == 0.0:
            assert stats.draft_lengths == budgets, "threshold 0 must never stop early"
        if threshold == 1.0:
            assert stats.draft_lengths == [min(b, block_size) for b in budgets], "threshold 1 stops after one block"
        decisions.update(d // block_size for d, b in zip(stats.draft_lengths, budgets) if b == cap)
    if threshold == 0.5 and kind != "copy":
        assert decisions >= {1, 2}, "the untrained pre-verifier should both stop and continue"


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_greedy_identical_float32(pair, arch):
    target, draft = pair(arch, "noisy", torch.float32)
    pv = make_preverifier(draft, block_size=3, threshold=0.4, max_draft_tokens=12)
    for seed in range(3):
        ids = prompt(seed=seed)
        expected = plain_greedy(target, ids, max_new_tokens=24)
        out = target.generate(ids, max_new_tokens=24, do_sample=False, assistant_model=draft, pacer=pv)
        assert torch.equal(out, expected)


@pytest.mark.parametrize("strategy", ["sd-fixed-1", "sd-fixed-4", "sd-fixed-7"])
def test_fixed_length_loop_identical(pair, strategy):
    target, draft = pair("llama", "noisy")
    ids = prompt(seed=5)
    expected = plain_greedy(target, ids, max_new_tokens=23)
    out = target.generate(ids, max_new_tokens=23, do_sample=False, assistant_model=draft, pacer=strategy)
    assert torch.equal(out, expected)
    gamma = int(strategy.rsplit("-", 1)[1])
    assert max(pacer_hf.last_stats(target).draft_lengths) == gamma


def test_trim_failed_block_is_exact_for_greedy(pair):
    target, draft = pair("llama", "noisy")
    drafted = {}
    for trim in (False, True):
        pv = make_preverifier(draft, block_size=4, threshold=0.5, max_draft_tokens=12, trim_failed_block=trim)
        drafted[trim] = 0
        for seed in range(3):
            ids = prompt(seed=seed)
            expected = plain_greedy(target, ids, max_new_tokens=20)
            out = target.generate(ids, max_new_tokens=20, do_sample=False, assistant_model=draft, pacer=pv)
            assert torch.equal(out, expected)
            drafted[trim] += sum(pacer_hf.last_stats(target).draft_lengths)
    assert drafted[True] < drafted[False], "trimming must send fewer drafted tokens to the target"


def test_dict_output_and_scores_match(pair):
    target, draft = pair("gpt2", "noisy")
    ids = prompt(seed=8)
    kwargs = {"max_new_tokens": 15, "do_sample": False, "return_dict_in_generate": True, "output_scores": True}
    expected = target.generate(ids, pacer=None, **kwargs)
    out = target.generate(ids, assistant_model=draft, pacer=make_preverifier(draft, block_size=2), **kwargs)
    assert torch.equal(out.sequences, expected.sequences)
    assert len(out.scores) == len(expected.scores) == 15
    for got, want in zip(out.scores, expected.scores):
        torch.testing.assert_close(got, want)


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    arch=st.sampled_from(ARCHITECTURES),
    kind=st.sampled_from(DRAFT_KINDS),
    tokens=st.lists(st.integers(0, 95), min_size=1, max_size=12),
    block_size=st.integers(1, 6),
    blocks=st.integers(1, 4),
    threshold=st.sampled_from([0.0, 0.2, 0.5, 0.8, 1.0]),
    rule=st.sampled_from(["block", "cumulative", "expected_gain"]),
    max_new_tokens=st.integers(1, 25),
    pv_seed=st.integers(0, 3),
)
def test_property_greedy_identical(pair, arch, kind, tokens, block_size, blocks, threshold, rule, max_new_tokens,
                                   pv_seed):
    target, draft = pair(arch, kind)
    ids = torch.tensor([tokens])
    costs = {"calibration": EXPECTED_GAIN_COSTS} if rule == "expected_gain" else {}
    pv = make_preverifier(draft, seed=pv_seed, block_size=block_size, threshold=threshold, decision_rule=rule, **costs,
                          max_draft_tokens=block_size * blocks)
    expected = plain_greedy(target, ids, max_new_tokens=max_new_tokens)
    # expected_gain with the test's costs (pacer_costs="prior"), under which untrained pre-verifiers stop and continue
    out = target.generate(ids, max_new_tokens=max_new_tokens, do_sample=False, assistant_model=draft, pacer=pv,
                          **({"pacer_costs": "prior"} if rule == "expected_gain" else {}))
    assert torch.equal(out, expected)


@pytest.mark.slow
def test_compiled_draft_identical_and_used():
    """compile_draft: same greedy output, and the compiled one-token step really runs."""
    from conftest import build_draft, build_model

    target = pacer_hf.enable(build_model("llama", seed=5))
    draft = build_draft(target, "noisy")
    keys = set(draft.state_dict())
    pacer_hf.compile_draft(draft)
    assert set(draft.state_dict()) == keys, "compiling must not add modules or weights to the draft"
    compiled, calls = draft._pacer_decode_step, []
    draft.__dict__["_pacer_decode_step"] = lambda **kwargs: calls.append(1) or compiled(**kwargs)
    pv = make_preverifier(draft, block_size=2, threshold=0.3, max_draft_tokens=6)
    for seed in range(3):
        ids = prompt(seed=seed)
        expected = plain_greedy(target, ids, max_new_tokens=20)
        for pacer in (pv, "sd-fixed-3"):
            out = target.generate(ids, max_new_tokens=20, do_sample=False, assistant_model=draft, pacer=pacer)
            assert torch.equal(out, expected)
    assert calls, "the compiled decode step was never used"
    with pytest.raises(ValueError, match="compile_draft needs"):
        pacer_hf.compile_draft(pv)
