"""Heads that differ only by padding rows past the shared vocabulary (`loops/padded_heads.py`).

Qwen2.5-7B's head has 152,064 rows and Qwen2.5-0.5B's 151,936 over one tokenizer; here, in small, a target with 96
rows drafted by a copy of it cut to 80. Greedy output equals the target's alone for every strategy that takes a
draft, in both verification loops and in the batched loop, whether the target's extra rows score low (zero weights,
like untrained padding) or at random (so the target emits them, and the draft must read ids it has no row for).
Sampling keeps the target's distribution (chi-square, the extra rows included); collection runs on such a pair;
and real mismatches are still refused, each error naming the argument and the fix.
"""

from __future__ import annotations

import contextlib
import copy

import pytest
import torch
from conftest import build_model, make_preverifier, plain_greedy
from helpers import TEMPERATURE, goodness_of_fit
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

import pacer_hf
import pacer_hf.loops.lean_loop
import pacer_hf.loops.padded_heads
from pacer_hf.loading import check_pair
from pacer_hf.strategies import LookupConfig, PearlConfig
from pacer_hf.training import CollectConfig, collect, load_traces
from pacer_hf.training.collect_answers import collect_along_answers

TARGET_ROWS, DRAFT_ROWS = 96, 80
EXTRAS = ("zero", "random")  # the target's rows past the draft's: zero weights (logit 0), or random ones
PROMPT = torch.tensor([[5, 17, 3, 42, 8, 61, 23]])  # every id a row of both heads, as a tokenizer's would be
NEW = 40
# name -> pacer= value; "pacer*" ones get a pre-verifier attached to the draft
STRATEGIES = {
    "sd-fixed-4": "sd-fixed-4",
    "pacer": "pacer",
    "ouroboros": "ouroboros",
    "pacer+ouroboros": "pacer+ouroboros",
    "pearl-process": PearlConfig(gamma=4, worker="process"),
    "pearl-thread": PearlConfig(gamma=4, worker="thread"),
    "pacer+pearl": PearlConfig(gamma=4, worker="thread", use_preverifier=True),
    "pearl-sequential-resync": PearlConfig(gamma=4, parallel=False, resync_tokens=2),
    "lookup-with-draft": LookupConfig(num_tokens=3),
}
BATCH_STRATEGIES = ("sd-fixed-4", "pacer", "ouroboros", "pacer+ouroboros")


def cut_copy(target, rows: int, noise: float, seed: int = 1):
    """The target's weights with its embedding and head cut to their first `rows` rows, perturbed by `noise`."""
    config = copy.deepcopy(target.config)
    config.vocab_size = rows
    draft = type(target)(config).to(target.dtype)
    width = target.get_output_embeddings().out_features
    draft.load_state_dict({name: value[:rows] if value.shape[:1] == (width,) else value
                           for name, value in target.state_dict().items()})
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in draft.parameters():
            param.add_(noise * param.std() * torch.randn(param.shape, generator=generator, dtype=param.dtype))
    return draft.eval()


_PAIRS: dict = {}


def padded_pair(arch: str = "llama", extra: str = "random", target_rows: int = TARGET_ROWS,
                draft_rows: int = DRAFT_ROWS, noise: float = 0.03, seed: int = 0):
    """(enabled target, draft): the target's head `target_rows` wide, the draft a perturbed copy cut to `draft_rows`."""
    key = (arch, extra, target_rows, draft_rows, noise, seed)
    if key not in _PAIRS:
        target = build_model(arch, vocab_size=target_rows, seed=seed).double()
        if extra == "zero":
            with torch.no_grad():
                target.get_output_embeddings().weight[draft_rows:] = 0.0
        _PAIRS[key] = (target, cut_copy(target, draft_rows, noise))
    target, draft = _PAIRS[key]
    pacer_hf.enable(target)
    pacer_hf.reset_phrase_pool(target)
    return target, draft


def word_tokenizer(size: int, swap: bool = False) -> PreTrainedTokenizerFast:
    """A word-level tokenizer of `size` tokens ("w0" ... ), built in memory; `swap` numbers w1 and w2 the other way."""
    vocab = {f"w{i}": i for i in range(size)}
    if swap:
        vocab["w1"], vocab["w2"] = 2, 1
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="w0")


TOKENIZER = word_tokenizer(DRAFT_ROWS)
LOOPS = {"lean": {}, "transformers": {"pacer_loop": "transformers", "tokenizer": TOKENIZER,
                                      "assistant_tokenizer": TOKENIZER}}


@contextlib.contextmanager
def ready(draft, name: str):
    """An untrained pre-verifier (its blocks both pass and fail) attached while a "pacer*" strategy runs."""
    if not name.startswith("pacer"):
        yield
        return
    pacer_hf.attach(draft, make_preverifier(draft, block_size=2, threshold=0.5, max_draft_tokens=6))
    try:
        yield
    finally:
        del draft._pacer_preverifier


def test_the_pair_is_what_the_tests_need():
    """The random variant's target emits ids past the draft's head, and the draft is often accepted: both paths
    (the draft reading ids it lacks, and accepted drafts) are exercised below."""
    target, draft = padded_pair(extra="random")
    expected = plain_greedy(target, PROMPT, max_new_tokens=NEW)
    assert (expected[0, PROMPT.shape[1]:] >= DRAFT_ROWS).any(), "the target must emit one of its extra rows"
    zero_target, _ = padded_pair(extra="zero")
    assert (plain_greedy(zero_target, PROMPT, max_new_tokens=NEW)[0] < DRAFT_ROWS).all()
    target.generate(PROMPT, max_new_tokens=NEW, do_sample=False, assistant_model=draft, pacer="sd-fixed-4")
    stats = pacer_hf.last_stats(target)
    assert sum(stats.accepted) > sum(stats.draft_lengths) / 4
    assert draft.get_output_embeddings().out_features == DRAFT_ROWS < target.get_output_embeddings().out_features


@pytest.mark.parametrize("loop", sorted(LOOPS))
@pytest.mark.parametrize("extra", EXTRAS)
@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_greedy_identical_to_the_target_alone(name, extra, loop):
    target, draft = padded_pair(extra=extra)
    expected = plain_greedy(target, PROMPT, max_new_tokens=NEW)
    with ready(draft, name):
        out = target.generate(PROMPT, max_new_tokens=NEW, do_sample=False, assistant_model=draft,
                              pacer=STRATEGIES[name], **LOOPS[loop])
    assert torch.equal(out, expected)
    stats = pacer_hf.last_stats(target)
    assert sum(stats.accepted) > 0, "the draft's proposals must be accepted sometimes for the test to mean much"


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("draft_forward", ["lean", "model"])
def test_greedy_identical_with_each_draft_forward_and_logits_processors(arch, draft_forward):
    """Repetition penalty and min_new_tokens read the ids the target emitted past the draft's rows."""
    target, draft = padded_pair(arch=arch, extra="random")
    kwargs = {"max_new_tokens": NEW, "repetition_penalty": 1.3, "min_new_tokens": 10}
    expected = plain_greedy(target, PROMPT, **kwargs)
    out = target.generate(PROMPT, do_sample=False, assistant_model=draft, pacer="sd-fixed-3",
                          pacer_draft_forward=draft_forward, **kwargs)
    assert torch.equal(out, expected)
    assert pacer_hf.last_stats(target).draft_forward == draft_forward


def left_padded(lengths: list[int], seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    ids = torch.zeros((len(lengths), max(lengths)), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for b, n in enumerate(lengths):
        ids[b, ids.shape[1] - n:] = torch.randint(1, DRAFT_ROWS, (n,), generator=generator)
        mask[b, ids.shape[1] - n:] = 1
    return ids, mask


@pytest.mark.parametrize("extra", EXTRAS)
@pytest.mark.parametrize("name", BATCH_STRATEGIES)
def test_batch_identical_to_batched_generate(name, extra):
    target, draft = padded_pair(extra=extra)
    ids, mask = left_padded([4, 9, 6])
    kwargs = {"attention_mask": mask, "max_new_tokens": 30, "do_sample": False, "pad_token_id": 0}
    expected = target.generate(ids, pacer=None, **kwargs)
    if extra == "random":
        assert (expected[:, ids.shape[1]:] >= DRAFT_ROWS).any()
    with ready(draft, name):
        out = target.generate(ids, assistant_model=draft, pacer=name, **kwargs)
    assert torch.equal(out, expected)
    assert sum(pacer_hf.last_stats(target).accepted) > 0


# ------------------------------------------------------------------------------------------------ sampling
SMALL_TARGET, SMALL_DRAFT = 12, 10  # two extra rows holding real probability mass: a sampler that lost them shows
SAMPLE_PROMPT = torch.tensor([[1, 7, 3, 3, 8]])
SAMPLES = 1000


def sampling_pair():
    target, draft = padded_pair(extra="random", target_rows=SMALL_TARGET, draft_rows=SMALL_DRAFT, noise=0.3, seed=5)
    return target, draft


def exact_distributions(target) -> tuple[torch.Tensor, torch.Tensor]:
    """p(t1) and p(t1, t2) of the target at TEMPERATURE after SAMPLE_PROMPT, over all of its rows."""
    with torch.no_grad():
        first = torch.softmax(target(SAMPLE_PROMPT).logits[0, -1] / TEMPERATURE, -1)
        extended = torch.cat([SAMPLE_PROMPT.repeat(SMALL_TARGET, 1), torch.arange(SMALL_TARGET)[:, None]], 1)
        second = torch.softmax(target(extended).logits[:, -1] / TEMPERATURE, -1)
    return first, first[:, None] * second


def sample_counts(target, draft, pacer, seed: int = 0, batch: int = 1, **kwargs):
    """Counts of the first token and of the first two (row 0 of `batch` copies of SAMPLE_PROMPT) over SAMPLES calls."""
    torch.manual_seed(seed)
    first, joint, accepted, drafted = torch.zeros(SMALL_TARGET), torch.zeros(SMALL_TARGET, SMALL_TARGET), 0, 0
    start = SAMPLE_PROMPT.shape[1]
    prompts = SAMPLE_PROMPT.repeat(batch, 1)
    if batch > 1:
        kwargs["attention_mask"] = torch.ones_like(prompts)
    for _ in range(SAMPLES):
        out = target.generate(prompts, max_new_tokens=4, do_sample=True, temperature=TEMPERATURE, top_k=0,
                              assistant_model=draft, pacer=pacer, **kwargs)
        t1, t2 = out[0, start:start + 2].tolist()
        first[t1] += 1
        joint[t1, t2] += 1
        stats = pacer_hf.last_stats(target)
        accepted, drafted = accepted + sum(stats.accepted), drafted + sum(stats.draft_lengths)
    return first, joint, accepted, drafted


@pytest.mark.parametrize("case", ["sd-fixed-3", "pacer+ouroboros", "pearl-thread", "transformers-loop", "batch"])
def test_sampling_keeps_the_target_distribution(case):
    """q = 0 on the rows the draft lacks: the first token and the first two follow the target's exact distribution,
    the extra rows' share included (lean loop: speculative rounds, Ouroboros' one-hot pool q, PEARL's jobs;
    transformers' loop; the batched loop, row 0 of two)."""
    target, draft = sampling_pair()
    p1, p12 = exact_distributions(target)
    assert float(p1[SMALL_DRAFT:].sum()) > 0.05, "the extra rows must carry mass for the test to mean much"
    pacer, kwargs = case, {}
    if case == "transformers-loop":
        tokenizer = word_tokenizer(SMALL_DRAFT)
        pacer, kwargs = "sd-fixed-3", {"pacer_loop": "transformers", "tokenizer": tokenizer,
                                       "assistant_tokenizer": tokenizer}
    if case == "pearl-thread":
        pacer = PearlConfig(gamma=3, worker="thread")
    if case == "batch":
        pacer, kwargs = "sd-fixed-3", {"batch": 2}
    with ready(draft, case):
        first, joint, accepted, drafted = sample_counts(target, draft, pacer, **kwargs)
    assert 0 < accepted < drafted, "the draft must be partly accepted for the test to mean much"
    assert first[SMALL_DRAFT:].sum() > 0
    assert goodness_of_fit(first, p1) > 1e-3
    assert goodness_of_fit(joint, p12) > 1e-3


def test_the_distribution_test_detects_q_on_rows_the_draft_lacks(monkeypatch):
    """A widening that gives the draft's missing rows a logit of its best one (q > 0 where it never samples) is
    caught: the test above can fail."""

    def lossy(logits, width, fill=float("-inf")):
        missing = width - logits.shape[-1]
        if missing <= 0:
            return logits
        return torch.cat([logits, logits.max(-1, keepdim=True).values.expand(*logits.shape[:-1], missing)], -1)

    monkeypatch.setattr(pacer_hf.loops.padded_heads, "widen", lossy)
    monkeypatch.setattr(pacer_hf.loops.lean_loop, "widen", lossy)
    target, draft = sampling_pair()
    p1, p12 = exact_distributions(target)
    first, joint, _, _ = sample_counts(target, draft, "sd-fixed-3")
    assert min(goodness_of_fit(first, p1), goodness_of_fit(joint, p12)) < 1e-3


# ------------------------------------------------------------------------------------------------ collection
def test_collection_runs_on_a_padded_pair(tmp_path):
    """collect (with the target's continuations, which reach its extra rows) and collect_along_answers (answers
    holding such ids): the draft reads them through its own rows; labels compare the real ids."""
    target, draft = padded_pair(extra="random")
    generator = torch.Generator().manual_seed(0)
    texts = [torch.randint(1, DRAFT_ROWS, (24,), generator=generator).tolist() for _ in range(4)]
    for temperature in (0.0, 1.0):
        config = CollectConfig(max_draft_tokens=4, positions_per_text=3, min_prefix=4, batch_size=4, shard_size=64,
                               target_continuation=12, temperature=temperature)
        out = collect(target, draft, tmp_path / f"collect-{temperature}", token_ids=texts, config=config,
                      tokenizer=TOKENIZER, progress=False)
        labels = torch.tensor([row["labels"] for row in load_traces(out)])
        assert ((labels == -100) | ((labels >= 0) & (labels <= 1))).all() and (labels > 0).any()
    answer = plain_greedy(target, PROMPT, max_new_tokens=NEW)[0, PROMPT.shape[1]:].tolist()
    assert max(answer) >= DRAFT_ROWS
    records = [{"prompt": PROMPT[0].tolist(), "response": answer, "top_logp": [[-0.1]] * len(answer)}]
    for forced in (False, True):
        out = collect_along_answers(draft, records, tmp_path / f"answers-{forced}", max_draft_tokens=4,
                                    teacher_forced=forced, progress=False)
        labels = torch.tensor([row["labels"] for row in load_traces(out)])
        assert (labels == 1).any() and (labels == 0).any()


# ------------------------------------------------------------------------------------------------ refusals
def test_a_draft_head_wider_than_the_target_is_refused():
    target, _ = padded_pair(extra="random")
    wider = build_model("llama", vocab_size=TARGET_ROWS + 16).double()
    with pytest.raises(ValueError, match="vocabularies differ.*wider than the target's"):
        target.generate(PROMPT, max_new_tokens=4, assistant_model=wider, pacer="sd-fixed-3")
    with pytest.raises(ValueError, match="vocabularies differ.*--draft"):
        check_pair(target, wider)


def test_configs_that_name_other_special_tokens_are_refused():
    """Without tokenizers the configs decide: BOS/EOS ids that disagree, or one past the draft's rows."""
    target, draft = padded_pair(extra="random")
    other = copy.deepcopy(draft)
    target_config, other.config.eos_token_id = copy.deepcopy(target.config), 7
    try:
        target.config.eos_token_id = 3
        with pytest.raises(ValueError, match=r"eos_token_id \[7\].*\[3\].*tokenizer= and assistant_tokenizer="):
            target.generate(PROMPT, max_new_tokens=4, assistant_model=other, pacer="sd-fixed-3")
        other.config.eos_token_id = 3
        target.generate(PROMPT, max_new_tokens=4, assistant_model=other, pacer="sd-fixed-3")  # they agree
        target.config.bos_token_id = other.config.bos_token_id = DRAFT_ROWS + 2
        with pytest.raises(ValueError, match=f"bos_token_id \\[{DRAFT_ROWS + 2}\\] has no row in the draft"):
            target.generate(PROMPT, max_new_tokens=4, assistant_model=other, pacer="sd-fixed-3")
    finally:
        target.config = target_config


def test_tokenizers_decide_when_the_call_has_them():
    target, draft = padded_pair(extra="random")
    run = {"max_new_tokens": 4, "do_sample": False, "assistant_model": draft, "pacer": "sd-fixed-3"}
    with pytest.raises(ValueError, match="tokenizer and assistant_tokenizer map tokens to different ids"):
        target.generate(PROMPT, tokenizer=TOKENIZER, assistant_tokenizer=word_tokenizer(DRAFT_ROWS, swap=True), **run)
    with pytest.raises(ValueError, match=f"tokenizer has {DRAFT_ROWS + 4} tokens, more than the {DRAFT_ROWS} rows"):
        target.generate(PROMPT, tokenizer=word_tokenizer(DRAFT_ROWS + 4), **run)
    with pytest.raises(ValueError, match="output rows: pass the --tokenizer"):
        check_pair(target, draft, word_tokenizer(DRAFT_ROWS + 4))
    with pytest.raises(TypeError, match="tokenizer= must be a transformers tokenizer"):
        target.generate(PROMPT, tokenizer="w0 w1", **run)
    expected = plain_greedy(target, PROMPT, max_new_tokens=4)
    assert torch.equal(target.generate(PROMPT, tokenizer=TOKENIZER, assistant_tokenizer=TOKENIZER, **run), expected)
    check_pair(target, draft, TOKENIZER)


def test_tokenizers_are_compared_for_heads_of_one_width_too():
    target = build_model("llama", vocab_size=DRAFT_ROWS).double()
    draft = cut_copy(target, DRAFT_ROWS, noise=0.03)
    pacer_hf.enable(target)
    run = {"max_new_tokens": 6, "do_sample": False, "assistant_model": draft, "pacer": "sd-fixed-3"}
    with pytest.raises(ValueError, match="map tokens to different ids"):
        target.generate(PROMPT, tokenizer=TOKENIZER, assistant_tokenizer=word_tokenizer(DRAFT_ROWS, swap=True), **run)
    expected = plain_greedy(target, PROMPT, max_new_tokens=6)
    for loop in ("lean", "transformers"):  # transformers refuses assistant_tokenizer for one vocab_size: not passed on
        out = target.generate(PROMPT, tokenizer=TOKENIZER, assistant_tokenizer=TOKENIZER, pacer_loop=loop, **run)
        assert torch.equal(out, expected)


def test_transformers_loop_without_tokenizers_says_what_to_pass():
    target, draft = padded_pair(extra="random")
    with pytest.raises(ValueError, match="pacer_loop='transformers'.*tokenizer= and assistant_tokenizer=.*'lean'"):
        target.generate(PROMPT, max_new_tokens=4, assistant_model=draft, pacer="sd-fixed-3", pacer_loop="transformers")
