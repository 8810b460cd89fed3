"""examples/compare_stop_rules.py --oracle: its reference stop must end every round exactly at the first rejected token,
or its "measured ceiling" measures something else."""

import importlib.util
import sys
from pathlib import Path

import pytest
import torch
from conftest import plain_greedy

import pacer_hf
from pacer_hf.strategies.registry import STRATEGY_TYPES


@pytest.fixture
def oracle_module():
    path = Path(__file__).resolve().parent.parent / "examples" / "compare_stop_rules.py"
    spec = importlib.util.spec_from_file_location("compare_stop_rules", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve the module's annotations through sys.modules
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(spec.name, None)
        STRATEGY_TYPES.pop("oracle-stop", None)


@pytest.mark.parametrize("trim", [True, False])
def test_reference_stop_ends_rounds_at_the_first_rejection(pair, oracle_module, trim):
    target, draft = pair("llama", "noisy")
    prompt = torch.tensor([[3, 17, 5, 42, 8, 11]])
    expected = plain_greedy(target, prompt, max_new_tokens=40)
    oracle_module.REFERENCES[tuple(prompt[0].tolist())] = expected[0].tolist()
    gamma = 6
    out = target.generate(prompt, assistant_model=draft, do_sample=False, max_new_tokens=40,
                          pacer=oracle_module.OracleStopConfig(gamma, trim=trim))
    assert torch.equal(out, expected)
    stats = pacer_hf.last_stats(target)
    rounds = list(zip(stats.draft_lengths, stats.accepted))
    assert len(rounds) > 3 and any(d < gamma for d, _ in rounds) and any(a > 0 for _, a in rounds)
    for drafted, accepted in rounds[:-1]:  # the last round may be cut by max_new_tokens
        if trim or drafted == gamma and accepted == gamma:
            assert accepted == drafted  # only tokens the target accepts are proposed
        else:
            assert accepted == drafted - 1  # the rejected token is the last one proposed


def test_curve_oracle_drafts_past_the_rejection_to_the_cheapest_length(pair, oracle_module, monkeypatch):
    """"oracle-curve": a round that meets a rejected token gains the same tokens at any longer length, so it drafts on
    to the cheapest of them under the round costs (a verify curve that is not monotone, as on CPUs whose kernels
    make some widths slow); rounds the target accepts whole end at the cap."""
    target, draft = pair("llama", "noisy")
    prompt = torch.tensor([[3, 17, 5, 42, 8, 11]])
    expected = plain_greedy(target, prompt, max_new_tokens=40)
    oracle_module.REFERENCES[tuple(prompt[0].tolist())] = expected[0].tolist()
    gamma, table = 6, [1.0, 2.0, 3.0, 4.0, 1.5, 6.0, 5.0]  # 4 tokens cheaper than 1-3, and 6 cheaper than 5
    monkeypatch.setattr(oracle_module, "round_seconds", lambda target, draft, cap: table)
    out = target.generate(prompt, assistant_model=draft, do_sample=False, max_new_tokens=40,
                          pacer=oracle_module.OracleStopConfig(gamma, trim=False, curve=True))
    assert torch.equal(out, expected)
    stats = pacer_hf.last_stats(target)
    rounds = list(zip(stats.draft_lengths, stats.accepted))
    assert len(rounds) > 3 and any(a < d for d, a in rounds[:-1])
    for drafted, accepted in rounds[:-1]:  # the last round may be cut by max_new_tokens
        if accepted < drafted:  # rejected at accepted + 1: the cheapest length from there
            assert drafted == min(range(accepted + 1, gamma + 1), key=table.__getitem__)
        else:
            assert drafted == gamma


def test_a_users_pair_runs_with_the_default_preverifier_and_the_oracle(oracle_module, tmp_path, monkeypatch, capsys):
    """`--target/--draft` loads a user's pair as the bench does (here the demo pair's folders: no chat template, so
    stdlib prompts); `default` names pacer_hf's default pre-verifier; every setting's output is checked exact."""
    import json

    from pacer_hf._paths import hub_cards_dir

    cards = hub_cards_dir()
    out = tmp_path / "results.json"
    monkeypatch.setattr(sys, "argv", ["compare_stop_rules.py", "default", "--target", str(cards / "demo-target"),
                                      "--draft", str(cards / "demo-draft"), "--oracle", "--gammas", "2",
                                      "--prompts", "1", "--runs", "1", "--max-new-tokens", "8",
                                      "--categories", "stdlib-continuation", "--out", str(out)])
    threads = torch.get_num_threads()
    try:
        oracle_module.main()  # it times on one thread, as the benchmarks do
    finally:
        torch.set_num_threads(threads)
    results = json.loads(out.read_text())
    assert set(results) == {"ar", "sd-fixed-2", "default", "oracle", "oracle-trim", "oracle-curve"}
    assert all(row["stdlib-continuation"]["tokens_per_s"] > 0 for row in results.values())
    monkeypatch.setattr(sys, "argv", ["compare_stop_rules.py", "--target", str(cards / "demo-target")])
    with pytest.raises(SystemExit):
        oracle_module.main()
    assert "--target and --draft go together" in capsys.readouterr().err
