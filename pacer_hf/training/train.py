"""Train or fine-tune a Pacer pre-verifier on collected traces with `transformers.Trainer`.

Works unchanged under `accelerate launch --cpu --num_processes 2 -m pacer_hf.cli train ...` (data
parallel; `--batch-size` is the global batch, split across processes). Evaluation reports AUC,
expected calibration error and the simulated speedup on held-out traces (see `simulate`).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import datasets
import numpy as np
import torch
import torch.nn.functional as F
from transformers import Trainer, TrainingArguments, set_seed

from ..configuration_pacer import PacerConfig
from ..costs import CostModel
from ..modeling_pacer import PacerPreVerifier
from .common import cli_errors
from .simulate import THRESHOLDS, acceptance_matrix, pacer_lengths, speedup, speedup_table
from .traces import load_traces, read_manifest

INPUT_COLUMNS = ("draft_hidden_states", "draft_features")


class TraceCollator:
    """Pads rounds of different lengths to the longest in the batch (labels padded with -100)."""

    def __call__(self, rows: list[dict]) -> dict[str, torch.Tensor]:
        length = max(len(row["labels"]) for row in rows)
        batch = {}
        if "loop_features" in rows[0]:  # one vector per round, no padding
            batch["loop_features"] = torch.stack([torch.as_tensor(row["loop_features"]).float() for row in rows])
        for name, fill in (("draft_hidden_states", 0.0), ("draft_features", 0.0), ("labels", -100.0)):
            items = [torch.as_tensor(row[name]).float() for row in rows]
            if all(item.shape[0] == length for item in items):
                batch[name] = torch.stack(items)
                continue
            shape = (len(rows), length, *items[0].shape[1:])
            padded = torch.full(shape, fill, dtype=torch.float32)
            for i, item in enumerate(items):
                padded[i, : item.shape[0]] = item
            batch[name] = padded
        return batch


class TraceTensors(torch.utils.data.Dataset):
    """Traces held in memory as tensors (hidden states stay float16): row access without Arrow decoding,
    which otherwise dominates training time for a model this small."""

    def __init__(self, dataset, label_column: str = "labels"):
        loop = ["loop_features"] if "loop_features" in dataset.column_names else []
        data = dataset.with_format("numpy", columns=[*INPUT_COLUMNS, *loop, label_column])
        self.columns = {
            "draft_hidden_states": torch.as_tensor(np.stack(data["draft_hidden_states"])),
            "draft_features": torch.as_tensor(np.stack(data["draft_features"])).float(),
            "labels": torch.as_tensor(np.stack(data[label_column])).float(),
        }
        if loop:  # the loop's state when each round started (collect_along_answers)
            self.columns["loop_features"] = torch.as_tensor(np.stack(data["loop_features"])).float()

    def __len__(self) -> int:
        return len(self.columns["labels"])

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {name: column[index] for name, column in self.columns.items()}


def prepare(dataset: datasets.Dataset, label_column: str = "labels") -> TraceTensors:
    """The model's columns only, in memory as tensors; `label_column` becomes `labels`."""
    if label_column not in dataset.column_names:
        raise ValueError(f"label_column={label_column!r} is not in the traces ({dataset.column_names}).")
    return TraceTensors(dataset, label_column)


def split_by_text(dataset: datasets.Dataset, eval_fraction: float, seed: int = 0) -> tuple[datasets.Dataset, datasets.Dataset]:
    """Hold out whole texts (not positions), so no evaluation prefix was seen in training."""
    if not 0 < eval_fraction < 1:
        raise ValueError(f"eval_fraction={eval_fraction} must lie in (0, 1); or pass eval data explicitly.")
    texts = np.unique(np.asarray(dataset["text_id"]))
    rng = np.random.default_rng(seed)
    held = set(rng.permutation(texts)[: max(1, int(round(len(texts) * eval_fraction)))].tolist())
    text_ids = np.asarray(dataset["text_id"])
    eval_idx = np.flatnonzero(np.isin(text_ids, list(held)))
    train_idx = np.flatnonzero(~np.isin(text_ids, list(held)))
    if len(train_idx) == 0:
        raise ValueError("Holding out texts left no training rows: collect from more texts or lower eval_fraction.")
    return dataset.select(train_idx), dataset.select(eval_idx)


def weighted_auc(scores: np.ndarray, positive: np.ndarray, negative: np.ndarray) -> float:
    """ROC AUC where each item counts `positive[i]` times as a positive and `negative[i]` as a negative
    (ties count one half); NaN when either class is empty. No scikit-learn needed."""
    total_pos, total_neg = positive.sum(), negative.sum()
    if total_pos <= 0 or total_neg <= 0:
        return float("nan")
    order = np.argsort(scores, kind="mergesort")
    values = scores[order]
    starts = np.flatnonzero(np.r_[True, values[1:] != values[:-1]])
    pos = np.add.reduceat(positive[order], starts)
    neg = np.add.reduceat(negative[order], starts)
    below = np.cumsum(neg) - neg
    return float((pos * (below + 0.5 * neg)).sum() / (total_pos * total_neg))


def auc_ece(probs: np.ndarray, labels: np.ndarray, bins: int = 15) -> tuple[float, float]:
    """ROC AUC and expected calibration error over valid tokens; soft labels count as weighted 1s and 0s."""
    valid = labels >= 0
    p, y = probs[valid].astype(np.float64), labels[valid].astype(np.float64)
    if len(p) == 0:
        return float("nan"), float("nan")
    auc = weighted_auc(p, y, 1 - y)
    edges = np.minimum((p * bins).astype(int), bins - 1)
    ece = sum(abs(p[edges == b].mean() - y[edges == b].mean()) * (edges == b).sum()
              for b in range(bins) if (edges == b).any()) / len(p)
    return float(auc), float(ece)


def cost_model_from(config: PacerConfig, default_ratio: float = 0.1) -> CostModel:
    """Costs recorded by `pacer-hf calibrate` in the config, else a default ratio (marked as assumed)."""
    cal = config.calibration or {}
    if cal.get("verify_cost"):
        return CostModel.from_calibration(cal)
    return CostModel(draft_cost=config.cost_ratio or default_ratio)


def evaluation_metrics(probs: np.ndarray, labels: np.ndarray, config: PacerConfig, costs: CostModel) -> dict:
    """AUC, ECE, simulated speedup at the config's setting, at the best threshold, best fixed gamma, oracle."""
    auc, ece = auc_ece(probs, labels)
    acc = acceptance_matrix(labels)
    table = speedup_table(acc, probs, costs, config.block_size, config.threshold, config.decision_rule,
                          max_gamma=min(8, acc.shape[1]))
    best_fixed = max(v for k, v in table.items() if k.startswith("fixed-"))
    tuned = table["pacer"]  # expected_gain has no threshold to tune
    for t in () if config.decision_rule == "expected_gain" else THRESHOLDS:
        lengths = pacer_lengths(probs, config.block_size, t, config.decision_rule, costs=costs)
        tuned = max(tuned, speedup(acc, lengths, costs, preverifier=True))
    valid = labels >= 0
    return {"auc": auc, "ece": ece, "accept_rate": float(labels[valid].mean()),
            "sim_speedup": table["pacer"], "sim_speedup_tuned": tuned, "sim_best_fixed": best_fixed,
            "sim_oracle": table["oracle"]}


class PacerTrainer(Trainer):
    """Trainer whose loss is the model's weighted BCE, or a focal loss (`loss_type="focal"`)."""

    def __init__(self, *args, loss_type: str = "bce", focal_gamma: float = 2.0, **kwargs):
        if loss_type not in ("bce", "focal"):
            raise ValueError(f"loss_type={loss_type!r} must be 'bce' or 'focal'.")
        super().__init__(*args, **kwargs)
        self.loss_type, self.focal_gamma = loss_type, focal_gamma

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if self.loss_type == "bce":
            outputs = model(**inputs)
            return (outputs.loss, outputs) if return_outputs else outputs.loss
        labels = inputs.pop("labels")
        outputs = model(**inputs)
        logits = outputs.logits
        mask = (labels >= 0).to(logits.dtype)
        y = labels.clamp(0, 1).to(logits.dtype)
        p = torch.sigmoid(logits)
        bce = F.binary_cross_entropy_with_logits(logits, y, reduction="none")
        p_true = y * p + (1 - y) * (1 - p)
        reject_weight = getattr(model, "module", model).config.reject_weight
        weight = (y + (1 - y) * reject_weight) * mask
        loss = ((1 - p_true) ** self.focal_gamma * bce * weight).sum() / weight.sum().clamp_min(1e-8)
        outputs.loss = loss
        return (loss, outputs) if return_outputs else loss


def build_preverifier(manifest: dict, init_from: str | None = None, **overrides) -> PacerPreVerifier:
    """A fresh pre-verifier for the traces' draft, or `init_from` after checking it was made for that draft."""
    steps = manifest["config"]["max_draft_tokens"]
    if init_from is None:
        loop = overrides.pop("loop_features", None)  # None: read the loop's state when the traces recorded it
        config = PacerConfig(draft_hidden_size=manifest["draft_hidden_size"], draft_model=manifest["draft_model"],
                             target_model=manifest["target_model"], draft_signature=manifest["draft_signature"],
                             max_draft_tokens=max(steps, overrides.pop("max_draft_tokens", None) or steps),
                             loop_features=manifest.get("loop_features", False) if loop is None else loop,
                             decoding=overrides.pop("decoding", None) or manifest.get("label_kind"), **overrides)
        return PacerPreVerifier(config)
    from ..generation import load_preverifier

    model = load_preverifier(init_from)
    config = model.config
    recorded, actual = config.draft_signature or {}, manifest["draft_signature"]
    mismatch = {k: (recorded.get(k), v) for k, v in actual.items() if recorded.get(k) not in (None, v)}
    if config.draft_hidden_size != manifest["draft_hidden_size"] or mismatch:
        raise ValueError(
            f"--init-from {init_from!r} was trained for draft {config.draft_model!r} {recorded}, but these traces "
            f"come from draft {manifest['draft_model']!r} {actual}. Fine-tune only a pre-verifier of the same draft, "
            "or train from scratch (omit --init-from)."
        )
    if config.max_draft_tokens < steps:
        raise ValueError(f"--init-from {init_from!r} handles {config.max_draft_tokens} drafted tokens, the traces "
                         f"have {steps}; collect with --max-draft-tokens {config.max_draft_tokens}.")
    for key, value in overrides.items():
        if key in ("block_size", "threshold", "decision_rule", "reject_weight") and value is not None:
            setattr(config, key, value)
    config.target_model = manifest["target_model"]
    return model


@torch.no_grad()
def predict_probs(model: PacerPreVerifier, dataset: TraceTensors, batch_size: int = 256) -> tuple[np.ndarray, np.ndarray]:
    """Per-token predicted acceptance `(N, L)` and labels for prepared traces (one forward per round:
    the layer is causal, so token i's prediction equals the one generation computes after token i)."""
    model.eval()
    columns = dataset.columns
    probs = []
    for start in range(0, len(dataset), batch_size):
        hidden = columns["draft_hidden_states"][start:start + batch_size].to(model.device)
        loop = columns.get("loop_features")
        loop = loop[start:start + batch_size].to(model.device) if loop is not None and model.loop_proj is not None else None
        logits = model(hidden, columns["draft_features"][start:start + batch_size].to(model.device),
                       loop_features=loop).logits
        probs.append(torch.sigmoid(logits.float()).cpu().numpy())
    return np.concatenate(probs), columns["labels"].numpy()


def load_collections(paths: str | Path | list[str | Path]) -> tuple[dict, datasets.Dataset]:
    """The first collection's manifest and the rows of every collection, for one training set.

    Collections must come from the same draft; text ids are offset per collection so that holding out
    texts (`split_by_text`) never mixes two collections' texts."""
    paths = paths if isinstance(paths, list) else [paths]
    manifest, parts, offset = read_manifest(paths[0]), [], 0
    for path in paths:
        if read_manifest(path)["draft_signature"] != manifest["draft_signature"]:
            raise ValueError(f"{str(path)!r} was collected with another draft than {str(paths[0])!r}; train on "
                             "collections of one draft.")
        traces = load_traces(path)
        if offset:
            traces = traces.map(lambda row, shift=offset: {"text_id": row["text_id"] + shift})
        offset += max(traces["text_id"]) + 1
        parts.append(traces)
    return manifest, datasets.concatenate_datasets(parts) if len(parts) > 1 else parts[0]


def train_preverifier(
    train_data: str | Path | list[str | Path],
    output_dir: str | Path,
    *,
    eval_data: str | Path | None = None,
    eval_fraction: float = 0.1,
    init_from: str | None = None,
    label_column: str = "labels",
    loss_type: str = "bce",
    focal_gamma: float = 2.0,
    epochs: float = 3.0,
    learning_rate: float = 1e-3,
    batch_size: int = 64,
    weight_decay: float = 0.01,
    seed: int = 0,
    max_train_rows: int | None = None,
    cost_ratio: float = 0.1,
    progress: bool = True,
    **config_overrides,
) -> tuple[PacerPreVerifier, dict]:
    """Train (or fine-tune `init_from`) on traces from `pacer-hf collect`; save to `output_dir`.

    Returns the model and the evaluation metrics (also written to `output_dir/train_results.json`).
    `batch_size` is the global batch: under data parallelism each process takes its share.
    """
    manifest, traces = load_collections(train_data)
    if eval_data is not None:
        eval_manifest = read_manifest(eval_data)
        if eval_manifest["draft_signature"] != manifest["draft_signature"]:
            raise ValueError(f"eval_data={str(eval_data)!r} was collected with another draft than {str(train_data)!r}.")
        train_rows, eval_rows = traces, load_traces(eval_data)
    else:
        train_rows, eval_rows = split_by_text(traces, eval_fraction, seed)
    if max_train_rows:
        train_rows = train_rows.select(range(min(max_train_rows, len(train_rows))))
    set_seed(seed)
    config_overrides = {k: v for k, v in config_overrides.items() if v is not None}
    model = build_preverifier(manifest, init_from, **config_overrides)
    if model.config.cost_ratio is None:
        model.config.cost_ratio = cost_ratio
    train_set, eval_set = prepare(train_rows, label_column), prepare(eval_rows, "labels")
    costs = cost_model_from(model.config, cost_ratio)

    def compute_metrics(prediction) -> dict:
        logits = prediction.predictions[0] if isinstance(prediction.predictions, tuple) else prediction.predictions
        probs = 1.0 / (1.0 + np.exp(-np.asarray(logits, dtype=np.float64)))
        return evaluation_metrics(probs, np.asarray(prediction.label_ids), model.config, costs)

    world = max(1, int(__import__("os").environ.get("WORLD_SIZE", "1")))
    if batch_size % world:
        raise ValueError(f"batch_size={batch_size} must be divisible by the number of processes ({world}).")
    steps_per_epoch = math.ceil(len(train_set) / batch_size)
    args = TrainingArguments(
        output_dir=str(output_dir), per_device_train_batch_size=batch_size // world,
        per_device_eval_batch_size=256, num_train_epochs=epochs, learning_rate=learning_rate,
        weight_decay=weight_decay, lr_scheduler_type="cosine", warmup_steps=max(1, int(0.05 * steps_per_epoch * epochs)),
        logging_steps=max(1, steps_per_epoch // 4), eval_strategy="epoch", save_strategy="no", report_to=[],
        remove_unused_columns=False, seed=seed, data_seed=seed, dataloader_num_workers=0, disable_tqdm=not progress,
        use_cpu=not torch.cuda.is_available(), ddp_find_unused_parameters=False,
    )
    trainer = PacerTrainer(model=model, args=args, train_dataset=train_set, eval_dataset=eval_set,
                           data_collator=TraceCollator(), compute_metrics=compute_metrics,
                           loss_type=loss_type, focal_gamma=focal_gamma)
    trainer.train()
    metrics = trainer.evaluate()
    metrics = {k.removeprefix("eval_"): v for k, v in metrics.items()}
    metrics["world_size"] = trainer.args.world_size
    sources = [str(path) for path in (train_data if isinstance(train_data, list) else [train_data])]
    model.config.training = {"train_data": sources[0] if len(sources) == 1 else sources,
                             "eval_data": str(eval_data) if eval_data else None,
                             "eval_fraction": None if eval_data else eval_fraction, "loss": loss_type,
                             "label_column": label_column, "epochs": epochs, "train_rows": len(train_set),
                             "eval_rows": len(eval_set), "metrics": {k: metrics[k] for k in ("auc", "ece")}}
    if trainer.is_world_process_zero():
        trainer.save_model(str(output_dir))
        (Path(output_dir) / "train_results.json").write_text(json.dumps(metrics, indent=2))
    return model, metrics


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data", required=True, nargs="+",
                        help="traces folder(s) written by `pacer-hf collect` (several: one training set)")
    parser.add_argument("--eval-data", help="held-out traces folder (default: hold out --eval-fraction of texts)")
    parser.add_argument("--eval-fraction", type=float, default=0.1)
    parser.add_argument("--out", required=True, help="folder for the trained pre-verifier")
    parser.add_argument("--init-from", help="fine-tune this pre-verifier (folder or Hub id) instead of a fresh one")
    parser.add_argument("--label-column", default="labels", help="labels (masked after a rejection) or labels_unmasked")
    parser.add_argument("--loss", default="bce", choices=("bce", "focal"))
    parser.add_argument("--focal-gamma", type=float, default=2.0)
    parser.add_argument("--reject-weight", type=float, help="loss weight of the reject class (default 1)")
    parser.add_argument("--input-mode", choices=("both", "hidden", "features"))
    parser.add_argument("--hidden-size", type=int)
    parser.add_argument("--block-size", type=int)
    parser.add_argument("--threshold", type=float)
    parser.add_argument("--decision-rule", choices=("block", "cumulative"))
    parser.add_argument("--no-loop-features", action="store_true",
                        help="ignore the loop's state recorded with the traces (`collect_along_answers`): the ablation")
    parser.add_argument("--epochs", type=float, default=3.0)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--batch-size", type=int, default=64, help="global batch (split across processes)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-train-rows", type=int)
    parser.add_argument("--cost-ratio", type=float, default=0.1,
                        help="assumed t(draft)/t(target) for the simulated speedup until `calibrate` measures it")


@cli_errors("train")
def run(args: argparse.Namespace) -> int:
    overrides = {"reject_weight": args.reject_weight, "input_mode": args.input_mode, "hidden_size": args.hidden_size,
                 "block_size": args.block_size, "threshold": args.threshold, "decision_rule": args.decision_rule,
                 "loop_features": False if args.no_loop_features else None}
    if args.init_from and (args.input_mode or args.hidden_size):
        raise ValueError("--input-mode/--hidden-size define a new architecture; they cannot be used with --init-from.")
    _, metrics = train_preverifier(
        args.data, args.out, eval_data=args.eval_data, eval_fraction=args.eval_fraction, init_from=args.init_from,
        label_column=args.label_column, loss_type=args.loss, focal_gamma=args.focal_gamma, epochs=args.epochs,
        learning_rate=args.lr, batch_size=args.batch_size, seed=args.seed, max_train_rows=args.max_train_rows,
        cost_ratio=args.cost_ratio, **overrides)
    if int(__import__("os").environ.get("RANK", "0")) == 0:
        print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in metrics.items()}, indent=2))
        print(f"saved to {args.out}")
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        # leave the process group together: a rank exiting with its gloo threads alive can abort ("terminate
        # called without an active exception") while rank 0 is still saving
        dist.barrier()
        dist.destroy_process_group()
    return 0
