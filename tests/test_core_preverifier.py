"""PacerPreVerifier as a transformers model: sizes, save/load, Auto classes, decision rule, loss."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from conftest import make_preverifier, plain_greedy
from transformers import AutoConfig, AutoModel

import pacer_hf
from pacer_hf import PacerConfig, PacerPreVerifier, draft_features


def inputs(pv: PacerPreVerifier, length: int = 5, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    hidden = torch.randn(1, length, pv.config.draft_hidden_size, generator=generator)
    logits = torch.randn(1, length, 50, generator=generator)
    return hidden, draft_features(logits, logits.argmax(-1))


def test_from_draft_is_sized_for_the_draft(pair):
    _, draft = pair("gpt2", "random")
    pv = PacerPreVerifier.from_draft(draft, block_size=3, threshold=0.7)
    assert pv.config.draft_hidden_size == draft.config.n_embd == 16
    assert pv.config.draft_signature == {"model_type": "gpt2", "hidden_size": 16, "num_hidden_layers": 1,
                                         "vocab_size": 96}
    assert (pv.config.block_size, pv.config.threshold) == (3, 0.7)
    assert sum(p.numel() for p in pv.parameters()) < 200_000


def test_save_load_round_trip_and_auto_classes(pair, tmp_path):
    target, draft = pair()
    pv = make_preverifier(draft, block_size=2, threshold=0.3)
    pv.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").is_file() and not (tmp_path / "pytorch_model.bin").exists()
    for loaded in (PacerPreVerifier.from_pretrained(tmp_path), AutoModel.from_pretrained(tmp_path),
                   pacer_hf.load_preverifier(str(tmp_path))):
        assert isinstance(loaded, PacerPreVerifier)
        ignored = {"_name_or_path", "transformers_version"}
        assert {k: v for k, v in loaded.config.to_dict().items() if k not in ignored} == {
            k: v for k, v in pv.config.to_dict().items() if k not in ignored}
        torch.testing.assert_close(loaded(*inputs(pv)).logits, pv(*inputs(pv)).logits)
    assert isinstance(AutoConfig.from_pretrained(tmp_path), PacerConfig)
    ids = torch.tensor([[5, 6, 7]])
    out = target.generate(ids, max_new_tokens=9, do_sample=False, assistant_model=draft, pacer=str(tmp_path))
    assert torch.equal(out, plain_greedy(target, ids, max_new_tokens=9))


def test_decide_survival_threshold_and_trim():
    """decide() is the whole rule: block or cumulative survival vs threshold, then the trim of a failed block."""
    def decide(logits, **config):
        config.setdefault("block_size", 2)
        return PacerPreVerifier(PacerConfig(draft_hidden_size=8, **config)).decide(torch.tensor(logits))

    sure, unsure = 10.0, -10.0
    assert decide([sure, sure, unsure, sure], threshold=0.5) == (True, 0), "block survival ~ 0 fails"
    assert decide([unsure, unsure, sure, sure], threshold=0.5) == (False, 0), "only the last block counts"
    assert decide([unsure, sure, sure], threshold=0.5, decision_rule="cumulative") == (True, 0)
    half = 0.0  # sigmoid(0) = 0.5: survival of a one-token block is exactly 0.5
    assert decide([half], threshold=0.5, block_size=1) == (False, 0), "survival == threshold passes"
    assert decide([half - 1e-3], threshold=0.5, block_size=1) == (True, 0)
    assert decide([unsure], threshold=0.0, block_size=1) == (False, 0), "threshold 0 never stops"
    assert decide([sure], threshold=1.0, block_size=1) == (True, 0), "threshold 1 stops after the first block"
    # trimming keeps the failed block's tokens up to the first one predicted below trim_cutoff
    assert decide([sure, sure, unsure, sure], threshold=0.9, block_size=4, trim_failed_block=True) == (True, 2)
    assert decide([sure, 0.5, sure, sure], threshold=0.99, block_size=4, trim_failed_block=True,
                  trim_cutoff=0.7) == (True, 3)
    assert decide([unsure, sure], threshold=0.5, block_size=2, trim_failed_block=True) == (True, 2)


def test_causal_layer_lets_a_block_see_only_earlier_blocks():
    pv = make_preverifier_from_config()
    hidden, features = inputs(pv, length=6)
    changed = hidden.clone()
    changed[:, 4:] += 5.0
    before, after = pv(hidden, features).logits, pv(changed, features).logits
    torch.testing.assert_close(before[:, :4], after[:, :4])
    assert not torch.allclose(before[:, 4:], after[:, 4:])


def make_preverifier_from_config() -> PacerPreVerifier:
    torch.manual_seed(0)
    return PacerPreVerifier(PacerConfig(draft_hidden_size=12, initializer_range=0.5)).eval()


def test_loss_masks_padding_and_weights_rejects():
    pv = make_preverifier_from_config()
    hidden, features = inputs(pv, length=4)
    labels = torch.tensor([[1.0, 0.0, -100.0, -100.0]])
    loss = pv(hidden, features, labels=labels).loss
    padded_changed = hidden.clone()
    padded_changed[:, 2:] = 0
    torch.testing.assert_close(pv(padded_changed, features, labels=labels).loss, loss)
    pv.config.reject_weight = 5.0
    logits = pv(hidden, features).logits[0, :2]
    bce = torch.nn.functional.binary_cross_entropy_with_logits(logits, torch.tensor([1.0, 0.0]), reduction="none")
    torch.testing.assert_close(pv(hidden, features, labels=labels).loss, (bce[0] + 5 * bce[1]) / 6)


@pytest.mark.parametrize("mode", ["hidden", "features"])
def test_input_modes(mode):
    pv = PacerPreVerifier(PacerConfig(draft_hidden_size=12, input_mode=mode))
    assert (pv.hidden_proj is None) == (mode == "features") and (pv.feature_proj is None) == (mode == "hidden")
    assert pv(*inputs(pv)).logits.shape == (1, 5)


def test_draft_features():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    features = draft_features(logits, torch.tensor([0]))
    probs = torch.softmax(logits, -1)
    torch.testing.assert_close(features[0, 0], probs[0, 0].log())
    torch.testing.assert_close(features[0, 1], -(probs * probs.log()).sum())
    torch.testing.assert_close(features[0, 2], probs[0, 0] - probs[0, 1])


def test_block_by_block_scoring_equals_the_full_rerun():
    """The round scored one block at a time over cached keys/values gives the full re-run's logits."""
    torch.manual_seed(0)
    pv = PacerPreVerifier(PacerConfig(draft_hidden_size=16, max_draft_tokens=12, initializer_range=0.3)).eval()
    hidden, features = torch.randn(1, 12, 16), torch.randn(1, 12, 3)
    full = pv(hidden, features).logits[0]
    for blocks in ([12], [1] * 12, [3, 3, 3, 3], [2, 5, 1, 4]):
        past, pieces, start = None, [], 0
        for size in blocks:
            out = pv(hidden[:, start:start + size], features[:, start:start + size], cache=past)
            past, start = out.cache, start + size
            pieces.append(out.logits[0])
        torch.testing.assert_close(torch.cat(pieces), full, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="exceed max_draft_tokens"):
        pv(hidden[:, :1], features[:, :1], cache=past)


@pytest.mark.parametrize("mode", ["both", "hidden", "features"])
def test_compiled_scorer_equals_the_torch_forward(mode):
    """The compiled scorer generation uses on CPU gives draft_features and the layer's logits, token by token,
    round after round, from the draft's hidden state and raw logits."""
    from pacer_hf.loops.preverifier_kernel import round_scorer

    torch.manual_seed(0)
    pv = PacerPreVerifier(PacerConfig(draft_hidden_size=16, max_draft_tokens=6, input_mode=mode,
                                      initializer_range=0.5, intermediate_size=48)).eval()
    for module in pv.modules():  # non-trivial LayerNorm affines, so their folding into the linears is exercised
        if isinstance(module, torch.nn.LayerNorm):
            torch.nn.init.normal_(module.weight, 1.0, 0.3)
            torch.nn.init.normal_(module.bias, 0.0, 0.3)
    scorer = round_scorer(pv)
    for scale in (0.5, 4.0, 40.0):  # rounds: start() must forget the last one; flat to peaked draft distributions
        hidden, logits = torch.randn(6, 16) * 2, torch.randn(6, 300) * scale
        tokens = [int(logits[0].argmax()), 7, int(logits[2].argmin()), 0, 299, int(logits[5].argmax())]
        features = draft_features(logits, torch.tensor(tokens))
        with torch.no_grad():
            full = pv(hidden[None], features[None]).logits[0]
        scorer.start()
        got = []
        for i, token in enumerate(tokens):
            got.append(scorer.add(hidden[i], logits[i], token))
            torch.testing.assert_close(torch.from_numpy(scorer.features.copy()), features[i], atol=2e-5, rtol=1e-5)
        torch.testing.assert_close(torch.tensor(got), full, atol=5e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="exceed max_draft_tokens"):
        scorer.add(hidden[0], logits[0], 0)
    bf16 = scorer.add  # other dtypes are converted, not refused
    scorer.start()
    assert math.isfinite(bf16(hidden[0].bfloat16(), logits[0].bfloat16(), 3))


def test_compiled_scorer_only_on_cpu():
    from pacer_hf.loops.preverifier_kernel import round_scorer

    pv = PacerPreVerifier(PacerConfig(draft_hidden_size=8))
    assert round_scorer(pv) is not None
    pv.to("meta")
    assert round_scorer(pv) is None


@pytest.mark.parametrize("scorer", ["compiled", "torch"])
def test_stopping_criteria_decisions_equal_deciding_on_the_full_rerun(pair, scorer):
    """In generate, every block decision equals decide() on a full re-run over the round so far, whether the
    round is scored by the compiled scorer (CPU) or by the torch forward block by block (other devices)."""
    from pacer_hf.loops.stop_rule import PacerStopRule
    from pacer_hf.stats import PacerStats

    target, draft = pair("llama", "noisy")
    seen = 0
    for rule, extra in (("block", {}), ("cumulative", {}), ("expected_gain", {"calibration": COSTS})):
        pv = make_preverifier(draft, block_size=2, threshold=0.5, decision_rule=rule, max_draft_tokens=8, **extra)
        stop = PacerStopRule(pv, PacerStats(strategy="pacer"))
        if scorer == "torch":
            stop.scorer = None
        stop.start_round()
        hidden, features = [], []
        generator = torch.Generator().manual_seed(1)
        for i in range(8):
            h, logits = torch.randn(1, 32, generator=generator), torch.randn(1, 96, generator=generator) * 3
            token = logits.argmax(-1, keepdim=True)
            hidden.append(h)
            features.append(pacer_hf.draft_features(logits, token[:, 0]))
            stopped = stop.add_token(h, logits, token)
            if (i + 1) % 2 == 0:
                with torch.no_grad():
                    full = pv(torch.stack(hidden, 1), torch.stack(features, 1)).logits[0]
                assert (stopped, stop.trim) == pv.decide(full), (rule, i)
                seen += 1
            else:
                assert not stopped
    assert seen == 12


def test_compiled_rule_equals_the_expected_gain_rule():
    """The CPU loop's compiled expected-gain rule (measured round costs), stop-only and trimming (greedy), answers
    what `expected_gain_continues` and `best_prefix` answer: random logits, block sizes 1-3, round tables shorter
    than the round (extended by `costs.curve.extrapolate`, as the loop extends them) and stepped ones; then inside
    `PacerStopRule`, against `decide` on the round's logits with and without `trim_failed_block`."""
    from pacer_hf.costs.curve import extrapolate
    from pacer_hf.costs.round_costs import RoundCosts
    from pacer_hf.loops.preverifier_kernel import _best_prefix, _continues
    from pacer_hf.loops.stop_rule import PacerStopRule
    from pacer_hf.modeling_pacer import best_prefix, expected_gain_continues
    from pacer_hf.stats import PacerStats

    rng = np.random.default_rng(0)
    answers, trims = [], []
    for _ in range(3000):
        block, cap, n = int(rng.integers(1, 4)), int(rng.integers(4, 25)), 0
        n = int(rng.integers(1, cap + 1))
        logits = rng.normal(rng.uniform(-1, 4), rng.uniform(0.1, 4), n)
        table = 1.0 + np.cumsum(rng.uniform(0.0, 0.6, int(rng.integers(2, 30))))
        table[rng.integers(0, len(table), 3)] += rng.uniform(0, 1.5, 3)  # a stepped curve: dear widths
        probs = [1.0 / (1.0 + math.exp(-min(max(x, -60.0), 60.0))) for x in logits.tolist()]
        costs, seconds = {"round_cost": table.tolist(), "draft_cost": 0.1}, extrapolate(table, np.arange(cap + 1))
        expected = expected_gain_continues(probs, block, cap, costs)
        assert _continues(logits, n, block, cap, seconds, -1.0) == expected, (block, cap, n)
        trimming = expected_gain_continues(probs, block, cap, costs, trim=True)
        assert _continues(logits, n, block, cap, seconds, 0.1) == trimming, (block, cap, n)
        assert _best_prefix(logits, n, seconds, 0.1) == best_prefix(probs, costs)
        answers.append(expected)
        trims.append(best_prefix(probs, costs) < n)
    assert 0.2 < np.mean(answers) < 0.8, "both answers exercised"
    assert 0.1 < np.mean(trims) < 0.9, "trimmed and whole rounds exercised"
    torch.manual_seed(0)
    for block, trim in itertools.product((1, 2), (False, True)):
        pv = PacerPreVerifier(PacerConfig(draft_hidden_size=16, max_draft_tokens=12, block_size=block,
                                          decision_rule="expected_gain", calibration=COSTS, initializer_range=0.5,
                                          trim_failed_block=trim)).eval()
        stop = PacerStopRule(pv, PacerStats(strategy="pacer"), RoundCosts([1.0, 1.9, 2.0, 2.9, 3.0, 3.1, 4.5], "given"))
        assert stop.compiled_rule and stop.trims == trim
        decided = 0
        for _ in range(20):
            stop.start_round()
            for i in range(12):
                logits = torch.randn(1, 64) * 4
                stopped = stop.add_token(torch.randn(1, 16) * 2, logits, logits.argmax(-1, keepdim=True))
                if (i + 1) % block == 0:
                    assert (stopped, stop.trim) == pv.decide(list(stop.token_logits), stop.round_costs)
                    decided += 1
                if stopped:
                    break
        assert decided >= 20


COSTS = {"draft_cost": 0.1, "verify_cost": [1.0 + 0.05 * k for k in range(17)], "round_overhead": 0.1,
         "preverifier_cost": 0.02}


def test_expected_gain_rule():
    from pacer_hf.modeling_pacer import expected_gain_continues

    assert expected_gain_continues([0.95, 0.95], 2, 8, COSTS), "likely accepted and cheap: draft on"
    assert not expected_gain_continues([0.1, 0.05], 2, 8, COSTS), "likely rejected: stop"
    assert not expected_gain_continues([0.95] * 8, 2, 8, COSTS), "at the cap there is nothing more to draft"
    expensive = {**COSTS, "draft_cost": 2.0}
    assert not expected_gain_continues([0.9, 0.9], 2, 8, expensive), "drafting dearer than the target never pays"
    # the rule compares rates: continuing pays exactly when a longer round yields more tokens per unit of time
    rate = lambda p, n: (1 + sum(p ** i for i in range(1, n + 1))) / (n * 0.1 + 1 + 0.05 * n + 0.1 + 0.02 * n)  # noqa: E731
    for p in (0.3, 0.5, 0.7, 0.9):
        assert expected_gain_continues([p], 1, 8, COSTS) == (max(rate(p, n) for n in range(2, 9)) > rate(p, 1)), p
    pv = PacerPreVerifier(PacerConfig(draft_hidden_size=8, block_size=2, decision_rule="expected_gain",
                                      calibration=COSTS))
    assert pv.decide(torch.tensor([5.0, 5.0])) == (False, 0) and pv.decide(torch.tensor([-5.0, -5.0])) == (True, 0)
    with pytest.raises(ValueError, match="pacer-hf calibrate"):
        PacerConfig(decision_rule="expected_gain")


STEPPED = {"draft_cost": 0.27, "verify_cost": [1.0, 1.07, 1.07, 1.9, 2.0, 2.05, 2.8, 2.9, 2.9], "round_overhead": 0.0}


def test_expected_gain_trim_drops_the_token_that_opens_a_dearer_verify_width():
    """With trim_failed_block the expected-gain rule proposes the prefix with the best expected rate, the drafting
    paid: on a curve where 3 drafted tokens verify for a step more than 2, an unlikely third token is dropped."""
    from pacer_hf.modeling_pacer import best_prefix

    def decide(probs, costs):
        logits = torch.tensor([math.log(p / (1 - p)) for p in probs])
        pv = PacerPreVerifier(PacerConfig(draft_hidden_size=8, block_size=1, decision_rule="expected_gain",
                                          trim_failed_block=True, calibration=costs, max_draft_tokens=8))
        return pv.decide(logits)

    # 2 likely tokens cost 1.07 + 2 * 0.27 + 0.27 paid for the third: 2.97 tokens in 1.88 steps; keeping the third
    # (p = 0.3) buys 0.29 expected tokens for 0.83 more steps
    assert decide([0.99, 0.99, 0.3], STEPPED) == (True, 1)
    milder = {**STEPPED, "verify_cost": [1.0, 1.07, 1.07, 1.4] + [9.0] * 5}  # the third token's width: +0.33 steps
    assert decide([0.99, 0.99, 0.97], milder) == (True, 0), "a likely token is kept where it pays for its width"
    assert decide([0.99, 0.99, 0.3], milder) == (True, 1), "an unlikely one is not"
    flat = {**STEPPED, "verify_cost": [1.0 + 0.05 * k for k in range(9)]}
    assert decide([0.99, 0.99, 0.3], flat) == (True, 0), "where a width costs little more, nothing is dropped"
    # the definition, over random rounds: the argmax of tokens / time, the drafting of all n tokens paid
    generator = torch.Generator().manual_seed(0)
    for _ in range(200):
        n = int(torch.randint(1, 9, (1,), generator=generator))
        probs = torch.rand(n, generator=generator).tolist()
        tokens = [1 + sum(math.prod(probs[: i + 1]) for i in range(k)) for k in range(n + 1)]
        rates = [tokens[k] / (k * 0.27 + STEPPED["verify_cost"][k] + (n - k) * 0.27) for k in range(n + 1)]
        assert rates[best_prefix(probs, STEPPED)] == pytest.approx(max(rates))


def test_trimmed_rounds_stay_exact(pair):
    """Greedy Pacer with the cost-aware trim on a stepped curve: the target's output, with rounds trimmed (more
    drafted than proposed: this untrained pre-verifier predicts many tokens near 0, which are dropped)."""
    target, draft = pair("llama", "noisy")
    pv = make_preverifier(draft, seed=2, block_size=1, decision_rule="expected_gain", trim_failed_block=True,
                          calibration=STEPPED, max_draft_tokens=8)
    ids = torch.tensor([[5, 6, 7, 8]])
    curve = [k * 0.27 + STEPPED["verify_cost"][k] for k in range(9)]
    out = target.generate(ids, max_new_tokens=40, do_sample=False, assistant_model=draft, pacer=pv, pacer_costs=curve)
    assert torch.equal(out, plain_greedy(target, ids, max_new_tokens=40))
    stats = pacer_hf.last_stats(target)
    assert stats.draft_forwards > sum(stats.draft_lengths), "some round proposed fewer tokens than it drafted"


def test_simulated_trim_matches_the_rule_and_charges_the_drafting():
    """The replay's trimmed rounds: each one's proposal is `best_prefix` of its drafted tokens, verified at the
    proposed width with every drafted token's cost paid; untrimmed, the same as the stop-only speedup."""
    import numpy as np

    from pacer_hf.costs import CostModel
    from pacer_hf.modeling_pacer import best_prefix
    from pacer_hf.training.simulate import speedup, trimmed_lengths

    rng = np.random.default_rng(1)
    probs = rng.uniform(0.02, 0.99, (50, 8))
    acc = (rng.random((50, 8)) < probs).astype(float)
    costs = CostModel.from_calibration(STEPPED)
    drafted = rng.integers(1, 9, 50)
    proposed = trimmed_lengths(probs, drafted, costs)
    assert proposed.tolist() == [best_prefix(p[:n].tolist(), costs.as_calibration()) for p, n in zip(probs, drafted)]
    assert (proposed < drafted).any() and (proposed <= drafted).all()
    assert speedup(acc, drafted, costs, proposed=drafted) == speedup(acc, drafted, costs)
    survive = np.cumprod(acc, axis=1)
    tokens = sum(1 + survive[r, :k].sum() for r, k in enumerate(proposed))
    time = sum(n * 0.27 + STEPPED["verify_cost"][k] for n, k in zip(drafted, proposed))
    assert speedup(acc, drafted, costs, proposed=proposed) == pytest.approx(tokens / time)


def test_calibration_prefers_the_cost_aware_rule_within_the_margin():
    """best_setting picks expected_gain unless a fitted threshold wins by more than the margin."""
    import numpy as np

    from pacer_hf.costs import CostModel
    from pacer_hf.training.simulate import best_setting

    rng = np.random.default_rng(0)
    probs = rng.uniform(0.05, 0.95, (400, 8))
    acc = (rng.random((400, 8)) < probs).astype(float)
    costs = CostModel(draft_cost=0.1, round_cost=[1.0, 1.4, 1.6, 1.7, 1.8, 1.9, 2.0, 2.1, 2.2])
    search = best_setting(acc, probs, costs, block_sizes=(1, 2))
    overall = max(search["grid"], key=lambda row: row["speedup"])
    gain = max((row for row in search["grid"] if row["rule"] == "expected_gain"), key=lambda row: row["speedup"])
    expected = gain if gain["speedup"] * 1.01 >= overall["speedup"] else overall
    assert search["best"] == expected
    assert best_setting(acc, probs, costs, block_sizes=(1, 2), prefer_margin=0.0)["best"] == overall
    assert best_setting(acc, probs, costs, block_sizes=(1, 2), prefer_margin=1.0)["best"]["rule"] == "expected_gain"


def test_compiled_kernels_import_where_numba_cannot_cache():
    """A read-only install without a writable home: numba finds no cache location, the kernels compile uncached."""
    import os
    import subprocess
    import sys

    import numba

    if not hasattr(numba.config, "CACHE_LOCATOR_CLASSES"):
        pytest.skip("this numba cannot be told which cache locators to use")
    code = """
import torch
from pacer_hf import PacerConfig, PacerPreVerifier
from pacer_hf.loops import preverifier_kernel
assert type(preverifier_kernel._score._cache).__name__ == "NullCache", type(preverifier_kernel._score._cache)
scorer = preverifier_kernel.round_scorer(PacerPreVerifier(PacerConfig(draft_hidden_size=8)))
scorer.start()
print(scorer.add(torch.randn(8), torch.randn(40), 3))
"""
    # a locator that finds nothing for a plain source file stands in for "nowhere writable"
    env = {**os.environ, "NUMBA_CACHE_LOCATOR_CLASSES": "ZipCacheLocator"}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert math.isfinite(float(result.stdout.strip().splitlines()[-1]))
