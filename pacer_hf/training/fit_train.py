"""`fit_preverifier`'s training stage: `transformers.Trainer` with checkpoints and a wall-clock limit.

`train_preverifier` (the `pacer-hf train` command) trains to the end in one go; a fit runs under a budget and may be
interrupted, so here the Trainer saves a checkpoint every `checkpoint_every` optimizer steps (and when the time is up)
and a rerun resumes from the last one (`resume_from_checkpoint`), optimizer and schedule included.

A fit prepares three candidates (`train_candidates`): one trained from scratch on the pair's draft hidden states,
the default pre-verifier fine-tuned on the pair's rounds, and the default as it is; calibration keeps the one whose
rule runs fastest on held-out rounds (`fit_calibrate.calibrate_here`). A few thousand rounds are often too few for
the first to beat what the default learned from several pairs, and a better held-out log-loss does not always make
a faster rule (the rule pays for rounds that stop short), so the choice is the simulated speed itself.
"""

from __future__ import annotations

import copy
import json
import math
import time
from pathlib import Path

import numpy as np
import torch
from transformers import PrinterCallback, TrainerCallback, TrainingArguments, set_seed
from transformers.trainer_utils import get_last_checkpoint

from ..modeling_pacer import PacerPreVerifier
from .traces import load_traces, read_manifest
from .train import PacerTrainer, TraceCollator, auc_ece, build_preverifier, predict_probs, prepare

FINE_TUNE_LEARNING_RATE = 3e-4  # a tenth of a fresh start's would barely move it; 1e-3 forgets more
FINE_TUNE_EPOCHS = 5.0
FRESH_EPOCHS = 8.0  # the most a fresh start trains; fewer when its time share is short (`epochs_for`)
TRAINED_EPOCHS = FRESH_EPOCHS + FINE_TUNE_EPOCHS  # epochs over the rounds, both candidates that train together
TRAIN_BATCH_SIZE = 64
CANDIDATES = ("fresh", "default", "as-is")  # "default": fine-tuned; "as-is": untrained


class TimeLimit(TrainerCallback):
    """Stop training (with a checkpoint) once `seconds` have passed since training started."""

    def __init__(self, seconds: float | None):
        self.seconds, self.start = seconds, None

    def on_train_begin(self, args, state, control, **kwargs):
        self.start = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        if self.seconds is not None and time.perf_counter() - self.start > self.seconds:
            control.should_training_stop = True
            control.should_save = True
        return control


def train_with_checkpoints(train_set, eval_set, manifest: dict, output_dir: Path, *, epochs: float,
                           seconds: float | None, max_draft_tokens: int, decoding: str, seed: int = 0,
                           batch_size: int = TRAIN_BATCH_SIZE, learning_rate: float = 1e-3, checkpoint_every: int = 50,
                           progress: bool = True, device: str = "cpu",
                           start: PacerPreVerifier | None = None) -> tuple[PacerPreVerifier, dict]:
    """Train a fresh pre-verifier (or fine-tune `start`) on `train_set` (prepared rounds of the traces `manifest`
    describes), resuming from the last checkpoint in `output_dir`, stopping after `epochs` or `seconds`; returns it
    with AUC/ECE on `eval_set` and the run."""
    set_seed(seed)
    if start is None:
        model = build_preverifier(manifest, max_draft_tokens=max_draft_tokens, decoding=decoding)
    else:
        model = fine_tune_start(start, manifest, max_draft_tokens)
    steps_per_epoch = max(1, math.ceil(len(train_set) / batch_size))
    checkpoint_every = max(1, min(checkpoint_every, steps_per_epoch))  # at least one checkpoint an epoch
    args = TrainingArguments(
        output_dir=str(output_dir), per_device_train_batch_size=batch_size, per_device_eval_batch_size=256,
        num_train_epochs=epochs, learning_rate=learning_rate, weight_decay=0.01, lr_scheduler_type="cosine",
        warmup_steps=max(1, int(0.05 * steps_per_epoch * epochs)), logging_strategy="no",
        eval_strategy="no", save_strategy="steps", save_steps=checkpoint_every, save_total_limit=2,
        report_to=[], remove_unused_columns=False, seed=seed, data_seed=seed,
        dataloader_num_workers=0, disable_tqdm=not progress, use_cpu=device == "cpu",
    )
    limit = TimeLimit(seconds)
    trainer = PacerTrainer(model=model, args=args, train_dataset=train_set, data_collator=TraceCollator(),
                           callbacks=[limit])
    trainer.remove_callback(PrinterCallback)  # without progress bars it would print every log line to stdout
    last = get_last_checkpoint(str(output_dir)) if Path(output_dir).is_dir() else None
    started = time.perf_counter()
    result = trainer.train(resume_from_checkpoint=last)
    model = trainer.model.eval()
    probs, labels = predict_probs(model, eval_set)
    auc, ece = auc_ece(probs, labels)
    state = trainer.state
    run = {"train_rows": len(train_set), "eval_rows": len(eval_set), "epochs_planned": epochs,
           "epochs_done": round(float(state.epoch or 0.0), 3), "steps": int(state.global_step),
           "stopped_by_time": bool(seconds is not None and state.epoch is not None and state.epoch < epochs - 1e-6),
           "resumed_from": Path(last).name if last else None, "seconds": round(time.perf_counter() - started, 1),
           "train_loss": round(float(result.training_loss), 5), "batch_size": batch_size,
           "learning_rate": learning_rate, "auc": auc, "ece": ece,
           "eval_accept_rate": float(labels[labels >= 0].mean()) if (labels >= 0).any() else float("nan")}
    model.config.training = {k: run[k] for k in ("train_rows", "eval_rows", "epochs_done", "steps", "auc", "ece")}
    return model, run


def fine_tune_start(start: PacerPreVerifier, manifest: dict, max_draft_tokens: int) -> PacerPreVerifier:
    """A copy of `start` (a features-only pre-verifier: the default one) to fine-tune on this pair's rounds. Positions
    past its last begin as its last (the pair's rounds may be longer than those it learned from), and the copy names
    the pair's draft, so `check_draft` refuses it for another one."""
    if start.config.input_mode != "features":
        raise ValueError("Only a features-only pre-verifier (input_mode='features') can start a fit for another "
                         f"draft; this one reads hidden states ({start.config.input_mode!r}).")
    model = copy.deepcopy(start).float().train()
    config = model.config
    steps = max(manifest["config"]["max_draft_tokens"], max_draft_tokens)
    if steps > config.max_draft_tokens:
        old = model.position.weight.data
        model.position = torch.nn.Embedding(steps, old.shape[1])
        model.position.weight.data[: len(old)] = old
        model.position.weight.data[len(old):] = old[-1]
        config.max_draft_tokens = steps
    config.draft_model, config.target_model = manifest["draft_model"], manifest["target_model"]
    config.draft_signature = manifest["draft_signature"]
    config.online_calibration = False  # calibrated on this pair's rounds (`fit_calibrate`)
    if manifest.get("label_kind"):
        config.decoding = manifest["label_kind"]
    return model


def train_candidates(train_traces: Path, eval_traces: Path, work: Path, mode: str, *, default: PacerPreVerifier,
                     seconds: float | None, step_seconds_fresh: float, max_draft_tokens: int, seed: int = 0,
                     progress: bool = True, device: str = "cpu") -> tuple[dict[str, PacerPreVerifier], dict[str, dict]]:
    """Every candidate by name with its run (each resumable under `work`; the two that train get half of `seconds`
    each). `fit_calibrate.calibrate_here` chooses among them."""
    manifest, train_rounds = read_manifest(train_traces), load_traces(train_traces)
    rows, sets = len(train_rounds), None  # the prepared rounds, once, for the candidates that still train
    share = None if seconds is None else seconds / 2
    candidates, runs = {}, {}
    for name in CANDIDATES:
        folder = work / f"candidate-{mode}-{name}"
        if not (folder / "model.safetensors").is_file():
            if name == "as-is":
                model = fine_tune_start(default, manifest, max_draft_tokens).eval()
                run = {"train_rows": rows, "eval_rows": 0, "epochs_done": 0.0, "steps": 0, "stopped_by_time": False,
                       "resumed_from": None, "train_loss": None, "auc": None, "ece": None}
                model.config.training = {"untrained": "pacer_hf's default pre-verifier as it is"}
            else:
                start = default if name == "default" else None
                tuning = {"most": FINE_TUNE_EPOCHS} if start is not None else {}
                sets = sets or (prepare(train_rounds), prepare(load_traces(eval_traces)))
                model, run = train_with_checkpoints(
                    *sets, manifest, work / f"trainer-{mode}-{name}", seconds=share,
                    epochs=epochs_for(rows, share, step_seconds_fresh, **tuning),
                    max_draft_tokens=max_draft_tokens, decoding=mode, seed=seed, progress=progress, device=device,
                    start=start, **({"learning_rate": FINE_TUNE_LEARNING_RATE} if start is not None else {}))
            model.save_pretrained(folder)
            (folder / "fit_training.json").write_text(json.dumps(run, indent=1))
        runs[name] = json.loads((folder / "fit_training.json").read_text())
        candidates[name] = PacerPreVerifier.from_pretrained(folder)
    return candidates, runs


def epochs_for(rows: int, seconds: float | None, step_seconds: float, batch_size: int = TRAIN_BATCH_SIZE,
               most: float = FRESH_EPOCHS) -> float:
    """Epochs that fit `seconds` at `step_seconds` per optimizer step (at least one, at most `most`; None: `most`)."""
    if seconds is None:
        return most
    steps = max(1.0, seconds / max(step_seconds, 1e-6))
    return float(np.clip(steps / max(1, math.ceil(rows / batch_size)), 1.0, most))


def step_seconds(max_draft_tokens: int, hidden_size: int, batch_size: int = TRAIN_BATCH_SIZE,
                 device: str = "cpu") -> float:
    """Seconds of one optimizer step of a fresh pre-verifier on random rounds of this shape (median of 5)."""
    from ..configuration_pacer import PacerConfig

    model = PacerPreVerifier(PacerConfig(draft_hidden_size=hidden_size, max_draft_tokens=max_draft_tokens,
                                         loop_features=True)).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    hidden = torch.randn(batch_size, max_draft_tokens, hidden_size, device=device)
    feats = torch.randn(batch_size, max_draft_tokens, 3, device=device)
    loop = torch.rand(batch_size, 3, device=device)
    labels = torch.randint(0, 2, (batch_size, max_draft_tokens), device=device).float()
    times = []
    for _ in range(6):
        start = time.perf_counter()
        loss = model(hidden, feats, labels=labels, loop_features=loop).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        times.append(time.perf_counter() - start)
    return float(np.median(times[1:])) * 1.5  # the Trainer's own bookkeeping and data loading on top
