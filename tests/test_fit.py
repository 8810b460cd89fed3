"""`pacer_hf.fit_preverifier` and `pacer-hf fit`: tiny config models with the demo tokenizer, small budgets.

The cost measurement and the answers are cut down here (fewer timing repeats, short answers); what is checked is the
plumbing: models from objects, folders and (monkeypatched) Hub ids, prompts from a list or a jsonl file, the card
written beside the weights, resuming after an interruption in training, and the errors for bad arguments.
"""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

import pytest
import torch
from conftest import build_draft, build_model
from transformers import AutoModelForCausalLM, AutoTokenizer

import pacer_hf
from pacer_hf import PacerPreVerifier
from pacer_hf._paths import hub_cards_dir
from pacer_hf.modeling_pacer import draft_signature
from pacer_hf.training import fit as fit_module
from pacer_hf.training import fit_calibrate, fit_train
from pacer_hf.training.fit_data import build_prompts, user_requests
from pacer_hf.training.fit_setup import load_models

DEMO_TOKENIZER = hub_cards_dir() / "demo-target"
PROMPTS = [f"def function_{i}(values):\n    \"\"\"Return the sum of values plus {i}.\"\"\"\n" for i in range(12)]
SMALL = {"max_new_tokens": 16, "max_draft_tokens": 8, "progress": False}


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(DEMO_TOKENIZER)


@pytest.fixture(scope="module")
def tiny(tokenizer):
    """A tiny float32 Llama target over the demo tokenizer's vocabulary and a noisy copy of it as the draft."""
    target = build_model("llama", vocab_size=len(tokenizer), hidden=32, layers=2).float()
    return target, build_draft(target, "noisy", noise=0.3)


@pytest.fixture(scope="module")
def folders(tiny, tokenizer, tmp_path_factory):
    root = tmp_path_factory.mktemp("pair")
    for name, model in zip(("target", "draft"), tiny):
        model.save_pretrained(root / name)
    tokenizer.save_pretrained(root / "target")
    return root / "target", root / "draft"


@pytest.fixture(autouse=True)
def quick_costs(monkeypatch):
    monkeypatch.setattr(fit_calibrate, "COST_REPEATS", 2)
    monkeypatch.setattr(fit_calibrate, "LOOP_TOKENS", 12)


@pytest.mark.slow
def test_fit_from_folders_writes_a_card_and_decides_exactly(folders, tokenizer, tmp_path):
    target_dir, draft_dir = folders
    out = tmp_path / "pv"
    prompts = PROMPTS + [f"class Point{i}:\n    def __init__(self, x, y):\n" for i in range(18)]
    pv = pacer_hf.fit_preverifier(str(target_dir), str(draft_dir), prompts=prompts, output_dir=out, budget_s=60,
                                  **SMALL)
    report = pv.fit_report
    assert pv.config.decision_rule == "expected_gain" and pv.config.decoding == "greedy"
    assert {"draft_cost", "verify_cost", "round_cost"} <= set(pv.config.calibration)
    assert pv.config.draft_model == str(draft_dir) and pv.config.target_model == str(target_dir)
    assert 0.0 <= report["auc"] <= 1.0 and 0.0 <= report["ece"] <= 1.0
    assert report["speed_check"]["summary"]["outputs_identical"]
    methods = [row["method"] for row in report["speed_check"]["rows"]]
    assert methods[:5] == ["target alone", "sd-fixed-2", "sd-fixed-4", "sd-fixed-6", "sd-fixed-8"]
    assert any(m.startswith("transformers' assisted generation") for m in methods)
    card = (out / "README.md").read_text()
    assert "held-out AUC" in card and "sd-fixed-4" in card and "expected_gain" in card
    metrics = json.loads((out / "pacer_metrics.json").read_text())
    assert metrics["training"]["answers"] == len(prompts) and metrics["evaluation"]["held-out AUC"] == report["auc"]
    stages = {"answers, tracing and training", "training setup", "calibrate", "speed check"}
    assert set(metrics["training"]["stage plan seconds"]) == stages
    loaded = pacer_hf.load_preverifier(str(out))
    target = AutoModelForCausalLM.from_pretrained(target_dir).eval()
    draft = AutoModelForCausalLM.from_pretrained(draft_dir).eval()
    pacer_hf.enable(target)
    ids = torch.tensor([tokenizer(PROMPTS[0])["input_ids"]])
    plain = target.generate(ids, max_new_tokens=20, do_sample=False)
    assert torch.equal(target.generate(ids, max_new_tokens=20, do_sample=False, assistant_model=draft, pacer=loaded),
                       plain)
    # the saved card goes with the object too: save_pretrained elsewhere writes it again
    pv.save_pretrained(tmp_path / "again")
    assert (tmp_path / "again" / "README.md").read_text() == card


def test_rerun_resumes_after_an_interruption_in_training(tiny, tokenizer, tmp_path, monkeypatch):
    target, draft = tiny
    out = tmp_path / "pv"

    def interrupt(self, args, state, control, **kwargs):
        raise KeyboardInterrupt("simulated interruption after the first checkpoint")

    monkeypatch.setattr(fit_train.TimeLimit, "on_save", interrupt, raising=False)
    with pytest.raises(KeyboardInterrupt):
        pacer_hf.fit_preverifier(target, draft, tokenizer, prompts=PROMPTS, output_dir=out, speed_check=False, **SMALL)
    monkeypatch.undo()
    monkeypatch.setattr(fit_calibrate, "COST_REPEATS", 2)
    monkeypatch.setattr(fit_calibrate, "LOOP_TOKENS", 12)
    answers = (out / "fit-work" / "answers-greedy.jsonl").read_text()
    assert list((out / "fit-work" / "trainer-greedy-fresh").glob("checkpoint-*"))

    def no_more_answers(*args, **kwargs):
        raise AssertionError("the answers stage had finished: a rerun must not generate again")

    monkeypatch.setattr(fit_module, "generate_answers", no_more_answers)
    pacer_hf.fit_preverifier(target, draft, tokenizer, prompts=PROMPTS, output_dir=out, speed_check=False,
                             budget_s=120, **SMALL)  # a budget is not part of what a rerun must repeat
    fresh = json.loads((out / "fit-work" / "candidate-greedy-fresh" / "fit_training.json").read_text())
    assert fresh["resumed_from"].startswith("checkpoint-")
    assert (out / "fit-work" / "answers-greedy.jsonl").read_text() == answers
    assert (out / "model.safetensors").is_file() and "not measured" in (out / "README.md").read_text()


def test_a_fit_keeps_the_candidate_whose_rule_runs_fastest_on_held_out_rounds(tiny, tokenizer, tmp_path, monkeypatch):
    """Three candidates (from scratch, the default fine-tuned, the default as it is), each calibrated on the choosing
    half of the held-out rounds; the fit keeps the one the simulation runs fastest and its card names all three."""
    target, draft = tiny
    out = tmp_path / "pv"
    before = {k: v.clone() for k, v in target.state_dict().items()}
    pv = pacer_hf.fit_preverifier(target, draft, tokenizer, prompts=PROMPTS, output_dir=out, speed_check=False, **SMALL)
    after = target.state_dict()  # the answers' dtype was timed and used on the target itself, then undone exactly
    assert target.dtype == torch.float32 and all(torch.equal(v, after[k]) for k, v in before.items())
    work = out / "fit-work"
    speeds = pv.config.calibration["candidates_simulated"]
    kept = pv.config.calibration["candidate_kept"]
    assert speeds[kept] == max(speeds.values())  # rounded: another candidate may tie with it
    assert set(speeds) == set(fit_train.CANDIDATES) and all(v > 0 for v in speeds.values())
    assert pv.config.calibration["chosen"]["speedup"] == pytest.approx(speeds[kept], abs=1e-4)
    assert (pv.config.input_mode == "features") == (kept != "fresh")  # only the one from scratch reads hidden states
    assert all(f"{v:.3f}x" in pv.fit_report["training"]["start"] for v in speeds.values())
    as_is = PacerPreVerifier.from_pretrained(work / "candidate-greedy-as-is")
    default = pacer_hf.default_preverifier()
    assert torch.equal(as_is.head.weight, default.head.weight.float()), "the as-is candidate is not trained"
    # the choice follows the simulated speed: make each candidate the fastest in turn
    calibrate = fit_calibrate.calibrate_preverifier
    candidates, _ = fit_train.train_candidates(
        work / "traces-greedy-train", work / "traces-greedy-heldout", work, "greedy",
        default=default, seconds=None, step_seconds_fresh=0.01, max_draft_tokens=8)
    plan = SimpleNamespace(hardware="test")
    for faster in fit_train.CANDIDATES:
        def rigged(preverifier, *args, faster=faster, **kwargs):
            report = calibrate(preverifier, *args, **kwargs)
            report["chosen"]["speedup"] = 2.0 if preverifier is candidates[faster] else 1.0
            return report

        monkeypatch.setattr(fit_calibrate, "calibrate_preverifier", rigged)
        name, chosen, report = fit_calibrate.calibrate_here(target, draft, dict(candidates), work / "traces-greedy-heldout",
                                                            plan, progress=False)
        assert name == faster and chosen is candidates[faster] and report["candidates_simulated"][faster] == 2.0


def test_the_default_starts_a_fit_for_longer_rounds_and_for_its_draft_only(tiny):
    target, draft = tiny
    default = pacer_hf.default_preverifier()
    signature = draft_signature(draft.config)
    manifest = {"config": {"max_draft_tokens": default.config.max_draft_tokens + 8}, "draft_model": "tiny-draft",
                "target_model": "tiny-target", "draft_signature": signature, "label_kind": "greedy"}
    start = fit_train.fine_tune_start(default, manifest, max_draft_tokens=4)
    rows, old = start.position.weight.detach(), default.position.weight.detach()
    assert start.config.max_draft_tokens == len(rows) == len(old) + 8
    assert torch.equal(rows[: len(old)], old) and torch.equal(rows[len(old):], old[-1].expand(8, -1))
    assert default.config.draft_signature is None and default.config.max_draft_tokens == len(old)  # a copy
    assert default.config.online_calibration and not start.config.online_calibration, "the fit calibrates on the pair"
    start.check_draft(draft)  # features only: any hidden size, but the pair's draft
    other = build_model("llama", vocab_size=draft.config.vocab_size, hidden=48, layers=3)
    with pytest.raises(ValueError, match="trained for draft tiny-draft"):
        start.check_draft(other)
    with pytest.raises(ValueError, match="features-only"):
        fit_train.fine_tune_start(PacerPreVerifier.from_draft(draft), manifest, max_draft_tokens=4)


def test_prompts_from_a_list_a_jsonl_file_and_a_dataset_agree(tokenizer, tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"text": p}) + "\n" for p in PROMPTS))
    from_file, from_list = build_prompts(tokenizer, str(path)), build_prompts(tokenizer, PROMPTS)
    assert from_file == from_list
    import datasets  # a datasets dataset (saved here: a Hub name goes through datasets.load_dataset the same way)

    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"request": PROMPTS})}).save_to_disk(tmp_path / "ds")
    assert build_prompts(tokenizer, str(tmp_path / "ds"), column="request", split="train") == from_list
    with pytest.raises(ValueError, match="split='test'"):
        build_prompts(tokenizer, str(tmp_path / "ds"), column="request", split="test")
    assert [r["prompt"] for r in from_list if r["key"] == "user/3"] == [tokenizer(PROMPTS[3] + "\n\n")["input_ids"]]
    held = [r for r in from_list if r["heldout"]]
    assert 2 <= len(held) < len(from_list) and from_list[: len(held)] == held  # held-out first, for any budget
    other = tmp_path / "other.jsonl"
    other.write_text(json.dumps({"prompt": "hi"}) + "\n")
    with pytest.raises(ValueError, match=r"prompts=.*column='text'"):
        user_requests(str(other))
    assert user_requests(str(other), column="prompt") == [("user/0", "user", "hi")]


def test_default_prompts_mix_the_five_kinds_and_use_the_chat_template(tokenizer):
    from pacer_hf.data.fit_prompts import category_of, default_requests

    requests = default_requests(per_category=3)
    assert {category_of(c) for _, c, _ in requests} == {"code", "qa", "summarization", "rewriting", "chat"}
    chat = AutoTokenizer.from_pretrained(DEMO_TOKENIZER)
    chat.chat_template = "{% for m in messages %}<user>{{ m['content'] }}</user>{% endfor %}<assistant>"
    records = build_prompts(chat, ["Why is the sky blue?"] * 4)
    assert chat.decode(records[0]["prompt"]).startswith("<user>Why is the sky blue?</user><assistant>")
    with pytest.raises(ValueError, match="chat_template=True"):
        build_prompts(tokenizer, PROMPTS, chat_template=True)


def test_hub_ids_load_as_transformers_loads_them(folders, monkeypatch):
    target_dir, draft_dir = folders
    local = {"org/tiny-target": target_dir, "org/tiny-draft": draft_dir}
    for cls in (AutoModelForCausalLM, AutoTokenizer):
        original = cls.from_pretrained.__func__
        monkeypatch.setattr(cls, "from_pretrained", classmethod(
            lambda c, name, *a, _o=original, **k: _o(c, str(local.get(name, name)), *a, **k)))
    target, draft, tokenizer, names = load_models("org/tiny-target", "org/tiny-draft", None, "cpu", "auto")
    assert names == {"target": "org/tiny-target", "draft": "org/tiny-draft"}
    assert target.dtype == draft.dtype == torch.float32 and len(tokenizer) == target.config.vocab_size


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"decoding": "beam"}, "decoding='beam'"),
    ({"budget_s": 0}, "budget_s=0"),
    ({"max_draft_tokens": 0}, "max_draft_tokens=0"),
    ({"device": "tpu"}, "device='tpu'"),
    ({"dtype": "int4"}, "dtype='int4'"),
    ({"push_to_hub": "org/name"}, "push_to_hub= needs output_dir="),
    ({"prompts": []}, "prompts= is empty"),
    ({"prompts": "missing.jsonl"}, "prompts='missing.jsonl' does not exist"),
])
def test_bad_arguments_name_the_argument(tiny, tokenizer, kwargs, match):
    target, draft = tiny
    with pytest.raises(ValueError, match=match):
        pacer_hf.fit_preverifier(target, draft, tokenizer, **{"prompts": PROMPTS, **kwargs})


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error a machine without CUDA gives")
def test_cuda_without_a_gpu_is_refused(tiny, tokenizer):
    with pytest.raises(ValueError, match="device='cuda', but torch sees no CUDA device"):
        pacer_hf.fit_preverifier(*tiny, tokenizer, prompts=PROMPTS, device="cuda")


def test_bad_models_and_output_folders_are_refused(tiny, tokenizer, tmp_path):
    target, draft = tiny
    with pytest.raises(ValueError, match="target= must be a causal LM"):
        pacer_hf.fit_preverifier(42, draft, tokenizer, prompts=PROMPTS)
    with pytest.raises(ValueError, match="draft='no/such-model' does not load"):
        pacer_hf.fit_preverifier(target, "no/such-model", tokenizer, prompts=PROMPTS)
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="is not empty and holds no fit"):
        pacer_hf.fit_preverifier(target, draft, tokenizer, prompts=PROMPTS, output_dir=tmp_path)
    other = build_model("llama", vocab_size=len(tokenizer) + 64, hidden=16, layers=1)  # ids the target lacks
    with pytest.raises(ValueError, match="vocabularies differ"):
        pacer_hf.fit_preverifier(target, other, tokenizer, prompts=PROMPTS)


def test_a_folder_holding_another_fit_is_refused(tiny, tokenizer, tmp_path):
    from pacer_hf.training.fit_setup import open_work

    open_work(tmp_path / "pv", {"max_draft_tokens": 8, "prompts": ["a"]}, overwrite=False)
    with pytest.raises(ValueError, match="holds a fit with other max_draft_tokens"):
        open_work(tmp_path / "pv", {"max_draft_tokens": 24, "prompts": ["a"]}, overwrite=False)
    work, state = open_work(tmp_path / "pv", {"max_draft_tokens": 24, "prompts": ["a"]}, overwrite=True)
    assert state["signature"]["max_draft_tokens"] == 24 and work.path.is_dir()


def test_cli_fit_reports_bad_arguments(capsys):
    from pacer_hf.cli import main

    assert main(["fit", "--target", "t", "--draft", "d", "--out", "o", "--budget-minutes", "0"]) == 2
    assert "--budget-minutes 0" in capsys.readouterr().err


def test_bench_reads_a_fit_folder_of_both_decodings(tmp_path):
    from pacer_hf.bench.user_pair import fitted_preverifiers

    for mode in ("greedy", "sampling"):
        (tmp_path / mode).mkdir()
        (tmp_path / mode / "config.json").write_text("{}")
    assert fitted_preverifiers(str(tmp_path), None) == (str(tmp_path / "greedy"), str(tmp_path / "sampling"))
    assert fitted_preverifiers(str(tmp_path / "greedy"), None) == (str(tmp_path / "greedy"), None)
    assert fitted_preverifiers(None, None) == (None, None)


@pytest.mark.slow
def test_cli_fits_both_decodings(folders, tmp_path, capsys):
    from pacer_hf.cli import main

    target_dir, draft_dir = folders
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"text": p}) + "\n" for p in PROMPTS))
    out = tmp_path / "pv"
    assert main(["fit", "--target", str(target_dir), "--draft", str(draft_dir), "--out", str(out), "--prompts",
                 str(prompts), "--decoding", "both", "--max-draft-tokens", "8", "--max-new-tokens", "16",
                 "--device", "cpu", "--budget-minutes", "2", "--no-progress"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith('{"decoding"')]
    assert [line["decoding"] for line in lines] == ["greedy", "sampling"]
    for mode in ("greedy", "sampling"):
        assert pacer_hf.load_preverifier(str(out / mode)).config.decoding == mode
        assert (out / mode / "README.md").is_file()


def test_a_dtype_tried_for_a_while_leaves_the_model_bit_for_bit_as_it_was(tiny):
    """bfloat16 for the answers must not round a float32 target's weights (a `.to()` there and back would)."""
    from pacer_hf.training.fit_data import cast_for_a_while, fastest_dtype

    target, _ = tiny
    before = {k: v.clone() for k, v in target.state_dict().items()}
    assert not all(torch.equal(v, v.bfloat16().float()) for v in before.values())  # a round trip would change them
    with cast_for_a_while(target, torch.bfloat16):
        assert target.dtype == torch.bfloat16
        assert next(target.parameters()).dtype == torch.bfloat16
    assert fastest_dtype(target, [[1, 2, 3]] * 2, 0, (torch.float32, torch.bfloat16), new_tokens=2) in (
        torch.float32, torch.bfloat16)
    after = target.state_dict()
    assert target.dtype == torch.float32 and all(torch.equal(v, after[k]) for k, v in before.items())


def test_a_dtype_the_hardware_emulates_is_not_timed_in_generate(tiny, monkeypatch):
    """A dtype whose matrix products run far slower than float32's here (bfloat16 on a CPU without bfloat16
    instructions) is dropped before any generate call is timed in it; one close to the best is still timed."""
    from pacer_hf.training import fit_data

    target, _ = tiny
    seen = []
    real = target.generate
    monkeypatch.setattr(target, "generate", lambda *a, **k: (seen.append(target.dtype), real(*a, **k))[1])
    both = (torch.float32, torch.bfloat16)
    monkeypatch.setattr(fit_data, "matmul_rates", lambda dtypes, device: {torch.float32: 10.0, torch.bfloat16: 0.5})
    assert fit_data.fastest_dtype(target, [[1, 2, 3]] * 2, 0, both, new_tokens=2) == torch.float32
    assert seen == []
    monkeypatch.setattr(fit_data, "matmul_rates", lambda dtypes, device: {torch.float32: 10.0, torch.bfloat16: 9.0})
    fit_data.fastest_dtype(target, [[1, 2, 3]] * 2, 0, both, new_tokens=2)
    assert set(seen) == set(both)


def test_matmul_rates_are_positive_per_dtype():
    from pacer_hf.training.fit_data import matmul_rates

    rates = matmul_rates((torch.float32, torch.bfloat16), "cpu", size=64)
    assert set(rates) == {torch.float32, torch.bfloat16} and all(r > 0 for r in rates.values())


def test_answers_stop_once_their_tracing_would_spend_the_budget(tiny, tokenizer, tmp_path):
    """Each answer written counts what tracing it will cost (`later`) against the answers' budget: with tracing priced
    at the whole budget, answering stops as soon as a held-out and a training batch are in (the minimum a fit needs);
    priced at nothing, every prompt is answered."""
    from pacer_hf.training.fit_data import _batches, generate_answers, read_answers

    target, _ = tiny
    records = build_prompts(tokenizer, PROMPTS + [f"class Point{i}:\n" for i in range(12)])
    kwargs = {"max_new_tokens": 4, "batch_size": 2, "budget_s": 600.0, "do_sample": False, "progress": False}
    priced = generate_answers(target, tokenizer, records, tmp_path / "priced.jsonl", later=lambda p, r: 600.0, **kwargs)
    first_with_both = next(k for k in range(1, len(records)) if len({p["heldout"] for b in _batches(records, 2)[:k]
                                                                    for p in b}) == 2)
    assert [r["key"] for r in priced] == [p["key"] for b in _batches(records, 2)[:first_with_both] for p in b]
    assert len(priced) < len(records)
    free = generate_answers(target, tokenizer, records, tmp_path / "free.jsonl", later=lambda p, r: 0.0, **kwargs)
    assert len(free) == len(records)
    # resuming counts the answers already written: their tracing is still to come
    again = generate_answers(target, tokenizer, records, tmp_path / "priced.jsonl", later=lambda p, r: 600.0, **kwargs)
    assert len(again) == len(priced) and len(read_answers(tmp_path / "priced.jsonl")) == len(priced)


def test_no_answer_batch_starts_that_would_end_more_than_half_its_cost_past_the_budget(tiny, tokenizer, tmp_path):
    """A batch costs what the last one did (its answers and their tracing): the next starts only while it would end
    less than half its cost past the budget, so the stage ends nearest the budget instead of up to a batch past it."""
    from pacer_hf.training.fit_data import _batches, generate_answers

    target, _ = tiny
    records = build_prompts(tokenizer, PROMPTS + [f"class Point{i}:\n" for i in range(12)])
    batches = _batches(records, 2)
    need = next(k for k in range(1, len(batches)) if len({p["heldout"] for b in batches[:k] for p in b}) == 2)
    spent = 100.0 * sum(map(len, batches[:need]))  # tracing priced at 100 s an answer; answering itself is quick
    half = 50.0 * len(batches[need - 1])
    kwargs = {"max_new_tokens": 4, "batch_size": 2, "do_sample": False, "progress": False, "later": lambda p, r: 100.0}
    stops = generate_answers(target, tokenizer, records, tmp_path / "a.jsonl", budget_s=spent + half - 10, **kwargs)
    assert len(stops) == sum(map(len, batches[:need]))
    goes_on = generate_answers(target, tokenizer, records, tmp_path / "b.jsonl", budget_s=spent + half + 10, **kwargs)
    assert len(goes_on) == sum(map(len, batches[:need + 1]))


def test_the_plan_gives_the_answers_what_tracing_calibration_and_the_speed_check_leave(tiny, tokenizer):
    """The time plan prices tracing and training per answer token and calibration from forwards timed on this pair: a
    target whose widest verify, step or prompt forward costs more leaves the answers less of the same budget, and the
    stages' estimates fill the mode's share but for the margin."""
    from pacer_hf.training import fit_setup

    target, draft = tiny
    records = build_prompts(tokenizer, PROMPTS)
    plan = fit_setup.FitPlan.measure(target, draft, records, budget_s=900.0, started=time.perf_counter(), modes=1,
                                     max_new_tokens=16, batch_size=None, device="cpu", max_draft_tokens=8)
    step, widest, draft_step = plan.forward_s
    assert step > 0 and widest > 0 and draft_step > 0 and plan.trace_s_per_token > 0 and plan.call_s > 0
    assert plan.trace_seconds([1] * 30, [2] * 10) == pytest.approx(40 * plan.trace_s_per_token)
    assert plan.train_step_s > 0  # training is priced per answer token: one round each at most, every epoch
    training = plan.after_answer([1] * 30, [2] * 10) - plan.trace_seconds([1] * 30, [2] * 10)
    assert training == pytest.approx(10 * (8 + 5) / 64 * plan.train_step_s)

    def answers(**changes) -> float:
        return fit_setup.FitPlan(**{**vars(plan), "started": time.perf_counter(), **changes}).answers_seconds()

    base = answers()
    assert answers(forward_s=(step, widest * 50, draft_step)) < base
    assert answers(step_s=plan.step_s * 50) < base
    assert answers(call_s=plan.call_s * 50) < base  # calibration's generate calls and timers fill caches
    fresh = fit_setup.FitPlan(**{**vars(plan), "started": time.perf_counter()})
    fresh.answers_seconds()
    assert fresh.planned["training setup"] == fit_setup.TRAIN_SETUP_S  # not a share: the rows are priced per answer
    assert sum(fresh.planned.values()) == pytest.approx(900.0 * (1 - fit_setup.MARGIN), rel=1e-3)
