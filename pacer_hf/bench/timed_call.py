"""One timed `generate` call, measured by the harness (the benchmark loop in runner.py runs many).

A forward pre-hook on the target records each forward's input width and cache length, from which the drafted and
accepted tokens of every round are reconstructed (also for transformers' own candidate generators); a pre-hook on
the draft's `lm_head` counts draft forwards. pacer_hf strategies' own `PacerStats` are used where they report rounds.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from transformers import PreTrainedModel

import pacer_hf

from .._hf_compat import CACHE_KWARG
from ..attached import ATTACHED_SLOTS, detach
from ..costs import timed
from ..data.prompts import Prompt
from ..modeling_pacer import PacerPreVerifier
from .strategy_calls import Strategy, call_context


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
    online_calibration: dict | None = None  # the pre-verifier's map to the pair as the call ended (`PacerStats`)



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



def _pacer_argument(strategy: Strategy, preverifiers: dict[str, PacerPreVerifier], sampling: bool,
                    draft: PreTrainedModel | None):
    if strategy.family == "sd-fixed":
        return strategy.name
    if strategy.name == "pacer-default":  # what `pacer=True` gives a draft with no pre-verifier of its own
        return pacer_hf.default_preverifier(sampling, draft.device)
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
    kwargs["pacer"] = _pacer_argument(strategy, preverifiers, temperature > 0, draft)
    if suffix_cache is not None:
        kwargs["suffix_cache"] = suffix_cache
    if strategy.needs_preverifier and strategy.family == "registered":  # e.g. pacer+ouroboros: the attached one
        detach(draft, ATTACHED_SLOTS)
        pacer_hf.attach(draft, preverifiers["pacer@sampling" if temperature > 0 else "pacer"])
    counter.reset()
    if temperature > 0:
        torch.manual_seed(seed)
    with call_context(strategy, target, draft):  # no inference_mode: PEARL drafts in a thread (mode is per-thread)
        seconds, out = timed(partial(target.generate, ids, **kwargs), target.device)
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
                      costs=stats.costs if stats is not None else None,
                      online_calibration=stats.online_calibration if stats is not None else None)
