"""pacer_hf.data.chat_prompts with a tiny offline tokenizer that has a chat template."""

from __future__ import annotations

import sysconfig
from pathlib import Path

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from pacer_hf.data import chat_prompts as cp
from pacer_hf.data.chat_prompts import CHAT_CATEGORIES, ChatPrompt, chat_prompts
from pacer_hf.data.prompts import Prompt, stdlib_hash_split

USER, ASSISTANT, END = "<|user|>", "<|assistant|>", "<|end|>"
TEMPLATE = ("{% for m in messages %}" + USER + "{{ m['content'] }}" + END + "{% endfor %}"
            "{% if add_generation_prompt %}" + ASSISTANT + "{% endif %}")
WORDS = ["def", "return", "the", "a", "of", "is", "in", "to", "and", "python", "function"]
N = 6


@pytest.fixture(scope="module")
def tokenizer():
    vocab = {token: i for i, token in enumerate(["[UNK]", USER, ASSISTANT, END, *WORDS])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]", eos_token=END,
                                  additional_special_tokens=[USER, ASSISTANT])
    tok.chat_template = TEMPLATE
    return tok


@pytest.fixture(scope="module")
def built(tokenizer):
    """N prompts of every category and split (built once: the stdlib scan is the slow part)."""
    return {(c, s): chat_prompts(tokenizer, c, s, n=N) for c in CHAT_CATEGORIES for s in ("bench", "train")}


@pytest.mark.parametrize("category", CHAT_CATEGORIES)
def test_prompts_are_chat_formatted_and_bounded(tokenizer, built, category):
    user, assistant = tokenizer.convert_tokens_to_ids([USER, ASSISTANT])
    for split in ("bench", "train"):
        prompts = built[category, split]
        assert len(prompts) == N
        for p in prompts:
            assert isinstance(p, ChatPrompt) and isinstance(p, Prompt)  # usable wherever the harness takes a Prompt
            assert p.category == category and p.split == split and p.name == p.id and p.name
            assert p.text.startswith(USER) and p.text.endswith(END + ASSISTANT)  # the template, with the
            assert p.ids[0] == user and p.ids[-1] == assistant                # generation prompt appended
            assert list(p.ids) == tokenizer.apply_chat_template(
                [{"role": "user", "content": p.messages[0][1]}], add_generation_prompt=True,
                return_dict=True)["input_ids"]
            assert len(p.messages) == 1 and p.messages[0][0] == "user" and len(p.messages[0][1]) > 40
            assert 8 <= len(p.ids) <= 1024
        assert len({p.name for p in prompts}) == N


@pytest.mark.parametrize("category", CHAT_CATEGORIES)
def test_train_and_bench_never_overlap(tokenizer, built, category):
    bench, train = built[category, "bench"], built[category, "train"]
    assert not {p.name for p in bench} & {p.name for p in train}
    if category in ("chat-docstring", "chat-extract", "chat-edit"):  # bench: held-out stdlib files; train: none of them
        root = Path(sysconfig.get_paths()["stdlib"])
        held = {path.relative_to(root).as_posix() for path in stdlib_hash_split()}
        assert all(p.name.split(":")[0] in held for p in bench)
        assert all(p.name.split(":")[0] not in held for p in train)
        assert all((root / p.name.split(":")[0]).is_file() for p in bench + train)
    else:  # the split is a property of the source key, whatever the seed
        assert not {p.messages for p in bench} & {p.messages for p in train}
        keys = {"chat-humaneval": lambda p: p.name}.get(category, lambda p: "pydoc:" + p.name.split(":")[1])
        assert all(cp.split_of(keys(p)) == p.split for p in bench + train)
        other_seed = chat_prompts(tokenizer, category, "train", n=N, seed=7)
        assert not {p.name for p in bench} & {p.name for p in other_seed}


@pytest.mark.parametrize("category", CHAT_CATEGORIES)
def test_deterministic_and_prefix_stable(tokenizer, built, category):
    again = chat_prompts(tokenizer, category, "bench", n=N)
    assert again == built[category, "bench"]
    assert chat_prompts(tokenizer, category, "bench", n=3) == again[:3]
    reseeded = chat_prompts(tokenizer, category, "bench", n=N, seed=1)
    assert [p.name for p in reseeded] != [p.name for p in again]


def test_max_tokens_skips_long_prompts(tokenizer, built):
    short = chat_prompts(tokenizer, "chat-summarize", "bench", n=4, max_tokens=200)
    assert len(short) == 4 and all(len(p.ids) <= 200 for p in short)


def test_errors_name_the_problem(tokenizer):
    with pytest.raises(ValueError, match="Unknown chat prompt category 'nope'"):
        chat_prompts(tokenizer, "nope")
    with pytest.raises(ValueError, match="split="):
        chat_prompts(tokenizer, "chat-qa", split="test")
    bare = PreTrainedTokenizerFast(tokenizer_object=tokenizer.backend_tokenizer)
    with pytest.raises(ValueError, match="no chat template"):
        chat_prompts(bare, "chat-qa")


def test_qa_prompts_hold_three_documents_and_a_question(built):
    for p in built["chat-qa", "bench"]:
        request = p.messages[0][1]
        assert all(f"Document {i}:" in request for i in (1, 2, 3)) and "\n\nQuestion: " in request
