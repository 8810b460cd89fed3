"""The proposer's cache of earlier requests: finished requests' prompts and outputs, searched for every row.

vLLM's own `suffix` method keeps such a cache (its default: the last 10,000 requests); so does
`PacerLookupProposer`, on by default and set through `additional_config={"pacer_hf": {"suffix_cache": ...}}`:
`false` turns it off, a dict sets `max_tokens` and `max_requests`. A row whose text ends with a longer match in
the cache than in its own text takes the cache's continuation, scored by the same gate
(`candidates.suffix.gate_features`); the batch-wide choice of how many drafts each row gets is unchanged.

Scope: vLLM hands a proposer token ids only (no request id, `user` field or header), so the proposer cannot
tell users apart and keeps one scope per engine. Outputs stay the target's, but a request's timing can reveal
whether another request's text matched it: on a server shared by parties who must not learn about each other's
requests, turn the cache off or run an engine per tenant (docs/VLLM.md).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from ..candidates.suffix import SuffixCache, gate_features
from ..modeling_lookup_gate import GateScorer
from .kernels import MAX_LOGIT, CompiledGate

CONFIG_KEY = "suffix_cache"
DEFAULTS = {"max_tokens": 262_144, "max_requests": 10_000}


def cache_settings(vllm_config) -> dict | None:
    """additional_config["pacer_hf"]["suffix_cache"]: True/absent (defaults), False (off) or a dict of settings."""
    extra = getattr(vllm_config, "additional_config", None) or {}
    value = (extra.get("pacer_hf", {}) if isinstance(extra, dict) else {}).get(CONFIG_KEY, True)
    if value is False or value is None:
        return None
    if value is True:
        return dict(DEFAULTS)
    if not isinstance(value, dict) or set(value) - set(DEFAULTS):
        raise ValueError(f"PacerLookupProposer: additional_config['pacer_hf']['{CONFIG_KEY}'] takes true, false or "
                         f"a dict with keys {sorted(DEFAULTS)}; got {value!r}.")
    return {**DEFAULTS, **{k: int(v) for k, v in value.items()}}


class ProposerCache:
    """Finished requests' texts, and the rows whose drafts they improve."""

    def __init__(self, settings: dict, scorer: GateScorer):
        self.cache = SuffixCache(max_tokens=settings["max_tokens"], max_requests=settings["max_requests"])
        self.scorer = scorer
        self.rows_from_cache = 0
        self.warm_up()

    def warm_up(self) -> None:
        """Compile (or load from numba's cache) the store's kernels now, not inside the first steps that use them."""
        store = SuffixCache(max_tokens=16, max_requests=2)
        store.add(np.array([1, 2, 3, 1, 2, 3], dtype=np.int64))
        match = store.find(np.array([7, 1, 2], dtype=np.int64), 2)
        self.scorer.accept_probabilities(gate_features(match, 3, 1, 0.5, 2, 3))

    def finished(self, texts: Iterable[np.ndarray]) -> None:
        for text in texts:
            self.cache.add(text)

    def improve(self, gate: CompiledGate, token_ids: np.ndarray, lengths: np.ndarray, live: np.ndarray,
                rooms: np.ndarray, prompts: np.ndarray, max_ngram: int, feature_tokens: int,
                confidence: float) -> None:
        """Replace a row's lookup (gate.tokens, counts, logits) by the cache's continuation where that matches
        more of the row's end."""
        if not len(self.cache):
            return
        for r in live.tolist():
            room = int(rooms[r])
            if room < 1:
                continue
            text = token_ids[r, : lengths[r]]
            match = self.cache.find(text, room, max_ngram)
            if match is None or (gate.counts[r] and match.match_length <= gate.matched[r]):
                continue
            features = gate_features(match, int(lengths[r]), int(prompts[r]), confidence, feature_tokens,
                                     max_ngram)
            k = len(match.tokens)
            gate.tokens[r, :k] = match.tokens
            gate.logits[r, :k] = np.clip(self.scorer.log_odds(features), -MAX_LOGIT, MAX_LOGIT)
            gate.counts[r], gate.matched[r] = k, match.match_length
            self.rows_from_cache += 1

