"""Build the demo draft/target pair shipped in hub_cards/ (tokenizer + two Llama models trained on the stdlib).

Reproducible and resumable: every stage writes its result under --work-dir and is skipped when that
result exists; training stages keep `transformers.Trainer` checkpoints, so rerunning the command
resumes an interrupted build. Uses a GPU automatically when one is present.

Stages (`--stage all` runs them in order):
  tokenizer    byte-level BPE trained on the training files only, saved as PreTrainedTokenizerFast
  data         files -> token blocks per split (train / validation / test, split by file)
  target-base  a shallow target, trained with cross-entropy
  draft        the draft, trained with cross-entropy
  target       the target grown deeper from target-base (function-preserving), trained further
  distill      the draft fine-tuned on the target-base's logits (KD) to raise acceptance
  export       bf16 Hub folders + model cards with measured losses, decode cost c, acceptance
  onpolicy     the draft fitted to the target on the target's own answers (on-policy distillation;
               `demo_onpolicy`), measured and shipped with its card in place of the exported draft
  preverifier  a pre-verifier for that draft: traces along the target's answers with the loop's state,
               Trainer, costs measured here and the stop rule calibrated; shipped with its card
  preverifier-sampling  the same for sampling (T = 1): sampled rounds labelled by the target (soft labels)
Independent stages (target-base | draft, then target | distill) may run as two processes at once.

Modules: this one (shapes, training stages, the command), `demo_data` (corpus, split, tokenizer, token
blocks), `demo_export` (evaluation, Hub folders, model cards), `demo_onpolicy` (the last two stages). Nothing outside pacer_hf.training imports
them: `pacer-hf demo` and `pacer-hf bench` read the built folders only.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from .._paths import hub_cards_dir
from .demo_data import (
    SPLITS_FILE,
    Blocks,
    corpus_files,
    held_out_files,
    load_stage_model,
    require_stage,
    split_files,
    split_of,
    stage_data,
    stage_tokenizer,
    stdlib_root,
    train_tokenizer,
)
from .demo_export import decode_step_ms, heldout_loss, stage_export

SHIPPED_DIR = hub_cards_dir()  # where the built pair is shipped (demo-target/, demo-draft/)


@dataclass
class Shape:
    """A Llama shape; `intermediate` defaults to ~8/3 of the width, rounded to 64."""

    layers: int
    hidden: int
    heads: int
    intermediate: int = 0

    def __post_init__(self) -> None:
        if not self.intermediate:
            self.intermediate = max(64, int(self.hidden * 8 / 3) // 64 * 64)

    @classmethod
    def parse(cls, text: str) -> Shape:
        """"16x256" -> 16 layers of width 256 with 64-wide heads."""
        layers, hidden = (int(v) for v in text.lower().split("x"))
        return cls(layers, hidden, max(1, hidden // 64))


# ---------------------------------------------------------------------------------------------- models


def llama_config(shape: Shape, tokenizer, seq_len: int):
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=len(tokenizer), hidden_size=shape.hidden, intermediate_size=shape.intermediate,
                       num_hidden_layers=shape.layers, num_attention_heads=shape.heads,
                       num_key_value_heads=shape.heads, max_position_embeddings=max(1024, seq_len),
                       tie_word_embeddings=True, bos_token_id=tokenizer.eos_token_id,
                       eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.eos_token_id,
                       initializer_range=0.02)


def grow_deeper(model, layers: int):
    """Function-preserving growth: each trained layer is followed by copies whose output projections
    are zero, so the grown model computes exactly what the shallow one did (then trains further).
    Depth is what makes a small model's decode step slow on a CPU, and this keeps the trained start."""
    import copy

    from transformers import LlamaForCausalLM

    base = model.model.layers
    if layers % len(base):
        raise ValueError(f"cannot grow {len(base)} layers to {layers}: not a multiple")
    config = copy.deepcopy(model.config)
    config.num_hidden_layers = layers
    grown = LlamaForCausalLM(config)
    state = {k: v for k, v in model.state_dict().items() if ".layers." not in k}
    factor = layers // len(base)
    for j in range(layers):
        for name, value in base[j // factor].state_dict().items():
            zero = j % factor and name in ("self_attn.o_proj.weight", "mlp.down_proj.weight")
            state[f"model.layers.{j}.{name}"] = torch.zeros_like(value) if zero else value.clone()
    grown.load_state_dict(state, strict=False)
    grown.tie_weights()
    return grown


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
                mult = min(1.0, (state.global_step + 1) / max(warmup, 1)) * (0.1 + 0.45 * (1 + math.cos(math.pi * min(frac, 1.0))))
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
    spent = json.loads((Path(last) / ELAPSED_FILE).read_text())["seconds"] if last and (Path(last) / ELAPSED_FILE).exists() else 0.0
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


def _stage_done(work: Path, name: str) -> bool:
    path = work / name / "final" / "stage.json"
    return path.exists() and json.loads(path.read_text())["complete"]


def _fresh(args: argparse.Namespace, work: Path, shape: Shape):
    from transformers import AutoTokenizer, LlamaForCausalLM

    torch.manual_seed(args.seed)
    return LlamaForCausalLM(llama_config(shape, AutoTokenizer.from_pretrained(work / "tokenizer"), args.seq_len))


def stage_target_base(args, work):
    if _stage_done(work, "target-base"):
        print("[target-base] done")
        return
    train_stage(args, work, "target-base", _fresh(args, work, Shape.parse(args.target_base)),
                args.target_base_minutes, args.lr, args.batch_size)


def stage_draft(args, work):
    if _stage_done(work, "draft"):
        print("[draft] done")
        return
    train_stage(args, work, "draft", _fresh(args, work, Shape.parse(args.draft)), args.draft_minutes,
                args.draft_lr, args.batch_size)


def stage_target(args, work):
    if _stage_done(work, "target"):
        print("[target] done")
        return
    require_stage(work, "target-base")
    base = load_stage_model(work / "target-base" / "final")
    layers = Shape.parse(args.target).layers
    model = grow_deeper(base, layers) if layers != base.config.num_hidden_layers else base
    train_stage(args, work, "target", model, args.target_minutes, args.grow_lr, args.batch_size)


def stage_distill(args, work):
    if _stage_done(work, "distill"):
        print("[distill] done")
        return
    require_stage(work, "draft")
    while not (work / "target-base" / "final" / "stage.json").exists():  # its teacher, maybe training in parallel
        print("[distill] waiting for target-base to finish", flush=True)
        time.sleep(30)
    if args.distill_minutes <= 0:
        print("[distill] skipped (--distill-minutes 0)")
        return
    teacher = load_stage_model(work / "target-base" / "final").eval()
    for p in teacher.parameters():
        p.requires_grad_(False)
    train_stage(args, work, "distill", load_stage_model(work / "draft" / "final"), args.distill_minutes, args.distill_lr,
                args.batch_size, teacher=teacher, kd_weight=args.kd_weight)


# ---------------------------------------------------------------------------------------------- CLI

def stage_onpolicy(args, work):
    from .demo_onpolicy import stage_onpolicy as fit

    fit(args, work)


def _for_the_fitted_draft(name: str):
    """A stage of `demo_onpolicy` that builds on the fitted draft: skipped when the onpolicy stage does not fit one."""

    def stage(args, work):
        from . import demo_onpolicy

        if args.onpolicy_train_minutes <= 0:
            print(f"[{name}] skipped (it is built for the fitted draft; --onpolicy-train-minutes 0)")
            return
        getattr(demo_onpolicy, f"stage_{name.replace('-', '_')}")(args, work)

    return stage


stage_preverifier = _for_the_fitted_draft("preverifier")
stage_preverifier_sampling = _for_the_fitted_draft("preverifier-sampling")


STAGES = {"tokenizer": stage_tokenizer, "data": stage_data, "target-base": stage_target_base, "draft": stage_draft,
          "target": stage_target, "distill": stage_distill, "export": stage_export, "onpolicy": stage_onpolicy,
          "preverifier": stage_preverifier, "preverifier-sampling": stage_preverifier_sampling}
TINY = {"target_base": "2x64", "target": "4x64", "draft": "1x32", "vocab_size": 512, "measure_vocab": [],
        "seq_len": 64, "batch_size": 4, "eval_tokens": 2048, "eval_prompts": 1, "eval_new_tokens": 8,
        "onpolicy_prompts": 12, "onpolicy_new_tokens": 8, "onpolicy_eval_prompts": 2, "preverifier_epochs": 1}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--stage", choices=["all", *STAGES], default="all")
    parser.add_argument("--work-dir", default="runs/demo_pair", help="intermediate files and checkpoints")
    parser.add_argument("--out", default=str(SHIPPED_DIR), help="where demo-target/ and demo-draft/ are written")
    parser.add_argument("--corpus-root", default=str(stdlib_root()))
    parser.add_argument("--vocab-size", type=int, default=8192)
    parser.add_argument("--measure-vocab", type=int, nargs="*", default=[4096, 16384],
                        help="other vocabulary sizes to measure bytes/token for (not shipped)")
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--target-base", default="4x256", help="LAYERSxWIDTH of the shallow target")
    parser.add_argument("--target", default="16x256", help="LAYERSxWIDTH of the grown target")
    parser.add_argument("--draft", default="1x128")
    parser.add_argument("--target-base-minutes", type=float, default=30)
    parser.add_argument("--target-minutes", type=float, default=15)
    parser.add_argument("--draft-minutes", type=float, default=30)
    parser.add_argument("--distill-minutes", type=float, default=12)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--grow-lr", type=float, default=1e-3)
    parser.add_argument("--draft-lr", type=float, default=3e-3)
    parser.add_argument("--distill-lr", type=float, default=1e-3)
    parser.add_argument("--kd-weight", type=float, default=0.7)
    parser.add_argument("--eval-tokens", type=int, default=65536, help="tokens of each held-out split to evaluate")
    parser.add_argument("--eval-prompts", type=int, default=10, help="HumanEval prompts for the oracle lengths")
    parser.add_argument("--eval-new-tokens", type=int, default=64)
    parser.add_argument("--oracle-cap", type=int, default=16)
    parser.add_argument("--max-steps", type=int, default=0,
                        help="fixed steps per training stage instead of sizing them from the minutes (tests)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: leave torch's default)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tiny", action="store_true", help="tiny shapes and budgets (a smoke test in ~1 min)")
    from .demo_onpolicy import add_arguments as onpolicy_arguments

    onpolicy_arguments(parser)


def run(args: argparse.Namespace) -> int:
    import sys

    args.command_line = os.environ.get("PACER_DEMO_COMMAND") or (
        "pacer-hf build-demo-pair " + " ".join(sys.argv[2:]) if sys.argv[1:2] == ["build-demo-pair"]
        else getattr(args, "command_line", "pacer-hf build-demo-pair"))
    if args.tiny:
        for key, value in TINY.items():
            setattr(args, key, value)
        for key in ("target_base_minutes", "target_minutes", "draft_minutes", "distill_minutes",
                    "onpolicy_generate_minutes", "onpolicy_train_minutes"):
            setattr(args, key, min(getattr(args, key), 0.1))
    if args.threads:
        torch.set_num_threads(args.threads)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    (work / "args.json").write_text(json.dumps({k: v for k, v in vars(args).items() if not k.startswith("_")}, indent=1))
    for name, stage in STAGES.items():
        if args.stage in ("all", name):
            stage(args, work)
    return 0


def default_args(**overrides) -> argparse.Namespace:
    """The command's defaults as a Namespace (for scripts and tests)."""
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args([])
    for key, value in overrides.items():
        setattr(args, key, value)
    return args


__all__ = ["SHIPPED_DIR", "SPLITS_FILE", "Shape", "corpus_files", "split_of", "split_files", "held_out_files",
           "stdlib_root", "train_tokenizer", "grow_deeper", "heldout_loss", "decode_step_ms", "default_args", "run"]
