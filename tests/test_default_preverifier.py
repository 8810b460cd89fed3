"""The default pre-verifier shipped in the package (hub_cards/default-preverifier): what it reads, when generate
uses it, that an attached or passed one still wins, and what `last_stats` says about it."""

from __future__ import annotations

import pytest
import torch
from conftest import build_draft, build_model, make_preverifier, plain_greedy
from helpers import prompt

import pacer_hf
from pacer_hf import attached
from pacer_hf._paths import hub_cards_dir
from pacer_hf.attached import DEFAULT_PREVERIFIER, DEFAULT_PREVERIFIER_SAMPLING, default_preverifier
from pacer_hf.modeling_pacer import PacerPreVerifier

SHIPPED = hub_cards_dir() / DEFAULT_PREVERIFIER


@pytest.mark.parametrize("do_sample,decoding", [(False, "greedy"), (True, "sampling")])
def test_shipped_default_reads_what_every_draft_gives(do_sample, decoding):
    """Features and loop state only (no hidden-state input, no draft named), the expected-gain rule, one per
    decoding mode, small enough to ship inside the package."""
    pv = default_preverifier(do_sample)
    config = pv.config
    assert (config.input_mode, config.loop_features, config.decision_rule) == ("features", True, "expected_gain")
    assert config.draft_signature is None and pv.hidden_proj is None and pv.loop_proj is not None
    assert config.decoding == decoding
    assert {"draft_cost", "verify_cost"} <= set(config.calibration)
    folder = SHIPPED / DEFAULT_PREVERIFIER_SAMPLING if do_sample else SHIPPED
    assert (folder / "model.safetensors").stat().st_size < 400_000
    heldout = config.training["metrics"]["heldout_pairs"]
    assert heldout and not set(heldout) & set(config.training["train_pairs"])
    assert all(0.5 < m["auc"] <= 1.0 and 0.0 <= m["ece"] < 0.2 for m in heldout.values())


@pytest.mark.parametrize("arch", ["llama", "gpt2", "qwen2"])
@pytest.mark.parametrize("kind", ["noisy", "random"])
def test_pacer_true_without_a_preverifier_uses_the_default(pair, arch, kind):
    """Any draft (a perturbed copy, an unrelated narrower model: other hidden sizes) with none attached: the
    default decides, the output is the target's own, and last_stats names it."""
    target, draft = pair(arch, kind)
    assert attached.attached_preverifier(draft, False) is None
    ids = prompt(10, seed=3)
    out = target.generate(ids, max_new_tokens=24, do_sample=False, assistant_model=draft, pacer=True)
    assert torch.equal(out, plain_greedy(target, ids, max_new_tokens=24))
    stats = pacer_hf.last_stats(target)
    assert stats.strategy == "pacer" and stats.preverifier == "default" and stats.draft_lengths
    assert stats.to_dict()["preverifier"] == "default"


def test_attached_or_passed_wins_over_the_default(pair):
    target, draft = pair("llama", "noisy")
    ids = prompt(10, seed=4)
    reference = plain_greedy(target, ids, max_new_tokens=16)
    passed = make_preverifier(draft, block_size=1, threshold=1.0, max_draft_tokens=5)  # stops after every token
    out = target.generate(ids, max_new_tokens=16, do_sample=False, assistant_model=draft, pacer=passed)
    assert torch.equal(out, reference) and pacer_hf.last_stats(target).preverifier == "passed"
    assert max(pacer_hf.last_stats(target).draft_lengths) == 1
    own = make_preverifier(draft, block_size=1, threshold=0.0, max_draft_tokens=5)  # never stops early
    try:
        pacer_hf.attach(draft, own)
        out = target.generate(ids, max_new_tokens=16, do_sample=False, assistant_model=draft, pacer=True)
        assert torch.equal(out, reference) and pacer_hf.last_stats(target).preverifier == "attached"
        assert max(pacer_hf.last_stats(target).draft_lengths) == 5
        out = target.generate(ids, max_new_tokens=16, do_sample=False, assistant_model=draft, pacer=passed)
        assert pacer_hf.last_stats(target).preverifier == "passed"  # passed beats attached
    finally:
        attached.detach(draft)
    target.generate(ids, max_new_tokens=8, do_sample=False, assistant_model=draft, pacer="sd-fixed-3")
    assert pacer_hf.last_stats(target).preverifier is None  # no pre-verifier decided


def test_batch_uses_the_default(pair):
    """The batch loop gets the same pre-verifier: each row is its own greedy output, last_stats says default."""
    target, draft = pair("llama", "noisy")
    rows = [prompt(9, seed=5), prompt(9, seed=6)]
    ids = torch.cat(rows)
    out = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=16, do_sample=False,
                          assistant_model=draft, pacer=True)
    for row, single in zip(out, rows):
        assert torch.equal(row[None], plain_greedy(target, single, max_new_tokens=16))
    stats = pacer_hf.last_stats(target)
    assert stats.preverifier == "default" and len(stats.rows) == 2


def test_sampled_calls_take_the_sampling_default(pair, monkeypatch):
    target, draft = pair("llama", "noisy")
    asked = []

    def spy(do_sample=False, device="cpu"):
        asked.append(do_sample)
        return default_preverifier(do_sample, device)

    monkeypatch.setattr(attached, "default_preverifier", spy)
    torch.manual_seed(0)
    target.generate(prompt(8), max_new_tokens=12, do_sample=True, assistant_model=draft, pacer=True)
    assert asked == [True] and pacer_hf.last_stats(target).preverifier == "default"
    target.generate(prompt(8), max_new_tokens=12, do_sample=False, assistant_model=draft, pacer=True)
    assert asked == [True, False]


def test_any_hidden_size_but_a_named_draft_is_still_checked():
    """check_draft: a features-only pre-verifier that names no draft takes drafts of any width; one that records
    its draft's signature (or reads hidden states) still refuses another draft."""
    pv = default_preverifier(False)
    for hidden in (16, 48):
        pv.check_draft(build_model("qwen2", hidden=hidden, layers=1))
    target = build_model("llama")
    draft = build_draft(target, "noisy")
    named = make_preverifier(draft, input_mode="features")
    named.check_draft(draft)
    with pytest.raises(ValueError, match="was trained for draft"):  # it reads no hidden state: the signature refuses
        named.check_draft(build_model("llama", hidden=48))


def test_missing_or_wrong_default_is_a_clear_error(tmp_path, monkeypatch, pair):
    target, draft = pair("llama", "noisy")
    monkeypatch.setattr(attached, "hub_cards_dir", lambda: tmp_path)
    attached._default_preverifier.cache_clear()
    try:
        with pytest.raises(ValueError, match="default pre-verifier is not installed"):
            target.generate(prompt(8), max_new_tokens=4, do_sample=False, assistant_model=draft, pacer=True)
        PacerPreVerifier.from_draft(draft).save_pretrained(tmp_path / DEFAULT_PREVERIFIER)  # reads hidden states
        with pytest.raises(ValueError, match="is not a default pre-verifier"):
            target.generate(prompt(8), max_new_tokens=4, do_sample=False, assistant_model=draft, pacer=True)
    finally:
        attached._default_preverifier.cache_clear()


def test_default_keeps_the_sampling_distribution(sampling_pair):
    """do_sample=True with none attached: the default's sampling twin decides, and the first two tokens follow
    the target's own distribution (chi-square), drafts partly accepted. Round costs given, so the decisions do not
    depend on this machine's timings."""
    from helpers import exact_distributions, goodness_of_fit, sample_counts

    target, draft = sampling_pair
    assert attached.attached_preverifier(draft, True) is None
    p1, p12 = exact_distributions(target)
    costs = [1.0 + 0.1 * k for k in range(17)]  # a draft step costs little: rounds draft several tokens
    first, joint, accepted = sample_counts(target, draft, True, seed=1, pacer_costs=costs)
    assert pacer_hf.last_stats(target).preverifier == "default"
    assert 0 < sum(accepted) < 2 * len(accepted), "drafts must be partly accepted for the test to mean much"
    assert goodness_of_fit(first, p1) > 1e-3
    assert goodness_of_fit(joint, p12) > 1e-3


def test_the_rule_decides_on_the_online_map_of_the_logits():
    """Both scoring paths keep the pre-verifier's own logits (what the calibration learns from) and decide on
    a * z + b; a fresh map is the identity."""
    from pacer_hf.loops.block_scorer import BlockScorer
    from pacer_hf.loops.recent_acceptance import RecentAcceptance
    from pacer_hf.loops.stop_rule import PacerStopRule
    from pacer_hf.stats import PacerStats

    pv = default_preverifier(False)
    hidden, logits = torch.randn(6, 1, 1), torch.randn(6, 1, 96) * 3
    raws = {}
    for path in ("compiled", "torch"):
        memory = RecentAcceptance()
        calibration = memory.calibration_for(pv)
        assert (calibration.scale, calibration.shift) == (1.0, 0.0) and memory.calibration_for(pv) is calibration
        calibration.scale, calibration.shift = 0.5, 2.0
        rule = PacerStopRule(pv, PacerStats(strategy="t"), recent=memory)
        if path == "torch":
            rule.scorer, rule.blocks = None, BlockScorer(pv)
        rule.start_round()
        for i in range(6):
            rule.add_token(hidden[i], logits[i], logits[i].argmax(-1, keepdim=True))
        raws[path] = torch.tensor(rule.raw_logits)
        assert rule.token_logits == pytest.approx([0.5 * z + 2.0 for z in rule.raw_logits])
        if path == "compiled":
            assert rule.scorer.logits[:6].tolist() == pytest.approx(rule.token_logits)
    torch.testing.assert_close(raws["compiled"], raws["torch"], atol=1e-4, rtol=1e-4)
    fitted = make_preverifier(build_draft(build_model("llama"), "noisy"))
    assert RecentAcceptance().calibration_for(fitted) is None, "a pre-verifier trained for its pair keeps its logits"


def test_the_default_learns_a_pairs_acceptance_across_calls():
    """On a pair the default under-rates (a copy of the target: every drafted token accepted), the map moves the
    probabilities up from the verified rounds, kept between calls, and the output stays the target's own."""
    from pacer_hf.loops.recent_acceptance import recent_acceptance_for

    target = build_model("llama", seed=5).double()
    draft = build_draft(target, "copy")
    pacer_hf.enable(target)
    pv = default_preverifier(False)
    cheap = [1.0 + 0.05 * k for k in range(pv.config.max_draft_tokens + 1)]  # drafting nearly free: long rounds pay
    for seed in range(4):
        ids = prompt(10, seed=seed)
        out = target.generate(ids, max_new_tokens=40, do_sample=False, assistant_model=draft, pacer=True,
                              pacer_costs=cheap)
        assert torch.equal(out, plain_greedy(target, ids, max_new_tokens=40))
    calibration = recent_acceptance_for(target, draft, False).calibrations[pv]
    assert calibration.labels >= 64 and calibration.shift > 0.5
    stats = pacer_hf.last_stats(target)
    assert stats.alpha == 1.0 and stats.online_calibration == calibration.summary()
    fitted = make_preverifier(draft, block_size=1, max_draft_tokens=5)
    target.generate(prompt(10, seed=9), max_new_tokens=8, do_sample=False, assistant_model=draft, pacer=fitted)
    assert pacer_hf.last_stats(target).online_calibration is None
