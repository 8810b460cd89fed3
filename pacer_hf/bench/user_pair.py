"""`pacer-hf bench --target ID --draft ID`: a user's own pair, loaded as transformers loads it.

The tokenizer comes from the target (a Hub id or a folder) unless --tokenizer names one; a chat model (its tokenizer
has a chat template) is benchmarked on the chat categories by default; a draft folder with a `cheap_draft.json` is
made cheap as it says (`pacer_hf.cheap_draft`); `--preverifier` may name what
`pacer-hf fit --out` wrote, one pre-verifier or, after `--decoding both`, one per decoding mode.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def tokenizer_of(args: argparse.Namespace, target_path: str):
    """--tokenizer, else the target's (a Hub id or folder, as transformers loads it)."""
    from transformers import AutoTokenizer

    from ..loading import load_tokenizer

    if args.tokenizer:
        return load_tokenizer(args.tokenizer)
    try:
        return AutoTokenizer.from_pretrained(target_path)
    except (OSError, ValueError) as error:
        raise ValueError(f"No tokenizer loads from --target {target_path!r} ({error}); pass --tokenizer.") from None


def load_draft(path: str, dtype: str):
    """The draft as transformers loads it, made cheap as the folder's `cheap_draft.json` says when it has one (int8
    linears, a vocabulary-subset head: `pacer_hf.cheap_draft`, e.g. an int8 copy of the target as its draft)."""
    import sys

    from ..cheap_draft import CHEAP_DRAFT_FILE, apply_cheap_draft
    from ..loading import load_causal_lm

    draft = load_causal_lm(path, dtype)
    if (Path(path) / CHEAP_DRAFT_FILE).is_file():
        print(f"note: the draft is made cheap as {Path(path) / CHEAP_DRAFT_FILE} says.", file=sys.stderr)
        apply_cheap_draft(draft, path)
    return draft


def is_chat_model(args: argparse.Namespace) -> bool:
    """Whether the user's target tokenizer has a chat template (then the chat categories are its default). A
    tokenizer that does not load says no here: loading the pair, after the argument checks, names the problem."""
    try:
        tokenizer = tokenizer_of(args, args.target)
    except ValueError:
        return False
    return getattr(tokenizer, "chat_template", None) is not None


def fitted_preverifiers(preverifier: str | None, sampling: str | None) -> tuple[str | None, str | None]:
    """(pre-verifier, sampling pre-verifier): a `pacer-hf fit --decoding both` folder holds greedy/ and sampling/."""
    folder = Path(preverifier) if preverifier else None
    if folder is None or (folder / "config.json").is_file() or not (folder / "greedy" / "config.json").is_file():
        return preverifier, sampling
    if sampling is None and (folder / "sampling" / "config.json").is_file():
        sampling = str(folder / "sampling")
    return str(folder / "greedy"), sampling
