"""Cheaper drafts (pacer_hf/cheap_draft.py): a vocabulary-subset head and int8 linear layers change what the draft
proposes, never what generate returns; the lean drafting loop runs them as the draft's own forward does."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import build_draft, build_model, make_preverifier, plain_greedy
from helpers import VOCAB, exact_distributions, goodness_of_fit, prompt, sample_counts

import pacer_hf
from pacer_hf.cheap_draft import OUTSIDE_LOGIT, SubsetHead, quantize_linears, restrict_vocabulary
from pacer_hf.loops.lean_draft import LeanDraft

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def qwen_pair():
    target = pacer_hf.enable(build_model("qwen2", vocab_size=96, hidden=32, seed=0).float())
    draft = build_draft(target, "noisy", noise=0.02).float()
    return target, draft


def test_subset_head_scores_only_its_tokens():
    head = torch.nn.Linear(8, 12, bias=True)
    keep = torch.tensor([7, 1, 3, 3])
    subset = SubsetHead(head, keep)
    hidden = torch.randn(2, 5, 8)
    full, mine = head(hidden), subset(hidden)
    assert mine.shape == full.shape and subset.out_features == 12 and subset.in_features == 8
    inside = torch.tensor([1, 3, 7])
    torch.testing.assert_close(mine[..., inside], full[..., inside])
    outside = torch.tensor([i for i in range(12) if i not in (1, 3, 7)])
    assert torch.all(mine[..., outside] == OUTSIDE_LOGIT)
    with pytest.raises(ValueError, match=r"ids in \[0, 12\)"):
        SubsetHead(head, torch.tensor([12]))


def test_restricted_draft_proposes_only_its_tokens_and_output_is_exact(qwen_pair):
    target, draft = qwen_pair
    ids = prompt(8, seed=2)
    expected = plain_greedy(target, ids, max_new_tokens=24)
    emitted = expected[0, ids.shape[1]:].unique()
    half = restrict_vocabulary(copy.deepcopy(draft), emitted[: max(1, len(emitted) // 2)])
    for pacer in ("sd-fixed-6", make_preverifier(half, max_draft_tokens=6)):
        out = target.generate(ids, max_new_tokens=24, do_sample=False, assistant_model=half, pacer=pacer)
        assert torch.equal(out, expected)
        stats = pacer_hf.last_stats(target)
        assert stats.draft_forward == "lean"
    with torch.no_grad():
        logits = half(ids).logits[0, -1]
    allowed = set(emitted[: max(1, len(emitted) // 2)].tolist())
    assert int(logits.argmax()) in allowed


def test_int8_draft_runs_the_lean_loop_and_output_is_exact(qwen_pair):
    target, draft = qwen_pair
    small = quantize_linears(copy.deepcopy(draft))
    assert type(small.lm_head) is torch.nn.Linear  # the head is left as it is unless asked
    assert type(small.model.layers[0].mlp.up_proj) is not torch.nn.Linear
    lean, reason = LeanDraft.for_model(small, max_length=64)
    assert lean is not None, reason
    ids = prompt(8, seed=5)
    expected = plain_greedy(target, ids, max_new_tokens=24)
    out = target.generate(ids, max_new_tokens=24, do_sample=False, assistant_model=small,
                          pacer=make_preverifier(small, max_draft_tokens=6))
    assert torch.equal(out, expected)
    assert pacer_hf.last_stats(target).draft_forward == "lean"
    both = quantize_linears(copy.deepcopy(draft), include_head=True)
    assert type(both.lm_head) is not torch.nn.Linear and both.get_output_embeddings().out_features == 96


def test_restricted_draft_keeps_the_target_distribution(sampling_pair):
    target, draft = sampling_pair
    restricted = restrict_vocabulary(copy.deepcopy(draft), range(0, VOCAB, 2))  # half the tokens have q = 0
    p1, p12 = exact_distributions(target)
    first, joint, accepted = sample_counts(target, restricted, make_preverifier(restricted, max_draft_tokens=4),
                                           seed=1, samples=1500)
    assert sum(accepted) > 0
    assert goodness_of_fit(first, p1) > 1e-3
    assert goodness_of_fit(joint, p12) > 1e-3


def test_a_cheapened_draft_is_named_as_what_it_is(qwen_pair):
    """A fit's card and resume signature name a draft object by its folder: an int8 copy must not pass for it."""
    from pacer_hf.cheap_draft import cheapened
    from pacer_hf.training.fit_setup import _model

    draft = copy.deepcopy(qwen_pair[1])  # named here only: the module's fixture stays as it is
    draft.name_or_path = "org/draft"
    assert cheapened(draft) is None and _model(draft, "draft", None, "cpu")[1] == "org/draft"
    cheap = restrict_vocabulary(quantize_linears(copy.deepcopy(draft)), [0, 5, 7])
    linears = sum(type(m) is torch.nn.Linear for m in draft.modules()) - 1  # all but the head
    assert cheapened(cheap) == f"int8 weights in {linears} linear layers, head over 3 of 96 tokens"
    assert _model(cheap, "draft", None, "cpu")[1] == f"org/draft ({cheapened(cheap)})"


def test_apply_cheap_draft_reads_the_shipped_choice(qwen_pair, tmp_path):
    import json

    from pacer_hf.cheap_draft import CHEAP_DRAFT_FILE, apply_cheap_draft

    _, draft = qwen_pair
    (tmp_path / "vocabulary.json").write_text(json.dumps([0, 5, 7]))
    (tmp_path / CHEAP_DRAFT_FILE).write_text(json.dumps({"vocabulary": "vocabulary.json", "int8": True}))
    cheap = apply_cheap_draft(copy.deepcopy(draft), tmp_path)
    assert isinstance(cheap.lm_head, SubsetHead) and cheap.lm_head.token_ids.tolist() == [0, 5, 7]
    assert type(cheap.model.layers[0].self_attn.q_proj) is not torch.nn.Linear
    (tmp_path / CHEAP_DRAFT_FILE).write_text(json.dumps({"int8": True, "bits": 4}))
    with pytest.raises(ValueError, match=r"unknown keys \['bits'\]"):
        apply_cheap_draft(copy.deepcopy(draft), tmp_path)
