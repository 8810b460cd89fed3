"""Build the default pre-verifier (`hub_cards/default-preverifier`, its `sampling/` twin) from the rounds
`default_preverifier_data.py` collects.

    OMP_NUM_THREADS=1 python -m pacer_hf.recipes.default_preverifier_data --work-dir runs/default_pv
    OMP_NUM_THREADS=1 python -m pacer_hf.recipes.default_preverifier --work-dir runs/default_pv

It reads what every draft gives: the draft's distribution features at each drafted token
(`modeling_pacer.draft_features`) and the loop's state when the round starts (`modeling_pacer.loop_features`),
no hidden states (`input_mode="features"`, no `draft_signature`), so any draft of any hidden size or vocabulary
takes it; it decides with the expected-gain rule under the round costs `generate` measures where it runs. One is
trained per decoding mode with `transformers.Trainer` (`training.train.PacerTrainer`, the project's train path)
on the rounds of the training pairs, each pair capped at `--rows-per-pair` rounds drawn at random so no pair's
acceptance shape dominates; AUC and ECE are reported on every held-out pair (never seen in training), and on the
demo pair beside the demo draft's own pre-verifier on the same rounds. `config.calibration` records costs
measured here on a training pair: a prior used only with `pacer_costs="prior"`.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import shutil
import time
from pathlib import Path

import numpy as np
import torch

from .default_preverifier_data import MAX_DRAFT_TOKENS, PAIRS

TRAIN_PAIRS = ("demo-int8", "demo-drop", "smollm2-int8", "smollm2-drop", "qwen")
HELDOUT_PAIRS = ("demo", "demo-drop10", "qwen-int8")
MODES = ("greedy", "sampling")
SAMPLING_SUBDIR = "sampling"


class FeatureRounds(torch.utils.data.Dataset):
    """Rounds as the default pre-verifier reads them: draft-distribution features, loop state, labels. The
    hidden-state column the collator and `predict_probs` expect is a (rounds, L, 1) zero tensor (the model has
    no hidden-state input, so it reads none of it)."""

    def __init__(self, features: np.ndarray, loop: np.ndarray, labels: np.ndarray):
        self.columns = {
            "draft_hidden_states": torch.zeros(len(labels), labels.shape[1], 1, dtype=torch.float16),
            "draft_features": torch.as_tensor(features).float(),
            "labels": torch.as_tensor(labels).float(),
            "loop_features": torch.as_tensor(loop).float(),
        }

    def __len__(self) -> int:
        return len(self.columns["labels"])

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {name: column[index] for name, column in self.columns.items()}


def read_rounds(path: Path, max_rows: int | None = None, seed: int = 0) -> dict[str, np.ndarray]:
    """Features, loop state and labels of a traces folder (hidden states are not read), at most `max_rows`
    rounds drawn at random (fixed seed); rounds with no defined label are dropped."""
    from ..training.traces import load_traces

    data = load_traces(path).with_format("numpy", columns=["draft_features", "loop_features", "labels", "text_id"])
    out = {"features": np.stack(data["draft_features"]).astype(np.float32),
           "loop": np.stack(data["loop_features"]).astype(np.float32),
           "labels": np.stack(data["labels"]).astype(np.float32), "text_id": np.asarray(data["text_id"])}
    keep = np.flatnonzero((out["labels"] >= 0).any(1))
    if max_rows is not None and len(keep) > max_rows:
        keep = np.sort(np.random.default_rng(seed).choice(keep, max_rows, replace=False))
    return {k: v[keep] for k, v in out.items()}


def to_dataset(parts: list[dict[str, np.ndarray]]) -> FeatureRounds:
    return FeatureRounds(*(np.concatenate([p[k] for p in parts]) for k in ("features", "loop", "labels")))


def build_config(decoding: str, calibration: dict, **overrides):
    from ..configuration_pacer import PacerConfig

    return PacerConfig(draft_hidden_size=1, hidden_size=64, num_attention_heads=4, intermediate_size=128,
                       max_draft_tokens=MAX_DRAFT_TOKENS, block_size=1, decision_rule="expected_gain",
                       input_mode="features", loop_features=True, draft_signature=None, decoding=decoding,
                       draft_model="any draft (pacer_hf's default pre-verifier)", target_model="any target",
                       calibration=calibration, online_calibration=True, **overrides)


def prior_costs(threads: int, repeats: int = 15) -> dict:
    """Round costs of a training pair (the demo target drafted by its 6-layer copy) measured here: the prior that
    `config.calibration` records. generate measures its own (`pacer_costs="measure"`, the default)."""
    from ..loops.probes import measure_costs
    from ..pairs import load_pair
    from ..training.calibrate import measure_loop_costs
    from .default_preverifier_data import make_draft

    torch.set_num_threads(threads)
    pair = load_pair("stdlib")
    draft = make_draft("demo-drop", pair.target, pair.draft)
    costs = measure_costs(pair.target, draft, None, max_k=MAX_DRAFT_TOKENS, repeats=repeats)
    costs = measure_loop_costs(pair.target, draft, costs)
    calibration = costs.as_calibration()
    calibration.update({
        "costs": "prior only (used with pacer_costs='prior'): the demo target drafted by its 6-layer copy, "
                 f"context 128, {repeats} interleaved repeats, loop costs measured inside generate; generate "
                 "measures the pair it runs (probe + online refit)",
        "draft_model": "demo-drop (recipes/default_preverifier_data.py)", "target_model": "hub_cards/demo-target",
        "machine": platform.machine(), "processor": platform.processor() or None, "torch_threads": threads,
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
    return calibration


def evaluate(model, rounds: dict[str, np.ndarray]) -> dict:
    from ..training.train import auc_ece, predict_probs

    probs, labels = predict_probs(model, to_dataset([rounds]))
    auc, ece = auc_ece(probs, labels)
    valid = labels >= 0
    first = labels[:, 0] >= 0
    return {"auc": round(auc, 4), "ece": round(ece, 4), "rounds": int(len(labels)), "tokens": int(valid.sum()),
            "accept_rate": round(float(labels[valid].mean()), 4),
            "first_token_accept": round(float(labels[first, 0].mean()), 4),
            "mean_predicted": round(float(probs[valid].mean()), 4)}


def own_preverifier_metrics(traces: Path) -> dict | None:
    """AUC/ECE of the demo draft's own pre-verifier (hidden states + features + loop state) on the held-out demo
    rounds (its first `max_draft_tokens` tokens, as the replays score a shorter horizon), for comparison."""
    from .._paths import hub_cards_dir
    from ..generation import load_preverifier
    from ..training.traces import load_traces
    from ..training.train import auc_ece, predict_probs, prepare

    mode = json.loads((traces / "manifest.json").read_text()).get("label_kind")
    folder = hub_cards_dir() / ("demo-preverifier-sampling" if mode == "sampling" else "demo-preverifier")
    if not (folder / "config.json").is_file():
        return None
    own = load_preverifier(folder).eval()
    steps = own.config.max_draft_tokens
    data = prepare(load_traces(traces))
    for name in ("draft_hidden_states", "draft_features", "labels"):
        data.columns[name] = data.columns[name][:, :steps]
    keep = (data.columns["labels"] >= 0).any(1)
    for name in list(data.columns):
        data.columns[name] = data.columns[name][keep]
    probs, labels = predict_probs(own, data)
    auc, ece = auc_ece(probs, labels)
    return {"preverifier": f"hub_cards/{folder.name}", "tokens_scored": steps, "auc": round(auc, 4),
            "ece": round(ece, 4)}


def train_mode(args: argparse.Namespace, mode: str, calibration: dict, out: Path) -> dict:
    from transformers import TrainingArguments, set_seed

    from ..modeling_pacer import PacerPreVerifier
    from ..training.train import PacerTrainer, TraceCollator

    traces = Path(args.work_dir) / "traces"
    train_parts = {p: read_rounds(traces / f"{p}-{mode}", args.rows_per_pair, args.seed) for p in args.train_pairs}
    heldout = {p: read_rounds(traces / f"{p}-{mode}") for p in args.heldout_pairs}
    # early evaluation: a tenth of every training pair's texts (whole answers) held back from the Trainer
    fit, check = [], []
    for rounds in train_parts.values():
        texts = np.unique(rounds["text_id"])
        held = np.random.default_rng(args.seed).permutation(texts)[: max(1, len(texts) // 10)]
        mask = np.isin(rounds["text_id"], held)
        fit.append({k: v[~mask] for k, v in rounds.items()})
        check.append({k: v[mask] for k, v in rounds.items()})
    train_set, eval_set = to_dataset(fit), to_dataset(check)
    set_seed(args.seed)
    model = PacerPreVerifier(build_config(mode, calibration))
    steps = math.ceil(len(train_set) / args.batch_size)
    training_args = TrainingArguments(
        output_dir=str(Path(args.work_dir) / f"trainer-{mode}"), per_device_train_batch_size=args.batch_size,
        per_device_eval_batch_size=512, num_train_epochs=args.epochs, learning_rate=args.lr, weight_decay=0.01,
        lr_scheduler_type="cosine", warmup_steps=max(1, int(0.05 * steps * args.epochs)),
        logging_steps=max(1, steps // 2), eval_strategy="epoch", save_strategy="no", report_to=[],
        remove_unused_columns=False, seed=args.seed, data_seed=args.seed, dataloader_num_workers=0,
        use_cpu=True, disable_tqdm=False)
    trainer = PacerTrainer(model=model, args=training_args, train_dataset=train_set, eval_dataset=eval_set,
                           data_collator=TraceCollator())
    started = time.perf_counter()
    trainer.train()
    model.eval()
    report = {
        "train_rounds": {p: int(len(r["labels"])) for p, r in zip(train_parts, fit)},
        "train_seconds": round(time.perf_counter() - started, 1),
        "train_pairs_texts_held_back": evaluate(model, {k: np.concatenate([c[k] for c in check]) for k in check[0]}),
        "heldout_pairs": {p: evaluate(model, r) for p, r in heldout.items()},
    }
    if "demo" in heldout:
        report["demo_own_preverifier"] = own_preverifier_metrics(traces / f"demo-{mode}")
    model.config.training = {
        "recipe": "pacer_hf/recipes/default_preverifier.py", "decoding": mode,
        "train_pairs": {p: describe(p) for p in args.train_pairs},
        "heldout_pairs": {p: describe(p) for p in args.heldout_pairs},
        "rows_per_pair": args.rows_per_pair, "epochs": args.epochs, "lr": args.lr, "batch_size": args.batch_size,
        "seed": args.seed, "loss": "bce", "metrics": report,
    }
    tmp = out.with_name(out.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    model.save_pretrained(tmp)
    PacerPreVerifier.from_pretrained(tmp)  # loads before it replaces anything
    if out.exists():
        for name in ("config.json", "model.safetensors", "configuration_pacer.py", "modeling_pacer.py"):
            (out / name).unlink(missing_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    for item in tmp.iterdir():
        shutil.move(str(item), out / item.name)
    tmp.rmdir()
    print(json.dumps(report, indent=1), flush=True)
    return report


def describe(pair: str) -> str:
    target, lever, argument = PAIRS[pair]
    shipped = {"demo": "its shipped 1-layer draft (hub_cards/demo-draft)",
               "qwen": "Qwen2.5-Coder-0.5B-Instruct in float32, as its GGUF ships it"}.get(target)
    target = {"demo": "the stdlib demo target (hub_cards/demo-target)", "smollm2": "SmolLM2-135M-Instruct",
              "qwen": "Qwen2.5-Coder-1.5B-Instruct"}[target]
    draft = {"shipped": shipped,
             "cheap": "Qwen2.5-Coder-0.5B-Instruct made cheap as hub_cards/qwen-coder-draft says (int8 linears, "
                      "a vocabulary-subset head)",
             "int8": "an int8 copy of itself (cheap_draft.quantize_linears)",
             "drop": f"a copy keeping {len(argument or ())} of its layers ({list(argument or ())}), untrained"}[lever]
    return f"{target} drafted by {draft}"


def run(args: argparse.Namespace) -> int:
    from .._paths import hub_cards_dir

    torch.set_num_threads(args.threads)
    out = Path(args.out) if args.out else hub_cards_dir() / "default-preverifier"
    calibration = prior_costs(args.threads)
    reports = {}
    for mode in args.modes:
        reports[mode] = train_mode(args, mode, calibration, out if mode == "greedy" else out / SAMPLING_SUBDIR)
    (Path(args.work_dir) / "default_preverifier_report.json").write_text(json.dumps(reports, indent=1))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work-dir", default="runs/default_pv")
    parser.add_argument("--out", default=None, help="default: hub_cards/default-preverifier")
    parser.add_argument("--train-pairs", nargs="+", default=list(TRAIN_PAIRS), choices=list(PAIRS))
    parser.add_argument("--heldout-pairs", nargs="+", default=list(HELDOUT_PAIRS), choices=list(PAIRS))
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    parser.add_argument("--rows-per-pair", type=int, default=12000)
    parser.add_argument("--epochs", type=float, default=6.0)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if set(args.train_pairs) & set(args.heldout_pairs):
        parser.error(f"pairs both trained on and held out: {sorted(set(args.train_pairs) & set(args.heldout_pairs))}")
    return run(args)


if __name__ == "__main__":
    raise SystemExit(main())
