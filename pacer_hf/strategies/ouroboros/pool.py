"""Ouroboros' phrase pool: token n-gram -> the recent phrases that followed it, bounded and LRU.

One pool per (target, draft) pair lives on the target instance and survives across `generate`
calls (warm start); `reset_phrase_pool(model)` empties it.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from collections.abc import Sequence

from transformers import PreTrainedModel

from ...model_state import ModelState

Phrase = tuple[int, ...]


class PhrasePool:
    """Token n-gram -> recent phrases (the tokens that followed it), bounded, LRU at both levels.

    Rules: inserting or looking up a key makes it the newest key; past `max_keys` keys the least
    recently used key goes. Under a key, inserting a phrase makes it the newest; a phrase that
    extends a stored phrase replaces it, a prefix of a stored phrase only refreshes that one (the
    newest such phrase, so a stale phrase that merely shares a prefix is not revived); past
    `phrases_per_key` the oldest phrase goes. So the pool never holds more than
    max_keys * phrases_per_key phrases of at most phrase_length tokens each.
    """

    def __init__(self, key_length: int = 2, phrase_length: int = 6, phrases_per_key: int = 8, max_keys: int = 16384):
        for name, value in (("key_length", key_length), ("phrase_length", phrase_length),
                            ("phrases_per_key", phrases_per_key), ("max_keys", max_keys)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"PhrasePool: {name} must be an integer >= 1, got {value!r}.")
        self.key_length = key_length
        self.phrase_length = phrase_length
        self.phrases_per_key = phrases_per_key
        self.max_keys = max_keys
        self._table: OrderedDict[Phrase, OrderedDict[Phrase, None]] = OrderedDict()
        self._phrases = 0
        self._tokens = 0
        self.lookups = self.hits = self.proposed_tokens = self.accepted_tokens = 0

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return self.key_length, self.phrase_length, self.phrases_per_key, self.max_keys

    def __len__(self) -> int:
        """Number of phrases held."""
        return self._phrases

    @property
    def num_keys(self) -> int:
        return len(self._table)

    @property
    def num_tokens(self) -> int:
        """Tokens held in phrases (the pool's memory, up to a constant per entry)."""
        return self._tokens

    @property
    def capacity(self) -> int:
        """The most phrases the pool can hold."""
        return self.max_keys * self.phrases_per_key

    def phrases(self, key: Sequence[int]) -> list[Phrase]:
        """Phrases under `key`, oldest first (read-only view for inspection and tests)."""
        return list(self._table.get(tuple(key), ()))

    def clear(self) -> None:
        """Drop every phrase and zero the counters."""
        self._table.clear()
        self._phrases = self._tokens = 0
        self.lookups = self.hits = self.proposed_tokens = self.accepted_tokens = 0

    def insert(self, key: Sequence[int], phrase: Sequence[int]) -> None:
        """Record that `phrase` followed `key` (both token-id sequences)."""
        key, phrase = tuple(key), tuple(phrase[: self.phrase_length])
        if not key or not phrase:
            return
        phrases = self._table.get(key)
        if phrases is None:
            phrases = self._table[key] = OrderedDict()
            if len(self._table) > self.max_keys:
                _, evicted = self._table.popitem(last=False)
                self._phrases -= len(evicted)
                self._tokens -= sum(map(len, evicted))
        else:
            self._table.move_to_end(key)
            for old in reversed(phrases):  # newest first: refresh the freshest match, never a stale one
                if old[: len(phrase)] == phrase:  # already known, maybe longer: refresh it
                    phrases.move_to_end(old)
                    return
                if phrase[: len(old)] == old:  # the new phrase extends an old one: replace it
                    del phrases[old]
                    self._phrases -= 1
                    self._tokens -= len(old)
                    break
        phrases[phrase] = None
        self._phrases += 1
        self._tokens += len(phrase)
        if len(phrases) > self.phrases_per_key:
            old, _ = phrases.popitem(last=False)
            self._phrases -= 1
            self._tokens -= len(old)

    def add(self, tokens: Sequence[int], start: int = 0) -> None:
        """Index `tokens`: for every key ending at position >= `start`, the tokens after it are a phrase.

        Keys of every length 1..key_length are stored, so lookups can back off to shorter keys.
        """
        last = len(tokens) - 1
        for end in range(max(start, 0), last):
            phrase = tokens[end + 1 : end + 1 + self.phrase_length]
            for k in range(1, min(self.key_length, end + 1) + 1):
                self.insert(tokens[end - k + 1 : end + 1], phrase)

    def lookup(self, context: Sequence[int]) -> Phrase:
        """The newest phrase under the longest key that ends `context` (empty if none)."""
        self.lookups += 1
        for k in range(min(self.key_length, len(context)), 0, -1):
            key = tuple(context[len(context) - k :])
            phrases = self._table.get(key)
            if phrases:
                self._table.move_to_end(key)
                self.hits += 1
                return next(reversed(phrases))
        return ()

    def __repr__(self) -> str:
        return (f"PhrasePool(phrases={len(self)}/{self.capacity}, keys={self.num_keys}/{self.max_keys}, "
                f"key_length={self.key_length}, phrase_length={self.phrase_length}, hits={self.hits}/{self.lookups}, "
                f"accepted={self.accepted_tokens}/{self.proposed_tokens} pool tokens)")


def phrase_pool(model: PreTrainedModel, draft: PreTrainedModel) -> PhrasePool | None:
    """The phrase pool kept on `model` for `draft` (None before the first Ouroboros call)."""
    pools = ModelState(model).phrase_pools
    return None if pools is None else pools.get(draft)


def reset_phrase_pool(model: PreTrainedModel, draft: PreTrainedModel | None = None) -> None:
    """Empty the warm-start phrase pool(s) kept on `model`: the one for `draft`, or all of them."""
    pools = ModelState(model).phrase_pools
    if pools is None:
        return
    for key, pool in list(pools.items()):
        if draft is None or key is draft:
            pool.clear()


def pool_for(model: PreTrainedModel, draft: PreTrainedModel, shape: tuple[int, int, int, int]) -> PhrasePool:
    """The pool kept on `model` for `draft`; a new one when none exists or its shape differs."""
    pools = ModelState(model).phrase_pools
    if pools is None:
        pools = ModelState(model).phrase_pools = weakref.WeakKeyDictionary()
    pool = pools.get(draft)
    if pool is None or pool.shape != shape:
        key_length, phrase_length, phrases_per_key, max_keys = shape
        pool = pools[draft] = PhrasePool(key_length, phrase_length, phrases_per_key, max_keys)
    return pool
