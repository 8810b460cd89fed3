"""The path of one `generate(..., pacer=...)` call visits each pacer_hf module once on its way down.

Every call made inside pacer_hf during the call is recorded with the chain of pacer_hf modules on the stack (frames
of other packages, transformers' included, left out; consecutive frames of one module counted once). A chain that
leaves a module and comes back to it (generation -> strategies -> generation) is a layer calling up into one above
it, or two modules passing control back and forth: the layout this project keeps out (docs/ALGORITHM.md).
Generated code (a dataclass's `__init__`, compiled from a string) is a value being built, not a visit.
"""

from __future__ import annotations

import sys

import pytest
import torch
from conftest import build_draft, build_model, make_lookup_gate, make_preverifier

import pacer_hf


def module_chain(frame) -> list[str]:
    chain: list[str] = []
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if name.startswith("pacer_hf") and not frame.f_code.co_filename.startswith("<"):
            if not chain or chain[-1] != name:
                chain.append(name)
        frame = frame.f_back
    return chain[::-1]


def reentries(chains) -> list[tuple[str, ...]]:
    """The chains that come back to a module they left."""
    return sorted({tuple(chain) for chain in chains if len(chain) != len(set(chain))})


def record_chains(call) -> list[list[str]]:
    chains: list[list[str]] = []

    def profile(frame, event, arg):
        if event == "call" and frame.f_globals.get("__name__", "").startswith("pacer_hf"):
            chains.append(module_chain(frame))

    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    return chains


def test_reentries_finds_a_call_back_up():
    chains = [["pacer_hf.generation", "pacer_hf.strategies.registry"],
              ["pacer_hf.generation", "pacer_hf.strategies.registry", "pacer_hf.generation"]]
    assert reentries(chains) == [tuple(chains[1])]


CASES = {
    "pacer": {"pacer": "preverifier"},
    "pacer-transformers-loop": {"pacer": "preverifier", "pacer_loop": "transformers"},
    "pacer-sampling": {"pacer": "preverifier", "do_sample": True},
    "sd-fixed": {"pacer": "sd-fixed-3"},
    "lookup": {"pacer": True, "prompt_lookup_num_tokens": 3, "gate": True},
    "batch": {"pacer": "preverifier", "batch": True},
    "ouroboros": {"pacer": "ouroboros"},
    "pearl": {"pacer": "pearl"},
    "lookup-with-draft": {"pacer": pacer_hf.LookupConfig(draft_tokens=3), "prompt_lookup_num_tokens": 3, "gate": True,
                          "draft": True},
}


@pytest.mark.parametrize("case", list(CASES))
def test_one_call_visits_each_module_once_on_its_way_down(case):
    spec = dict(CASES[case])
    target = pacer_hf.enable(build_model("llama"))
    draft = build_draft(target, "noisy")
    kwargs = {"max_new_tokens": 10, "do_sample": spec.pop("do_sample", False)}
    gate, with_draft = spec.pop("gate", False), spec.pop("draft", False)
    if gate:
        pacer_hf.attach(target, make_lookup_gate(target))
    if with_draft or not gate:
        kwargs["assistant_model"] = draft
    if spec.get("pacer") == "preverifier":
        spec["pacer"] = make_preverifier(draft)
    prompt = torch.tensor([[5, 6, 7, 8, 5, 6, 7, 8, 5, 6]])
    if spec.pop("batch", False):
        prompt = torch.cat([prompt, prompt.flip(1)])
        kwargs["attention_mask"] = torch.ones_like(prompt)
    kwargs.update(spec)
    target.generate(prompt, **kwargs)  # warm-up: one-time checks and compilation stay out of the path
    chains = record_chains(lambda: target.generate(prompt, **kwargs))
    assert chains, "no pacer_hf code ran"
    assert reentries(chains) == []
