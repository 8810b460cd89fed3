"""Compiled kernels of the suffix store (`suffix.py`): append tokens, find the longest suffix match.

The store is a set of flat arrays so that numba compiles every operation into one call and so that nothing
in it is shared between processes or threads:

- `tokens[cap]`, `doc_of[cap]`: a ring of the last `cap` token positions and the document (request) each
  belongs to; a position p lives in slot p % cap while p >= `state[OLDEST]`.
- `prev[orders, cap]`, `heads[orders, table]`: one hash chain per n-gram order n = 1..orders. heads[n-1, b]
  is the newest position whose n-gram (the n tokens ending there) hashes to bucket b, prev[n-1, p % cap] the
  next older one. Appending is O(orders) per token; a search walks one chain, newest first.
- `docs[R, 3]`: start, end (exclusive) and scope id of document d in row d % R.
- `state`: next position, oldest live position, next document number, oldest live document number.

The hash seeds with the scope id, so a scope's chains rarely meet another's, and every position found is
checked against the query token by token and by scope: a hash collision or another scope's text is never
returned.
"""

from __future__ import annotations

import numpy as np

from ..loops.preverifier_kernel import compiled

TOTAL, OLDEST, NEXT_DOC, FIRST_DOC = 0, 1, 2, 3
START, END, SCOPE = 0, 1, 2
MODULUS = 2147483647  # 2^31 - 1: hash values stay small enough that products never overflow int64
MULTIPLIER = 1000003
MAX_CHAIN = 4096  # chain entries a search visits per order at most (collisions and other scopes included)


@compiled()
def _seed(scope):
    return (scope * 7919 + 12345) % MODULUS


@compiled()
def _mix(h, token):
    return (h * MULTIPLIER + token + 1) % MODULUS


@compiled()
def _bucket(h, mask):
    return ((h * 2654435761) >> 16) & mask  # Knuth's multiplicative spread: nearby hashes land far apart


@compiled()
def append_tokens(tokens, doc_of, prev, heads, docs, state, new, doc):
    """Append `new` to document `doc` (the newest); evict the oldest documents, then the doc's own oldest
    tokens, when the ring is full."""
    cap = tokens.shape[0]
    rows = docs.shape[0]
    mask = heads.shape[1] - 1
    row = doc % rows
    for i in range(new.shape[0]):
        p = state[TOTAL]
        while p - state[OLDEST] >= cap:
            if state[FIRST_DOC] < doc:
                state[FIRST_DOC] += 1
                state[OLDEST] = max(state[OLDEST], docs[state[FIRST_DOC] % rows, START])
            else:
                state[OLDEST] = p - cap + 1
                docs[row, START] = state[OLDEST]
        slot = p % cap
        tokens[slot] = new[i]
        doc_of[slot] = doc
        h = _seed(docs[row, SCOPE])
        for n in range(prev.shape[0]):
            q = p - n
            if q < docs[row, START]:
                prev[n, slot] = -1
                continue
            h = _mix(h, tokens[q % cap])
            bucket = _bucket(h, mask)
            prev[n, slot] = heads[n, bucket]
            heads[n, bucket] = p
        state[TOTAL] = p + 1
        docs[row, END] = p + 1


@compiled()
def _collect(tokens, doc_of, prev, heads, docs, state, query, length, scope, n, hits):
    """Positions (newest first, at most len(hits)) where the query's last n tokens end in `scope`'s text, each
    followed by at least one token of its document."""
    cap = tokens.shape[0]
    rows = docs.shape[0]
    h = _seed(scope)
    for k in range(n):
        h = _mix(h, query[length - 1 - k])
    p = heads[n - 1, _bucket(h, heads.shape[1] - 1)]
    count, steps = 0, 0
    while p >= state[OLDEST] and count < hits.shape[0] and steps < MAX_CHAIN:
        steps += 1
        slot = p % cap
        row = doc_of[slot] % rows
        following = prev[n - 1, slot]
        if docs[row, SCOPE] == scope and p + 1 < docs[row, END] and p - n + 1 >= max(docs[row, START], state[OLDEST]):
            same = True
            for k in range(n):
                if tokens[(p - k) % cap] != query[length - 1 - k]:
                    same = False
                    break
            if same:
                hits[count] = p
                count += 1
        p = following
    return count


@compiled()
def find_suffix(tokens, doc_of, prev, heads, docs, state, query, length, scope, max_tokens, max_ngram, max_match,
                hits, out_tokens, out_agreement, out):
    """The continuation of the best occurrence of the end of query[:length] in `scope`'s text.

    Longest n-gram first (n <= max_ngram, the store's orders); among the (newest len(hits)) occurrences of that
    n-gram, the longest backward match (at most max_match tokens), then the longest continuation (at most
    max_tokens), then the newest: the rule of `find_lookup`. out = (n, match length, occurrences, absolute start
    of the continuation, its length k); n = 0 without a match. out_tokens[:k] is the continuation,
    out_agreement[j] the share of occurrences whose continuation equals it up to token j."""
    cap = tokens.shape[0]
    rows = docs.shape[0]
    out[:] = 0
    for n in range(min(max_ngram, prev.shape[0], length), 0, -1):
        count = _collect(tokens, doc_of, prev, heads, docs, state, query, length, scope, n, hits)
        if count == 0:
            continue
        best, best_match, best_more = -1, -1, -1
        for h in range(count):  # newest first: a tie keeps the newer occurrence
            p = hits[h]
            row = doc_of[p % cap] % rows
            low = max(docs[row, START], state[OLDEST])
            matched = 0
            while matched < min(max_match, length) and p - matched >= low and \
                    tokens[(p - matched) % cap] == query[length - 1 - matched]:
                matched += 1
            more = min(docs[row, END] - p - 1, max_tokens)
            if matched > best_match or (matched == best_match and more > best_more):
                best, best_match, best_more = p, matched, more
        for j in range(best_more):
            out_tokens[j] = tokens[(best + 1 + j) % cap]
        agreeing = np.ones(count, dtype=np.bool_)
        for j in range(best_more):
            agree, available = 0, 0
            for h in range(count):
                offset = hits[h] + 1 + j
                if offset < docs[doc_of[hits[h] % cap] % rows, END]:
                    available += 1
                    if agreeing[h] and tokens[offset % cap] == out_tokens[j]:
                        agree += 1
                        continue
                agreeing[h] = False
            out_agreement[j] = agree / max(available, 1)
        out[0], out[1], out[2], out[3], out[4] = n, best_match, count, best + 1, best_more
        return
