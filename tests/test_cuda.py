"""The decode path on CUDA: greedy output equals the target alone, for every strategy, on models built from
configs (float64, so any difference is a logic bug), on the shipped demo pair, in float16 and bfloat16, in
left-padded batches whose rows end at their own EOS, on a sliding-window and an MoE family; the round-cost
probe waits for the device. Marked `cuda` (`pytest -m cuda`); skipped where torch sees no CUDA device.
"""

from __future__ import annotations

import pytest
import torch
from conftest import make_lookup_gate, make_preverifier
from cuda_support import (
    CASES,
    DEVICE,
    REPEATS,
    assert_same_greedy,
    config_pair,
    needs_cuda,
    ready,
    speculative,
    uses_preverifier,
)
from families import BATTERY, LOOKUP_PROMPT, noisy_copy, run_case, tiny_model
from test_batch import LENGTHS, batched_greedy, early_eos, left_padded
from test_batch import speculative as batch_speculative

import pacer_hf

pytestmark = needs_cuda
PROMPT = torch.tensor([REPEATS])
DEMO_TEXTS = ("def parse_args(argv):\n    parser = argparse.ArgumentParser(", "class Queue:\n    def __init__(self")


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("arch", ["llama", "gpt2", "qwen2"])
@pytest.mark.parametrize("kind", ["noisy", "random"])
def test_greedy_identical_on_config_models(case, arch, kind):
    target, draft = config_pair(arch, kind)
    ids = PROMPT.to(DEVICE)
    expected = target.generate(ids, max_new_tokens=24, do_sample=False, pacer=None)
    with ready(target, draft, case):
        for loop in ("lean", "transformers"):
            out = speculative(target, draft, case, ids, 24, do_sample=False, pacer_loop=loop)
            assert out.device.type == torch.device(DEVICE).type and torch.equal(out, expected), (case, loop)
    assert pacer_hf.last_stats(target).new_tokens == 24


@pytest.mark.parametrize("rule", ["block", "expected_gain"])
def test_preverifier_left_on_the_cpu_scores_a_cuda_draft(rule):
    """A pre-verifier not moved with its draft: the torch path scores the draft's CUDA tensors (the compiled
    CPU scorer cannot read them), and the output is still exact."""
    target, draft = config_pair("llama", "noisy")
    ids = PROMPT.to(DEVICE)
    expected = target.generate(ids, max_new_tokens=20, do_sample=False, pacer=None)
    calibration = {"draft_cost": 0.1, "verify_cost": [1.0 + 0.1 * k for k in range(9)], "round_overhead": 0.1}
    extra = {"decision_rule": rule, "calibration": calibration} if rule == "expected_gain" else {}
    with ready(target, draft, "pacer", preverifier_device="cpu", **extra):
        out = speculative(target, draft, "pacer", ids, 20, do_sample=False)
    assert torch.equal(out, expected)
    assert pacer_hf.last_stats(target).preverifier_seconds > 0


@pytest.fixture(scope="module")
def demo():
    """The shipped demo pair on the device in float32, its pre-verifier with it, and two tokenized prompts."""
    from pacer_hf.pairs import load_pair

    pair = load_pair("stdlib")
    pair.target.to(DEVICE), pair.draft.to(DEVICE)
    ids = [pair.tokenizer(text, return_tensors="pt")["input_ids"].to(DEVICE) for text in DEMO_TEXTS]
    return pair, ids


@pytest.mark.parametrize("case", CASES)
def test_greedy_identical_on_the_demo_pair(demo, case):
    pair, prompts = demo
    for ids in prompts:
        expected = pair.target.generate(ids, max_new_tokens=48, do_sample=False, pacer=None)
        with ready(pair.target, pair.draft, case, preverifier=pair.preverifier):
            out = speculative(pair.target, pair.draft, case, ids, 48, do_sample=False)
        assert_same_greedy(pair.target, out, expected, near_tie=1e-3, what=f"demo pair, {case}")
    if uses_preverifier(case) or case == "sd-fixed-3":
        assert pacer_hf.last_stats(pair.target).tau > 1.0, "the demo draft must get tokens accepted"


def test_default_preverifier_greedy_identical_on_the_demo_pair(demo):
    """`pacer=True` with no pre-verifier attached: the default one (features only) scores on the draft's device."""
    from pacer_hf.attached import detach, reattach

    pair, prompts = demo
    taken = detach(pair.draft)
    try:
        for ids in prompts:
            expected = pair.target.generate(ids, max_new_tokens=48, do_sample=False, pacer=None)
            out = pair.target.generate(ids, max_new_tokens=48, do_sample=False, assistant_model=pair.draft,
                                       pacer=True)
            assert_same_greedy(pair.target, out, expected, near_tie=1e-3, what="demo pair, default pre-verifier")
        stats = pacer_hf.last_stats(pair.target)
    finally:
        reattach(pair.draft, taken)
    assert stats.preverifier == "default" and stats.tau > 1.0, stats


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("case", ["sd-fixed-3", "pacer", "pacer+ouroboros", "pearl"])
def test_half_precision_greedy_identical_to_the_same_dtype_alone(dtype, case):
    """Config models in half precision (decisive logits: strict) and the demo pair (a near-tie may flip)."""
    from pacer_hf.pairs import load_pair

    target, draft = config_pair("llama", "noisy", dtype)
    ids = PROMPT.to(DEVICE)
    with ready(target, draft, case):
        out = speculative(target, draft, case, ids, 24, do_sample=False)
    assert out.device.type == torch.device(DEVICE).type and target.dtype == dtype
    assert torch.equal(out, target.generate(ids, max_new_tokens=24, do_sample=False, pacer=None)), case
    pair = load_pair("stdlib", dtype=dtype)
    pair.target.to(DEVICE), pair.draft.to(DEVICE)
    ids = pair.tokenizer(DEMO_TEXTS[0], return_tensors="pt")["input_ids"].to(DEVICE)
    expected = pair.target.generate(ids, max_new_tokens=40, do_sample=False, pacer=None)
    with ready(pair.target, pair.draft, case, preverifier=pair.preverifier):
        out = speculative(pair.target, pair.draft, case, ids, 40, do_sample=False)
    assert_same_greedy(pair.target, out, expected, near_tie=0.25, what=f"demo pair in {dtype}, {case}")


@pytest.mark.parametrize("strategy", ["sd-fixed-3", "pacer", "ouroboros", "pacer+ouroboros"])
@pytest.mark.parametrize("cache", ["mask", "compact"])
def test_batch_rows_end_at_their_own_eos(strategy, cache):
    """Left-padded rows of different lengths; one row's EOS ends it early and it leaves the batch; every row
    equals the target's own batched generate (EOS and padding included), on the device."""
    target, draft = config_pair("qwen2", "noisy")
    ids, mask = (tensor.to(DEVICE) for tensor in left_padded(LENGTHS, seed=5))
    eos, eos_row = early_eos(batched_greedy(target, ids, mask, max_new_tokens=14), ids.shape[1])
    expected = batched_greedy(target, ids, mask, max_new_tokens=14, eos_token_id=eos)
    with ready(target, draft, strategy):
        out = batch_speculative(target, draft, ids, mask, strategy, max_new_tokens=14, eos_token_id=eos,
                                pacer_batch_cache=cache)
    assert out.device.type == torch.device(DEVICE).type and torch.equal(out, expected)
    stats = pacer_hf.last_stats(target)
    assert stats.rows[eos_row].target_forwards < stats.target_forwards, "the EOS row must end first"


@pytest.mark.parametrize("family", ["mistral", "qwen2_moe"])
def test_window_and_moe_families_exact(family):
    """mistral: a sliding window on every layer (the cache rolls back inside the window); qwen2_moe: experts
    (float32: grouped expert kernels). Every strategy of the family battery equals the target alone."""
    dtype = torch.float32 if family == "qwen2_moe" else torch.float64
    target = tiny_model(family, dtype=dtype)
    draft = noisy_copy(target).to(DEVICE)
    target = pacer_hf.enable(target.to(DEVICE))
    pacer_hf.attach(target, make_lookup_gate(target).to(DEVICE))
    pacer_hf.attach(draft, make_preverifier(draft, block_size=2, threshold=0.5, max_draft_tokens=6).to(DEVICE, dtype))
    ids = LOOKUP_PROMPT.to(DEVICE)
    expected = target.generate(ids, max_new_tokens=30, do_sample=False, pacer=None)
    for label, pacer, kwargs in BATTERY:
        assert torch.equal(run_case(target, draft, pacer, ids, 30, **kwargs), expected), f"{family}: {label}"
    ids, mask = (tensor.to(DEVICE) for tensor in left_padded(LENGTHS, seed=2))
    for strategy in ("sd-fixed-3", "pacer"):
        out = batch_speculative(target, draft, ids, mask, strategy, max_new_tokens=20)
        assert torch.equal(out, batched_greedy(target, ids, mask, max_new_tokens=20)), f"{family}: batch {strategy}"


def test_round_cost_probe_waits_for_the_device(monkeypatch, tmp_path):
    """The probe's timings synchronize CUDA around every timed forward, and what a call decided by expected gain
    reports was measured on the device."""
    from pacer_hf.costs import measure, round_costs

    monkeypatch.setattr(round_costs, "_PROCESS", {})
    monkeypatch.setattr(round_costs, "_FORWARDS", {})
    monkeypatch.setenv(round_costs.COST_CACHE_ENV, str(tmp_path / "costs.json"))
    target, draft = config_pair("llama", "noisy", torch.float32)
    synced, real = [], torch.cuda.synchronize
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: (synced.append(1), real(*a, **k))[1])
    seconds = measure.time_forwards(target, 4, budget_s=0.5)
    assert len(seconds) == 4 and all(0 < s < 1 for s in seconds)
    if DEVICE == "cuda":
        assert len(synced) >= 2 * 5, "two synchronizations per timed forward (warm-up included)"
    calibration = {"draft_cost": 0.1, "verify_cost": [1.0 + 0.1 * k for k in range(9)], "round_overhead": 0.1}
    ids = PROMPT.to(DEVICE)
    expected = target.generate(ids, max_new_tokens=16, do_sample=False, pacer=None)
    with ready(target, draft, "pacer", decision_rule="expected_gain", calibration=calibration, block_size=1):
        out = speculative(target, draft, "pacer", ids, 16, do_sample=False)
    stats = pacer_hf.last_stats(target)
    assert torch.equal(out, expected) and stats.costs["source"].startswith("probe")
    assert stats.costs["device"].startswith(DEVICE) and stats.costs["draft_token_ms"] > 0


@pytest.mark.skipif(DEVICE != "cuda", reason="CUDA graphs need a CUDA device")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("loop", [False, True], ids=["draft-only", "loop-features"])
@pytest.mark.parametrize("rows", [1, 3])
@pytest.mark.parametrize("mode", ["both", "features"])
def test_graph_scorer_scores_like_the_eager_forward(dtype, loop, rows, mode):
    """The CUDA-graph path (`GraphBlockScorer`) returns the eager forward's logits block by block, round after
    round (its graphs captured once and replayed), for one row and for a batch's rows; a features-only
    pre-verifier (the default one) takes hidden states of any width and reads none."""
    from pacer_hf.loops.block_scorer import BlockScorer, GraphBlockScorer

    _, draft = config_pair("llama", "noisy")
    pv = make_preverifier(draft, block_size=2, max_draft_tokens=6, loop_features=loop, input_mode=mode)
    pv = pv.to(DEVICE, dtype)
    width = pv.config.draft_hidden_size + (8 if mode == "features" else 0)
    graph, eager = GraphBlockScorer.for_preverifier(pv), BlockScorer(pv)
    generator = torch.Generator().manual_seed(0)
    for _ in range(3):  # rounds: captured once, then replayed
        loops = torch.rand(rows, 3, generator=generator).tolist()
        graph.start(loops)
        eager.start(loops)
        for i in range(6):
            hidden = torch.randn(rows, width, generator=generator).to(DEVICE, dtype)
            logits = (torch.randn(rows, 96, generator=generator) * 3).to(DEVICE, dtype)
            tokens = logits.argmax(-1)
            got, want = graph.add(hidden, logits, tokens), eager.add(hidden, logits, tokens)
            assert (got is None) == (want is None) == (i % 2 == 0)
            if got is not None:
                torch.testing.assert_close(torch.tensor(got), torch.tensor(want), atol=1e-4, rtol=0)
        assert len(graph.graphs) == 3  # one per block index (rows padded to 1 or 4), captured in the first round
        assert graph.take_seconds(graph.waited) > 0, "the graphs' device time counts as the scorer's own"
    assert GraphBlockScorer.for_preverifier(pv) is graph
    assert GraphBlockScorer.for_preverifier(pv.to(torch.float32 if dtype == torch.float64 else torch.float64)) is not graph


@pytest.mark.skipif(DEVICE != "cuda", reason="CUDA graphs need a CUDA device")
def test_stop_rule_scores_with_graphs_where_draft_and_preverifier_share_the_device():
    from pacer_hf.loops.stop_rule import PacerStopRule
    from pacer_hf.stats import PacerStats

    _, draft = config_pair("llama", "noisy")
    pv = make_preverifier(draft).double()
    assert PacerStopRule(pv.to(DEVICE), PacerStats("t"), draft_device=draft.device).path == "graph"
    assert PacerStopRule(pv.cpu(), PacerStats("t"), draft_device=draft.device).path == "torch"
    assert PacerStopRule(pv.cpu(), PacerStats("t")).path == "compiled"
