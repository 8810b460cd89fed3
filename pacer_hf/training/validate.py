"""Stop rules measured in real `generate` calls: what the simulator predicts, checked on the clock.

`compare_in_generate` decodes every prompt with every setting, interleaved (machine load hits them alike),
checks each greedy output against plain decoding, and returns tokens/s and speed over the target alone.
`pacer-hf calibrate --validate-prompts` runs it for its choice next to fixed γ; so does
`examples/compare_stop_rules.py` for any pre-verifiers.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from functools import partial
from typing import Any

import torch
from transformers import PreTrainedModel

from ..costs import timed
from ..generation import EnabledState, disable, enable, last_stats
from ..loops.recent_acceptance import SeparateMemories


@torch.inference_mode()
def compare_in_generate(target: PreTrainedModel, draft: PreTrainedModel, prompts: list[list[int]],
                        settings: dict[str, Any], runs: int = 2, max_new_tokens: int = 64, warmup: bool = False,
                        contexts: dict[str, Callable[[], AbstractContextManager]] | None = None,
                        setting_kwargs: dict[str, dict] | None = None, **generate_kwargs) -> dict[str, dict]:
    """`settings`: name -> `pacer=` value (None: the target alone, always run as "ar"; False: transformers' own
    assisted generation with `draft`, whose schedule `contexts[name]` sets). Greedy decoding.

    `warmup` runs every setting once on the first prompt first (untimed: the lean draft forward's one-time
    check); `contexts`: name -> a context manager factory each call of that setting runs in; `setting_kwargs`:
    name -> generate kwargs of that setting only (e.g. `pacer_costs`); `generate_kwargs` go to every call (e.g.
    `min_new_tokens`). Returns name -> {"tokens_per_s", "vs_ar", "mean_draft", "tau",
    "alpha"} over all prompts and runs (tau, alpha: means over calls; not recorded for pacer=False)."""
    enabled_here = EnabledState(target).plain_generate is None
    enable(target)
    settings = {"ar": None, **settings}
    memories = SeparateMemories(target, draft)  # each setting learns the pair on its own, as alone it would
    tokens, seconds = dict.fromkeys(settings, 0), dict.fromkeys(settings, 0.0)
    recorded: dict[str, list[tuple[float, float, float]]] = {name: [] for name in settings}  # draft, tau, alpha
    try:
        def call(name: str, pacer, inputs: torch.Tensor, max_new_tokens: int, **kwargs):
            with memories.of(name), (contexts or {}).get(name, nullcontext)():
                return timed(partial(target.generate, inputs, max_new_tokens=max_new_tokens, do_sample=False,
                                     assistant_model=draft if pacer is not None else None, pacer=pacer, **kwargs,
                                     **(setting_kwargs or {}).get(name, {})),
                             target.device)

        for name, pacer in settings.items() if warmup else ():
            call(name, pacer, torch.tensor([prompts[0]], device=target.device), 4)
        for _ in range(runs):
            for ids in prompts:
                inputs, expected = torch.tensor([ids], device=target.device), None
                for name, pacer in settings.items():
                    elapsed, out = call(name, pacer, inputs, max_new_tokens, **generate_kwargs)
                    seconds[name] += elapsed
                    tokens[name] += out.shape[1] - inputs.shape[1]
                    if pacer is False:  # transformers' own loop keeps no pacer_hf stats
                        recorded[name].append((float("nan"),) * 3)
                    else:
                        stats = last_stats(target) if pacer is not None else None
                        recorded[name].append((stats.mean_draft_len, stats.tau, stats.alpha) if stats else (0.0, 1.0, 0.0))
                    expected = out if expected is None else expected
                    if not torch.equal(out, expected):
                        raise AssertionError(f"pacer={name!r} changed a greedy output: a bug, please report it.")
    finally:
        if enabled_here:
            disable(target)
    speed = {name: tokens[name] / seconds[name] for name in settings}
    means = {name: [statistics.mean(column) for column in zip(*rows)] for name, rows in recorded.items()}
    return {name: {"tokens_per_s": speed[name], "vs_ar": speed[name] / speed["ar"], "mean_draft": means[name][0],
                   "tau": means[name][1], "alpha": means[name][2]} for name in settings}
