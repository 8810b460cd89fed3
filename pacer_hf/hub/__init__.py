"""Publishing to the Hugging Face Hub: pre-verifier repos with model cards, and the `custom_generate` repo.

`publish.py` builds and uploads the repos; `custom_generate_code.py` flattens the package into the one folder
transformers' remote-code loader reads; `hub_generate.py` is that repo's `generate.py`; `push.py` and
`push_generate.py` are the `pacer-hf push` and `pacer-hf push-generate` commands.
"""

from .publish import (
    build_custom_generate_repo,
    build_preverifier_repo,
    load_metrics,
    push_custom_generate,
    push_preverifier,
    render_preverifier_card,
)

__all__ = [
    "build_custom_generate_repo",
    "build_preverifier_repo",
    "load_metrics",
    "push_custom_generate",
    "push_preverifier",
    "render_preverifier_card",
]
