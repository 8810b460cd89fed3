"""The demo-pair builder end to end at tiny sizes, its split, resumability, and the demo on its output."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from pacer_hf import demo, pairs
from pacer_hf._paths import hub_cards_dir
from pacer_hf.recipes import demo_pair

SHIPPED = hub_cards_dir()


def _small_corpus(root: Path, n: int = 120) -> Path:
    """A copy of the first n small stdlib files, so the tiny build stays fast."""
    src = demo_pair.stdlib_root()
    files = [f for f in demo_pair.corpus_files(src) if (src / f).stat().st_size < 12_000][:n]
    for rel in files:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(src / rel, root / rel)
    return root


@pytest.fixture(scope="module")
def tiny_build(tmp_path_factory):
    base = tmp_path_factory.mktemp("demo_pair")
    args = demo_pair.default_args(tiny=True, corpus_root=str(_small_corpus(base / "corpus")), work_dir=str(base / "work"),
                                  out=str(base / "out"), max_steps=3, eval_tokens=512, threads=1)
    assert demo_pair.run(args) == 0
    return args, base


def test_split_is_by_file_deterministic_and_disjoint():
    files = demo_pair.corpus_files(demo_pair.stdlib_root())
    splits = demo_pair.split_files(files)
    sets = {k: set(v) for k, v in splits.items()}
    assert not sets["train"] & sets["test"] and not sets["train"] & sets["validation"]
    assert not sets["validation"] & sets["test"]
    assert sets["train"] | sets["validation"] | sets["test"] == set(files)
    assert splits["test"] and splits["validation"]
    assert all(demo_pair.split_of(f) == "test" for f in splits["test"])
    assert not any("/test/" in f or f.startswith("test/") for f in files)


def test_tiny_build_exports_loadable_hub_folders(tiny_build):
    args, base = tiny_build
    out = Path(args.out)
    for role in ("target", "draft"):
        folder = out / f"demo-{role}"
        for name in (*pairs.REQUIRED_FILES, "README.md", demo_pair.SPLITS_FILE):
            assert (folder / name).is_file(), name
        assert (folder / "README.md").read_text().startswith("---\n")
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.float32)
        assert next(model.parameters()).dtype == torch.float32
    splits = json.loads((out / "demo-target" / demo_pair.SPLITS_FILE).read_text())
    assert not set(splits["train"]) & set(splits["test"])
    assert demo_pair.held_out_files(out / "demo-target") == splits["test"]
    report = json.loads((Path(args.work_dir) / "report.json").read_text())
    assert {"target", "draft", "target-base", "draft-ce"} <= set(report["losses"])
    assert report["decode_step_ms"]["c"] > 0
    grown = json.loads((out / "demo-target" / "config.json").read_text())
    assert grown["num_hidden_layers"] == demo_pair.Shape.parse(args.target).layers


def test_rerun_is_a_no_op_and_resumes_from_checkpoints(tiny_build):
    args, base = tiny_build
    work = Path(args.work_dir)
    before = {n: (work / n / "final" / "stage.json").read_text() for n in ("target-base", "draft", "target", "distill")}
    args.stage = "draft"
    demo_pair.run(args)
    assert (work / "draft" / "final" / "stage.json").read_text() == before["draft"]
    shutil.rmtree(work / "draft" / "final")  # as if interrupted after the last checkpoint
    demo_pair.run(args)
    record = json.loads((work / "draft" / "final" / "stage.json").read_text())
    assert record["resumed_from"] and record["complete"]
    assert record["steps_done"] == json.loads(before["draft"])["steps_done"]


def test_grow_deeper_preserves_the_function():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    shallow = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                           num_attention_heads=2, num_key_value_heads=2)).eval()
    deep = demo_pair.grow_deeper(shallow, 6).eval()
    x = torch.randint(0, 64, (1, 10))
    assert deep.config.num_hidden_layers == 6
    torch.testing.assert_close(deep(input_ids=x).logits, shallow(input_ids=x).logits)


def test_demo_runs_on_the_tiny_pair_and_outputs_match(tiny_build):
    args, _ = tiny_build
    target, draft, tok = pairs.load_demo_pair(args.out)
    pv, note = pairs.load_demo_preverifier(draft, args.out)
    assert note.startswith("pre-verifier:") and pv.config.loop_features, "the preverifier stage ships one"
    # the bench harness raises BenchmarkMismatch if any output differs from plain decoding
    result = demo.run_demo(target, draft, tok, pv, prompts=1, max_new_tokens=8, repeats=1, gammas=(2, 4))
    assert [r["strategy"] for r in result.records] == ["ar", "pacer", "sd-fixed-2", "sd-fixed-4", "hf-confidence"]
    assert all(r["identical_to_ar"] for r in result.records)
    summary = demo.format_summary(result.records)
    assert "HF dynamic (stock)" in summary and "sd-fixed-4 (pacer_hf loop)" in summary
    speed = {r["strategy"]: r["speedup_vs_ar"] for r in result.records}
    best = max(("sd-fixed-2", "sd-fixed-4"), key=speed.get)
    assert demo.format_verdict(result.records) == (
        f"Pacer: {speed['pacer']:.2f}x the target alone, {speed['pacer'] / speed[best]:.2f}x the best fixed length "
        f"({best}), {speed['pacer'] / speed['hf-confidence']:.2f}x HF's dynamic schedule (hf-confidence)")


def test_onpolicy_stage_fits_measures_and_ships_the_draft(tiny_build):
    """The onpolicy stage: the target's answers (greedy and T = 1) from TRAIN-split prompts, the fitted draft with
    its before/after measurements and card, and the preverifier stage's traces and shipped pre-verifier."""
    from pacer_hf.recipes.smollm2_draft_train import read_records

    args, _ = tiny_build
    work = Path(args.work_dir) / "onpolicy"
    greedy, sampled = read_records(work / "responses.jsonl"), read_records(work / "responses_sampled.jsonl")
    assert greedy and sampled and all(r["response"] and len(r["top_logp"]) == len(r["response"]) for r in greedy)
    train = set(json.loads((Path(args.work_dir) / demo_pair.SPLITS_FILE).read_text())["train"])
    for record in greedy:  # windows, docstrings and tables of TRAIN files, or test suites outside the benchmark
        category, _, name = record["key"].partition("/")
        if category == "window":
            assert name.rsplit("@", 1)[0] in train
    report = json.loads((work / "report.json").read_text())
    for when in ("before", "after"):
        assert 0.0 <= report[when]["agreement_greedy_path"] <= 1.0 and report[when]["c"] > 0
        assert report[when]["rounds_at_cap"]["cap"] == 8
    card = (Path(args.out) / "demo-draft" / "README.md").read_text()
    assert "Fitted to its target" in card and f"{report['after']['agreement_greedy_path']:.3f}" in card
    shipped = json.loads((Path(args.out) / "demo-preverifier" / "config.json").read_text())
    assert shipped["loop_features"] and shipped["calibration"]["chosen"] and shipped["decoding"] == "greedy"
    sampling = json.loads((Path(args.out) / "demo-preverifier-sampling" / "config.json").read_text())
    assert sampling["decoding"] == "sampling" and sampling["calibration"]["chosen"] and not sampling["loop_features"]
    manifest = json.loads((work / "traces-sampled-train" / "manifest.json").read_text())
    assert manifest["label_kind"] == "sampling" and manifest["complete"]


def test_missing_or_corrupted_pair_says_how_to_rebuild(tiny_build, tmp_path):
    args, _ = tiny_build
    with pytest.raises(pairs.DemoPairMissing, match="build-demo-pair"):
        pairs.load_demo_pair(tmp_path / "nowhere")
    broken = tmp_path / "broken"
    shutil.copytree(args.out, broken)
    (broken / "demo-draft" / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(pairs.DemoPairMissing, match="build-demo-pair"):
        pairs.load_demo_pair(broken)


@pytest.mark.skipif(not (SHIPPED / "demo-target" / "model.safetensors").exists(), reason="shipped pair not built")
def test_demo_on_the_shipped_pair():
    target, draft, tok = pairs.load_demo_pair(SHIPPED)
    pv, _ = pairs.load_demo_preverifier(draft, SHIPPED)
    result = demo.run_demo(target, draft, tok, pv, prompts=1, max_new_tokens=12, repeats=1, gammas=(4,))
    assert len(result.records) == 4 and all(r["identical_to_ar"] for r in result.records)
    assert all(r["tokens_per_s"] > 0 for r in result.records)
    assert demo_pair.held_out_files(SHIPPED / "demo-target")
