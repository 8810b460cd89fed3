"""One training stage of `pacer-hf build-demo-pair` (recipes/demo_pair.py): `transformers.Trainer` on a wall-time
budget (cosine decay driven by the budget's spent fraction, the time kept in each checkpoint so a resumed stage
finishes on budget), with an optional distillation loss against a teacher's logits."""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from .demo_data import Blocks, load_stage_model

ELAPSED_FILE = "elapsed.json"


def _time_budget_callback(budget_s: float, lr: float, warmup: int, schedule: bool, resumed_from: str | None,
                          name: str = "train"):
    """Trainer callback for a wall-time budget: cosine LR decay (to 10%) driven by the fraction of the
    budget spent, so a stage uses its minutes whatever share of a shared CPU it gets, and still ends
    with a decayed LR. Elapsed time is stored in each checkpoint, so a resumed run continues the schedule.
    Its progress bar counts minutes of the budget (a step count is unknown in advance), with step, loss, LR."""
    from tqdm.auto import tqdm
    from transformers import TrainerCallback

    previous = 0.0
    if resumed_from and (Path(resumed_from) / ELAPSED_FILE).exists():
        previous = json.loads((Path(resumed_from) / ELAPSED_FILE).read_text())["seconds"]

    class TimeBudget(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            self.start = time.perf_counter()
            self.lr = lr
            self.bar = tqdm(total=round(budget_s / 60, 1), initial=round(previous / 60, 1), desc=f"[{name}]",
                            unit="min", bar_format="{desc} {percentage:3.0f}%|{bar}| {n:.1f}/{total:.1f} min{postfix}")

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "loss" in logs:
                self.bar.set_postfix(step=state.global_step, loss=f"{float(logs['loss']):.3f}", lr=f"{self.lr:.2e}")

        def on_train_end(self, args, state, control, **kwargs):
            self.bar.close()

        def elapsed(self) -> float:
            return previous + time.perf_counter() - self.start

        def on_step_end(self, args, state, control, optimizer=None, **kwargs):
            frac = self.elapsed() / budget_s
            if schedule and optimizer is not None:
                decay = 0.1 + 0.45 * (1 + math.cos(math.pi * min(frac, 1.0)))
                mult = min(1.0, (state.global_step + 1) / max(warmup, 1)) * decay
                self.lr = lr * mult
                for group in optimizer.param_groups:
                    group["lr"] = self.lr
            self.bar.n = round(min(self.elapsed(), budget_s) / 60, 1)
            self.bar.refresh()
            if frac >= 1.0:
                print(f"\n[time budget] {budget_s / 60:.1f} min spent at step {state.global_step}; saving", flush=True)
                control.should_training_stop = True
                control.should_save = True

        def on_save(self, args, state, control, **kwargs):
            folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            if folder.is_dir():
                (folder / ELAPSED_FILE).write_text(json.dumps({"seconds": self.elapsed()}))

    return TimeBudget()


def _device_kwargs() -> dict:
    cuda = torch.cuda.is_available()
    return {"use_cpu": not cuda, "bf16": cuda and torch.cuda.is_bf16_supported()}


def train_stage(args: argparse.Namespace, work: Path, name: str, model, minutes: float, lr: float,
                batch_size: int, teacher=None, kd_weight: float = 0.0) -> None:
    """Train `model` for `minutes` of wall time (or `--max-steps` steps) with `transformers.Trainer`.

    The plan is written to plan.json on the first run and reused on resume; checkpoints every 25 steps
    carry the time spent, so an interrupted stage resumes where it stopped and finishes on budget."""
    from transformers import Trainer, TrainingArguments

    stage_dir = work / name
    stage_dir.mkdir(parents=True, exist_ok=True)
    train = Blocks(work / "data" / "train.pt")
    plan_path = stage_dir / "plan.json"
    plan = {"budget_minutes": minutes, "max_steps": args.max_steps, "batch_size": batch_size, "seq_len": args.seq_len,
            "lr": lr, "warmup_steps": 20, "kd_weight": kd_weight, "params": sum(p.numel() for p in model.parameters()),
            "device": "cuda" if torch.cuda.is_available() else "cpu", "torch_threads": torch.get_num_threads()}
    if plan_path.exists():  # the first run's plan wins: a resumed stage keeps its schedule
        plan.update(json.loads(plan_path.read_text()))
    plan_path.write_text(json.dumps(plan, indent=1))
    print(f"[{name}] plan: {plan}")
    timed = not plan["max_steps"]  # 0: as many steps as fit in budget_minutes
    targs = TrainingArguments(
        output_dir=str(stage_dir), per_device_train_batch_size=plan["batch_size"],
        max_steps=plan["max_steps"] or 10**7, learning_rate=plan["lr"],
        lr_scheduler_type="constant" if timed else "cosine_with_min_lr",
        lr_scheduler_kwargs={} if timed else {"min_lr_rate": 0.1},
        warmup_steps=0 if timed else min(plan["warmup_steps"], plan["max_steps"] // 10),
        weight_decay=0.1, adam_beta2=0.95, max_grad_norm=1.0, logging_steps=10, save_steps=25, save_total_limit=2,
        report_to=[], seed=args.seed, data_seed=args.seed, dataloader_num_workers=0, disable_tqdm=timed,
        **_device_kwargs())
    from transformers.trainer_utils import get_last_checkpoint

    last = get_last_checkpoint(str(stage_dir))
    budget_s = plan["budget_minutes"] * 60 * (1.0 if timed else 1.3)
    callback = _time_budget_callback(budget_s, plan["lr"], plan["warmup_steps"], timed, last, name)
    trainer_cls = _distill_trainer(teacher, kd_weight) if teacher is not None else Trainer
    trainer = trainer_cls(model=model, args=targs, train_dataset=train, callbacks=[callback])
    if timed:  # the budget bar shows step/loss/LR; the log history still goes to trainer_state.json
        from transformers.trainer_callback import PrinterCallback

        trainer.remove_callback(PrinterCallback)
    start = time.perf_counter()
    state = json.loads((Path(last) / "trainer_state.json").read_text()) if last else {}
    elapsed = Path(last) / ELAPSED_FILE if last else None
    spent = json.loads(elapsed.read_text())["seconds"] if elapsed is not None and elapsed.exists() else 0.0
    if (state.get("global_step", 0) >= targs.max_steps) or (timed and spent >= budget_s):  # finished before `final` was written
        trainer.model.load_state_dict(load_stage_model(Path(last)).state_dict())
        done, train_loss = state["global_step"], next((h["train_loss"] for h in reversed(state["log_history"])
                                                          if "train_loss" in h), float("nan"))
    else:
        result = trainer.train(resume_from_checkpoint=last)
        done, train_loss = trainer.state.global_step, result.training_loss
    trainer.save_model(str(stage_dir / "final"))
    spent = max(spent, callback.elapsed() if hasattr(callback, "start") else 0.0)
    record = {"steps_done": done, "complete": (spent >= budget_s) if timed else done >= targs.max_steps,
              "training_seconds": round(spent, 1),
              "train_loss": round(train_loss, 4), "seconds_this_process": round(time.perf_counter() - start, 1),
              "tokens_seen": done * plan["batch_size"] * plan["seq_len"], "resumed_from": last}
    (stage_dir / "final" / "stage.json").write_text(json.dumps({**plan, **record}, indent=1))
    print(f"[{name}] {record}")


def _distill_trainer(teacher, kd_weight: float):
    from transformers import Trainer

    class DistillTrainer(Trainer):
        """Loss = kd_weight * KL(teacher || student) + (1 - kd_weight) * cross-entropy, per token."""

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            out = model(**inputs)
            with torch.no_grad():
                teacher.to(out.logits.device).eval()
                t_logits = teacher(input_ids=inputs["input_ids"]).logits
            vocab = out.logits.shape[-1]
            s = F.log_softmax(out.logits[:, :-1].float().reshape(-1, vocab), -1)
            t = F.log_softmax(t_logits[:, :-1].float().reshape(-1, vocab), -1)
            kl = F.kl_div(s, t, log_target=True, reduction="batchmean")
            loss = kd_weight * kl + (1 - kd_weight) * out.loss
            return (loss, out) if return_outputs else loss

    return DistillTrainer
