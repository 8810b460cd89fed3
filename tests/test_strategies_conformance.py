"""Every registered strategy keeps the lossless contract: one battery, parametrised over the registry.

Greedy output is token-identical to the target alone (architectures x draft kinds, EOS inside a round,
max_new_tokens inside a round, active logits processors, both verification loops, random prompts), and
sampling keeps the target's distribution (chi-square on the first one and two tokens). A strategy added
with `register_strategy` is covered by adding nothing: its presets are read from the registry.
Strategy-specific behaviour (pools, workers, pre-verifier decisions) is tested in its own file.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
from conftest import (
    ARCHITECTURES,
    DRAFT_KINDS,
    logits_processor_case,
    make_lookup_gate,
    make_preverifier,
    plain_greedy,
)
from helpers import exact_distributions, goodness_of_fit, prompt, round_budgets, sample_counts
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pacer_hf
from pacer_hf.strategies import STRATEGIES, StrategyConfig, strategy_config

# Every preset of the registry, plus parametrised names and config instances a user would pass.
CASES = {name: name for name in sorted(STRATEGIES)}
CASES.update({
    "sd-fixed-3": "sd-fixed-3",
    "PearlConfig(gamma=3)": pacer_hf.PearlConfig(gamma=3),
    "PearlConfig(gamma=4, thread)": pacer_hf.PearlConfig(gamma=4, worker="thread"),
    "OuroborosConfig(draft_tokens=2)": pacer_hf.OuroborosConfig(draft_tokens=2, key_length=1),
    "SpeculativeConfig(gamma=5, pre-verifier)": pacer_hf.SpeculativeConfig(gamma=5, use_preverifier=True),
    "lookup-4": "lookup-4",
    "LookupConfig(gated, 2-gram)": pacer_hf.LookupConfig(use_gate=True, max_ngram_size=2),
})
# The sampling test runs a few thousand generate calls: one case per strategy type (and Pacer on each).
SAMPLING = ("sd-fixed-3", "pacer", "ouroboros", "pacer+ouroboros", "pearl", "pacer+pearl", "pacer-lookup")


def config_of(case) -> StrategyConfig:
    return case if isinstance(case, StrategyConfig) else strategy_config(case)


@contextlib.contextmanager
def strategy_ready(draft, case, target=None, **pv_overrides):
    """Attach an untrained pre-verifier (blocks both pass and fail) when the strategy uses one; for a
    gated lookup strategy, also an untrained lookup gate to `target` (the draft proposes when it says none)."""
    config = config_of(case)
    if not (config.use_gate if isinstance(config, pacer_hf.LookupConfig) else config.use_preverifier):
        yield
        return
    if isinstance(config, pacer_hf.LookupConfig):
        pacer_hf.attach(target, make_lookup_gate(target))
    for key, value in {"block_size": 2, "threshold": 0.5, "max_draft_tokens": 6}.items():
        pv_overrides.setdefault(key, value)
    pacer_hf.attach(draft, make_preverifier(draft, **pv_overrides))
    try:
        yield
    finally:
        del draft._pacer_preverifier
        if target is not None:
            target.__dict__.pop("_pacer_lookup_gate", None)


@pytest.fixture(autouse=True)
def _cold_pools(pair):
    """Ouroboros pools live on the shared cached targets: every test starts from empty ones."""
    for arch in ARCHITECTURES:
        for kind in DRAFT_KINDS:
            pacer_hf.reset_phrase_pool(pair(arch, kind)[0])


def test_registry_covers_every_builtin():
    assert {"pacer", "ouroboros", "pacer+ouroboros", "pearl", "pacer+pearl"} <= set(STRATEGIES)
    assert "sd-fixed-<γ>" in pacer_hf.strategy_names()


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
@pytest.mark.parametrize("arch", ARCHITECTURES)
@pytest.mark.parametrize("kind", DRAFT_KINDS)
def test_greedy_identical(pair, case, arch, kind):
    target, draft = pair(arch, kind)
    ids = prompt(seed=sum(map(ord, arch + kind)))
    expected = plain_greedy(target, ids, max_new_tokens=19)
    with strategy_ready(draft, case, target):
        for loop in ("lean", "transformers"):
            out = target.generate(ids, max_new_tokens=19, do_sample=False, assistant_model=draft, pacer=case,
                                  pacer_loop=loop)
            assert torch.equal(out, expected), loop
            stats = pacer_hf.last_stats(target)
            assert stats.new_tokens == 19 and stats.loop == loop
            assert len(stats.accepted) == len(stats.draft_lengths) == stats.target_forwards
            assert all(a <= d for a, d in zip(stats.accepted, stats.draft_lengths))
    if kind == "copy" and not isinstance(config_of(case), pacer_hf.PearlConfig):
        assert stats.tau > 1.5, "an exact-copy draft must get several tokens accepted per target forward"


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
@pytest.mark.parametrize("eos_position", [1, 4, 6])
def test_eos_inside_a_round(pair, case, eos_position):
    """EOS drafted mid-round by an exact copy: generation stops exactly where the target stops."""
    target, draft = pair("llama", "copy")
    ids = prompt(seed=11)
    free = plain_greedy(target, ids, max_new_tokens=12)
    eos = int(free[0, ids.shape[1] + eos_position])
    expected = plain_greedy(target, ids, max_new_tokens=12, eos_token_id=eos, pad_token_id=eos)
    with strategy_ready(draft, case, target, threshold=0.0, block_size=4, max_draft_tokens=8):
        out = target.generate(ids, max_new_tokens=12, do_sample=False, assistant_model=draft, pacer=case,
                              eos_token_id=eos, pad_token_id=eos)
    assert torch.equal(out, expected)


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
@pytest.mark.parametrize("max_new_tokens", [1, 2, 5, 13])
def test_max_new_tokens_inside_a_round(pair, case, max_new_tokens):
    target, draft = pair("llama", "copy")
    ids = prompt(seed=2)
    expected = plain_greedy(target, ids, max_new_tokens=max_new_tokens)
    with strategy_ready(draft, case, target, threshold=0.0, block_size=4, max_draft_tokens=8):
        out = target.generate(ids, max_new_tokens=max_new_tokens, do_sample=False, assistant_model=draft,
                              pacer=case)
    assert torch.equal(out, expected)
    stats = pacer_hf.last_stats(target)
    assert stats.new_tokens == max_new_tokens
    budgets = round_budgets(stats, ids.shape[1], max_new_tokens, cap=10**6)
    assert all(d <= b for d, b in zip(stats.draft_lengths, budgets)), "no round proposes past max_length - 1"


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_logits_processors_active(pair, case, arch):
    """Repetition penalty and min_new_tokens (with an EOS the target would otherwise emit early)."""
    target, draft = pair(arch, "noisy")
    ids = prompt(seed=4)
    kwargs, expected = logits_processor_case(target, ids)
    with strategy_ready(draft, case, target):
        out = target.generate(ids, do_sample=False, assistant_model=draft, pacer=case, **kwargs)
    assert torch.equal(out, expected)


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_config_round_trips_and_runs_from_a_dict(pair, case):
    """A strategy config serialises (`to_dict`, e.g. into a GenerationConfig) and runs from that dict."""
    config = config_of(case)
    restored = StrategyConfig.from_dict(config.to_dict())
    assert restored == config
    target, draft = pair("qwen2", "noisy")
    ids = prompt(seed=9)
    with strategy_ready(draft, case, target):
        out = target.generate(ids, max_new_tokens=9, do_sample=False, assistant_model=draft,
                              pacer=config.to_dict())
    assert torch.equal(out, plain_greedy(target, ids, max_new_tokens=9))


@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    case=st.sampled_from(list(CASES.values())),
    arch=st.sampled_from(ARCHITECTURES),
    kind=st.sampled_from(DRAFT_KINDS),
    tokens=st.lists(st.integers(0, 95), min_size=1, max_size=12),
    max_new_tokens=st.integers(1, 25),
    threshold=st.sampled_from([0.0, 0.3, 0.7, 1.0]),
)
def test_property_greedy_identical(pair, case, arch, kind, tokens, max_new_tokens, threshold):
    target, draft = pair(arch, kind)
    ids = torch.tensor([tokens])
    expected = plain_greedy(target, ids, max_new_tokens=max_new_tokens)
    with strategy_ready(draft, case, target, threshold=threshold):
        out = target.generate(ids, max_new_tokens=max_new_tokens, do_sample=False, assistant_model=draft,
                              pacer=case)
    assert torch.equal(out, expected)


@pytest.mark.parametrize("name", SAMPLING)
def test_sampling_matches_target_distribution(sampling_pair, name):
    target, draft = sampling_pair
    p1, p12 = exact_distributions(target)
    pacer_hf.reset_phrase_pool(target)
    samples = 500 if "pearl" in name else 1200  # a PEARL call forks its draft worker
    with strategy_ready(draft, name, target, block_size=2, threshold=0.3, max_draft_tokens=4):
        first, joint, accepted = sample_counts(target, draft, name, seed=0, samples=samples)
    # the default loop: the lean one, which draws as transformers' own does (test_lean_loop.py)
    assert pacer_hf.last_stats(target).loop == "lean"
    assert 0 < sum(accepted), "drafts must be partly accepted for the test to mean much"
    assert goodness_of_fit(first, p1) > 1e-3
    assert goodness_of_fit(joint, p12) > 1e-3


# Round costs (k = 0, 1, ... proposed tokens, in plain steps) where a 1-token verify costs two steps, as on the Zen 3
# EPYC's curve, and where it costs one, as on the Intel Xeon's.
DEAR_SHORT_VERIFY = [1.0, 2.2, 3.1, 2.9, 3.3, 3.5, 3.8, 4.0, 4.2]
CHEAP_SHORT_VERIFY = [1.0, 1.02, 1.05, 1.9, 2.0, 2.1, 2.2, 2.3, 2.4]
PREVERIFIER_CASES = {name: case for name, case in CASES.items()
                     if not isinstance(config_of(case), pacer_hf.LookupConfig) and config_of(case).use_preverifier}


@pytest.mark.parametrize("case", PREVERIFIER_CASES.values(), ids=PREVERIFIER_CASES.keys())
def test_first_block_trim_follows_the_curve_and_stays_exact(pair, case):
    """`trim_first_block` (the default): a greedy round the expected-gain rule stops at its first block proposes
    nothing where a 1-token verify costs more than a plain step, and proposes the block where it does not; sampled
    calls send what they drafted. Greedy output is the target's either way."""
    from pacer_hf.loops.recent_acceptance import SeparateMemories

    target, draft = pair("llama", "noisy")
    calibration = {"draft_cost": 0.0, "verify_cost": DEAR_SHORT_VERIFY, "round_overhead": 0.0}
    trimmed = {}
    # each call learns the pair afresh: what earlier calls taught it (and, once it is known, the timings its probes
    # read) would otherwise decide whether a round drafts at all
    memories = SeparateMemories(target, draft)
    with strategy_ready(draft, case, target, block_size=1, decision_rule="expected_gain", calibration=calibration,
                        max_draft_tokens=8, seed=3):
        with torch.no_grad():  # doubtful predictions: rounds that stop at their first block
            draft._pacer_preverifier.head.bias -= 3.5
        for name, curve in (("dear", DEAR_SHORT_VERIFY), ("cheap", CHEAP_SHORT_VERIFY)):
            trimmed[name] = 0
            for seed in range(3):
                ids = prompt(seed=seed)
                with memories.of(f"{name}-{seed}"):
                    out = target.generate(ids, max_new_tokens=24, do_sample=False, assistant_model=draft, pacer=case,
                                          pacer_costs=curve)
                assert torch.equal(out, plain_greedy(target, ids, max_new_tokens=24)), (name, seed)
                stats = pacer_hf.last_stats(target)
                assert set(stats.trimmed.values()) <= {1}, stats.trimmed  # only a first block (1 token) is dropped
                trimmed[name] += len(stats.trimmed)
        with memories.of("sampled"):
            target.generate(prompt(seed=0), max_new_tokens=24, do_sample=True, assistant_model=draft, pacer=case,
                            pacer_costs=DEAR_SHORT_VERIFY)
        assert not pacer_hf.last_stats(target).trimmed, "a sampled round must send what it drafted"
    assert trimmed["cheap"] == 0
    if not isinstance(config_of(case), pacer_hf.PearlConfig):  # PEARL does not record what it trimmed
        assert trimmed["dear"] > 0, "some round stopped at its first block should have become a plain step"
