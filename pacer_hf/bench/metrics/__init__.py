"""`evaluate` metric modules shipped with pacer_hf; `SPECULATIVE_STATS` is the folder to `evaluate.load`."""

from pathlib import Path

SPECULATIVE_STATS = str(Path(__file__).resolve().parent / "speculative_stats")
