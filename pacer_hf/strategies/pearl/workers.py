"""Where PEARL's draft-ahead jobs run: the caller's thread, a worker thread, or a forked worker process.

A `DraftWorker` runs `run(job)` (the candidate generator's drafting of one `Job`) somewhere, and is
the caller's only handle on it. From the caller's thread: `submit(job)`; then any number of
`cancel(job)` (the job can no longer be kept) and `expect(job, token)` (the job is kept only if its
first token is `token`), which reach the running job between draft steps; `wait(job)` blocks until
it is done and raises what went wrong (the worker's error, a hang past `timeout_s`, a dead worker);
`close()` stops the worker. `run` fills `job.tokens` (and `job.scores` under sampling) and polls
`job.interrupted(first_token)` between draft steps.

- `InlineWorker` ("sequential"): the job runs in `submit`, in the caller's thread (no concurrency).
- `ThreadWorker` ("thread"): one daemon thread per call; a side CUDA stream for a CUDA draft. Small
  CPU models are GIL-bound Python dispatch, so on a CPU a thread barely overlaps (docs/PEARL.md §4).
- `ProcessWorker` ("process"): a forked child that starts with the draft, its cache and RNG already
  in memory; prefixes and sampled logits travel through shared memory, requests and replies through
  a pipe, cancellation through a shared array. Killed on close if stuck.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import sys
import threading
import time
import traceback
import warnings
from collections.abc import Callable

import torch
from transformers import PreTrainedModel

from .config import PearlConfig, PearlStats

WORKER_NAME = "pacer-hf-pearl-draft"
_POLL_S = 0.05
_CUT, _EXPECT_JOB, _EXPECT_TOKEN = 0, 1, 2  # slots of the process worker's shared control array


class Job:
    """One draft-ahead request: draft up to `budget` tokens after `seq`, sampling with seed `seed`."""

    __slots__ = ("id", "seq", "budget", "seed", "loop", "tokens", "scores", "done", "error", "cancelled", "cut",
                 "expected_first", "seconds", "ready", "sync")

    def __init__(self, job_id: int, seq: torch.Tensor, budget: int, seed: int = 0, loop: list[float] | None = None):
        self.id, self.seq, self.budget, self.seed = job_id, seq, budget, seed
        self.loop = loop  # the loop state the pre-verifier reads (`loop_features`), fixed when the job is made
        self.tokens: list[int] = []
        self.scores: list[torch.Tensor] = []  # processed draft logits of each token (sampling only)
        self.done = threading.Event()
        self.error: BaseException | None = None
        self.cancelled = False  # set by the caller: the job can no longer be kept
        self.cut = False  # set by the worker: it stopped early because of `cancelled` or `expected_first`
        self.expected_first: int | None = None
        self.seconds = 0.0
        self.ready = None  # CUDA event: `seq` is ready on the caller's stream (thread worker on a GPU)
        self.sync: Callable[[Job], None] | None = None  # process worker: reads the caller's decisions

    def interrupted(self, first: int | None) -> bool:
        """Whether drafting must stop now (`first`: the job's first token once drafted)."""
        if self.sync is not None:
            self.sync(self)
        if self.cancelled or (first is not None and self.expected_first is not None and first != self.expected_first):
            self.cancelled = self.cut = True
        return self.cut


class WorkerError(Exception):
    """An exception raised in the worker process, carried back as text (type name, message, traceback)."""

    def __init__(self, type_name: str, message: str, trace: str):
        super().__init__(f"{message}\n\nDraft worker traceback:\n{trace}")
        self.type_name = type_name


Run = Callable[[Job], None]


class DraftWorker:
    """The caller's side of a draft worker (see the module docstring for the protocol)."""

    kind = ""
    hang_hint = ""  # appended to the timeout error: what else makes this kind of worker hang
    join_timeout_s = 5.0  # close(): how long a running job may take to notice it was cancelled

    def __init__(self, run: Run, *, stats: PearlStats, timeout_s: float = 120.0):
        self.run, self.stats, self.timeout_s = run, stats, timeout_s
        self.started = False

    def start(self) -> None:
        """Start the worker (idempotent; `submit` calls it). Its cost goes to `stats.worker_start_seconds`."""
        if self.started:
            return
        start = time.perf_counter()
        self._start()
        self.started = True
        self.stats.worker_start_seconds += time.perf_counter() - start

    def submit(self, job: Job) -> None:
        raise NotImplementedError

    def cancel(self, job: Job) -> None:
        job.cancelled = True

    def expect(self, job: Job, token: int) -> None:
        job.expected_first = token

    def finished(self, job: Job, timeout: float = 0.0) -> bool:
        """Whether `job` is done, waiting up to `timeout` seconds."""
        return job.done.wait(timeout)

    def wait(self, job: Job) -> None:
        """Block until `job` is done; raise its error, or TimeoutError after `timeout_s`, or a dead worker's."""
        deadline = time.perf_counter() + self.timeout_s
        while not self.finished(job, _POLL_S):
            self._check_alive()
            if time.perf_counter() > deadline:
                self.cancel(job)
                raise TimeoutError(f"PEARL draft job did not finish within timeout_s={self.timeout_s}s; "
                                   f"raise PearlConfig.timeout_s for very slow drafts{self.hang_hint}.")
        if job.error is not None:
            name = getattr(job.error, "type_name", type(job.error).__name__)
            raise RuntimeError(f"PEARL draft worker failed: {name}: {job.error}") from job.error

    def close(self) -> None:
        """Stop the worker (cancel the job in flight first); runs when generate returns or raises."""

    # ------------------------------------------------------------- worker side
    def _start(self) -> None:
        pass

    def _check_alive(self) -> None:
        pass

    def _execute(self, job: Job) -> None:
        """Run `job` here, catching everything into it (reported by `wait`)."""
        start = time.perf_counter()
        try:
            self._run(job)
        except BaseException as error:  # noqa: BLE001 - reported to the caller by wait
            job.error = error
        finally:
            job.seconds = time.perf_counter() - start
            job.done.set()

    def _run(self, job: Job) -> None:
        self.run(job)


class InlineWorker(DraftWorker):
    """No concurrency: `submit` runs the job at once in the caller's thread (PEARL's `parallel=False`)."""

    kind = "sequential"

    def submit(self, job: Job) -> None:
        self.start()
        self._execute(job)
        if job.error is not None:
            self.wait(job)  # raises it now


class ThreadWorker(DraftWorker):
    """One daemon thread serving jobs; on a CUDA draft each job runs on a side stream."""

    kind = "thread"

    def __init__(self, run: Run, *, stats: PearlStats, timeout_s: float = 120.0, draft_threads: int = 1,
                 switch_interval_s: float | None = 0.0005, device: torch.device | None = None):
        super().__init__(run, stats=stats, timeout_s=timeout_s)
        self.draft_threads, self.switch_interval_s = draft_threads, switch_interval_s
        self.requests: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self.thread: threading.Thread | None = None
        self.old_switch_interval: float | None = None
        # Autograd modes are thread-local: the worker drafts in the caller's mode, or tensors made under
        # the caller's torch.inference_mode() could not be updated by the worker.
        self.inference_mode = torch.is_inference_mode_enabled()
        cuda = device is not None and device.type == "cuda" and torch.cuda.is_available()
        self.stream = torch.cuda.Stream(device=device) if cuda else None
        self.main_stream = torch.cuda.current_stream(device) if cuda else None

    def _start(self) -> None:
        if self.switch_interval_s is not None:
            self.old_switch_interval = sys.getswitchinterval()
            sys.setswitchinterval(self.switch_interval_s)
        self.thread = threading.Thread(target=self._serve, name=WORKER_NAME, daemon=True)
        self.thread.start()

    def submit(self, job: Job) -> None:
        self.start()
        if self.stream is not None:  # the side stream starts once `seq` is ready on the caller's stream
            job.ready = torch.cuda.Event()
            job.ready.record(self.main_stream)
            job.seq.record_stream(self.stream)
        self.requests.put(job)

    def _check_alive(self) -> None:
        if self.thread is not None and not self.thread.is_alive():
            raise RuntimeError("PEARL draft worker thread died without reporting an error.")

    def close(self) -> None:
        thread, self.thread = self.thread, None
        if thread is not None:
            self.requests.put(None)
            thread.join(timeout=self.join_timeout_s)  # a cancelled job stops after its current draft step
            if thread.is_alive():
                warnings.warn(f"PEARL draft worker did not stop within {self.join_timeout_s}s (a draft forward is "
                              "stuck); it is a daemon thread and will not block interpreter exit.", RuntimeWarning,
                              stacklevel=2)
            else:
                _wait_native_exit(thread, self.join_timeout_s)
        if self.old_switch_interval is not None:
            sys.setswitchinterval(self.old_switch_interval)
            self.old_switch_interval = None

    def _serve(self) -> None:
        torch.set_num_threads(self.draft_threads)  # per-thread on OpenMP builds: the caller keeps its own
        with torch.inference_mode(self.inference_mode):
            while (job := self.requests.get()) is not None:
                self._execute(job)

    def _run(self, job: Job) -> None:
        if self.stream is None:
            self.run(job)
            return
        self.stream.wait_event(job.ready)
        with torch.cuda.stream(self.stream):
            self.run(job)
        for tensor in job.scores:  # freed later on the caller's stream: tell the allocator
            tensor.record_stream(self.main_stream)
        self.stream.synchronize()


def _wait_native_exit(thread: threading.Thread, timeout_s: float) -> None:
    """Wait until `thread`'s OS thread is gone, not only its Python side (what `join` waits for).

    Its thread-local destructors run after `join` returns; MKL's frees the thread's GEMM buffers under
    a spin lock. A fork in that window (the next process worker) leaves the child spinning on a lock
    nobody will release, so the process worker's first job never returns.
    """
    task = f"/proc/self/task/{thread.native_id}"
    deadline = time.perf_counter() + timeout_s
    while os.path.exists(task) and time.perf_counter() < deadline:
        time.sleep(0.001)


class ProcessWorker(DraftWorker):
    """A forked child serving jobs (CPU drafts). The caller never drafts once it runs: only the child
    holds a live draft cache. Prefixes (`max_length` ids) and sampled logits (`slots` x `vocab`, when
    `do_sample`) go through shared memory; the child adds its draft forwards to the caller's stats."""

    kind = "process"
    hang_hint = (", or use PearlConfig(worker='thread') if other threads of this process run MKL or OpenMP work "
                 "while generate forks its worker (the child inherits their locks)")

    def __init__(self, run: Run, *, stats: PearlStats, timeout_s: float = 120.0, max_length: int, slots: int,
                 vocab: int, do_sample: bool):
        super().__init__(run, stats=stats, timeout_s=timeout_s)
        self.max_length, self.slots, self.vocab, self.do_sample = max_length, slots, vocab, do_sample
        self.inference_mode = torch.is_inference_mode_enabled()
        self.process = self.conn = self.control = None
        self.shared_seq: torch.Tensor | None = None
        self.shared_scores: torch.Tensor | None = None

    def _start(self) -> None:
        context = multiprocessing.get_context("fork")  # the child starts with the draft already in memory
        self.control = context.RawArray("q", 3)
        self.shared_seq = torch.zeros((1, self.max_length), dtype=torch.long).share_memory_()
        if self.do_sample:
            self.shared_scores = torch.zeros((self.slots, self.vocab)).share_memory_()
        self.conn, child_end = context.Pipe()
        self.process = context.Process(target=self._serve, args=(child_end,), name=WORKER_NAME, daemon=True)
        self.process.start()
        child_end.close()

    def submit(self, job: Job) -> None:
        self.start()
        length = job.seq.shape[1]
        self.shared_seq[:, :length] = job.seq
        self.conn.send((job.id, length, job.budget, job.seed, job.loop))

    def cancel(self, job: Job) -> None:
        super().cancel(job)
        if self.control is not None:
            self.control[_CUT] = job.id

    def expect(self, job: Job, token: int) -> None:
        super().expect(job, token)
        if self.control is not None:
            self.control[_EXPECT_TOKEN] = token
            self.control[_EXPECT_JOB] = job.id  # written last: the child reads the job id first

    def finished(self, job: Job, timeout: float = 0.0) -> bool:
        if job.done.is_set() or self.conn is None:
            return job.done.wait(timeout)
        if not self.conn.poll(timeout):
            return False
        try:
            reply = self.conn.recv()
        except (EOFError, OSError):  # the pipe closed: the child is gone
            self.process.join(timeout=1.0)
            self._died()
        job_id, job.tokens, job.cut, job.seconds, forwards, preverifier_seconds, error = reply
        if job_id != job.id:
            raise RuntimeError(f"PEARL internal error: reply for job {job_id} while waiting for job {job.id}.")
        if self.do_sample and job.tokens:
            job.scores = list(self.shared_scores[: len(job.tokens)].clone()[:, None])
        job.error = None if error is None else WorkerError(*error)
        self.stats.draft_forwards += forwards
        self.stats.preverifier_seconds += preverifier_seconds
        job.done.set()
        return True

    def _check_alive(self) -> None:
        if self.process is not None and not self.process.is_alive():
            self._died()

    def _died(self) -> None:
        raise RuntimeError(f"PEARL draft worker process died (exit code {self.process.exitcode}) without reporting "
                           "an error (killed, or out of memory?).")

    def close(self) -> None:
        process, self.process = self.process, None
        if process is None:
            return
        try:
            self.conn.send(None)
        except OSError:  # the child is already gone
            pass
        process.join(timeout=self.join_timeout_s)
        if process.is_alive():  # stuck in a draft forward: it holds nothing the caller needs
            process.kill()
            process.join(timeout=self.join_timeout_s)
        self.conn.close()

    # ------------------------------------------------------------- in the child
    def _serve(self, conn) -> None:
        """The child's loop: it owns copies of the draft, its cache, the buffers and the RNG."""
        self.conn.close()  # the caller's end: without this, the child would never see the caller go away
        torch.set_num_threads(1)
        with torch.inference_mode(self.inference_mode):
            while True:
                try:
                    request = conn.recv()
                except (EOFError, OSError):
                    return
                if request is None:
                    return
                job_id, length, budget, seed, loop = request
                job = Job(job_id, self.shared_seq[:, :length], budget, seed, loop)
                job.sync = self._sync
                forwards, preverifier_seconds = self.stats.draft_forwards, self.stats.preverifier_seconds
                self._execute(job)
                error = None
                if job.error is not None:
                    trace = "".join(traceback.format_exception(job.error))
                    error = (type(job.error).__name__, str(job.error), trace)
                for slot, scores in enumerate(job.scores if self.do_sample else []):
                    self.shared_scores[slot] = scores[0]
                conn.send((job_id, job.tokens, job.cut, job.seconds, self.stats.draft_forwards - forwards,
                           self.stats.preverifier_seconds - preverifier_seconds, error))

    def _sync(self, job: Job) -> None:
        """The caller's decisions about `job`, from shared memory."""
        if self.control[_CUT] >= job.id:
            job.cancelled = True
        if self.control[_EXPECT_JOB] == job.id:
            job.expected_first = self.control[_EXPECT_TOKEN]


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


def make_worker(mode: str, run: Run, *, config: PearlConfig, stats: PearlStats, draft: PreTrainedModel,
                max_length: int, slots: int, do_sample: bool) -> DraftWorker:
    """The worker for `mode` (from `worker_mode`), running `run` on `draft`'s jobs."""
    if mode == "sequential":
        return InlineWorker(run, stats=stats, timeout_s=config.timeout_s)
    if mode == "thread":
        return ThreadWorker(run, stats=stats, timeout_s=config.timeout_s, draft_threads=config.draft_threads,
                            switch_interval_s=config.switch_interval_s, device=draft.device)
    if mode == "process":
        vocab = draft.get_output_embeddings().out_features
        return ProcessWorker(run, stats=stats, timeout_s=config.timeout_s, max_length=max_length, slots=slots,
                             vocab=vocab, do_sample=do_sample)
    raise ValueError(f"unknown PEARL worker mode {mode!r}; expected 'sequential', 'thread' or 'process'.")
