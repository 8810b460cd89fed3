"""Everything pacer_hf keeps on a model instance, in one documented place.

pacer_hf never patches a class: what it needs on a model lives in plain instance attributes named `_pacer_<field>`
(set with `object.__setattr__`, so a module is never registered as a submodule: the model's `state_dict`,
parameters and `save_pretrained` stay its own). `ModelState(model)` is the one way to read and write them.

Set by `enable` and removed by `disable` (`ModelState.ENABLE`; `disable` also removes the bound methods):
    plain_generate        the instance's `generate` before `enable`; set means the model is enabled
    added_config_entry    `enable` added `pacer` to generation_config (`disable` removes it again while it is None)
    transformers_call     the StrategyCall of a running pacer_loop="transformers" call; None between calls
    loaded                pre-verifiers and lookup gates that `pacer=<folder or Hub id>` loaded, by name
Kept across `enable`/`disable`:
    last_stats            PacerStats of the last call that ran a pacer_hf strategy (`last_stats`)
    preverifier           the greedy pre-verifier `attach` hung on a draft
    preverifier_sampling  the sampling pre-verifier `attach` hung on a draft
    lookup_gate           the lookup gate `attach` hung on a target
    lookup_calibration    lookup gates' online recalibration to this target's acceptances (a WeakKeyDictionary:
                          gate -> {False: greedy, True: sampling} -> OnlineCalibration; loops/online_calibration.py)
    decode_step           the draft's compiled decode step (`compile_draft`)
    phrase_pools          Ouroboros' phrase pools on a target, one per draft (a WeakKeyDictionary)
    recent_acceptance     the stop rule's recent acceptance on a target, per draft and decoding mode (a
                          WeakKeyDictionary: draft -> {do_sample: RecentAcceptance}; loops/recent_acceptance.py)
    hub_loaded            what the Hub entry point loaded by id, kept between its calls
"""

from __future__ import annotations

from typing import Any

from ._hf_compat import CANDIDATE_HOOK

ENABLE = ("plain_generate", "transformers_call", "loaded", "added_config_entry")
FIELDS = (*ENABLE, "last_stats", "preverifier", "preverifier_sampling", "lookup_gate", "lookup_calibration",
          "decode_step", "phrase_pools", "recent_acceptance", "hub_loaded")


def attribute(field: str) -> str:
    """The instance attribute that holds `field`."""
    if field not in FIELDS:
        raise AttributeError(f"pacer_hf keeps no {field!r} on a model; fields: {FIELDS}")
    return f"_pacer_{field}"


class ModelState:
    """A view over one model's `_pacer_*` attributes: `ModelState(model).lookup_gate`, None when unset."""

    ENABLE = ENABLE
    FIELDS = FIELDS
    # what `disable` removes from the instance (the Hub bundle saves and restores these around its call)
    ATTRIBUTES = ("generate", CANDIDATE_HOOK, *(attribute(name) for name in ENABLE))

    def __init__(self, model: Any):
        object.__setattr__(self, "_model", model)

    def __getattr__(self, name: str):
        return self._model.__dict__.get(attribute(name))

    def __setattr__(self, name: str, value) -> None:
        object.__setattr__(self._model, attribute(name), value)

    def clear_enable(self) -> None:
        """Remove what `enable` set (the bound methods included); the other fields stay."""
        for name in self.ATTRIBUTES:
            self._model.__dict__.pop(name, None)
