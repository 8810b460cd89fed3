"""Which pre-verifier path runs where, decided without a GPU: the compiled scorer (numba, CPU-only) reads the
draft's tensors as numpy arrays, so it serves a draft on the CPU only; a draft elsewhere takes the torch path,
whichever device the pre-verifier is on. And the bench's clock waits for CUDA's queued work."""

from __future__ import annotations

import pytest
import torch
from conftest import build_draft, build_model, make_preverifier

import pacer_hf
from pacer_hf.loops.stop_rule import PacerStopRule
from pacer_hf.stats import PacerStats


@pytest.mark.parametrize(("draft_device", "compiled"), [(None, True), ("cpu", True), ("cuda", False),
                                                         ("cuda:1", False), ("mps", False)])
def test_compiled_scorer_only_for_a_draft_on_the_cpu(draft_device, compiled):
    draft = build_draft(build_model("llama"), "noisy")
    device = torch.device(draft_device) if draft_device else None
    stop = PacerStopRule(make_preverifier(draft), PacerStats(strategy="t"), draft_device=device)
    assert (stop.scorer is not None) == compiled


def test_torch_path_scores_like_the_compiled_one():
    """The path a CUDA draft takes, run on the CPU: the same decisions as the compiled scorer."""
    target = pacer_hf.enable(build_model("llama"))
    draft = build_draft(target, "noisy")
    pv = make_preverifier(draft, block_size=2, threshold=0.5, max_draft_tokens=6)
    hidden = torch.randn(6, 1, pv.config.draft_hidden_size, generator=torch.Generator().manual_seed(0)).double()
    logits = torch.randn(6, 1, 96, generator=torch.Generator().manual_seed(1)).double() * 3
    scores = []
    for device in (None, torch.device("cuda")):
        stop = PacerStopRule(pv, PacerStats(strategy="t"), draft_device=device)
        stop.start_round()
        decisions = [stop.add_token(hidden[i], logits[i], logits[i].argmax(-1, keepdim=True)) for i in range(6)]
        scores.append((decisions, stop.token_logits))
    (compiled_stops, compiled), (torch_stops, torch_logits) = scores
    assert compiled_stops == torch_stops
    assert torch_logits == pytest.approx(compiled[: len(torch_logits)], abs=1e-4)


def test_bench_clock_synchronizes_cuda(monkeypatch):
    from pacer_hf import costs

    calls = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: calls.append(device))
    costs.synchronize(torch.device("cpu"))
    assert calls == []
    costs.synchronize(torch.device("cuda:0"))
    assert calls == [torch.device("cuda:0")]


@pytest.mark.parametrize("with_rule", [False, True])
@pytest.mark.parametrize("eos_at", [1, 2, 3, 5])
def test_tokens_read_once_per_block_propose_what_reading_each_does(with_rule, eos_at):
    """Off the CPU the drafting loop reads its tokens back once per block and at the round's end, not per token
    (`read_each_token`): the proposal still ends at the draft's first EOS, wherever it falls in a block, with and
    without a stop rule; the same as reading every token."""
    from transformers import GenerationConfig

    from pacer_hf.loops.draft_loop import PacerCandidateGenerator

    target = build_model("llama")
    draft = build_draft(target, "noisy")
    ids = torch.tensor([[5, 17, 33, 60, 5, 17]])
    free = draft.generate(ids, max_new_tokens=6, do_sample=False)[0, ids.shape[1]:].tolist()
    eos = free[eos_at - 1]
    expected_len = free.index(eos) + 1  # the first occurrence ends the proposal
    proposals = []
    for each in (True, False):
        stats = PacerStats(strategy="t")
        config = GenerationConfig(max_length=40, do_sample=False, eos_token_id=eos)
        pv = make_preverifier(draft, block_size=2, threshold=0.0, max_draft_tokens=6)
        stop = PacerStopRule(pv, stats) if with_rule else None
        generator = PacerCandidateGenerator(draft, config, max_draft_tokens=6, stats=stats, stop=stop)
        generator.read_each_token = each
        candidates, _ = generator.get_candidates(ids)
        proposals.append(candidates[0, ids.shape[1]:].tolist())
    assert proposals[0] == proposals[1] == free[:expected_len]
