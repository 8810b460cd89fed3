"""The best-prefix rule (docs/ALGORITHM.md, "The best prefix") has three copies: the pre-verifier's trim
(`modeling_pacer.best_prefix`), the lookup gate's length (`modeling_lookup_gate.expected_gain_length`) and the vLLM
step's choice (`vllm/kernels.best_prefixes`). They must pick the same k on the same inputs, ties included.

Inputs are on a dyadic grid (probabilities in quarters, costs in quarter steps), where every expected-token sum is
exact in floating point: the three compute the same quotients bit for bit, and equal rates are real ties."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from pacer_hf.modeling_lookup_gate import expected_gain_length
from pacer_hf.modeling_pacer import best_prefix
from pacer_hf.vllm.kernels import best_prefixes


def three_choices(probs: list[float], costs: list[float]) -> tuple[int, int, int]:
    """The k each copy picks for one round: `probs[j]` the chance token j is accepted given those before it were,
    `costs[k]` the time of a round proposing k tokens (drafting costs nothing extra, so the three read one table)."""
    survival = np.cumprod(probs).tolist()
    pacer = best_prefix(probs, {"round_cost": costs, "draft_cost": 0.0, "preverifier_cost": 0.0})
    lookup = expected_gain_length(survival, costs)
    curve = np.array([costs[0], *costs], dtype=np.float64)  # curve[N]: a step of N tokens, one row's own + k drafts
    counts = np.zeros(1, dtype=np.int64)
    best_prefixes(-np.array(survival, dtype=np.float64), np.zeros(len(probs), dtype=np.int64), curve, 1, counts)
    return pacer, lookup, int(counts[0])


def rates(probs: list[float], costs: list[float]) -> list[float]:
    survival = np.cumprod(probs)
    return [(1 + survival[:k].sum()) / costs[k] for k in range(len(probs) + 1)]


def test_ties_go_to_the_shorter_prefix_in_all_three():
    cases = [  # (probs, costs, the k the rule picks), each with exact ties in its rates
        ([1.0], [1.0, 2.0], 0),  # rates 1, 1
        ([0.5, 1.0], [1.0, 1.5, 2.0], 0),  # rates 1, 1, 1
        ([1.0, 1.0, 0.5], [1.0, 1.0, 1.5, 2.5], 1),  # rates 1, 2, 2, 1.4
        ([0.5, 0.0], [1.0, 1.5, 1.5], 0),  # an impossible token: rates 1, 1, 1
        ([1.0, 1.0, 1.0], [1.0, 2.0, 3.0, 4.0], 0),  # every width pays exactly its token
        ([1.0, 0.5, 1.0], [1.0, 1.0, 1.5, 2.0], 1),  # rates 1, 2, 1.667, 1.5: no tie, the longest is not best
    ]
    for probs, costs, expected in cases:
        r = rates(probs, costs)
        assert r.index(max(r)) == expected, "the case's expected k is the first best rate"
        assert three_choices(probs, costs) == (expected,) * 3, (probs, costs)


QUARTERS = st.sampled_from([0.0, 0.25, 0.5, 0.75, 1.0])


@settings(max_examples=300, deadline=None)
@given(st.lists(QUARTERS, min_size=1, max_size=8), st.data())
def test_the_three_copies_agree_on_the_same_inputs(probs, data):
    steps = data.draw(st.lists(st.integers(0, 8), min_size=len(probs), max_size=len(probs)))
    costs = [1.0]
    for step in steps:  # non-decreasing, as measured round costs are, in quarter steps
        costs.append(costs[-1] + step / 4)
    r = rates(probs, costs)
    assert three_choices(probs, costs) == (r.index(max(r)),) * 3
