"""The lookup gate recipe's measurements (`pacer-hf train-lookup-gate`, recipes/lookup_gate.py, stages `costs` and
`ship`): what proposing k lookup tokens costs the target, and the simulated speed of fixed lengths, the gate's
rules and the per-round oracle on held-out answers."""

from __future__ import annotations

import numpy as np
import torch

from ..modeling_lookup_gate import PacerLookupGate, expected_gain_length, threshold_length


def measure_round_cost(target, max_tokens: int, context: int = 400, repeats: int = 15) -> dict:
    """Proposing k = 0..max_tokens lookup tokens costs a target forward of k + 1 tokens after a cached
    `context`-token prefix: calibrate's measured verify costs (interleaved medians, no draft), as ms and
    relative to one token (`round_cost`)."""
    from ..loops.probes import measure_costs

    costs = measure_costs(target, None, context=context, max_k=max_tokens, repeats=repeats)
    return {"verify_ms": [round(1000 * costs.step_seconds * v, 2) for v in costs.verify_cost],
            "round_cost": [round(v, 4) for v in costs.verify_cost], "context": context, "repeats": repeats,
            "threads": torch.get_num_threads()}


def simulate(accepted: np.ndarray, available: np.ndarray, lengths: np.ndarray, cost: list[float]) -> float:
    """Speed over plain decoding of proposing `lengths[t]` tokens at each round start t (greedy rounds)."""
    t, spent, n = 0, 0.0, len(accepted)
    while t < n:
        k = int(min(lengths[t], available[t], n - t - 1))
        spent += cost[k]
        t += min(k, int(accepted[t])) + 1
    return n / spent


def policy_lengths(gate: PacerLookupGate, entry: dict, cost: list[float] | None,
                   threshold: float = 0.5) -> np.ndarray:
    """The gate's proposal length at every round start of one answer: expected gain under `cost`, or
    (cost None) the tokens whose survival is >= threshold."""
    survival = gate.survival(entry["features"]).numpy()
    out = np.zeros(len(entry["available"]), dtype=np.int64)
    for t, k in enumerate(entry["available"]):
        if k:
            s = survival[t, :k].tolist()
            out[t] = expected_gain_length(s, cost) if cost is not None else threshold_length(s, threshold)
    return out


def speed_table(gate: PacerLookupGate, examples: dict, cost: list[float], max_tokens: int,
                cache: bool = False) -> dict:
    """Simulated speed over plain decoding on the held-out answers, per category and policy (mean over answers);
    `cache`: the answers as run with a cache of the earlier ones (the examples' cache pass)."""
    table: dict[str, dict[str, list[float]]] = {}
    for entry, record in zip(examples["per_record"], examples["records"]):
        if not record["heldout"] or record.get("sampled") or len(entry["accepted"]) < 2:
            continue
        if bool(record.get("cache")) != cache:
            continue
        acc, avail = entry["accepted"], entry["available"]
        row = table.setdefault(record["category"], {})
        for n in (1, 2, 3, 4, 5, max_tokens):
            row.setdefault(f"fixed-{n}", []).append(simulate(acc, avail, np.full(len(acc), n), cost))
        row.setdefault("gate", []).append(simulate(acc, avail, policy_lengths(gate, entry, cost), cost))
        row.setdefault("gate-threshold-0.5", []).append(simulate(acc, avail, policy_lengths(gate, entry, None), cost))
        oracle = np.array([max(range(int(k) + 1), key=lambda j, a=int(a): (min(j, a) + 1) / cost[j])
                           for a, k in zip(acc, avail)])
        row.setdefault("oracle", []).append(simulate(acc, avail, oracle, cost))
    return {cat: {name: round(float(np.mean(v)), 3) for name, v in row.items()} | {"answers": len(row["gate"])}
            for cat, row in sorted(table.items())}
