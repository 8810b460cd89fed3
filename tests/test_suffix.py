"""The suffix candidate source (pacer_hf/candidates): against brute-force references, eviction, scopes."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import ARCHITECTURES, build_model, make_lookup_gate, plain_greedy
from helpers import PROMPT, TEMPERATURE, VOCAB, exact_distributions, goodness_of_fit
from hypothesis import given, settings
from hypothesis import strategies as st

import pacer_hf
from pacer_hf.candidates import SuffixCache, SuffixSource, SuffixStore, suffix_kernels
from pacer_hf.candidates.suffix import CACHE, REQUEST, as_scoped, gate_features
from pacer_hf.modeling_lookup_gate import MAX_MATCH_LENGTH, NUM_LOOKUP_FEATURES, find_lookup

REPEAT = torch.tensor([[5, 6, 7, 8, 5, 6, 7]])
TOKENS = st.lists(st.integers(0, 4), min_size=1, max_size=40)


def live_documents(docs: list[tuple[list[int], int]], max_tokens: int, max_requests: int):
    """FIFO eviction written the slow way: the newest documents that fit, the newest one cut to its last
    max_tokens tokens."""
    kept, total = [], 0
    for tokens, scope in reversed(docs[-max_requests:]):
        tokens = tokens[-max_tokens:]
        if total + len(tokens) > max_tokens:
            break
        kept.insert(0, (tokens, scope))
        total += len(tokens)
    return kept


def brute_force(docs: list[tuple[list[int], int]], query: list[int], scope: int, max_tokens: int, max_ngram: int):
    """Every occurrence of the query's last n-gram in `scope`'s documents, longest n first; of the newest 256,
    the longest backward match (<= 32), then the longest continuation, then the newest."""
    for n in range(min(max_ngram, len(query)), 0, -1):
        hits = []  # (age order, document, end index)
        for d, (tokens, s) in enumerate(docs):
            for end in range(n - 1, len(tokens) - 1):
                if s == scope and tokens[end - n + 1:end + 1] == query[-n:]:
                    hits.append((d, end))
        hits = hits[-256:]
        if not hits:
            continue

        def back(hit):
            tokens = docs[hit[0]][0]
            m = 0
            while m < min(MAX_MATCH_LENGTH, len(query)) and hit[1] - m >= 0 and tokens[hit[1] - m] == query[-1 - m]:
                m += 1
            return m

        def key(i, hits=hits):
            d, end = hits[i]
            return back(hits[i]), min(max_tokens, len(docs[d][0]) - end - 1), i

        best = max(range(len(hits)), key=key)
        d, end = hits[best]
        return docs[d][0][end + 1:end + 1 + max_tokens], n, back(hits[best]), len(hits), hits
    return None


@settings(max_examples=300, deadline=None, derandomize=True)
@given(ids=st.lists(st.integers(0, 4), min_size=1, max_size=60), max_tokens=st.integers(1, 8),
       max_ngram=st.integers(1, 4), split=st.integers(1, 60))
def test_request_source_is_find_lookup(ids, max_tokens, max_ngram, split):
    """Indexed incrementally (in two steps), the request's own text gives find_lookup's match and statistics."""
    source = SuffixSource(64, max_ngram)
    source.find(np.array(ids[:split]), max_tokens)
    found = source.find(np.array(ids), max_tokens)
    expected = find_lookup(torch.tensor(ids), max_tokens, max_ngram)
    if expected is None:
        assert found is None
        return
    assert found.source == REQUEST
    assert (found.tokens.tolist(), found.ngram, found.match_length, found.occurrences, found.start) == (
        expected.tokens.tolist(), expected.ngram, expected.match_length, expected.occurrences, expected.start)
    np.testing.assert_allclose(found.agreement, expected.agreement.numpy(), rtol=1e-6)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(docs=st.lists(st.tuples(TOKENS, st.integers(0, 2)), min_size=1, max_size=8), query=TOKENS,
       scope=st.integers(0, 2), max_tokens=st.integers(1, 6), max_ngram=st.integers(1, 4),
       capacity=st.integers(1, 120), max_requests=st.integers(1, 6))
def test_cache_matches_brute_force_after_eviction(docs, query, scope, max_tokens, max_ngram, capacity, max_requests):
    cache = SuffixCache(max_tokens=capacity, max_requests=max_requests)
    for tokens, s in docs:
        cache.add(tokens, s)
    live = live_documents(docs, capacity, max_requests)
    assert len(cache) == sum(len(t) for t, _ in live) <= capacity and cache.requests <= max_requests
    found = cache.find(np.array(query), max_tokens, max_ngram, scope)
    expected = brute_force(live, query, scope, max_tokens, max_ngram)
    if expected is None:
        assert found is None
        return
    tokens, n, match_length, occurrences, hits = expected
    assert found.source == CACHE
    assert (found.tokens.tolist(), found.ngram, found.match_length, found.occurrences) == (
        tokens, n, match_length, occurrences)
    # the continuation follows an occurrence of the matched suffix, in the same scope
    followed = [live[d][0][end + 1:end + 1 + len(tokens)] == tokens
                and live[d][0][end + 1 - match_length:end + 1] == query[len(query) - match_length:]
                for d, end in hits]
    assert any(followed)
    assert 0 < found.agreement[0] <= 1


def test_memory_is_fixed_and_old_requests_are_evicted():
    cache = SuffixCache(max_tokens=100, max_requests=4)
    size = cache.nbytes
    rng = np.random.default_rng(0)
    for i in range(50):
        cache.add(rng.integers(0, 1000, size=int(rng.integers(1, 60))), scope=i % 3)
        assert len(cache) <= 100 and cache.requests <= 4 and cache.nbytes == size
    cache.add([1, 2, 3, 4, 5, 6])
    assert cache.find(np.array([9, 1, 2, 3]), 3).tokens.tolist() == [4, 5, 6]
    for _ in range(4):
        cache.add(rng.integers(1000, 2000, size=30))
    assert cache.find(np.array([9, 1, 2, 3]), 3) is None  # evicted: first by count, then by tokens


def test_a_request_gets_nothing_from_another_scopes_text():
    secret = [11, 12, 13, 14, 15, 16, 17, 18]
    cache = SuffixCache(max_tokens=1000)
    cache.scoped("tenant-a").add(secret)
    query = np.array([1, 11, 12, 13])
    assert cache.scoped("tenant-b").find(query, 5) is None
    assert cache.find(query, 5) is None  # the unscoped view is a scope of its own
    assert cache.scoped("tenant-a").find(query, 5).tokens.tolist() == [14, 15, 16, 17, 18]
    cache.scoped("tenant-b").add([11, 12, 13, 99, 98])
    assert cache.scoped("tenant-b").find(query, 5).tokens.tolist() == [99, 98]


def bucket(scope_id: int, ngram: list[int], table: int) -> int:
    h = suffix_kernels._seed(scope_id)
    for token in reversed(ngram):
        h = suffix_kernels._mix(h, token)
    return suffix_kernels._bucket(h, table - 1)


def test_scopes_hold_under_hash_collisions():
    """Two scopes whose chains for the same n-gram share a bucket: each still sees its own continuation only."""
    cache = SuffixCache(max_tokens=450, max_requests=200)
    table = cache.store.heads.shape[1]
    first = {}
    for scope in range(table + 1):
        b = bucket(scope, [5, 6], table)
        if b in first:
            a = first[b]
            break
        first[b] = scope
    for s in range(scope + 1):  # scope ids are given in order of first use
        cache._scope_id(s)
    cache.add([5, 6, 1000 + a], a)
    cache.add([5, 6, 1000 + scope], scope)
    assert cache.find(np.array([5, 6]), 1, 2, a).tokens.tolist() == [1000 + a]
    assert cache.find(np.array([5, 6]), 1, 2, scope).tokens.tolist() == [1000 + scope]


def test_request_text_wins_ties_and_a_longer_cached_match_wins():
    cache = SuffixCache(max_tokens=100)
    cache.add([9, 7, 1, 2, 3, 40, 41])
    source = SuffixSource(100, 3, cache.scoped(None))
    match = source.find(np.array([1, 2, 3, 50, 9, 1, 2, 3]), 4)  # 3 tokens both ways: the request's own
    assert match.source == REQUEST and match.tokens.tolist() == [50, 9, 1, 2]
    match = SuffixSource(100, 3, cache.scoped(None)).find(np.array([8, 7, 1, 2, 3, 9, 7, 1, 2, 3]), 4)
    assert match.source == CACHE and match.tokens.tolist() == [40, 41] and match.match_length == 5
    features = gate_features(match, 10, 4, 0.5, 10, 3)
    assert features.shape == (2, NUM_LOOKUP_FEATURES) and (features[:, 4:6] == 1).all()


def test_store_rejects_bad_arguments():
    with pytest.raises(ValueError, match="max_tokens"):
        SuffixStore(0)
    store = SuffixStore(10, 2)
    first = store.open_document()
    store.open_document()
    with pytest.raises(ValueError, match="newest"):
        store.append(first, [1])
    with pytest.raises(ValueError, match="suffix_cache"):
        as_scoped(None, "a")
    with pytest.raises(ValueError, match="already scoped"):
        as_scoped(SuffixCache(10).scoped("a"), "b")
    with pytest.raises(TypeError):
        as_scoped({}, None)


# -- in generate ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def targets():
    return {arch: pacer_hf.enable(build_model(arch)) for arch in ARCHITECTURES}


@pytest.mark.parametrize("arch", ARCHITECTURES)
@pytest.mark.parametrize("loop", ["lean", "transformers"])
def test_greedy_identical_with_a_cache_across_calls(targets, arch, loop):
    target = targets[arch]
    gate = make_lookup_gate(target, threshold=0.0)  # proposes every scored token
    cache = pacer_hf.SuffixCache(max_tokens=500)
    rng = np.random.default_rng(1)
    prompts = [torch.tensor([rng.integers(0, 12, size=int(rng.integers(3, 14))).tolist()]) for _ in range(4)]
    for prompt in [*prompts, *prompts]:  # the second time round the cache holds each prompt's own answer
        out = target.generate(prompt, max_new_tokens=16, do_sample=False, prompt_lookup_num_tokens=6, pacer=gate,
                              pacer_loop=loop, suffix_cache=cache)
        assert torch.equal(out, plain_greedy(target, prompt, max_new_tokens=16))
    assert pacer_hf.last_stats(target).cache_matches > 0 and cache.requests == 8


def test_a_request_gets_no_candidate_from_another_tenant(targets):
    target = targets["llama"]
    gate = make_lookup_gate(target, threshold=0.0)
    prompt = torch.tensor([[3, 17, 29, 41, 53, 65, 77, 89]])
    cache = pacer_hf.SuffixCache(max_tokens=500)
    kwargs = {"max_new_tokens": 12, "do_sample": False, "prompt_lookup_num_tokens": 6, "pacer": gate}
    target.generate(prompt, suffix_cache=cache, suffix_scope="tenant-a", **kwargs)
    assert len(cache) == 20
    target.generate(prompt, suffix_cache=cache.scoped("tenant-b"), **kwargs)
    assert pacer_hf.last_stats(target).cache_matches == 0
    target.generate(prompt, suffix_cache=cache.scoped("tenant-a"), **kwargs)
    assert pacer_hf.last_stats(target).cache_matches > 0


def test_sampling_with_a_cache_matches_target_distribution(sampling_pair):
    target, _ = sampling_pair
    gate = make_lookup_gate(target, threshold=0.0, max_lookup_tokens=3)
    cache = pacer_hf.SuffixCache(max_tokens=1000)
    for first in range(VOCAB):  # every continuation of the prompt, so the cache always proposes
        cache.add([*PROMPT[0].tolist(), first, (first * 3) % VOCAB, 2, 5])
    p1, p12 = exact_distributions(target)
    torch.manual_seed(0)
    first, joint, proposed = torch.zeros(VOCAB), torch.zeros(VOCAB, VOCAB), 0
    for _ in range(1500):
        out = target.generate(PROMPT, max_new_tokens=4, do_sample=True, temperature=TEMPERATURE, top_k=0,
                              prompt_lookup_num_tokens=3, pacer=gate, suffix_cache=cache)
        t1, t2 = out[0, PROMPT.shape[1]:PROMPT.shape[1] + 2].tolist()
        first[t1] += 1
        joint[t1, t2] += 1
        proposed += sum(pacer_hf.last_stats(target).draft_lengths)
    assert proposed > 1000, "the cache must propose tokens for the test to mean much"
    assert goodness_of_fit(first, p1) > 1e-3
    assert goodness_of_fit(joint, p12) > 1e-3


def test_suffix_cache_errors_name_the_fix(targets):
    target = targets["llama"]
    cache = pacer_hf.SuffixCache(max_tokens=50)
    with pytest.raises(ValueError, match="feeds pacer_hf's prompt lookup"):
        target.generate(REPEAT, max_new_tokens=4, suffix_cache=cache)
    with pytest.raises(ValueError, match="SpeculativeConfig"):
        target.generate(REPEAT, max_new_tokens=4, pacer="sd-fixed-3", assistant_model=target, suffix_cache=cache)
    with pytest.raises(ValueError, match="needs suffix_cache"):
        target.generate(REPEAT, max_new_tokens=4, pacer=True, prompt_lookup_num_tokens=3, suffix_scope="a")


def test_bench_suffix_strategies_keep_one_cache_per_strategy_and_temperature():
    from pacer_hf.bench.strategy_calls import BenchSuffixCaches, available_strategy_names, resolve_strategies

    assert {"pacer-suffix", "pacer-suffix-cache"} <= set(available_strategy_names())
    named = {s.name: s for s in resolve_strategies(["pacer-suffix", "pacer-suffix-cache"], False, 8, has_draft=False)}
    plain, cached = named["pacer-suffix"], named["pacer-suffix-cache"]
    assert (plain.family, plain.suffix_cache, cached.suffix_cache, cached.lookup_tokens) == ("suffix", False, True, 10)
    caches = BenchSuffixCaches(max_tokens=100)
    assert caches.get(plain, 0.0) is None
    cache = caches.get(cached, 0.0)
    assert caches.get(cached, 0.0) is cache and caches.get(cached, 1.0) is not cache
    caches.reset()  # a new run: no prompt's own answer is ever in its cache
    assert caches.get(cached, 0.0) is not cache
