"""Ouroboros and Pacer + Ouroboros: pool tokens accepted exactly, bounded, warm-started, resettable.

Prompts repeat token patterns and most checks run a generate call twice, so the phrase pool (warm
from the first call) really proposes, and is really accepted, during the exactness checks.
"""

from __future__ import annotations

import contextlib
import dataclasses

import pytest
import torch
from conftest import ARCHITECTURES, DRAFT_KINDS, make_preverifier, plain_greedy
from helpers import exact_distributions, goodness_of_fit, round_budgets, sample_counts
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pacer_hf
from pacer_hf._hf_compat import output_cache
from pacer_hf.loops.lean_draft import DraftKV
from pacer_hf.strategies import ouroboros
from pacer_hf.strategies.ouroboros import OuroborosConfig, OuroborosStats, PhrasePool

STRATEGY_NAMES = ("ouroboros", "pacer+ouroboros")


def repeating(pattern: list[int], times: int) -> torch.Tensor:
    return torch.tensor([pattern * times])


@contextlib.contextmanager
def attached(draft, **pv_overrides):
    """Attach an untrained pre-verifier to a (shared, cached) draft for the duration of a test."""
    pv_overrides.setdefault("block_size", 2)
    pv_overrides.setdefault("threshold", 0.5)
    pv_overrides.setdefault("max_draft_tokens", 6)
    pacer_hf.attach(draft, make_preverifier(draft, **pv_overrides))
    try:
        yield
    finally:
        del draft._pacer_preverifier


def run(target, draft, ids, strategy, pool: dict | OuroborosConfig | None = None,
        **kwargs) -> tuple[torch.Tensor, OuroborosStats]:
    """generate with `strategy` ("ouroboros" or "pacer+ouroboros"), its pool settings changed by `pool`."""
    kwargs.setdefault("do_sample", False)
    if pool is not None:
        fields = dataclasses.asdict(pool) if isinstance(pool, OuroborosConfig) else dict(pool)
        fields.pop("use_preverifier", None)  # the strategy name decides that
        strategy = dataclasses.replace(pacer_hf.STRATEGIES[strategy], **fields)
    out = target.generate(ids, assistant_model=draft, pacer=strategy, **kwargs)
    return out, pacer_hf.last_stats(target)


def check_stats(stats: OuroborosStats, prompt_len: int, max_new_tokens: int) -> None:
    """Per-round bookkeeping, and no round proposes past max_length - cur_len - 1."""
    rounds = stats.target_forwards
    assert len(stats.draft_lengths) == len(stats.accepted) == len(stats.pool_lengths) == len(stats.pool_accepted)
    assert len(stats.accepted) == rounds
    assert all(a <= d for a, d in zip(stats.accepted, stats.draft_lengths))
    assert all(a <= p <= d for a, p, d in zip(stats.pool_accepted, stats.pool_lengths, stats.draft_lengths))
    budgets = round_budgets(stats, prompt_len, max_new_tokens, cap=10**6)
    assert all(d <= b for d, b in zip(stats.draft_lengths, budgets)), (stats.draft_lengths, budgets)


@pytest.fixture(autouse=True)
def _cold_pools(pair):
    """Every test starts from empty pools on the shared cached models."""
    for arch in ARCHITECTURES:
        for kind in DRAFT_KINDS:
            pacer_hf.reset_phrase_pool(pair(arch, kind)[0])


@pytest.mark.parametrize("arch", ARCHITECTURES)
@pytest.mark.parametrize("kind", DRAFT_KINDS)
@pytest.mark.parametrize("strategy", STRATEGY_NAMES)
def test_greedy_identical(pair, arch, kind, strategy):
    target, draft = pair(arch, kind)
    ids = repeating([5, 17, 33], 4)
    expected = plain_greedy(target, ids, max_new_tokens=24)
    with attached(draft):
        for _ in range(2):  # cold pool, then warm pool
            out, stats = run(target, draft, ids, strategy, max_new_tokens=24)
            assert torch.equal(out, expected)
            check_stats(stats, ids.shape[1], 24)
    if kind != "random":
        assert sum(stats.pool_accepted) > 0, "the warm pool should contribute accepted tokens"


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_greedy_identical_float32_with_longer_keys(pair, arch):
    target, draft = pair(arch, "noisy", torch.float32)
    pacer_hf.reset_phrase_pool(target)
    config = OuroborosConfig(draft_tokens=3, key_length=3, phrase_length=8, from_target_tail=True)
    for seed in range(2):
        ids = repeating([seed + 1, 40, 41, 60], 3)
        expected = plain_greedy(target, ids, max_new_tokens=20)
        for _ in range(2):
            out, _ = run(target, draft, ids, "ouroboros", max_new_tokens=20, pool=config)
            assert torch.equal(out, expected)


@pytest.mark.parametrize("arch", ARCHITECTURES)
@pytest.mark.parametrize("eos_position", [1, 3, 6])
def test_eos_inside_a_pool_phrase(pair, arch, eos_position):
    """One draft token per round, so EOS sits inside the pool phrase; generation stops where the target stops."""
    target, draft = pair(arch, "copy")
    ids = repeating([9, 2], 3)
    free = plain_greedy(target, ids, max_new_tokens=14)
    eos = int(free[0, ids.shape[1] + eos_position])
    expected = plain_greedy(target, ids, max_new_tokens=14, eos_token_id=eos, pad_token_id=eos)
    config = {"draft_tokens": 1}
    run(target, draft, ids, "ouroboros", max_new_tokens=14, pool=config)  # warm: learns the continuation
    out, stats = run(target, draft, ids, "ouroboros", max_new_tokens=14, pool=config, eos_token_id=eos,
                     pad_token_id=eos)
    assert torch.equal(out, expected)
    assert out.shape[1] <= ids.shape[1] + eos_position + 1
    if eos_position > 1:  # HF counts an accepted EOS as the round's bonus token, not as a match
        assert sum(stats.pool_accepted) > 0


@pytest.mark.parametrize("strategy", STRATEGY_NAMES)
@pytest.mark.parametrize("max_new_tokens", [1, 2, 5, 7, 13])
def test_max_new_tokens_edges(pair, strategy, max_new_tokens):
    target, draft = pair("llama", "copy")
    ids = repeating([3, 4, 5, 6], 3)
    expected = plain_greedy(target, ids, max_new_tokens=max_new_tokens)
    with attached(draft, threshold=0.0, max_draft_tokens=4):
        run(target, draft, ids, strategy, max_new_tokens=20)  # warm the pool past max_new_tokens
        out, stats = run(target, draft, ids, strategy, max_new_tokens=max_new_tokens)
    assert torch.equal(out, expected)
    assert stats.new_tokens == max_new_tokens
    check_stats(stats, ids.shape[1], max_new_tokens)


@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    arch=st.sampled_from(ARCHITECTURES),
    kind=st.sampled_from(DRAFT_KINDS),
    strategy=st.sampled_from(STRATEGY_NAMES),
    pattern=st.lists(st.integers(0, 95), min_size=1, max_size=4),
    times=st.integers(1, 5),
    key_length=st.integers(1, 3),
    phrase_length=st.integers(1, 8),
    draft_tokens=st.integers(1, 5),
    from_target_tail=st.booleans(),
    max_new_tokens=st.integers(1, 25),
)
def test_property_greedy_identical(pair, arch, kind, strategy, pattern, times, key_length, phrase_length,
                                   draft_tokens, from_target_tail, max_new_tokens):
    target, draft = pair(arch, kind)
    ids = repeating(pattern, times)
    config = OuroborosConfig(draft_tokens=draft_tokens, key_length=key_length, phrase_length=phrase_length,
                             from_target_tail=from_target_tail)
    expected = plain_greedy(target, ids, max_new_tokens=max_new_tokens)
    with attached(draft, block_size=draft_tokens, max_draft_tokens=2 * draft_tokens):
        for _ in range(2):
            out, stats = run(target, draft, ids, strategy, max_new_tokens=max_new_tokens, pool=config)
            assert torch.equal(out, expected)
            check_stats(stats, ids.shape[1], max_new_tokens)


class _AuditedGenerator(ouroboros.OuroborosCandidateGenerator):
    """Checks, every round, that the draft cache positions the base class keeps equal a fresh draft forward."""

    audited = 0
    risky = 0  # rounds where a trim left >= 2 drafted positions in the cache beyond the proposed drafts

    def get_candidates(self, input_ids, **kwargs):
        if self.cache.get_seq_length():
            keep = min(self.cache.get_seq_length(), input_ids.shape[1] - 1)
            fresh = output_cache(self.draft(input_ids[:, :keep], use_cache=True))
            kept_layers = (zip(self.cache.keys, self.cache.values) if isinstance(self.cache, DraftKV)  # lean forward
                           else ((layer.keys, layer.values) for layer in self.cache.layers))
            for (keys, values), want in zip(kept_layers, fresh.layers, strict=True):
                torch.testing.assert_close(keys[:, :, :keep], want.keys)
                torch.testing.assert_close(values[:, :, :keep], want.values)
            _AuditedGenerator.audited += 1
        candidates, logits = super().get_candidates(input_ids, **kwargs)
        if logits is None and self.stop.trim >= 2 and self.stats.pool_lengths[-1]:
            _AuditedGenerator.risky += 1
        return candidates, logits


@pytest.mark.parametrize("kind", ["noisy", "random"])
def test_draft_cache_stays_consistent_with_pool_tokens_and_trims(pair, monkeypatch, kind):
    """Pool tokens are never fed to the draft; after a pre-verifier trim the cache must not keep trimmed drafts."""
    monkeypatch.setattr(ouroboros, "OuroborosCandidateGenerator", _AuditedGenerator)
    monkeypatch.setattr(_AuditedGenerator, "risky", 0)
    target, draft = pair("llama", kind)
    ids = repeating([11, 12, 13], 4)
    expected = plain_greedy(target, ids, max_new_tokens=30)
    with attached(draft, block_size=3, threshold=0.5, max_draft_tokens=9, trim_failed_block=True):
        for _ in range(3):
            out, stats = run(target, draft, ids, "pacer+ouroboros", max_new_tokens=30)
            assert torch.equal(out, expected)
    assert _AuditedGenerator.audited > 10
    assert _AuditedGenerator.risky > 0, "the trim + pool path must be exercised"


@pytest.mark.parametrize(("strategy", "pool_q", "samples"), [
    ("ouroboros", "one-hot", 450), ("ouroboros", "none", 300), ("pacer+ouroboros", "one-hot", 250)])
def test_sampling_matches_target_distribution(sampling_pair, strategy, pool_q, samples):
    """One draft token per round leaves room for pool tokens within max_new_tokens=4. With a one-hot q
    for pool tokens rounds stay speculative sampling; with "none" they fall back to target-only acceptance."""
    target, draft = sampling_pair
    p1, p12 = exact_distributions(target)
    pacer_hf.reset_phrase_pool(target)
    config = dataclasses.replace(pacer_hf.STRATEGIES[strategy], draft_tokens=1, sampling_pool_q=pool_q)
    with attached(draft, block_size=1, threshold=0.4, max_draft_tokens=2):
        first, joint, _ = sample_counts(target, draft, config, seed=1, samples=samples)
    pool = pacer_hf.phrase_pool(target, draft)
    assert pool.accepted_tokens >= 10 and pool.proposed_tokens > pool.accepted_tokens, repr(pool)
    assert goodness_of_fit(first, p1) > 1e-3
    assert goodness_of_fit(joint, p12) > 1e-3


def test_phrase_pool_rules():
    pool = PhrasePool(key_length=2, phrase_length=3, phrases_per_key=2, max_keys=3)
    pool.insert([1], [2, 3])
    pool.insert([1], [2, 3, 4, 5])  # extends (2, 3): replaces it, cut to phrase_length
    assert pool.phrases([1]) == [(2, 3, 4)]
    pool.insert([1], [2])  # a prefix of a stored phrase only refreshes it
    assert pool.phrases([1]) == [(2, 3, 4)]
    pool.insert([1], [7, 8])
    pool.insert([1], [9])
    assert pool.phrases([1]) == [(7, 8), (9,)], "oldest phrase evicted past phrases_per_key"
    assert pool.lookup([5, 1]) == (9,), "newest phrase, backing off to the 1-token key"
    pool.insert([5, 1], [6])
    assert pool.lookup([5, 1]) == (6,), "the longest key wins"
    pool.insert([20], [21])
    pool.lookup([0, 1])  # touches key (1,)
    pool.insert([30], [31])  # 4 keys > max_keys: the least recently used key, (5, 1), goes
    assert pool.phrases([5, 1]) == [] and pool.phrases([1]) and pool.num_keys == 3
    assert len(pool) == 4 and pool.num_tokens == 5
    pool.add([1, 2, 3, 4])
    assert pool.lookup([1, 2]) == (3, 4) and pool.lookup([9, 3]) == (4,)
    pool.clear()
    assert len(pool) == pool.num_keys == pool.num_tokens == pool.lookups == 0


def _recount(pool: PhrasePool) -> tuple[int, int]:
    phrases = [p for key in list(pool._table) for p in pool.phrases(key)]
    return len(phrases), sum(map(len, phrases))


def test_pool_stays_bounded_over_many_calls(pair):
    target, draft = pair("qwen2", "noisy")
    config = OuroborosConfig(draft_tokens=3, max_keys=12, phrases_per_key=2, phrase_length=4, from_target_tail=True)
    for call in range(25):
        ids = repeating([call % 96, (7 * call) % 96, 50], 3)
        run(target, draft, ids, "ouroboros", max_new_tokens=16, pool=config)
        pool = pacer_hf.phrase_pool(target, draft)
        assert pool.num_keys <= 12 and len(pool) <= pool.capacity == 24
        assert pool.num_tokens <= 24 * 4
        assert _recount(pool) == (len(pool), pool.num_tokens), "the running counts match the contents"
    assert pool.num_keys == 12, "the bound was reached, so eviction ran"


def test_warm_start_and_reset(pair):
    target, draft = pair("llama", "noisy")
    ids = repeating([21, 22, 23, 24], 3)
    taus = []
    for _ in range(2):
        run(target, draft, ids, "ouroboros", max_new_tokens=32)
        taus.append(pacer_hf.last_stats(target).tau)
    assert taus[1] > taus[0], taus
    pool = pacer_hf.phrase_pool(target, draft)
    assert len(pool) > 0 and pacer_hf.last_stats(target).pool_phrases == len(pool)
    pacer_hf.reset_phrase_pool(target)
    assert len(pool) == 0 and pool.proposed_tokens == 0
    run(target, draft, ids, "ouroboros", max_new_tokens=32)
    assert pacer_hf.last_stats(target).tau == taus[0], "after a reset the call is cold again"


def test_pools_are_per_draft_and_per_shape(pair):
    target, noisy = pair("gpt2", "noisy")
    _, copy_draft = pair("gpt2", "copy")
    pacer_hf.enable(target)
    ids = repeating([1, 2], 4)
    run(target, noisy, ids, "ouroboros", max_new_tokens=8)
    run(target, copy_draft, ids, "ouroboros", max_new_tokens=8)
    first = pacer_hf.phrase_pool(target, noisy)
    assert first is not pacer_hf.phrase_pool(target, copy_draft)
    pacer_hf.reset_phrase_pool(target, copy_draft)
    assert len(first) > 0 and len(pacer_hf.phrase_pool(target, copy_draft)) == 0
    run(target, noisy, ids, "ouroboros", max_new_tokens=8, pool={"phrase_length": 3})
    assert pacer_hf.phrase_pool(target, noisy).phrase_length == 3, "a new pool shape starts a fresh pool"


def test_registered_and_configurable(pair):
    assert {"ouroboros", "pacer+ouroboros"} <= set(pacer_hf.STRATEGIES)
    target, draft = pair("llama", "random")
    _, stats = run(target, draft, repeating([4], 6), "ouroboros", max_new_tokens=12, pool={"draft_tokens": 2})
    assert isinstance(stats, OuroborosStats) and stats.strategy == "ouroboros"
    assert max(d - p for d, p in zip(stats.draft_lengths, stats.pool_lengths)) == 2
    assert "pool_acceptance" in stats.to_dict()


def test_errors(pair):
    target, draft = pair("llama", "noisy")
    ids = repeating([1], 4)
    _, stats = run(target, draft, ids, "pacer+ouroboros", max_new_tokens=4)
    assert stats.preverifier == "default"  # none attached: the package's default pre-verifier decides
    with attached(draft, trim_failed_block=True), pytest.raises(ValueError, match="trim_failed_block"):
        run(target, draft, ids, "pacer+ouroboros", max_new_tokens=4, do_sample=True)
    with pytest.raises(ValueError, match="phrase_length"):
        run(target, draft, ids, "ouroboros", max_new_tokens=4, pool={"phrase_length": 0})
    with pytest.raises(TypeError, match="unknown"):
        run(target, draft, ids, {"strategy_type": "ouroboros", "unknown": 1}, max_new_tokens=4)
    with pytest.raises(ValueError, match="sampling_pool_q"):
        OuroborosConfig(sampling_pool_q="soft")
    with pytest.raises(TypeError):
        OuroborosConfig(unknown=1)
