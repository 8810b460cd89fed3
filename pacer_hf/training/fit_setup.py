"""`fit_preverifier`'s setup: argument checks, loading the pair, the work folder, and the time plan.

The plan turns a budget into stage sizes from speeds measured here: calibration is priced from a target step, the
widest verify and a draft step, the speed check from target steps, and the target's answers (the data) get what is
left, each answer counted with what tracing and training will cost for it (the forward tracing runs per answer and an
optimizer step, both timed here), so that the whole call ends near the budget.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..cheap_draft import CHEAP_DRAFT_FILE, apply_cheap_draft, cheapened
from ..costs import cached_forward_timer, fastest, processor_name, timed
from ..loading import DTYPES, check_pair
from ..loops.draft_forwards import draft_step_timer
from .fit_train import TRAIN_BATCH_SIZE, TRAINED_EPOCHS, step_seconds

WORK = "fit-work"
STATE = "fit_state.json"
MARGIN = 0.04
TRAIN_SETUP_S = 5.0  # training's fixed part: loading and preparing the rounds, two Trainers, evaluation, saving
TRAIN_MOST = 0.20  # of a mode's budget, the most training may take when the other stages leave it the time
LOOP_CALLS = 9  # generate calls of `fit_calibrate.LOOP_TOKENS` tokens calibration times (fixed γ = 1..8 and plain)
LOOP_WARMUP_TOKENS = 90  # the untimed warm-up calls' tokens before them
LOOP_PREFILLS = (22, 18)  # generate calls calibration makes in all (warm-ups and one-token setup calls included),
# and those of them with the draft, each paying the call's setup and a 128-token prompt's forward
SPEED_STEPS = 10  # target steps per held-out prompt and new token the speed check takes (7 settings, a warm-up, HF's)


def check_arguments(*, decoding, budget_s, max_draft_tokens, max_new_tokens, push_to_hub, output_dir,
                    batch_size) -> None:
    """ValueError naming the bad argument and what to pass instead."""
    if decoding not in ("greedy", "sampling", "both"):
        raise ValueError(f"decoding={decoding!r} must be 'greedy', 'sampling' or 'both'.")
    if budget_s is not None and not (isinstance(budget_s, (int, float)) and budget_s > 0):
        raise ValueError(f"budget_s={budget_s!r} must be a positive number of seconds, or None for no budget.")
    if not (isinstance(max_draft_tokens, int) and 1 <= max_draft_tokens <= 64):
        raise ValueError(f"max_draft_tokens={max_draft_tokens!r} must be an integer in [1, 64] (24 is what the "
                         "project's best pre-verifiers use).")
    if not (isinstance(max_new_tokens, int) and max_new_tokens >= 8):
        raise ValueError(f"max_new_tokens={max_new_tokens!r} must be an integer >= 8 (the answers' length cap).")
    if batch_size is not None and not (isinstance(batch_size, int) and batch_size >= 1):
        raise ValueError(f"batch_size={batch_size!r} must be a positive integer, or None (16 on CPU, 32 on CUDA).")
    if push_to_hub is not None:
        if output_dir is None:
            raise ValueError("push_to_hub= needs output_dir= (the folder that is published).")
        if not isinstance(push_to_hub, str) or push_to_hub.count("/") != 1:
            raise ValueError(f"push_to_hub={push_to_hub!r} must be a Hub repo id 'owner/name'.")


def resolve_device(device: str | None, target) -> str:
    """'cpu' or 'cuda': None keeps a model object's device (else auto); 'auto' picks CUDA when there is one."""
    if device is None:
        device = target.device.type if isinstance(getattr(target, "device", None), torch.device) else "auto"
    if device not in ("auto", "cpu", "cuda"):
        raise ValueError(f"device={device!r} must be 'auto', 'cpu' or 'cuda'.")
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device='cuda', but torch sees no CUDA device here; pass device='cpu' or 'auto'.")
    return device


def _dtype(dtype, device: str) -> torch.dtype | None:
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        return torch.bfloat16 if device == "cuda" else torch.float32
    if dtype not in DTYPES:
        raise ValueError(f"dtype={dtype!r} must be 'auto', None or one of {sorted(DTYPES)}.")
    return DTYPES[dtype]


def _model(value, role: str, dtype: torch.dtype | None, device: str):
    from transformers import AutoModelForCausalLM, PreTrainedModel

    if isinstance(value, (str, Path)):
        try:
            model = AutoModelForCausalLM.from_pretrained(str(value), dtype=dtype or torch.float32)
        except (OSError, ValueError) as error:
            raise ValueError(f"{role}={str(value)!r} does not load as a causal LM ({error}); pass a Hub id, a folder "
                             "written by save_pretrained, or a model object.") from None
        name = str(value)
        if role == "draft" and (Path(value) / CHEAP_DRAFT_FILE).is_file():  # e.g. an int8 copy of the target
            apply_cheap_draft(model, value)
    elif isinstance(value, (PreTrainedModel, torch.nn.Module)) and hasattr(value, "get_output_embeddings"):
        model = value.to(dtype) if dtype is not None and value.dtype != dtype else value
        name, changes = getattr(value, "name_or_path", None) or type(value).__name__, cheapened(value)
        if changes:  # e.g. load_pair's int8 draft: not the model its folder holds
            name += f" ({changes})"
    else:
        raise ValueError(f"{role}= must be a causal LM object, a Hub id or a local folder; got {type(value).__name__}.")
    return (model if device == "cpu" else model.to(device)).eval(), name


def load_models(target, draft, tokenizer, device: str, dtype) -> tuple:
    """(target, draft, tokenizer, names) on `device` in the serving dtype; the pair checked to fit together."""
    from transformers import AutoTokenizer

    dtype = _dtype(dtype, device) if dtype is not None or isinstance(target, (str, Path)) else None
    if dtype is None and isinstance(target, (str, Path)):
        dtype = _dtype("auto", device)
    target, target_name = _model(target, "target", dtype, device)
    draft, draft_name = _model(draft, "draft", dtype or target.dtype, device)
    if tokenizer is None or isinstance(tokenizer, (str, Path)):
        source = str(tokenizer) if tokenizer is not None else target_name
        try:
            tokenizer = AutoTokenizer.from_pretrained(source)
        except (OSError, ValueError) as error:
            raise ValueError(f"No tokenizer loads from {source!r} ({error}); pass tokenizer= (an object, Hub id or "
                             "folder).") from None
    check_pair(target, draft, tokenizer)
    return target, draft, tokenizer, {"target": target_name, "draft": draft_name}


@dataclass
class Work:
    """The folder a fit keeps its stages in (`output_dir/fit-work`, or a temporary one without output_dir)."""

    path: Path
    temporary: bool = False

    def save(self, state: dict) -> None:
        tmp = self.path / (STATE + ".tmp")
        tmp.write_text(json.dumps(state, indent=1))
        tmp.replace(self.path / STATE)

    def cleanup(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


def open_work(output_dir, signature: dict, overwrite: bool) -> tuple[Work, dict]:
    """The work folder and its state (a rerun resumes); a folder holding another fit (other pair, prompts or
    settings) is refused, and so is a non-empty output_dir that holds no fit; `overwrite` deletes it first."""
    if output_dir is None:
        return Work(Path(tempfile.mkdtemp(prefix="pacer-fit-")), temporary=True), {"signature": signature}
    out = Path(output_dir)
    if out.exists() and not out.is_dir():
        raise ValueError(f"output_dir={str(out)!r} is a file; pass a folder.")
    work = out / WORK
    if out.is_dir() and any(out.iterdir()) and not (work / STATE).is_file() and not overwrite:
        raise ValueError(f"output_dir={str(out)!r} is not empty and holds no fit to resume; pass an empty or new "
                         "folder, or overwrite=True to replace its contents.")
    if overwrite and out.is_dir():
        shutil.rmtree(out)
    state = json.loads((work / STATE).read_text()) if (work / STATE).is_file() else None
    if state is not None and state["signature"] != signature:
        changed = sorted(k for k in signature if state["signature"].get(k) != signature[k])
        raise ValueError(f"output_dir={str(out)!r} holds a fit with other {', '.join(changed)}; pass the same "
                         "arguments to resume it, another output_dir, or overwrite=True to start over.")
    work.mkdir(parents=True, exist_ok=True)
    state = state or {"signature": signature}
    Work(work).save(state)
    return Work(work), state


@dataclass
class FitPlan:
    """Stage sizes from the budget and the speeds measured here (see the module docstring)."""

    budget_s: float | None
    started: float
    modes: int
    step_s: float
    batch_size: int
    heldout: int
    max_new_tokens: int
    draft_hidden: int
    answer_dtypes: tuple
    hardware: str
    max_draft_tokens: int = 24
    forward_s: tuple[float, float, float] = (0.0, 0.0, 0.0)  # cached forwards: a target step, the widest verify, a draft step
    trace_s_per_token: float = 0.0  # tracing's forward per answer, per token of prompt and answer it covers
    call_s: float = 0.0  # a one-token generate call on the first prompt's last 128 tokens: setup and prompt forward
    train_step_s: float = 0.0  # one optimizer step of a fresh pre-verifier (`fit_train.step_seconds`)
    done: int = 0
    mode_end: float | None = None
    dtypes: dict = field(default_factory=dict)
    planned: dict = field(default_factory=dict)  # the last mode's stage estimates, seconds (`answers_seconds`)

    @classmethod
    def measure(cls, target, draft, records, *, budget_s, started, modes, max_new_tokens, batch_size, device,
                max_draft_tokens: int = 24):
        prompt = torch.tensor([records[0]["prompt"][-128:]], device=target.device)
        with torch.no_grad():
            one = min(timed(lambda: target.generate(prompt, max_new_tokens=1, do_sample=False), target.device)[0]
                      for _ in range(2))
            nine = timed(lambda: target.generate(prompt, max_new_tokens=9, min_new_tokens=9, do_sample=False),
                         target.device)[0]
        hardware = (torch.cuda.get_device_name(target.device) if device == "cuda"
                    else f"CPU ({processor_name()}), {torch.get_num_threads()} torch threads")
        widest = max(16, max_draft_tokens) + 1  # as calibration's cost passes time them (`calibration_seconds`)
        forwards = tuple(fastest(timer, 2) for timer in (
            cached_forward_timer(target, 1, 128, logits_to_keep=1), cached_forward_timer(target, widest, 128),
            draft_step_timer(draft, 128)))
        hidden = int(draft.get_output_embeddings().in_features)
        return cls(budget_s, started, modes, max((nine - one) / 8, 1e-4), batch_size or (32 if device == "cuda" else 16),
                   sum(r["heldout"] for r in records), max_new_tokens, hidden, (torch.float32, torch.bfloat16),
                   hardware, max_draft_tokens, forwards,
                   trace_seconds_per_token(target, draft, records[0]["prompt"], max_new_tokens), one,
                   step_seconds(max_draft_tokens, hidden, device=device))

    def trace_seconds(self, prompt: list[int], response: list[int]) -> float:
        """What tracing one answer will cost (`collect_along_answers`, one forward over it)."""
        return self.trace_s_per_token * (len(prompt) + len(response))

    def train_seconds_for(self, response: list[int]) -> float:
        """What training will spend on one answer's rounds: at most one round per answer token (each round keeps at
        least one), every epoch of both candidates that train (`fit_train.TRAINED_EPOCHS`)."""
        return len(response) * TRAINED_EPOCHS / TRAIN_BATCH_SIZE * self.train_step_s

    def after_answer(self, prompt: list[int], response: list[int]) -> float:
        """What the stages after the answers will spend on this one (`generate_answers` counts it as it writes)."""
        return self.trace_seconds(prompt, response) + self.train_seconds_for(response)

    def calibration_seconds(self) -> float:
        """What `fit_calibrate.calibrate_here` takes: its cost passes (a step, a draft step and every verify width up
        to the widest, each verify priced on the line between a step and the widest, each width's timer first filling
        a 128-token cache), then a generate call per fixed γ and plain decoding (`LOOP_CALLS`), each token at about a
        target step and a draft step, and every call's setup and prompt forward (`LOOP_PREFILLS`, the draft's priced
        at its step's share of the target's)."""
        from . import fit_calibrate

        step, widest, draft = self.forward_s
        k = max(16, self.max_draft_tokens)
        verifies = k * step + (widest - step) * (k + 1) / 2
        passes = (fit_calibrate.COST_REPEATS + 1) * (step + draft + verifies) + (k + 2) * self.call_s
        calls, drafted = LOOP_PREFILLS
        prefills = (calls + drafted * draft / max(step, 1e-9)) * self.call_s
        return passes + prefills + (LOOP_CALLS * fit_calibrate.LOOP_TOKENS + LOOP_WARMUP_TOKENS) * (self.step_s + draft)

    def _left(self) -> float:
        return self.budget_s - (time.perf_counter() - self.started)

    def speed_size(self) -> tuple[int, int]:
        """(held-out prompts, new tokens) of the speed check: 7 settings, each about a target step per token."""
        tokens = min(self.max_new_tokens, 96)
        prompts = min(self.heldout, 8)
        if self.budget_s is not None:
            share = 0.12 * self.budget_s / self.modes
            while prompts > 2 and SPEED_STEPS * prompts * tokens * self.step_s > share:
                prompts -= 1
            while tokens > 32 and SPEED_STEPS * prompts * tokens * self.step_s > share:
                tokens -= 16
        return prompts, tokens

    def speed_seconds(self) -> float:
        prompts, tokens = self.speed_size()
        return SPEED_STEPS * prompts * tokens * self.step_s

    def fixed_seconds(self) -> float:
        return self.calibration_seconds() + self.speed_seconds()

    def answers_seconds(self) -> float | None:
        """What this mode's answers, their tracing and their training may take (`generate_answers` counts each
        answer's `after_answer` against it): its share of what is left, less the other stages' estimates."""
        if self.budget_s is None:
            return None
        share = self._start_mode()
        others = {"training setup": TRAIN_SETUP_S, "calibrate": self.calibration_seconds(),
                  "speed check": self.speed_seconds()}
        answers = max(share - MARGIN * share - sum(others.values()), 0.05 * share)
        self.planned = {"answers, tracing and training": answers, **others}
        return answers

    def _start_mode(self) -> float:
        """This mode's share of what is left of the budget; its end is kept for the later stages."""
        share = self._left() / (self.modes - self.done)
        self.mode_end = time.perf_counter() + share
        return share

    def train_seconds(self) -> float | None:
        if self.budget_s is None:
            return None
        if self.mode_end is None:  # a resumed fit whose answers were already done
            self._start_mode()
        left = self.mode_end - time.perf_counter() - self.fixed_seconds() - MARGIN * self.budget_s / self.modes
        return max(min(left, TRAIN_MOST * self.budget_s / self.modes), TRAIN_SETUP_S)

    def speed_prompts(self, prompts: list[list[int]]) -> tuple[list[list[int]], int]:
        count, tokens = self.speed_size()
        return prompts[:count], tokens

    def finished(self, mode: str) -> None:
        self.done, self.mode_end = self.done + 1, None

    def state_dtype(self, mode: str) -> str | None:
        return self.dtypes.get(mode)


def trace_seconds_per_token(target, draft, prompt: list[int], max_new_tokens: int) -> float:
    """Seconds per token of the forward tracing runs over each answer (`collect_answers._answer_forward`: the draft
    over the prompt and the answer, or, for a copy of the target, the target over the prompt and the draft over the
    answer), timed on `prompt` with a stand-in answer of `max_new_tokens` tokens (the prompt's own, repeated)."""
    from .collect_answers import _answer_forward, _prompt_reader

    stand_in = {"prompt": prompt, "response": (prompt * (max_new_tokens // max(len(prompt), 1) + 1))[:max_new_tokens]}
    reader = _prompt_reader(draft, target, teacher_forced=True)
    with torch.no_grad():
        seconds = min(timed(lambda: _answer_forward(draft, stand_in, len(prompt), reader), draft.device)[0]
                      for _ in range(2))
    return seconds / (len(prompt) + len(stand_in["response"]))
