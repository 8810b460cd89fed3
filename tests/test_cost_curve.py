"""The one cost-curve type (costs/curve.py): its policies, extrapolation and storage, and the classes built on it
(RoundCosts, StepCosts, BatchClock, CostModel) agreeing with it."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pacer_hf.costs import BatchClock, CostCurve, CostModel, RoundCosts, StepCosts, round_costs
from pacer_hf.costs.curve import fit_scale

PROBE = [1.0, 2.0, 1.5, 4.0]


def test_scale_policy_reproduces_round_costs_fit():
    """fit="scale" on synthetic rounds (3 x base + 0.5, with noise per length) gives RoundCosts' estimate, and that
    estimate is the closed-form weighted least squares over the per-length medians of the proposing rounds, with
    the rounds that propose nothing at their own median."""
    curve = CostCurve(PROBE, "probe", fit="scale", min_samples=round_costs.MIN_ROUNDS,
                      refit_every=round_costs.REFIT_EVERY, window=round_costs.WINDOW)
    rounds = RoundCosts(PROBE, "probe")
    rng = np.random.default_rng(1)
    observed = []
    for _ in range(60):
        k = int(rng.integers(0, 4))
        seconds = (3.0 * PROBE[k] + 0.5) * float(rng.uniform(0.9, 1.1))
        observed.append((k, seconds))
        curve.observe(k, seconds)
        rounds.observe(k, seconds)
    assert rounds.seconds() == pytest.approx(list(curve.values()))
    assert rounds.fit == pytest.approx(curve.params)
    ks = sorted({k for k, _ in observed if k > 0})
    medians = np.array([np.median([s for k2, s in observed if k2 == k]) for k in ks])
    assert curve.values()[0] == np.median([s for k, s in observed if k == 0])
    counts = np.array([sum(k2 == k for k2, _ in observed) for k in ks], dtype=float)
    design = np.stack([np.array(PROBE)[ks], np.ones(len(ks))], 1) * np.sqrt(counts)[:, None]
    (scale, offset), *_ = np.linalg.lstsq(design, medians * np.sqrt(counts), rcond=None)
    assert curve.params == pytest.approx((scale, offset))
    assert 2.5 < scale < 3.5 and offset > 0
    assert fit_scale(np.array(PROBE)[[1]], np.array([4.0]), np.array([3.0])) == (2.0, 0.0), "one length: scale only"


def test_a_round_that_proposes_nothing_keeps_its_own_cost():
    """Proposing rounds carry per-round work a plain step does not (verifying, cropping the cache): with both kinds
    observed, cost(0) is the plain rounds' median and the fit runs over the proposing ones, so proposing one token
    costs what it measured, not a share of it spread over the scale. Before x = 0 holds min_samples rounds, the
    fit takes every length."""
    base = [1.0, 1.1, 1.15, 1.2, 1.3]
    truth = [1.0] + [1.05 * b + 0.25 for b in base[1:]]  # x >= 1: the extra quarter step of a proposing round
    curve = CostCurve(base, fit="scale", min_samples=3, refit_every=1)
    for k in (1, 2, 4, 1, 2, 4):
        curve.observe(k, truth[k])
    curve.observe(0, 1.0)
    early = curve.values().copy()
    assert early[0] != pytest.approx(1.0)  # one plain round: still inside the fit
    for _ in range(2):
        curve.observe(0, 1.0)
    table = curve.values()
    assert table[0] == pytest.approx(1.0) and list(table[1:]) == pytest.approx(truth[1:])
    assert table[1] - table[0] == pytest.approx(0.405) and early[1] - early[0] < 0.3  # the fit over all lengths hid it


def test_a_plain_step_keeps_its_own_cost_while_rounds_propose_one_length():
    """A draft that cannot pay proposes one token a round, if any: the rounds are at x = 1 only. A probe whose
    one-token forward came out slow prices proposing one token at 1.14 plain steps; the rounds measure 1.55. A fit
    through both would need b < 0, so cost(0) must stand apart already with one proposing length, or the rule
    keeps drafting on the probe's 1.14."""
    base = [1.0, 1.14, 1.59, 2.04]
    curve = CostCurve(base, fit="scale", min_samples=3, refit_every=1)
    for _ in range(3):
        curve.observe(0, 0.020)
        curve.observe(1, 0.031)
    table = curve.values()
    assert table[0] == pytest.approx(0.020) and table[1] == pytest.approx(0.031)
    assert table[1] / table[0] == pytest.approx(1.55)
    assert table[2] == pytest.approx(0.031 / 1.14 * 1.59), "past the measured length: the base's shape, scaled"


def test_scale_policy_waits_for_min_samples_and_ignores_lengths_past_the_table():
    curve = CostCurve(PROBE, fit="scale", min_samples=4, refit_every=100)
    for _ in range(3):
        curve.observe(1, 10.0)
    curve.observe(7, 10.0)  # no base value at 7: ignored
    assert list(curve.values()) == PROBE and not curve.refined() and curve.observed == 3
    curve.observe(1, 10.0)
    assert curve.refined() and curve.values()[1] == pytest.approx(10.0)
    fixed = CostCurve(PROBE, "given")  # no policy: observations change nothing
    fixed.observe(1, 100.0)
    assert list(fixed.values()) == PROBE and not fixed.samples


def test_line_policy_floor_never_decreases_past_a_measured_point():
    curve = CostCurve(fit="line", min_samples=3)
    for x in (1, 2, 4, 8):
        for _ in range(3):
            curve.observe(x, 0.008 + 0.001 * x)
    assert curve.at(6) == pytest.approx(0.014) and curve.at(20) == pytest.approx(0.028)
    for _ in range(3):
        curve.observe(5, 0.030)  # a slow x: its median stands, and no larger x is cheaper
    table = curve.values(40)
    assert table[5] == pytest.approx(0.030)
    assert np.all(np.diff(table[5:]) >= 0) and np.all(table[5:] >= 0.030)
    assert table[4] == pytest.approx(0.012), "below the slow point the measured medians stand"
    untrusted = CostCurve(fit="line", min_samples=3)
    for x, seconds in ((1, 0.01), (2, 0.012), (3, 0.001)):  # one observation each: the line, no floor or medians
        untrusted.observe(x, seconds)
    at_three = untrusted.at(3)  # fits (lazily): params are the fitted line's
    intercept, slope = untrusted.params
    assert slope == 0.0 and at_three == pytest.approx(intercept) == pytest.approx(0.023 / 3)


def test_line_policy_charges_tokens_past_a_busy_step_at_the_measured_rise():
    """Flat at small x, steep at large x (a CPU engine: weight-bound alone, arithmetic-bound when busy): the line
    through all medians is too flat for the top, so past the largest measured x the curve rises at the slope of
    the measured points near it, never flat (tokens past a busy step are not free)."""
    curve = CostCurve(fit="line", min_samples=3)
    for x in range(1, 12):
        for _ in range(8):
            curve.observe(x, 0.010 + 0.0001 * x)
    for _ in range(3):
        curve.observe(30, 0.040)
    table = curve.values(60)
    _, line_slope = curve.params
    rise = (0.040 - (0.010 + 0.0011)) / (30 - 11)
    assert line_slope < 0.6 * rise  # the line, pulled down by the flat part
    assert table[30] == pytest.approx(0.040) and table[40] - table[30] == pytest.approx(10 * rise)
    assert table[20] == pytest.approx(0.0111 + 9 * rise), "between measured x: joined linearly"
    steps = StepCosts()
    for n in range(1, 12):
        for _ in range(8):
            steps.observe(n, 0.010 + 0.0001 * n)
    for _ in range(3):
        steps.observe(30, 0.040)
    assert not steps.token_can_pay(30), "a sure token costs more than a busy step's tokens each"


def test_line_policy_is_step_costs_and_batch_clock():
    """StepCosts and BatchClock's verify are the line policy: same observations, same curve; on exact line data
    BatchClock's verify seconds are the line it used to fit by running sums."""
    steps, clock = StepCosts(), BatchClock()
    curve = CostCurve(fit="line", window=32, min_samples=3, refit_every=64)
    rng = np.random.default_rng(2)
    for _ in range(200):
        n = int(rng.integers(1, 30))
        seconds = 0.005 + 0.0004 * n + float(rng.exponential(0.001))
        steps.observe(n, seconds)
        curve.observe(n, seconds)
    assert np.allclose(steps.curve(50)[:51], curve.values(50)[:51])
    assert steps.seconds(45) == pytest.approx(curve.at(45))
    for tokens in (4, 8, 12, 4, 8):
        clock.verify(tokens, 0.02 + 0.001 * tokens)
    assert [clock.verify_seconds(t) for t in (4, 10, 16, 40)] == pytest.approx([0.024, 0.030, 0.036, 0.060])


def test_extrapolation_past_the_table():
    curve = CostCurve([1.0, 1.1, 1.3])
    assert curve.at(2) == pytest.approx(1.3)
    assert curve.at(4) == pytest.approx(1.7), "the last two entries' slope, 0.2 per x"
    assert list(curve.at(np.array([0, 3, 5]))) == pytest.approx([1.0, 1.5, 1.9])
    assert CostCurve([2.0]).at(9) == 2.0, "one entry: flat"
    assert CostModel(verify_cost=[1.0, 1.1, 1.3]).verify(np.array([4])) == pytest.approx([1.7])
    assert CostCurve().at(7) == 7.0 and CostCurve().at(500) == 500.0, "nothing known: one unit per x"


def test_relative_to_the_first_entry_or_a_unit():
    curve = CostCurve([0.02, 0.03, 0.05])
    assert list(curve.relative()) == pytest.approx([1.0, 1.5, 2.5])
    assert list(curve.relative(0.01)) == pytest.approx([2.0, 3.0, 5.0])


def test_to_dict_from_dict_round_trip():
    where = {"device": "cpu", "dtype": "float32", "threads": 1, "processor": "x", "key": "abc"}
    curve = CostCurve([1.0, 2.0, 1.5, 4.0], "probe", where, fit="scale", min_samples=2)
    for k in (0, 3, 0, 3):
        curve.observe(k, 2.0 * PROBE[k] + 0.1)
    stored = json.loads(json.dumps(curve.to_dict()))  # what a config or cache file holds
    assert stored["source"] == "probe" and stored["describe"] == where
    loaded = CostCurve.from_dict(stored)
    assert list(loaded.values()) == pytest.approx([2.0 * v + 0.1 for v in PROBE]) and loaded.describe == where
    assert loaded.to_dict() == stored
    assert list(CostCurve.from_dict([1.0, 1.2]).values()) == [1.0, 1.2], "a bare list: a calibration's table"
    refined = CostCurve.from_dict(stored, fit="scale", min_samples=1)
    refined.observe(1, 100.0)
    assert refined.values()[1] == pytest.approx(100.0), "policy keywords pass through"


def test_old_calibration_dict_still_loads_into_cost_model():
    """config.calibration as shipped (hub_cards/*/config.json): bare lists under draft_cost/verify_cost/round_cost;
    CostModel reads it, writes it back in the same shape, and also reads tables stored as CostCurve dicts."""
    calibration = {"draft_cost": 0.12, "verify_cost": [1.0, 1.05, 1.1], "preverifier_cost": 0.01,
                   "round_overhead": 0.2, "ar_overhead": 0.03, "round_cost": [1.0, 1.4, 1.7], "chosen": {"rule": "x"}}
    costs = CostModel.from_calibration(calibration)
    assert (costs.draft_cost, costs.verify_cost, costs.round_cost) == (0.12, [1.0, 1.05, 1.1], [1.0, 1.4, 1.7])
    assert (costs.preverifier_cost, costs.round_overhead, costs.ar_overhead) == (0.01, 0.2, 0.03)
    assert costs.as_calibration() == {k: calibration[k] for k in ("draft_cost", "verify_cost", "preverifier_cost",
                                                                   "round_overhead", "round_cost")}
    assert list(costs.round_time(np.array([0, 2, 4]))) == pytest.approx([1.0, 1.7, 2.3])
    bare = CostModel.from_calibration({"draft_cost": 0.1, "verify_cost": [1.0, 1.1]})
    assert bare.round_cost is None and list(bare.round_time(np.array([2]))) == pytest.approx([0.2 + 1.2])
    as_curves = CostModel.from_calibration({"draft_cost": 0.1, "verify_cost": CostCurve([1.0, 1.1]).to_dict(),
                                            "round_cost": CostCurve([1.0, 1.5]).to_dict()})
    assert as_curves.verify_cost == [1.0, 1.1] and as_curves.round_cost == [1.0, 1.5]


def test_shipped_calibrations_load():
    from pathlib import Path

    configs = [json.loads(p.read_text()) for p in Path(__file__).parents[1].glob("hub_cards/*/config.json")]
    calibrations = [c["calibration"] for c in configs if isinstance(c.get("calibration"), dict)
                    and "verify_cost" in c["calibration"]]
    assert len(calibrations) >= 3, "the demo, demo-sampling and Qwen pre-verifiers ship calibrations"
    for calibration in calibrations:
        costs = CostModel.from_calibration(calibration)
        assert costs.verify_cost == [float(v) for v in calibration["verify_cost"]]
        assert costs.as_calibration()["verify_cost"] == costs.verify_cost
