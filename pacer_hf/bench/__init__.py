"""Benchmark every strategy side by side (Spec-Bench style) against HF's own schedules and the oracle.

Python API: `run_benchmark(target, draft, prompts, BenchConfig(...), preverifier=...)` returns a
`BenchResult`; `write_outputs(result, out_dir, ...)` writes results.json, results.md and plots.
"""

from ..data.prompts import CATEGORIES, Prompt, build_prompts
from .cli import add_arguments, run
from .runner import BenchConfig, BenchmarkMismatch, BenchResult, run_benchmark
from .strategy_calls import Strategy, available_strategy_names, resolve_strategies

__all__ = ["CATEGORIES", "add_arguments", "run", "BenchConfig", "BenchResult", "BenchmarkMismatch", "Prompt", "Strategy",
           "available_strategy_names", "build_prompts", "resolve_strategies", "run_benchmark"]
