"""Prompt lookup with Pacer's stop rule (strategies/lookup, modeling_lookup_gate), without a draft model.

The conformance suite runs the lookup presets with a draft (lookup, else the draft); here: no draft at
all (`prompt_lookup_num_tokens=N, pacer=...`), the gate's decisions, the match search, loading, errors
and the training pipeline on a tiny model.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import ARCHITECTURES, build_model, logits_processor_case, make_lookup_gate, plain_greedy
from helpers import PROMPT, TEMPERATURE, VOCAB, exact_distributions, goodness_of_fit
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pacer_hf
import pacer_hf.pairs
from pacer_hf.modeling_lookup_gate import find_lookup, lookup_features
from pacer_hf.recipes import lookup_gate as trainer

REPEATING = torch.tensor([[5, 6, 7, 8, 9, 10, 11, 12, 5, 6, 7, 8, 40, 41, 5, 6]])  # text with repeated n-grams


@pytest.fixture(scope="module")
def targets():
    return {arch: pacer_hf.enable(build_model(arch)) for arch in ARCHITECTURES}


def gated(target, **overrides):
    return make_lookup_gate(target, **overrides)


CASES = {
    "lookup-3": lambda target: "lookup-3",
    "LookupConfig(num_tokens=7)": lambda target: pacer_hf.LookupConfig(num_tokens=7, max_ngram_size=1),
    "gate threshold": lambda target: gated(target),
    "gate expected_gain": lambda target: gated(target, decision_rule="expected_gain"),
}


@pytest.mark.parametrize("case", CASES, ids=CASES.keys())
@pytest.mark.parametrize("arch", ARCHITECTURES)
@pytest.mark.parametrize("lookup_tokens", [None, 2, 10])
def test_greedy_identical_without_a_draft(targets, case, arch, lookup_tokens):
    target = targets[arch]
    expected = plain_greedy(target, REPEATING, max_new_tokens=24)
    extra = {} if lookup_tokens is None else {"prompt_lookup_num_tokens": lookup_tokens}
    for loop in ("lean", "transformers"):
        out = target.generate(REPEATING, max_new_tokens=24, do_sample=False, pacer=CASES[case](target),
                              pacer_loop=loop, **extra)
        assert torch.equal(out, expected), loop
        stats = pacer_hf.last_stats(target)
        assert stats.new_tokens == 24 and stats.draft_forwards == 0
        assert len(stats.accepted) == len(stats.draft_lengths) == len(stats.lookup_lengths) == stats.target_forwards
        assert stats.draft_lengths == stats.lookup_lengths
        assert all(a <= d for a, d in zip(stats.accepted, stats.draft_lengths))
        cap = {"lookup-3": 3, "LookupConfig(num_tokens=7)": 7}.get(case, min(lookup_tokens or 6, 6))
        assert max(stats.draft_lengths) <= cap
    assert stats.matches > 0, "the repeated prompt must give lookup matches"


def test_a_gate_trained_for_another_vocabulary_runs_exactly(targets):
    """No vocabulary lock: no feature of a gate depends on the vocabulary its target had."""
    target = targets["llama"]
    other = make_lookup_gate(build_model("llama", vocab_size=50), decision_rule="expected_gain")
    out = target.generate(REPEATING, max_new_tokens=12, do_sample=False, prompt_lookup_num_tokens=6, pacer=other)
    assert torch.equal(out, plain_greedy(target, REPEATING, max_new_tokens=12))


def test_pacer_true_with_lookup_uses_the_attached_gate_and_proposes_nothing_when_told(targets):
    target = targets["llama"]
    gate = gated(target)
    with torch.no_grad():
        gate.mlp[-1].bias.fill_(-30.0)  # survival ~ 0: never worth proposing
    pacer_hf.attach(target, gate)
    try:
        out = target.generate(REPEATING, max_new_tokens=12, do_sample=False, prompt_lookup_num_tokens=5, pacer=True)
        stats = pacer_hf.last_stats(target)
        assert stats.strategy == "pacer-lookup" and stats.matches > 0 and sum(stats.draft_lengths) == 0
        with torch.no_grad():
            gate.mlp[-1].bias.fill_(30.0)  # survival ~ 1: propose every lookup token
        out2 = target.generate(REPEATING, max_new_tokens=12, do_sample=False, prompt_lookup_num_tokens=5,
                               pacer="pacer")
        stats2 = pacer_hf.last_stats(target)
        assert stats2.draft_lengths == stats2.lookup_lengths and max(stats2.draft_lengths) > 1
        assert torch.equal(out, out2)
    finally:
        del target._pacer_lookup_gate


def test_the_lookup_search_is_timed_apart_from_the_gate(targets):
    """`lookup_seconds` times the search, `preverifier_seconds` only the gate: an ungated call has no gate time."""
    target = targets["llama"]
    target.generate(REPEATING, max_new_tokens=12, do_sample=False, pacer="lookup-5")
    stats = pacer_hf.last_stats(target)
    assert stats.matches > 0 and stats.lookup_seconds > 0 and stats.preverifier_seconds == 0
    target.generate(REPEATING, max_new_tokens=12, do_sample=False, prompt_lookup_num_tokens=5, pacer=gated(target))
    stats = pacer_hf.last_stats(target)
    assert stats.matches > 0 and stats.lookup_seconds > 0 and stats.preverifier_seconds > 0


def test_the_gate_is_recalibrated_to_the_target_across_calls(targets):
    """generate keeps one map of the gate's log-odds to this target's acceptances per gate and mode, refines it
    with every round's outcome and reads it in the next call: a map that says nothing is accepted stops every
    proposal (outputs unchanged)."""
    from pacer_hf.model_state import ModelState

    target = targets["gpt2"]
    gate = gated(target)
    with torch.no_grad():
        gate.mlp[-1].bias.fill_(30.0)  # as trained: every lookup token survives
    expected = plain_greedy(target, REPEATING, max_new_tokens=16)
    for _ in range(3):
        out = target.generate(REPEATING, max_new_tokens=16, do_sample=False, prompt_lookup_num_tokens=5, pacer=gate)
        assert torch.equal(out, expected)
    stats = pacer_hf.last_stats(target)
    assert sum(stats.lookup_lengths) > 0
    maps = ModelState(target).lookup_calibration[gate]
    assert set(maps) == {False} and maps[False].labels >= 3 * sum(a + 1 for a in stats.accepted if a < 5) // 3
    maps[False].scale, maps[False].shift = 1.0, -80.0  # this target, it says, accepts nothing the gate proposes
    out = target.generate(REPEATING, max_new_tokens=16, do_sample=False, prompt_lookup_num_tokens=5, pacer=gate)
    stats = pacer_hf.last_stats(target)
    assert torch.equal(out, expected) and stats.matches > 0 and sum(stats.lookup_lengths) == 0
    other = gated(target)
    with torch.no_grad():
        other.mlp[-1].bias.fill_(30.0)
    target.generate(REPEATING, max_new_tokens=16, do_sample=False, prompt_lookup_num_tokens=5, pacer=other)
    assert sum(pacer_hf.last_stats(target).lookup_lengths) > 0  # another gate: a map of its own


def test_pacer_none_leaves_hf_prompt_lookup_alone(targets):
    target = targets["qwen2"]
    out = target.generate(REPEATING, max_new_tokens=16, do_sample=False, prompt_lookup_num_tokens=4, pacer=None)
    assert torch.equal(out, plain_greedy(target, REPEATING, max_new_tokens=16))


@pytest.mark.parametrize("eos_position", [1, 3, 6])
def test_eos_and_max_new_tokens(targets, eos_position):
    target = targets["llama"]
    free = plain_greedy(target, REPEATING, max_new_tokens=14)
    eos = int(free[0, REPEATING.shape[1] + eos_position])
    expected = plain_greedy(target, REPEATING, max_new_tokens=14, eos_token_id=eos, pad_token_id=eos)
    for case in ("lookup-6", gated(target, threshold=0.0)):
        out = target.generate(REPEATING, max_new_tokens=14, do_sample=False, pacer=case, eos_token_id=eos,
                              pad_token_id=eos)
        assert torch.equal(out, expected)
    for max_new_tokens in (1, 2, 5):
        out = target.generate(REPEATING, max_new_tokens=max_new_tokens, do_sample=False, pacer="lookup-8")
        assert torch.equal(out, plain_greedy(target, REPEATING, max_new_tokens=max_new_tokens))


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_logits_processors_and_streamer(targets, arch):
    from transformers.generation.streamers import BaseStreamer

    class Collect(BaseStreamer):
        def __init__(self):
            self.tokens = []

        def put(self, value):
            self.tokens += value.flatten().tolist()

        def end(self):
            pass

    target = targets[arch]
    kwargs, expected = logits_processor_case(target, REPEATING)
    streamer = Collect()
    out = target.generate(REPEATING, do_sample=False, pacer=gated(target), prompt_lookup_num_tokens=6,
                          streamer=streamer, **kwargs)
    assert torch.equal(out, expected)
    assert streamer.tokens == out[0].tolist()  # transformers streams the prompt first


@settings(max_examples=30, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(tokens=st.lists(st.integers(0, 12), min_size=1, max_size=24), max_new_tokens=st.integers(1, 20),
       arch=st.sampled_from(ARCHITECTURES), threshold=st.sampled_from([0.0, 0.4, 0.9]),
       lookup_tokens=st.integers(1, 8))
def test_property_greedy_identical(targets, tokens, max_new_tokens, arch, threshold, lookup_tokens):
    """Small-alphabet prompts repeat a lot, so lookup proposes often."""
    target = targets[arch]
    ids = torch.tensor([tokens])
    out = target.generate(ids, max_new_tokens=max_new_tokens, do_sample=False, prompt_lookup_num_tokens=lookup_tokens,
                          pacer=gated(target, threshold=threshold))
    assert torch.equal(out, plain_greedy(target, ids, max_new_tokens=max_new_tokens))


@pytest.mark.parametrize("case", ["lookup-4", "gate"])
def test_sampling_matches_target_distribution(sampling_pair, case):
    target, _ = sampling_pair
    pacer = case
    if case == "gate":
        pacer = gated(target, threshold=0.3, max_lookup_tokens=3)
        with torch.no_grad():
            pacer.mlp[-1].bias.fill_(5.0)  # mostly propose, still cut some proposals short
    p1, p12 = exact_distributions(target)
    torch.manual_seed(0)
    first, joint, proposed = torch.zeros(VOCAB), torch.zeros(VOCAB, VOCAB), 0
    for _ in range(1500):
        out = target.generate(PROMPT, max_new_tokens=4, do_sample=True, temperature=TEMPERATURE, top_k=0, pacer=pacer)
        t1, t2 = out[0, PROMPT.shape[1]:PROMPT.shape[1] + 2].tolist()
        first[t1] += 1
        joint[t1, t2] += 1
        proposed += sum(pacer_hf.last_stats(target).draft_lengths)
    assert proposed > 500, "lookup must propose tokens for the test to mean much"
    assert goodness_of_fit(first, p1) > 1e-3
    assert goodness_of_fit(joint, p12) > 1e-3


# -- the match and the decision ----------------------------------------------------------------------------


def brute_force_lookup(ids: list[int], max_tokens: int, max_ngram: int):
    """find_lookup's rule written the slow way: longest n, then longest backward match, longest continuation,
    most recent."""
    length = len(ids)
    for n in range(min(max_ngram, length - 1), 0, -1):
        hits = [i for i in range(length - n) if ids[i:i + n] == ids[length - n:]]
        if not hits:
            continue

        def back(i, n=n):
            m = 0
            while m < min(32, length) and i + n - 1 - m >= 0 and ids[i + n - 1 - m] == ids[length - 1 - m]:
                m += 1
            return m

        best = max(hits, key=lambda i: (back(i), min(max_tokens, length - i - n), i))
        return ids[best + n: best + n + max_tokens], n, back(best), len(hits)
    return None


@settings(max_examples=200, deadline=None, derandomize=True)
@given(ids=st.lists(st.integers(0, 4), min_size=1, max_size=60), max_tokens=st.integers(1, 8),
       max_ngram=st.integers(1, 4))
def test_find_lookup_matches_the_slow_rule(ids, max_tokens, max_ngram):
    found = find_lookup(torch.tensor(ids), max_tokens, max_ngram)
    expected = brute_force_lookup(ids, max_tokens, max_ngram)
    if expected is None:
        assert found is None
        return
    tokens, n, match_length, occurrences = expected
    assert (found.tokens.tolist(), found.ngram, found.match_length, found.occurrences) == (
        tokens, n, match_length, occurrences)
    assert 0 < found.agreement[0] <= 1 and torch.all(found.agreement <= 1)  # the chosen occurrence agrees with itself
    features = lookup_features(found, len(ids), 3, None, max_tokens, max_ngram)
    assert features.shape == (len(tokens), pacer_hf.modeling_lookup_gate.NUM_LOOKUP_FEATURES)
    assert torch.isfinite(features).all() and features[:, 7].eq(1).all()


def test_agreement_counts_occurrences_that_continue_the_same_way():
    ids = torch.tensor([1, 2, 3, 4, 9, 1, 2, 3, 5, 9, 1, 2, 3, 4, 9, 1, 2])
    match = find_lookup(ids, 3, 2)
    # "1 2" occurred 3 times before the end, continued by "3 4 9", "3 5 9", "3 4 9"; the second occurrence is
    # preceded by the same tokens as the end of the text ("1 2 3 4 9 1 2") for longest, so it is chosen
    assert match.tokens.tolist() == [3, 5, 9] and match.occurrences == 3 and match.match_length == 7
    assert match.agreement.tolist() == pytest.approx([1.0, 1 / 3, 1 / 3])


def test_expected_gain_rule_picks_the_best_rate():
    gate = pacer_hf.PacerLookupGate(pacer_hf.PacerLookupGateConfig(
        max_lookup_tokens=4, decision_rule="expected_gain", round_cost=[1.0, 1.6, 2.0, 1.5, 1.7]))
    # rates: k=0 1.0, k=1 (1+.9)/1.6, k=2 (1+.9+.8)/2.0, k=3 (1+.9+.8+.7)/1.5 = 2.27, k=4 (3.4+.1)/1.7
    assert gate.choose_length([0.9, 0.8, 0.7, 0.1]) == 3
    assert gate.choose_length([0.2, 0.1, 0.05, 0.01]) == 0
    assert gate.choose_length([0.9]) == 1  # (1 + 0.9) / 1.6 = 1.19 > 1
    threshold = pacer_hf.PacerLookupGate(pacer_hf.PacerLookupGateConfig(threshold=0.5))
    assert threshold.choose_length([0.9, 0.6, 0.4, 0.9]) == 2


# -- loading and errors ------------------------------------------------------------------------------------


def test_gate_round_trips_and_loads_as_pacer_folder(targets, tmp_path):
    target = targets["gpt2"]
    gate = gated(target, decision_rule="expected_gain")
    gate.save_pretrained(tmp_path / "gate")
    loaded = pacer_hf.PacerLookupGate.from_pretrained(tmp_path / "gate")
    assert loaded.config.round_cost == gate.config.round_cost
    from transformers import AutoModel

    assert isinstance(AutoModel.from_pretrained(tmp_path / "gate"), pacer_hf.PacerLookupGate)
    out = target.generate(REPEATING, max_new_tokens=10, do_sample=False, prompt_lookup_num_tokens=6,
                          pacer=str(tmp_path / "gate"))
    assert pacer_hf.last_stats(target).strategy == "pacer-lookup"
    assert torch.equal(out, plain_greedy(target, REPEATING, max_new_tokens=10))


def test_errors_name_the_argument_and_the_fix(targets):
    target = targets["llama"]
    with pytest.raises(ValueError, match="prompt_lookup_num_tokens=4 cannot be combined with pacer='pearl'"):
        target.generate(REPEATING, max_new_tokens=4, prompt_lookup_num_tokens=4, pacer="pearl")
    with pytest.raises(ValueError, match="needs a draft model.*prompt_lookup_num_tokens"):
        target.generate(REPEATING, max_new_tokens=4, pacer="sd-fixed-2")
    with pytest.raises(ValueError, match="round_cost holds the cost of proposing k = 0..10"):
        pacer_hf.PacerLookupGateConfig(decision_rule="expected_gain", round_cost=[1.0, 2.0])
    with pytest.raises(ValueError, match="num_tokens must be >= 1"):
        pacer_hf.LookupConfig(num_tokens=0)
    with pytest.raises(TypeError, match="PacerLookupGate"):
        pacer_hf.attach(target, object())


# -- training ----------------------------------------------------------------------------------------------


def test_examples_label_the_accepted_prefix():
    top_ids = [[3, 8], [4, 5], [9, 5], [1, 2], [2, 7], [3, 4]]  # the target's top-2 on the answer's path
    top_logp = [[-0.1, -2.5], [-0.2, -2.0], [-0.7, -1.0], [-0.1, -3.0], [-0.1, -3.0], [-0.1, -3.0]]
    record = {"key": "k", "category": "c", "heldout": False, "prompt": [1, 2, 3, 4, 5, 1, 2],
              "response": [3, 4, 9, 1, 2, 3], "top_ids": top_ids, "top_logp": top_logp}
    examples = trainer.record_examples(record, max_tokens=4, max_ngram=2)
    # round 0: text ends "1 2" -> proposal "3 4 5 1"; the answer goes "3 4 9 ..." -> 2 accepted
    assert examples["available"][0] == 4 and examples["accepted"][0] == 2
    assert examples["labels"][0].tolist() == [1, 1, 0, 0] and examples["label_mask"][0].tolist() == [1, 1, 1, 0]
    # under sampling: p(3), p(4) on the path, and p(5) at the mismatch (its second choice there)
    assert examples["sampled_labels"][0].tolist() == pytest.approx(np.exp([-0.1, -0.2, -1.0, 0]).tolist() * np.array(
        [1, 1, 1, 0]), abs=1e-6)
    rows = trainer.GateExamples([examples])  # no sampled answers: the greedy path gives the sampling rows too
    matched = int((examples["available"] > 0).sum())
    assert len(rows) == 2 * matched and rows.features[..., 9].sum() == matched * 4
    assert torch.equal(rows.labels[matched:], examples["sampled_labels"][examples["available"] > 0])
    rows = trainer.GateExamples([examples, examples], sampled=[False, True])
    assert len(rows) == 2 * matched and torch.equal(rows.labels[:matched], examples["labels"][examples["available"] > 0])
    assert examples["features"][0, 0, 7] == 1  # first round: no confidence yet
    assert examples["features"][1, 0, 6] == pytest.approx(np.exp(-0.1), abs=1e-6)
    assert examples["features"][..., 9].eq(0).all()  # greedy rows; GateExamples adds the sampling copies


def test_cache_pass_trains_on_the_rounds_an_earlier_answer_matches(tmp_path):
    """The examples' cache pass: an answer that repeats an earlier one (under another prompt) takes its matches
    from the cache, with the cache's features (prompt text at the largest distance) and labels that the answer
    accepts; only those rounds become training rows, and the plain pass is unchanged."""
    rng = np.random.default_rng(0)
    answer = [int(t) for t in rng.permutation(np.arange(100, 160))[:24]]  # no token repeats: no own match
    records = [{"key": f"k{i}", "category": "c", "heldout": False, "prompt": [10 + i, 20 + i, 30 + i],
                "response": answer} for i in range(2)]
    examples = trainer.stage_examples(records, tmp_path, max_tokens=4, max_ngram=2, progress=False)
    plain, first, second = examples["per_record"][0], examples["per_record"][2], examples["per_record"][3]
    assert [r.get("cache", False) for r in examples["records"]] == [False, False, True, True]
    assert not plain["from_cache"].any() and not first["from_cache"].any()  # nothing earlier to match
    assert second["from_cache"][1:].all()  # every round after the first token continues the earlier answer
    r = 5
    assert second["available"][r] == 4 and second["accepted"][r] == 4
    assert second["features"][r, 0, 4] == 1 and second["features"][r, 0, 5] == 1  # a cache match's encoding
    rows = trainer.GateExamples(examples["per_record"])
    assert len(rows) == 2 * int(second["train_rounds"].sum())  # greedy + sampling copies of the cache rounds only
    assert trainer.stage_examples(records, tmp_path, max_tokens=4, max_ngram=2, progress=False,
                                  with_cache=False)["records"] == examples["records"][:2]


def test_trainer_pipeline_on_a_tiny_target(tmp_path):
    """Answers of a tiny model -> examples -> Trainer -> simulated speeds; the gate beats proposing nothing
    on answers that repeat their prompt."""
    target = pacer_hf.enable(build_model("llama", vocab_size=40))
    records = []
    for i in range(12):
        ids = torch.randint(0, 40, (1, 10), generator=torch.Generator().manual_seed(i)).repeat(1, 3)
        answer = target.generate(ids, max_new_tokens=30, do_sample=False, pacer=None)[0, ids.shape[1]:].tolist()
        records.append({"key": str(i), "category": "c", "heldout": i % 4 == 0, "prompt": ids[0].tolist(),
                        "response": answer, "top_logp": [[-0.5]] * len(answer)})
    examples = trainer.stage_examples(records, tmp_path, max_tokens=4, max_ngram=2, progress=False)
    gate = trainer.stage_train(examples, tmp_path, max_tokens=4, max_ngram=2, epochs=3, lr=1e-2, batch_size=32,
                               seed=0, target_name="tiny", vocab_size=40)
    assert (tmp_path / trainer.TRAINED / "config.json").is_file()
    table = trainer.speed_table(gate, examples, [1.0, 1.1, 1.2, 1.3, 1.4], max_tokens=4)
    row = table["c"]
    assert row["oracle"] >= max(v for k, v in row.items() if k != "answers") - 1e-9
    assert row["gate"] > 1.0, row
    costs = trainer.measure_round_cost(target, 4, context=8, repeats=2)
    assert len(costs["round_cost"]) == len(costs["verify_ms"]) == 5 and costs["round_cost"][0] == 1.0
    assert all(ms > 0 for ms in costs["verify_ms"])
    cached = trainer.stage_examples(records, tmp_path, max_tokens=4, max_ngram=2, progress=False)
    assert cached["settings"] == examples["settings"]
    json.dumps(table)


def test_attach_keeps_the_model_state_its_own(targets):
    """An attached gate is a plain attribute: not a submodule, so state_dict and parameters are unchanged."""
    target = targets["gpt2"]
    keys = set(target.state_dict())
    pacer_hf.attach(target, gated(target))
    try:
        assert set(target.state_dict()) == keys and "_pacer_lookup_gate" not in dict(target.named_modules())
    finally:
        del target._pacer_lookup_gate
    assert not hasattr(target, "_pacer_lookup_gate")


def test_gate_loads_as_remote_code_and_runs(targets, tmp_path):
    """save_pretrained writes the model code next to the weights (auto_map): AutoModel with
    trust_remote_code gives a copy of the class from that folder, which pacer= accepts."""
    import subprocess
    import sys

    target = targets["llama"]
    gate = gated(target, decision_rule="expected_gain")
    gate.save_pretrained(tmp_path / "gate")
    assert {"configuration_lookup_gate.py", "modeling_lookup_gate.py"} <= {p.name for p in (tmp_path / "gate").iterdir()}
    code = ("from transformers import AutoModel; import torch; "
            f"m = AutoModel.from_pretrained({str(tmp_path / 'gate')!r}, trust_remote_code=True); "
            "assert type(m).__module__.startswith('transformers_modules'), type(m).__module__; "
            "print(m.survival(torch.zeros(3, 10)).tolist())")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**__import__("os").environ, "HF_MODULES_CACHE": str(tmp_path / "modules")})
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == pytest.approx(gate.survival(torch.zeros(3, 10)).tolist())
    # in this process too (where AutoModel resolves to pacer_hf's registered class): a copy of the class
    # loaded from the folder's code is normalised to pacer_hf's class and decides the same
    from transformers.dynamic_module_utils import get_class_from_dynamic_module

    remote_class = get_class_from_dynamic_module("modeling_lookup_gate.PacerLookupGate", str(tmp_path / "gate"))
    copy = remote_class.from_pretrained(tmp_path / "gate")
    assert type(copy) is not pacer_hf.PacerLookupGate
    # pacer_costs="probe": this machine's costs, without the online refinement that lets decisions drift
    out = target.generate(REPEATING, max_new_tokens=12, do_sample=False, prompt_lookup_num_tokens=6, pacer=copy,
                          pacer_costs="probe")
    lengths = pacer_hf.last_stats(target).draft_lengths
    again = target.generate(REPEATING, max_new_tokens=12, do_sample=False, prompt_lookup_num_tokens=6, pacer=gate,
                            pacer_costs="probe")
    assert torch.equal(out, again) and pacer_hf.last_stats(target).draft_lengths == lengths


def test_shipped_gate_code_is_the_package_code_and_loads():
    """hub_cards/smollm2-lookup-gate carries the model code for trust_remote_code: it must be pacer_hf's own."""
    from pathlib import Path

    from pacer_hf._paths import hub_cards_dir

    folder = hub_cards_dir() / "smollm2-lookup-gate"
    package = Path(pacer_hf.__file__).parent
    for name in ("configuration_lookup_gate.py", "modeling_lookup_gate.py"):
        assert (folder / name).read_text() == (package / name).read_text(), f"{name}: re-save the shipped gate"
    gate = pacer_hf.PacerLookupGate.from_pretrained(folder)
    assert gate.config.decision_rule == "expected_gain" and len(gate.config.round_cost) == 11
    assert gate.config.vocab_size == 49152


def test_default_gate_is_shipped_with_its_card_and_no_cost_table():
    """hub_cards/default-lookup-gate: trained on two targets' answers, no training machine's costs (generate
    measures them), and its card is what the trainer writes from its config."""
    from pacer_hf._paths import hub_cards_dir
    from pacer_hf.recipes.lookup_gate_card import write_card

    gate = pacer_hf.default_lookup_gate()
    assert gate is pacer_hf.default_lookup_gate(), "loaded once per process"
    config = gate.config
    assert config.decision_rule == "expected_gain" and config.round_cost is None and config.vocab_size is None
    assert config.training["targets"] == ["smollm2", "stdlib"]
    assert set(config.training["simulated_speed_target_left_out"]) == {"smollm2", "stdlib"}
    folder = hub_cards_dir() / "default-lookup-gate"
    package = Path(pacer_hf.__file__).parent
    for name in ("configuration_lookup_gate.py", "modeling_lookup_gate.py"):
        assert (folder / name).read_text() == (package / name).read_text(), f"{name}: re-save the shipped gate"
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        write_card(Path(tmp) / "README.md", config, trainer.TARGETS)
        assert (Path(tmp) / "README.md").read_text() == (folder / "README.md").read_text()


def test_stdlib_prompts_never_come_from_benchmark_files():
    from pacer_hf._paths import hub_cards_dir
    from pacer_hf.data.prompts import pair_held_out_files, stdlib_test_files

    splits = hub_cards_dir() / "demo-target" / "corpus_splits.json"
    tokenizer = pacer_hf.pairs.load_demo_pair(hub_cards_dir())[2]
    prompts = trainer.stdlib_prompts(tokenizer, splits, n=30, prompt_tokens=64)
    assert prompts == trainer.stdlib_prompts(tokenizer, splits, n=30, prompt_tokens=64), "deterministic"
    benchmarked = {p.name for p in stdlib_test_files()}
    held_out = set(pair_held_out_files(hub_cards_dir() / "demo-target"))
    categories = {category for _, category, _ in prompts}
    assert categories == {"stdlib-train", "stdlib-tests"}
    for key, _, ids in prompts:
        path = key.split("/", 1)[1].rsplit("@", 1)[0]
        assert len(ids) == 64 and path not in held_out and Path(path).name not in benchmarked


def test_numpy_scorer_equals_the_torch_forward(targets):
    """Generation scores with GateScorer (numpy); its survival probabilities are the gate's own."""
    gate = gated(targets["llama"], max_lookup_tokens=10)
    features = torch.rand(10, 10, generator=torch.Generator().manual_seed(0)) * 2 - 0.5
    assert gate.scorer().survival(features.numpy()) == pytest.approx(gate.survival(features).tolist(), abs=1e-6)
    shipped = pacer_hf.default_lookup_gate()
    assert shipped.scorer().survival(features.numpy()) == pytest.approx(shipped.survival(features).tolist(), abs=1e-6)


def test_lookup_forwards_the_draft_rounds_to_the_draft_generator():
    """In lookup with a draft, a round the draft proposed ends in the draft generator's update_candidate_strategy
    (its cost refinement, its loop features, its record of the round), and a lookup round does not."""
    from transformers import GenerationConfig

    from pacer_hf.strategies.lookup import LookupCandidateGenerator, LookupStats

    stats = LookupStats(strategy="lookup-4")

    class Drafting:  # records what reaches it; proposes one token, records the outcome as the real one does
        def __init__(self):
            self.updates = []

        def get_candidates(self, input_ids, **kwargs):
            stats.target_forwards += 1
            stats.draft_lengths.append(1)
            return torch.cat((input_ids, input_ids[:, -1:]), 1), None

        def update_candidate_strategy(self, input_ids, scores, num_matches):
            self.updates.append(int(num_matches))
            stats.accepted.append(int(num_matches))

    drafting = Drafting()
    generator = LookupCandidateGenerator(GenerationConfig(max_length=64), num_tokens=4, max_ngram=2, gate=None,
                                         stats=stats, drafting=drafting)
    scores = torch.zeros(1, 5, 11)
    no_match = torch.tensor([[1, 2, 3, 4, 5]])
    ids, _ = generator.get_candidates(no_match)  # no lookup match: the draft proposes
    generator.update_candidate_strategy(ids, scores, 1)
    assert drafting.updates == [1], "the draft's round reached the draft generator"
    match = torch.tensor([[1, 2, 3, 1, 2]])  # "1 2" seen before: lookup proposes "3 1 2"
    ids, _ = generator.get_candidates(match)
    generator.update_candidate_strategy(ids, scores, 0)
    assert drafting.updates == [1], "a lookup round stays with lookup"
    assert stats.accepted == [1, 0] and len(stats.accepted) == len(stats.draft_lengths)
