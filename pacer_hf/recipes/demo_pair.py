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

Modules: this one (shapes, training stages, the command), `demo_train` (a stage's `transformers.Trainer` run on a
wall-time budget), `demo_data` (corpus, split, tokenizer, token blocks), `demo_export` (evaluation, Hub folders,
model cards), `demo_onpolicy` and `demo_onpolicy_card` (the last two stages). The library does not import them (only
the recipes and the CLI's build commands do): `pacer-hf demo` and `pacer-hf bench` read the built folders only.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from .._paths import hub_cards_dir
from .demo_data import (
    SPLITS_FILE,
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
from .demo_train import train_stage

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
