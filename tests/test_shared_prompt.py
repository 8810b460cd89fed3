"""A draft that is a copy of its target (int8 here) takes the prompt's keys and values from the target's cache, which
reads the prompt but its last token before the first round (pacer_hf/loops/shared_prompt.py): the draft never reads
the prompt, and the output stays the target's, greedy and sampled."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from conftest import build_draft, build_model, make_preverifier, plain_greedy
from helpers import exact_distributions, goodness_of_fit, prompt, sample_counts

import pacer_hf
from pacer_hf._hf_compat import CACHE_KWARG, full_attention_kv, output_cache
from pacer_hf.cheap_draft import quantize_linears
from pacer_hf.loops.lean_draft import LeanDraft
from pacer_hf.loops.shared_prompt import is_copy_of

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def int8_pair():
    target = pacer_hf.enable(build_model("qwen2", vocab_size=96, hidden=32, seed=0).float())
    return target, quantize_linears(copy.deepcopy(target))


def _perturbed_copy(target, noise: float):
    """The target with noise on every weight but the embeddings: a copy by `is_copy_of`, partly accepted."""
    draft = copy.deepcopy(target)
    generator = torch.Generator().manual_seed(1)
    embeddings = draft.get_input_embeddings().weight
    with torch.no_grad():
        for param in draft.parameters():
            if param is not embeddings:
                param.add_(noise * param.std() * torch.randn(param.shape, generator=generator, dtype=param.dtype))
    return draft.eval()


def test_an_int8_copy_starts_from_the_targets_prompt_states_and_output_is_exact(int8_pair, monkeypatch):
    target, draft = int8_pair
    assert LeanDraft.for_model(draft, 64)[0] is not None  # its one-time check against the draft's forward, done
    read = []  # how many tokens each draft forward reads
    forward = LeanDraft.__call__
    monkeypatch.setattr(LeanDraft, "__call__", lambda self, ids, kv: read.append(ids.shape[1]) or forward(self, ids, kv))
    assert is_copy_of(draft, target)
    ids = prompt(11, seed=3)
    expected = plain_greedy(target, ids, max_new_tokens=24)
    for pacer in ("sd-fixed-4", make_preverifier(draft, max_draft_tokens=6)):
        out = target.generate(ids, max_new_tokens=24, do_sample=False, assistant_model=draft, pacer=pacer)
        assert torch.equal(out, expected)
        stats = pacer_hf.last_stats(target)
        assert stats.draft_forward == "lean"
        assert stats.prompt_kv_from_target == ids.shape[1] - 1 and stats.draft_lengths[0] > 0
        assert read and max(read) <= 2, "the draft read the prompt"  # the last token, or two after a full round
        read.clear()
        assert sum(stats.accepted) + len(stats.accepted) == out.shape[1] - ids.shape[1]


def test_a_draft_that_is_not_a_copy_reads_the_prompt_itself(int8_pair):
    target, _ = int8_pair
    other = build_draft(target, "noisy", noise=0.02)  # its embeddings differ too
    assert not is_copy_of(other, target)
    ids = prompt(9, seed=4)
    out = target.generate(ids, max_new_tokens=16, do_sample=False, assistant_model=other, pacer="sd-fixed-4")
    assert torch.equal(out, plain_greedy(target, ids, max_new_tokens=16))
    stats = pacer_hf.last_stats(target)
    assert stats.prompt_kv_from_target == 0 and stats.draft_lengths[0] == 4
    out = target.generate(ids, max_new_tokens=16, do_sample=False, assistant_model=_perturbed_copy(target, 0.02),
                          pacer="sd-fixed-4", pacer_loop="transformers")  # only the lean loop hands its cache over
    assert torch.equal(out, plain_greedy(target, ids, max_new_tokens=16))
    assert pacer_hf.last_stats(target).prompt_kv_from_target == 0


def test_a_copy_with_another_layout_is_not_a_copy(int8_pair):
    target, _ = int8_pair
    deeper = build_model("qwen2", vocab_size=96, hidden=32, layers=3, seed=0).float()
    deeper.get_input_embeddings().weight.data.copy_(target.get_input_embeddings().weight)
    assert target.config.num_hidden_layers != 3 and not is_copy_of(deeper, target)


def test_only_full_attention_states_are_handed_over(int8_pair):
    target, _ = int8_pair
    with torch.no_grad():
        cache = target(prompt(5, seed=1), use_cache=True).past_key_values
    layers = full_attention_kv(cache, 4)
    assert len(layers) == target.config.num_hidden_layers and layers[0][0].shape[2] == 4
    assert full_attention_kv(cache, 6) is None  # it holds 5 positions
    assert full_attention_kv(object(), 1) is None


def test_sampling_from_a_copy_keeps_the_target_distribution(sampling_pair):
    target, _ = sampling_pair
    draft = _perturbed_copy(target, 0.3)
    assert is_copy_of(draft, target)
    p1, p12 = exact_distributions(target)
    first, joint, accepted = sample_counts(target, draft, "sd-fixed-3", seed=2, samples=1500)
    assert pacer_hf.last_stats(target).prompt_kv_from_target > 0
    assert 0 < sum(accepted) < 3 * len(accepted)  # drafts partly accepted: the second token is a speculative one
    assert goodness_of_fit(first, p1) > 1e-3
    assert goodness_of_fit(joint, p12) > 1e-3


def test_traces_along_answers_read_a_copys_prompt_from_the_targets_states(tmp_path):
    """`collect_along_answers(target=...)` traces a copy the way the lean loop serves it: the answer read from the
    target's keys and values for the prompt but its last token. Another draft, or no target, reads its own."""
    from pacer_hf.training.collect_answers import collect_along_answers
    from pacer_hf.training.fit_data import answer_batch
    from pacer_hf.training.traces import load_traces, read_manifest

    target = build_model("qwen2", vocab_size=96, hidden=32, seed=0).float().eval()
    draft = _perturbed_copy(target, 0.5)
    records = []
    for i in range(3):
        ids = prompt(9 + i, seed=20 + i)[0].tolist()
        (answer,) = answer_batch(target, [ids], 12, 0, set(), False, 4)
        records.append({"key": f"k{i}", "prompt": ids, **answer})
    kwargs = {"max_draft_tokens": 4, "teacher_forced": True, "progress": False}
    shared = collect_along_answers(draft, records, tmp_path / "shared", target=target, **kwargs)
    own = collect_along_answers(draft, records, tmp_path / "own", **kwargs)
    assert read_manifest(shared)["prompt_states"] == "target" and read_manifest(own)["prompt_states"] == "draft"
    other = build_draft(target, "random", seed=5).float().eval()  # not a copy: reads the prompt itself even given the target
    assert read_manifest(collect_along_answers(other, records, tmp_path / "other", target=target,
                                               **kwargs))["prompt_states"] == "draft"
    first = {r["text_id"]: r for r in load_traces(shared) if r["position"] == len(records[r["text_id"]]["prompt"])}
    own_first = {r["text_id"]: r for r in load_traces(own) if r["position"] == len(records[r["text_id"]]["prompt"])}
    differ = 0
    for i, record in enumerate(records):
        full, start = record["prompt"] + record["response"], len(record["prompt"])
        with torch.no_grad():
            cache = output_cache(target(input_ids=torch.tensor([full[: start - 1]]), use_cache=True))
            logits = draft(input_ids=torch.tensor([full[start - 1: start + 3]]), **{CACHE_KWARG: cache}).logits[0]
        expected = pacer_hf.draft_features(logits, logits.argmax(-1))
        np.testing.assert_allclose(first[i]["draft_features"], expected.numpy(), atol=1e-4, rtol=1e-4)
        differ += not np.allclose(own_first[i]["draft_features"], expected.numpy(), atol=1e-4, rtol=1e-4)
    assert differ == len(records), "a perturbed copy's own prompt states must change what it drafts from"
    with pytest.raises(ValueError, match="teacher_forced=True"):
        collect_along_answers(draft, records, tmp_path / "rollout", target=target, max_draft_tokens=4, progress=False)
