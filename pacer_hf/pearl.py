"""PEARL (arXiv 2408.11850) inside `generate`: the draft drafts round k+1 while the target verifies round k.

`target.generate(ids, assistant_model=draft, pacer="pearl")`. The verification loop (pacer_hf's lean
loop or transformers' `_assisted_decoding`) is unchanged; only the candidate generator differs. Each `get_candidates` call:

1. waits for the draft-ahead job launched in the previous call (it ran during the target forward);
2. keeps the job's tokens only when they continue from the token the target settled on: every
   candidate of the last round was accepted *and* the job's first token equals HF's bonus token.
   The job's remaining tokens become this round's candidates ("post-verify"); otherwise there are
   none and the target forwards a single token ("pre-verify") while the draft drafts ahead;
3. launches the next job from the optimistic prefix (input + candidates) on the draft worker, so it
   overlaps the target forward that HF runs next, and returns.

The worker is a forked process on a CPU (its own interpreter: a thread cannot overlap small-model
decode steps, which are GIL-bound Python dispatch) and a thread with a side CUDA stream on a GPU.

Why it stays exact: greedy candidates are only ever accepted by HF's argmax match. Under sampling the
draft samples from its processed distribution q with its own per-job-seeded `torch.Generator` (the
global RNG belongs to the target's sampling in the caller's thread), the keep decision depends only
on the job's first token and the target's token, so kept candidates are distributed exactly as
q-drafts from the current prefix, and their q logits are the ones they were sampled from.
See docs/PEARL.md for the concurrency model and measurements.
"""

from __future__ import annotations

import multiprocessing
import queue
import sys
import threading
import time
import traceback
import warnings
import weakref
from dataclasses import dataclass, field

import torch
from transformers import PreTrainedModel

from .candidate_generator import PacerCandidateGenerator, PacerStoppingCriteria
from .generation import STRATEGIES, StrategyCall, _check_preverifier, _generation_value
from .stats import PacerStats
from .timing import cached_forward_timer

__all__ = ["PearlCandidateGenerator", "PearlConfig", "PearlStats", "measure_gamma", "register", "worker_mode"]


@dataclass(frozen=True)
class PearlConfig:
    """PEARL options. `gamma=None` measures the target/draft step-time ratio (once per model pair)."""

    gamma: int | None = None
    max_gamma: int = 8
    parallel: bool = True
    # "process": a forked worker process (CPU; needs fork); "thread": a worker thread (+ side CUDA stream on
    # a GPU); "auto": process for a CPU draft on Linux with draft_threads == 1, else thread.
    worker: str = "auto"
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


_JOIN_TIMEOUT_S = 5.0
_RESYNC_SEED_OFFSET = 1 << 40  # resync drafts use their own seed stream, disjoint from the jobs'
_WORKER_NAME = "pacer-hf-pearl-draft"
_CUT, _EXPECT_JOB, _EXPECT_TOKEN = 0, 1, 2  # slots of the process worker's shared control array


def worker_mode(config: PearlConfig, draft: PreTrainedModel) -> str:
    """Where the draft-ahead jobs run: "sequential", "thread" or "process" (see PearlConfig.worker)."""
    if not config.parallel:
        return "sequential"
    on_cpu = draft.device.type == "cpu"
    if config.worker == "process" and not on_cpu:
        raise ValueError(f"PearlConfig(worker='process') drafts on a CPU; this draft is on {draft.device}. Use "
                         "worker='thread' (a side CUDA stream) or worker='auto'.")
    if config.worker != "auto":
        return config.worker
    # Linux only for auto: fork is what the worker relies on, and macOS's system frameworks are not fork-safe.
    forkable = sys.platform.startswith("linux") and "fork" in multiprocessing.get_all_start_methods()
    return "process" if on_cpu and forkable and config.draft_threads == 1 else "thread"


class _Job:
    """One draft-ahead request: draft up to `budget` tokens after `seq` (the optimistic prefix)."""

    __slots__ = ("id", "seq", "budget", "seed", "tokens", "scores", "done", "error", "cancelled", "cut",
                 "expected_first", "seconds", "ready", "waited")

    def __init__(self, job_id: int, seq: torch.Tensor, budget: int, seed: int):
        self.id, self.seq, self.budget, self.seed = job_id, seq, budget, seed
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


class _WorkerError(Exception):
    """An exception raised in the worker process, carried back as text (type name, message, traceback)."""

    def __init__(self, type_name: str, message: str, trace: str):
        super().__init__(f"{message}\n\nDraft worker traceback:\n{trace}")
        self.type_name = type_name


class PearlCandidateGenerator(PacerCandidateGenerator):
    """Draft-ahead candidate generator; the draft worker owns the draft (cache, buffer, RNG) while a job runs.

    Ownership rule: with a worker thread the caller touches `self.cache`/`self.ids` only when no job is
    in flight; with a worker process the caller never drafts (the forked child owns the only live cache).
    """

    def __init__(self, *args, config: PearlConfig, mode: str, gamma: int, stats: PearlStats,
                 stopping_criteria: PacerStoppingCriteria | None = None, seed: int = 0, **kwargs):
        super().__init__(*args, max_draft_tokens=gamma, stats=stats, stopping_criteria=stopping_criteria, **kwargs)
        self.config, self.mode, self.gamma, self.seed = config, mode, gamma, seed
        self.job: _Job | None = None
        self.jobs_made = 0
        self.pending = 0  # candidates sent in the current round
        self.round = 0
        self.rng = torch.Generator(device=self.draft.device) if self.do_sample else None
        self.sent_at = 0.0
        self.launched: list[_Job | None] = []  # the job launched in each round (None: none launched)
        self.inference_mode = torch.is_inference_mode_enabled()
        # thread worker
        self.worker: threading.Thread | None = None
        self.requests: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        cuda = self.draft.device.type == "cuda" and torch.cuda.is_available()
        self.stream = torch.cuda.Stream(device=self.draft.device) if (cuda and mode == "thread") else None
        self.main_stream = torch.cuda.current_stream(self.draft.device) if self.stream is not None else None
        self.old_switch_interval: float | None = None
        # process worker: a pipe for requests/replies, shared memory for the sequence, scores and cancellation
        self.process = None
        self.conn = None
        self.control = None

    # ----------------------------------------------------------------- caller's thread
    @torch.no_grad()
    def get_candidates(self, input_ids: torch.LongTensor, **kwargs) -> tuple[torch.LongTensor, torch.Tensor | None]:
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
                pending, scores = self._resync(input_ids)
        candidates = input_ids if pending is None else torch.cat([input_ids, pending], dim=1)
        self.pending = 0 if pending is None else pending.shape[1]
        self.stats.draft_lengths.append(self.pending)
        budget = min(self.gamma, self.main_model_max_length - candidates.shape[1] - 1)
        launched = None
        if budget >= 2:  # a job of one token could only be pre-verified, never sent
            launched = self._new_job(candidates.clone(), budget, self.seed + self.round)
            self._launch(launched)
        self.launched.append(launched)
        self.round += 1
        self.sent_at = time.perf_counter()
        return candidates, scores

    def update_candidate_strategy(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, num_matches) -> None:
        """Record the round; tell the in-flight job as early as possible whether it can still be kept."""
        self.stats.target_seconds.append(time.perf_counter() - self.sent_at)
        matches = int(num_matches)
        self.stats.accepted.append(matches)
        job = self.job
        if job is None:
            return
        if matches < self.pending:
            self._cancel(job)
        else:  # the job is kept only if its first token is the target's: the worker stops at a mismatch
            job.expected_first = int(input_ids[0, -1])
            if self.control is not None:
                self.control[_EXPECT_TOKEN] = job.expected_first
                self.control[_EXPECT_JOB] = job.id  # written last: the worker reads the job id first

    def _new_job(self, seq: torch.Tensor, budget: int, seed: int) -> _Job:
        self.jobs_made += 1
        return _Job(self.jobs_made, seq, budget, seed)

    def _cancel(self, job: _Job) -> None:
        job.cancelled = True
        if self.control is not None:
            self.control[_CUT] = job.id

    def _resync(self, input_ids: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """After a miss, optionally draft `resync_tokens` now (serially) so the round still verifies candidates."""
        budget = min(self.config.resync_tokens, self.main_model_max_length - input_ids.shape[1] - 1)
        if budget < 1:
            return None, None
        job = self._new_job(input_ids.clone(), budget, self.seed + _RESYNC_SEED_OFFSET + self.round)
        start = time.perf_counter()
        if self.mode == "process":  # only the worker holds a live draft cache
            self._submit(job)
            self._wait(job, count_wait=False)
        else:
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
        self.job = job
        if self.mode == "sequential":  # same job, run in the caller's thread before the target forward
            self._run(job)
            if job.error is not None:
                self._wait(job)
        elif self.mode == "process":
            self._submit(job)
        else:
            if self.worker is None:
                self._start_thread()
            if self.stream is not None:  # CUDA: the side stream starts once `seq` is ready on the caller's stream
                job.ready = torch.cuda.Event()
                job.ready.record(self.main_stream)
                job.seq.record_stream(self.stream)
            self.requests.put(job)

    def _wait(self, job: _Job, count_wait: bool = True) -> None:
        start = time.perf_counter()
        deadline = start + self.config.timeout_s
        while not self._finished(job):
            if self.worker is not None and not self.worker.is_alive():
                raise RuntimeError("PEARL draft worker thread died without reporting an error.")
            if self.process is not None and not self.process.is_alive():
                self._process_died()
            if time.perf_counter() > deadline:
                self._cancel(job)
                raise TimeoutError(
                    f"PEARL draft job did not finish within timeout_s={self.config.timeout_s}s; "
                    "raise PearlConfig.timeout_s for very slow drafts."
                )
        if job.waited:
            return
        job.waited = True
        if count_wait:
            self.stats.wait_seconds += time.perf_counter() - start
        if job.error is not None:
            name = getattr(job.error, "type_name", type(job.error).__name__)
            raise RuntimeError(f"PEARL draft worker failed: {name}: {job.error}") from job.error
        if job.cut:
            self.stats.jobs_cancelled += 1

    def _finished(self, job: _Job) -> bool:
        if self.process is None or job.done.is_set():
            return job.done.wait(0.05)
        if not self.conn.poll(0.05):
            return False
        try:
            reply = self.conn.recv()
        except (EOFError, OSError):  # the pipe closed: the worker is gone
            self.process.join(timeout=1.0)
            self._process_died()
        job_id, job.tokens, job.cut, job.seconds, forwards, preverifier_seconds, error = reply
        if job_id != job.id:
            raise RuntimeError(f"PEARL internal error: reply for job {job_id} while waiting for job {job.id}.")
        if self.do_sample and job.tokens:
            job.scores = list(self.shared_scores[: len(job.tokens)].clone()[:, None])
        job.error = None if error is None else _WorkerError(*error)
        self.stats.draft_forwards += forwards
        self.stats.preverifier_seconds += preverifier_seconds
        job.done.set()
        return True

    def _process_died(self) -> None:
        raise RuntimeError(f"PEARL draft worker process died (exit code {self.process.exitcode}) without reporting "
                           "an error (killed, or out of memory?).")

    def _start_thread(self) -> None:
        start = time.perf_counter()
        if self.config.switch_interval_s is not None:
            self.old_switch_interval = sys.getswitchinterval()
            sys.setswitchinterval(self.config.switch_interval_s)
        self.worker = threading.Thread(target=self._serve_thread, name=_WORKER_NAME, daemon=True)
        self.worker.start()
        self.stats.worker_start_seconds += time.perf_counter() - start

    def _submit(self, job: _Job) -> None:
        """Process worker: the sequence goes through shared memory, the request through the pipe."""
        if self.process is None:
            self._start_process()
        self.shared_seq[:, : job.seq.shape[1]] = job.seq
        self.conn.send((job.id, job.seq.shape[1], job.budget, job.seed))

    def _start_process(self) -> None:
        start = time.perf_counter()
        context = multiprocessing.get_context("fork")  # the child starts with the draft already in memory
        self.control = context.RawArray("q", 3)
        self.shared_seq = torch.zeros((1, self.main_model_max_length), dtype=torch.long).share_memory_()
        slots = max(self.gamma, self.config.resync_tokens)
        vocab = self.lm_head.weight.shape[0]
        self.shared_scores = torch.zeros((slots, vocab)).share_memory_() if self.do_sample else None
        self.conn, child_end = context.Pipe()
        self.process = context.Process(target=self._serve_process, args=(child_end,), name=_WORKER_NAME, daemon=True)
        self.process.start()
        child_end.close()
        self.stats.worker_start_seconds += time.perf_counter() - start

    def close(self) -> None:
        """Stop and join the worker (runs when generate returns or raises)."""
        if self.job is not None:
            self._cancel(self.job)
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
        process, self.process = self.process, None
        if process is not None:
            try:
                self.conn.send(None)
            except OSError:  # the worker is already gone
                pass
            process.join(timeout=_JOIN_TIMEOUT_S)
            if process.is_alive():  # stuck in a draft forward: it holds nothing the caller needs
                process.kill()
                process.join(timeout=_JOIN_TIMEOUT_S)
            self.conn.close()
        self.job = None
        self.cache = None
        self.stats.job_seconds.extend(job.seconds if job is not None and job.done.is_set() else 0.0
                                      for job in self.launched)
        self.launched.clear()

    # ----------------------------------------------------------------- worker thread / worker process
    def _serve_thread(self) -> None:
        torch.set_num_threads(self.config.draft_threads)  # per-thread on OpenMP builds: the caller keeps its own
        # Autograd modes are thread-local: the worker must draft in the caller's mode, or tensors made
        # under the caller's torch.inference_mode() cannot be updated by the worker.
        with torch.inference_mode(self.inference_mode):
            while (job := self.requests.get()) is not None:
                self._run(job)

    def _serve_process(self, conn) -> None:
        """The forked worker's loop: it owns copies of the draft, its cache, the buffers and the RNG."""
        self.conn.close()  # the caller's end: without this, the worker would never see the caller go away
        torch.set_num_threads(1)
        with torch.inference_mode(self.inference_mode):
            while True:
                try:
                    request = conn.recv()
                except (EOFError, OSError):
                    return
                if request is None:
                    return
                job_id, length, budget, seed = request
                job = _Job(job_id, self.shared_seq[:, :length], budget, seed)
                forwards, preverifier_seconds = self.stats.draft_forwards, self.stats.preverifier_seconds
                self._run(job)
                error = None
                if job.error is not None:
                    trace = "".join(traceback.format_exception(job.error))
                    error = (type(job.error).__name__, str(job.error), trace)
                for slot, scores in enumerate(job.scores if self.do_sample else []):
                    self.shared_scores[slot] = scores[0]
                conn.send((job_id, job.tokens, job.cut, job.seconds, self.stats.draft_forwards - forwards,
                           self.stats.preverifier_seconds - preverifier_seconds, error))

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
        except BaseException as error:  # noqa: BLE001 - reported to the caller by _wait
            job.error = error
        finally:
            job.seconds = time.perf_counter() - start
            job.done.set()

    @torch.no_grad()
    def _draft(self, job: _Job) -> None:
        """Draft up to `job.budget` tokens after `job.seq` with the shared drafting loop (in the worker)."""
        if self.rng is not None:
            self.rng.manual_seed(job.seed)
        first: list[int] = []

        def interrupt(n: int, token: int) -> bool:
            if n == 1:
                first.append(token)
            if self.control is not None:  # process worker: the caller's decisions arrive through shared memory
                if self.control[_CUT] >= job.id:
                    job.cancelled = True
                if self.control[_EXPECT_JOB] == job.id:
                    job.expected_first = self.control[_EXPECT_TOKEN]
            if job.cancelled or (first and job.expected_first is not None and first[0] != job.expected_first):
                job.cancelled = job.cut = True
            return job.cut

        if interrupt(0, -1):
            return
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
        mode = worker_mode(config, draft)
        gamma = gamma or measure_gamma(model, draft, config.max_gamma)
        stats.gamma, stats.parallel, stats.worker = gamma, config.parallel, mode
        # The draft's sampling seed comes from the global RNG once, in the caller's thread: reproducible
        # under torch.manual_seed, and the worker never touches the global generator.
        seed = int(torch.randint(0, 2**62, (1,)).item()) if do_sample else 0
        generators: list[PearlCandidateGenerator] = []

        def make(**generator_kwargs) -> PearlCandidateGenerator:
            generator = PearlCandidateGenerator(**generator_kwargs, config=config, mode=mode, gamma=gamma,
                                                stats=stats, stopping_criteria=stop, seed=seed)
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
register("pearl-thread", PearlConfig(worker="thread"))
register("pacer+pearl", PearlConfig(use_preverifier=True))
register("pearl-resync", PearlConfig(resync_tokens=2))  # not in the paper: SD round instead of a 1-token round
