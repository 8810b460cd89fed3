"""Training pipeline: collect -> train -> calibrate -> generate, resumption, bad input, PEFT, data parallel.

Tiny Llama pairs from configs (tests/conftest.py); float64 models so generation exactness is never a
numerical near-tie.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import build_draft, build_model, make_preverifier, plain_greedy

import pacer_hf
from pacer_hf import PacerPreVerifier
from pacer_hf.training import (
    CollectConfig,
    CostModel,
    calibrate_preverifier,
    collect,
    load_texts,
    load_traces,
    measure_costs,
    measure_loop_costs,
    pacer_lengths,
    propose_and_label,
    read_manifest,
    train_preverifier,
)
from pacer_hf.training.simulate import fixed_lengths, speedup
from pacer_hf.training.train import build_preverifier, predict_probs, prepare

VOCAB = 96
STEPS = 6


@pytest.fixture(scope="module")
def tiny_pair():
    target = build_model("llama", vocab_size=VOCAB).to(torch.float64)
    draft = build_draft(target, "noisy", noise=0.06)
    return pacer_hf.enable(target), draft


def corpus(n_texts: int = 32, length: int = 40, seed: int = 0) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (length,), generator=generator).tolist() for _ in range(n_texts)]


def small_config(**overrides) -> CollectConfig:
    values = {"max_draft_tokens": STEPS, "positions_per_text": 8, "min_prefix": 4, "shard_size": 32, "batch_size": 16}
    return CollectConfig(**{**values, **overrides})


@pytest.fixture(scope="module")
def traces(tiny_pair, tmp_path_factory):
    target, draft = tiny_pair
    out = tmp_path_factory.mktemp("traces")
    return collect(target, draft, out, token_ids=corpus(), config=small_config(), progress=False)


def test_end_to_end_collect_train_calibrate_generate(tiny_pair, traces, tmp_path):
    target, draft = tiny_pair
    data = load_traces(traces)
    manifest = read_manifest(traces)
    assert len(data) == manifest["num_units"] == 32 * 8 and manifest["complete"]
    labels = np.asarray(data["labels"])
    assert 0.05 < (labels[labels >= 0]).mean() < 0.95, "the noisy draft should be partly accepted"
    model, metrics = train_preverifier(traces, tmp_path / "pv", eval_fraction=0.25, epochs=5, batch_size=32,
                                       learning_rate=3e-3, hidden_size=32, progress=False)
    assert metrics["auc"] > 0.6 and 0 <= metrics["ece"] <= 1
    assert {"sim_speedup", "sim_best_fixed", "sim_oracle"} <= set(metrics)
    costs = measure_costs(target, draft, model, context=16, max_k=STEPS, repeats=2, progress=False)
    assert costs.draft_cost > 0 and costs.verify_cost[0] == 1.0 and costs.step_seconds > 0
    assert costs.preverifier_cost > 0, "the pre-verifier's work per drafted token is timed"
    costs = measure_loop_costs(target, draft, costs, context=16, new_tokens=24, gammas=(1, 4), repeats=2)
    assert costs.draft_cost > 0 and np.isfinite([costs.round_overhead, costs.ar_overhead, costs.preverifier_cost]).all()
    assert getattr(target, "_pacer_plain_generate", None) is not None, "an enabled target stays enabled"
    report = calibrate_preverifier(model, data, costs, block_sizes=(1, 2, 3))
    assert report["round_overhead"] == costs.round_overhead
    table = report["table"]
    assert table["oracle"] >= max(v for k, v in table.items() if k.startswith("fixed-")) - 1e-9
    model.save_pretrained(tmp_path / "pv")
    loaded = PacerPreVerifier.from_pretrained(tmp_path / "pv")
    assert loaded.config.calibration["chosen"] == report["chosen"]
    assert loaded.config.block_size == report["chosen"]["block_size"]
    for prompt in corpus(3, 10, seed=5):
        prompt = torch.tensor([prompt])
        expected = plain_greedy(target, prompt, max_new_tokens=24)
        out = target.generate(prompt, assistant_model=draft, pacer=str(tmp_path / "pv"), do_sample=False,
                              max_new_tokens=24)
        assert torch.equal(out, expected)



def test_loop_costs_recover_the_parts_of_a_known_clock(tiny_pair, monkeypatch):
    """measure_loop_costs' algebra (setup, first round, least squares) on a clock whose parts are known: real
    generate calls give the stats, the clock charges each call its fixed cost, every draft forward, every verify
    after the prompt's and an overhead per round; plain decoding pays a step plus its own overhead per token."""
    import pacer_hf.training.calibrate as calibrate

    target, draft = tiny_pair
    step, draft_s, round_s, plain_s, setup_s = 0.010, 0.003, 0.002, 0.001, 0.05
    costs = CostModel(draft_cost=0.1, verify_cost=[1.0, 1.1, 1.25, 1.4, 1.6], step_seconds=step)

    def clock(call, device=None):
        result = call()
        tokens = call.keywords["max_new_tokens"]
        if "assistant_model" not in call.keywords:
            return setup_s + (tokens - 1) * (step + plain_s), result
        stats = pacer_hf.last_stats(target)
        rounds = stats.target_forwards - 1
        verifies = costs.verify(np.asarray(stats.draft_lengths[1:], dtype=int)).sum() * step
        return setup_s + stats.draft_forwards * draft_s + verifies + rounds * round_s, result

    monkeypatch.setattr(calibrate, "timed", clock)
    enabled_before = getattr(target, "_pacer_plain_generate", None) is not None
    refined = measure_loop_costs(target, draft, costs, context=16, new_tokens=24, gammas=(1, 2, 3), repeats=1)
    assert refined.draft_cost == pytest.approx(draft_s / step)
    assert refined.round_overhead == pytest.approx(round_s / step)
    assert refined.ar_overhead == pytest.approx(plain_s / step)
    assert refined.round_cost[0] == pytest.approx(1 + plain_s / step)
    assert len(refined.round_cost) == 4 and all(c > refined.round_cost[0] for c in refined.round_cost[1:])
    assert (getattr(target, "_pacer_plain_generate", None) is not None) == enabled_before, "left as it was found"


def test_round_overhead_favours_longer_drafts():
    """The loop's per-round cost moves the best fixed length up; ar's own overhead scales every speedup."""
    acc = (np.random.default_rng(0).random((400, 8)) < 0.7).astype(float)
    bare = CostModel(draft_cost=0.1)
    looped = CostModel(draft_cost=0.1, round_overhead=0.5)

    def best(costs):
        return max(range(1, 9), key=lambda g: speedup(acc, fixed_lengths(acc, g), costs))

    assert best(looped) > best(bare)
    ratio = speedup(acc, fixed_lengths(acc, 2), CostModel(ar_overhead=0.2)) / speedup(acc, fixed_lengths(acc, 2),
                                                                                        CostModel())
    assert ratio == pytest.approx(1.2)
    restored = CostModel.from_calibration({"draft_cost": 0.1, "verify_cost": [1.0, 1.1], "round_overhead": 0.5})
    assert restored.round_overhead == 0.5 and restored.ar_overhead == 0.0


def test_collected_inputs_match_generation(tiny_pair, monkeypatch):
    """Collection's hidden states/features equal what generation feeds the pre-verifier, and the simulator's
    draft length equals the one generation chooses (first round, same prefix)."""
    from pacer_hf.loops.preverifier_kernel import CompiledRoundScorer

    target, draft = tiny_pair
    prompt = corpus(1, 12, seed=7)[0]
    pv = make_preverifier(draft, max_draft_tokens=STEPS, block_size=2, threshold=0.3)
    fed, add = [], CompiledRoundScorer.add

    def recording_add(self, hidden, logits, token):
        logit = add(self, hidden, logits, token)
        fed.append((hidden.float().numpy().copy(), self.features.copy()))
        return logit

    monkeypatch.setattr(CompiledRoundScorer, "add", recording_add)
    target.generate(torch.tensor([prompt]), assistant_model=draft, pacer=pv, do_sample=False, max_new_tokens=8)
    first_round = pacer_hf.last_stats(target).draft_lengths[0]
    arrays = propose_and_label(target, draft, [prompt], STEPS)
    hidden = torch.as_tensor(np.stack([h for h, _ in fed[:first_round]]))
    feats = torch.as_tensor(np.stack([f for _, f in fed[:first_round]]))
    torch.testing.assert_close(hidden.float(), torch.as_tensor(arrays["draft_hidden_states"][0, :first_round]).float(),
                               atol=2e-3, rtol=2e-3)
    torch.testing.assert_close(feats.float(), torch.as_tensor(arrays["draft_features"][0, :first_round]),
                               atol=1e-4, rtol=1e-4)
    data = {"draft_hidden_states": torch.as_tensor(arrays["draft_hidden_states"]).float(),
            "draft_features": torch.as_tensor(arrays["draft_features"])}
    with torch.no_grad():
        probs = torch.sigmoid(pv(**data).logits).numpy()
    lengths = pacer_lengths(probs, 2, 0.3, "block")
    assert int(lengths[0]) == first_round


def test_target_continuation(tiny_pair, tmp_path):
    """Prefixes grown by the target's own greedy tokens (as at serving) match plain greedy generation."""
    from pacer_hf.training.collect import greedy_continuations

    target, draft = tiny_pair
    prompts = corpus(3, 12, seed=4)
    prompts[1] = prompts[1][:7]  # different lengths: left padding must not change the continuation
    grown = greedy_continuations(target, prompts, 5)
    for prompt, more in zip(prompts, grown):
        expected = plain_greedy(target, torch.tensor([prompt]), max_new_tokens=5)[0, len(prompt):].tolist()
        assert more == expected
    out = collect(target, draft, tmp_path / "c", token_ids=corpus(4), config=small_config(target_continuation=6),
                  progress=False)
    assert len(load_traces(out)) == read_manifest(out)["num_units"]


def test_resume_after_interruption(tiny_pair, traces, tmp_path):
    target, draft = tiny_pair
    out = tmp_path / "resumed"
    with pytest.raises(KeyboardInterrupt):
        collect(target, draft, out, token_ids=corpus(), config=small_config(), progress=False, _stop_after_shards=2)
    manifest = read_manifest(out)
    assert manifest["done_shards"] == [0, 1] and not manifest["complete"]
    with pytest.raises(ValueError, match="incomplete"):
        load_traces(out)
    (out / "shards" / ".tmp-shard-00002").mkdir()  # a shard write cut halfway
    collect(target, draft, out, token_ids=corpus(), config=small_config(), progress=False)
    resumed, full = load_traces(out), load_traces(traces)
    assert len(resumed) == len(full) == read_manifest(out)["num_units"]
    assert len(set(resumed["example_id"])) == len(resumed)
    assert resumed["example_id"] == full["example_id"]
    np.testing.assert_array_equal(np.asarray(resumed["labels"]), np.asarray(full["labels"]))
    assert not list((out / "shards").glob(".tmp-*"))


def test_output_folder_of_another_run_is_refused(tiny_pair, traces, tmp_path):
    target, draft = tiny_pair
    before = sorted(p.name for p in (traces / "shards").iterdir())
    with pytest.raises(ValueError, match="different collection run.*max_draft|different collection run"):
        collect(target, draft, traces, token_ids=corpus(), config=small_config(max_draft_tokens=4), progress=False)
    assert sorted(p.name for p in (traces / "shards").iterdir()) == before
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("keep me")
    with pytest.raises(ValueError, match="not empty"):
        collect(target, draft, other, token_ids=corpus(), config=small_config(), progress=False)
    assert (other / "notes.txt").read_text() == "keep me"


def test_bad_inputs(tiny_pair, traces, tmp_path):
    target, draft = tiny_pair
    other_vocab = build_model("llama", vocab_size=VOCAB + 8).to(torch.float64)
    with pytest.raises(ValueError, match="vocabularies differ"):
        collect(target, other_vocab, tmp_path / "v", token_ids=corpus(), config=small_config(), progress=False)
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"content": "x = 1"}) + "\n")
    with pytest.raises(ValueError, match="column='text'.*--column"):
        load_texts(rows)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="without text files"):
        load_texts(tmp_path / "empty")
    rows.write_text(json.dumps({"text": "  "}) + "\n")
    with pytest.raises(ValueError, match="no non-empty texts"):
        load_texts(rows)
    with pytest.raises(ValueError, match="min_prefix"):
        collect(target, draft, tmp_path / "short", token_ids=[[1, 2]], config=small_config(), progress=False)
    foreign = PacerPreVerifier.from_draft(build_model("llama", vocab_size=VOCAB, hidden=16, layers=1), max_draft_tokens=8)
    foreign.save_pretrained(tmp_path / "foreign")
    with pytest.raises(ValueError, match="trained for draft .* train from scratch"):
        build_preverifier(read_manifest(traces), str(tmp_path / "foreign"))


def test_fine_tune_existing_preverifier(traces, tmp_path):
    first, _ = train_preverifier(traces, tmp_path / "a", epochs=1, batch_size=32, hidden_size=32, progress=False)
    tuned, metrics = train_preverifier(traces, tmp_path / "b", init_from=str(tmp_path / "a"), epochs=1,
                                       batch_size=32, progress=False)
    assert tuned.config.hidden_size == 32 and metrics["auc"] == metrics["auc"]


def test_train_on_several_collections(tiny_pair, traces, tmp_path):
    """`--data A B` trains on both collections' rows, text ids kept apart; another draft's collection is refused."""
    from pacer_hf.training.train import load_collections

    target, draft = tiny_pair
    second = collect(target, draft, tmp_path / "second", token_ids=corpus(8, seed=1), config=small_config(),
                     progress=False)
    one, both = load_collections(traces)[1], load_collections([traces, second])[1]
    assert len(both) == len(one) + len(load_traces(second))
    assert min(both["text_id"][len(one):]) > max(one["text_id"])
    model, _ = train_preverifier([traces, second], tmp_path / "pv", eval_fraction=0.25, epochs=1, batch_size=32,
                                 progress=False)
    assert model.config.training["train_data"] == [str(traces), str(second)]
    assert model.config.training["train_rows"] + model.config.training["eval_rows"] == len(both)
    other = build_model("llama", vocab_size=VOCAB, hidden=16, layers=1)
    foreign = collect(target, other, tmp_path / "foreign", token_ids=corpus(4), config=small_config(), progress=False)
    with pytest.raises(ValueError, match="another draft"):
        load_collections([traces, foreign])


def test_peft_draft_exact_and_alignment(tiny_pair, tmp_path):
    from peft import LoraConfig, PeftModel, get_peft_model

    from pacer_hf.training import align_draft, measure_alpha

    target, draft = tiny_pair
    import copy

    base = copy.deepcopy(draft)
    lora = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0))
    with torch.no_grad():
        for name, param in lora.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.05)
    lora.eval()
    assert isinstance(lora, PeftModel)
    pv = make_preverifier(lora, max_draft_tokens=STEPS, block_size=2, threshold=0.4)
    for prompt in corpus(3, 10, seed=9):
        prompt = torch.tensor([prompt])
        expected = plain_greedy(target, prompt, max_new_tokens=20)
        for pacer in (pv, "sd-fixed-3"):
            out = target.generate(prompt, assistant_model=lora, pacer=pacer, do_sample=False, max_new_tokens=20)
            assert torch.equal(out, expected)
    arrays = propose_and_label(target, lora, [corpus(1, 12)[0]], STEPS)
    assert arrays["draft_hidden_states"].shape == (1, STEPS, draft.config.hidden_size)
    held = corpus(6, 40, seed=3)
    before = measure_alpha(target, draft, held, gamma=4, positions_per_text=4)
    aligned = align_draft(copy.deepcopy(draft), target, corpus(40, 40, seed=11), steps=40, seq_len=32,
                          batch_size=8, learning_rate=5e-3, progress=False)
    after = measure_alpha(target, aligned, held, gamma=4, positions_per_text=4)
    assert after["alpha"] >= before["alpha"]
    prompt = torch.tensor([held[0][:10]])
    out = target.generate(prompt, assistant_model=aligned, pacer="sd-fixed-4", do_sample=False, max_new_tokens=16)
    assert torch.equal(out, plain_greedy(target, prompt, max_new_tokens=16))


def test_sampling_labels_are_soft(tiny_pair, tmp_path):
    target, draft = tiny_pair
    out = collect(target, draft, tmp_path / "s", token_ids=corpus(6), config=small_config(temperature=1.0),
                  progress=False)
    labels = np.asarray(load_traces(out)["labels"])
    assert read_manifest(out)["label_kind"] == "sampling"
    assert ((labels >= 0) & (labels <= 1)).all() and ((labels > 0) & (labels < 1)).any()
    model = build_preverifier(read_manifest(out))
    assert model.config.decoding == "sampling", "a pre-verifier records what its traces were labelled for"


@pytest.mark.slow
def test_accelerate_two_processes_matches_single(traces, tmp_path):
    common = ["--data", str(traces), "--eval-fraction", "0.25", "--epochs", "6", "--batch-size", "32",
              "--lr", "3e-3", "--hidden-size", "32"]
    # accelerate 1.15's `--cpu` launcher starts ONE process unless mpirun is set up; `--multi_gpu` starts two
    # through torchrun, and with no GPU they train data parallel on CPU (gloo). world_size below proves it.
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "CUDA_VISIBLE_DEVICES": ""}
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
              "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
              "-m", "pacer_hf.cli", "train", *common, "--out", str(tmp_path / "ddp")]
    result = subprocess.run(launch, env=env, capture_output=True, text=True, timeout=170)
    assert result.returncode == 0, result.stderr[-3000:]
    ddp = json.loads((tmp_path / "ddp" / "train_results.json").read_text())
    single = json.loads(Path(train_preverifier(traces, tmp_path / "one", eval_fraction=0.25, epochs=6, batch_size=32,
                                               learning_rate=3e-3, hidden_size=32, progress=False)
                             and tmp_path / "one" / "train_results.json").read_text())
    assert ddp["world_size"] == 2 and single["world_size"] == 1
    assert abs(ddp["auc"] - single["auc"]) < 0.05 and abs(ddp["ece"] - single["ece"]) < 0.05, (ddp, single)
    # the saved data-parallel model loads and ranks accepted vs rejected tokens as well as the single one
    from sklearn.metrics import roc_auc_score

    examples = prepare(load_traces(traces))
    aucs = {}
    for name in ("ddp", "one"):
        probs, labels = predict_probs(PacerPreVerifier.from_pretrained(tmp_path / name), examples)
        aucs[name] = roc_auc_score(labels > 0.5, probs)
    assert aucs["ddp"] > 0.6 and abs(aucs["ddp"] - aucs["one"]) < 0.05, aucs


def test_round_costs_measured_in_generate_and_validation_on_the_clock(tiny_pair, tmp_path):
    """measure_loop_costs' round_cost table (k = 0..3) and compare_in_generate's real-call comparison."""
    from pacer_hf.training.validate import compare_in_generate

    target, draft = tiny_pair
    costs = measure_costs(target, draft, None, context=16, max_k=4, repeats=2, progress=False)
    costs = measure_loop_costs(target, draft, costs, context=16, new_tokens=24, gammas=(1, 2, 3), repeats=2)
    assert len(costs.round_cost) == 4 and all(value > 0 for value in costs.round_cost)
    # k=0 is plain decoding per token: the same measurement as ar_overhead (= its excess over a bare step)
    assert costs.ar_overhead == pytest.approx(max(costs.round_cost[0] - 1.0, 0.0), abs=1e-9)
    assert costs.round_cost[3] > costs.round_cost[0], "a round that drafts 3 tokens costs more than one plain step"
    assert list(costs.round_time(np.array([0, 3]))) == [costs.round_cost[0], costs.round_cost[3]]
    prompts = corpus(2, 10, seed=7)
    pv = make_preverifier(draft, block_size=1, threshold=0.5, max_draft_tokens=4)
    rows = compare_in_generate(target, draft, prompts, {"sd-fixed-2": "sd-fixed-2", "pacer": pv}, runs=1,
                               max_new_tokens=12)
    assert set(rows) == {"ar", "sd-fixed-2", "pacer"} and rows["ar"]["vs_ar"] == 1.0
    assert rows["sd-fixed-2"]["mean_draft"] == pytest.approx(2.0, abs=0.5) and rows["pacer"]["tokens_per_s"] > 0
    assert rows["ar"]["tau"] == 1.0 and rows["sd-fixed-2"]["tau"] > 1.0 and 0 < rows["sd-fixed-2"]["alpha"] <= 1


def test_compare_in_generate_gives_setting_kwargs_to_that_setting_only(tiny_pair):
    """`setting_kwargs` reach the named setting's calls (examples/compare_stop_rules.py --costs: one pre-verifier
    deciding with a given cost table beside the same one measuring), and no other setting's."""
    from pacer_hf.training.validate import compare_in_generate

    target, draft = tiny_pair
    prompts = corpus(1, 10, seed=11)
    pv = make_preverifier(draft, block_size=1, threshold=0.5, max_draft_tokens=4)
    rows = compare_in_generate(target, draft, prompts, {"measured": pv, "given": pv}, runs=1, max_new_tokens=8,
                               setting_kwargs={"given": {"pacer_costs": [1.0, 1.5, 2.0, 2.5, 3.0]}})
    assert set(rows) == {"ar", "measured", "given"}
    bad = {"pacer_costs": "nope"}
    with pytest.raises(ValueError, match=r"pacer_costs='nope'"):
        compare_in_generate(target, draft, prompts, {"sd-fixed-2": "sd-fixed-2"}, runs=1, max_new_tokens=8,
                            setting_kwargs={"sd-fixed-2": bad})
    compare_in_generate(target, draft, prompts, {"sd-fixed-2": "sd-fixed-2"}, runs=1, max_new_tokens=8,
                        setting_kwargs={"another": bad})


def test_compare_in_generate_runs_transformers_own_schedule_in_its_context(tiny_pair):
    """pacer=False is transformers' assisted generation with the draft, its schedule set by the setting's context
    for each call (and put back after it); its output is checked against the target's like every setting's."""
    from contextlib import contextmanager

    from pacer_hf.bench.strategy_calls import draft_generation_config
    from pacer_hf.training.validate import compare_in_generate

    target, draft = tiny_pair
    entered, seen = [], []
    before = draft.generation_config.num_assistant_tokens

    @contextmanager
    def constant_two():
        with draft_generation_config(draft, {"num_assistant_tokens": 2, "num_assistant_tokens_schedule": "constant",
                                             "assistant_confidence_threshold": 0.0}):
            entered.append(True)
            seen.append(draft.generation_config.num_assistant_tokens)
            yield

    rows = compare_in_generate(target, draft, corpus(2, 10, seed=3), {"hf-2": False}, runs=1, max_new_tokens=8,
                               warmup=True, contexts={"hf-2": constant_two})
    assert len(entered) == 3 and set(seen) == {2}  # the warm-up call and one per prompt
    assert draft.generation_config.num_assistant_tokens == before
    assert rows["hf-2"]["tokens_per_s"] > 0 and math.isnan(rows["hf-2"]["tau"])


def test_compare_in_generate_gives_each_setting_its_own_memory_of_the_pair(tiny_pair):
    """Interleaved, two pre-verifiers must not start from what the other learned of the pair (the stop rule keeps
    one memory per target and draft between calls): each setting carries its own from call to call."""
    from contextlib import contextmanager

    from pacer_hf.loops.recent_acceptance import recent_acceptance_for
    from pacer_hf.model_state import ModelState
    from pacer_hf.training.validate import compare_in_generate

    target, draft = tiny_pair
    seen: dict[str, list] = {"a": [], "b": []}

    def recording(name):
        @contextmanager
        def context():
            memory = recent_acceptance_for(target, draft, False)
            seen[name].append((memory, memory.long_tried))
            yield
        return context

    pvs = {name: make_preverifier(draft, seed=seed, block_size=1, threshold=0.5, max_draft_tokens=4)
           for seed, name in enumerate(seen)}
    compare_in_generate(target, draft, corpus(2, 10, seed=5), pvs, runs=1, max_new_tokens=12,
                        contexts={name: recording(name) for name in seen})
    (a1, tried_a1), (a2, tried_a2) = seen["a"]
    (b1, tried_b1), _ = seen["b"]
    assert tried_a1 == 0 and tried_b1 == 0, "each setting's first call starts with no memory of the pair"
    assert a2 is a1 and tried_a2 > 0, "a setting's next call starts from what its own calls learned"
    assert b1 is not a1
    assert draft not in (ModelState(target).recent_acceptance or {})


def test_loop_costs_warm_every_verify_width_and_plain_decoding_before_timing(tiny_pair, monkeypatch):
    """Each γ's round cost rests on few timed calls: a shape's one-time costs (kernel selection and allocations on a
    GPU) must not land in them, so every γ and plain decoding run once, untimed and short, before any timed call."""
    from pacer_hf.training import calibrate as calibrate_module

    target, draft = tiny_pair
    costs = measure_costs(target, draft, None, context=16, max_k=4, repeats=1, progress=False)
    calls, timed = [], calibrate_module.timed

    def recording(call, device):
        calls.append((call.keywords.get("pacer"), call.keywords["max_new_tokens"]))
        return timed(call, device)

    monkeypatch.setattr(calibrate_module, "timed", recording)
    measure_loop_costs(target, draft, costs, context=16, new_tokens=24, gammas=(1, 2, 3), repeats=1)
    first_full = next(i for i, (_, tokens) in enumerate(calls) if tokens == 24)
    warmed = {pacer for pacer, tokens in calls[:first_full] if tokens < 24}
    assert {None, "sd-fixed-1", "sd-fixed-2", "sd-fixed-3"} <= warmed
