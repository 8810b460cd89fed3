"""PEARL (arXiv 2408.11850) inside `generate`: the draft drafts round k+1 while the target verifies round k.

`target.generate(ids, assistant_model=draft, pacer="pearl")`. HF's `_assisted_decoding` stays the
verifier; only the candidate generator changes. Each `get_candidates` call:

1. waits for the draft-ahead job launched in the previous call (it ran during the target forward);
2. keeps the job's tokens only when they continue from the token the target settled on: every
   candidate of the last round was accepted *and* the job's first token equals HF's bonus token.
   The job's remaining tokens become this round's candidates ("post-verify"); otherwise there are
   none and the target forwards a single token ("pre-verify") while the draft drafts ahead;
3. launches the next job from the optimistic prefix (input + candidates) on a worker thread, so it
   overlaps the target forward that HF runs next, and returns.

Why it stays exact: greedy candidates are only ever accepted by HF's argmax match. Under sampling the
draft samples from its processed distribution q with its own per-job-seeded `torch.Generator` (the
global RNG belongs to the target's sampling in the caller's thread), the keep decision depends only
on the job's first token and the target's token, so kept candidates are distributed exactly as
q-drafts from the current prefix, and their q logits are the ones they were sampled from.
See docs/PEARL.md for the concurrency model and measurements.
"""

from __future__ import annotations

import queue
import sys
import threading
import time
import warnings
import weakref
from dataclasses import dataclass, field

import torch
from transformers import PreTrainedModel

from ._hf_compat import crop_cache
from .candidate_generator import PacerCandidateGenerator, PacerStoppingCriteria
from .generation import STRATEGIES, StrategyCall, _check_preverifier, _generation_value
from .stats import PacerStats
from .timing import cached_forward_timer

__all__ = ["PearlCandidateGenerator", "PearlConfig", "PearlStats", "measure_gamma", "register"]


@dataclass(frozen=True)
class PearlConfig:
    """PEARL options. `gamma=None` measures the target/draft step-time ratio (once per model pair)."""

    gamma: int | None = None
    max_gamma: int = 8
    parallel: bool = True
    draft_threads: int = 1  # intra-op threads of the draft worker (CPU); the target keeps the caller's
    use_preverifier: bool = False  # "pacer+pearl": the attached Pacer pre-verifier may end a job early
    timeout_s: float = 120.0  # a job taking longer than this is reported as a hang, never waited on forever
    # Not in the paper: after a miss, draft this many tokens serially so the round is an SD round
    # instead of a 1-token pre-verify round (0 = PEARL as published).
    resync_tokens: int = 0
    switch_interval_s: float | None = 0.0005  # GIL switch interval while the worker runs (None: leave as is)

    def __post_init__(self) -> None:
        if self.gamma is not None and self.gamma < 2:
            raise ValueError(f"PEARL gamma must be >= 2 (one token is checked, the rest are candidates); got {self.gamma}.")
        if self.max_gamma < 2 or self.draft_threads < 1 or self.timeout_s <= 0 or self.resync_tokens < 0:
            raise ValueError("PearlConfig: max_gamma >= 2, draft_threads >= 1, timeout_s > 0 and resync_tokens >= 0 "
                             "are required.")


@dataclass
class PearlStats(PacerStats):
    """PacerStats plus PEARL's rounds. `draft_lengths[i]` = candidates sent in round i (0 = pre-verify round).

    `job_seconds[i]` is the draft-ahead job launched in round i, `target_seconds[i]` the time from
    round i's candidates to its `update_candidate_strategy` (the target forward and HF's accept step).
    """

    gamma: int = 0
    parallel: bool = True
    jobs: int = 0
    jobs_kept: int = 0
    jobs_cancelled: int = 0
    draft_tokens_wasted: int = 0
    wait_seconds: float = 0.0
    resync_seconds: float = 0.0
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


_JOIN_TIMEOUT_S = 5.0
_RESYNC_SEED_OFFSET = 1 << 40  # resync drafts use their own seed stream, disjoint from the jobs'


class _Job:
    """One draft-ahead request: draft up to `budget` tokens after `seq` (the optimistic prefix)."""

    __slots__ = ("seq", "budget", "seed", "tokens", "scores", "done", "error", "cancelled", "cut", "expected_first",
                 "seconds", "ready", "waited")

    def __init__(self, seq: torch.Tensor, budget: int, seed: int):
        self.seq, self.budget, self.seed = seq, budget, seed
        self.tokens: list[int] = []
        self.scores: list[torch.Tensor] = []
        self.done = threading.Event()
        self.error: BaseException | None = None
        self.cancelled = False  # set by the caller: the job can no longer be kept
        self.cut = False  # set by the worker: it stopped early because of `cancelled`
        self.waited = False
        self.expected_first: int | None = None
        self.seconds = 0.0
        self.ready = None  # CUDA event: `seq` is ready on the caller's stream


class PearlCandidateGenerator(PacerCandidateGenerator):
    """Draft-ahead candidate generator; a worker thread owns the draft (its cache, buffer, RNG) while a job runs.

    Ownership rule: the caller's thread touches `self.cache`/`self.ids` only when no job is in flight.
    """

    def __init__(self, *args, config: PearlConfig, gamma: int, stats: PearlStats,
                 stopping_criteria: PacerStoppingCriteria | None = None, seed: int = 0, **kwargs):
        super().__init__(*args, max_draft_tokens=gamma, stats=stats, stopping_criteria=stopping_criteria, **kwargs)
        self.config = config
        self.gamma = gamma
        self.job: _Job | None = None
        self.pending = 0  # candidates sent in the current round
        self.round = 0
        self.seed = seed
        self.rng = torch.Generator(device=self.draft.device) if self.do_sample else None
        self.sent_at = 0.0
        self.worker: threading.Thread | None = None
        self.requests: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self.cuda = self.draft.device.type == "cuda" and torch.cuda.is_available()
        self.stream = torch.cuda.Stream(device=self.draft.device) if (self.cuda and config.parallel) else None
        self.main_stream = torch.cuda.current_stream(self.draft.device) if self.stream is not None else None
        self.launched: list[_Job | None] = []  # the job launched in each round (None: none launched)
        self.old_switch_interval: float | None = None

    # ----------------------------------------------------------------- caller's thread
    @torch.no_grad()
    def get_candidates(self, input_ids: torch.LongTensor, **kwargs) -> tuple[torch.LongTensor, torch.Tensor | None]:
        cur_len = input_ids.shape[1]
        self.stats.target_forwards += 1
        job, self.job = self.job, None
        pending, scores = None, None
        if job is not None:
            self._wait(job)
            if self._continues(job, input_ids):
                self.stats.jobs_kept += 1
                pending = torch.tensor([job.tokens[1:]], dtype=input_ids.dtype, device=input_ids.device)
                scores = torch.stack(job.scores[1:], dim=1) if self.do_sample else None
            else:
                self.stats.draft_tokens_wasted += len(job.tokens)
                if self.cache is not None:  # roll the draft back to the accepted prefix (worker is idle)
                    crop_cache(self.cache, min(self.cache.get_seq_length(), cur_len - 1))
                pending, scores = self._resync(input_ids)
        candidates = input_ids if pending is None else torch.cat([input_ids, pending], dim=1)
        self.pending = 0 if pending is None else pending.shape[1]
        self.stats.draft_lengths.append(self.pending)
        budget = min(self.gamma, self.main_model_max_length - candidates.shape[1] - 1)
        launched = None
        if budget >= 2:  # a job of one token could only be pre-verified, never sent
            launched = _Job(candidates.clone(), budget, self.seed + self.round)
            self._launch(launched)
        self.launched.append(launched)
        self.round += 1
        self.sent_at = time.perf_counter()
        return candidates, scores

    def update_candidate_strategy(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, num_matches) -> None:
        """Record the round; cancel the in-flight job early when it can no longer be kept."""
        self.stats.target_seconds.append(time.perf_counter() - self.sent_at)
        matches = int(num_matches)
        self.stats.accepted.append(matches)
        job = self.job
        if job is None:
            return
        if matches < self.pending:
            job.cancelled = True
        else:
            target_token = int(input_ids[0, -1])
            job.expected_first = target_token
            if job.tokens and job.tokens[0] != target_token:
                job.cancelled = True

    def _resync(self, input_ids: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """After a miss, optionally draft `resync_tokens` now (serially) so the round still verifies candidates."""
        budget = min(self.config.resync_tokens, self.main_model_max_length - input_ids.shape[1] - 1)
        if budget < 1:
            return None, None
        job = _Job(input_ids.clone(), budget, self.seed + _RESYNC_SEED_OFFSET + self.round)
        start = time.perf_counter()
        self._draft(job)  # the worker is idle: the caller's thread may use the draft
        self.stats.resync_seconds += time.perf_counter() - start
        pending = torch.tensor([job.tokens], dtype=input_ids.dtype, device=input_ids.device)
        return pending, torch.stack(job.scores, dim=1) if self.do_sample else None

    def _continues(self, job: _Job, input_ids: torch.Tensor) -> bool:
        seq_len = job.seq.shape[1]
        return (
            len(job.tokens) >= 2
            and input_ids.shape[1] == seq_len + 1
            and job.tokens[0] == int(input_ids[0, -1])
            and torch.equal(job.seq[0], input_ids[0, :-1].to(job.seq.device))
        )

    def _launch(self, job: _Job) -> None:
        self.stats.jobs += 1
        if not self.config.parallel:  # same job, run in the caller's thread before the target forward
            self._run(job)
            self.job = job
            if job.error is not None:
                self._wait(job)
            return
        if self.worker is None:
            self._start_worker()
        if self.stream is not None:  # CUDA: the side stream starts once `seq` is ready on the caller's stream
            job.ready = torch.cuda.Event()
            job.ready.record(self.main_stream)
            job.seq.record_stream(self.stream)
        self.job = job
        self.requests.put(job)

    def _wait(self, job: _Job) -> None:
        start = time.perf_counter()
        deadline = start + self.config.timeout_s
        while not job.done.wait(0.05):
            if self.worker is not None and not self.worker.is_alive():
                raise RuntimeError("PEARL draft worker thread died without reporting an error.")
            if time.perf_counter() > deadline:
                job.cancelled = True
                raise TimeoutError(
                    f"PEARL draft job did not finish within timeout_s={self.config.timeout_s}s; "
                    "raise PearlConfig.timeout_s for very slow drafts."
                )
        if job.waited:
            return
        job.waited = True
        self.stats.wait_seconds += time.perf_counter() - start
        if job.error is not None:
            raise RuntimeError(f"PEARL draft worker failed: {type(job.error).__name__}: {job.error}") from job.error
        if job.cut:
            self.stats.jobs_cancelled += 1

    def _start_worker(self) -> None:
        if self.config.switch_interval_s is not None:
            self.old_switch_interval = sys.getswitchinterval()
            sys.setswitchinterval(self.config.switch_interval_s)
        # Autograd modes are thread-local: the worker must draft in the caller's mode, or tensors made
        # under the caller's torch.inference_mode() cannot be updated by the worker.
        self.inference_mode = torch.is_inference_mode_enabled()
        self.worker = threading.Thread(target=self._serve, name="pacer-hf-pearl-draft", daemon=True)
        self.worker.start()

    def close(self) -> None:
        """Stop and join the worker (runs when generate returns or raises)."""
        if self.job is not None:
            self.job.cancelled = True
        worker, self.worker = self.worker, None
        if worker is not None:
            self.requests.put(None)
            worker.join(timeout=_JOIN_TIMEOUT_S)  # a cancelled job stops after its current draft step
            if worker.is_alive():
                warnings.warn(f"PEARL draft worker did not stop within {_JOIN_TIMEOUT_S}s (a draft forward is stuck); "
                              "it is a daemon thread and will not block interpreter exit.", RuntimeWarning, stacklevel=2)
        if self.old_switch_interval is not None:
            sys.setswitchinterval(self.old_switch_interval)
            self.old_switch_interval = None
        self.job = None
        self.cache = None
        self.stats.job_seconds.extend(job.seconds if job is not None and job.done.is_set() else 0.0
                                      for job in self.launched)
        self.launched.clear()

    # ----------------------------------------------------------------- worker thread
    def _serve(self) -> None:
        torch.set_num_threads(self.config.draft_threads)  # per-thread on OpenMP builds: the caller keeps its own
        with torch.inference_mode(self.inference_mode):
            while (job := self.requests.get()) is not None:
                self._run(job)

    def _run(self, job: _Job) -> None:
        start = time.perf_counter()
        try:
            if job.ready is not None and self.stream is not None:
                self.stream.wait_event(job.ready)
                with torch.cuda.stream(self.stream):
                    self._draft(job)
                for tensor in job.scores:  # freed later on the caller's stream: tell the allocator
                    tensor.record_stream(self.main_stream)
                self.stream.synchronize()
            else:
                self._draft(job)
        except BaseException as error:  # noqa: BLE001 - reported to the caller's thread by _wait
            job.error = error
        finally:
            job.seconds = time.perf_counter() - start
            job.done.set()

    @torch.no_grad()
    def _draft(self, job: _Job) -> None:
        """Draft up to `job.budget` tokens after `job.seq` with the shared drafting loop (off-thread)."""
        if self.rng is not None:
            self.rng.manual_seed(job.seed)
        if job.cancelled:
            job.cut = True
            return

        def interrupt(n: int, token: int) -> bool:
            if job.cancelled or (n == 1 and job.expected_first is not None and token != job.expected_first):
                job.cancelled = job.cut = True
            return job.cut

        n, processed = super()._draft(job.seq, job.budget, generator=self.rng, interrupt=interrupt)
        kept = max(1, n) if processed else 0  # the first token is always kept: it is what pre-verify checks
        seq_len = job.seq.shape[1]
        job.tokens = self.ids[0, seq_len : seq_len + kept].tolist()
        job.scores = processed[:kept] if self.do_sample else []


# --------------------------------------------------------------------- gamma
# target -> draft -> (dtypes, devices, threads, cap) -> gamma; weak, so freed models drop their entries
_GAMMA_CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _step_seconds(model: PreTrainedModel, tokens: int, reps: int = 7, context: int = 32) -> float:
    """Fastest of `reps` cached forwards over `tokens` new tokens after a `context`-token prefix.

    The minimum, not the median: on a shared machine other jobs only ever add time.
    """
    once = cached_forward_timer(model, tokens, context)
    once()  # warm-up
    return min(once() for _ in range(reps))


def measure_gamma(target: PreTrainedModel, draft: PreTrainedModel, max_gamma: int = 8) -> int:
    """PEARL's gamma: the target/draft step-time ratio (one cached token each), clamped to [2, max_gamma].

    Cached per model pair and thread count. The paper's scripts use 3-5; a large ratio with a
    mediocre draft loses more per miss than it hides, hence the default cap of 8 (see docs/PEARL.md).
    """
    per_pair = _GAMMA_CACHE.setdefault(target, weakref.WeakKeyDictionary()).setdefault(draft, {})
    key = (target.dtype, draft.dtype, target.device, draft.device, torch.get_num_threads(), max_gamma)
    if key not in per_pair:
        ratio = _step_seconds(target, 1) / _step_seconds(draft, 1)
        per_pair[key] = max(2, min(max_gamma, round(ratio)))
    return per_pair[key]


# --------------------------------------------------------------------- registration
def _builder(name: str, config: PearlConfig):
    def build(model: PreTrainedModel, draft: PreTrainedModel, kwargs: dict) -> StrategyCall:
        stop = None
        do_sample = bool(_generation_value(model, kwargs, "do_sample"))
        gamma = config.gamma
        if config.use_preverifier:
            preverifier = getattr(draft, "_pacer_preverifier", None)
            if preverifier is None:
                raise ValueError(f"pacer={name!r} uses the pre-verifier attached to the draft, and this draft has "
                                 "none: call pacer_hf.attach(draft, preverifier) first.")
            _check_preverifier(preverifier, draft)
            if preverifier.config.trim_failed_block and do_sample:
                raise ValueError(f"pacer={name!r}: the pre-verifier has trim_failed_block=True, which is exact only "
                                 "for greedy decoding; set do_sample=False or use trim_failed_block=False.")
            stats = PearlStats(strategy=name)
            stop = PacerStoppingCriteria(preverifier.eval(), stats)
            gamma = gamma or max(2, preverifier.config.max_draft_tokens)
        else:
            stats = PearlStats(strategy=name)
        gamma = gamma or measure_gamma(model, draft, config.max_gamma)
        stats.gamma, stats.parallel = gamma, config.parallel
        # The draft's sampling seed comes from the global RNG once, in the caller's thread: reproducible
        # under torch.manual_seed, and the worker never touches the global generator.
        seed = int(torch.randint(0, 2**62, (1,)).item()) if do_sample else 0
        generators: list[PearlCandidateGenerator] = []

        def make(**generator_kwargs) -> PearlCandidateGenerator:
            generator = PearlCandidateGenerator(**generator_kwargs, config=config, gamma=gamma, stats=stats,
                                                stopping_criteria=stop, seed=seed)
            generators.append(generator)
            return generator

        def close() -> None:
            while generators:
                generators.pop().close()

        return StrategyCall(name=name, make=make, stats=stats, closers=[close])

    return build


def register(name: str, config: PearlConfig) -> None:
    """Make `generate(..., pacer=name)` run PEARL with `config` (e.g. a fixed gamma or parallel=False)."""
    STRATEGIES[name] = _builder(name, config)


register("pearl", PearlConfig())
register("pearl-sequential", PearlConfig(parallel=False))
register("pacer+pearl", PearlConfig(use_preverifier=True))
register("pearl-resync", PearlConfig(resync_tokens=2))  # not in the paper: SD round instead of a 1-token round
