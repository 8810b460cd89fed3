"""pacer_hf's lean verification loop (`pacer_loop="lean"`, the default) is exact.

Greedy output equals the target alone; against transformers' own loop (`pacer_loop="transformers"`)
the lean loop gives the same tokens, the same rounds, the same scores and streamed chunks, and under
sampling the same random draws (same seed, same output: it keeps transformers' accept step). Spies
prove which loop ran. Strategies that draft past EOS or max_length check the loop's own truncation.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
from typing import ClassVar

import pytest
import torch
from conftest import ARCHITECTURES, logits_processor_case, make_preverifier, plain_greedy
from helpers import TEMPERATURE, prompt
from transformers import GenerationMixin
from transformers.generation import BaseStreamer

import pacer_hf
from pacer_hf import generation
from pacer_hf._hf_compat import output_cache
from pacer_hf.loops.draft_loop import PacerCandidateGenerator
from pacer_hf.stats import PacerStats
from pacer_hf.strategies import STRATEGY_TYPES, SpeculativeConfig, StrategyCall, register_strategy

STRATEGY_NAMES = ("sd-fixed-1", "sd-fixed-4", "pacer", "ouroboros")
SAMPLING = {"do_sample": True, "temperature": TEMPERATURE, "top_k": 0}


def pacer_value(strategy: str, draft):
    """The `pacer=` argument; build it before seeding: make_preverifier seeds torch's RNG itself."""
    if strategy == "pacer":
        return make_preverifier(draft, block_size=2, threshold=0.5, max_draft_tokens=6)
    return strategy


def run(target, draft, ids, pacer, loop: str, **kwargs) -> tuple[torch.Tensor, PacerStats]:
    pacer_hf.reset_phrase_pool(target)  # Ouroboros' pool is warm across calls: every run starts cold
    kwargs.setdefault("do_sample", False)
    out = target.generate(ids, assistant_model=draft, pacer=pacer, pacer_loop=loop, **kwargs)
    stats = pacer_hf.last_stats(target)
    assert stats.loop == loop
    return out, stats


class _Unbounded(PacerCandidateGenerator):
    """Drafts the full γ, through EOS and past max_length (as a multi-token head would): the loop must cut."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.eos = set()
        self.max_length += self.max_draft_tokens
        self.ids = torch.empty((1, self.max_length), dtype=torch.long, device=self.draft.device)


@pytest.fixture
def unbounded(monkeypatch):
    """A strategy config whose generator is _Unbounded, registered for one test."""

    @dataclasses.dataclass(frozen=True)
    class UnboundedConfig(SpeculativeConfig):
        strategy_type: ClassVar[str] = "unbounded-test"

    def build(config, context) -> StrategyCall:
        stats = PacerStats(strategy="unbounded-4")
        return StrategyCall("unbounded-4", lambda generation_config, processors: _Unbounded(
            context.draft, generation_config, processors, max_draft_tokens=4, stats=stats), stats)

    register_strategy(UnboundedConfig, build)
    yield UnboundedConfig(gamma=4)
    del STRATEGY_TYPES["unbounded-test"]


@pytest.fixture
def spies(monkeypatch) -> dict[str, int]:
    """Counts calls of the lean loop and of transformers' `_assisted_decoding` (restored after the test)."""
    calls = {"lean": 0, "transformers": 0}
    lean, assisted = generation.lean_assisted_decoding, GenerationMixin._assisted_decoding

    @functools.wraps(lean)
    def lean_spy(*args, **kwargs):
        calls["lean"] += 1
        return lean(*args, **kwargs)

    @functools.wraps(assisted)
    def assisted_spy(*args, **kwargs):
        calls["transformers"] += 1
        return assisted(*args, **kwargs)

    monkeypatch.setattr(generation, "lean_assisted_decoding", lean_spy)
    monkeypatch.setattr(GenerationMixin, "_assisted_decoding", assisted_spy)
    return calls


@pytest.mark.parametrize("arch", ARCHITECTURES)
@pytest.mark.parametrize("strategy", STRATEGY_NAMES)
def test_greedy_identical_with_logits_processors(pair, arch, strategy):
    """Repetition penalty + min_new_tokens + an EOS the target would emit early: same as the target alone."""
    target, draft = pair(arch, "noisy")
    ids = prompt(seed=4)
    kwargs, expected = logits_processor_case(target, ids)
    pacer = pacer_value(strategy, draft)
    out, stats = run(target, draft, ids, pacer, "lean", **kwargs)
    assert torch.equal(out, expected)
    reference, hf_stats = run(target, draft, ids, pacer, "transformers", **kwargs)
    assert torch.equal(reference, expected)
    assert (stats.draft_lengths, stats.accepted) == (hf_stats.draft_lengths, hf_stats.accepted)
    assert sum(stats.accepted) > 0, "some drafts must be accepted for the check to mean much"


@pytest.mark.parametrize("arch", ARCHITECTURES)
@pytest.mark.parametrize("kind", ["copy", "noisy", "random"])
@pytest.mark.parametrize("strategy", STRATEGY_NAMES)
def test_lean_and_transformers_loops_agree(pair, arch, kind, strategy):
    target, draft = pair(arch, kind)
    pacer = pacer_value(strategy, draft)
    for seed in range(2):
        ids = prompt(seed=seed + 20)
        expected = plain_greedy(target, ids, max_new_tokens=21)
        out, stats = run(target, draft, ids, pacer, "lean", max_new_tokens=21)
        reference, hf_stats = run(target, draft, ids, pacer, "transformers", max_new_tokens=21)
        assert torch.equal(out, expected) and torch.equal(reference, expected)
        assert (stats.draft_lengths, stats.accepted) == (hf_stats.draft_lengths, hf_stats.accepted)
        assert stats.target_forwards == len(stats.accepted) == hf_stats.target_forwards


@pytest.mark.parametrize("arch", ARCHITECTURES)
@pytest.mark.parametrize("eos_position", [0, 2, 5])
@pytest.mark.parametrize("strategy", ["sd-fixed-8", "unbounded"])
def test_eos_inside_a_round(pair, unbounded, arch, eos_position, strategy):
    """An exact-copy draft: EOS lands inside a round (the unbounded draft keeps drafting past it)."""
    strategy = unbounded if strategy == "unbounded" else strategy
    target, draft = pair(arch, "copy")
    ids = prompt(seed=11)
    free = plain_greedy(target, ids, max_new_tokens=12)
    eos = int(free[0, ids.shape[1] + eos_position])
    expected = plain_greedy(target, ids, max_new_tokens=12, eos_token_id=eos, pad_token_id=eos)
    assert expected.shape[1] < free.shape[1], "the EOS must end generation early"
    out, stats = run(
        target, draft, ids, strategy, "lean", max_new_tokens=12, eos_token_id=eos, pad_token_id=eos
    )
    assert torch.equal(out, expected)
    reference, hf_stats = run(
        target, draft, ids, strategy, "transformers", max_new_tokens=12, eos_token_id=eos, pad_token_id=eos
    )
    assert torch.equal(reference, expected)
    assert (stats.draft_lengths, stats.accepted) == (hf_stats.draft_lengths, hf_stats.accepted)


@pytest.mark.parametrize("max_new_tokens", [1, 2, 3, 7])
@pytest.mark.parametrize("strategy", ["sd-fixed-4", "unbounded", "ouroboros"])
def test_max_new_tokens_edges(pair, unbounded, max_new_tokens, strategy):
    strategy = unbounded if strategy == "unbounded" else strategy
    target, draft = pair("llama", "copy")
    ids = torch.tensor([[5, 6, 7, 5, 6, 7, 5, 6]])  # repeats, so Ouroboros' pool proposes from the prompt
    expected = plain_greedy(target, ids, max_new_tokens=max_new_tokens)
    out, stats = run(target, draft, ids, strategy, "lean", max_new_tokens=max_new_tokens)
    assert torch.equal(out, expected)
    assert stats.new_tokens == max_new_tokens
    reference, hf_stats = run(target, draft, ids, strategy, "transformers", max_new_tokens=max_new_tokens)
    assert torch.equal(reference, expected)
    assert (stats.draft_lengths, stats.accepted) == (hf_stats.draft_lengths, hf_stats.accepted)


@pytest.mark.parametrize("loop", ["lean", "transformers"])
def test_spy_shows_which_loop_ran(pair, spies, loop):
    target, draft = pair("llama", "noisy")
    ids = prompt(seed=3)
    out, stats = run(target, draft, ids, "sd-fixed-4", loop, max_new_tokens=10)
    assert torch.equal(out, plain_greedy(target, ids, max_new_tokens=10))
    other = "transformers" if loop == "lean" else "lean"
    assert spies == {loop: 1, other: 0}
    target.generate(ids, max_new_tokens=10, do_sample=False, assistant_model=draft, pacer="sd-fixed-4")
    assert spies["lean"] == 1 + (loop == "lean"), "the default loop is the lean one"
    assert pacer_hf.last_stats(target).loop == "lean"


def test_plain_generate_untouched(pair, spies):
    """pacer=None: transformers' own generate and loop, whatever pacer_loop says."""
    target, draft = pair("llama", "noisy")
    draft = copy.deepcopy(draft)  # transformers' loop writes its draft length back into the draft's config
    ids = prompt(seed=3)
    out = target.generate(
        ids, max_new_tokens=6, do_sample=False, assistant_model=draft, pacer=None, pacer_loop="lean"
    )
    assert torch.equal(out, plain_greedy(target, ids, max_new_tokens=6))
    assert spies == {"lean": 0, "transformers": 1}


@pytest.mark.parametrize("strategy", ["sd-fixed-3", "pacer", "ouroboros"])
def test_dict_output_scores_and_logits(pair, strategy):
    target, draft = pair("gpt2", "noisy")
    ids = prompt(seed=8)
    kwargs = {
        "max_new_tokens": 15,
        "return_dict_in_generate": True,
        "output_scores": True,
        "output_logits": True,
        "repetition_penalty": 1.3,
    }
    expected = target.generate(ids, do_sample=False, pacer=None, **kwargs)
    pacer = pacer_value(strategy, draft)
    out, _ = run(target, draft, ids, pacer, "lean", **kwargs)
    reference, _ = run(target, draft, ids, pacer, "transformers", **kwargs)
    assert torch.equal(out.sequences, expected.sequences)
    assert torch.equal(reference.sequences, expected.sequences)
    assert len(out.scores) == len(out.logits) == len(expected.scores) == 15
    for got, hf, want in zip(out.scores, reference.scores, expected.scores):
        assert torch.equal(got, hf)
        torch.testing.assert_close(got, want)
    for got, hf, want in zip(out.logits, reference.logits, expected.logits):
        assert torch.equal(got, hf)
        torch.testing.assert_close(got, want)
    assert not torch.equal(out.scores[3], out.logits[3]), "the processor must have changed the scores"
    assert output_cache(out).get_seq_length() == output_cache(reference).get_seq_length()
    assert output_cache(out).get_seq_length() == out.sequences.shape[1] - 1


class _Recorder(BaseStreamer):
    def __init__(self):
        self.chunks: list[list[int]] = []
        self.ended = 0

    def put(self, value: torch.Tensor) -> None:
        self.chunks.append(value.flatten().tolist())

    def end(self) -> None:
        self.ended += 1


def test_streamer_receives_the_output(pair):
    target, draft = pair("qwen2", "noisy")
    ids = prompt(seed=6)
    recorded = {}
    for loop in ("lean", "transformers"):
        streamer = _Recorder()
        out, stats = run(target, draft, ids, "sd-fixed-4", loop, max_new_tokens=17, streamer=streamer)
        assert streamer.ended == 1
        assert streamer.chunks[0] == ids[0].tolist()  # transformers' generate streams the prompt itself
        assert sum(streamer.chunks[1:], []) == out[0, ids.shape[1] :].tolist()
        assert len(streamer.chunks) - 1 == stats.target_forwards  # one chunk per round
        recorded[loop] = streamer.chunks
    assert recorded["lean"] == recorded["transformers"]


@pytest.mark.parametrize("strategy", ["sd-fixed-3", "pacer", "ouroboros", "ouroboros-no-q"])
def test_sampling_same_draws_as_transformers(sampling_pair, strategy):
    """Same seed, same output: the lean loop consumes torch's RNG exactly as `_assisted_decoding` does.

    "ouroboros-no-q" returns no draft logits when pool tokens are proposed: transformers' branch that
    samples from the target and keeps matching candidates.
    """
    target, draft = sampling_pair
    ids = torch.tensor([[1, 2, 3, 1, 2, 3, 1, 2]])
    pacer = pacer_value(strategy.removesuffix("-no-q"), draft)
    if strategy == "ouroboros-no-q":
        pacer = pacer_hf.OuroborosConfig(sampling_pool_q="none")
    accepted = 0
    for seed in range(6):
        outputs = []
        for loop in ("lean", "transformers"):
            torch.manual_seed(seed)
            out, stats = run(target, draft, ids, pacer, loop, max_new_tokens=16, **SAMPLING)
            outputs.append((out, stats.draft_lengths, stats.accepted))
        assert torch.equal(outputs[0][0], outputs[1][0]) and outputs[0][1:] == outputs[1][1:]
        accepted += sum(outputs[0][2])
    assert accepted > 0


def test_errors(pair):
    target, draft = pair("gpt2", "noisy")
    ids = prompt(seed=1)
    common = {"max_new_tokens": 5, "do_sample": False, "assistant_model": draft, "pacer": "sd-fixed-2"}
    with pytest.raises(ValueError, match=r"pacer_loop='fast'.*'lean', 'transformers'"):
        target.generate(ids, pacer_loop="fast", **common)
    with pytest.raises(ValueError, match="custom_generate"):
        target.generate(ids, custom_generate=generation.lean_assisted_decoding, **common)
    with pytest.raises(ValueError, match="synced_gpus.*pacer_loop='transformers'"):
        target.generate(ids, synced_gpus=True, **common)
    for name in ("output_attentions", "output_hidden_states"):
        with pytest.raises(ValueError, match=f"{name}.*pacer_loop='transformers'"):
            target.generate(ids, return_dict_in_generate=True, **{name: True}, **common)
        assert target._pacer_transformers_call is None
    with pytest.raises(ValueError, match=r"token_type_ids.*pacer_loop='transformers'"):
        target.generate(ids, token_type_ids=torch.zeros_like(ids), **common)
    assert target._pacer_transformers_call is None
    # a multimodal model's encoded images: empty on a text prompt (ignored), refused when they hold something
    with pytest.raises(ValueError, match=r"mm_encoder_outputs.*pacer_loop='transformers'"):
        target.generate(ids, mm_encoder_outputs={"image": torch.zeros(1, 2, 4)}, **common)
    assert torch.equal(target.generate(ids, mm_encoder_outputs={}, **common), plain_greedy(target, ids, max_new_tokens=5))
    # what the lean loop refuses, transformers' loop does
    out = target.generate(
        ids, return_dict_in_generate=True, output_hidden_states=True, pacer_loop="transformers", **common
    )
    assert out.hidden_states is not None
    assert torch.equal(out.sequences, plain_greedy(target, ids, max_new_tokens=5))


@pytest.mark.parametrize("accepted", [0, 1, 3])
def test_a_round_after_plain_steps_drafts_from_the_verified_text(accepted):
    """After a round the draft's cache still holds the proposals the target rejected; rounds that propose nothing
    (plain steps, lookup or pool tokens) then append the target's tokens past them. The next drafting round re-reads
    from the first position where what the cache read and the text differ, and proposes what a draft reading the
    text afresh proposes (a stale context costs no exactness, only acceptance: the rounds after plain steps)."""
    from conftest import build_draft, build_model
    from transformers import GenerationConfig

    target = build_model("llama")
    draft = build_draft(target, "noisy")
    config = GenerationConfig(max_length=64, do_sample=False)
    ids = torch.tensor([[5, 17, 33, 60, 5, 17]])
    generator = PacerCandidateGenerator(draft, config, max_draft_tokens=6, stats=PacerStats(strategy="t"))
    drafted = generator.get_candidates(ids)[0][0, ids.shape[1]:].tolist()
    assert len(drafted) == 6
    # the target kept `accepted` of them and chose another token, then three plain steps
    written = [*drafted[:accepted], (drafted[accepted] + 1) % 96, *[(t + 2) % 96 for t in drafted[accepted + 1:][:3]]]
    text = torch.cat([ids, torch.tensor([written])], dim=1)
    assert generator._kept(text) == ids.shape[1] + accepted
    fresh = PacerCandidateGenerator(draft, config, max_draft_tokens=6, stats=PacerStats(strategy="t"))
    assert generator.get_candidates(text)[0].tolist() == fresh.get_candidates(text)[0].tolist()
