"""What `pacer_hf.attach` hangs on a model, and how `generate(pacer=True)` finds it again.

A draft holds one pre-verifier per decoding mode (`PacerConfig.decoding`): a pre-verifier calibrated on greedy
rounds predicts greedy agreement, which a sampled token rarely has though the target often accepts it, so
sampled calls want one trained on sampled rounds. A draft with none attached gets the default pre-verifier
shipped in the package (`default_preverifier`: it reads only what every draft gives, so it takes any draft). A
target holds one lookup gate; without it, lookup gated by Pacer uses the default gate shipped in the package.
"""

from __future__ import annotations

import functools

import torch
from transformers import PreTrainedModel

from ._paths import hub_cards_dir
from .model_state import ModelState, attribute
from .modeling_lookup_gate import PacerLookupGate
from .modeling_pacer import PacerPreVerifier

_GREEDY_SLOT, _SAMPLING_SLOT = "preverifier", "preverifier_sampling"  # ModelState fields
ATTACHED_SLOTS = (_GREEDY_SLOT, _SAMPLING_SLOT)
DEFAULT_LOOKUP_GATE = "default-lookup-gate"  # folder under hub_cards/ (pacer_hf/hub_cards/ in the wheel)
DEFAULT_PREVERIFIER = "default-preverifier"  # folder under hub_cards/; its sampling twin in its `sampling/`
DEFAULT_PREVERIFIER_SAMPLING = "sampling"
PREVERIFIER_SOURCES = ("passed", "attached", "default")  # PacerStats.preverifier: which one decided


def attach(model: PreTrainedModel, module: PacerPreVerifier | PacerLookupGate) -> PreTrainedModel:
    """Attach a pre-verifier to its draft (`generate(assistant_model=draft, pacer=True)` uses it) or a lookup
    gate to its target (`generate(prompt_lookup_num_tokens=N, pacer=True)` uses it). Returns `model`.

    A draft holds one pre-verifier per decoding mode: one trained for sampling (`config.decoding == "sampling"`)
    serves `do_sample=True` calls, any other serves greedy ones; each mode falls back on the other's."""
    # ModelState: a plain attribute, not a registered submodule (the model's state_dict, parameters and
    # save_pretrained stay its own)
    if isinstance(module, PacerPreVerifier):
        module.check_draft(model)
        sampling = getattr(module.config, "decoding", None) == "sampling"
        setattr(ModelState(model), _SAMPLING_SLOT if sampling else _GREEDY_SLOT, module)
    elif isinstance(module, PacerLookupGate):
        ModelState(model).lookup_gate = module
    else:
        raise TypeError(f"attach() takes a PacerPreVerifier or a PacerLookupGate, got {type(module).__name__}.")
    return model


def detach(model: PreTrainedModel, fields: tuple[str, ...] = (*ATTACHED_SLOTS, "lookup_gate")) -> dict:
    """Take what `attach` hung on `model` off it (the pre-verifiers and the lookup gate, or `fields`); returns it
    by field, for `reattach`."""
    return {field: model.__dict__.pop(attribute(field), None) for field in fields}


def reattach(model: PreTrainedModel, taken: dict) -> None:
    """Put back what `detach` took (None fields stay empty)."""
    for field, module in taken.items():
        if module is not None:
            setattr(ModelState(model), field, module)


@functools.cache
def default_lookup_gate() -> PacerLookupGate:
    """The lookup gate shipped inside pacer_hf (`hub_cards/default-lookup-gate`), trained on the answers of several
    targets with different tokenizers: `generate(prompt_lookup_num_tokens=N, pacer=True)` uses it on any causal LM
    without a gate of its own. Loaded once per process, on CPU (an MLP over at most N rows)."""
    folder = hub_cards_dir() / DEFAULT_LOOKUP_GATE
    if not (folder / "config.json").is_file():
        raise ValueError(f"pacer_hf's default lookup gate is not installed here ({folder} is missing): pass "
                         "pacer=<PacerLookupGate, folder or Hub id>, or pacer_hf.attach(target, gate).")
    return PacerLookupGate.from_pretrained(folder).eval()


@functools.cache
def _default_preverifier(sampling: bool, device: str) -> PacerPreVerifier:
    folder = hub_cards_dir() / DEFAULT_PREVERIFIER
    if sampling:
        folder = folder / DEFAULT_PREVERIFIER_SAMPLING
    if not (folder / "config.json").is_file():
        raise ValueError(f"pacer_hf's default pre-verifier is not installed here ({folder} is missing): pass "
                         "pacer=<PacerPreVerifier, folder or Hub id>, or pacer_hf.attach(draft, preverifier).")
    model = PacerPreVerifier.from_pretrained(folder).eval()
    config = model.config
    if config.input_mode != "features" or config.draft_signature:
        raise ValueError(f"{folder} is not a default pre-verifier: it must read the draft's distribution features "
                         f"only (input_mode={config.input_mode!r}) and name no draft (draft_signature="
                         f"{config.draft_signature!r}).")
    return model.to(device)


def default_preverifier(do_sample: bool = False, device: str | torch.device = "cpu") -> PacerPreVerifier:
    """The pre-verifier shipped inside pacer_hf (`hub_cards/default-preverifier`, its `sampling/` twin for
    `do_sample=True`), trained on rounds of several pairs: it reads the draft's distribution features and the
    loop's state only (no hidden states), so it serves any draft, and decides with the expected-gain rule under the
    round costs measured where the call runs. `generate(assistant_model=draft, pacer=True)` uses it for a draft
    with no pre-verifier attached. Loaded once per process and device; treat it as read-only."""
    return _default_preverifier(bool(do_sample), str(torch.device(device)))


def preverifier_for(draft: PreTrainedModel, passed: PacerPreVerifier | None,
                    do_sample: bool) -> tuple[PacerPreVerifier, str]:
    """The pre-verifier that decides a call's rounds and where it came from (one of `PREVERIFIER_SOURCES`): the
    one passed as `pacer=`, else the one attached to `draft` for this decoding mode (`attached_preverifier`), else
    the default one shipped in the package, on the draft's device."""
    if passed is not None:
        return passed, "passed"
    attached = attached_preverifier(draft, do_sample)
    if attached is not None:
        return attached, "attached"
    return default_preverifier(do_sample, draft.device), "default"


def attached_preverifier(draft: PreTrainedModel, do_sample: bool) -> PacerPreVerifier | None:
    """The pre-verifier attached to `draft` for this decoding mode, else the other mode's, else None."""
    slots = (_SAMPLING_SLOT, _GREEDY_SLOT) if do_sample else (_GREEDY_SLOT, _SAMPLING_SLOT)
    state = ModelState(draft)
    return next((getattr(state, slot) for slot in slots if getattr(state, slot) is not None), None)
