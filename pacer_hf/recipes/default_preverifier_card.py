"""The model card of the default pre-verifier (hub_cards/default-preverifier/README.md), rendered from what its
configs record (training pairs, held-out AUC/ECE) and a `pacer-hf bench` folder of it on a held-out pair.

    python -m pacer_hf.recipes.default_preverifier_card --bench docs/benchmarks/default_preverifier/demo
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from .._paths import hub_cards_dir
from ..attached import DEFAULT_PREVERIFIER, DEFAULT_PREVERIFIER_SAMPLING
from ..configuration_pacer import PacerConfig

FIXED = ("sd-fixed-2", "sd-fixed-4", "sd-fixed-6", "sd-fixed-8")
SUMMARY = "summary.json"  # beside the bench folders: what the card and docs/TRAINING.md quote
CONDITIONS = "conditions.json"  # beside a bench folder's results: `uptime` before and after the run


def bench_summary(folder: Path) -> dict:
    """Per strategy: total seconds over every prompt of the greedy run (sum over categories of new tokens divided
    by tokens/s), speedups per category vs the target alone, outputs identical; Pacer's ratios to HF's dynamic
    schedule and to the best fixed γ of 2/4/6/8 by total time."""
    from ..bench.report import load_results

    records, meta = load_results(folder)
    greedy = [r for r in records if r["temperature"] == 0.0]
    strategies = list(dict.fromkeys(r["strategy"] for r in greedy))
    categories = list(dict.fromkeys(r["category"] for r in greedy))
    total = {s: sum(r["new_tokens"] / r["tokens_per_s"] for r in greedy if r["strategy"] == s) for s in strategies}
    per_category = {s: {r["category"]: r["speedup_vs_ar"] for r in greedy if r["strategy"] == s} for s in strategies}
    overhead = {s: max(r["preverifier_overhead"] for r in greedy if r["strategy"] == s) for s in strategies}
    identical = {s: all(r["identical_to_ar"] for r in greedy if r["strategy"] == s) for s in strategies}
    fixed = [s for s in FIXED if s in total]
    best = min(fixed, key=total.get) if fixed else None
    out = {"command": meta.get("command"), "runs": (meta.get("config") or {}).get("runs", 1),
           "categories": categories, "strategies": strategies,
           "total_seconds": {s: round(v, 2) for s, v in total.items()},
           "speedup_total_vs_ar": {s: round(total["ar"] / v, 3) for s, v in total.items()} if "ar" in total else {},
           "per_category": per_category, "identical": identical, "preverifier_overhead_max": overhead,
           "best_fixed": best, "new_tokens": {s: sum(r["new_tokens"] for r in greedy if r["strategy"] == s)
                                              for s in strategies}}
    if "pacer" in total:
        if "hf-confidence" in total:
            out["pacer_vs_hf_confidence"] = round(total["hf-confidence"] / total["pacer"], 3)
        if best:
            out["pacer_vs_best_fixed"] = round(total[best] / total["pacer"], 3)
        out["pacer_lowest_category_vs_ar"] = round(min(per_category["pacer"].values()), 3)
    conditions = folder / CONDITIONS
    if conditions.is_file():
        out["conditions"] = json.loads(conditions.read_text())
    return out


def _bench_section(summary: dict, pair: str, source: Path) -> str:
    strategies, categories = summary["strategies"], summary["categories"]
    head = "| strategy | total s | vs target alone (total) | " + " | ".join(categories) + " | identical |"
    rows = [head, "|" + "---|" * (len(categories) + 4)]
    for s in strategies:
        cats = " | ".join(f"{summary['per_category'][s].get(c, float('nan')):.2f}" for c in categories)
        rows.append(f"| {s} | {summary['total_seconds'][s]:.1f} | {summary['speedup_total_vs_ar'].get(s, 0):.3f} | "
                    f"{cats} | {'yes' if summary['identical'][s] else 'NO'} |")
    conditions = summary.get("conditions") or {}
    runs = summary.get("runs", 1)
    timed = "one interleaved run (`--runs 1`)" if runs == 1 else f"{runs} interleaved runs (`--runs {runs}`)"
    lines = [f"<!-- figures: {source.as_posix()} -->",
             f"Held out of training. Greedy, 1 torch thread, {timed}; per-category "
             "columns are speedups vs the target alone (`ar`); total = the sum over every prompt "
             f"({source.as_posix()}).", "",
             *rows, ""]
    if "pacer_vs_hf_confidence" in summary:
        lines.append(f"- Pacer with this pre-verifier, total time: **{summary['pacer_vs_hf_confidence']}x** HF's "
                     f"dynamic schedule (`hf-confidence`), **{summary.get('pacer_vs_best_fixed')}x** the best fixed "
                     f"γ ({summary['best_fixed']}), lowest category **{summary['pacer_lowest_category_vs_ar']}x** "
                     "the target alone.")
    if "pacer" in summary["preverifier_overhead_max"]:
        lines.append(f"- Pre-verifier share of decode time (largest category): "
                     f"{100 * summary['preverifier_overhead_max']['pacer']:.1f} %.")
    if conditions:
        shared = " The machine was shared with other jobs, so absolute speeds are low and differences of a few " \
                 "hundredths are within noise." if "shared" in str(conditions.get("machine")) else ""
        lines.append(f"- Machine: {conditions.get('machine')}; load (`uptime`) before: {conditions.get('uptime_before')}"
                     f"; after: {conditions.get('uptime_after')}.{shared}")
    lines.append(f"- Command: `{summary['command']}`")
    return "\n".join(lines)


def _metrics_rows(training: dict) -> str:
    metrics = training["metrics"]
    rows = ["| pair (held out of training) | rounds | tokens | acceptance | AUC | ECE |", "|---|---|---|---|---|---|"]
    for pair, m in metrics["heldout_pairs"].items():
        rows.append(f"| {pair}: {training['heldout_pairs'][pair]} | {m['rounds']} | {m['tokens']} | "
                    f"{m['accept_rate']} | {m['auc']} | {m['ece']} |")
    back = metrics["train_pairs_texts_held_back"]
    rows.append(f"| training pairs, a tenth of their answers held back | {back['rounds']} | {back['tokens']} | "
                f"{back['accept_rate']} | {back['auc']} | {back['ece']} |")
    own = metrics.get("demo_own_preverifier")
    note = (f"\n\nOn the same held-out demo rounds the demo draft's own pre-verifier (`{own['preverifier']}`, which "
            f"also reads the draft's hidden states and was trained on this pair) scores AUC {own['auc']}, ECE "
            f"{own['ece']} (on each round's first {own['tokens_scored']} tokens).") if own else ""
    return "\n".join(rows) + note


ANSWERS = ("the demo target's 160 greedy and 80 T = 1 answers, SmolLM2's 93 greedy and 32 T = 1 answers, "
           "Qwen2.5-Coder-1.5B's 24 greedy and 8 T = 1 answers, at most 128 tokens each")


def _bench_text(benches: list[tuple[Path, str]]) -> str:
    """The measured-speed section; writes the summaries its figures quote beside the bench folders."""
    summaries = {Path(bench).name: bench_summary(Path(bench)) for bench, _ in benches}
    if benches:  # the figures below are read from this file (scripts/check_figures.py traces them there)
        summary_path = Path(benches[0][0]).parent / SUMMARY
        summary_path.write_text(json.dumps(summaries, indent=1) + "\n")
    text = "\n\n".join(f"### {pair}\n\n" + _bench_section(summaries[Path(bench).name], pair,
                                                                   Path(bench).parent / SUMMARY)
                             for bench, pair in benches) or "Not measured yet."
    if any(summary["speedup_total_vs_ar"].get("pacer", 1.0) < 1.0 for summary in summaries.values()):
        text += ("\n\nWhere a draft cannot pay, Pacer falls back to rounds that draft nothing (before a round drafts, "
                       "the rule asks whether any length is expected to beat a plain step at the pair's recent "
                       "acceptance, which it keeps between calls: `PacerStopRule.drafts_this_round`); what it still "
                       "pays is the first call's rounds that learn the pair and the rare probe rounds, each with the "
                       "draft's catch-up over the tokens it skipped.")
    if benches:
        text += ("\n\nA layer-dropped draft of `recipes/default_preverifier_data.PAIRS` is written as a model "
                       "folder for `--draft` by `python -m pacer_hf.recipes.default_preverifier_data --save-draft "
                       "PAIR DIR` (here `demo-drop10` to `runs/default_pv/drafts/demo-drop10`).")
    return text


def _intro(greedy: PacerConfig) -> str:
    calibration = greedy.calibration or {}
    return f"""---
library_name: pacer_hf
tags: [speculative-decoding, pacer, pre-verifier]
---
# Default pre-verifier (any draft)

The Pacer pre-verifier ([arXiv 2602.01274](https://arxiv.org/abs/2602.01274)) that pacer_hf uses for a draft
that has none of its own: `target.generate(**inputs, assistant_model=draft, pacer=True)` with nothing attached
to the draft runs this one, and `pacer_hf.last_stats(target).preverifier` says `"default"` (`"attached"` or
`"passed"` when a pre-verifier of the draft's own decided: one attached with `pacer_hf.attach` or passed as
`pacer=` always wins). Shipped inside the package (`hub_cards/default-preverifier`, its sampling twin in
`sampling/`), loaded once per process like the default lookup gate.

It reads only what every draft gives, so it takes any draft of any hidden size or vocabulary:

- the draft's distribution at each drafted token: log-probability of the token, entropy, top-1/top-2 margin
  (`modeling_pacer.draft_features`, `input_mode="features"`: no hidden-state input);
- the loop's state when the round starts: the previous round's accepted share, whether it accepted all
  {greedy.max_draft_tokens}, the target's probability of its last token (`loop_features=True`).

A causal layer ({greedy.hidden_size} wide) scores each of up to {greedy.max_draft_tokens} drafted tokens; the
`expected_gain` rule drafts on while a longer round is expected to yield more tokens per unit of time under the
round costs `generate` measures where it runs (a probe on first use, refined by the call's own rounds:
`last_stats(target).costs`), so it drafts only as far as the costs say pays; before a round drafts, the same rule
asks whether any length is expected to beat a plain step at the pair's acceptance, so a pair whose drafts do not pay
runs plain steps (see the measured speed below). Decoding stays exact: the target
verifies every drafted token. `config.calibration` holds the costs of a training pair on the training machine
({calibration.get('machine')}, {calibration.get('torch_threads')} thread), used only with `pacer_costs="prior"`.

Its probabilities were learned on the training pairs, so `config.online_calibration` is on: the stop rule decides on
sigmoid(a·z + b) over this model's logits z, with a and b refitted to the rounds the target verifies, kept per
pair and decoding mode between calls (`pacer_hf.last_stats(target).online_calibration`). A pair that accepts
nearly every drafted token (an int8 copy of the target) moves the map up within a few calls, so rounds grow from
one token to the lengths the costs pay for.

    import pacer_hf
    target = pacer_hf.enable(target)
    out = target.generate(**inputs, assistant_model=draft, pacer=True)   # this pre-verifier, for any draft
    pacer_hf.last_stats(target).preverifier                             # "default"

A pre-verifier fitted to the pair (hidden states included) does better where one exists: see docs/TRAINING.md.

"""


def _training_text(greedy: PacerConfig, sampling: PacerConfig | None) -> str:
    training = greedy.training
    pairs = "\n".join(f"  - `{p}`: {d}" for p, d in training["train_pairs"].items())
    rows = {m: cfg.training["metrics"]["train_rounds"] for m, cfg in (("greedy", greedy), ("sampling", sampling)) if cfg}
    data_rows = "; ".join(f"{m}: " + ", ".join(f"{p} {n}" for p, n in r.items()) for m, r in rows.items())
    answers = ANSWERS
    return f"""## Training

- Rounds along each target's own answers to TRAIN-split prompts (`collect_along_answers`, teacher-forced,
  with the loop's state), greedy rounds with hard labels for `decoding="greedy"`, T = 1 rounds with soft labels
  min(1, p/q) for the `sampling/` twin; pairs with different cost ratios and acceptance shapes:
{pairs}
- Rounds per pair (each pair capped at {training['rows_per_pair']} drawn at random): {data_rows}.
- `transformers.Trainer` (`pacer_hf.training.train.PacerTrainer`, BCE), {training['epochs']} epochs, lr
  {training['lr']}, batch {training['batch_size']}, seed {training['seed']}.
- Commands (as run: {answers}):
  `OMP_NUM_THREADS=1 python -m pacer_hf.recipes.default_preverifier_data --work-dir runs/default_pv` (stopped
  during the SmolLM2 answers on the loaded machine), then `... --targets smollm2 --greedy-answers 64
  --sampled-answers 32` (resumed: the answers already written are kept), `... --targets demo --pairs
  demo-drop10` and `... --targets qwen --greedy-answers 24 --sampled-answers 8 --threads 2`; then
  `OMP_NUM_THREADS=2 python -m pacer_hf.recipes.default_preverifier --work-dir runs/default_pv --epochs
  {training['epochs']:g} --threads 2` (the cost prior in `config.calibration` kept from the earlier 1-thread run).

"""


MEASURED_BEFORE_THE_MAP = ("Measured before `online_calibration`; with it, on a 2-core Intel Xeon: "
                           "docs/benchmarks/xeon/default_online in pacer_hf's repository (its "
                           "docs/YOUR_PAIR.md).")


def write_card(folder: Path | None = None, benches: list[tuple[Path, str]] = ()) -> Path:
    """README.md of the default pre-verifier; `benches`: (`pacer-hf bench` folder, how the card names its held-out
    pair), one section each."""
    folder = Path(folder) if folder else hub_cards_dir() / DEFAULT_PREVERIFIER
    greedy = PacerConfig.from_pretrained(folder)
    sampling_dir = folder / DEFAULT_PREVERIFIER_SAMPLING
    sampling = PacerConfig.from_pretrained(sampling_dir) if (sampling_dir / "config.json").is_file() else None
    training = greedy.training
    bench_text = _bench_text(benches)
    text = _intro(greedy) + _training_text(greedy, sampling) + f"""## Held-out pairs

Greedy (`decoding="greedy"`):

{_metrics_rows(training)}
"""
    if sampling:
        text += ("\nSampling (`sampling/`, soft labels; AUC counts them as weighted 1s and 0s):\n\n"
                 f"{_metrics_rows(sampling.training)}\n")
    text += f"\n## Measured speed (wall clock)\n\n{MEASURED_BEFORE_THE_MAP}\n\n{bench_text}\n"
    path = folder / "README.md"
    path.write_text(text)
    if sampling:
        (sampling_dir / "README.md").write_text(
            "# Default pre-verifier for sampled rounds\n\nThe `do_sample=True` twin of the default pre-verifier "
            "(trained on T = 1 rounds with soft labels); see ../README.md. Like it, it is recalibrated online to the "
            "pair it runs\n(`config.online_calibration`), per decoding mode.\n")
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--folder", default=None, help="default: hub_cards/default-preverifier")
    parser.add_argument("--bench", nargs=2, action="append", default=[], metavar=("FOLDER", "PAIR"),
                        help="a `pacer-hf bench` folder of this pre-verifier and how the card names its pair "
                             "(repeatable)")
    args = parser.parse_args(argv)
    print(f"wrote {write_card(args.folder, [(Path(f), pair) for f, pair in args.bench])}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
