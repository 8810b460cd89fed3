"""`pacer_hf.enable(model)`: the `pacer=` argument of `generate`, bound on one model instance.

`enable` binds two methods on the instance only (no global patching): `generate`, which resolves
and validates `pacer=` before any work and records stats, and `_get_candidate_generator`, which
hands the verification loop our candidate generator for that call. The loop is pacer_hf's lean one
(`lean_loop.py`, passed to transformers' `generate` as `custom_generate`) unless
`pacer_loop="transformers"` asks for transformers' own `_assisted_decoding`.
"""

from __future__ import annotations

import functools
import re
import time
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import PreTrainedModel

from . import _hf_compat
from .candidate_generator import PacerCandidateGenerator, PacerStoppingCriteria
from .lean_draft import DRAFT_FORWARDS
from .lean_loop import lean_assisted_decoding
from .modeling_pacer import PacerPreVerifier, draft_signature
from .stats import PacerStats

PacerArg = bool | str | PacerPreVerifier | None
_FIXED = re.compile(r"sd-fixed-(\d+)")
_MISSING = object()
# pacer_loop=: pacer_hf's lean verification loop (lean_loop.py), or transformers' _assisted_decoding.
LOOPS = ("lean", "transformers")


@dataclass
class StrategyCall:
    """One `generate` call's strategy: builds the candidate generator, owns per-call state."""

    name: str
    make: Callable[..., _hf_compat.CandidateGenerator]
    stats: PacerStats
    closers: list[Callable[[], None]] = field(default_factory=list)
    draft_forward: str = "auto"

    def close(self) -> None:
        for close in self.closers:
            close()
        self.closers.clear()


# name -> builder(model, draft, generate kwargs) -> StrategyCall. Strategies other than Pacer
# (PEARL, Ouroboros) register here; the PEFT-style registry keeps `pacer=` open to them. The kwargs
# dict is the one passed on to transformers' generate, so a builder pops its own options from it
# (e.g. `ouroboros=OuroborosConfig(...)`) and transformers never sees them.
STRATEGIES: dict[str, Callable[..., StrategyCall]] = {}


def enable(model: PreTrainedModel) -> PreTrainedModel:
    """Make `model.generate` accept `pacer=` (on this instance only). Returns the model."""
    _hf_compat.check_supported()
    if getattr(model, "_pacer_plain_generate", None) is not None:
        return model
    model._pacer_added_config_entry = not hasattr(model.generation_config, "pacer")
    if model._pacer_added_config_entry:
        model.generation_config.pacer = None  # a config entry makes `pacer` a legal, saveable generate kwarg
    model._pacer_plain_generate = model.generate
    model.generate = types.MethodType(_generate, model)
    model._get_candidate_generator = types.MethodType(_get_candidate_generator, model)
    model._pacer_call = None
    model._pacer_last_stats = None
    model._pacer_loaded = {}
    return model


def disable(model: PreTrainedModel) -> PreTrainedModel:
    """Undo `enable`: the instance goes back to plain transformers behaviour."""
    if getattr(model, "_pacer_plain_generate", None) is None:
        return model
    if model._pacer_added_config_entry and getattr(model.generation_config, "pacer", None) is None:
        del model.generation_config.pacer
    for name in ("generate", "_get_candidate_generator", "_pacer_plain_generate", "_pacer_call", "_pacer_loaded",
                 "_pacer_added_config_entry"):
        model.__dict__.pop(name, None)
    return model


def attach(draft_model: PreTrainedModel, preverifier: PacerPreVerifier) -> PreTrainedModel:
    """Attach `preverifier` to `draft_model`, so `generate(assistant_model=draft, pacer=True)` uses it."""
    if not isinstance(preverifier, PacerPreVerifier):
        raise TypeError(f"preverifier must be a PacerPreVerifier, got {type(preverifier).__name__}.")
    _check_preverifier(preverifier, draft_model)
    draft_model._pacer_preverifier = preverifier
    return draft_model


def last_stats(model: PreTrainedModel) -> PacerStats | None:
    """Stats of the last `generate` call on `model` that ran a pacer_hf strategy (None otherwise)."""
    return getattr(model, "_pacer_last_stats", None)


def _generate(self: PreTrainedModel, *args, **kwargs):
    pacer = kwargs.pop("pacer", _MISSING)
    loop = kwargs.pop("pacer_loop", "lean")
    if loop not in LOOPS:
        raise ValueError(f"pacer_loop={loop!r}: choose one of {LOOPS} (default 'lean').")
    draft_forward = kwargs.pop("pacer_draft_forward", "auto")
    if draft_forward not in DRAFT_FORWARDS:
        raise ValueError(f"pacer_draft_forward={draft_forward!r}: choose one of {DRAFT_FORWARDS} (default 'auto').")
    if pacer is _MISSING:
        pacer = getattr(kwargs.get("generation_config") or self.generation_config, "pacer", None)
    if pacer is None or pacer is False:
        return self._pacer_plain_generate(*args, **kwargs)
    if kwargs.get("custom_generate") is not None:
        raise ValueError(
            "pacer= runs its own decoding loop and cannot be combined with custom_generate=; pass one of them "
            "(pacer=None for your custom_generate)."
        )
    if loop == "lean" and kwargs.get("synced_gpus"):
        raise ValueError(
            "pacer_hf's lean verification loop does not support synced_gpus; pass pacer_loop='transformers'."
        )
    call = _resolve(self, pacer, args, kwargs)
    call.stats.loop = loop
    call.draft_forward = draft_forward
    if loop == "lean":  # transformers gives a custom_generate callable neither the draft nor the streamer
        kwargs["custom_generate"] = functools.partial(
            lean_assisted_decoding, assistant_model=kwargs["assistant_model"], streamer=kwargs.get("streamer")
        )
    self._pacer_call = call
    start = time.perf_counter()
    try:
        output = self._pacer_plain_generate(*args, **kwargs)
    finally:
        self._pacer_call = None
        call.close()
    stats = call.stats
    stats.seconds = time.perf_counter() - start
    sequences = output if isinstance(output, torch.Tensor) else output.sequences
    stats.new_tokens = sequences.shape[1] - _prompt_length(self, args, kwargs)
    self._pacer_last_stats = stats
    return output


def _get_candidate_generator(self, generation_config, input_ids, inputs_tensor, logits_processor, model_kwargs,
                             assistant_model=None, target_tokenizer=None, assistant_tokenizer=None):
    call = self._pacer_call
    if call is None:
        return _hf_compat.default_candidate_generator(
            self, generation_config, input_ids, inputs_tensor, logits_processor, model_kwargs,
            assistant_model, target_tokenizer, assistant_tokenizer,
        )
    return call.make(
        input_ids=input_ids, assistant_model=assistant_model, generation_config=generation_config,
        model_kwargs=model_kwargs, inputs_tensor=inputs_tensor, logits_processor=logits_processor,
        draft_forward=call.draft_forward,
    )


def _resolve(model: PreTrainedModel, pacer: PacerArg, args: tuple, kwargs: dict) -> StrategyCall:
    """Turn the `pacer=` value into a StrategyCall, raising every argument error before any work."""
    draft = kwargs.get("assistant_model")
    if draft is None:
        raise ValueError(
            f"pacer={pacer!r} needs a draft model: pass assistant_model=<draft> to generate "
            "(or pacer=None for plain decoding)."
        )
    if kwargs.get("tokenizer") is not None or kwargs.get("assistant_tokenizer") is not None:
        raise ValueError(
            "pacer= does not support drafts with a different tokenizer (tokenizer=/assistant_tokenizer=); "
            "use a draft that shares the target's vocabulary."
        )
    _check_pair(model, draft)
    _check_inputs(args, kwargs)
    if isinstance(pacer, str) and (match := _FIXED.fullmatch(pacer)):
        return _pacer_call(f"sd-fixed-{match.group(1)}", int(match.group(1)), None)
    if isinstance(pacer, str) and pacer in STRATEGIES:
        return STRATEGIES[pacer](model, draft, kwargs)
    preverifier = _resolve_preverifier(model, pacer, draft)
    _check_preverifier(preverifier, draft)
    do_sample = _generation_value(model, kwargs, "do_sample")
    if preverifier.config.trim_failed_block and do_sample:
        raise ValueError(
            "The pre-verifier has trim_failed_block=True, which is exact only for greedy decoding; "
            "set do_sample=False or use a pre-verifier config with trim_failed_block=False."
        )
    return _pacer_call("pacer", preverifier.config.max_draft_tokens, preverifier)


def _pacer_call(name: str, max_draft_tokens: int, preverifier: PacerPreVerifier | None) -> StrategyCall:
    if max_draft_tokens < 1:
        raise ValueError(f"pacer={name!r}: the draft length must be >= 1.")
    stats = PacerStats(strategy=name)
    stop = PacerStoppingCriteria(preverifier.eval(), stats) if preverifier is not None else None

    def make(**generator_kwargs) -> PacerCandidateGenerator:
        return PacerCandidateGenerator(
            **generator_kwargs, max_draft_tokens=max_draft_tokens, stats=stats, stopping_criteria=stop
        )

    return StrategyCall(name=name, make=make, stats=stats)


def _resolve_preverifier(model: PreTrainedModel, pacer: PacerArg, draft: PreTrainedModel) -> PacerPreVerifier:
    if isinstance(pacer, PacerPreVerifier):
        return pacer
    if getattr(getattr(pacer, "config", None), "model_type", None) == "pacer_preverifier":
        return PacerPreVerifier.from_other_copy(pacer)  # e.g. from AutoModel(..., trust_remote_code=True)
    if pacer is True:
        attached = getattr(draft, "_pacer_preverifier", None)
        if attached is None:
            raise ValueError(
                "pacer=True uses the pre-verifier attached to the draft, and this draft has none: call "
                "pacer_hf.attach(draft, preverifier) first, or pass pacer=<PacerPreVerifier, path or Hub id>."
            )
        return attached
    if isinstance(pacer, (str, Path)):
        key = str(pacer)
        if key not in model._pacer_loaded:
            model._pacer_loaded[key] = load_preverifier(key).to(draft.device)
        return model._pacer_loaded[key]
    raise TypeError(
        f"pacer= accepts True, False/None, a PacerPreVerifier, a path or Hub id, 'sd-fixed-<n>' or one of "
        f"{sorted(STRATEGIES)}; got {type(pacer).__name__}."
    )


def load_preverifier(name_or_path: str, **kwargs) -> PacerPreVerifier:
    """`PacerPreVerifier.from_pretrained` with a clear error when the place holds no pre-verifier."""
    local = Path(name_or_path)
    if local.is_dir() and not (local / "config.json").is_file():
        raise ValueError(f"pacer={name_or_path!r}: the folder holds no pre-verifier (no config.json).")
    if local.is_dir():
        import json

        model_type = json.loads((local / "config.json").read_text()).get("model_type")
        if model_type != "pacer_preverifier":
            raise ValueError(
                f"pacer={name_or_path!r}: config.json has model_type={model_type!r}, not 'pacer_preverifier'; "
                "point pacer= at a folder written by PacerPreVerifier.save_pretrained."
            )
    return PacerPreVerifier.from_pretrained(name_or_path, **kwargs)


def _check_preverifier(preverifier: PacerPreVerifier, draft: PreTrainedModel) -> None:
    config = preverifier.config
    lm_head = draft.get_output_embeddings()
    hidden = int(lm_head.weight.shape[1]) if lm_head is not None else None
    if hidden != config.draft_hidden_size:
        raise ValueError(
            f"The pre-verifier expects draft hidden size {config.draft_hidden_size}, the draft has {hidden}: it was "
            f"built for another draft ({config.draft_model or 'unnamed'}). Use a pre-verifier trained for this "
            "draft, or PacerPreVerifier.from_draft(draft) and train it."
        )
    recorded, actual = config.draft_signature, draft_signature(draft.config)
    if recorded and any(recorded.get(k) not in (None, v) for k, v in actual.items()):
        raise ValueError(
            f"The pre-verifier was trained for draft {config.draft_model or ''} {recorded}, but the draft is "
            f"{actual}. Use a pre-verifier trained for this draft."
        )


def check_vocabularies(target: PreTrainedModel, draft: PreTrainedModel, fix: str) -> None:
    """Refuse a draft whose output rows differ from the target's: token ids must mean the same thing."""
    target_rows = target.get_output_embeddings().weight.shape[0]
    draft_head = draft.get_output_embeddings()
    draft_rows = None if draft_head is None else draft_head.weight.shape[0]
    if draft_rows != target_rows:
        raise ValueError(
            f"Draft and target vocabularies differ (draft lm_head has {draft_rows} rows, target {target_rows}): {fix}"
        )


def _check_pair(model: PreTrainedModel, draft: PreTrainedModel) -> None:
    check_vocabularies(model, draft, "assistant_model must share the target's tokenizer and vocabulary for pacer=.")
    if model.config.is_encoder_decoder or draft.config.is_encoder_decoder:
        raise ValueError("pacer= supports decoder-only models; use plain assisted generation for encoder-decoders.")


def _check_inputs(args: tuple, kwargs: dict) -> None:
    input_ids = args[0] if args else kwargs.get("input_ids", kwargs.get("inputs"))
    if input_ids is not None and input_ids.shape[0] > 1:
        raise ValueError(
            f"pacer= supports batch size 1 (transformers' assisted generation does too); got input_ids with batch "
            f"size {input_ids.shape[0]}. Call generate once per prompt."
        )
    mask = kwargs.get("attention_mask")
    if mask is not None and not bool(mask.all()):
        raise ValueError("pacer= does not support padded prompts (attention_mask has zeros); pass the prompt unpadded.")


def _generation_value(model: PreTrainedModel, kwargs: dict, name: str):
    if name in kwargs:
        return kwargs[name]
    return getattr(kwargs.get("generation_config") or model.generation_config, name, None)


def _prompt_length(model: PreTrainedModel, args: tuple, kwargs: dict) -> int:
    inputs = args[0] if args else kwargs.get("input_ids", kwargs.get("inputs"))
    return 0 if inputs is None else inputs.shape[1]
