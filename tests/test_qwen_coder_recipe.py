"""The Qwen2.5-Coder recipe's bookkeeping (the stages themselves need the pair: docs/QWEN_CODER.md)."""

from __future__ import annotations

import json

import pytest

from pacer_hf.recipes.qwen_coder import SAMPLED_RESPONSES, answers


def test_answers_split_by_key_and_name_the_stage_to_run(tmp_path):
    with pytest.raises(FileNotFoundError, match="--stage sampled-responses"):
        answers(tmp_path, sampled=True)
    with pytest.raises(FileNotFoundError, match="--stage responses"):
        answers(tmp_path)
    rows = [{"key": "a", "heldout": False, "prompt": [1], "response": [2, 3]},
            {"key": "b", "heldout": True, "prompt": [1], "response": [4]},
            {"key": "c", "heldout": False, "prompt": [1], "response": []}]  # an empty answer is no answer
    (tmp_path / SAMPLED_RESPONSES).write_text("".join(json.dumps(r) + "\n" for r in rows))
    train, heldout = answers(tmp_path, sampled=True)
    assert [r["key"] for r in train] == ["a"] and [r["key"] for r in heldout] == ["b"]


def test_the_shipped_pre_verifiers_serve_one_mode_each_for_the_same_draft():
    """load_pair attaches both to the cheap 0.5B draft: greedy calls get one, do_sample=True calls the other."""
    from pacer_hf._paths import hub_cards_dir
    from pacer_hf.generation import load_preverifier
    from pacer_hf.pairs import QWEN_PREVERIFIERS

    cards = hub_cards_dir()
    if not all((cards / folder / "config.json").is_file() for folder in QWEN_PREVERIFIERS):
        pytest.skip("the Qwen2.5-Coder pre-verifiers are not shipped in this tree")
    greedy, sampling = (load_preverifier(str(cards / folder)) for folder in QWEN_PREVERIFIERS)
    assert greedy.config.decoding == "greedy" and sampling.config.decoding == "sampling"
    assert greedy.config.draft_signature == sampling.config.draft_signature == {
        "model_type": "qwen2", "hidden_size": 896, "num_hidden_layers": 24, "vocab_size": 151936}
    assert not sampling.config.trim_failed_block, "a trim is exact for greedy decoding only"
