"""The stop rule's choices follow the cost curve it is given (issue 54): the Qwen pair's recorded curves of two CPU
kinds (docs/benchmarks/qwen_coder/cost_curves/) make the same rounds choose differently, and under each curve the
length chosen is the one with the best expected rate (brute force over every length)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from pacer_hf.configuration_pacer import PacerConfig
from pacer_hf.costs import RoundCosts
from pacer_hf.costs.cost_model import FAVOURED_ACCEPTANCE, favoured_lengths
from pacer_hf.modeling_pacer import PacerPreVerifier, expected_tokens, round_cost

CURVES = Path(__file__).resolve().parents[1] / "docs" / "benchmarks" / "qwen_coder" / "cost_curves"
# the EPYC of the first runs (amd_epyc), with MKL's Intel kernels, a Zen 5 EPYC under both MKL paths and a Zen 3 EPYC
# whose long verifies cost more than the first one's
KINDS = ("intel_xeon", "amd_epyc", "amd_epyc_mkl_intel_path", "amd_epyc_zen5_mkl_generic", "amd_epyc_zen5_mkl_intel_path",
         "amd_epyc_zen3_mkl_generic")
CAP = 24  # the shipped Qwen pre-verifier's rounds
ACCEPTANCE = (0.3, 0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95, 0.98)


def recorded(kind: str) -> dict:
    return json.loads((CURVES / f"{kind}.json").read_text())["costs"]


def loop_costs(kind: str) -> RoundCosts:
    """The round costs a call decides with, built from the recorded curve as the probe builds them
    (`draft_costs`: a verify of k + 1 tokens plus k drafted tokens, in seconds)."""
    costs = recorded(kind)
    step = costs["step_seconds"]
    per_token = step * (costs["draft_cost"] + costs["preverifier_cost"])
    seconds = [step * round_cost(costs["verify_cost"], k) + k * per_token for k in range(CAP + 1)]
    return RoundCosts(seconds, "given", online=False, per_token=per_token)


def rule(trim: bool = False) -> PacerPreVerifier:
    config = PacerConfig(draft_hidden_size=8, hidden_size=8, num_attention_heads=1, intermediate_size=8,
                         max_draft_tokens=CAP, block_size=1, decision_rule="expected_gain", trim_failed_block=trim,
                         calibration={"draft_cost": 1.0, "verify_cost": [1.0, 9.0]})  # never read: costs= given
    return PacerPreVerifier(config).eval()


def chosen(preverifier: PacerPreVerifier, costs: RoundCosts, p: float) -> tuple[int, int]:
    """(drafted, proposed) of a round whose every token is accepted with probability `p`, the pre-verifier's
    prediction being exactly that (the rule's own guess for undrafted tokens is then the truth)."""
    logit = math.log(p / (1 - p))
    table = {"round_cost": costs.seconds(), "draft_cost": costs.token_seconds()}
    for n in range(1, CAP + 1):
        stop, trim = preverifier.decide([logit] * n, table)
        if stop:
            return n, n - trim
    return CAP, CAP


def best_rate(costs: RoundCosts, p: float, lengths) -> float:
    seconds = costs.seconds()
    tokens = expected_tokens([p] * CAP)
    return max(tokens[n] / seconds[n] for n in lengths)


@pytest.mark.parametrize("kind", KINDS)
def test_choice_is_the_best_expected_rate_under_its_curve(kind):
    """Stop-only, a round drafts at least one token: the length chosen has the highest expected tokens per second
    of every length 1..24 under this curve."""
    costs, preverifier = loop_costs(kind), rule()
    for p in ACCEPTANCE:
        n, _ = chosen(preverifier, costs, p)
        rate = expected_tokens([p] * CAP)[n] / costs.seconds()[n]
        assert rate == pytest.approx(best_rate(costs, p, range(1, CAP + 1)), rel=1e-9), (kind, p, n)


def test_the_same_rounds_choose_differently_on_the_two_kinds():
    """Where the Xeon verifies three tokens for the price of one step and the EPYC charges two steps for two, the
    same uncertain round stops short on one and drafts on (or proposes nothing) on the other."""
    intel, amd, preverifier = loop_costs("intel_xeon"), loop_costs("amd_epyc"), rule()
    choices = {p: (chosen(preverifier, intel, p)[0], chosen(preverifier, amd, p)[0]) for p in ACCEPTANCE}
    assert any(a != b for a, b in choices.values()), choices
    assert intel.relative()[2] < 1.5 < amd.relative()[1]  # the recorded curves differ where the claim says


@pytest.mark.parametrize(("cpu", "short_verify"), [("amd_epyc", 1.5), ("amd_epyc_zen5", 1.6)])
def test_one_cpu_under_the_two_mkl_paths_has_the_two_kinds_curves_and_choices(cpu, short_verify):
    """An EPYC with MKL's Intel kernels preloaded (`pacer-hf mkl-shim`, docs/CPU.md) verifies 2-3 tokens for under
    1.5 steps (the earlier EPYC; the Zen 5's 3-token verify is 1.53) where its generic kernels charge 2-3 steps, as
    the Xeon does for about one: the same rounds choose differently on the same CPU with and without the shim."""
    generic, intel_path = f"{cpu}_mkl_generic", f"{cpu}_mkl_intel_path"
    verify = {kind: recorded(kind)["verify_cost"] for kind in (generic, intel_path, "intel_xeon")}  # widths 1, 2, ...
    assert max(verify[intel_path][1:3]) < short_verify and max(verify["intel_xeon"][1:3]) < 1.5
    assert min(verify[generic][1:3]) > 2.0
    preverifier = rule()
    lengths = {kind: [chosen(preverifier, loop_costs(kind), p)[0] for p in ACCEPTANCE] for kind in (generic, intel_path)}
    assert lengths[generic] != lengths[intel_path], lengths
    assert 2 in lengths[intel_path] and 2 not in lengths[generic], lengths


def round_table(kind: str) -> list[float]:
    costs = recorded(kind)
    return [round_cost(costs["verify_cost"], k) + k * costs["draft_cost"] for k in range(CAP + 1)]


def test_favoured_lengths_are_each_curves_best_fixed_lengths():
    """The fixed lengths a curve favours (what `pacer-hf demo --gammas auto` compares with) are, per acceptance, the
    brute-force best expected rate; the Xeon's include 2, the EPYC's start past its dear 2- and 3-token verifies."""
    for kind in KINDS:
        table = round_table(kind)
        lengths = favoured_lengths(table, max_length=CAP)
        best = {max(range(1, CAP + 1), key=lambda k: (1 - a ** (k + 1)) / (1 - a) / table[k]) for a in FAVOURED_ACCEPTANCE}
        assert lengths == tuple(sorted(best)), kind
    assert 2 in favoured_lengths(round_table("intel_xeon"), max_length=CAP)
    assert min(favoured_lengths(round_table("amd_epyc"), max_length=CAP)) >= 3


def test_demo_compares_with_the_lengths_this_machines_curve_favours(monkeypatch):
    """`--gammas auto` reads the verify curve the stop rule's probe measures (here a stepped one, 1 s a step, where
    4 tokens cost less than 2) and the drafting loop's step, and picks the lengths that curve favours."""
    from pacer_hf import costs, demo

    verify = [1.0, 2.0, 2.9, 1.8, 2.1, 2.1, 2.2, 2.2, 2.5]  # widths 1..9, seconds
    monkeypatch.setattr(costs, "forward_costs", lambda model, widths: ("key", {}, verify[:widths], 0.0))
    target, draft = demo.build_config_pair()
    gammas = demo.machine_gammas(target, draft, max_length=8)
    assert gammas == favoured_lengths(verify, max_length=8)  # a tiny draft's step is ~1 ms against 1 s steps
    assert 1 not in gammas and 2 not in gammas and 3 in gammas
    assert demo.machine_gammas(target, None) == demo.FALLBACK_GAMMAS


@pytest.mark.parametrize("path", ["generic", "intel", "none"])
def test_demo_names_the_fix_where_mkl_runs_its_generic_kernels(monkeypatch, capsys, path):
    from pacer_hf import costs, demo
    from pacer_hf.costs import blas

    monkeypatch.setattr(costs, "forward_costs", lambda model, widths: ("key", {}, [1.0, 1.1, 1.2][:widths], 0.0))
    monkeypatch.setattr(blas, "mkl_code_path", lambda: path)
    monkeypatch.setattr(blas, "cpu_vendor", lambda: "AuthenticAMD")
    target, draft = demo.build_config_pair()
    demo.machine_gammas(target, draft, max_length=2)
    printed = capsys.readouterr().out
    assert ("pacer-hf mkl-shim" in printed) == (path == "generic"), printed


def test_a_trimming_rule_ends_a_doubtful_round_with_nothing_proposed_where_short_verifies_are_dear():
    """On the EPYC's curve (verifying 2 or 3 tokens costs two to three target steps) a doubtful first token: a
    stop-only rule must propose what it drafted, a trimming rule (greedy) stops and proposes nothing, a plain step,
    which has the better expected rate; on the Xeon's curve the same round is worth a short verify."""
    amd, intel = loop_costs("amd_epyc"), loop_costs("intel_xeon")
    doubtful = 0.45
    stop_only = chosen(rule(), amd, doubtful)
    assert stop_only[1] == stop_only[0] >= 1
    drafted, proposed = chosen(rule(trim=True), amd, doubtful)
    assert (drafted, proposed) == (1, 0)
    seconds, per_token = amd.seconds(), amd.token_seconds()
    tokens = expected_tokens([doubtful] * CAP)
    nothing = 1.0 / (seconds[0] + per_token)  # one drafted token paid, a plain step
    assert nothing > max(tokens[n] / seconds[n] for n in range(1, CAP + 1))
    assert chosen(rule(trim=True), intel, doubtful)[1] >= 1


@pytest.mark.parametrize("kind", KINDS)
def test_trimming_choice_is_the_best_expected_rate_zero_included(kind):
    """Brute force over every length 0..24 (0: a plain step after one drafted token): the trimming rule's
    (drafted, proposed) round has the best expected rate under its curve."""
    costs, preverifier = loop_costs(kind), rule(trim=True)
    seconds, per_token = costs.seconds(), costs.token_seconds()
    for p in ACCEPTANCE:
        drafted, proposed = chosen(preverifier, costs, p)
        tokens = expected_tokens([p] * CAP)
        rate = tokens[proposed] / (seconds[proposed] + (drafted - proposed) * per_token)
        best = max(1.0 / (seconds[0] + per_token), *(tokens[n] / seconds[n] for n in range(1, CAP + 1)))
        assert rate == pytest.approx(best, rel=1e-9), (kind, p, drafted, proposed)


def test_rounds_that_propose_nothing_stay_exact(pair):
    """Greedy Pacer with the trimming rule on a curve where short verifies are dear: some rounds propose nothing
    (a plain step) and the output is the target's."""
    from conftest import make_preverifier, plain_greedy

    import pacer_hf

    target, draft = pair("llama", "noisy")
    dear = {"draft_cost": 0.2, "verify_cost": [1.0, 2.0, 2.9, 1.8, 2.1, 2.1, 2.2, 2.2, 2.2], "round_overhead": 0.0}
    pv = make_preverifier(draft, seed=2, block_size=1, decision_rule="expected_gain", trim_failed_block=True,
                          calibration=dear, max_draft_tokens=8)
    ids = torch.tensor([[5, 6, 7, 8]])
    curve = [k * 0.2 + dear["verify_cost"][k] for k in range(9)]
    out = target.generate(ids, max_new_tokens=40, do_sample=False, assistant_model=draft, pacer=pv, pacer_costs=curve)
    assert torch.equal(out, plain_greedy(target, ids, max_new_tokens=40))
    assert 0 in pacer_hf.last_stats(target).draft_lengths, "some round proposed nothing"
