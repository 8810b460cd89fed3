"""scripts/check_figures.py: speed figures in the docs traced to results files under docs/benchmarks/."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "check_figures.py"


@pytest.fixture
def figures(tmp_path, monkeypatch):
    """The checker over a tiny repository: one bench results folder, an empty baseline."""
    spec = importlib.util.spec_from_file_location("check_figures", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "ROOT", tmp_path)
    monkeypatch.setattr(module, "BASELINE", tmp_path / "baseline.json")
    run = tmp_path / "docs" / "benchmarks" / "run"
    run.mkdir(parents=True)
    records = [{"strategy": s, "category": c, "temperature": 0.0, "speedup_vs_ar": v, "speedup_vs_best_fixed": b}
               for s, c, v, b in [("pacer", "a", 2.4812, 1.1), ("hf-confidence", "a", 2.0, 0.9),
                                  ("pacer", "b", 1.5, 1.2), ("hf-confidence", "b", 1.25, 1.0)]]
    (run / "results.json").write_text(json.dumps(records))
    (tmp_path / "hub_cards").mkdir()
    return module


def page(root: Path, text: str) -> None:
    (root / "README.md").write_text(text, encoding="utf-8")


def test_a_declared_figure_must_be_in_its_results(figures, tmp_path):
    page(tmp_path, "<!-- figures: docs/benchmarks/run -->\nPacer ran at 2.48× (b: 1.50×).\n")
    assert figures.main([]) == 0
    page(tmp_path, "<!-- figures: docs/benchmarks/run -->\nPacer ran at 2.58×.\n")
    assert figures.main([]) == 1
    page(tmp_path, "<!-- figures: docs/benchmarks/elsewhere -->\nPacer ran at 2.48×.\n")
    assert figures.main([]) == 1, "a source that does not exist"


def test_derived_figures_are_traced(figures, tmp_path):
    """Medians over categories and Pacer over transformers' schedule in a cell: what the docs quote."""
    page(tmp_path, "<!-- figures: docs/benchmarks/run -->\nmedian 1.99×; 1.24× and 1.20× HF's schedule (median 1.22×)\n")
    assert figures.main([]) == 0


def test_untraced_figures_are_held_to_the_baseline(figures, tmp_path):
    page(tmp_path, "A figure from nowhere: 3.14×.\n\nA paragraph citing docs/benchmarks/run: 2.48×.\n")
    assert figures.main([]) == 1
    (tmp_path / "baseline.json").write_text(json.dumps({"README.md": ["3.14"]}))
    assert figures.main([]) == 0
    page(tmp_path, "Two figures from nowhere: 3.14× and 2.72×.\n")
    assert figures.main([]) == 1, "a new untraced figure"
    page(tmp_path, "<!-- figures: -->\nMarked untraced: 3.14×.\n")
    assert figures.main([]) == 0


def test_a_card_quotes_the_results_of_its_command(figures, tmp_path):
    card = tmp_path / "hub_cards" / "pv"
    card.mkdir()
    page(tmp_path, "no figures\n")
    row = {"method": "pacer", "category": "a", "temperature": 0.0, "speedup": 2.48}
    metrics = {"command": "pacer-hf bench --out docs/benchmarks/run", "speedup": [row]}
    (card / "pacer_metrics.json").write_text(json.dumps(metrics))
    assert figures.main([]) == 0
    (card / "pacer_metrics.json").write_text(json.dumps({**metrics, "speedup": [{**row, "speedup": 2.16}]}))
    assert figures.main([]) == 1
    (card / "pacer_metrics.json").write_text(json.dumps({**metrics, "command": "pacer-hf bench --out bench_out/x"}))
    assert figures.main([]) == 1, "results kept nowhere under docs/"


def test_the_repository_figures_are_traced_or_in_the_baseline():
    spec = importlib.util.spec_from_file_location("check_figures", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main([]) == 0
