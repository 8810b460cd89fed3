"""Measuring what work costs where the call runs: the one timing loop behind every cost in pacer_hf.

`timed(call, device)` times one call (CUDA synchronized around it); `timer(step, ...)` makes a repeatable one of
it (a KV cache cropped back after each call), and every measurement is built from them: the benchmark's and
validation's timed `generate` calls, `cached_forward_timer` (a cached forward over `width` new tokens), the probe of
every verify width (`time_forwards`), PEARL's γ (`fastest`), calibration's and the recipes' interleaved medians
(`interleaved`), and the loop's own pieces (`loops/probes.py`: the draft step, the pre-verifier's work per token).
`model_key`/`processor_name` say where a measurement was taken: the key of every cached probe.
"""

from __future__ import annotations

import hashlib
import json
import platform
import statistics
import time
import weakref
from collections.abc import Callable
from typing import TypeVar

import torch
from tqdm.auto import tqdm
from transformers import PreTrainedModel

from .._hf_compat import CACHE_KWARG, crop_cache, new_cache
from .blas import cpu_vendor, cpuinfo, mkl_code_path

T = TypeVar("T")


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (CUDA runs asynchronously: a clock read right after a call that ends
    without a host read would stop before the work does); nothing to wait for on a CPU. For timing a whole
    call; `timed` does this itself."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def timed(call: Callable[[], T], device: torch.device | str | None = None) -> tuple[float, T]:
    """(seconds, result) of one `call()`. On CUDA (a CUDA `device`) the device is synchronized before and after:
    kernels launch asynchronously, so without it the time is that of launching them. Every timing in pacer_hf
    (probes, calibration, benchmarks) goes through here."""
    cuda = device is not None and torch.device(device).type == "cuda"
    if cuda:
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    result = call()
    if cuda:
        torch.cuda.synchronize(device)
    return time.perf_counter() - start, result


def timer(step: Callable[[], object], cache=None, context: int = 0,
          device: torch.device | None = None) -> Callable[[], float]:
    """A callable returning the seconds of one `step()` (`timed`, without gradients), with `cache` (if any) cropped
    back to `context` after each call, so repeated calls time the same work and can be interleaved across models."""

    @torch.no_grad()
    def once() -> float:
        elapsed, _ = timed(step, device)
        if cache is not None:
            crop_cache(cache, context)
        return elapsed

    return once


@torch.no_grad()
def cached_forward_timer(
    model: PreTrainedModel, width: int, context: int = 32, logits_to_keep: int | None = None
) -> Callable[[], float]:
    """A `timer` of one forward of `width` new tokens after a cached `context`-token prefix (batch 1)."""
    forward, cache = _cached_forward(model, width, context, logits_to_keep)
    return timer(lambda: forward(width), cache, context, model.device)


def _cached_forward(model: PreTrainedModel, widths: int, context: int, logits_to_keep: int | None = None):
    """(forward(width), cache): a cache holding a random `context`-token prefix and a forward of the first `width`
    of `widths` random tokens after it."""
    vocab = model.get_output_embeddings().out_features
    generator = torch.Generator().manual_seed(0)
    prefix = torch.randint(0, vocab, (1, context), generator=generator).to(model.device)
    tokens = torch.randint(0, vocab, (1, widths), generator=generator).to(model.device)
    extra = {"logits_to_keep": logits_to_keep} if logits_to_keep else {}
    cache = new_cache(model.config)  # recording: a windowed layer rolls back past its window too
    model(input_ids=prefix, use_cache=True, **{CACHE_KWARG: cache})
    return lambda width: model(input_ids=tokens[:, :width], use_cache=True, **{CACHE_KWARG: cache}, **extra), cache


def fastest(once: Callable[[], float], repeats: int, warmup: int = 1) -> float:
    """The fastest of `repeats` timed calls after `warmup` untimed ones: on a shared machine other jobs only
    ever add time."""
    for _ in range(warmup):
        once()
    return min(once() for _ in range(repeats))


def interleaved(runs: dict[str, Callable[[], float]], repeats: int, warmup: int = 1, reduce=statistics.median,
                progress: bool = False) -> dict[str, float]:
    """`reduce` (median) of `repeats` timings of every callable in `runs`, the callables interleaved within each
    repeat (so a slow spell of the machine hits all of them), after `warmup` untimed passes."""
    for _ in range(warmup):
        for once in runs.values():
            once()
    samples: dict[str, list[float]] = {name: [] for name in runs}
    for _ in tqdm(range(repeats), desc="timing", disable=not progress):
        for name, once in runs.items():
            samples[name].append(once())
    return {name: reduce(values) for name, values in samples.items()}


PROBE_BUDGET_S = 2.5  # the forward probe starts no pass that would end past this (at least one pass runs)
PROBE_PASSES = 5
PROBE_CONTEXT = 64


@torch.no_grad()
def time_forwards(model: PreTrainedModel, widths: int, context: int = PROBE_CONTEXT,
                  budget_s: float = PROBE_BUDGET_S) -> list[float]:
    """Seconds of one cached forward over w = 1..widths new tokens after a `context`-token prefix: every width
    once per pass, as many passes as fit in `budget_s` (at least one, at most PROBE_PASSES), minimum per width."""
    forward, cache = _cached_forward(model, widths, context)
    timers = [timer(lambda w=width: forward(w), cache, context, model.device) for width in range(1, widths + 1)]
    best = [float("inf")] * widths
    start = time.perf_counter()
    timers[0]()  # warm-up
    last_pass = 0.0
    for passes in range(PROBE_PASSES):
        if passes and time.perf_counter() - start + last_pass > budget_s:  # another pass would overrun the budget
            break
        began = time.perf_counter()
        for width, once in enumerate(timers):
            best[width] = min(best[width], once())
        last_pass = time.perf_counter() - began
    return best


def model_key(model) -> str:
    """What a probe of `model` depends on: its class, configuration, size, dtype, device, thread count,
    processor and the torch version."""
    config = model.config.to_dict()
    config.pop("_name_or_path", None)
    config.pop("transformers_version", None)
    text = json.dumps([type(model).__name__, config, _size(model), str(model.dtype), str(model.device),
                       torch.get_num_threads(), processor_name(), torch.__version__], sort_keys=True, default=str)
    return hashlib.sha1(text.encode()).hexdigest()[:16]


_SIZES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _size(model) -> int:
    """`model.num_parameters()`, counted once per model object: walking the modules costs a few tenths of a
    millisecond, paid by every call that looks its costs up (a short call's setup)."""
    size = _SIZES.get(model)
    if size is None:
        size = _SIZES[model] = model.num_parameters()
    return size


def processor_name() -> str:
    """The GPU's name when CUDA is in use, else the CPU's (`cpu_name`), marked when MKL runs its Intel kernels on
    another vendor's CPU (`blas`): the same CPU has another cost curve then."""
    if torch.cuda.is_available():
        return torch.cuda.get_device_name()
    if cpu_vendor() not in ("", "GenuineIntel") and mkl_code_path() == "intel":
        return f"{cpu_name()} (MKL Intel path)"
    return cpu_name()


def cpu_name() -> str:
    """The CPU's model name (Linux /proc/cpuinfo, else what `platform` knows)."""
    return cpuinfo().get("model name") or platform.processor() or platform.machine()
