"""Entry point of the pacer `custom_generate` Hub repository (shipped there as `custom_generate/generate.py`).

`model.generate(ids, custom_generate="<org>/pacer", trust_remote_code=True, assistant_model=draft, pacer=...)`
runs pacer_hf without installing it: transformers downloads this file and, through the relative
imports below, the pacer_hf modules that `pacer_hf.hub.build_custom_generate_repo` puts next to it
(flattened into one folder: `custom_generate_code.py`), then calls
`generate(model=model, **every_generate_argument)`. The call takes exactly
the path of `pacer_hf.enable(model)` + `model.generate(...)`, so the tokens are the same.
"""

from __future__ import annotations

from transformers import PreTrainedModel

# Every module is imported in the `from ..x import y` form: transformers' remote-code loader fetches
# the files it finds that way (it does not see `from .. import x`), so this list keeps the repo complete.
from .._hf_compat import check_supported
from ..configuration_pacer import PacerConfig  # noqa: F401  (fetched for modeling_pacer)
from ..generation import EnabledState, disable, enable  # imports the strategy registry, which registers all


def generate(model: PreTrainedModel, *args, **kwargs):
    """`generate` as after `pacer_hf.enable(model)`, for this call only; the model is left as it was.

    `pacer=` takes the same values as with pacer_hf (True, a Hub id or path, a `PacerPreVerifier` from
    pacer_hf or from `AutoModel(..., trust_remote_code=True)`, a strategy name such as "sd-fixed-<n>",
    "ouroboros" or "pearl", or a strategy config).
    Stats of the call are on `pacer_hf.model_state.ModelState(model).last_stats` (`pacer_hf.last_stats(model)` if installed).
    """
    check_supported()
    saved = {name: model.__dict__.pop(name) for name in EnabledState.ATTRIBUTES if name in model.__dict__}
    had_pacer_entry = "pacer" in model.generation_config.__dict__
    enable(model)
    EnabledState(model).loaded = EnabledState(model).hub_loaded or {}  # loaded by id, kept across calls
    try:
        return model.generate(*args, **kwargs)
    finally:
        EnabledState(model).hub_loaded = EnabledState(model).loaded
        disable(model)
        model.__dict__.update(saved)
        if not had_pacer_entry:
            model.generation_config.__dict__.pop("pacer", None)
