"""One compiled pass per engine step: every row's prompt-lookup match, its gate features and the gate's log-odds.

The numpy reference (`find_lookup`, `feature_rows`, `GateScorer` in modeling_lookup_gate.py) is a few dozen
small array operations per row; between two forward passes the interpreter and numpy run from cold caches
and those cost ≈ 0.2 ms a row, several percent of a small model's step. This is the same computation
compiled with numba (`loops.preverifier_kernel.compiled`), equal to the reference (tests/test_vllm_proposer.py), so the
proposer stays under a percent or two of a step.
"""

from __future__ import annotations

import math

import numpy as np

from ..configuration_lookup_gate import NUM_LOOKUP_FEATURES
from ..loops.online_calibration import MAX_LOGIT as MAX_CALIBRATED_LOGIT
from ..loops.preverifier_kernel import compiled
from ..modeling_lookup_gate import MAX_MATCH_LENGTH, MAX_OCCURRENCES, GateScorer

MAX_LOGIT = math.log((1 - 1e-6) / 1e-6)  # the gate's log-odds stop where its probabilities reach 1e-6 and 1 - 1e-6


@compiled()
def _gelu(x):
    z = abs(x) * (1.0 / math.sqrt(2.0))
    t = 1.0 / (1.0 + 0.3275911 * z)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    erf = 1.0 - poly * math.exp(-z * z)
    return 0.5 * x * (1.0 + (erf if x >= 0 else -erf))


@compiled()
def _match(ids, length, max_tokens, max_ngram, hits):
    """find_lookup's choice for ids[:length]: (start, ngram, match length, occurrences); start -1 without one."""
    for n in range(min(max_ngram, length - 1), 0, -1):
        count = 0
        for i in range(length - n - 1, -1, -1):  # newest first, at most MAX_OCCURRENCES
            same = True
            for j in range(n):
                if ids[i + j] != ids[length - n + j]:
                    same = False
                    break
            if same:
                hits[count] = i
                count += 1
                if count == MAX_OCCURRENCES:
                    break
        if count == 0:
            continue
        best_key, best_hit, best_match = -1, -1, 0
        limit = min(MAX_MATCH_LENGTH, length)
        for h in range(count):
            hit = hits[h]
            matched = 0
            for back in range(1, limit + 1):
                position = hit + n - back
                if position < 0 or ids[position] != ids[length - back]:
                    break
                matched += 1
            continuation = min(length - hit - n, max_tokens)
            key = (matched * (max_tokens + 1) + continuation) * (length + 1) + hit
            if key > best_key:
                best_key, best_hit, best_match = key, hit, matched
        return best_hit + n, n, best_match, count
    return -1, 0, 0, 0


@compiled()
def lookup_logits(token_ids, lengths, rows, rooms, prompt_lengths, max_ngram, feature_tokens, confidence, w1, b1, w2,
                  b2, w3, b3, out_tokens, out_counts, out_logits, out_matched):
    """For each row r in `rows` (with room[r] > 0): the lookup proposal (out_tokens[r, :out_counts[r]]), the
    gate's log-odds of each of its tokens (out_logits) and the match length (out_matched); out_counts[r] = 0
    without a match."""
    hits = np.empty(MAX_OCCURRENCES, dtype=np.int64)
    features = np.empty(NUM_LOOKUP_FEATURES, dtype=np.float64)
    hidden1 = np.empty(w1.shape[1], dtype=np.float64)
    hidden2 = np.empty(w2.shape[1], dtype=np.float64)
    for r in rows:
        out_counts[r] = 0
        out_matched[r] = 0
        length = lengths[r]
        if rooms[r] < 1 or length < 2:
            continue
        ids = token_ids[r]
        start, n, matched, count = _match(ids, length, rooms[r], max_ngram, hits)
        if start < 0:
            continue
        k = min(rooms[r], length - start)
        out_matched[r] = matched
        for j in range(k):
            out_tokens[r, j] = ids[start + j]
        features[1] = math.log1p(matched) / math.log1p(MAX_MATCH_LENGTH)
        features[2] = math.log1p(count) / math.log1p(MAX_OCCURRENCES)
        features[4] = 1.0 if start < prompt_lengths[r] else 0.0
        features[5] = math.log1p(length - start) / math.log1p(4096)
        features[6] = confidence
        features[7] = 0.0
        features[8] = n / max_ngram
        features[9] = 0.0
        agreeing = np.ones(count, dtype=np.bool_)
        for j in range(k):
            agree, available = 0, 0
            for h in range(count):
                offset = hits[h] + n + j
                if offset < length:
                    available += 1
                    if agreeing[h] and ids[offset] == ids[start + j]:
                        agree += 1
                    else:
                        agreeing[h] = False
                else:
                    agreeing[h] = False
            features[0] = (j + 1) / feature_tokens
            features[3] = agree / max(available, 1)
            for c in range(w1.shape[1]):
                total = b1[c]
                for f in range(NUM_LOOKUP_FEATURES):
                    total += features[f] * w1[f, c]
                hidden1[c] = _gelu(total)
            for c in range(w2.shape[1]):
                total = b2[c]
                for f in range(w1.shape[1]):
                    total += hidden1[f] * w2[f, c]
                hidden2[c] = _gelu(total)
            logit = b3[0]
            for f in range(w2.shape[1]):
                logit += hidden2[f] * w3[f, 0]
            out_logits[r, j] = min(max(logit, -MAX_LOGIT), MAX_LOGIT)
        out_counts[r] = k


class CompiledGate:
    """The gate's weights as float64 arrays for `lookup_logits`, and buffers for up to `max_rows` rows."""

    def __init__(self, scorer: GateScorer, max_rows: int, max_tokens: int):
        (self.w1, self.b1), (self.w2, self.b2), (self.w3, self.b3) = [
            (np.ascontiguousarray(w, dtype=np.float64), np.ascontiguousarray(b, dtype=np.float64))
            for w, b in scorer.layers]
        self.tokens = np.zeros((max_rows, max_tokens), dtype=np.int64)
        self.counts = np.zeros(max_rows, dtype=np.int64)
        self.logits = np.zeros((max_rows, max_tokens), dtype=np.float64)
        self.chosen = np.zeros(max_rows, dtype=np.int64)
        self.matched = np.zeros(max_rows, dtype=np.int64)

    def run(self, token_ids: np.ndarray, lengths: np.ndarray, rows: np.ndarray, rooms: np.ndarray,
            prompt_lengths: np.ndarray, max_ngram: int, feature_tokens: int, confidence: float) -> None:
        needed = len(lengths)
        if needed > self.counts.shape[0]:
            grow = needed * 2
            self.tokens = np.zeros((grow, self.tokens.shape[1]), dtype=np.int64)
            self.counts = np.zeros(grow, dtype=np.int64)
            self.logits = np.zeros((grow, self.logits.shape[1]), dtype=np.float64)
            self.chosen = np.zeros(grow, dtype=np.int64)
            self.matched = np.zeros(grow, dtype=np.int64)
        lookup_logits(token_ids, lengths, rows, rooms, prompt_lengths, max_ngram, feature_tokens, confidence,
                      self.w1, self.b1, self.w2, self.b2, self.w3, self.b3, self.tokens, self.counts, self.logits,
                      self.matched)

    def choose(self, available: np.ndarray, scale: float, shift: float, curve: np.ndarray, rows: int) -> np.ndarray:
        """Drafts per row (the first len(available) rows) for the calibrated gate and the step-cost curve."""
        size = len(available)
        choose_counts(self.logits[:size], available, scale, shift, curve, rows, self.chosen[:size])
        return self.chosen[:size]

    def warm_up(self, max_ngram: int, feature_tokens: int) -> None:
        """Compile (or load from numba's cache) for the engine's array types before the first step."""
        text = np.array([[1, 2, 3, 1, 2, 3, 1, 2]], dtype=np.int32)
        one = np.array([0], dtype=np.int64)
        self.run(text, np.array([8], dtype=np.int64), one, np.array([2], dtype=np.int64), one, max_ngram,
                 feature_tokens, 0.5)
        self.choose(self.counts[:1], 1.0, 0.0, np.arange(64, dtype=np.float64), 1)


@compiled()
def best_prefixes(values, owner, curve, rows, out_counts):
    """The step's best drafts, for the most expected tokens per second of the whole step: out_counts[r] drafts for
    row r. Candidate i has survival -values[i] (the chance the target accepts its row's tokens up to it) and row
    owner[i]; candidates come row by row, each row's in order. A step with `rows` decoding rows and M drafts
    yields rows + (their survival sum) tokens in curve[rows + M] seconds; the best M drafts for any M are the M
    largest survivals (each row's share a prefix, since a row's survival never increases and a stable sort keeps
    ties in order), so one sorted pass over M finds the best step. Ties go to fewer drafts, as in the rule's other
    copies (docs/ALGORITHM.md, "The best prefix")."""
    out_counts[:] = 0
    m = values.shape[0]
    if m == 0:
        return
    order = np.argsort(values, kind="mergesort")
    best, best_rate, expected = 0, rows / curve[rows], float(rows)
    for i in range(m):
        expected -= values[order[i]]
        rate = expected / curve[rows + i + 1]
        if rate > best_rate:
            best, best_rate = i + 1, rate
    for i in range(best):
        out_counts[owner[order[i]]] += 1


@compiled()
def choose_counts(logits, available, scale, shift, curve, rows, out_counts):
    """`best_prefixes` over the calibrated survival of every row's first available[r] scored tokens."""
    width = logits.shape[1]
    total = 0
    for r in range(available.shape[0]):
        total += min(available[r], width)
    values = np.empty(total, dtype=np.float64)
    owner = np.empty(total, dtype=np.int64)
    m = 0
    for r in range(available.shape[0]):
        survival = 1.0
        for j in range(min(available[r], width)):
            z = min(max(scale * logits[r, j] + shift, -MAX_CALIBRATED_LOGIT), MAX_CALIBRATED_LOGIT)
            survival *= 1.0 / (1.0 + math.exp(-z))
            values[m] = -survival
            owner[m] = r
            m += 1
    best_prefixes(values, owner, curve, rows, out_counts)
