"""Per strategy x category x temperature metrics (docs/ALGORITHM.md §5), the oracle, and the cost model behind both.

Modelled time (units of one target decoding step, prefill excluded): a round that verifies L drafted tokens
costs verify(L), plus c per draft forward the harness counted (= L for a plain draft loop), with
c = t(draft step)/t(target step) and verify(L) = t(target forward over L+1 tokens)/t(target step), both
measured in the same process (`loops.probes.measure_costs`).
Autoregressive decoding costs 1 per token, so modelled speedup = new tokens / sum of round costs.

The oracle replays the longest fixed-γ run of pacer_hf's loop (sd-fixed-Γ): in every round it drafts
exactly the a_r tokens the target accepted (stop just before the first rejection; a_r = Γ when all were
accepted, so Γ caps it) and yields the same a_r + 1 tokens. It is the upper bound for any stop rule
with the same draft, at most Γ tokens per round. Its tokens/s is ar's measured tokens/s times its
modelled speedup. Oracle-gap capture = (S_method - S_bestfixed)/(S_oracle - S_bestfixed), all three
modelled speedups, best fixed = the sd-fixed-γ with the highest modelled speedup; oracle gap = 1 - capture.

Prompt lookup has its own oracle (`lookup-oracle`): it replays the longest pacer_hf `lookup-<N>` run (every
lookup token proposed) and in every round proposes the a_r tokens the target accepted, or more of the
round's lookup tokens where verifying more is cheaper (on some CPUs verify(3) < verify(2)). Lookup
strategies are compared with the best `hf-lookup-<N>` (transformers' own prompt lookup) of the same run:
`speedup_vs_best_hf_lookup` (measured) and `lookup_oracle_gap_capture` (modelled, against the oracle).
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from ..costs import CostModel
from .strategy_calls import Strategy, is_lookup_fixed, sklearn_retuning

RECORD_KEYS = ("strategy", "category", "temperature", "tokens_per_s", "speedup_vs_ar", "tau", "alpha",
               "mean_draft_len", "preverifier_overhead", "identical_to_ar")


def modelled_time(lengths: list[int], costs: CostModel, draft_forwards: int | None = None) -> float:
    """Rounds of `lengths` verified tokens; draft cost per draft forward when known (Ouroboros' pool tokens
    and HF's skipped steps cost no draft forward), else per drafted token."""
    if not lengths:
        return 0.0
    k = np.asarray(lengths, dtype=np.int64)
    drafted = float(k.sum()) if draft_forwards is None else float(draft_forwards)
    return float(drafted * costs.draft_cost + costs.verify(k).sum())


def _modelled(strategy: Strategy) -> bool:
    """PEARL overlaps drafting with verification (and pre-verifies with extra target forwards): the
    sequential round model does not describe it, so it gets no modelled speedup or oracle-gap capture."""
    return "pearl" not in strategy.name


def _median(values: list[float]) -> float | None:
    return float(np.median(values)) if values else None


def aggregate(calls: list[dict], strategies: list[Strategy], costs: CostModel | None, config) -> list[dict]:
    """Turn per-call measurements into one record per strategy x category x temperature (`costs` None: no
    modelled columns)."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for call in calls:
        groups[(call["strategy"], call["category"], call["temperature"])].append(call)
    categories = list(dict.fromkeys(call["category"] for call in calls))
    records = []
    for category in categories:
        for temperature in config.temperatures:
            cell = {s.name: groups.get((s.name, category, temperature), []) for s in strategies if s.runs}
            records += _cell(cell, strategies, category, temperature, costs, config)
    return records


def _per_run_tps(calls: list[dict]) -> dict[int, float]:
    tokens, seconds = defaultdict(int), defaultdict(float)
    for call in calls:
        tokens[call["run"]] += call["new_tokens"]
        seconds[call["run"]] += call["seconds"]
    return {run: tokens[run] / seconds[run] for run in tokens if seconds[run] > 0}


def _cell(cell: dict[str, list[dict]], strategies: list[Strategy], category: str, temperature: float,
          costs: CostModel | None, config) -> list[dict]:
    ar_runs = _per_run_tps(cell["ar"])
    records: dict[str, dict] = {}
    for strategy in strategies:
        if not strategy.runs:
            continue
        calls = cell[strategy.name]
        runs = _per_run_tps(calls)
        ratios = [runs[r] / ar_runs[r] for r in runs if r in ar_runs]
        tokens = sum(c["new_tokens"] for c in calls)
        seconds = sum(c["seconds"] for c in calls)
        lengths = [n for c in calls for n in c["draft_lengths"]]
        accepted = [n for c in calls for n in c["accepted"]]
        target_forwards = sum(c["target_forwards"] for c in calls)
        draft_forwards = sum(c["draft_forwards"] for c in calls)
        identical = all(c["identical"] is True for c in calls) if temperature == 0 and calls else None
        record = {
            "strategy": strategy.name, "family": strategy.family, "category": category,
            "temperature": temperature, "runs": len(runs), "calls": len(calls), "new_tokens": tokens,
            "tokens_per_s": _median(list(runs.values())),
            "tokens_per_s_min": min(runs.values()) if runs else None,
            "tokens_per_s_max": max(runs.values()) if runs else None,
            "speedup_vs_ar": _median(ratios), "speedup_vs_ar_min": min(ratios) if ratios else None,
            "speedup_vs_ar_max": max(ratios) if ratios else None,
            "tau": tokens / target_forwards if target_forwards else None,
            "alpha": sum(accepted) / sum(lengths) if sum(lengths) else None,
            "mean_draft_len": float(np.mean(lengths)) if lengths else None,
            "draft_len_hist": _hist(lengths),
            "rounds": len(lengths),
            "draft_forwards_per_token": draft_forwards / tokens if tokens else None,
            "target_forwards_per_token": target_forwards / tokens if tokens else None,
            "preverifier_overhead": (sum(c["preverifier_seconds"] for c in calls) / seconds) if seconds else 0.0,
            "modelled_speedup": (None if not _modelled(strategy) or costs is None else
                                 tokens / modelled_time(lengths, costs, draft_forwards) if lengths else 1.0),
            "identical_to_ar": identical,
            "draft_config": strategy.draft_config, "sklearn_retuning": sklearn_retuning(strategy),
            "modelled": False, "lookup": strategy.lookup_tokens is not None,
        }
        records[strategy.name] = record
    fixed = [s for s in strategies if s.family == "sd-fixed" and s.runs]
    oracle = next((s for s in strategies if s.family == "oracle"), None)
    if oracle is not None and fixed and costs is not None:
        longest = max(fixed, key=lambda s: s.gamma or 0)
        records["oracle"] = _oracle(cell[longest.name], longest, records["ar"], category, temperature, costs)
    if costs is not None:
        _lookup_columns(records, strategies, cell, category, temperature, costs)
    best_measured = max((records[s.name] for s in fixed), key=lambda r: r["tokens_per_s"] or 0, default=None)
    best_modelled = (max((records[s.name] for s in fixed), key=lambda r: r["modelled_speedup"], default=None)
                     if costs is not None else None)
    for record in records.values():
        record["best_fixed"] = best_measured["strategy"] if best_measured else None
        record["speedup_vs_best_fixed"] = (record["tokens_per_s"] / best_measured["tokens_per_s"]
                                           if best_measured and record["tokens_per_s"] and
                                           best_measured["tokens_per_s"] else None)
        record["best_fixed_modelled"] = best_modelled["strategy"] if best_modelled else None
        capture = None
        if best_modelled and "oracle" in records and record["family"] != "ar" and record["modelled_speedup"]:
            span = records["oracle"]["modelled_speedup"] - best_modelled["modelled_speedup"]
            if span > 1e-9:
                capture = (record["modelled_speedup"] - best_modelled["modelled_speedup"]) / span
        record["oracle_gap_capture"] = capture
        record["oracle_gap"] = None if capture is None else 1.0 - capture
    return list(records.values())


def _lookup_columns(records: dict[str, dict], strategies: list[Strategy], cell: dict[str, list[dict]], category: str,
                    temperature: float, costs: CostModel) -> None:
    """The lookup oracle record, and every lookup strategy against the best hf-lookup-<N> and that oracle."""
    fixed = [s for s in strategies if is_lookup_fixed(s) and s.runs]
    if fixed and any(s.family == "lookup-oracle" for s in strategies):
        longest = max(fixed, key=lambda s: s.lookup_tokens or 0)
        verified = [_cheapest_width(a, d, costs) for c in cell[longest.name]
                    for a, d in zip(c["accepted"], c["draft_lengths"])]
        records["lookup-oracle"] = _oracle(cell[longest.name], longest, records["ar"], category, temperature, costs,
                                           name="lookup-oracle", verified=verified, draft_forwards=0)
    hf = [records[s.name] for s in strategies if s.family == "hf-lookup"]
    if not hf:
        return
    best = max(hf, key=lambda r: r["tokens_per_s"] or 0)
    best_modelled = max(hf, key=lambda r: r["modelled_speedup"] or 0)
    oracle = records.get("lookup-oracle")
    for record in records.values():
        if record["family"] not in ("hf-lookup", "lookup-oracle") and not (
                record["family"] in ("registered", "default-gate", "suffix") and record.get("lookup")):
            continue
        record["best_hf_lookup"] = best["strategy"]
        record["speedup_vs_best_hf_lookup"] = (record["tokens_per_s"] / best["tokens_per_s"]
                                               if record["tokens_per_s"] and best["tokens_per_s"] else None)
        span = oracle["modelled_speedup"] - best_modelled["modelled_speedup"] if oracle else 0.0
        record["lookup_oracle_gap_capture"] = (
            (record["modelled_speedup"] - best_modelled["modelled_speedup"]) / span
            if span > 1e-9 and record["modelled_speedup"] and record is not oracle else None)


def _cheapest_width(accepted: int, proposed: int, costs: CostModel) -> int:
    """The proposal length in [accepted, proposed] that costs least to verify (ties: the shorter)."""
    options = range(accepted, max(accepted, proposed) + 1)
    return min(options, key=lambda k: (float(costs.verify(np.asarray(k))), k))


def _oracle(calls: list[dict], source: Strategy, ar: dict, category: str, temperature: float,
            costs: CostModel, name: str = "oracle", verified: list[int] | None = None,
            draft_forwards: int | None = None) -> dict:
    """The oracle record: rounds verifying `verified` tokens (default: exactly the accepted ones), drafted
    at one draft forward per token unless `draft_forwards` says otherwise (0: lookup tokens cost none)."""
    lengths = [a for c in calls for a in c["accepted"]]
    verified = lengths if verified is None else verified
    tokens = sum(c["new_tokens"] for c in calls)
    speedup = tokens / modelled_time(verified, costs, draft_forwards) if lengths else None
    rounds = len(lengths)
    return {
        "strategy": name, "family": name, "category": category, "temperature": temperature,
        "runs": ar["runs"], "calls": len(calls), "new_tokens": tokens,
        "tokens_per_s": ar["tokens_per_s"] * speedup if speedup and ar["tokens_per_s"] else None,
        "tokens_per_s_min": None, "tokens_per_s_max": None,
        "speedup_vs_ar": speedup, "speedup_vs_ar_min": None, "speedup_vs_ar_max": None,
        "tau": tokens / rounds if rounds else None,
        "alpha": sum(lengths) / sum(verified) if sum(verified) else None,
        "mean_draft_len": float(np.mean(verified)) if verified else None,
        "draft_len_hist": _hist(verified), "rounds": rounds,
        "draft_forwards_per_token": (sum(lengths) if draft_forwards is None else draft_forwards) / tokens
        if tokens else None,
        "target_forwards_per_token": rounds / tokens if tokens else None,
        "preverifier_overhead": 0.0, "modelled_speedup": speedup or 1.0,
        "identical_to_ar": None, "draft_config": {}, "sklearn_retuning": False,
        "modelled": True, "oracle_source": source.name,
    }


def _hist(lengths: list[int]) -> dict[str, int]:
    values, counts = np.unique(np.asarray(lengths, dtype=np.int64), return_counts=True)
    return {str(int(v)): int(c) for v, c in zip(values, counts)}
