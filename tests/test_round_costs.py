"""Round costs from the machine that runs the call (costs/round_costs.py): probe, online refinement, disk
cache, `pacer_costs=`, and decisions that follow the cost curve, for the lookup gate and the pre-verifier."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from conftest import build_draft, build_model, make_preverifier, plain_greedy

import pacer_hf
from pacer_hf.costs import RoundCosts, round_costs

REPEATING = torch.tensor([[5, 6, 7, 8, 9, 10, 11, 12, 5, 6, 7, 8, 40, 41, 5, 6, 7, 8, 9, 10, 5, 6, 7]])
FLAT = [1.0] * 11  # a GPU-like curve: verifying 11 tokens costs what one does
STEEP = [1.0 + 2.0 * k for k in range(11)]  # every proposed token costs two decoding steps


@pytest.fixture(autouse=True)
def fresh_costs(monkeypatch):
    """Every test starts with no probe cached in the process and no disk cache."""
    monkeypatch.setattr(round_costs, "_PROCESS", {})
    monkeypatch.setattr(round_costs, "_FORWARDS", {})
    monkeypatch.delenv(round_costs.COST_CACHE_ENV, raising=False)


@pytest.fixture(scope="module")
def targets():
    # two tokenizers' worth of vocabulary: the default gate has no vocabulary lock
    return {"llama-96": pacer_hf.enable(build_model("llama")),
            "gpt2-300": pacer_hf.enable(build_model("gpt2", vocab_size=300, seed=3))}


def fake_probe(monkeypatch, curve: list[float]) -> list[int]:
    """Replace the forward probe by a fake cost curve; returns the list the probe's calls are counted in."""
    calls = []

    def time_forwards(model, widths, **kwargs):
        calls.append(widths)
        return [0.01 * curve[w] for w in range(widths)]

    monkeypatch.setattr(round_costs, "time_forwards", time_forwards)
    return calls


def lookup(target, **kwargs):
    out = target.generate(REPEATING, max_new_tokens=20, do_sample=False, prompt_lookup_num_tokens=10, pacer=True,
                          **kwargs)
    return out, pacer_hf.last_stats(target)


def test_online_rounds_refine_the_probe():
    """Rounds supply the probe's scale and a per-round offset; the probe keeps the curve's shape, whatever the
    per-length noise, and too few rounds leave the probe alone."""
    probe = [1.0, 2.0, 1.5, 4.0]  # width 2 a slow kernel on this machine, as probes find
    costs = RoundCosts(probe, "probe")
    assert costs.table() == probe
    for _ in range(round_costs.MIN_ROUNDS - 1):
        costs.observe(1, 3.0 * 2.0 + 0.5)
    assert costs.seconds() == probe, "too few rounds: the probe still decides"
    for k in (0, 2, 3, 0, 2, 3, 1):  # every round costs 3 x the probe + 0.5 s the probe leaves out
        costs.observe(k, 3.0 * probe[k] + 0.5)
    assert costs.seconds() == pytest.approx([3.0 * v + 0.5 for v in probe])
    assert costs.summary()["source"] == "probe+online" and costs.summary()["online_rounds"] == 14
    assert costs.summary()["fit"] == {"scale": 3.0, "offset_ms": 500.0}
    noisy = RoundCosts(probe, "probe")
    rng = np.random.default_rng(0)
    for _ in range(200):  # per-length noise and a few outliers: the fitted curve keeps the probe's shape
        k = int(rng.integers(0, 4))
        noisy.observe(k, (2.0 * probe[k] + 0.2) * float(rng.uniform(0.8, 1.25)) * (10.0 if rng.random() < 0.03 else 1.0))
    seconds = noisy.seconds()
    assert seconds[2] < seconds[1] < seconds[3] and seconds[0] < seconds[2]
    one_length = RoundCosts(probe, "probe")  # a single length: its scale, no offset
    for _ in range(round_costs.MIN_ROUNDS):
        one_length.observe(2, 3.0)
    assert one_length.seconds() == pytest.approx([2.0 * v for v in probe])
    cheaper_long = RoundCosts(probe, "probe")  # a fit needing a negative offset falls back to scale only
    for k, seconds in ((0, 0.1), (3, 8.0)) * 4:
        cheaper_long.observe(k, seconds)
    assert cheaper_long.fit[1] == 0.0 and cheaper_long.seconds()[0] > 0
    fixed = RoundCosts([1.0, 2.0], "given", online=False)
    fixed.observe(1, 100.0)
    assert fixed.table() == [1.0, 2.0]
    with pytest.raises(ValueError, match="positive"):
        RoundCosts([1.0, 0.0], "given")


@pytest.mark.parametrize("name", ["llama-96", "gpt2-300"])
def test_default_gate_serves_any_vocabulary_exactly(targets, name):
    """No gate attached: pacer=True uses the gate shipped in the package; output is the target's; the first call
    probes this machine (once per process), later calls reuse and refine it."""
    target = targets[name]
    assert getattr(target, "_pacer_lookup_gate", None) is None
    out, stats = lookup(target)
    assert torch.equal(out, plain_greedy(target, REPEATING, max_new_tokens=20))
    assert stats.strategy == "pacer-lookup" and stats.costs["source"].startswith("probe")
    assert stats.costs["probe_seconds"] > 0 and len(stats.costs["table"]) == 11 and stats.costs["table"][0] == 1.0
    assert stats.costs["device"] == "cpu" and stats.costs["threads"] == torch.get_num_threads()
    probe = round_costs._FORWARDS.copy()
    again, stats = lookup(target)
    assert torch.equal(again, out) and round_costs._FORWARDS == probe, "the probe runs once per process"
    sampled = target.generate(REPEATING, max_new_tokens=12, do_sample=True, prompt_lookup_num_tokens=10, pacer=True)
    assert sampled.shape[1] == REPEATING.shape[1] + 12


def test_decisions_follow_the_probed_cost_curve(targets, monkeypatch):
    """The same gate and text: a flat (GPU-like) probed curve proposes lookup tokens, a steep one proposes none."""
    target = targets["llama-96"]
    expected = plain_greedy(target, REPEATING, max_new_tokens=20)
    calls = fake_probe(monkeypatch, FLAT)
    out, flat = lookup(target, pacer_costs="probe")
    assert calls == [11] and flat.costs["source"] == "probe" and flat.costs["table"] == FLAT
    monkeypatch.setattr(round_costs, "_PROCESS", {})
    monkeypatch.setattr(round_costs, "_FORWARDS", {})
    fake_probe(monkeypatch, STEEP)
    out_steep, steep = lookup(target, pacer_costs="probe")
    assert steep.costs["table"] == pytest.approx(STEEP)
    assert torch.equal(out, expected) and torch.equal(out_steep, expected)
    assert sum(flat.draft_lengths) > 0 and sum(steep.draft_lengths) == 0, (flat.draft_lengths, steep.draft_lengths)
    # a given list decides the same way, without probing
    given = fake_probe(monkeypatch, STEEP)
    _, listed = lookup(target, pacer_costs=FLAT)
    assert listed.costs["source"] == "given" and listed.draft_lengths == flat.draft_lengths and not given


def test_probe_is_cached_on_disk_keyed_by_what_it_measured(targets, monkeypatch, tmp_path):
    target = targets["gpt2-300"]
    cache = tmp_path / "costs.json"
    monkeypatch.setenv(round_costs.COST_CACHE_ENV, str(cache))
    calls = fake_probe(monkeypatch, FLAT)
    lookup(target, pacer_costs="probe")
    entries = json.loads(cache.read_text())
    (entry,) = entries.values()
    assert entry["seconds"] == pytest.approx([0.01] * 11) and entry["device"] == "cpu" and "processor" in entry
    monkeypatch.setattr(round_costs, "_PROCESS", {})  # a new process: nothing in memory, the file remains
    monkeypatch.setattr(round_costs, "_FORWARDS", {})
    _, stats = lookup(target, pacer_costs="probe")
    assert calls == [11] and stats.costs["probe_seconds"] == 0.0 and stats.costs["table"] == FLAT
    torch.set_num_threads(torch.get_num_threads())  # same threads: same key
    other = targets["llama-96"]
    lookup(other, pacer_costs="probe")
    assert calls == [11, 11] and len(json.loads(cache.read_text())) == 2, "another model is another key"


def test_preverifier_expected_gain_follows_the_cost_curve(monkeypatch):
    """A pre-verifier deciding by expected gain drafts on while verifying is cheap, and stops when it is not."""
    target = pacer_hf.enable(build_model("llama", seed=7))
    draft = build_draft(target, "noisy")
    calibration = {"draft_cost": 0.1, "verify_cost": [1.0 + 0.1 * k for k in range(9)], "round_overhead": 0.1}
    pv = make_preverifier(draft, block_size=1, max_draft_tokens=6, decision_rule="expected_gain",
                          calibration=calibration)
    expected = plain_greedy(target, REPEATING, max_new_tokens=16)
    lengths = {}
    for name, curve in (("flat", [1.0] * 7), ("steep", [1.0 + 3.0 * k for k in range(7)])):
        out = target.generate(REPEATING, max_new_tokens=16, do_sample=False, assistant_model=draft, pacer=pv,
                              pacer_costs=curve)
        stats = pacer_hf.last_stats(target)
        assert torch.equal(out, expected) and stats.costs["source"] == "given"
        lengths[name] = stats.mean_draft_len
    assert lengths["flat"] > lengths["steep"], lengths
    out = target.generate(REPEATING, max_new_tokens=16, do_sample=False, assistant_model=draft, pacer=pv)
    stats = pacer_hf.last_stats(target)
    assert torch.equal(out, expected) and stats.costs["source"].startswith("probe")
    assert stats.costs["draft_token_ms"] > 0
    target.generate(REPEATING, max_new_tokens=16, do_sample=False, assistant_model=draft, pacer=pv, pacer_costs="prior")
    assert pacer_hf.last_stats(target).costs["source"] == "prior"


def test_pacer_costs_errors_name_the_argument(targets):
    target = targets["llama-96"]
    with pytest.raises(ValueError, match="pacer_costs='fast'.*'measure'"):
        lookup(target, pacer_costs="fast")
    with pytest.raises(ValueError, match="positive numbers"):
        lookup(target, pacer_costs=[1.0, -1.0])
    with pytest.raises(ValueError, match="pacer_costs='prior'.*no cost table"):
        lookup(target, pacer_costs="prior")  # the default gate ships no training machine's table


def _drafted(stats) -> list[int]:
    """Tokens drafted per round: those proposed plus those a greedy round's best prefix left out."""
    return [n + stats.trimmed.get(i, 0) for i, n in enumerate(stats.draft_lengths)]


def _expected_gain_preverifier(draft, **overrides):
    calibration = {"draft_cost": 0.1, "verify_cost": [1.0 + 0.1 * k for k in range(9)], "round_overhead": 0.1}
    return make_preverifier(draft, decision_rule="expected_gain", calibration=calibration, block_size=1,
                            max_draft_tokens=6, **overrides)


@pytest.mark.parametrize(("kind", "per_token", "plain"), [("random", 0.6, True), ("random", 0.1, True),
                                                         ("noisy", 0.1, False)])
def test_a_draft_that_cannot_pay_falls_back_to_plain_steps(kind, per_token, plain):
    """A draft the target rejects (random weights), on its first call: after the first rounds the rule drafts
    nothing but a probe round every PROBE_EVERY + 1, and the output is the target's own. A draft the target mostly
    accepts, where a drafted token costs a tenth of a target step, keeps drafting every round."""
    from pacer_hf.loops.stop_rule import PROBE_EVERY

    target = pacer_hf.enable(build_model("llama"))
    draft = build_draft(target, kind)
    ids = torch.tensor([[5, 17, 33, 60, 5, 17, 33, 60]])
    expected = plain_greedy(target, ids, max_new_tokens=64)
    costs = [1.0 + per_token * k for k in range(7)]
    out = target.generate(ids, max_new_tokens=64, do_sample=False, assistant_model=draft,
                          pacer=_expected_gain_preverifier(draft), pacer_costs=costs)
    assert torch.equal(out, expected)
    lengths = _drafted(pacer_hf.last_stats(target))[:-1]  # the last round's budget may be cut by max_new_tokens
    if plain:
        assert lengths[0] > 0, "the first round drafts: nothing is known of the draft yet"
        drafting = [i for i, n in enumerate(lengths) if n > 0]
        assert len(lengths) > 2 * len(drafting), lengths
        gaps = [b - a for a, b in zip(drafting, drafting[1:]) if b - a > 1]  # between probe rounds
        assert len(gaps) >= 2 and all(gap == PROBE_EVERY + 1 for gap in gaps), lengths
    else:
        assert 0 not in lengths, lengths


def test_a_pair_that_did_not_pay_starts_its_next_call_plain():
    """What calls learned of a pair's acceptance is kept for the next one (`RecentAcceptance` on the target, per
    draft and decoding mode): once a few calls have shown that the draft does not pay, the next call's first rounds
    draft nothing, so the draft does not even read the prompt; the output is still the target's own. Another draft
    object, or the other decoding mode, starts fresh."""
    from pacer_hf.loops.recent_acceptance import recent_acceptance_for

    target = pacer_hf.enable(build_model("llama"))
    draft = build_draft(target, "random")
    ids = torch.tensor([[5, 17, 33, 60, 5, 17, 33, 60]])
    expected = plain_greedy(target, ids, max_new_tokens=24)
    costs = [1.0 + 0.6 * k for k in range(7)]
    preverifier = _expected_gain_preverifier(draft)

    def call(model_draft):
        out = target.generate(ids, max_new_tokens=24, do_sample=False, assistant_model=model_draft, pacer=preverifier,
                              pacer_costs=costs)
        assert torch.equal(out, expected)
        return pacer_hf.last_stats(target)

    first = call(draft)
    assert _drafted(first)[0] > 0, "nothing known of the pair yet: the first call drafts"
    recent = recent_acceptance_for(target, draft, do_sample=False)
    calls = 1
    while not recent.known:  # a few calls' worth of judged tokens
        assert _drafted(call(draft))[0] > 0, "not known yet: each call judges its own first tokens"
        calls += 1
        assert calls < 20
    assert (recent.long_accepted + 1) / (recent.long_tried + 2) < 0.5
    later = call(draft)
    assert _drafted(later)[:4] == [0, 0, 0, 0], _drafted(later)
    assert later.draft_forwards < first.draft_forwards
    assert recent_acceptance_for(target, draft, do_sample=True).tried == 0, "sampling keeps its own"
    fresh = build_draft(target, "random")
    assert _drafted(call(fresh))[0] > 0, "another draft starts fresh"


def _one_share(recent) -> float:
    """One acceptance share for every judged token, first tokens and later ones alike (what the rule does not use)."""
    return (recent.accepted + 1) / (recent.tried + 2)


def _pays_at(share: float, table: list[float], first: float | None = None) -> bool:
    """Brute force: some length k, k tokens accepted in a row, the first with `first` (default `share`) and each
    later one with `share`, beats a plain step under `table`."""
    first = share if first is None else first
    return any((1 + sum(first * share ** (i - 1) for i in range(1, k + 1))) / table[k] > 1 / table[0]
               for k in range(1, len(table)))


def test_one_call_the_draft_could_not_follow_does_not_turn_the_next_call_plain():
    """A pair that paid over many rounds, then one request it could not follow: within that call the recent share
    falls and the rule drafts nothing; the next call restarts from the long-run share (weighed as MIN_TRIED judged
    tokens) and drafts at once, and goes on drafting through rejected rounds until MIN_TRIED of its own tokens
    were judged. A pair that never paid starts its next call plain."""
    from pacer_hf.loops.stop_rule import MIN_TRIED, PacerStopRule, RecentAcceptance
    from pacer_hf.stats import PacerStats

    preverifier = _expected_gain_preverifier(build_draft(build_model("llama"), "noisy"))
    costs = RoundCosts([1.0 + 0.8 * k for k in range(7)], "given", online=False)  # pays at a high share only
    recent = RecentAcceptance()
    for _ in range(200):
        recent.add(6, 6)  # every drafted token accepted
    for _ in range(10):
        recent.add(0, 6)  # one request the draft could not follow
    bad_call = PacerStopRule(preverifier, PacerStats("t"), costs, recent=None)
    bad_call.recent, bad_call.judged = recent, 60.0
    assert not bad_call.drafts_this_round(1), "within the call, its recent rounds decide"
    next_call = PacerStopRule(preverifier, PacerStats("t"), costs, recent=recent)
    assert recent.tried == MIN_TRIED and recent.first_tried == MIN_TRIED / 2
    assert recent.first_share == pytest.approx(recent.long_first_share)
    assert recent.next_share == pytest.approx(recent.long_next_share)
    assert next_call.drafts_this_round(1)
    next_call.end_round(0, 6, torch.zeros(96))  # its first round, right after the prompt: not counted
    assert recent.tried == MIN_TRIED and next_call.judged == 0
    for _ in range(3):  # its next rounds rejected at once: three judged tokens, no evidence yet
        next_call.end_round(0, 6, torch.zeros(96))
    assert not _pays_at(recent.next_share, costs.seconds(), recent.first_share) and next_call.drafts_this_round(1)
    next_call.end_round(0, 6, torch.zeros(96))  # the fourth: now its own rounds decide
    assert not next_call.drafts_this_round(1)
    never = RecentAcceptance()
    for _ in range(50):
        never.add(0, 6)
    assert not PacerStopRule(preverifier, PacerStats("t"), costs, recent=never).drafts_this_round(1)


def test_a_probe_waits_until_its_catch_up_is_a_small_share_of_the_plain_time():
    """A probe round makes the draft read every token it skipped first: with the draft reading a token in a third
    of a plain step, 290 unread tokens wait until their reading is PROBE_SHARE of the plain rounds' time; with
    reading almost free, probes wait probe_every plain rounds. Each probe that leaves drafting unpaid doubles probe_every, up to
    MAX_PROBE_EVERY; a round expected to pay resets it. A pair that pays in the long run probes every PROBE_EVERY
    plain rounds whatever its catch-up costs."""
    from pacer_hf.loops.stop_rule import MAX_PROBE_EVERY, PROBE_EVERY, PROBE_SHARE, PacerStopRule
    from pacer_hf.stats import PacerStats

    rule = PacerStopRule(_expected_gain_preverifier(build_draft(build_model("llama"), "noisy")), PacerStats("t"))
    rule.costs = RoundCosts([1.0 + 0.8 * k for k in range(7)], "given", online=False)  # pays at a high share only
    rule.recent.tried, rule.recent.long_tried = 10.0, 40.0  # a pair known not to pay
    rule.recent.accepted, rule.recent.long_accepted = 2.0, 8.0
    rule.judged = 10.0
    step = rule.costs.seconds()[0]
    rule.recent.read(300, 300 * step / 3)
    waits = []
    for unread in (290, 1, 1, 1, 1, 1):
        plain = 0
        while not rule.drafts_this_round(unread):
            plain += 1
        waits.append(plain)
        rule.recent.read(300, 300 * step / 1000)  # from here on, reading costs next to nothing
    assert waits[0] == math.ceil(290 / 3 / PROBE_SHARE) - 1, waits
    assert waits[1:] == [min(PROBE_EVERY * 2 ** i, MAX_PROBE_EVERY) for i in range(1, 6)], waits
    rule.recent.accepted, rule.recent.first_tried, rule.recent.first_accepted = 10.0, 4.0, 4.0  # drafting pays now
    assert rule.drafts_this_round(1) and rule.recent.probe_every == PROBE_EVERY
    rule.recent.accepted, rule.recent.first_accepted = 2.0, 0.0  # a pair that pays in the long run, in a bad stretch
    rule.recent.long_accepted, rule.recent.long_first_tried, rule.recent.long_first_accepted = 40.0, 8.0, 8.0
    for _ in range(3):
        plain = 0
        while not rule.drafts_this_round(1):
            plain += 1
        assert plain == PROBE_EVERY, "its probes do not back off"


def test_no_one_call_pays_more_than_its_share_for_a_probe():
    """A known pair that does not pay, long past its last probe (plain rounds in earlier calls): a probe whose catch-up
    (290 unread tokens at a third of a plain step each) costs more than PROBE_SHARE of the plain steps the call has
    left waits for a call with more left; without a length limit, the plain rounds since the last probe decide."""
    from pacer_hf.loops.stop_rule import PROBE_SHARE, PacerStopRule
    from pacer_hf.stats import PacerStats

    def rule() -> PacerStopRule:
        made = PacerStopRule(_expected_gain_preverifier(build_draft(build_model("llama"), "noisy")), PacerStats("t"))
        made.costs = RoundCosts([1.0 + 0.8 * k for k in range(7)], "given", online=False)
        made.recent.tried, made.recent.long_tried, made.recent.accepted, made.recent.long_accepted = 10.0, 40.0, 2.0, 8.0
        made.judged, made.recent.skipped = 10.0, 10**6
        made.recent.read(300, 300 * made.costs.seconds()[0] / 3)
        return made

    enough = math.ceil(290 / 3 / PROBE_SHARE)
    assert not rule().drafts_this_round(290, enough - 2)
    assert rule().drafts_this_round(290, enough + 1)
    assert rule().drafts_this_round(290)


def test_plain_step_decision_is_the_best_expected_rate(monkeypatch):
    """drafts_this_round drafts exactly when some length k, at the recent accepted shares (k tokens in a row, the
    round's first accepted with the first tokens' share, each later one with the later tokens'), yields more tokens
    per second than a plain step: brute force over shares and cost tables."""
    from pacer_hf.loops.stop_rule import PacerStopRule
    from pacer_hf.stats import PacerStats

    target = build_model("llama")
    rule = PacerStopRule(_expected_gain_preverifier(build_draft(target, "noisy")), PacerStats("t"))
    generator = np.random.default_rng(0)
    for _ in range(200):
        table = np.cumsum(generator.uniform(0.05, 1.5, 7)).tolist()
        first, share = (float(x) for x in generator.uniform(0, 1, 2))
        rule.costs = RoundCosts(table, "given", online=False)
        recent = rule.recent
        recent.first_tried = recent.long_first_tried = 4.0
        recent.first_accepted = recent.long_first_accepted = first * 6.0 - 1.0  # (accepted + 1) / (tried + 2)
        recent.tried = recent.long_tried = 10.0  # 6 later tokens
        recent.accepted = recent.long_accepted = recent.first_accepted + share * 8.0 - 1.0
        assert (recent.first_share, recent.next_share) == (pytest.approx(first), pytest.approx(share))
        recent.skipped, rule.judged = 0, 10.0
        assert rule.drafts_this_round() == _pays_at(share, table, first)


def test_acceptance_estimate_counts_the_tokens_tried():
    """A round that drafted 4 and had 2 accepted tried 3 (the third was rejected, the fourth never judged): 2 of 3,
    not the accepted share 2 of 4, with one prior success and failure; counts decay by 0.9 a round; a plain round
    tells nothing. Fewer than MIN_TRIED judged tokens never fall back to plain rounds."""
    from pacer_hf.loops.stop_rule import MIN_TRIED, PacerStopRule
    from pacer_hf.stats import PacerStats

    rule = PacerStopRule(_expected_gain_preverifier(build_draft(build_model("llama"), "noisy")), PacerStats("t"))
    rule.costs = RoundCosts([1.0 + 5.0 * k for k in range(7)], "given", online=False)  # drafting never pays
    scores = torch.zeros(96)
    rule.end_round(0, 4, scores)  # the call's first round: no evidence about the pair
    assert rule.recent.tried == rule.recent.first_tried == rule.judged == 0
    rule.end_round(2, 4, scores)
    assert _one_share(rule.recent) == pytest.approx((2 + 1) / (3 + 2))
    assert rule.recent.first_share == pytest.approx((1 + 1) / (1 + 2)), "its first token: accepted"
    assert rule.recent.next_share == pytest.approx((1 + 1) / (2 + 2)), "the two after it: one accepted, one not"
    assert rule.recent.tried < MIN_TRIED and rule.drafts_this_round(), "one round is no evidence"
    rule.end_round(4, 4, scores)
    assert _one_share(rule.recent) == pytest.approx((0.9 * 2 + 4 + 1) / (0.9 * 3 + 4 + 2))
    rule.end_round(3, 0, scores)
    assert _one_share(rule.recent) == pytest.approx((0.9 * 2 + 4 + 1) / (0.9 * 3 + 4 + 2))
    assert not rule.drafts_this_round()


def test_a_calls_opening_round_is_no_evidence_about_the_call():
    """A call's opening round drafts right after the prompt, where a chat answer's opening is often a token the draft
    could not guess. A pair that pays, opening a call with a rejected long round and a half-accepted short one, keeps
    drafting (three judged tokens, fewer than MIN_TRIED); counted, the same two rounds (four judged tokens, first
    tokens 1 in 2) would have sent it plain. The opening round still counts toward the pair's long-run counts, and
    from the second round on rounds count as before. A pair known not to pay opens its calls with a probe, whose
    verdict counts at once: it is the evidence the probe was for."""
    from pacer_hf.loops.stop_rule import MIN_TRIED, PacerStopRule, RecentAcceptance
    from pacer_hf.stats import PacerStats

    preverifier = _expected_gain_preverifier(build_draft(build_model("llama"), "noisy"))
    costs = RoundCosts([1.0 + 0.8 * k for k in range(7)], "given", online=False)  # pays at a high share only
    call = PacerStopRule(preverifier, PacerStats("t"), costs, recent=RecentAcceptance())
    call.end_round(0, 6, torch.zeros(96))
    assert call.recent.tried == call.recent.first_tried == call.judged == 0
    assert call.recent.long_tried == call.recent.long_first_tried == 1 and call.recent.long_first_accepted == 0
    call.end_round(2, 3, torch.zeros(96))
    assert call.judged == 3 < MIN_TRIED and call.drafts_this_round(1)
    counted = PacerStopRule(preverifier, PacerStats("t"), costs, recent=RecentAcceptance())
    for accepted, drafted in ((0, 0), (0, 6), (2, 3)):  # the same two rounds after a plain opening: both count
        counted.end_round(accepted, drafted, torch.zeros(96))
    assert counted.judged == MIN_TRIED and not counted.drafts_this_round(1)
    call.end_round(0, 6, torch.zeros(96))
    assert call.judged == MIN_TRIED and not call.drafts_this_round(1), "from the second round on, rounds count"

    loser = RecentAcceptance()
    for _ in range(50):
        loser.add(0, 6)
    probe = PacerStopRule(preverifier, PacerStats("t"), costs, recent=loser)
    assert loser.known_loser(costs.seconds())
    tried = loser.tried
    probe.end_round(0, 6, torch.zeros(96))
    assert probe.judged == 1 and loser.tried == pytest.approx(0.9 * tried + 1)


def test_a_known_pair_reads_a_long_prompt_only_when_the_answer_left_can_win_it_back():
    """For a known pair, a round that drafts first makes the draft read every token it has not seen: the rule drafts
    only when that catch-up, at the draft's measured reading speed, costs at most what the best length is expected
    to save over the tokens the call may still generate (at the better of the recent and long-run share). A pair
    that pays a little starts a long prompt with a short answer plain and its probes wait too; the same prompt with
    a long answer left, a pair that pays well, a short catch-up, or a pair not yet known, drafts at once."""
    from pacer_hf.loops.stop_rule import PacerStopRule, RecentAcceptance, saving_per_token
    from pacer_hf.stats import PacerStats

    preverifier = _expected_gain_preverifier(build_draft(build_model("llama"), "noisy"))
    costs = RoundCosts([1.0, 1.9, 2.4, 2.8, 3.1, 3.35, 3.55], "given", online=False)
    table = costs.seconds()

    def pair(share: float, judged: float = 200.0) -> RecentAcceptance:  # first tokens and later ones alike
        rounds = judged / 5
        recent = RecentAcceptance(long_tried=judged, long_first_tried=rounds,
                                  long_first_accepted=share * (rounds + 2) - 1)
        recent.long_accepted = recent.long_first_accepted + share * (judged - rounds + 2) - 1
        recent.read(400, 400 * table[0] / 20)  # the draft reads 20 tokens in a target step's time
        return recent

    little = pair(0.8)
    saving = saving_per_token(little.long_first_share, little.long_next_share, table)
    assert 0 < saving < 0.2 * table[0], "drafting pays, a little"
    read = 400 * little.read_seconds
    short, long = int(read / saving) // 2, int(read / saving) * 2
    rule = PacerStopRule(preverifier, PacerStats("t"), costs, recent=little)
    assert not any(rule.drafts_this_round(400 + i, short - i) for i in range(40)), "no read, no probe"
    assert PacerStopRule(preverifier, PacerStats("t"), costs, recent=pair(0.8)).drafts_this_round(400, long)
    assert PacerStopRule(preverifier, PacerStats("t"), costs, recent=pair(0.8)).drafts_this_round(2, short)
    assert PacerStopRule(preverifier, PacerStats("t"), costs, recent=pair(0.97)).drafts_this_round(400, short)
    assert PacerStopRule(preverifier, PacerStats("t"), costs, recent=pair(0.8, judged=8.0)).drafts_this_round(400, 4)
    for share in (0.0, 0.3, 0.6, 0.8, 0.95):
        assert (saving_per_token(share, share, table) > 0) == _pays_at(share, table)


def test_a_rounds_first_token_and_the_later_ones_are_judged_apart():
    """The first token of a round follows the target's own token and is accepted less often than one that follows
    an accepted draft token. Long accepted rounds followed by rounds whose first token is rejected: one share for
    all tokens still expects drafting to pay, the first tokens' share does not, and the rule takes plain steps. A
    draft whose first token is right and whose second is wrong: one share expects no gain, the split one drafts."""
    from pacer_hf.loops.stop_rule import PacerStopRule, RecentAcceptance
    from pacer_hf.stats import PacerStats

    preverifier = _expected_gain_preverifier(build_draft(build_model("llama"), "noisy"))

    def rule(table: list[float], rounds: list[tuple[int, int]]) -> PacerStopRule:
        made = PacerStopRule(preverifier, PacerStats("t"), RoundCosts(table, "given", online=False),
                             recent=RecentAcceptance())
        made.end_round(0, 0, torch.zeros(96))  # a call that opens with a plain round
        for accepted, drafted in rounds:
            made.end_round(accepted, drafted, torch.zeros(96))
        return made

    table = [1.0, 1.75, 2.0, 2.25, 2.5, 2.75, 3.0]
    stalled = rule(table, [(6, 6), (5, 5), (0, 1), (0, 1), (0, 1)])
    recent = stalled.recent
    assert recent.first_share < 0.4 < 0.85 < recent.next_share
    assert _pays_at(_one_share(recent), table), "one share for every token expects drafting to pay"
    assert not _pays_at(recent.next_share, table, recent.first_share)
    assert not stalled.drafts_this_round()

    table = [1.0, 1.6, 2.6, 3.6, 4.6, 5.6, 6.6]
    one_right = rule(table, [(1, 6)] * 6)
    recent = one_right.recent
    assert recent.first_share > 0.85 and recent.next_share < 0.15
    assert not _pays_at(_one_share(recent), table), "one share for every token (half accepted) expects no gain"
    assert one_right.drafts_this_round()
