"""Put a benchmark's measured speeds into a shipped pre-verifier's card.

    python scripts/card_speedups.py hub_cards/qwen-coder-preverifier docs/benchmarks/qwen_coder/horizon_bench \
        --temperature 0 --where "2-core Intel Xeon VM, nothing else running"

    python scripts/card_speedups.py hub_cards/demo-preverifier docs/BENCHMARKS.md --temperature 0,1 \
        --where "nothing else running" --hardware "2-core AMD EPYC CPU, 1 torch thread, torch 2.13 CPU, ..."

Reads the benchmark folder's `results.json` and `run.json` (written by `pacer-hf bench --out`), or the page
`pacer-hf bench --write-docs` generated from one (its tables and command; the hardware then given), keeps, per
category at each given temperature, Pacer, the best fixed γ of that category and transformers' own schedules, and writes them
with the command and the machine to the card's `pacer_metrics.json`; then re-renders the card's README.md (the
"Measured speedup" section reads them; the card's `datasets` metadata is kept).
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from check_figures import report_rows  # this folder: one reader of a bench report page's tables
from huggingface_hub import ModelCard

from pacer_hf.bench.report import load_results
from pacer_hf.hub.publish import METRICS_FILE, render_preverifier_card

KEPT = ("pacer", "hf-confidence", "hf-heuristic")


def speedup_rows(results: list[dict], temperature: float) -> list[dict]:
    """Per category: Pacer, the best sd-fixed-<γ> of the category, and the hf-* schedules the run measured."""
    chosen = [r for r in results if float(r["temperature"]) == temperature]
    if not any(r["strategy"] == "pacer" for r in chosen):
        raise SystemExit(f"the results hold no pacer row at temperature {temperature}")
    rows = []
    for category in dict.fromkeys(r["category"] for r in chosen):
        here = [r for r in chosen if r["category"] == category]
        fixed = [r for r in here if r["strategy"].startswith("sd-fixed-")]
        best = [max(fixed, key=lambda r: r["speedup_vs_ar"])] if fixed else []
        for r in [r for r in here if r["strategy"] in KEPT] + best:
            rows.append({"category": category, "method": r["strategy"], "temperature": temperature,
                         "speedup": round(r["speedup_vs_ar"], 2), "tokens_per_s": round(r["tokens_per_s"], 2),
                         "mean_draft": None if r.get("mean_draft_len") is None else round(r["mean_draft_len"], 2)})
    return rows


def report_results(page: Path) -> tuple[list[dict], str]:
    """The records and the command of a page `pacer-hf bench --write-docs` wrote (docs/BENCHMARKS.md): one per table
    row, under "### <category>, greedy" or "### <category>, sampling T=<t>"."""
    text = page.read_text(encoding="utf-8")
    command = re.search(r"```\n(pacer-hf bench [^\n]*)\n```", text).group(1)
    records = []
    for category, temperature, row in report_rows(text):
        speed, rate = row["speedup vs ar (min–max)"].split()[0], row["tokens/s (min–max)"].split()[0]
        if re.fullmatch(r"[\d.]+", speed) and "(modelled)" not in row["speedup vs ar (min–max)"]:
            mean = row.get("mean L", "–")
            records.append({"strategy": row["strategy"], "category": category, "temperature": temperature,
                            "speedup_vs_ar": float(speed), "tokens_per_s": float(rate),
                            "mean_draft_len": float(mean) if re.fullmatch(r"[\d.]+", mean) else None})
    return records, command


def card_datasets(readme: Path) -> list[str]:
    """The `datasets` list of a rendered card's YAML header (kept when the card is rendered again)."""
    if not readme.is_file():
        return []
    return list(ModelCard.load(readme).data.to_dict().get("datasets") or [])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("card", type=Path, help="a shipped pre-verifier folder (hub_cards/...)")
    parser.add_argument("bench", type=Path, help="a `pacer-hf bench --out` folder (results.json, run.json), or the "
                        "page `--write-docs` generated from one")
    parser.add_argument("--temperature", required=True, help="the rows' temperatures (0, 1 or 0,1)")
    parser.add_argument("--where", required=True, help="what else the machine was doing (one phrase)")
    parser.add_argument("--hardware", help="the machine, for a generated page (a bench folder's run.json says it)")
    args = parser.parse_args()
    if args.bench.is_file():
        if not args.hardware:
            raise SystemExit("a generated page does not record the dtype: pass --hardware")
        results, command = report_results(args.bench)
        hardware = args.hardware
    else:
        results, run = load_results(args.bench)
        machine = run["machine"]
        hardware = (f"{machine['physical_cores']}-core {machine['cpu']}, {machine['torch_threads']} torch thread(s), "
                    f"torch {machine['torch']}, transformers {machine['transformers']}, "
                    f"{run['dtype'].removeprefix('torch.')}")
        command = re.sub(r"--out \S+", f"--out {args.bench}", run["command"])  # where the results are kept
    datasets = card_datasets(args.card / "README.md")
    temperatures = [float(t) for t in args.temperature.split(",")]
    rows = [row for t in temperatures for row in speedup_rows(results, t)]
    order = list(dict.fromkeys(row["category"] for row in rows))
    rows.sort(key=lambda row: (order.index(row["category"]), temperatures.index(row["temperature"])))
    metrics = {"command": command, "hardware": hardware, "conditions": args.where, "speedup": rows}
    if datasets:
        metrics["datasets"] = datasets
    (args.card / METRICS_FILE).write_text(json.dumps(metrics, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    (args.card / "README.md").write_text(render_preverifier_card(args.card, datasets=datasets), encoding="utf-8")
    print(f"{args.card}: {len(metrics['speedup'])} measured rows")


if __name__ == "__main__":
    main()
