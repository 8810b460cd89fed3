"""A pre-verifier that reads the loop's state (`config.loop_features`): what each round hands it, exactness in
every loop that runs it, and the traces it is trained on (`collect_along_answers`)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from conftest import make_preverifier, plain_greedy
from helpers import prompt

import pacer_hf
from pacer_hf import PacerConfig, PacerPreVerifier, draft_features
from pacer_hf.loops.preverifier_kernel import round_scorer
from pacer_hf.loops.stop_rule import PacerStopRule
from pacer_hf.modeling_pacer import loop_features


def loop_preverifier(draft, **overrides) -> PacerPreVerifier:
    """Untrained, with a loop projection strong enough that the loop's state changes decisions."""
    pv = make_preverifier(draft, loop_features=True, **overrides)
    with torch.no_grad():
        pv.loop_proj.weight.normal_(0.0, 3.0)
    return pv


def test_loop_features_values():
    assert loop_features(0, 0, 0.9, 8) == [0.0, 0.0, 0.0], "before the first round"
    assert loop_features(3, 5, 0.25, 8) == [3 / 8, 0.0, 0.25]
    assert loop_features(5, 5, 0.5, 10) == [0.5, 0.0, 0.5], "a short round that accepted all is not a full one"
    assert loop_features(10, 10, 0.5, 10) == [1.0, 1.0, 0.5]


def test_forward_needs_them_and_the_compiled_scorer_matches():
    torch.manual_seed(0)
    pv = PacerPreVerifier(PacerConfig(draft_hidden_size=16, max_draft_tokens=6, loop_features=True,
                                      initializer_range=0.5)).eval()
    hidden, features = torch.randn(1, 6, 16), torch.randn(1, 6, 3)
    with pytest.raises(ValueError, match="loop_features"):
        pv(hidden, features)
    logits = torch.randn(6, 50) * 3
    tokens = logits.argmax(-1)
    features = draft_features(logits, tokens)[None]
    scorer = round_scorer(pv)
    outputs = []
    for loop in ([0.0, 0.0, 0.0], [0.5, 1.0, 0.9], [0.125, 0.0, 0.3]):
        with torch.no_grad():
            full = pv(hidden, features, loop_features=torch.tensor([loop])).logits[0]
        scorer.start(loop)
        got = torch.tensor([scorer.add(hidden[0, i], logits[i], int(tokens[i])) for i in range(6)])
        torch.testing.assert_close(got, full, atol=2e-5, rtol=1e-5)
        outputs.append(full)
    assert not torch.allclose(outputs[0], outputs[1]), "the loop's state must reach the logits"


@pytest.mark.parametrize("scorer", ["compiled", "torch"])
def test_each_round_reads_the_round_before(pair, monkeypatch, scorer):
    """Round i + 1 starts with loop_features(accepted_i, drafted_i, the target's top probability where it chose
    its last token of round i); the first round with zeros; output identical to the target alone."""
    target, draft = pair("llama", "noisy")
    pv = loop_preverifier(draft, block_size=2, threshold=0.5, max_draft_tokens=6)
    seen = []
    start_round = PacerStopRule.start_round

    def recording(self):
        if scorer == "torch":
            self.scorer = None
        seen.append(list(self.loop))
        start_round(self)

    monkeypatch.setattr(PacerStopRule, "start_round", recording)
    ids = prompt(seed=3)
    expected = plain_greedy(target, ids, max_new_tokens=24)
    out = target.generate(ids, max_new_tokens=24, do_sample=False, assistant_model=draft, pacer=pv)
    assert torch.equal(out, expected)
    stats = pacer_hf.last_stats(target)
    assert seen[0] == [0.0, 0.0, 0.0]
    assert len(seen) <= len(stats.accepted) and not any(stats.draft_lengths[len(seen):]), "a round drafting nothing"
    with torch.no_grad():
        probs = torch.softmax(target(out).logits[0].float(), -1)
    length = ids.shape[1]
    for i in range(1, len(seen)):
        accepted = stats.accepted[i - 1]
        length += accepted + 1
        confidence = float(probs[length - 2].max())  # the distribution its last token (at length - 1) came from
        assert seen[i][:2] == [accepted / 6, float(accepted >= 6)]
        assert seen[i][2] == pytest.approx(confidence, rel=1e-6)
    assert len({tuple(s) for s in seen}) > 2


def test_exact_in_the_batch_loop_and_pearl(pair):
    from test_batch import LENGTHS, batched_greedy, left_padded, speculative

    target, draft = pair("llama", "noisy")
    pv = loop_preverifier(draft, block_size=2, threshold=0.5, max_draft_tokens=6)
    ids, mask = left_padded(LENGTHS, seed=0)
    expected = batched_greedy(target, ids, mask, max_new_tokens=20)
    assert torch.equal(speculative(target, draft, ids, mask, pv, max_new_tokens=20, pacer_batch_stop="row"), expected)
    from test_pearl import pearl_config

    pacer_hf.attach(draft, pv)
    try:
        rounds = {}
        single = prompt(seed=5)
        for mode in ("sequential", "thread", "process"):
            out = target.generate(single, max_new_tokens=24, do_sample=False, assistant_model=draft,
                                  pacer=pearl_config(mode, gamma=6, use_preverifier=True))
            assert torch.equal(out, plain_greedy(target, single, max_new_tokens=24)), mode
            stats = pacer_hf.last_stats(target)
            rounds[mode] = (stats.draft_lengths, stats.accepted)
        # each job reads the loop state fixed when it was made: concurrency changes no decision
        assert rounds["process"] == rounds["sequential"] == rounds["thread"]
    finally:
        del draft._pacer_preverifier


def _answers(target, n: int = 4, new_tokens: int = 20, top_k: int = 4, do_sample: bool = False) -> list[dict]:
    from pacer_hf.training.fit_data import answer_batch

    prompts = [prompt(length=5 + i, seed=10 + i)[0].tolist() for i in range(n)]
    records = []
    for p in prompts:
        (answer,) = answer_batch(target, [p], new_tokens, 0, set(), do_sample, top_k)
        records.append({"key": f"k{len(records)}", "prompt": p, **answer})
    return records


def test_collect_along_answers_labels_and_chain(pair, tmp_path):
    """Labels equal verification by the target (its forward over prefix + draft); rounds follow one another as
    fixed-length speculative decoding runs them; each row carries the loop state that round would see."""
    from pacer_hf.training.collect import propose_and_label
    from pacer_hf.training.collect_answers import collect_along_answers
    from pacer_hf.training.traces import load_traces, read_manifest

    target, draft = pair("llama", "noisy")
    records = _answers(target)
    out = collect_along_answers(draft, records, tmp_path / "traces", max_draft_tokens=5, batch_size=3,
                                records_per_shard=2, progress=False)
    assert read_manifest(out)["loop_features"] is True
    rows = load_traces(out)
    by_record: dict[int, list] = {}
    for row in rows:
        by_record.setdefault(row["text_id"], []).append(row)
    assert sorted(by_record) == list(range(len(records)))
    for i, chain in by_record.items():
        record = records[i]
        full = record["prompt"] + record["response"]
        chain.sort(key=lambda r: r["position"])
        assert chain[0]["position"] == len(record["prompt"]) and chain[0]["loop_features"] == [0.0, 0.0, 0.0]
        for row, after in zip(chain, chain[1:] + [None]):
            labels = np.array(row["labels"])
            accepted = int((labels == 1).sum())
            p = row["position"]
            reference = propose_and_label(target, draft, [full[:p]], 5)["labels"][0]
            defined = labels >= 0
            np.testing.assert_array_equal(labels[defined], reference[defined])
            if after is None:
                assert p + accepted + 1 >= len(full)
                continue
            assert after["position"] == p + accepted + 1
            confidence = math.exp(record["top_logp"][after["position"] - 1 - len(record["prompt"])][0])
            np.testing.assert_allclose(after["loop_features"], [accepted / 5, float(accepted == 5), confidence],
                                       rtol=1e-5)


def test_teacher_forced_traces_equal_the_rollouts_where_labels_are_defined(pair, tmp_path):
    """One forward per answer gives the same rounds, tokens, labels, loop state, hidden states and features as a
    rollout per round, at every drafted token up to and including the round's first miss."""
    from pacer_hf.training.collect_answers import collect_along_answers
    from pacer_hf.training.traces import load_traces

    target, draft = pair("llama", "noisy")
    draft = draft.float()
    records = _answers(target)
    kwargs = {"max_draft_tokens": 5, "batch_size": 3, "records_per_shard": 2, "progress": False}
    rollout = load_traces(collect_along_answers(draft, records, tmp_path / "rollout", **kwargs))
    forced = load_traces(collect_along_answers(draft, records, tmp_path / "forced", teacher_forced=True, **kwargs))
    rounds = {(r["text_id"], r["position"]): r for r in rollout}
    assert sorted(rounds) == sorted((r["text_id"], r["position"]) for r in forced)
    misses = 0
    for row in forced:
        ref = rounds[(row["text_id"], row["position"])]
        np.testing.assert_array_equal(row["labels"], ref["labels"])
        np.testing.assert_allclose(row["loop_features"], ref["loop_features"], rtol=1e-6)
        upto = int((np.array(ref["labels"]) == 1).sum()) + int((np.array(ref["labels"]) == 0).any())
        misses += int((np.array(ref["labels"]) == 0).any())
        assert row["draft_tokens"][:upto] == ref["draft_tokens"][:upto]
        np.testing.assert_allclose(np.array(row["draft_hidden_states"])[:upto],
                                   np.array(ref["draft_hidden_states"])[:upto], atol=2e-3, rtol=2e-3)
        np.testing.assert_allclose(np.array(row["draft_features"])[:upto], np.array(ref["draft_features"])[:upto],
                                   atol=1e-3, rtol=1e-3)
    assert misses > 0, "the noisy draft must miss somewhere for the comparison to mean much"


def test_sampled_traces_label_each_sampled_token_with_its_acceptance_probability(pair, tmp_path):
    """T = 1 traces along sampled answers: every drafted token is the draft's sample given the answer so far, its
    label min(1, p/q) under the target's and the draft's T = 1 distributions there; rounds follow one another
    with the loop state the previous round leaves; the manifest says `sampling`."""
    from pacer_hf.training.collect_answers import collect_along_answers
    from pacer_hf.training.traces import load_traces, read_manifest

    target, draft = pair("llama", "noisy", torch.float32)  # the cached pair: converting one in place leaks into others
    torch.manual_seed(0)
    vocab = target.config.vocab_size
    records = _answers(target, top_k=vocab, do_sample=True)  # every token's log-probability recorded: p is exact
    out = collect_along_answers(draft, records, tmp_path / "sampled", max_draft_tokens=5, teacher_forced=True,
                                temperature=1.0, seed=3, progress=False)
    assert read_manifest(out)["label_kind"] == "sampling"
    rows = load_traces(out)
    soft = 0
    for i, record in enumerate(records):
        full, start = record["prompt"] + record["response"], len(record["prompt"])
        with torch.no_grad():
            ids = torch.tensor([full[:-1]])
            p_all = torch.softmax(target(input_ids=ids).logits[0].float(), -1)
            q_all = torch.softmax(draft(input_ids=ids).logits[0].float(), -1)
        chain = sorted((r for r in rows if r["text_id"] == i), key=lambda r: r["position"])
        assert chain[0]["position"] == start and chain[0]["loop_features"] == [0.0, 0.0, 0.0]
        for row, after in zip(chain, chain[1:]):
            assert row["position"] < after["position"] <= row["position"] + 6
            accepted = after["position"] - row["position"] - 1
            confidence = math.exp(record["top_logp"][after["position"] - 1 - start][0])
            np.testing.assert_allclose(after["loop_features"], [accepted / 5, float(accepted == 5), confidence],
                                       rtol=1e-5)
        for row in chain:
            for j, (token, label) in enumerate(zip(row["draft_tokens"], row["labels"])):
                at = row["position"] + j - 1  # the forward row predicting position + j
                if row["position"] + j >= len(full):
                    assert label == -100.0
                    continue
                expected = min(1.0, float(p_all[at, token] / q_all[at, token]))
                assert label == pytest.approx(expected, rel=1e-3, abs=1e-4)
                soft += 0.0 < label < 1.0
    assert soft > 0, "a noisy draft must give soft labels somewhere"
    with pytest.raises(ValueError, match="teacher_forced=True"):
        collect_along_answers(draft, records, tmp_path / "x", temperature=1.0, progress=False)


def test_trained_on_them_reads_them(pair, tmp_path):
    from pacer_hf.training.collect_answers import collect_along_answers
    from pacer_hf.training.train import predict_probs, prepare, train_preverifier

    target, draft = pair("llama", "noisy")
    traces = collect_along_answers(draft.float(), _answers(target, n=6), tmp_path / "traces", max_draft_tokens=4,
                                   progress=False)
    model, _ = train_preverifier(str(traces), tmp_path / "pv", epochs=1, progress=False)
    assert model.config.loop_features and model.loop_proj is not None
    ablated, _ = train_preverifier(str(traces), tmp_path / "pv-ablated", epochs=1, progress=False, loop_features=False)
    assert not ablated.config.loop_features and ablated.loop_proj is None
    from pacer_hf.training.traces import load_traces

    data = prepare(load_traces(traces))
    with torch.no_grad():
        model.loop_proj.weight.normal_(0.0, 3.0)
    probs, _ = predict_probs(model, data)
    data.columns["loop_features"] = torch.zeros_like(data.columns["loop_features"])
    assert not np.allclose(probs, predict_probs(model, data)[0]), "predictions must read the loop column"
