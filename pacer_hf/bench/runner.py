"""The benchmark loop: strategies interleaved per prompt in one process, warm-up excluded, runs repeated.

Counting is done by the harness itself, the same way for every strategy: a forward pre-hook on the
target records each forward's input width and cache length (so the drafted and accepted tokens of
every round are known, also for transformers' own candidate generators), and a pre-hook on the
draft's `lm_head` counts draft forwards. pacer_hf strategies also report `PacerStats`, whose per-round
record is used for them (and their pre-verifier time), and whose draft-forward count is used when they ran
the lean draft forward, which bypasses the draft's modules.
"""

from __future__ import annotations

import copy
import os
import platform
import statistics
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import transformers
from tqdm.auto import tqdm
from transformers import PreTrainedModel

import pacer_hf

from .._hf_compat import CACHE_KWARG
from ..attached import ATTACHED_SLOTS
from ..costs import CostModel, synchronize
from ..data.prompts import CATEGORIES, Prompt
from ..modeling_pacer import PacerPreVerifier
from ..strategies import OuroborosConfig, strategy_config
from ..strategies.ouroboros.pool import POOLS_ATTRIBUTE
from .strategies import (
    BenchSuffixCaches,
    Strategy,
    call_context,
    default_strategy_names,
    resolve_strategies,
    sklearn_retuning,
)

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
    quick: bool = False
    cost_repeats: int = 15


@dataclass
class CallResult:
    """One `generate` call, as measured by the harness."""

    seconds: float
    new_tokens: int
    output: list[int]
    target_forwards: int
    draft_forwards: int
    draft_lengths: list[int]
    accepted: list[int]
    preverifier_seconds: float = 0.0
    costs: dict | None = None  # which round costs decided an expected-gain rule (`PacerStats.costs`)


@dataclass
class BenchResult:
    records: list[dict]
    meta: dict
    calls: list[dict]  # per (strategy, category, temperature, run, prompt) call, without outputs


def physical_cores() -> int:
    """Physical cores from /proc/cpuinfo ((physical id, core id) pairs); os.cpu_count() elsewhere."""
    try:
        pairs, current = set(), {}
        for line in open("/proc/cpuinfo"):
            key, _, value = line.partition(":")
            key = key.strip()
            if key in ("physical id", "core id"):
                current[key] = value.strip()
            elif not line.strip() and current:
                pairs.add((current.get("physical id"), current.get("core id")))
                current = {}
        if current:
            pairs.add((current.get("physical id"), current.get("core id")))
        if pairs and (None, None) not in pairs:
            return len(pairs)
    except OSError:
        pass
    return os.cpu_count() or 1


def machine_info(threads: int) -> dict:
    """CPU model, cores and library versions: stated next to every published number."""
    model = platform.processor() or platform.machine()
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    from transformers.utils import is_sklearn_available

    return {"cpu": model, "physical_cores": physical_cores(), "logical_cpus": os.cpu_count(),
            "torch_threads": threads, "torch": torch.__version__, "transformers": transformers.__version__,
            "python": platform.python_version(), "platform": platform.platform(),
            "scikit_learn": is_sklearn_available(), "pacer_hf": pacer_hf.__version__,
            "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}


class ForwardCounter:
    """Hooks that count target forwards (with their widths) and draft forwards, for one call at a time."""

    def __init__(self, target: PreTrainedModel, draft: PreTrainedModel | None):
        self.target_calls: list[tuple[int, int]] = []  # (cache length before, input width)
        self.draft_forwards = 0
        self.handles = [target.register_forward_pre_hook(self._target, with_kwargs=True)]
        head = draft.get_output_embeddings() if draft is not None else None
        if head is not None:
            self.handles.append(head.register_forward_pre_hook(self._draft))

    def reset(self) -> None:
        self.target_calls = []
        self.draft_forwards = 0

    def _target(self, module, args, kwargs) -> None:
        ids = kwargs.get("input_ids", args[0] if args else None)
        cache = kwargs.get(CACHE_KWARG)
        cached = int(cache.get_seq_length()) if cache is not None else 0
        self.target_calls.append((cached, int(ids.shape[1]) if ids is not None else 0))

    def _draft(self, module, args) -> None:
        self.draft_forwards += 1

    def rounds(self, prompt_len: int, final_len: int) -> tuple[list[int], list[int]]:
        """(drafted, accepted) per verification round, reconstructed from the target forwards.

        Round r starts with S_r accepted tokens (the prompt for r = 1, else cache length + 1) and feeds the
        target 1 + L_r tokens (prompt + L_1 for r = 1); it ends with S_{r+1} = S_r + accepted_r + 1.
        """
        starts, drafted = [], []
        for i, (cached, width) in enumerate(self.target_calls):
            start = prompt_len if i == 0 else cached + 1
            starts.append(start)
            drafted.append(width - prompt_len if i == 0 else width - 1)
        ends = starts[1:] + [final_len]
        accepted = [max(0, min(d, end - start - 1)) for start, end, d in zip(starts, ends, drafted)]
        return drafted, accepted

    def close(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles.clear()


class PoolIsolation:
    """One Ouroboros phrase pool per strategy, emptied at the start of every run.

    pacer_hf keeps one pool per (target, draft) across calls (warm start). Interleaved, `ouroboros` and
    `pacer+ouroboros` would read each other's phrases for the very prompt being decoded, and run 2 would
    replay run 1's outputs; so each strategy gets its own pool, warm across the prompts of one run only.
    """

    def __init__(self, target: PreTrainedModel, draft: PreTrainedModel):
        self.target, self.draft = target, draft
        self.saved: dict[str, Any] = {}
        self.caches = BenchSuffixCaches()  # the suffix caches too: each prompt once per run, earlier prompts only

    def new_run(self) -> None:
        self.saved.clear()
        self.caches.reset()

    @contextmanager
    def around(self, strategy: Strategy) -> Iterator[None]:
        config = strategy_config(strategy.name) if strategy.family == "registered" else None
        if not isinstance(config, OuroborosConfig):
            yield
            return
        pools = self.target.__dict__.get(POOLS_ATTRIBUTE)
        if pools is not None:
            pools.pop(self.draft, None)
            if strategy.name in self.saved:
                pools[self.draft] = self.saved[strategy.name]
        try:
            yield
        finally:
            pools = self.target.__dict__.get(POOLS_ATTRIBUTE)
            if pools is not None and self.draft in pools:
                self.saved[strategy.name] = pools.pop(self.draft)


def _pacer_argument(strategy: Strategy, preverifiers: dict[str, PacerPreVerifier], sampling: bool):
    if strategy.family == "sd-fixed":
        return strategy.name
    if strategy.family == "pacer":
        return preverifiers[strategy.name + ("@sampling" if sampling else "")]
    if strategy.family == "registered":
        return strategy.name
    if strategy.family == "default-gate":
        return pacer_hf.default_lookup_gate()
    if strategy.family == "suffix":
        return True
    return None


def run_call(strategy: Strategy, target: PreTrainedModel, draft: PreTrainedModel | None, prompt: Prompt,
             temperature: float, max_new_tokens: int, preverifiers: dict[str, PacerPreVerifier],
             counter: ForwardCounter, seed: int, suffix_cache=None) -> CallResult:
    """One timed `generate` call of `strategy` on `prompt` (batch 1); `suffix_cache` for family "suffix"."""
    ids = torch.tensor([prompt.ids], dtype=torch.long, device=target.device)
    kwargs: dict[str, Any] = {"attention_mask": torch.ones_like(ids), "max_new_tokens": max_new_tokens,
                              "do_sample": temperature > 0}
    if temperature > 0:
        kwargs.update(temperature=temperature, top_k=0, top_p=1.0)
    if strategy.uses_draft:
        kwargs["assistant_model"] = draft
    if strategy.lookup_tokens is not None:
        kwargs["prompt_lookup_num_tokens"] = strategy.lookup_tokens
    kwargs["pacer"] = _pacer_argument(strategy, preverifiers, temperature > 0)
    if suffix_cache is not None:
        kwargs["suffix_cache"] = suffix_cache
    if strategy.needs_preverifier and strategy.family == "registered":  # e.g. pacer+ouroboros: the attached one
        for slot in ATTACHED_SLOTS:
            draft.__dict__.pop(slot, None)
        pacer_hf.attach(draft, preverifiers["pacer@sampling" if temperature > 0 else "pacer"])
    counter.reset()
    if temperature > 0:
        torch.manual_seed(seed)
    with call_context(strategy, target, draft):  # no inference_mode: PEARL drafts in a thread (mode is per-thread)
        synchronize(target.device)
        start = time.perf_counter()
        out = target.generate(ids, **kwargs)
        synchronize(target.device)
        seconds = time.perf_counter() - start
    output = out[0].tolist()
    new_tokens = len(output) - ids.shape[1]
    stats = pacer_hf.last_stats(target) if kwargs["pacer"] is not None else None
    if stats is not None and stats.draft_lengths:
        lengths, accepted = list(stats.draft_lengths), list(stats.accepted)
    elif strategy.family != "ar":  # transformers' own loops: rounds from the target's forwards
        lengths, accepted = counter.rounds(ids.shape[1], len(output))
    else:
        lengths, accepted = [], []
    # the lean draft forward (lean_draft.py) never calls the draft's lm_head: the drafting loop counts it
    draft_forwards = stats.draft_forwards if stats is not None and stats.draft_forward == "lean" else counter.draft_forwards
    return CallResult(seconds=seconds, new_tokens=new_tokens, output=output,
                      target_forwards=len(counter.target_calls), draft_forwards=draft_forwards,
                      draft_lengths=lengths, accepted=accepted[: len(lengths)],
                      preverifier_seconds=stats.preverifier_seconds if stats is not None else 0.0,
                      costs=stats.costs if stats is not None else None)


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
    """`pacer` is the given pre-verifier; `pacer-b1` the same weights with a copied config, block_size=1.

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
    gate = target.__dict__.get("_pacer_lookup_gate")
    names = config.strategies or default_strategy_names(config.quick, preverifier is not None, draft is not None,
                                                        gate is not None)
    oracle_gamma = max(8, preverifier.config.max_draft_tokens if preverifier is not None else 0)
    strategies = resolve_strategies(names, preverifier is not None, oracle_gamma, has_draft=draft is not None)
    running = [s for s in strategies if s.runs]
    preverifiers = preverifier_variants(preverifier, sampling_preverifier)
    if not any(prompts.values()):
        raise ValueError("No prompts to run.")
    if costs is None:
        from ..loops.probes import measure_costs

        max_gamma = max([s.gamma or 0 for s in strategies] + [16])
        costs = measure_costs(target, draft, context=min(128, config.prompt_tokens), max_k=max_gamma,
                              repeats=config.cost_repeats, progress=progress)
    attached = {slot: draft.__dict__.get(slot) for slot in ATTACHED_SLOTS} if draft is not None else {}
    counter = ForwardCounter(target, draft)
    pools = PoolIsolation(target, draft)
    calls: list[dict] = []
    try:
        if config.warmup:
            first = next(iter(p for ps in prompts.values() for p in ps))
            for temperature in config.temperatures:
                for strategy in running:
                    with pools.around(strategy):
                        run_call(strategy, target, draft, first, temperature, min(16, config.max_new_tokens),
                                 preverifiers, counter, config.seed, pools.caches.get(strategy, temperature))
        total = config.runs * sum(len(p) for p in prompts.values()) * len(config.temperatures) * len(running)
        bar = tqdm(total=total, desc="bench", disable=not progress, unit="call")
        for run in range(config.runs):
            pools.new_run()
            for category, category_prompts in prompts.items():
                for index, prompt in enumerate(category_prompts):
                    for temperature in config.temperatures:
                        seed = config.seed * 1_000_003 + run * 1009 + index
                        shift = (run + index) % len(running)  # rotate so no strategy always runs first
                        outputs: dict[str, list[int]] = {}
                        unit: list[dict] = []
                        for strategy in running[shift:] + running[:shift]:
                            with pools.around(strategy):
                                result = run_call(strategy, target, draft, prompt, temperature,
                                                  config.max_new_tokens, preverifiers, counter, seed, pools.caches.get(strategy, temperature))
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
    finally:
        counter.close()
        if draft is not None:  # the draft leaves with the pre-verifiers it came with, if any
            for slot, module in attached.items():
                draft.__dict__.pop(slot, None)
                if module is not None:
                    draft.__dict__[slot] = module
    records = aggregate(calls, strategies, costs, config)
    meta = {"bench_schema": SCHEMA, "machine": machine_info(threads), "config": asdict(config),
            "strategies": [s.name for s in strategies],
            "sklearn_retuning": {s.name: sklearn_retuning(s) for s in strategies if s.family == "hf"},
            "trim_failed_block": bool(preverifier is not None and preverifier.config.trim_failed_block),
            "ouroboros_pools": "one per strategy, emptied at the start of every run",
            "costs": asdict(costs), "prompts": {c: [p.id for p in ps] for c, ps in prompts.items()},
            "prompt_lengths": {c: [len(p.ids) for p in ps] for c, ps in prompts.items()}}
    return BenchResult(records=records, meta=meta, calls=calls)


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
