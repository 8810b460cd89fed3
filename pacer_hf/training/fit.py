"""`fit_preverifier`: a pre-verifier for any (target, draft) pair in one call, within a time budget.

    pv = pacer_hf.fit_preverifier("org/target", "org/draft", budget_s=900, output_dir="pv")
    out = target.generate(**inputs, assistant_model=draft, pacer=pv)

The stages are those that built every good pre-verifier in this project (docs/TRAINING.md): the target's own answers
to the prompts (batched, in the dtype that is fastest on the device), rounds of `max_draft_tokens` traced along them
with the loop's state (`collect_along_answers`), Trainer (checkpointed), the expected-gain rule calibrated on the
device and dtype the pair runs in, held-out AUC/ECE and a measured speed check. Each stage keeps its results under
`output_dir/fit-work`, so rerunning the same call after an interruption resumes where it stopped.
"""

from __future__ import annotations

import shlex
import sys
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

from ..modeling_pacer import PacerPreVerifier
from .fit_data import build_prompts, cast_for_a_while, fastest_dtype, generate_answers, read_answers
from .fit_setup import FitPlan, check_arguments, load_models, open_work, resolve_device
from .fit_train import train_candidates

DECODINGS = ("greedy", "sampling", "both")


def fit_preverifier(target, draft, tokenizer=None, *, prompts=None, decoding: str = "greedy",
                    budget_s: float | None = None, output_dir: str | Path | None = None,
                    push_to_hub: str | None = None, device: str | None = None, dtype: str | torch.dtype | None = None,
                    max_draft_tokens: int = 24, max_new_tokens: int = 128, batch_size: int | None = None,
                    chat_template: bool | None = None, prompt_column: str = "text", prompt_split: str = "train",
                    per_category: int = 80, seed: int = 0, overwrite: bool = False, speed_check: bool = True,
                    progress: bool = True) -> PacerPreVerifier | dict[str, PacerPreVerifier]:
    """Fit a pre-verifier for `draft` drafting for `target`; with `output_dir`, save it there with its card.

    `target`, `draft`: model objects, Hub ids or local folders (loaded as transformers loads them); `tokenizer`:
    an object or id, default the target's. `prompts`: None (a mixed default set shipped with pacer_hf: code, QA,
    summarization, rewriting, chat), a list of user requests, a .jsonl file (`prompt_column`) or a `datasets` name
    (`prompt_split`); rendered with the chat template when the tokenizer has one (`chat_template`).
    `decoding`: "greedy", "sampling" (soft labels along the target's T = 1 answers) or "both" (returns
    {"greedy": pv, "sampling": pv}, saved in output_dir/greedy and output_dir/sampling).
    `budget_s`: the whole call's wall-clock budget; the data is sized from measured speeds so that it ends near it
    (None: every prompt is answered). `device`: "auto", "cpu" or "cuda" (collection, training and calibration all
    run there); `dtype`: the dtype the pair serves in ("auto": bfloat16 on CUDA, float32 on CPU; None: as loaded).
    `push_to_hub`: a repo id to publish to (with the card; "both": `<repo>-greedy` and `<repo>-sampling`).
    `speed_check=False` skips timing the pre-verifier against fixed γ and HF's schedule on held-out prompts (the
    card then says "not measured").
    Rerunning with the same `output_dir` resumes.
    """
    started = time.perf_counter()
    check_arguments(decoding=decoding, budget_s=budget_s, max_draft_tokens=max_draft_tokens,
                    max_new_tokens=max_new_tokens, push_to_hub=push_to_hub, output_dir=output_dir,
                    batch_size=batch_size)
    device = resolve_device(device, target)
    target, draft, tokenizer, names = load_models(target, draft, tokenizer, device, dtype)
    records = build_prompts(tokenizer, prompts, chat_template=chat_template, per_category=per_category, seed=seed,
                            column=prompt_column, split=prompt_split)
    modes = ("greedy", "sampling") if decoding == "both" else (decoding,)
    signature = {"target": names["target"], "draft": names["draft"], "prompts": [r["key"] for r in records],
                 "decodings": list(modes), "max_draft_tokens": max_draft_tokens, "max_new_tokens": max_new_tokens,
                 "seed": seed}
    work, state = open_work(output_dir, signature, overwrite)
    plan = FitPlan.measure(target, draft, records, budget_s=budget_s, started=started, modes=len(modes),
                           max_new_tokens=max_new_tokens, batch_size=batch_size, device=device,
                           max_draft_tokens=max_draft_tokens)
    fitted = {}
    for mode in modes:
        fitted[mode] = _fit_one(target, draft, tokenizer, records, mode, work, state, plan, names,
                                max_draft_tokens=max_draft_tokens, max_new_tokens=max_new_tokens, seed=seed,
                                device=device, progress=progress, budget_s=budget_s, started=started,
                                timed_check=speed_check)
        plan.finished(mode)
    for mode, preverifier in fitted.items():
        total = round(time.perf_counter() - started, 1)
        preverifier.fit_metrics["training"]["total seconds"] = preverifier.fit_report["total_seconds"] = total
        if output_dir is not None:
            folder = Path(output_dir) / mode if len(modes) > 1 else Path(output_dir)
            preverifier.save_pretrained(folder)
            if push_to_hub:
                from ..hub.publish import push_preverifier

                repo = push_to_hub if len(modes) == 1 else f"{push_to_hub}-{mode}"
                push_preverifier(folder, repo, datasets=preverifier.fit_metrics["datasets"])
    if work.temporary:
        work.cleanup()
    return fitted if len(modes) > 1 else fitted[modes[0]]


def _fit_one(target, draft, tokenizer, records, mode: str, work, state, plan, names, *, max_draft_tokens: int,
             max_new_tokens: int, seed: int, device: str, progress: bool, budget_s, started: float,
             timed_check: bool = True):
    """One decoding mode's pre-verifier: answers, traces, training, calibration, speed check, card."""
    from .collect import read_manifest
    from .collect_answers import collect_along_answers

    stages = tqdm(total=5, desc=f"fit ({mode})", unit="stage", disable=not progress, dynamic_ncols=True,
                  position=0, leave=True)
    seconds = state.setdefault(f"seconds-{mode}", {})
    path = work.path / f"answers-{mode}.jsonl"
    clock = time.perf_counter()
    if not state.get(f"answers-{mode}"):
        answer_dtype = fastest_dtype(target, [r["prompt"][-128:] for r in records[:plan.batch_size]],
                                     tokenizer.pad_token_id or 0, plan.answer_dtypes)
        with cast_for_a_while(target, answer_dtype):
            generate_answers(target, tokenizer, records, path, max_new_tokens=max_new_tokens,
                             batch_size=plan.batch_size, budget_s=plan.answers_seconds(),
                             do_sample=mode == "sampling", progress=progress, later=plan.after_answer)
        state[f"answers-{mode}"] = str(answer_dtype).removeprefix("torch.")
        work.save(state)
    plan.dtypes[mode] = state[f"answers-{mode}"]
    seconds["answers"] = seconds.get("answers", 0) + round(time.perf_counter() - clock, 1)
    stages.update()
    answers = [r for r in read_answers(path) if r["response"]]
    train, heldout = [r for r in answers if not r["heldout"]], [r for r in answers if r["heldout"]]
    if len(train) < 1 or len(heldout) < 2:
        raise ValueError(f"The budget left {len(train)} training and {len(heldout)} held-out answers; raise budget_s "
                         "or pass more prompts.")
    clock, traces = time.perf_counter(), {}
    context = max(len(r["prompt"]) for r in answers)  # the whole prompt, as a served draft reads it
    for split, rows in (("train", train), ("heldout", heldout)):
        folder = work.path / f"traces-{mode}-{split}"
        if not (folder / "manifest.json").is_file() or not read_manifest(folder).get("complete"):
            collect_along_answers(draft=draft, records=rows, output_dir=folder, max_draft_tokens=max_draft_tokens,
                                  context=context, target=target, teacher_forced=True, seed=seed,
                                  temperature=1.0 if mode == "sampling" else 0.0,
                                  source=f"{path.name} ({split})", draft_name=names["draft"],
                                  target_name=names["target"], progress=progress)
        traces[split] = folder
    seconds["collect"] = seconds.get("collect", 0) + round(time.perf_counter() - clock, 1)
    stages.update()
    clock = time.perf_counter()
    from ..attached import default_preverifier

    candidates, runs = train_candidates(
        traces["train"], traces["heldout"], work.path, mode, default=default_preverifier(mode == "sampling"),
        seconds=plan.train_seconds(), step_seconds_fresh=plan.train_step_s,
        max_draft_tokens=max_draft_tokens, seed=seed, progress=progress, device=device)
    seconds["train"] = seconds.get("train", 0) + round(time.perf_counter() - clock, 1)
    stages.update()
    clock = time.perf_counter()
    from .fit_calibrate import calibrate_here

    kept, preverifier, calibration = calibrate_here(target, draft, candidates, traces["heldout"], plan, seed=seed,
                                                    progress=progress)
    run = dict(runs[kept], start=_start(kept, calibration["candidates_simulated"]))
    seconds["calibrate"] = round(time.perf_counter() - clock, 1)
    stages.update()
    clock = time.perf_counter()
    speed = None
    if mode == "greedy" and timed_check:
        from .fit_report import speed_check

        prompts, new_tokens = plan.speed_prompts([r["prompt"] for r in heldout])
        speed = speed_check(target, draft, preverifier, prompts, new_tokens)
    seconds["speed check"] = round(time.perf_counter() - clock, 1)
    stages.update()
    stages.close()
    work.save(state)
    return _finish(preverifier, run, calibration, speed, answers, mode, seconds, names, plan, budget_s, started)


CANDIDATE_NAMES = {  # fit_train.CANDIDATES: (what the card says the fit kept, how it names one it did not)
    "fresh": ("trained from scratch on the draft's hidden states", "the one from scratch"),
    "default": ("pacer_hf's default pre-verifier fine-tuned on the pair's rounds", "the fine-tuned default"),
    "as-is": ("pacer_hf's default pre-verifier as it is (calibrated for the pair)", "the default as it is"),
}


def _start(kept: str, speeds: dict[str, float]) -> str:
    """Which candidate the fit kept and why, for the card: every candidate's simulated speed."""
    others = ", ".join(f"{speeds[name]:.3f}x for {CANDIDATE_NAMES[name][1]}" for name in speeds if name != kept)
    return (f"{CANDIDATE_NAMES[kept][0]}: its rule simulated {speeds[kept]:.3f}x the target alone on the half of the "
            f"held-out texts calibration chooses on, against {others}")


def _finish(preverifier, run, calibration, speed, answers, mode, seconds, names, plan, budget_s, started):
    """The pre-verifier with its names, its report in the config and a card its save_pretrained writes."""
    from .fit_report import card_metrics, with_card

    preverifier.config.draft_model, preverifier.config.target_model = names["draft"], names["target"]
    preverifier.config.decoding = mode
    tokens = sum(len(r["response"]) for r in answers)
    kinds = sorted({r["category"] for r in answers})
    report = {
        "data": (f"{names['target']}'s {'greedy answers' if mode == 'greedy' else 'T = 1 samples'} to {len(answers)} "
                 f"prompts ({', '.join(kinds)}; {tokens} answer tokens), rounds of {preverifier.config.max_draft_tokens} "
                 f"drafted tokens traced along them with {names['draft']}"),
        "training": {**{k: run[k] for k in ("train_rows", "epochs_done", "steps", "stopped_by_time", "resumed_from",
                                             "train_loss")},
                     "start": run["start"],
                     "answers": len(answers), "answer tokens": tokens, "answers dtype": plan.state_dtype(mode)},
        "auc": calibration["auc"], "ece": calibration["ece"], "heldout_rounds": calibration["rounds"],
        "simulated": {f"simulated {name} vs target alone (report split)": calibration["table"][key]
                      for key, name in (("pacer", "Pacer"), ("oracle", "oracle")) if key in calibration["table"]},
        "speed_check": speed, "stage_seconds": dict(seconds),
        "stage_plan_seconds": {k: round(v, 1) for k, v in plan.planned.items()}, "budget_s": budget_s,
        "total_seconds": round(time.perf_counter() - started, 1), "hardware": plan.hardware,
        "command": " ".join(shlex.quote(a) for a in sys.argv) if Path(sys.argv[0]).name == "pacer-hf" else None,
    }
    if speed:
        report["simulated"].update({f"measured {k.replace('_', ' ')}": v for k, v in speed["summary"].items()})
    preverifier.fit_report = report
    return with_card(preverifier, card_metrics(report))


