"""PEARL's config (what `pacer=PearlConfig(...)` and the presets hold) and its per-call stats."""

from __future__ import annotations

import multiprocessing
from dataclasses import dataclass, field
from typing import ClassVar

from ...stats import PacerStats
from ..registry import StrategyConfig


@dataclass(frozen=True)
class PearlConfig(StrategyConfig):
    """PEARL options. `gamma=None` measures the target/draft step-time ratio (once per model pair)."""

    strategy_type: ClassVar[str] = "pearl"

    gamma: int | None = None
    max_gamma: int = 8
    parallel: bool = True
    # "process": a forked worker process (CPU; needs fork); "thread": a worker thread (+ side CUDA stream on
    # a GPU); "auto": process for a CPU draft on Linux with draft_threads == 1, else thread.
    worker: str = "auto"
    draft_threads: int = 1  # intra-op threads of the draft worker (CPU); the target keeps the caller's
    use_preverifier: bool = False  # "pacer+pearl": the Pacer pre-verifier may end a job early
    timeout_s: float = 120.0  # a job taking longer than this is reported as a hang, never waited on forever
    # Not in the paper: after a miss, draft this many tokens serially so the round is an SD round
    # instead of a 1-token pre-verify round (0 = PEARL as published).
    resync_tokens: int = 0
    switch_interval_s: float | None = 0.0005  # GIL switch interval while the worker thread runs (None: leave as is)

    def __post_init__(self) -> None:
        if self.gamma is not None and self.gamma < 2:
            raise ValueError(f"PEARL gamma must be >= 2 (one token is checked, the rest are candidates); got {self.gamma}.")
        if self.max_gamma < 2 or self.draft_threads < 1 or self.timeout_s <= 0 or self.resync_tokens < 0:
            raise ValueError("PearlConfig: max_gamma >= 2, draft_threads >= 1, timeout_s > 0 and resync_tokens >= 0 "
                             "are required.")
        if self.worker not in ("auto", "process", "thread"):
            raise ValueError(f"PearlConfig.worker must be 'auto', 'process' or 'thread'; got {self.worker!r}.")
        if self.worker == "process" and self.draft_threads != 1:
            raise ValueError("PearlConfig: worker='process' drafts with one intra-op thread (OpenMP is not fork-safe "
                             "with more); use worker='thread' for draft_threads > 1.")
        if self.worker == "process" and "fork" not in multiprocessing.get_all_start_methods():
            raise ValueError("PearlConfig: worker='process' needs the 'fork' start method, which this platform "
                             "lacks; use worker='thread'.")


@dataclass
class PearlStats(PacerStats):
    """PacerStats plus PEARL's rounds. `draft_lengths[i]` = candidates sent in round i (0 = pre-verify round).

    `job_seconds[i]` is the draft-ahead job launched in round i, `target_seconds[i]` the time from
    round i's candidates to its `update_candidate_strategy` (the target forward and HF's accept step).
    """

    gamma: int = 0
    parallel: bool = True
    worker: str = ""  # "process", "thread" or "sequential"
    jobs: int = 0
    jobs_kept: int = 0
    jobs_cancelled: int = 0
    draft_tokens_wasted: int = 0
    wait_seconds: float = 0.0
    resync_seconds: float = 0.0
    worker_start_seconds: float = 0.0  # starting the worker (fork for the process worker), once per call
    job_seconds: list[float] = field(default_factory=list)
    target_seconds: list[float] = field(default_factory=list)

    @property
    def modelled_seconds(self) -> float:
        """Wall time if each round's job and target forward overlapped perfectly (from a sequential run)."""
        rounds = min(len(self.job_seconds), len(self.target_seconds))
        serial = self.seconds - sum(self.job_seconds) - sum(self.target_seconds)
        overlapped = sum(max(self.job_seconds[i], self.target_seconds[i]) for i in range(rounds))
        rest = sum(self.job_seconds[rounds:]) + sum(self.target_seconds[rounds:])
        return serial + overlapped + rest

    def to_dict(self) -> dict:
        return {**super().to_dict(), "modelled_seconds": self.modelled_seconds}
