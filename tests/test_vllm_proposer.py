"""PacerLookupProposer's logic without vLLM: the step-cost curve, the batch allocation, the online calibration, and
the proposer driven through vLLM's call contract by a simulated engine (tests/test_vllm_engine.py runs it in vLLM)."""

from __future__ import annotations

import itertools
import json
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pacer_hf
from pacer_hf.costs.step_costs import EXPLORE_SLOPE
from pacer_hf.loops.online_calibration import OnlineCalibration
from pacer_hf.modeling_lookup_gate import find_lookup
from pacer_hf.vllm import GATE_ENV, STATS_ENV, PacerLookupProposer, StepCosts, allocate, check_environment
from pacer_hf.vllm.bench import markdown, speculative_config, summarize


def linear_costs(intercept: float, slope: float, sizes=range(1, 40)) -> StepCosts:
    costs = StepCosts()
    for n in sizes:
        for _ in range(3):
            costs.observe(n, intercept + slope * n)
    return costs


def test_step_costs_before_and_after_measuring():
    costs = StepCosts()
    assert not costs.samples and costs.seconds(5) == 5.0  # flat per token: nothing pays before a measurement
    assert not costs.token_can_pay(1)
    costs.observe(2, 0.010)
    # one size measured: the exploration prior, each extra token EXPLORE_SLOPE of the per-token time
    assert costs.seconds(2) == pytest.approx(0.010)
    assert costs.seconds(3) == pytest.approx(0.010 + EXPLORE_SLOPE * 0.005)
    assert costs.token_can_pay(2)


def test_step_costs_follow_the_measured_curve():
    costs = linear_costs(0.008, 0.001, sizes=(1, 2, 4, 8))
    assert costs.seconds(4) == pytest.approx(0.012)  # a measured size: its median
    assert costs.seconds(6) == pytest.approx(0.014)  # between measured sizes: the fitted line
    assert costs.seconds(20) == pytest.approx(0.028)  # beyond: the line too
    for _ in range(3):
        costs.observe(5, 0.030)  # a slow size: measured medians win, and larger sizes are never cheaper
    assert costs.seconds(5) == pytest.approx(0.030)
    assert all(costs.seconds(n) >= 0.030 for n in range(6, 12))
    assert costs.table()[5] == {"median_s": pytest.approx(0.030), "steps": 3}


def test_step_costs_median_is_robust_to_an_outlier():
    costs = linear_costs(0.008, 0.001, sizes=(1, 2))
    costs.observe(2, 5.0)
    costs.observe(2, 0.010)
    costs.observe(2, 0.010)
    costs.observe(2, 0.010)
    assert costs.seconds(2) < 0.011


def padded(rows: list[list[float]], width: int = 4) -> np.ndarray:
    out = np.zeros((len(rows), width))
    for r, row in enumerate(rows):
        out[r, : len(row)] = row
    return out


def rate(survival, counts, rows, costs):
    tokens = rows + sum(sum(row[:k]) for row, k in zip(survival, counts))
    return tokens / costs.seconds(rows + sum(counts))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.floats(0.01, 1.0), min_size=0, max_size=3), min_size=1, max_size=3),
       st.floats(0.0, 0.02), st.integers(0, 2))
def test_allocate_is_the_best_step(raw, slope, idle_rows):
    survival = [list(np.cumprod(row)) for row in raw]  # running products: non-increasing per row
    rows = len(survival) + idle_rows
    costs = linear_costs(0.01, slope)
    counts = allocate(padded(survival), rows, costs).tolist()
    assert all(0 <= k <= len(row) for k, row in zip(counts, survival))
    best = max(rate(survival, combo, rows, costs)
               for combo in itertools.product(*(range(len(row) + 1) for row in survival)))
    assert rate(survival, counts, rows, costs) == pytest.approx(best, rel=1e-9)


def test_allocate_follows_the_batch():
    """The same drafts pay at batch 1 on a curve that is flat there, and not once the step is compute-bound."""
    survival = [[0.6, 0.4, 0.3]]
    flat = linear_costs(0.010, 0.0002)
    assert allocate(padded(survival), 1, flat).tolist() == [3]
    steep = linear_costs(0.0, 0.010)  # every token costs as much as a row's own token: no draft below 1 pays
    assert allocate(padded(survival * 8), 8, steep).tolist() == [0] * 8
    assert not steep.token_can_pay(8)
    assert allocate(padded([[1.0, 1.0]]), 1, steep).tolist() == [0]  # ties go to proposing less


def test_calibration_learns_the_served_target():
    rng = np.random.default_rng(0)
    calibration = OnlineCalibration()
    for _ in range(600):
        z = rng.normal(1.0, 2.0, size=4)
        true = 1 / (1 + np.exp(-(0.5 * z - 1.0)))  # the target accepts less often than the gate believes
        accepted = 0
        while accepted < 4 and rng.random() < true[accepted]:
            accepted += 1
        calibration.update(z, accepted)
    assert calibration.scale == pytest.approx(0.5, abs=0.15)
    assert calibration.shift == pytest.approx(-1.0, abs=0.25)
    assert calibration.labels > 600


def vllm_config(k: int = 10, max_model_len: int = 4096, extra: dict | None = None) -> SimpleNamespace:
    return SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=k),
                           model_config=SimpleNamespace(max_model_len=max_model_len), additional_config=extra or {})


class FakeEngine:
    """vLLM's side of the contract: a token buffer per row, the target's true continuation, acceptance of the
    longest matching prefix of each row's drafts plus one token, rows that join in prefill and rows that move."""

    def __init__(self, texts: list[list[int]], max_model_len: int = 4096):
        self.full = [list(t) for t in texts]  # each row's whole text; the first 12 tokens are the prompt
        self.length = [0] * len(texts)
        self.buffer = np.zeros((len(texts), max_model_len), dtype=np.int32)

    def add(self, row: int, prompt: int) -> None:
        self.length[row] = prompt + 1
        self.buffer[row, : prompt + 1] = self.full[row][: prompt + 1]

    def step(self, drafts: list[list[int]]) -> list[list[int]]:
        sampled = []
        for row, draft in enumerate(drafts):
            n = self.length[row]
            if n == 0:
                sampled.append([])
                continue
            truth = self.full[row][n: n + len(draft) + 1]
            accepted = next((j for j, (a, b) in enumerate(zip(draft, truth)) if a != b), min(len(draft), len(truth) - 1))
            new = truth[: accepted + 1]
            self.buffer[row, n: n + len(new)] = new
            self.length[row] = n + len(new)
            sampled.append(new)
        return sampled

    def swap(self, a: int, b: int) -> None:
        self.buffer[[a, b]] = self.buffer[[b, a]]
        self.length[a], self.length[b] = self.length[b], self.length[a]
        self.full[a], self.full[b] = self.full[b], self.full[a]


def repetitive(seed: int, length: int = 400) -> list[int]:
    rng = np.random.default_rng(seed)
    phrase = list(rng.integers(5, 60, size=9))
    return [int(t) for t in itertools.islice(itertools.cycle(phrase + [int(rng.integers(5, 60))]), length)]


def test_proposer_drafts_are_lookup_prefixes_and_pay_on_repetitive_text():
    proposer = PacerLookupProposer(vllm_config(k=6))
    engine = FakeEngine([repetitive(0), repetitive(1)])
    engine.add(0, 12)
    engine.add(1, 12)
    sampled = [[engine.full[0][12]], [engine.full[1][12]]]
    for _ in range(40):
        drafts = proposer.propose(sampled, np.array(engine.length), engine.buffer)
        for row, draft in enumerate(drafts):
            n = engine.length[row]
            assert len(draft) <= 6
            if draft:
                match = find_lookup(engine.buffer[row, :n], 6, proposer.max_ngram)
                assert draft == match.tokens[: len(draft)].tolist()
        proposer.costs.observe(2, 0.010)  # steps are instant here: give the rule a measured, cheap curve
        sampled = engine.step(drafts)
    stats = proposer.stats
    assert stats.proposed > 40 and stats.accepted / stats.proposed > 0.8  # a repeated phrase: long accepted drafts
    assert proposer.calibration.labels > 0
    assert sum(stats.proposed_by_batch.values()) == stats.proposed
    assert sum(stats.accepted_by_batch.values()) == stats.accepted and set(stats.accepted_by_batch) <= set(
        stats.proposed_by_batch), "acceptances are filed under the batch size the drafts were proposed at"


def test_proposer_times_the_batch_own_size_before_drafting_there():
    """Drafts are judged against the plain step at the batch's own size: where the engine never timed it (a busy
    batch drafts in every step, so every timed step is larger), the proposer proposes nothing in clean steps until
    that size has its own measurements, then drafts by the curve."""
    proposer = PacerLookupProposer(vllm_config(k=6))
    proposer.costs = linear_costs(0.010, 0.00001, sizes=range(3, 40))
    engine = FakeEngine([repetitive(0), repetitive(1)])
    engine.add(0, 12)
    engine.add(1, 12)
    sampled = [[engine.full[0][12]], [engine.full[1][12]]]
    counts = []
    for _ in range(4):
        drafts = proposer.propose(sampled, np.array(engine.length), engine.buffer)
        counts.append(sum(map(len, drafts)))
        sampled = engine.step(drafts)
    assert counts[0] > 0 and counts[1:] == [0, 0, 0], "new rows: no clean step to time; then three plain steps"
    proposer.propose(sampled, np.array(engine.length), engine.buffer)
    assert proposer.costs.measured(2)
    for _ in range(70):  # plain steps as a real engine times them (these are instant); past a refit
        proposer.costs.observe(2, 0.010 + 0.00001 * 2)
    drafts = proposer.propose(engine.step([[], []]), np.array(engine.length), engine.buffer)
    assert sum(map(len, drafts)) > 0


def test_proposer_follows_rows_that_move_and_skips_rows_in_prefill():
    proposer = PacerLookupProposer(vllm_config())
    engine = FakeEngine([repetitive(2), repetitive(3), repetitive(4)])
    engine.add(0, 12)
    engine.add(1, 20)
    sampled = [[engine.full[0][12]], [engine.full[1][20]], []]  # row 2 is still in prefill
    drafts = proposer.propose(sampled, np.array(engine.length), engine.buffer)
    assert drafts[2] == []
    assert proposer._pending_tokens is None  # a row in prefill: the next step is not a clean timing sample
    sampled = engine.step(drafts)
    engine.swap(0, 1)  # vLLM condenses and reorders its batch: rows are followed by content, not index
    sampled[0], sampled[1] = sampled[1], sampled[0]
    proposer.propose(sampled, np.array(engine.length), engine.buffer)
    prompts = sorted(row.prompt_length for row in proposer._rows.values())
    assert prompts == [12, 20]


def test_proposer_respects_max_model_len_and_spec_tokens():
    proposer = PacerLookupProposer(vllm_config(k=3, max_model_len=40))
    proposer.costs = linear_costs(0.010, 0.00001)
    engine = FakeEngine([repetitive(5)], max_model_len=40)
    engine.add(0, 12)
    sampled = [[engine.full[0][12]]]
    for _ in range(30):
        if engine.length[0] >= 39:
            break
        drafts = proposer.propose(sampled, np.array(engine.length), engine.buffer)
        assert len(drafts[0]) <= 3 and engine.length[0] + len(drafts[0]) < 40
        sampled = engine.step(drafts)


def test_proposer_stats_file(tmp_path, monkeypatch):
    path = tmp_path / "stats.json"
    monkeypatch.setenv(STATS_ENV, str(path))
    proposer = PacerLookupProposer(vllm_config())
    engine = FakeEngine([repetitive(6)])
    engine.add(0, 12)
    proposer.propose([[engine.full[0][12]]], np.array(engine.length), engine.buffer)
    proposer.write_stats()
    stats = json.loads(path.read_text())
    assert stats["steps"] == 1 and "step_costs" in stats and "calibration" in stats


def test_proposer_gate_from_env_and_errors(tmp_path, monkeypatch):
    gate = pacer_hf.default_lookup_gate()
    gate.save_pretrained(tmp_path / "gate")
    monkeypatch.setenv(GATE_ENV, str(tmp_path / "gate"))
    assert PacerLookupProposer(vllm_config()).gate.config.max_lookup_tokens == gate.config.max_lookup_tokens
    monkeypatch.setenv(GATE_ENV, str(tmp_path / "missing"))
    with pytest.raises(ValueError, match=GATE_ENV):
        PacerLookupProposer(vllm_config())
    monkeypatch.delenv(GATE_ENV)
    with pytest.raises(ValueError, match="additional_config"):
        PacerLookupProposer(vllm_config(extra={"pacer_hf": {"gate": str(tmp_path / "missing")}}))
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        PacerLookupProposer(vllm_config(k=0))


def test_environment_check_names_the_fix():
    try:
        import vllm  # noqa: F401
    except ImportError:
        problems = check_environment(raise_error=False)
        assert any("pacer-hf[vllm]" in p for p in problems)
        with pytest.raises(ValueError, match="pacer-hf"):
            check_environment()
    else:  # the vLLM lane: its environment is one where vLLM loads models
        assert check_environment(raise_error=False) == []


def test_bench_configs_and_summary():
    assert speculative_config("none") is None
    assert speculative_config("ngram-5")["num_speculative_tokens"] == 5
    assert speculative_config("pacer", 7) == {"method": "custom_class", "model": "pacer_hf.vllm.PacerLookupProposer",
                                              "num_speculative_tokens": 7}
    assert speculative_config("custom:examples.Mine:4") == {"method": "custom_class", "model": "examples.Mine",
                                                            "num_speculative_tokens": 4}
    with pytest.raises(ValueError, match="unknown vLLM method"):
        speculative_config("eagle")
    base = {"outputs": [[1, 2], [3, 4]], "alone_seconds": [[1.0, 3.0], [1.0, 1.0]], "batch_outputs": [[1, 2], [3, 4]],
            "batch_seconds": [2.0]}
    fast = dict(base, alone_seconds=[[0.5], [0.5]], batch_outputs=[[1, 2], [3, 5]])
    summary = summarize({"none": base, "pacer": fast}, {"a": [0], "b": [1]})
    assert summary["alone"]["none"]["a"] == pytest.approx(1.0)  # 2 tokens / median(1, 3) s
    assert summary["alone"]["pacer"]["a"] == pytest.approx(4.0)
    assert summary["differs"]["pacer"] == {"alone": 0, "batch": 1}
    text = markdown(summary, {"none": base, "pacer": fast},
                    {"model_name": "m", "command": "c", "machine": "x", "vllm": "0", "transformers": "0", "prompts": 2,
                     "max_new_tokens": 2, "runs": 1})
    assert "| a | 1.0 (1.00×) | 4.0 (4.00×) |" in text and "pacer 0/1" in text


def test_bench_cli_without_vllm_fails_clearly(capsys):
    try:
        import vllm  # noqa: F401
        pytest.skip("vLLM is installed here")
    except ImportError:
        pass
    from pacer_hf.cli import main

    assert main(["bench", "--engine", "vllm", "--out", "unused"]) == 2
    assert "pacer-hf[vllm]" in capsys.readouterr().err


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(0, 6), min_size=2, max_size=120), st.integers(1, 10), st.integers(1, 4),
       st.integers(0, 60))
def test_compiled_gate_equals_the_reference(text, room, max_ngram, prompt_length):
    """kernels.lookup_logits == find_lookup + feature_rows + GateScorer (the generate path's single source)."""
    from pacer_hf.modeling_lookup_gate import feature_rows
    from pacer_hf.vllm.kernels import CompiledGate

    gate = pacer_hf.default_lookup_gate()
    scorer = gate.scorer()
    compiled = CompiledGate(scorer, 2, 10)
    ids = np.array([text, text], dtype=np.int32)
    n = len(text)
    compiled.run(ids, np.array([n, n], dtype=np.int64), np.array([1], dtype=np.int64), np.array([0, room]),
                 np.array([0, prompt_length], dtype=np.int64), max_ngram, gate.config.max_lookup_tokens, 0.9)
    match = find_lookup(np.array(text), room, max_ngram)
    if match is None:
        assert compiled.counts[1] == 0
        return
    k = match.tokens.shape[0]
    assert compiled.counts[1] == k and compiled.tokens[1, :k].tolist() == match.tokens.tolist()
    features = feature_rows(match, n, prompt_length, 0.9, gate.config.max_lookup_tokens, max_ngram)
    p = np.clip(scorer.accept_probabilities(features), 1e-6, 1 - 1e-6)  # the kernel's MAX_LOGIT
    reference = np.log(p / (1 - p))
    np.testing.assert_allclose(compiled.logits[1, :k], reference, atol=2e-4)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.floats(-6.0, 6.0), min_size=0, max_size=4), min_size=1, max_size=4),
       st.floats(0.0, 0.02), st.floats(0.3, 2.0), st.floats(-2.0, 2.0))
def test_compiled_choice_equals_allocate(raw, slope, scale, shift):
    from pacer_hf.loops.online_calibration import OnlineCalibration
    from pacer_hf.vllm.kernels import CompiledGate

    compiled = CompiledGate(pacer_hf.default_lookup_gate().scorer(), len(raw), 4)
    available = np.array([len(row) for row in raw], dtype=np.int64)
    for r, row in enumerate(raw):
        compiled.logits[r, : len(row)] = row
    calibration = OnlineCalibration()
    calibration.scale, calibration.shift = scale, shift
    survival = np.cumprod(calibration.apply(compiled.logits[: len(raw)]) * (np.arange(4) < available[:, None]), axis=1)
    costs = linear_costs(0.01, slope)
    rows = len(raw)
    counts = compiled.choose(available, scale, shift, costs.curve(rows + int(available.sum())), rows)
    expected = allocate(survival, rows, costs)
    assert rate(survival.tolist(), counts.tolist(), rows, costs) == pytest.approx(
        rate(survival.tolist(), expected.tolist(), rows, costs), rel=1e-9)
