"""Stop rules measured in real `generate` calls: what the simulator predicts, checked on the clock.

`compare_in_generate` decodes every prompt with every setting, interleaved (machine load hits them alike),
checks each greedy output against plain decoding, and returns tokens/s and speed over the target alone.
`pacer-hf calibrate --validate-prompts` runs it for its choice next to fixed γ; so does
`examples/compare_stop_rules.py` for any pre-verifiers.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch
from transformers import PreTrainedModel

from ..generation import disable, enable, last_stats


@torch.inference_mode()
def compare_in_generate(target: PreTrainedModel, draft: PreTrainedModel, prompts: list[list[int]],
                        settings: dict[str, Any], runs: int = 2, max_new_tokens: int = 64) -> dict[str, dict]:
    """`settings`: name -> `pacer=` value (None: the target alone, always run as "ar"). Greedy decoding.

    Returns name -> {"tokens_per_s", "vs_ar", "mean_draft"} over all prompts and runs."""
    enabled_here = getattr(target, "_pacer_plain_generate", None) is None
    enable(target)
    settings = {"ar": None, **settings}
    tokens, seconds, drafted = dict.fromkeys(settings, 0), dict.fromkeys(settings, 0.0), {n: [] for n in settings}
    try:
        for _ in range(runs):
            for ids in prompts:
                inputs, expected = torch.tensor([ids], device=target.device), None
                for name, pacer in settings.items():
                    start = time.perf_counter()
                    out = target.generate(inputs, max_new_tokens=max_new_tokens, do_sample=False,
                                          assistant_model=draft if pacer is not None else None, pacer=pacer)
                    seconds[name] += time.perf_counter() - start
                    tokens[name] += out.shape[1] - inputs.shape[1]
                    drafted[name].append(last_stats(target).mean_draft_len if pacer is not None else 0.0)
                    expected = out if expected is None else expected
                    if not torch.equal(out, expected):
                        raise AssertionError(f"pacer={name!r} changed a greedy output: a bug, please report it.")
    finally:
        if enabled_here:
            disable(target)
    speed = {name: tokens[name] / seconds[name] for name in settings}
    return {name: {"tokens_per_s": speed[name], "vs_ar": speed[name] / speed["ar"],
                   "mean_draft": statistics.mean(drafted[name])} for name in settings}
