"""The benchmark loop: strategies interleaved per prompt in one process, warm-up excluded, runs repeated.

Counting is done by the harness itself, the same way for every strategy (timed_call.py: one timed call, its target
and draft forwards counted by hooks, pacer_hf strategies' own `PacerStats` used where they report rounds); this
module runs the calls, checks greedy outputs against `ar`, and aggregates.
"""

from __future__ import annotations

import copy
import statistics
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from tqdm.auto import tqdm
from transformers import PreTrainedModel

import pacer_hf

from ..attached import ATTACHED_SLOTS, detach, reattach
from ..costs import CostModel
from ..data.prompts import CATEGORIES, Prompt
from ..loops.recent_acceptance import SeparateMemories
from ..model_state import ModelState
from ..modeling_pacer import PacerPreVerifier
from ..strategies import OuroborosConfig, strategy_config
from .machine import machine_info, physical_cores
from .strategy_calls import (
    BenchSuffixCaches,
    Strategy,
    default_strategy_names,
    resolve_strategies,
    sklearn_retuning,
)
from .timed_call import CallResult, ForwardCounter, run_call

__all__ = ["SCHEMA", "BenchConfig", "BenchResult", "BenchmarkMismatch", "PoolIsolation", "histogram",
           "median_spread", "preverifier_variants", "run_benchmark"]

SCHEMA = 1  # bump when results.json records change meaning


class BenchmarkMismatch(RuntimeError):
    """A greedy output differed from the target alone: speculative decoding must be lossless."""


@dataclass
class BenchConfig:
    """What to run. `strategies=None` means the default list for the mode (see `default_strategy_names`)."""

    strategies: list[str] | None = None
    categories: list[str] = field(default_factory=lambda: list(CATEGORIES))
    temperatures: tuple[float, ...] = (0.0, 1.0)
    prompts_per_category: int = 8
    runs: int = 3
    max_new_tokens: int = 128
    prompt_tokens: int = 256
    threads: int | None = None
    seed: int = 0
    warmup: bool = True
    warmup_tokens: int = 16  # per warm-up call: enough to compile kernels and run each rule's first-call probes
    quick: bool = False
    cost_repeats: int = 15  # 0: no cost model, so no modelled columns and no oracle (the demo: measured speed only)


@dataclass
class BenchResult:
    records: list[dict]
    meta: dict
    calls: list[dict]  # per (strategy, category, temperature, run, prompt) call, without outputs


class PoolIsolation:
    """One Ouroboros phrase pool per strategy, emptied at the start of every run; one memory of the pair's acceptance
    per strategy, kept across runs.

    pacer_hf keeps one pool per (target, draft) across calls (warm start). Interleaved, `ouroboros` and
    `pacer+ouroboros` would read each other's phrases for the very prompt being decoded, and run 2 would
    replay run 1's outputs; so each strategy gets its own pool, warm across the prompts of one run only.
    The stop rule's memory of the pair (`loops/recent_acceptance.py`) is per (target, draft) as well: interleaved,
    `pacer` and `pacer-default` would each start from what the other learned, so each has its own, as a process
    serving one of them would.
    """

    def __init__(self, target: PreTrainedModel, draft: PreTrainedModel):
        self.target, self.draft = target, draft
        self.saved: dict[str, Any] = {}
        self.memories = SeparateMemories(target, draft)
        self.caches = BenchSuffixCaches()  # the suffix caches too: each prompt once per run, earlier prompts only

    def new_run(self) -> None:
        self.saved.clear()
        self.caches.reset()

    @contextmanager
    def around(self, strategy: Strategy) -> Iterator[None]:
        with self.memories.of(strategy.name), self._pool(strategy):
            yield

    @contextmanager
    def _pool(self, strategy: Strategy) -> Iterator[None]:
        config = strategy_config(strategy.name) if strategy.family == "registered" else None
        if not isinstance(config, OuroborosConfig):
            yield
            return
        pools = ModelState(self.target).phrase_pools
        if pools is not None:
            pools.pop(self.draft, None)
            if strategy.name in self.saved:
                pools[self.draft] = self.saved[strategy.name]
        try:
            yield
        finally:
            pools = ModelState(self.target).phrase_pools
            if pools is not None and self.draft in pools:
                self.saved[strategy.name] = pools.pop(self.draft)


def _first_difference(a: list[int], b: list[int]) -> int:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


def _with_config(preverifier: PacerPreVerifier, **changes) -> PacerPreVerifier:
    """The same weights (shared, not copied) under a copied config with `changes`."""
    variant = copy.copy(preverifier)
    variant.config = copy.deepcopy(preverifier.config)
    for key, value in changes.items():
        setattr(variant.config, key, value)
    return variant


def preverifier_variants(preverifier: PacerPreVerifier | None,
                         sampling: PacerPreVerifier | None = None) -> dict[str, PacerPreVerifier]:
    """`pacer` is the given pre-verifier; `pacer-b1` the same weights with a copied config, block_size=1
    (`pacer-default` needs none of them: it is the default pre-verifier, `timed_call._pacer_argument`).

    Sampling runs ("@sampling") use `sampling` (a pre-verifier trained for sampled rounds) when given, else the
    same, with trim_failed_block=False: trimming is exact for greedy only, and generate refuses it when sampling.
    """
    if preverifier is None:
        return {}

    def named(module: PacerPreVerifier) -> dict[str, PacerPreVerifier]:
        return {"pacer": module, "pacer-b1": _with_config(module, block_size=1)}

    variants = named(preverifier)
    for name, module in named(sampling if sampling is not None else preverifier).items():
        variants[f"{name}@sampling"] = _with_config(module, trim_failed_block=False)
    return variants


@dataclass
class _Harness:
    """What every timed call of one benchmark shares: the pair, the pre-verifier variants, the hooks, the pools."""

    target: PreTrainedModel
    draft: PreTrainedModel | None
    preverifiers: dict[str, PacerPreVerifier]
    counter: ForwardCounter
    pools: PoolIsolation

    def call(self, strategy: Strategy, prompt: Prompt, temperature: float, max_new_tokens: int,
             seed: int) -> CallResult:
        with self.pools.around(strategy):
            return run_call(strategy, self.target, self.draft, prompt, temperature, max_new_tokens,
                            self.preverifiers, self.counter, seed, self.pools.caches.get(strategy, temperature))


def run_benchmark(
    target: PreTrainedModel,
    draft: PreTrainedModel | None,
    prompts: dict[str, list[Prompt]],
    config: BenchConfig,
    preverifier: PacerPreVerifier | None = None,
    costs: CostModel | None = None,
    progress: bool = True,
    call_hook: Callable[[Strategy, CallResult], None] | None = None,
    sampling_preverifier: PacerPreVerifier | None = None,
) -> BenchResult:
    """Run every strategy on every prompt, interleaved, `config.runs` times; return aggregated records.

    Pacer's sampling runs use `sampling_preverifier` (one trained for sampled rounds) when given, else `preverifier`.

    Raises BenchmarkMismatch when a greedy output differs from `ar`'s in the same run. `costs` (measured
    when None) is the cost model of the oracle and of the modelled speedups. `call_hook` sees every
    timed call (tests use it). Without a draft only prompt-lookup strategies run (Pacer-gated lookup when
    a lookup gate is attached to the target).
    """
    from .metrics_core import aggregate

    threads = config.threads or physical_cores()
    torch.set_num_threads(threads)
    pacer_hf.enable(target)
    if draft is not None:
        pacer_hf.generation._check_pair(target, draft)
    gate = ModelState(target).lookup_gate
    names = config.strategies or default_strategy_names(config.quick, preverifier is not None, draft is not None,
                                                        gate is not None)
    oracle_gamma = max(8, preverifier.config.max_draft_tokens if preverifier is not None else 0)
    strategies = resolve_strategies(names, preverifier is not None, oracle_gamma, has_draft=draft is not None)
    running = [s for s in strategies if s.runs]
    preverifiers = preverifier_variants(preverifier, sampling_preverifier)
    if not any(prompts.values()):
        raise ValueError("No prompts to run.")
    if costs is None and config.cost_repeats == 0:
        modelled = [s.name for s in strategies if s.family in ("oracle", "lookup-oracle")]
        if modelled:
            raise ValueError(f"{modelled} are modelled from measured costs: give cost_repeats >= 1 (got 0).")
    elif costs is None:
        from ..loops.probes import measure_costs

        max_gamma = max([s.gamma or 0 for s in strategies] + [16])
        costs = measure_costs(target, draft, context=min(128, config.prompt_tokens), max_k=max_gamma,
                              repeats=config.cost_repeats, progress=progress)
    attached = {slot: getattr(ModelState(draft), slot) for slot in ATTACHED_SLOTS} if draft is not None else {}
    harness = _Harness(target, draft, preverifiers, ForwardCounter(target, draft), PoolIsolation(target, draft))
    try:
        if config.warmup:
            first = next(iter(p for ps in prompts.values() for p in ps))
            for temperature in config.temperatures:
                for strategy in running:
                    harness.call(strategy, first, temperature, min(config.warmup_tokens, config.max_new_tokens),
                                 config.seed)
        calls = _timed_calls(harness, prompts, config, running, call_hook, progress)
    finally:
        harness.counter.close()
        if draft is not None:  # the draft leaves with the pre-verifiers it came with, if any
            detach(draft, ATTACHED_SLOTS)
            reattach(draft, attached)
    records = aggregate(calls, strategies, costs, config)
    return BenchResult(records=records, meta=_meta(config, threads, strategies, preverifier, costs, prompts),
                       calls=calls)


def _timed_calls(harness: _Harness, prompts: dict[str, list[Prompt]], config: BenchConfig, running: list[Strategy],
                 call_hook: Callable[[Strategy, CallResult], None] | None, progress: bool) -> list[dict]:
    """The timed calls, `config.runs` times over every prompt and temperature, strategies rotated per prompt."""
    calls: list[dict] = []
    total = config.runs * sum(len(p) for p in prompts.values()) * len(config.temperatures) * len(running)
    bar = tqdm(total=total, desc="bench", disable=not progress, unit="call")
    for run in range(config.runs):
        harness.pools.new_run()
        for category, category_prompts in prompts.items():
            for index, prompt in enumerate(category_prompts):
                for temperature in config.temperatures:
                    seed = config.seed * 1_000_003 + run * 1009 + index
                    shift = (run + index) % len(running)  # rotate so no strategy always runs first
                    outputs: dict[str, list[int]] = {}
                    unit: list[dict] = []
                    for strategy in running[shift:] + running[:shift]:
                        result = harness.call(strategy, prompt, temperature, config.max_new_tokens, seed)
                        if call_hook is not None:
                            call_hook(strategy, result)
                        outputs[strategy.name] = result.output
                        unit.append({"strategy": strategy.name, "category": category,
                                     "temperature": temperature, "run": run, "prompt": prompt.id,
                                     **{k: v for k, v in asdict(result).items() if k != "output"}})
                        bar.update()
                    if temperature == 0:
                        _check_identical(outputs, category, prompt, run, len(prompt.ids))
                    for call in unit:
                        call["identical"] = True if temperature == 0 else None
                    calls += unit
    bar.close()
    return calls


def _meta(config: BenchConfig, threads: int, strategies: list[Strategy], preverifier: PacerPreVerifier | None,
          costs: CostModel | None, prompts: dict[str, list[Prompt]]) -> dict:
    """results.json's `meta`: the machine, the configuration, the strategies, the costs and the prompts."""
    return {"bench_schema": SCHEMA, "machine": machine_info(threads), "config": asdict(config),
            "strategies": [s.name for s in strategies],
            "sklearn_retuning": {s.name: sklearn_retuning(s) for s in strategies if s.family == "hf"},
            "trim_failed_block": bool(preverifier is not None and preverifier.config.trim_failed_block),
            "ouroboros_pools": "one per strategy, emptied at the start of every run",
            "costs": asdict(costs) if costs is not None else None,
            "prompts": {c: [p.id for p in ps] for c, ps in prompts.items()},
            "prompt_lengths": {c: [len(p.ids) for p in ps] for c, ps in prompts.items()}}


def _check_identical(outputs: dict[str, list[int]], category: str, prompt: Prompt, run: int, prompt_len: int) -> None:
    reference = outputs["ar"]
    for name, output in outputs.items():
        if output != reference:
            at = _first_difference(output, reference)
            raise BenchmarkMismatch(
                f"Greedy output of {name!r} differs from 'ar' on {category}/{prompt.id} (run {run}) at new token "
                f"{at - prompt_len}: {output[at:at + 5]} vs {reference[at:at + 5]}. Speculative decoding must be "
                "lossless; if this is a float near-tie, rerun with --dtype float64 to confirm, else report a bug."
            )


def median_spread(values: list[float]) -> tuple[float, float, float]:
    """(median, min, max): the spread reported next to every median."""
    if not values:
        return (float("nan"),) * 3
    return statistics.median(values), min(values), max(values)


def histogram(lengths: list[int]) -> dict[str, int]:
    return {str(k): v for k, v in sorted(Counter(lengths).items())}
