"""PNG plots of a benchmark run: speedup bars per category, draft-length histograms (Pacer vs oracle vs fixed).

Needs matplotlib (the `bench` extra); `pacer-hf bench` checks for it before running and skips the plots
with a note when it is missing.
"""

from __future__ import annotations

from pathlib import Path

try:
    import matplotlib
except ImportError as error:
    raise ImportError("pacer_hf.bench.plots needs matplotlib: pip install 'pacer-hf[bench]' (or write results "
                      "without plots: write_outputs(..., plots=False), `pacer-hf bench --no-plots`).") from error

matplotlib.use("Agg")  # files only; no display on benchmark machines
import matplotlib.pyplot as plt  # noqa: E402

# ar/sd-fixed green, HF's generators orange, Pacer blue, PEARL/Ouroboros purple, the (modelled) oracle grey
FAMILY_COLORS = {"ar": "#2ca02c", "sd-fixed": "#2ca02c", "hf": "#ff7f0e", "pacer": "#1f77b4",
                 "registered": "#9467bd", "oracle": "#999999"}


def _cells(records: list[dict]) -> tuple[list[str], list[float]]:
    return list(dict.fromkeys(r["category"] for r in records)), list(dict.fromkeys(r["temperature"] for r in records))


def speedup_bars(records: list[dict], out: Path) -> list[Path]:
    """One figure per temperature; one panel per category; median speedup vs ar with min–max error bars."""
    categories, temperatures = _cells(records)
    paths = []
    for temperature in temperatures:
        fig, axes = plt.subplots(len(categories), 1, figsize=(10, 3.2 * len(categories)), squeeze=False)
        for ax, category in zip(axes[:, 0], categories):
            rows = [r for r in records if r["category"] == category and r["temperature"] == temperature]
            values = [r["speedup_vs_ar"] or 0.0 for r in rows]
            low = [v - (r["speedup_vs_ar_min"] if r.get("speedup_vs_ar_min") is not None else v)
                   for v, r in zip(values, rows)]
            high = [(r["speedup_vs_ar_max"] if r.get("speedup_vs_ar_max") is not None else v) - v
                    for v, r in zip(values, rows)]
            colors = [FAMILY_COLORS.get(r["family"], "#2ca02c") for r in rows]
            ax.bar(range(len(rows)), values, yerr=[low, high], color=colors, capsize=2)
            ax.axhline(1.0, color="black", linewidth=0.8)
            ax.set_xticks(range(len(rows)), [r["strategy"] for r in rows], rotation=45, ha="right", fontsize=8)
            ax.set_ylabel("speedup vs ar")
            ax.set_title(f"{category} ({'greedy' if temperature == 0 else f'T={temperature:g}'})", fontsize=10)
        fig.tight_layout()
        path = out / f"speedup_T{temperature:g}.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        paths.append(path)
    return paths


def draft_length_histograms(records: list[dict], out: Path) -> list[Path]:
    """Draft length per round: Pacer (if run) vs the oracle vs the best fixed γ, one panel per category."""
    categories, temperatures = _cells(records)
    paths = []
    for temperature in temperatures:
        fig, axes = plt.subplots(1, len(categories), figsize=(4 * len(categories), 3.2), squeeze=False)
        for ax, category in zip(axes[0], categories):
            rows = {r["strategy"]: r for r in records if r["category"] == category and r["temperature"] == temperature}
            best = next(iter(rows.values())).get("best_fixed")
            series = [(name, rows[name]) for name in dict.fromkeys(("pacer", "oracle", best))
                      if name and name in rows and rows[name]["draft_len_hist"]]
            width = 0.8 / max(1, len(series))
            for i, (name, row) in enumerate(series):
                hist = {int(k): v for k, v in row["draft_len_hist"].items()}
                total = sum(hist.values())
                xs = list(range(0, max(hist) + 1))
                ax.bar([x - 0.4 + width * (i + 0.5) for x in xs], [hist.get(x, 0) / total for x in xs],
                       width=width, label=name)
            ax.set_xlabel("draft length per round")
            ax.set_ylabel("fraction of rounds")
            ax.set_title(f"{category} ({'greedy' if temperature == 0 else f'T={temperature:g}'})", fontsize=10)
            ax.legend(fontsize=8)
        fig.tight_layout()
        path = out / f"draft_lengths_T{temperature:g}.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        paths.append(path)
    return paths
