"""Batches of left-padded prompts (`batch_loop.py`): every row decides its tokens as batch 1 does.

Greedy output equals the target's own batched `generate`, row for row (architectures, strategies, both
cache modes, max_new_tokens inside a round, per-row EOS, logits processors, scores, random batches);
rows that end leave the target's batch; per-row stats add up to the batch's; sampling keeps the target's
distribution in a padded row; and every input the loop cannot run is refused before any forward.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
from conftest import ARCHITECTURES, DRAFT_KINDS, make_preverifier
from helpers import PROMPT, TEMPERATURE, VOCAB, exact_distributions, goodness_of_fit, round_budgets
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import LogitsProcessor, LogitsProcessorList, TextStreamer

import pacer_hf
import pacer_hf.loops.batch_cache
import pacer_hf.loops.batch_loop
from pacer_hf._hf_compat import check_cache_support

PAD = 0
STRATEGIES = ("sd-fixed-4", "pacer", "ouroboros", "pacer+ouroboros")
LENGTHS = (3, 7, 1, 5, 6)  # five prompts of different lengths, the longest not first


def left_padded(lengths, seed: int = 0, vocab: int = 96) -> tuple[torch.Tensor, torch.Tensor]:
    """Random prompts (no token is the pad id) left-padded with PAD, and their attention mask."""
    generator = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ids = torch.full((len(lengths), width), PAD, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for b, n in enumerate(lengths):
        ids[b, width - n:] = torch.randint(1, vocab, (n,), generator=generator)
        mask[b, width - n:] = 1
    return ids, mask


def batched_greedy(target, ids, mask, **kwargs):
    """The reference: the target alone, through transformers' own batched generate."""
    return target.generate(ids, attention_mask=mask, do_sample=False, pacer=None, pad_token_id=PAD, **kwargs)


def speculative(target, draft, ids, mask, strategy, **kwargs):
    return target.generate(ids, attention_mask=mask, do_sample=False, assistant_model=draft, pacer=strategy,
                           pad_token_id=PAD, **kwargs)


@contextlib.contextmanager
def strategy_ready(draft, strategy, seed: int = 0, **pv_overrides):
    """Attach an untrained pre-verifier (its blocks both pass and fail) when the strategy uses one."""
    if not strategy.startswith("pacer"):
        yield
        return
    for key, value in {"block_size": 2, "threshold": 0.5, "max_draft_tokens": 6}.items():
        pv_overrides.setdefault(key, value)
    pacer_hf.attach(draft, make_preverifier(draft, seed=seed, **pv_overrides))
    try:
        yield
    finally:
        del draft._pacer_preverifier


@pytest.fixture(autouse=True)
def _cold_pools(pair):
    """Ouroboros pools live on the shared cached targets: every test starts from empty ones."""
    for arch in ARCHITECTURES:
        for kind in DRAFT_KINDS:
            pacer_hf.reset_phrase_pool(pair(arch, kind)[0])


def generated_lengths(sequences: torch.Tensor, width: int, eos: int | None) -> list[int]:
    """Tokens each row generated: up to and including its first EOS, else all of them."""
    lengths = []
    for row in sequences[:, width:].tolist():
        lengths.append(row.index(eos) + 1 if eos is not None and eos in row else len(row))
    return lengths


def early_eos(reference: torch.Tensor, width: int) -> tuple[int, int]:
    """(eos, row): a token one row emits among its first three but some other row never emits."""
    generated = reference[:, width:].tolist()
    for position in range(3):
        for row, tokens in enumerate(generated):
            token = tokens[position]
            if token != PAD and any(token not in others for others in generated):
                return token, row
    raise AssertionError("no token ends one row early and leaves another running")


def check_row_stats(target, max_new_tokens: int, produced: list[int], cap: int) -> pacer_hf.PacerStats:
    """Per-row stats are consistent, add up to the batch's, and no round proposes past the length limit."""
    stats = pacer_hf.last_stats(target)
    assert len(stats.rows) == len(produced)
    for row, n in zip(stats.rows, produced):
        assert len(row.draft_lengths) == len(row.accepted) == row.target_forwards
        assert all(0 <= a <= d for a, d in zip(row.accepted, row.draft_lengths))
        assert row.new_tokens == n == sum(row.accepted) + len(row.accepted), "each round adds accepted + 1"
        budgets = round_budgets(row, 0, max_new_tokens, cap)
        assert all(d <= b for d, b in zip(row.draft_lengths, budgets)), "no round proposes past max_length - 1"
    assert stats.new_tokens == sum(produced) == sum(row.new_tokens for row in stats.rows)
    assert stats.target_forwards == max(row.target_forwards for row in stats.rows), "one target forward a round"
    assert sorted(stats.draft_lengths) == sorted(d for row in stats.rows for d in row.draft_lengths)
    assert sorted(stats.accepted) == sorted(a for row in stats.rows for a in row.accepted)
    return stats


# Ouroboros pool tokens come on top of the draft's cap.
CAPS = {"sd-fixed-4": 4, "pacer": 6, "ouroboros": 4 + 6, "pacer+ouroboros": 6 + 6}


@pytest.mark.parametrize("cache", ["mask", "compact"])
@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_greedy_identical_to_batched_generate(pair, arch, strategy, cache):
    """Greedy rows equal the target's batched generate: a length limit inside a round, an EOS that ends
    one row early (the others run on, that row padded as transformers pads it), and logits processors."""
    target, draft = pair(arch, "noisy")
    ids, mask = left_padded(LENGTHS, seed=sum(map(ord, arch)))
    width = ids.shape[1]
    free = batched_greedy(target, ids, mask, max_new_tokens=13)
    eos, eos_row = early_eos(free, width)
    # the EOS a row would emit at its second token; min_new_tokens keeps that row going past it
    penalised = batched_greedy(target, ids, mask, max_new_tokens=10, repetition_penalty=1.3)
    processed_eos = int(penalised[1, width + 1])
    cases = {
        "length": {"max_new_tokens": 13},
        "eos": {"max_new_tokens": 13, "eos_token_id": eos},
        "processors": {"max_new_tokens": 16, "repetition_penalty": 1.3, "min_new_tokens": 5,
                       "eos_token_id": processed_eos},
    }
    with strategy_ready(draft, strategy):
        for name, kwargs in cases.items():
            expected = batched_greedy(target, ids, mask, **kwargs)
            out = speculative(target, draft, ids, mask, strategy, pacer_batch_cache=cache, **kwargs)
            assert torch.equal(out, expected), name
            produced = generated_lengths(expected, width, kwargs.get("eos_token_id"))
            stats = check_row_stats(target, kwargs["max_new_tokens"], produced, CAPS[strategy])
            assert sum(stats.draft_lengths) > 0, "the draft must propose tokens"
            assert sum(stats.accepted) > 0, "a noisy draft gets tokens accepted"
            if name == "eos":
                assert produced[eos_row] <= 3 < max(produced) == 13, "one row ends early, another runs on"
                assert (expected[eos_row, width + produced[eos_row]:] == PAD).all()
            if name == "processors":
                assert int(expected[1, width + 1]) != processed_eos, "min_new_tokens keeps row 1 going past its EOS"
                assert not torch.equal(expected, batched_greedy(target, ids, mask, max_new_tokens=16)), \
                    "the processors must change the output for the test to mean much"


@pytest.mark.parametrize("draft_forward", ["auto", "model"])
@pytest.mark.parametrize("kind", ["copy", "random"])
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_greedy_identical_over_draft_kinds(pair, kind, strategy, draft_forward):
    """An exact copy (every drafted token accepted, so the draft's batched forward is right; max_new_tokens=13
    ends inside sd-fixed-4's third round) and an unrelated draft (most tokens rejected, rows roll back by
    different amounts every round)."""
    target, draft = pair("llama", kind)
    ids, mask = left_padded(LENGTHS, seed=3)
    expected = batched_greedy(target, ids, mask, max_new_tokens=13)
    with strategy_ready(draft, strategy, threshold=0.0 if kind == "copy" else 0.5):
        for cache in ("mask", "compact"):
            out = speculative(target, draft, ids, mask, strategy, max_new_tokens=13, pacer_batch_cache=cache,
                              pacer_draft_forward=draft_forward)
            assert torch.equal(out, expected), cache
            stats = check_row_stats(target, 13, [13] * len(LENGTHS), CAPS[strategy])
            assert stats.draft_forward == ("lean" if draft_forward == "auto" else "model"), "llama drafts qualify"
            drafted = sum(stats.draft_lengths)
            if kind == "copy":
                assert drafted > 0
                for row in stats.rows:  # pool tokens (Ouroboros) are proposals the copy did not make
                    pooled = getattr(row, "pool_lengths", [0] * len(row.accepted))
                    assert all(a >= d - p for a, d, p in zip(row.accepted, row.draft_lengths, pooled)), \
                        "an exact copy gets every token it drafts accepted"
                if strategy == "sd-fixed-4":
                    assert all(row.draft_lengths == [4, 4, 2] for row in stats.rows), "the third round is cut"
            else:
                assert 0 < drafted and sum(stats.accepted) < drafted, "an unrelated draft gets tokens rejected"


@pytest.mark.parametrize("strategy", ["sd-fixed-3", "pacer"])
@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_scores_and_logits_match_per_row(pair, arch, strategy):
    """output_scores / output_logits: each row's step equals transformers' until the row ends; after it,
    the step puts all its mass on pad_token_id (what the row emits)."""
    target, draft = pair(arch, "noisy")
    ids, mask = left_padded(LENGTHS, seed=7)
    width = ids.shape[1]
    eos, _ = early_eos(batched_greedy(target, ids, mask, max_new_tokens=12), width)
    kwargs = {"max_new_tokens": 12, "eos_token_id": eos, "repetition_penalty": 1.3,
              "return_dict_in_generate": True, "output_scores": True, "output_logits": True}
    expected = batched_greedy(target, ids, mask, **kwargs)
    with strategy_ready(draft, strategy):
        out = speculative(target, draft, ids, mask, strategy, **kwargs)
    assert torch.equal(out.sequences, expected.sequences)
    produced = generated_lengths(expected.sequences, width, eos)
    assert min(produced) < max(produced) == len(expected.scores), "a row must end before the others"
    assert len(out.scores) == len(out.logits) == len(expected.scores)
    ended = torch.full((target.config.vocab_size,), float("-inf"))
    ended[PAD] = 0.0
    for step in range(len(expected.scores)):
        for b, n in enumerate(produced):
            if step < n:
                assert torch.allclose(out.scores[step][b], expected.scores[step][b]), (step, b)
                assert torch.allclose(out.logits[step][b], expected.logits[step][b]), (step, b)
            else:
                assert torch.equal(out.scores[step][b], ended) and torch.equal(out.logits[step][b], ended)
    assert not torch.allclose(expected.scores[1], expected.logits[1]), "the penalty makes scores differ from logits"


@pytest.mark.parametrize("draft_forward", ["auto", "model"])
def test_ended_rows_leave_the_target_batch(pair, draft_forward):
    """After a row's EOS, target forwards run on fewer rows: each row costs exactly its own rounds (and the
    draft's own forward, when it runs, shrinks too)."""
    target, draft = pair("qwen2", "noisy")
    ids, mask = left_padded(LENGTHS, seed=5)
    eos, eos_row = early_eos(batched_greedy(target, ids, mask, max_new_tokens=14), ids.shape[1])
    batches = {"target": [], "draft": []}
    hooks = [model.register_forward_pre_hook(lambda module, args, kwargs, name=name:
                                             batches[name].append(kwargs["input_ids"].shape[0]), with_kwargs=True)
             for name, model in (("target", target), ("draft", draft))]
    try:
        out = speculative(target, draft, ids, mask, "sd-fixed-3", max_new_tokens=14, eos_token_id=eos,
                          pacer_draft_forward=draft_forward)
    finally:
        for hook in hooks:
            hook.remove()
    assert torch.equal(out, batched_greedy(target, ids, mask, max_new_tokens=14, eos_token_id=eos))
    stats = pacer_hf.last_stats(target)
    assert stats.rows[eos_row].target_forwards < stats.target_forwards, "the EOS row must end first"
    if draft_forward == "model":
        assert stats.draft_forward == "model"
    else:
        del batches["draft"]  # the lean draft forward (when the draft qualifies) is not the module's
    for sizes in batches.values():
        assert sizes[0] == len(LENGTHS) and sizes[-1] < len(LENGTHS)
        assert sizes == sorted(sizes, reverse=True), "a row that left never comes back"
    assert batches["target"] == [sum(row.target_forwards > i for row in stats.rows)
                                 for i in range(stats.target_forwards)]


@pytest.mark.parametrize("seed", [0, 1])
def test_pacer_drafts_a_length_per_row(pair, seed):
    """pacer_batch_stop="row": each row's pre-verifier decision is its own; in some round, two rows with the full
    budget draft different lengths (a fixed-length strategy could not)."""
    target, draft = pair("gpt2", "noisy")
    ids, mask = left_padded(LENGTHS, seed=seed)
    expected = batched_greedy(target, ids, mask, max_new_tokens=24)
    pv = make_preverifier(draft, seed=seed, block_size=2, threshold=0.5, max_draft_tokens=6)
    out = speculative(target, draft, ids, mask, pv, max_new_tokens=24, pacer_batch_stop="row")
    assert torch.equal(out, expected)
    stats = check_row_stats(target, 24, [24] * len(LENGTHS), cap=6)
    full = [[d for d, b in zip(row.draft_lengths, round_budgets(row, 0, 24, 6)) if b == 6] for row in stats.rows]
    rounds = min(len(lengths) for lengths in full)
    assert rounds > 0
    assert any(len({lengths[i] for lengths in full}) > 1 for i in range(rounds)), full


class FixedClock(pacer_hf.costs.BatchClock):
    """Costs that do not depend on timing, so `pacer_batch_stop="batch"` decides from the first block on:
    a verify forward of t tokens costs 1 + 0.01 t, a draft step and a pre-verifier call 0.005 each."""

    draft_step = preverifier_call = 0.005

    def __setattr__(self, name, value):  # measurements are ignored
        if name in ("draft_step", "preverifier_call"):
            return
        super().__setattr__(name, value)

    def ready(self) -> bool:
        return True

    def verify_seconds(self, tokens: int) -> float:
        return 1.0 + 0.01 * tokens


def test_batch_continues_rule():
    """The batch-wide rule drafts on while summed expected tokens per second would grow: likely tokens and a
    cheap width go on, unlikely ones or an expensive width stop, and rows that cannot draft on add nothing."""
    from pacer_hf.loops.stop_rule import batch_continues

    def cheap(n):
        return 1.0 + 0.05 * n

    def steep(n):
        return 1.0 + 2.0 * n

    likely, unlikely = [[0.9, 0.9]] * 4, [[0.1, 0.1]] * 4
    assert batch_continues(likely, [True] * 4, 2, 8, cheap)
    assert not batch_continues(unlikely, [True] * 4, 2, 8, cheap)
    assert not batch_continues(likely, [True] * 4, 2, 8, steep)
    assert not batch_continues(likely, [False] * 4, 2, 8, cheap), "closed rows cannot gain tokens"
    assert batch_continues([[0.9, 0.9], [0.1, 0.1]], [True, False], 2, 8, cheap), "one open likely row suffices"
    assert not batch_continues(likely, [True] * 4, 2, 2, cheap), "never past max_tokens"


@pytest.mark.parametrize("strategy", ["pacer", "pacer+ouroboros"])
@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_batch_stop_greedy_identical_and_shared(pair, arch, strategy, monkeypatch):
    """pacer_batch_stop="batch" (the default): rows equal batched generate (EOS in one row included), and in every round the
    rows with the full budget drafted the same number of draft-model tokens (one stop for the batch)."""
    monkeypatch.setattr(pacer_hf.loops.batch_loop, "BatchClock", FixedClock)
    target, draft = pair(arch, "noisy")
    ids, mask = left_padded(LENGTHS, seed=7)
    width = ids.shape[1]
    eos, _ = early_eos(batched_greedy(target, ids, mask, max_new_tokens=13), width)
    with strategy_ready(draft, strategy, threshold=0.5):
        for kwargs in ({"max_new_tokens": 20}, {"max_new_tokens": 13, "eos_token_id": eos}):
            expected = batched_greedy(target, ids, mask, **kwargs)
            out = speculative(target, draft, ids, mask, strategy, pacer_batch_stop="batch", **kwargs)
            assert torch.equal(out, expected), kwargs
            stats = check_row_stats(target, kwargs["max_new_tokens"],
                                    generated_lengths(expected, width, kwargs.get("eos_token_id")), CAPS[strategy])
            assert sum(stats.accepted) > 0
            if "eos_token_id" in kwargs or strategy != "pacer":
                continue  # a drafted EOS or pool tokens change a row's proposal length on their own
            full = [[d for d, b in zip(row.draft_lengths, round_budgets(row, 0, 20, 6)) if b == 6]
                    for row in stats.rows]
            rounds = min(len(lengths) for lengths in full)
            assert rounds > 1
            assert all(len({lengths[i] for lengths in full}) == 1 for i in range(rounds)), full
            assert len({d for lengths in full for d in lengths}) > 1, "the shared length still adapts"


def exact_first_token(target, prompt: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return torch.softmax(target(prompt).logits[0, -1] / TEMPERATURE, -1)


@pytest.mark.parametrize("strategy", ["sd-fixed-3", "pacer+ouroboros", "pacer:row"])
def test_sampling_matches_target_distribution_in_a_padded_row(sampling_pair, strategy, monkeypatch):
    """Row 0 is PROMPT left-padded by 2 next to a longer prompt: its first one and two tokens follow the
    target's exact distribution after PROMPT (chi-square), and row 1 its own; the rows sample independently.
    Pacer's rows stop together (the default, deciding from the first block here) or, ":row", one by one."""
    strategy, _, stop = strategy.partition(":")
    monkeypatch.setattr(pacer_hf.loops.batch_loop, "BatchClock", FixedClock)
    target, draft = sampling_pair
    p1, p12 = exact_distributions(target)
    other = torch.tensor([[4, 2, 9, 5, 1, 6, 2]])
    q1 = exact_first_token(target, other)
    ids = torch.cat([torch.cat([torch.zeros(1, 2, dtype=torch.long), PROMPT], 1), other])
    mask = (ids != 0).long()
    mask[1] = 1
    pacer_hf.reset_phrase_pool(target)
    torch.manual_seed(0)
    first, joint, other_first, accepted, drafted, same = torch.zeros(VOCAB), torch.zeros(VOCAB, VOCAB), \
        torch.zeros(VOCAB), 0, 0, 0
    samples = 1500
    with strategy_ready(draft, strategy, block_size=2, threshold=0.3, max_draft_tokens=4):
        for _ in range(samples):
            out = target.generate(ids, attention_mask=mask, max_new_tokens=3, do_sample=True, temperature=TEMPERATURE,
                                  top_k=0, assistant_model=draft, pacer=strategy, pad_token_id=PAD,
                                  pacer_batch_stop=stop or "batch")
            t1, t2 = out[0, 7:9].tolist()
            first[t1] += 1
            joint[t1, t2] += 1
            other_first[out[1, 7]] += 1
            same += torch.equal(out[0, 7:], out[1, 7:])
            row = pacer_hf.last_stats(target).rows[0]
            accepted += sum(row.accepted)
            drafted += sum(row.draft_lengths)
    assert 0 < accepted < drafted, "row 0's drafts must be partly accepted for the test to mean much"
    assert same < samples / 4, "row 1 must not copy row 0"
    assert goodness_of_fit(first, p1) > 1e-3
    assert goodness_of_fit(joint, p12) > 1e-3
    assert goodness_of_fit(other_first, q1) > 1e-3


@settings(max_examples=15, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    lengths=st.lists(st.integers(1, 8), min_size=2, max_size=5),
    arch=st.sampled_from(ARCHITECTURES),
    kind=st.sampled_from(DRAFT_KINDS),
    max_new_tokens=st.integers(1, 15),
    strategy=st.sampled_from(["sd-fixed-1", "sd-fixed-2", "sd-fixed-3", "sd-fixed-4", "pacer"]),
    cache=st.sampled_from(["mask", "compact"]),
    stop=st.sampled_from(["row", "batch"]),
    draft_forward=st.sampled_from(["auto", "model"]),
    eos=st.one_of(st.none(), st.integers(1, 95)),
    seed=st.integers(0, 2**16),
)
def test_property_greedy_identical(pair, lengths, arch, kind, max_new_tokens, strategy, cache, stop, draft_forward,
                                   eos, seed):
    """Random left-padded batches (equal lengths included), limits, EOS and strategies: rows equal batched generate."""
    target, draft = pair(arch, kind)
    ids, mask = left_padded(lengths, seed=seed)
    kwargs = {"max_new_tokens": max_new_tokens, "eos_token_id": eos}
    expected = batched_greedy(target, ids, mask, **kwargs)
    with strategy_ready(draft, strategy, seed=seed % 4, threshold=0.4):
        out = speculative(target, draft, ids, mask, strategy, pacer_batch_cache=cache, pacer_batch_stop=stop,
                          pacer_draft_forward=draft_forward, **kwargs)
    assert torch.equal(out, expected)
    check_row_stats(target, max_new_tokens, generated_lengths(expected, ids.shape[1], eos), cap=6)


class _Custom(LogitsProcessor):
    def __call__(self, input_ids, scores):
        return scores


def _bad_inputs():
    """(description, generate kwargs over the default batch, match): each refused with its fix."""
    ids, mask = left_padded((2, 4, 3))
    right = mask.flip(1)
    return [
        ("pearl", {"pacer": "pearl"}, r"'pearl' runs batch size 1 only.*call generate once per prompt"),
        ("PearlConfig(gamma=3)", {"pacer": pacer_hf.PearlConfig(gamma=3)},
         r"runs batch size 1 only.*call generate once per prompt"),
        ("pacer+pearl", {"pacer": "pacer+pearl"}, r"'pacer\+pearl' runs batch size 1 only.*once per prompt"),
        ("lookup", {"pacer": "lookup-3", "assistant_model": None},
         r"'lookup-3' runs batch size 1 only.*call generate once per prompt"),
        ("transformers loop", {"pacer_loop": "transformers"}, r"supports batch size 1.*Leave pacer_loop at 'lean'"),
        ("streamer", {"streamer": TextStreamer(None)}, r"does not support streamer; call generate once per prompt"),
        ("right padding", {"input_ids": ids.flip(1), "attention_mask": right},
         r"left-padded.*padding on the right.*padding_side = 'left'"),
        ("no mask", {"attention_mask": None}, r"needs their attention_mask: pass the tokenizer's output whole"),
        ("mask shape", {"attention_mask": mask[:, 1:]}, r"attention_mask has shape \(3, 3\) but input_ids \(3, 4\)"),
        ("all padding", {"attention_mask": torch.cat([mask[:2], torch.zeros(1, 4, dtype=torch.long)])},
         r"all padding.*drop that prompt"),
        ("cache mode", {"pacer_batch_cache": "rows"}, r"pacer_batch_cache='rows': choose one of \('mask', 'compact'\)"),
        ("stop mode", {"pacer_batch_stop": "rows"}, r"pacer_batch_stop='rows': choose one of \('batch', 'row'\)"),
        ("custom processor", {"logits_processor": LogitsProcessorList([_Custom()])},
         r"does not know _Custom; call generate once per prompt with it, or leave it out"),
        ("from_target_tail", {"pacer": pacer_hf.OuroborosConfig(from_target_tail=True)},
         r"from_target_tail=True\) runs batch size 1 only; pass from_target_tail=False"),
    ]


@pytest.mark.parametrize("case", _bad_inputs(), ids=lambda case: case[0])
def test_refused_before_any_forward(pair, case):
    """Each input the batched loop cannot run raises a ValueError that names the problem and the fix."""
    name, kwargs, match = case
    target, draft = pair("llama", "noisy")
    ids, mask = left_padded((2, 4, 3))
    call = {"input_ids": ids, "attention_mask": mask, "max_new_tokens": 5, "assistant_model": draft,
            "pacer": "sd-fixed-3", "pad_token_id": PAD, **kwargs}
    if call["attention_mask"] is None:
        del call["attention_mask"]
    if call["assistant_model"] is None:
        del call["assistant_model"]
    check_cache_support(target, "target")  # the once-per-model probe of the target's cache runs forwards; not this test's
    forwards = []
    hooks = [model.register_forward_pre_hook(lambda *args: forwards.append(1)) for model in (target, draft)]
    try:
        with strategy_ready(draft, "pacer"), pytest.raises(ValueError, match=match):
            target.generate(**call)
    finally:
        for hook in hooks:
            hook.remove()
    assert forwards == [], "the error must come before any model forward"


def test_model_kwargs_the_loop_would_drop_are_refused(pair):
    """Model kwargs the batched loop does not feed the target (a multimodal model's encoded images, token types) are
    refused before its first forward, not dropped: dropped, they would decode another text. transformers' empty
    image encodings on a text prompt are no such input. (The loop sees these kwargs only inside generate, after the
    once-per-model cache probe, so a first call runs that probe here.)"""
    target, draft = pair("llama", "noisy")
    ids, mask = left_padded((2, 4, 3))
    call = {"input_ids": ids, "attention_mask": mask, "max_new_tokens": 5, "assistant_model": draft,
            "pacer": "sd-fixed-3", "pad_token_id": PAD, "do_sample": False}
    expected = target.generate(**call)
    assert torch.equal(target.generate(**call, mm_encoder_outputs={}), expected)
    forwards = []
    hooks = [model.register_forward_pre_hook(lambda *args: forwards.append(1)) for model in (target, draft)]
    try:
        with pytest.raises(ValueError, match=r"batched loop does not support model kwargs \['mm_encoder_outputs'\]"
                                             r".*once per prompt with pacer_loop='transformers'"):
            target.generate(**call, mm_encoder_outputs={"image": torch.zeros(3, 2, 4)})
    finally:
        for hook in hooks:
            hook.remove()
    assert forwards == [], "the error must come before the loop's first forward"


def test_batch_too_large_for_memory_refused_before_any_forward(pair, monkeypatch):
    """A batch whose KV caches cannot fit is refused up front, naming the size and the fix."""
    target, draft = pair("llama", "noisy")
    ids, mask = left_padded((2, 4, 3))
    monkeypatch.setattr(pacer_hf.loops.batch_cache, "available_memory", lambda device: 1000)
    forwards = []
    hooks = [model.register_forward_pre_hook(lambda *args: forwards.append(1)) for model in (target, draft)]
    try:
        with pytest.raises(ValueError, match=r"A batch of 3 prompts up to 9 tokens needs about .* GiB of KV cache"
                                             r".*pass fewer prompts per generate call"):
            speculative(target, draft, ids, mask, "sd-fixed-3", max_new_tokens=5)
    finally:
        for hook in hooks:
            hook.remove()
    assert forwards == []
    monkeypatch.undo()
    speculative(target, draft, ids, mask, "sd-fixed-3", max_new_tokens=5)  # the same batch runs with the memory


def test_row_stops_decide_with_the_batch_clock_once_it_is_ready(pair, monkeypatch):
    """`pacer_batch_stop="row"`: each row's decision reads the costs the batch's own clock measured (the round time
    of n drafted tokens per row, a drafted token's time) once the clock is ready, and, said explicitly by passing
    none, the pre-verifier's stored calibration before that."""
    from pacer_hf.loops.stop_rule import BatchStopRule
    from pacer_hf.stats import PacerStats

    _, draft = pair("llama", "noisy")
    pv = make_preverifier(draft, block_size=2, threshold=0.5, max_draft_tokens=6)
    seen = []
    monkeypatch.setattr(type(pv), "decide", lambda self, logits, costs=None: seen.append(costs) or (False, 0))
    clock = pacer_hf.costs.BatchClock()
    rule = BatchStopRule(pv, PacerStats("t"), "row", clock)
    hidden, raw = torch.randn(2, pv.config.draft_hidden_size), torch.randn(2, 96)
    tokens = raw.argmax(-1)
    for ready in (False, True):
        if ready:
            clock = FixedClock()
            rule.clock = clock
        rule.start([[0.0] * 3] * 2)
        assert rule.add(hidden, raw, tokens, [[1], [2]], [True, True]) is None
        assert rule.add(hidden, raw, tokens, [[1, 3], [2, 4]], [True, True]) == [(False, 0)] * 2
    assert seen[:2] == [None, None]
    table = [n * 0.005 + -(-n // 2) * 0.005 + 1.0 + 0.01 * 2 * (n + 1) for n in range(7)]
    assert seen[2:] == [{"round_cost": pytest.approx(table), "draft_cost": 0.005}] * 2
