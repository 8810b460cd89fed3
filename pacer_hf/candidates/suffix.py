"""Lookup candidates from the request's own text and, optionally, from earlier requests: one source for
`generate(prompt_lookup_num_tokens=N, pacer=True)` and vLLM's `PacerLookupProposer`.

`SuffixStore` indexes token sequences (documents) with hash chains over their n-grams (`suffix_kernels.py`) in a ring
of at most `max_tokens` positions and `max_requests` documents, the oldest evicted first: appending is
incremental and O(1) per token, memory is fixed when the store is built, and a search visits only the
occurrences of the text's last n-gram instead of the whole text.

`SuffixSource` is one request's view: its own store (the prompt and the output so far, extended every round)
and, when the caller passes one, a `SuffixCache` of earlier requests restricted to one scope. It returns the
best continuation with the statistics the lookup gate reads (`SuffixMatch`): match length (the depth of the
match), occurrences (the count), agreement (how often each continuation token followed the match), and
where it comes from. On the request's own text the choice is exactly `find_lookup`'s (tested), so the gate
sees the features it was trained on.

Why scopes: a cross-request cache proposes one user's text while serving another. Outputs stay the target's,
but the time a request takes can reveal whether another request's text matched it. A `SuffixCache` answers a
search only with text added under the same scope (`cache.scoped("tenant-a")`), and nothing is cached across
calls unless the caller passes a cache.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ..modeling_lookup_gate import MAX_MATCH_LENGTH, MAX_OCCURRENCES, LookupMatch, feature_rows
from .suffix_kernels import FIRST_DOC, NEXT_DOC, OLDEST, START, TOTAL, append_tokens, find_suffix

DEFAULT_MAX_NGRAM = 4  # n-gram orders a cache indexes (the gates search up to 3)
REQUEST, CACHE = "request", "cache"


@dataclass
class SuffixMatch:
    """A continuation and what the gate may read about it."""

    tokens: np.ndarray  # (k,) int64
    ngram: int  # the order of the n-gram that was looked up
    match_length: int  # tokens before the continuation equal to the text's last ones (its depth, <= 32)
    occurrences: int  # occurrences of the n-gram considered (newest MAX_OCCURRENCES)
    agreement: np.ndarray  # (k,) share of occurrences whose continuation equals tokens[: j + 1]
    source: str  # REQUEST (this request's text) or CACHE (an earlier request in the same scope)
    start: int  # REQUEST: index of tokens[0] in the request's text; CACHE: -1

    def as_lookup_match(self) -> LookupMatch:
        return LookupMatch(torch.from_numpy(self.tokens), self.ngram, self.match_length, self.occurrences,
                           self.start, torch.from_numpy(self.agreement))


def gate_features(match: SuffixMatch, text_length: int, prompt_length: int, confidence: float | None,
                  max_tokens: int, max_ngram: int, sampling: bool = False) -> np.ndarray:
    """The gate's features (`modeling_lookup_gate.FEATURES`) of a match. A cache match reads as prompt text at
    distance 1 (in-prompt 1, distance 1), a distance no request's own text reaches (4,096 tokens back): the gate
    keeps its feature layout, and a gate trained with the lookup recipe's cache pass tells cached text apart
    by it."""
    features = feature_rows(match.as_lookup_match(), text_length, prompt_length, confidence, max_tokens,
                            max_ngram, sampling)
    if match.source == CACHE:
        features[:, 4] = 1.0
        features[:, 5] = 1.0
    return features


class SuffixStore:
    """Documents of tokens indexed for suffix matches, at most `max_tokens` tokens and `max_requests` documents
    (the oldest evicted first). Not thread-safe; holds no global state."""

    def __init__(self, max_tokens: int, max_requests: int = 1, max_ngram: int = DEFAULT_MAX_NGRAM):
        if max_tokens < 1 or max_requests < 1 or max_ngram < 1:
            raise ValueError(f"SuffixStore: max_tokens, max_requests and max_ngram must be >= 1; got {max_tokens}, "
                             f"{max_requests}, {max_ngram}.")
        self.max_tokens, self.max_requests, self.max_ngram = int(max_tokens), int(max_requests), int(max_ngram)
        table = 1 << max(10, (2 * self.max_tokens - 1).bit_length())
        self.tokens = np.zeros(self.max_tokens, dtype=np.int64)
        self.doc_of = np.zeros(self.max_tokens, dtype=np.int64)
        self.prev = np.full((self.max_ngram, self.max_tokens), -1, dtype=np.int64)
        self.heads = np.full((self.max_ngram, table), -1, dtype=np.int64)
        self.docs = np.zeros((self.max_requests, 3), dtype=np.int64)
        self.state = np.zeros(4, dtype=np.int64)
        self._hits = np.empty(MAX_OCCURRENCES, dtype=np.int64)
        self._out = np.zeros(5, dtype=np.int64)

    @property
    def nbytes(self) -> int:
        """Memory the store holds: fixed when it is built."""
        return sum(a.nbytes for a in (self.tokens, self.doc_of, self.prev, self.heads, self.docs, self.state))

    @property
    def live_tokens(self) -> int:
        return int(self.state[TOTAL] - self.state[OLDEST])

    @property
    def live_documents(self) -> int:
        return int(self.state[NEXT_DOC] - self.state[FIRST_DOC])

    def open_document(self, scope: int = 0) -> int:
        """Start a new document (evicting the oldest one when `max_requests` are held); its number."""
        state = self.state
        if self.live_documents >= self.max_requests:
            state[FIRST_DOC] += 1
            first = state[FIRST_DOC]
            nxt = self.docs[first % self.max_requests, START] if first < state[NEXT_DOC] else \
                state[TOTAL]
            state[OLDEST] = max(state[OLDEST], nxt)
        doc = int(state[NEXT_DOC])
        self.docs[doc % self.max_requests] = (state[TOTAL], state[TOTAL], scope)
        state[NEXT_DOC] += 1
        return doc

    def append(self, doc: int, tokens: np.ndarray | Sequence[int]) -> None:
        """Append tokens to document `doc`, which must be the newest one."""
        if doc != self.state[NEXT_DOC] - 1:
            raise ValueError("SuffixStore.append: only the newest document can grow.")
        new = np.ascontiguousarray(tokens, dtype=np.int64)
        if new.size:
            append_tokens(self.tokens, self.doc_of, self.prev, self.heads, self.docs, self.state, new, doc)

    def find(self, query: np.ndarray, max_tokens: int, max_ngram: int, scope: int = 0,
             source: str = REQUEST) -> SuffixMatch | None:
        """The best continuation of `query`'s end in `scope`'s documents (`kernels.find_suffix`), or None."""
        length = int(query.shape[0])
        if length < 1 or max_tokens < 1:
            return None
        query = np.ascontiguousarray(query, dtype=np.int64)
        tokens = np.empty(max_tokens, dtype=np.int64)
        agreement = np.empty(max_tokens, dtype=np.float32)
        out = self._out
        find_suffix(self.tokens, self.doc_of, self.prev, self.heads, self.docs, self.state, query, length,
                            scope, max_tokens, max_ngram, MAX_MATCH_LENGTH, self._hits, tokens, agreement, out)
        if out[0] == 0:
            return None
        k = int(out[4])
        return SuffixMatch(tokens[:k], int(out[0]), int(out[1]), int(out[2]), agreement[:k], source,
                           int(out[3]) if source == REQUEST else -1)


class SuffixCache:
    """Earlier requests' prompts and outputs, for lookup candidates across calls (opt-in).

        cache = pacer_hf.SuffixCache(max_tokens=200_000)
        model.generate(ids, prompt_lookup_num_tokens=10, pacer=True, suffix_cache=cache)   # adds prompt + output
        model.generate(ids, ..., suffix_cache=cache.scoped("tenant-a"))                    # one tenant's text only

    At most `max_tokens` tokens and `max_requests` requests, over all scopes, the oldest evicted first; memory
    is allocated up front (`nbytes`, about 113 bytes a token with the default 4 orders: 30 MB at the default size).
    A search returns only text added under the same scope (None is a scope of its own)."""

    def __init__(self, max_tokens: int = 262_144, max_requests: int = 10_000, max_ngram: int = DEFAULT_MAX_NGRAM):
        self.store = SuffixStore(max_tokens, max_requests, max_ngram)
        self._scopes: dict[Hashable, int] = {}

    def _scope_id(self, scope: Hashable) -> int:
        return self._scopes.setdefault(scope, len(self._scopes))

    def add(self, tokens: Sequence[int] | np.ndarray | torch.Tensor, scope: Hashable = None) -> None:
        """Add one request's text (prompt and output), as a document of `scope`."""
        if isinstance(tokens, torch.Tensor):
            tokens = tokens.detach().cpu().reshape(-1).numpy()
        tokens = np.asarray(tokens, dtype=np.int64).reshape(-1)
        if tokens.size:
            self.store.append(self.store.open_document(self._scope_id(scope)), tokens)

    def find(self, query: np.ndarray, max_tokens: int, max_ngram: int = 3,
             scope: Hashable = None) -> SuffixMatch | None:
        """The best continuation of `query`'s end among earlier requests of `scope` (None without one)."""
        if scope not in self._scopes:
            return None
        return self.store.find(np.asarray(query), max_tokens, max_ngram, self._scopes[scope], CACHE)

    def scoped(self, scope: Hashable) -> ScopedSuffixCache:
        """This cache seen by one scope (a user, a tenant): it adds and finds that scope's text only."""
        return ScopedSuffixCache(self, scope)

    def clear(self) -> None:
        store = self.store
        self.store = SuffixStore(store.max_tokens, store.max_requests, store.max_ngram)
        self._scopes.clear()

    @property
    def nbytes(self) -> int:
        return self.store.nbytes

    def __len__(self) -> int:
        """Tokens held."""
        return self.store.live_tokens

    @property
    def requests(self) -> int:
        return self.store.live_documents


@dataclass(frozen=True)
class ScopedSuffixCache:
    """`SuffixCache.scoped(scope)`: the cache as one scope sees it."""

    cache: SuffixCache
    scope: Hashable

    def add(self, tokens: Sequence[int] | np.ndarray | torch.Tensor) -> None:
        self.cache.add(tokens, self.scope)

    def find(self, query: np.ndarray, max_tokens: int, max_ngram: int = 3) -> SuffixMatch | None:
        return self.cache.find(query, max_tokens, max_ngram, self.scope)


def as_scoped(cache: SuffixCache | ScopedSuffixCache | None, scope: Hashable = None) -> ScopedSuffixCache | None:
    """`generate`'s suffix_cache= and suffix_scope= as one scoped view (None: no cache)."""
    if cache is None:
        if scope is not None:
            raise ValueError("suffix_scope= needs suffix_cache=: pass a pacer_hf.SuffixCache as well.")
        return None
    if isinstance(cache, ScopedSuffixCache):
        if scope is not None and scope != cache.scope:
            raise ValueError(f"suffix_cache= is already scoped to {cache.scope!r}; suffix_scope={scope!r} differs.")
        return cache
    if not isinstance(cache, SuffixCache):
        raise TypeError(f"suffix_cache= takes a pacer_hf.SuffixCache (or cache.scoped(key)); got {type(cache).__name__}.")
    return cache.scoped(scope)


def refuse_cache(cache: ScopedSuffixCache | None, what: str) -> None:
    """suffix_cache= feeds pacer_hf's prompt lookup only: elsewhere it is an error that names the fix."""
    if cache is not None:
        raise ValueError(f"suffix_cache= feeds pacer_hf's prompt lookup; {what} is not that: pass "
                         "prompt_lookup_num_tokens=N with pacer=True (or drop suffix_cache=).")


class SuffixSource:
    """One request's candidates: its own text (indexed incrementally as it grows) and, when given, a scoped cache
    of earlier requests. The longer match wins; on a tie, the request's own text (the gate was trained on it)."""

    def __init__(self, max_length: int, max_ngram: int, cache: ScopedSuffixCache | None = None):
        self.max_ngram = max_ngram
        self.store = SuffixStore(max(int(max_length), 1), 1, max_ngram)
        self.doc = self.store.open_document()
        self.cache = cache
        self.indexed = 0
        self.cache_matches = 0

    def find(self, ids: np.ndarray | torch.Tensor, max_tokens: int) -> SuffixMatch | None:
        """Index the tokens of `ids` (the request's text so far) not yet indexed, then search."""
        if isinstance(ids, torch.Tensor):
            ids = ids.cpu().numpy()
        if ids.shape[0] > self.indexed:
            self.store.append(self.doc, ids[self.indexed:])
            self.indexed = int(ids.shape[0])
        match = self.store.find(ids, max_tokens, self.max_ngram)
        if self.cache is not None:
            cached = self.cache.find(ids, max_tokens, self.max_ngram)
            if cached is not None and (match is None or cached.match_length > match.match_length):
                self.cache_matches += 1
                return cached
        return match

