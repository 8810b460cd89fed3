"""Loading a (draft, target) pair from folders and checking it fits together: used by the benchmark, the training
commands and the recipes alike."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import PreTrainedModel

from .generate_checks import check_vocabularies

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "float64": torch.float64}


def check_pair(target: PreTrainedModel, draft: PreTrainedModel, tokenizer=None) -> None:
    """Refuse pairs whose vocabularies differ: labels compare token ids, so they must mean the same thing. Heads that
    differ only by padding rows past the tokenizer pass (`generate_checks.check_vocabularies`)."""
    draft_head = draft.get_output_embeddings()
    rows = min(target.get_output_embeddings().out_features, draft_head.out_features if draft_head else 0)
    if tokenizer is not None and draft_head is not None and len(tokenizer) > rows:
        raise ValueError(f"The tokenizer has {len(tokenizer)} tokens but the models only {rows} output rows: "
                         "pass the --tokenizer of this pair.")
    check_vocabularies(target, draft, "pick a --draft that shares the target's tokenizer.", tokenizer=tokenizer)


def load_causal_lm(path: str, dtype: str = "float32", adapter: str | None = None) -> PreTrainedModel:
    """Load a causal LM (optionally with a PEFT adapter on top) in eval mode."""
    from transformers import AutoModelForCausalLM

    if dtype not in DTYPES:
        raise ValueError(f"dtype={dtype!r} is not one of {sorted(DTYPES)}.")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=DTYPES[dtype])
    if adapter:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, adapter)
    return model.eval()


def load_tokenizer(path: str):
    from transformers import AutoTokenizer

    if not Path(path).exists():
        raise ValueError(f"--tokenizer {path!r} does not exist; pass the folder holding the pair's tokenizer.")
    return AutoTokenizer.from_pretrained(path)


def model_name(model: PreTrainedModel, fallback: str | None = None) -> str | None:
    return fallback or getattr(model, "name_or_path", None) or getattr(model.config, "_name_or_path", None) or None
