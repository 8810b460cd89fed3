"""What the CUDA tests share (tests/test_cuda*.py, marked `cuda`; they skip where torch sees no CUDA device).

The CPU suite's helpers build the models and prompts; these put them on the device and compare there. Every
strategy of the registry runs: greedy output must equal the target alone on the same device and dtype.
"""

from __future__ import annotations

import contextlib
import functools
import os

import pytest
import torch
from conftest import build_draft, build_model, make_lookup_gate, make_preverifier

import pacer_hf
from pacer_hf.attached import detach

# PACER_HF_TEST_DEVICE=cpu runs them on the CPU instead: a check of the tests themselves where no GPU is at hand
DEVICE = os.environ.get("PACER_HF_TEST_DEVICE", "cuda")
needs_cuda = [pytest.mark.cuda,
              pytest.mark.skipif(DEVICE == "cuda" and not torch.cuda.is_available(),
                                 reason="needs a CUDA device (torch.cuda.is_available())")]

# (strategy, generate kwargs): one of each strategy type, Pacer on each, both lookups
CASES = {
    "sd-fixed-3": {},
    "pacer": {},
    "ouroboros": {},
    "pacer+ouroboros": {},
    "pearl": {},
    "pacer+pearl": {},
    "lookup-4": {"prompt_lookup_num_tokens": 4},
    "pacer-lookup": {"prompt_lookup_num_tokens": 4},
}
REPEATS = [5, 17, 33, 60, 5, 17, 33, 60, 5, 17, 2, 71]  # lookup finds matches in it


def uses_preverifier(case: str) -> bool:
    return case.startswith("pacer") and case != "pacer-lookup"


@functools.cache
def config_pair(arch: str, kind: str, dtype: torch.dtype = torch.float64):
    """(enabled target, draft) built from configs (conftest.build_model), on the device in `dtype`; cached."""
    target = build_model(arch).to(dtype)
    draft = build_draft(target, kind).to(dtype)
    return pacer_hf.enable(target.to(DEVICE)), draft.to(DEVICE)


@contextlib.contextmanager
def ready(target, draft, case: str, preverifier_device: str = DEVICE, preverifier=None, **overrides):
    """Attach what `case` reads: a pre-verifier (untrained with blocks that pass and fail, unless one is given) on
    `preverifier_device`, a lookup gate for pacer-lookup; detach afterwards. Phrase pools start empty."""
    pacer_hf.reset_phrase_pool(target)
    if uses_preverifier(case):
        if preverifier is None:
            for key, value in {"block_size": 2, "threshold": 0.5, "max_draft_tokens": 6}.items():
                overrides.setdefault(key, value)
            preverifier = make_preverifier(draft, **overrides).to(draft.dtype)
        pacer_hf.attach(draft, preverifier.to(preverifier_device))
    if case == "pacer-lookup":
        pacer_hf.attach(target, make_lookup_gate(target).to(DEVICE))
    try:
        yield
    finally:
        detach(draft)
        detach(target)


def speculative(target, draft, case: str, ids: torch.Tensor, max_new_tokens: int, **kwargs) -> torch.Tensor:
    lookup = "prompt_lookup_num_tokens" in CASES[case]
    return target.generate(ids, max_new_tokens=max_new_tokens, pacer=case if case != "pacer-lookup" else True,
                           assistant_model=None if lookup else draft, **CASES[case], **kwargs)


def first_difference(a: torch.Tensor, b: torch.Tensor) -> int | None:
    """The first column where two (1, n) outputs differ; None when they are equal."""
    if torch.equal(a, b):
        return None
    n = min(a.shape[1], b.shape[1])
    unequal = (a[0, :n] != b[0, :n]).nonzero()
    return int(unequal[0, 0]) if len(unequal) else n


def assert_same_greedy(target, out: torch.Tensor, expected: torch.Tensor, near_tie: float, what: str) -> None:
    """Equal outputs, or (a real model in float32 or lower precision, where a k-token verify forward and a one-token
    step round differently) an xfail when the first difference is a near-tie of the target's own logits there:
    its top two logits, on the common prefix, closer than `near_tie`. Anything else fails."""
    at = first_difference(out, expected)
    if at is None:
        return
    with torch.no_grad():
        logits = target(expected[:, :at]).logits[0, -1].float()
    top = logits.topk(2).values
    margin = float(top[0] - top[1])
    if margin < near_tie:
        pytest.xfail(f"{what}: first difference at column {at} is a near-tie of the target (top-2 margin {margin:.2e})")
    raise AssertionError(f"{what}: differs from the target alone at column {at} (top-2 margin {margin:.3f}): "
                         f"{out[0, at:at + 5].tolist()} vs {expected[0, at:at + 5].tolist()}")
