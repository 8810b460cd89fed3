"""Simulated speedup of stop rules on recorded traces (docs/ALGORITHM.md §5), in units of one target step.

A round drafts n tokens (the stop rule picks n), the target verifies them in one forward; with the
acceptance a_i of each drafted token (1/0, or a soft probability) the round yields
E[accepted] + 1 = sum_{k<=n} prod_{i<=k} a_i + 1 tokens and costs n*c + verify_cost(n) (+ the
pre-verifier's calls and the decoding loop's own per-round overhead), with c = t(draft step)/t(target
step) and verify_cost(k) = t(target forward over k+1 tokens)/t(one target step). Autoregressive
decoding costs 1 + ar_overhead per token (its loop is not free either), so
speedup = sum(tokens) * (1 + ar_overhead) / sum(time).
"""

from __future__ import annotations

import numpy as np

from ..configuration_pacer import DECISION_RULES
from ..costs import CostModel
from ..modeling_pacer import best_prefix, expected_gain_continues


def acceptance_matrix(labels: np.ndarray) -> np.ndarray:
    """Per-token acceptance in [0,1] from stored labels; -100 (undefined) counts as rejected.

    Greedy labels are -100 only after the first rejection or an EOS, where the round has ended anyway.
    """
    acc = np.asarray(labels, dtype=np.float64)
    return np.where(acc < 0, 0.0, acc)


def expected_accepted(acc: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """E[accepted tokens] per round when round r drafts lengths[r] tokens."""
    survive = np.cumprod(acc, axis=1)
    csum = np.concatenate([np.zeros((acc.shape[0], 1)), np.cumsum(survive, axis=1)], axis=1)
    return csum[np.arange(acc.shape[0]), lengths]


def speedup(acc: np.ndarray, lengths: np.ndarray, costs: CostModel, preverifier: bool = False,
            proposed: np.ndarray | None = None) -> float:
    """Simulated speedup over autoregressive decoding when round r drafts lengths[r] tokens; with `preverifier`
    every drafted token also pays `costs.preverifier_cost` (generation scores each one). `proposed`: a trim
    verifies only proposed[r] <= lengths[r] of them (the drafting is paid all the same)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    proposed = lengths if proposed is None else np.asarray(proposed, dtype=np.int64)
    tokens = expected_accepted(acc, proposed) + 1.0
    time = costs.round_time(proposed) + (lengths - proposed) * costs.draft_cost
    if preverifier:
        time = time + lengths * costs.preverifier_cost
    return float(tokens.sum() * (1.0 + costs.ar_overhead) / time.sum())


def fixed_lengths(acc: np.ndarray, gamma: int) -> np.ndarray:
    return np.full(acc.shape[0], min(gamma, acc.shape[1]), dtype=np.int64)


def oracle_lengths(acc: np.ndarray, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Stop exactly before the first rejection. Soft acceptances are first drawn as 0/1 (fixed seed).

    Returns (lengths, the 0/1 acceptance they refer to)."""
    hard = acc
    if not np.isin(acc, (0.0, 1.0)).all():
        hard = (np.random.default_rng(seed).random(acc.shape) < acc).astype(np.float64)
    return np.cumprod(hard, axis=1).sum(1).astype(np.int64), hard


def pacer_lengths(probs: np.ndarray, block_size: int, threshold: float, rule: str = "block",
                  max_tokens: int | None = None, costs: CostModel | None = None, trim: bool = False) -> np.ndarray:
    """Draft lengths chosen by the Pacer rule from per-token predicted acceptance `probs (N, L)`.

    Mirrors generation: after every `block_size` tokens the pre-verifier scores the last block
    ("block") or the whole draft ("cumulative") against `threshold`, or ("expected_gain", with `costs`)
    asks `expected_gain_continues`, the function `PacerPreVerifier.decide` calls; a stop ends drafting
    (the last block is still verified); the cap is `max_tokens`. Every drafted token is scored (its
    features and the scorer run per token), so a round's pre-verifier cost is its length times the per-token cost.
    `trim` (expected_gain, greedy): the rule `trim_failed_block` runs, which also stops where proposing a prefix,
    none included, beats drafting on; `trimmed_lengths` gives what such rounds propose.
    """
    n, width = probs.shape
    cap = min(width, max_tokens or width)
    if rule == "expected_gain":
        if costs is None:
            raise ValueError("rule='expected_gain' needs the cost model (costs=).")
        calibration, lengths = costs.as_calibration(), np.full(n, cap, dtype=np.int64)
        for r, row in enumerate(probs[:, :cap].tolist()):
            for end in range(block_size, cap + 1, block_size):
                if not expected_gain_continues(row[:end], block_size, cap, calibration, trim=trim):
                    lengths[r] = end
                    break
        return lengths
    lengths = np.full(n, cap, dtype=np.int64)
    alive = np.ones(n, dtype=bool)
    if threshold <= 0:
        return lengths
    logp = np.log(np.clip(probs[:, :cap], 1e-12, 1.0))
    cum = np.cumsum(logp, axis=1)
    for end in range(block_size, cap + 1, block_size):
        start = end - block_size if rule == "block" else 0
        score = np.exp(cum[:, end - 1] - (cum[:, start - 1] if start > 0 else 0.0))
        fail = alive & ((score < threshold) | (threshold >= 1.0))
        lengths[fail] = end
        alive &= ~fail
    return lengths


def trimmed_lengths(probs: np.ndarray, lengths: np.ndarray, costs: CostModel) -> np.ndarray:
    """The tokens each round proposes when the expected-gain rule trims its drafted `lengths` (`best_prefix`, the
    function `PacerPreVerifier.decide` calls with `trim_failed_block`; greedy only)."""
    calibration = costs.as_calibration()
    return np.array([best_prefix(row[:n], calibration) for row, n in zip(probs.tolist(), lengths.tolist())],
                    dtype=np.int64)


THRESHOLDS = (0.01, 0.02, *(round(x, 2) for x in np.arange(0.05, 1.0, 0.05)), 0.97, 0.99, 1.0)


def speedup_table(acc: np.ndarray, probs: np.ndarray | None, costs: CostModel, block_size: int = 4,
                  threshold: float = 0.5, rule: str = "block", max_gamma: int = 8, trim: bool = False) -> dict[str, float]:
    """Fixed gamma 1..max_gamma, the oracle and (with probs) Pacer at the given setting; with `trim` (expected_gain)
    also Pacer with `trim_failed_block` (`pacer_trim`, `pacer_trim_mean_proposed`: the rule that may stop to trim)."""
    table = {f"fixed-{g}": speedup(acc, fixed_lengths(acc, g), costs) for g in range(1, max_gamma + 1)}
    lengths, hard = oracle_lengths(acc)
    table["oracle"] = speedup(hard, lengths, costs)
    if probs is not None:
        lengths = pacer_lengths(probs, block_size, threshold, rule, costs=costs)
        table["pacer"] = speedup(acc, lengths, costs, preverifier=True)
        table["pacer_mean_draft"] = float(lengths.mean())
        if trim and rule == "expected_gain":
            lengths = pacer_lengths(probs, block_size, threshold, rule, costs=costs, trim=True)
            proposed = trimmed_lengths(probs, lengths, costs)
            table["pacer_trim"] = speedup(acc, lengths, costs, preverifier=True, proposed=proposed)
            table["pacer_trim_mean_proposed"] = float(proposed.mean())
    return table


def best_setting(acc: np.ndarray, probs: np.ndarray, costs: CostModel, block_sizes=(1, 2, 3, 4, 6, 8),
                 thresholds=THRESHOLDS, rules=DECISION_RULES,
                 prefer_margin: float = 0.01) -> dict:
    """The (rule, block size, threshold) with the highest simulated speedup, and the full grid.

    "expected_gain" has no threshold (its row says None): the cost model decides."""
    grid = []
    for rule in rules:
        for b in block_sizes:
            if b > acc.shape[1]:
                continue
            for t in (None,) if rule == "expected_gain" else thresholds:
                lengths = pacer_lengths(probs, b, t, rule, costs=costs)
                grid.append({"rule": rule, "block_size": b, "threshold": None if t is None else float(t),
                             "speedup": speedup(acc, lengths, costs, preverifier=True), "mean_draft": float(lengths.mean())})
    best = max(grid, key=lambda row: row["speedup"])
    # The cost-aware rule has no threshold fitted to these traces, so it is preferred unless a threshold
    # rule beats it by more than `prefer_margin` (a tuned threshold's edge on the traces it was tuned on).
    gain = [row for row in grid if row["rule"] == "expected_gain"]
    if gain and max(gain, key=lambda row: row["speedup"])["speedup"] * (1 + prefer_margin) >= best["speedup"]:
        best = max(gain, key=lambda row: row["speedup"])
    return {"best": best, "grid": grid}
