"""`pacer_hf.enable(model)`: the `pacer=` argument of `generate`, bound on one model instance.

`enable` binds `generate` on the instance only (no global patching). It resolves `pacer=` to a
registered strategy (`strategies/`), resolves and checks the pre-verifier once, raises every argument
error before any work (the checks live in `generate_checks.py`), and records stats. The strategy's
candidate generator goes to pacer_hf's lean verification loop (`lean_loop.py`, passed to transformers'
`generate` as `custom_generate`, with the generator factory bound in) or, with `pacer_loop="transformers"`,
to transformers' own `_assisted_decoding` through the `_get_candidate_generator` hook, also bound on the instance.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import time
import types
from pathlib import Path

import torch
from transformers import PretrainedConfig, PreTrainedModel

from ._hf_compat import bind_candidate_factory, check_supported, default_candidate_generator
from .attached import attached_preverifier, default_lookup_gate, preverifier_for
from .candidates.suffix import ScopedSuffixCache, as_scoped, refuse_cache
from .costs import check_cost_mode
from .generate_checks import (
    _batch_size,
    _check_batch,
    _check_inputs,
    _check_pair,
    _check_tokenizers,
    _check_transformers_loop,
    _check_trim,
    _generation_value,
    _input_ids,
    _prompt_length,
)
from .loops.batch_loop import BATCH_CACHES, BATCH_STOPS, batched_assisted_decoding
from .loops.draft_forwards import DRAFT_FORWARDS
from .loops.lean_loop import lean_assisted_decoding
from .loops.padded_heads import fit_generator
from .model_state import ModelState
from .modeling_lookup_gate import PacerLookupGate
from .modeling_pacer import PacerPreVerifier
from .stats import PacerStats
from .strategies import (
    DEFAULT_LOOKUP_TOKENS,
    LookupConfig,
    SpeculativeConfig,
    StrategyCall,
    StrategyConfig,
    StrategyContext,
    build_call,
    strategy_config,
    unknown_name_error,
)

PacerArg = bool | str | dict | StrategyConfig | PacerPreVerifier | PacerLookupGate | None
MODULE_TYPES = {"pacer_preverifier": PacerPreVerifier, "pacer_lookup_gate": PacerLookupGate}
_MISSING = object()
# pacer_loop=: pacer_hf's lean verification loop (lean_loop.py), or transformers' _assisted_decoding.
LOOPS = ("lean", "transformers")


class EnabledState(ModelState):
    """`ModelState` with what `enable` does to an instance: `install` sets its fields and binds `generate` and
    `_get_candidate_generator` over transformers' own, on the instance; `clear` (from `disable`) undoes that."""

    @classmethod
    def install(cls, model: PreTrainedModel) -> None:
        state = cls(model)
        state.added_config_entry = not hasattr(model.generation_config, "pacer")
        if state.added_config_entry:
            model.generation_config.pacer = None  # a config entry makes `pacer` a legal, saveable generate kwarg
        state.plain_generate = model.generate
        model.generate = types.MethodType(_generate, model)
        bind_candidate_factory(model, _get_candidate_generator)
        state.transformers_call = None
        state.last_stats = None
        state.loaded = {}

    @classmethod
    def clear(cls, model: PreTrainedModel) -> None:
        state = cls(model)
        if state.added_config_entry and getattr(model.generation_config, "pacer", None) is None:
            del model.generation_config.pacer
        state.clear_enable()


def enable(model: PreTrainedModel) -> PreTrainedModel:
    """Make `model.generate` accept `pacer=` (on this instance only). Returns the model."""
    check_supported()
    if EnabledState(model).plain_generate is not None:
        return model
    EnabledState.install(model)
    return model


def disable(model: PreTrainedModel) -> PreTrainedModel:
    """Undo `enable`: the instance goes back to plain transformers behaviour."""
    if EnabledState(model).plain_generate is None:
        return model
    EnabledState.clear(model)
    return model


def last_stats(model: PreTrainedModel) -> PacerStats | None:
    """Stats of the last `generate` call on `model` that ran a pacer_hf strategy (None otherwise)."""
    return EnabledState(model).last_stats


def _generate(self: PreTrainedModel, *args, **kwargs):
    pacer = kwargs.pop("pacer", _MISSING)
    loop = _option(kwargs, "pacer_loop", LOOPS)
    draft_forward = _option(kwargs, "pacer_draft_forward", DRAFT_FORWARDS)
    batch_cache = _option(kwargs, "pacer_batch_cache", BATCH_CACHES)
    batch_stop = _option(kwargs, "pacer_batch_stop", BATCH_STOPS)
    costs = check_cost_mode(kwargs.pop("pacer_costs", "measure"))
    suffix_cache = as_scoped(kwargs.pop("suffix_cache", None), kwargs.pop("suffix_scope", None))
    if pacer is _MISSING:
        pacer = getattr(kwargs.get("generation_config") or self.generation_config, "pacer", None)
    state = EnabledState(self)
    if pacer is None or pacer is False:
        refuse_cache(suffix_cache, f"pacer={pacer!r}")
        return state.plain_generate(*args, **kwargs)
    if kwargs.get("custom_generate") is not None:
        raise ValueError(
            "pacer= runs its own decoding loop and cannot be combined with custom_generate=; pass one of them "
            "(pacer=None for your custom_generate)."
        )
    if loop == "lean" and kwargs.get("synced_gpus"):
        raise ValueError(
            "pacer_hf's lean verification loop does not support synced_gpus; pass pacer_loop='transformers'."
        )
    if loop == "transformers":
        _check_transformers_loop(self, kwargs)
    call = _resolve(self, pacer, args, kwargs, draft_forward, costs, suffix_cache)
    call.stats.loop = loop
    size = _batch_size(args, kwargs)
    batched = size > 1
    if batched:
        try:
            _check_batch(self, call, loop, kwargs, _input_ids(args, kwargs))
            plan = dataclasses.replace(call.batch(batch_cache), stop_mode=batch_stop)
        except Exception:
            call.close()
            raise
        kwargs["custom_generate"] = functools.partial(batched_assisted_decoding, plan=plan)
    elif loop == "lean":  # transformers gives a custom_generate callable neither the draft nor the streamer
        kwargs["custom_generate"] = functools.partial(
            lean_assisted_decoding, assistant_model=kwargs.get("assistant_model"), streamer=kwargs.get("streamer"),
            candidate_generator=call.make,
        )
    else:  # transformers' _assisted_decoding asks the model for its candidate generator
        state.transformers_call = call
    start = time.perf_counter()
    try:
        output = state.plain_generate(*args, **kwargs)
    finally:
        state.transformers_call = None
        call.close()
    stats = call.stats
    stats.seconds = time.perf_counter() - start
    sequences = output if isinstance(output, torch.Tensor) else output.sequences
    if not batched:  # the batched loop counts each row's tokens, padding excluded
        stats.new_tokens = sequences.shape[1] - _prompt_length(self, args, kwargs)
        if suffix_cache is not None:  # later calls may copy from this prompt and its answer
            suffix_cache.add(sequences[0])
    state.last_stats = stats
    return output


def _option(kwargs: dict, name: str, choices: tuple[str, ...]) -> str:
    """Pop one of pacer_hf's own generate kwargs; its first choice is the default."""
    value = kwargs.pop(name, choices[0])
    if value not in choices:
        raise ValueError(f"{name}={value!r}: choose one of {choices} (default {choices[0]!r}).")
    return value


def _get_candidate_generator(self, generation_config, input_ids, inputs_tensor, logits_processor, model_kwargs,
                             assistant_model=None, target_tokenizer=None, assistant_tokenizer=None):
    """transformers' hook, bound on enabled models: this call's generator under pacer_loop="transformers"."""
    call = EnabledState(self).transformers_call
    if call is None:
        return default_candidate_generator(
            self, generation_config, input_ids, inputs_tensor, logits_processor, model_kwargs,
            assistant_model, target_tokenizer, assistant_tokenizer,
        )
    return fit_generator(call.make(generation_config, logits_processor), self, assistant_model)


def _resolve(model: PreTrainedModel, pacer: PacerArg, args: tuple, kwargs: dict, draft_forward: str,
             costs: str | list[float] = "measure", suffix_cache: ScopedSuffixCache | None = None) -> StrategyCall:
    """Turn the `pacer=` value into a StrategyCall, raising every argument error before any work."""
    draft = kwargs.get("assistant_model")
    lookup_tokens = _generation_value(model, kwargs, "prompt_lookup_num_tokens")
    config, module = _strategy(model, pacer, draft, lookup_tokens is not None)
    size = _batch_size(args, kwargs)
    if size > 1 and not config.supports_batch:  # before the builder runs (PEARL measures its γ there)
        what = repr(pacer) if isinstance(pacer, str) else type(config).__name__
        raise ValueError(
            f"pacer={what} runs batch size 1 only; got {size} prompts. Batches run "
            "with Pacer, sd-fixed-<γ>, ouroboros and pacer+ouroboros; call generate once per prompt for this strategy."
        )
    if isinstance(config, LookupConfig):
        return _resolve_lookup(model, config, module, args, kwargs, lookup_tokens, draft_forward, costs, suffix_cache)
    refuse_cache(suffix_cache, f"pacer={pacer!r} ({type(config).__name__})")
    if lookup_tokens is not None:
        raise ValueError(
            f"prompt_lookup_num_tokens={lookup_tokens} cannot be combined with pacer={pacer!r} ({type(config).__name__}): "
            "pass pacer=True for lookup gated by Pacer, pacer='lookup-<N>' for ungated lookup, or pacer=None for "
            "transformers' own prompt lookup."
        )
    if draft is None:
        raise ValueError(
            f"pacer={pacer!r} needs a draft model: pass assistant_model=<draft> to generate, or "
            "prompt_lookup_num_tokens=<N> for prompt lookup (or pacer=None for plain decoding)."
        )
    _check_tokenizers(kwargs)
    _check_pair(model, draft, kwargs)
    _check_inputs(model, args, kwargs)
    preverifier, source = module, None
    do_sample = bool(_generation_value(model, kwargs, "do_sample"))
    if config.use_preverifier:  # passed, else attached, else the default shipped in the package
        preverifier, source = preverifier_for(draft, preverifier, do_sample)
        preverifier.check_draft(draft)
        _check_trim(preverifier, do_sample)
    else:
        preverifier = None
    call = build_call(config, StrategyContext(model, draft, preverifier, do_sample, draft_forward, costs=costs))
    call.stats.preverifier = source
    return call


def _resolve_lookup(model: PreTrainedModel, config: LookupConfig, module, args: tuple, kwargs: dict,
                    lookup_tokens: int | None, draft_forward: str, costs: str | list[float], suffix_cache=None) -> StrategyCall:
    """Prompt lookup (strategies/lookup): the gate from `pacer=`, else the one attached to the target, else the
    default gate shipped in the package; a draft optional."""
    draft = kwargs.get("assistant_model")
    config = dataclasses.replace(
        config, num_tokens=config.num_tokens or lookup_tokens,
        max_ngram_size=config.max_ngram_size or _generation_value(model, kwargs, "max_matching_ngram_size"),
    )
    # transformers' own loop (pacer_loop="transformers") asks for candidates only in assisted mode
    kwargs["prompt_lookup_num_tokens"] = config.num_tokens or DEFAULT_LOOKUP_TOKENS
    gate = None
    if config.use_gate:
        gate = module if isinstance(module, PacerLookupGate) else ModelState(model).lookup_gate
        gate = gate if gate is not None else default_lookup_gate()
    preverifier = None
    do_sample = bool(_generation_value(model, kwargs, "do_sample"))
    if draft is not None:
        _check_tokenizers(kwargs)
        _check_pair(model, draft, kwargs)
        preverifier = attached_preverifier(draft, do_sample)
        if preverifier is not None:
            preverifier.check_draft(draft)
    _check_inputs(model, args, kwargs)
    if preverifier is not None:
        _check_trim(preverifier, do_sample)
    return build_call(config, StrategyContext(model, draft, preverifier, do_sample, draft_forward, lookup_gate=gate,
                                              costs=costs, suffix_cache=suffix_cache))


def _strategy(model: PreTrainedModel, pacer: PacerArg, draft, lookup: bool) -> tuple[StrategyConfig, object]:
    """The strategy config `pacer=` stands for, and the pre-verifier or lookup gate it names, if any.

    `lookup`: the call passed prompt_lookup_num_tokens, so pacer=True means lookup gated by Pacer."""
    if isinstance(pacer, StrategyConfig):
        return pacer, None
    if isinstance(pacer, dict):
        return StrategyConfig.from_dict(pacer), None
    if pacer is True:
        return (LookupConfig(use_gate=True) if lookup else SpeculativeConfig(use_preverifier=True)), None
    if isinstance(pacer, (str, Path)):
        config = strategy_config(pacer) if isinstance(pacer, str) else None
        if config is not None:
            if lookup and config == SpeculativeConfig(use_preverifier=True):  # "pacer" with prompt lookup
                return LookupConfig(use_gate=True), None
            return config, None
        name = str(pacer)
        loaded = EnabledState(model).loaded
        if name not in loaded:
            loaded[name] = _load_module(name).to(model.device if draft is None else draft.device)
        pacer = loaded[name]
    model_type = getattr(getattr(pacer, "config", None), "model_type", None)
    # another copy of a class (AutoModel with trust_remote_code=True) is normalised by from_other_copy
    if isinstance(pacer, PacerPreVerifier) or model_type == "pacer_preverifier":
        return SpeculativeConfig(use_preverifier=True), PacerPreVerifier.from_other_copy(pacer)
    if isinstance(pacer, PacerLookupGate) or model_type == "pacer_lookup_gate":
        return LookupConfig(use_gate=True), PacerLookupGate.from_other_copy(pacer)
    raise TypeError(
        "pacer= accepts True, False/None, a strategy name or config (pacer_hf.strategy_names()), a "
        f"PacerPreVerifier or PacerLookupGate, or a folder or Hub id holding one; got {type(pacer).__name__}."
    )


def load_preverifier(name_or_path: str | Path, **kwargs) -> PacerPreVerifier:
    """`PacerPreVerifier.from_pretrained` with a clear error when the place holds no pre-verifier.

    A name that is not an existing folder and not a Hub id (`org/name`) fails at once, listing the
    strategy names it may have meant, instead of retrying a download.
    """
    return _load_module(name_or_path, PacerPreVerifier, **kwargs)


def _load_module(name_or_path: str | Path, expected: type | None = None, **kwargs):
    """The pre-verifier or lookup gate (by config.json's model_type) held by a folder or Hub id."""
    name = str(name_or_path)
    local = Path(name).expanduser()
    if not local.is_dir():
        if "/" not in name:
            raise unknown_name_error(name)
        if local.is_absolute() or name.startswith((".", "~")) or name.count("/") > 1:
            raise ValueError(f"pacer={name!r}: no such folder. Pass a folder written by "
                             "PacerPreVerifier.save_pretrained, a Hub id ('org/name') or a strategy name.")
        if expected is not None:
            return expected.from_pretrained(name, **kwargs)
        model_type = PretrainedConfig.get_config_dict(name)[0].get("model_type")
    else:
        if not (local / "config.json").is_file():
            raise ValueError(f"pacer={name!r}: the folder holds no pre-verifier or lookup gate (no config.json).")
        model_type = json.loads((local / "config.json").read_text()).get("model_type")
        name = local
    wanted = {k: v for k, v in MODULE_TYPES.items() if expected in (None, v)}
    if model_type not in wanted:
        raise ValueError(
            f"pacer={str(name_or_path)!r}: config.json has model_type={model_type!r}, not one of {sorted(wanted)}; "
            "point pacer= at a folder written by PacerPreVerifier.save_pretrained or PacerLookupGate.save_pretrained."
        )
    return wanted[model_type].from_pretrained(name, **kwargs)
