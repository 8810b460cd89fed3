"""Put a benchmark's measured speeds into a shipped pre-verifier's card.

    python scripts/card_speedups.py hub_cards/qwen-coder-preverifier docs/benchmarks/qwen_coder/horizon_bench \
        --temperature 0 --where "2-core Intel Xeon VM, nothing else running"

Reads the benchmark folder's `results.json` and `run.json` (written by `pacer-hf bench --out`), keeps, per category
at the given temperature, Pacer, the best fixed γ of that category and transformers' own schedules, and writes them
with the command and the machine to the card's `pacer_metrics.json`; then re-renders the card's README.md (the
"Measured speedup" section reads them; the card's `datasets` metadata is kept).
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

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


def card_datasets(readme: Path) -> list[str]:
    """The `datasets` list of a rendered card's YAML header (kept when the card is rendered again)."""
    if not readme.is_file():
        return []
    return list(ModelCard.load(readme).data.to_dict().get("datasets") or [])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("card", type=Path, help="a shipped pre-verifier folder (hub_cards/...)")
    parser.add_argument("bench", type=Path, help="a `pacer-hf bench --out` folder (results.json, run.json)")
    parser.add_argument("--temperature", type=float, required=True, help="the rows' temperature (0 or 1)")
    parser.add_argument("--where", required=True, help="what else the machine was doing (one phrase)")
    args = parser.parse_args()
    results, run = load_results(args.bench)
    machine = run["machine"]
    hardware = (f"{machine['physical_cores']}-core {machine['cpu']}, {machine['torch_threads']} torch thread(s), torch "
                f"{machine['torch']}, transformers {machine['transformers']}, {run['dtype'].removeprefix('torch.')}")
    command = re.sub(r"--out \S+", f"--out {args.bench}", run["command"])  # where the results are kept
    datasets = card_datasets(args.card / "README.md")
    metrics = {"command": command, "hardware": hardware, "conditions": args.where,
               "speedup": speedup_rows(results, args.temperature)}
    if datasets:
        metrics["datasets"] = datasets
    (args.card / METRICS_FILE).write_text(json.dumps(metrics, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    (args.card / "README.md").write_text(render_preverifier_card(args.card, datasets=datasets), encoding="utf-8")
    print(f"{args.card}: {len(metrics['speedup'])} measured rows")


if __name__ == "__main__":
    main()
