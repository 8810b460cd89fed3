"""PEARL (pacer="pearl"): its policy, its draft workers and its gamma.

Greedy identity and sampling exactness of every strategy, PEARL's presets included, are in
test_strategies_conformance.py. Here: PEARL's own invariants (jobs kept, concurrency changing no
decision and no random draw), the workers (inline, thread, process) driven directly for errors,
hangs, kills and cancellation, no worker outliving generate, and the measured gamma.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import threading
import time
import types

import pytest
import torch
from conftest import ARCHITECTURES, DRAFT_KINDS, build_draft, build_model, make_preverifier, plain_greedy
from helpers import prompt

import pacer_hf
import pacer_hf.strategies.pearl as pearl
from pacer_hf import PearlConfig
from pacer_hf.strategies import STRATEGIES, StrategyConfig
from pacer_hf.strategies.pearl import PearlStats, measure_gamma, worker_mode
from pacer_hf.strategies.pearl.workers import WORKER_NAME, InlineWorker, Job, ProcessWorker, ThreadWorker

MODES = ("process", "sequential", "thread")
PARENT = os.getpid()


def pearl_config(mode: str, **options) -> PearlConfig:
    """A PEARL config whose jobs run in `mode` (the auto gamma of equal-size test pairs is always 2)."""
    if mode == "sequential":
        return PearlConfig(parallel=False, **options)
    return PearlConfig(worker=mode, **options)


def workers() -> list:
    """Live PEARL workers: threads of this process and child processes (active_children also reaps)."""
    threads = [t for t in threading.enumerate() if t.name == WORKER_NAME]
    return threads + [p for p in multiprocessing.active_children() if p.name == WORKER_NAME]


@pytest.fixture(autouse=True)
def no_leaked_worker():
    yield
    assert not workers(), "a PEARL worker (thread or process) outlived its test"


# --------------------------------------------------------------------- config and registration
def test_presets_and_serialisation():
    assert STRATEGIES["pearl"] == PearlConfig()
    assert STRATEGIES["pearl-sequential"] == PearlConfig(parallel=False)
    assert STRATEGIES["pearl-thread"] == PearlConfig(worker="thread")
    assert STRATEGIES["pacer+pearl"] == PearlConfig(use_preverifier=True)
    assert STRATEGIES["pearl-resync"] == PearlConfig(resync_tokens=2)
    config = PearlConfig(gamma=5, worker="thread", timeout_s=3.0, switch_interval_s=None)
    values = config.to_dict()
    assert values["strategy_type"] == "pearl" and values["gamma"] == 5
    assert StrategyConfig.from_dict(values) == config


@pytest.mark.parametrize("bad", [{"gamma": 1}, {"max_gamma": 1}, {"draft_threads": 0}, {"timeout_s": 0},
                                 {"resync_tokens": -1}, {"worker": "fiber"},
                                 {"worker": "process", "draft_threads": 2}])
def test_config_rejects_bad_values(bad):
    with pytest.raises(ValueError, match="gamma|required|worker"):
        PearlConfig(**bad)


def test_auto_worker_choice(pair):
    """auto: a process for a one-thread CPU draft, a thread for a multi-threaded one; never a process on CUDA."""
    _, draft = pair("llama", "noisy")
    assert worker_mode(PearlConfig(), draft) == "process"
    assert worker_mode(PearlConfig(draft_threads=2), draft) == "thread"
    assert worker_mode(PearlConfig(parallel=False), draft) == "sequential"
    on_gpu = types.SimpleNamespace(device=torch.device("cuda", 0))
    assert worker_mode(PearlConfig(), on_gpu) == "thread"
    with pytest.raises(ValueError, match="worker='thread'"):
        worker_mode(PearlConfig(worker="process"), on_gpu)


# --------------------------------------------------------------------- the policy, through generate
@pytest.mark.parametrize("arch", ARCHITECTURES)
@pytest.mark.parametrize("kind", DRAFT_KINDS)
def test_rounds_and_jobs(pair, arch, kind):
    target, draft = pair(arch, kind)
    ids = prompt(seed=sum(map(ord, arch + kind)))
    expected = plain_greedy(target, ids, max_new_tokens=21)
    for config in (PearlConfig(gamma=2, worker="process"), PearlConfig(gamma=5, parallel=False),
                   PearlConfig(gamma=3, worker="thread")):
        out = target.generate(ids, max_new_tokens=21, do_sample=False, assistant_model=draft, pacer=config)
        assert torch.equal(out, expected), config
        stats = pacer_hf.last_stats(target)
        assert stats.gamma == config.gamma and stats.worker == worker_mode(config, draft)
        assert stats.new_tokens == 21 and len(stats.accepted) == len(stats.draft_lengths) == stats.target_forwards
        assert all(a <= d for a, d in zip(stats.accepted, stats.draft_lengths))
        assert max(stats.draft_lengths) <= stats.gamma - 1, "a kept job sends all its tokens but the first"
        assert len(stats.job_seconds) == stats.target_forwards and stats.jobs <= stats.target_forwards
        if kind == "copy":
            assert stats.jobs_kept >= stats.jobs - 2, "an exact copy keeps every job but the one cut by max length"
        if kind == "random":
            assert stats.jobs_kept <= stats.jobs // 2


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_concurrency_changes_no_decision(pair, arch):
    """Process, thread and sequential runs make the same decisions round by round (with and without resync)."""
    target, draft = pair(arch, "noisy", torch.float32)
    for seed in range(2):
        ids = prompt(seed=seed)
        expected = plain_greedy(target, ids, max_new_tokens=24)
        for options in ({"gamma": 3}, {"gamma": 3, "resync_tokens": 2}):
            rounds = {}
            for mode in MODES:
                out = target.generate(ids, max_new_tokens=24, do_sample=False, assistant_model=draft,
                                      pacer=pearl_config(mode, **options))
                assert torch.equal(out, expected)
                stats = pacer_hf.last_stats(target)
                assert stats.worker == mode
                rounds[mode] = (stats.draft_lengths, stats.accepted, stats.jobs_kept)
            assert rounds["process"] == rounds["sequential"] == rounds["thread"], options


@pytest.mark.parametrize("eos_position", [1, 2, 5])
def test_eos_inside_a_job(pair, eos_position):
    target, draft = pair("llama", "copy")
    ids = prompt(seed=11)
    free = plain_greedy(target, ids, max_new_tokens=12)
    eos = int(free[0, ids.shape[1] + eos_position])
    expected = plain_greedy(target, ids, max_new_tokens=12, eos_token_id=eos, pad_token_id=eos)
    configs = [pearl_config(mode, gamma=5) for mode in MODES] + [PearlConfig(gamma=5, resync_tokens=1, parallel=False)]
    for config in configs:
        out = target.generate(ids, max_new_tokens=12, do_sample=False, assistant_model=draft, pacer=config,
                              eos_token_id=eos, pad_token_id=eos)
        assert torch.equal(out, expected), config
        assert out.shape[1] <= ids.shape[1] + eos_position + 1


@pytest.mark.parametrize("max_new_tokens", [1, 2, 3, 5, 8])
def test_max_new_tokens_edges(pair, max_new_tokens):
    """Jobs shrink near max_length and none is launched when fewer than 2 tokens fit."""
    target, draft = pair("llama", "copy")
    ids = prompt(seed=2)
    expected = plain_greedy(target, ids, max_new_tokens=max_new_tokens)
    for config in (PearlConfig(gamma=5), PearlConfig(gamma=2), PearlConfig(gamma=3, resync_tokens=2)):
        out = target.generate(ids, max_new_tokens=max_new_tokens, do_sample=False, assistant_model=draft, pacer=config)
        assert torch.equal(out, expected)
        stats = pacer_hf.last_stats(target)
        assert stats.new_tokens == max_new_tokens
        assert (stats.jobs == 0) == (max_new_tokens <= 2)


@pytest.mark.parametrize("threshold", [0.0, 0.5, 1.0])
def test_pacer_plus_pearl(pair, threshold):
    """The pre-verifier runs inside the job and may end it early; threshold 1 ends every job after one block."""
    target, draft = pair("llama", "noisy")
    pacer_hf.attach(draft, make_preverifier(draft, block_size=2, threshold=threshold, max_draft_tokens=6))
    try:
        lengths = set()
        for seed in range(3):
            ids = prompt(seed=seed)
            expected = plain_greedy(target, ids, max_new_tokens=20)
            out = target.generate(ids, max_new_tokens=20, do_sample=False, assistant_model=draft, pacer="pacer+pearl")
            assert torch.equal(out, expected)
            stats = pacer_hf.last_stats(target)
            assert stats.strategy == "pacer+pearl" and stats.gamma == 6, "gamma: the pre-verifier's max_draft_tokens"
            lengths.update(stats.draft_lengths)
        if threshold == 1.0:
            assert lengths <= {0, 1}, "threshold 1 ends every job after its first block of 2"
    finally:
        del draft._pacer_preverifier


def test_sampling_is_reproducible_and_independent_of_concurrency(sampling_pair):
    """The draft samples with its own per-job-seeded generator: process == thread == sequential under one seed."""
    target, draft = sampling_pair
    for options in ({"gamma": 3}, {"gamma": 3, "resync_tokens": 2}):
        outputs = {}
        for mode in MODES:
            torch.manual_seed(7)
            outputs[mode] = [target.generate(torch.tensor([[1, 7, 3, 3, 8]]), max_new_tokens=12, do_sample=True,
                                             temperature=0.9, top_k=0, assistant_model=draft,
                                             pacer=pearl_config(mode, **options)) for _ in range(6)]
        assert all(torch.equal(a, b) for a, b in zip(outputs["process"], outputs["sequential"])), options
        assert all(torch.equal(a, b) for a, b in zip(outputs["thread"], outputs["sequential"])), options


@pytest.mark.parametrize("mode", ["process", "thread"])
def test_no_worker_left_when_the_target_raises(pair, mode):
    target, draft = pair("llama", "copy")
    calls = {"n": 0}

    def explode(module, args):
        calls["n"] += 1
        if calls["n"] == 3:
            raise ValueError("target exploded on purpose")

    handle = target.register_forward_pre_hook(explode)
    try:
        with pytest.raises(ValueError, match="target exploded"):
            target.generate(prompt(), max_new_tokens=30, do_sample=False, assistant_model=draft,
                            pacer=pearl_config(mode, gamma=5))
    finally:
        handle.remove()
    assert not workers()
    assert sys.getswitchinterval() == pytest.approx(0.005), "the GIL switch interval is restored"


class _Failing(torch.nn.Module):
    """Wraps a draft (so it gets the draft's own forward, not the lean one); raises from call `after` on."""

    def __init__(self, draft, after: int):
        super().__init__()
        self.inner, self.after, self.calls = draft, after, 0
        self.config, self.generation_config = draft.config, draft.generation_config

    def forward(self, *args, **kwargs):
        self.calls += 1
        if self.calls >= self.after:
            raise RuntimeError("draft exploded on purpose")
        return self.inner(*args, **kwargs)

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.inner, name)


@pytest.mark.parametrize("mode", ["process", "thread"])
def test_draft_error_surfaces_through_generate(pair, mode):
    target, draft = pair("llama", "copy")
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="PEARL draft worker failed: RuntimeError: draft exploded on purpose"):
        target.generate(prompt(), max_new_tokens=30, do_sample=False, assistant_model=_Failing(draft, 4),
                        pacer=pearl_config(mode, gamma=3))
    assert time.monotonic() - start < 5


def test_caller_thread_count_untouched(pair):
    """The worker sets its own intra-op thread count; the caller's (the target's) stays as it was."""
    target, draft = pair("llama", "noisy")
    torch.set_num_threads(2)
    try:
        for mode in ("process", "thread"):
            target.generate(prompt(), max_new_tokens=8, do_sample=False, assistant_model=draft,
                            pacer=pearl_config(mode, gamma=3))
            assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(1)
    assert pacer_hf.last_stats(target).parallel and pacer_hf.last_stats(target).jobs > 0


def test_pearl_under_inference_mode(pair):
    """The workers draft in the caller's autograd mode (modes are thread-local)."""
    target, draft = pair("llama", "noisy")
    ids = prompt(seed=3)
    expected = plain_greedy(target, ids, max_new_tokens=16)
    for mode in MODES:
        with torch.inference_mode():
            out = target.generate(ids, max_new_tokens=16, do_sample=False, assistant_model=draft,
                                  pacer=pearl_config(mode, gamma=3))
        assert torch.equal(out, expected), mode


# --------------------------------------------------------------------- the workers, driven directly
VOCAB = 5


def new_worker(kind: str, run, timeout_s: float = 5.0, do_sample: bool = False):
    stats = PearlStats(strategy="test")
    if kind == "inline":
        return InlineWorker(run, stats=stats, timeout_s=timeout_s)
    if kind == "thread":
        return ThreadWorker(run, stats=stats, timeout_s=timeout_s)
    return ProcessWorker(run, stats=stats, timeout_s=timeout_s, max_length=16, slots=8, vocab=VOCAB,
                         do_sample=do_sample)


def new_job(job_id: int = 1, budget: int = 4) -> Job:
    return Job(job_id, torch.arange(3)[None], budget, seed=0)


def drafting(step_s: float = 0.0, scores: bool = False):
    """A stand-in for the generator's drafting: token 10 + n at step n, polling the job like the real one."""

    def run(job: Job) -> None:
        for n in range(job.budget):
            time.sleep(step_s)
            job.tokens.append(10 + n)
            if scores:
                job.scores.append(torch.full((1, VOCAB), float(n)))
            if job.interrupted(job.tokens[0]):
                return

    return run


@pytest.mark.parametrize("kind", ["inline", "thread", "process"])
def test_worker_runs_jobs_and_reports_counters(kind):
    run = drafting(scores=True)

    def counted(job: Job) -> None:  # the process worker adds the child's draft forwards to the caller's stats
        run(job)
        worker.stats.draft_forwards += len(job.tokens)

    worker = new_worker(kind, counted, do_sample=True)
    try:
        for job_id, budget in ((1, 4), (2, 2)):
            job = new_job(job_id, budget)
            worker.submit(job)
            worker.wait(job)
            assert job.tokens == [10 + n for n in range(budget)] and not job.cut
            assert [float(s[0, 0]) for s in job.scores] == list(range(budget))
        assert worker.stats.draft_forwards == 6
    finally:
        worker.close()


@pytest.mark.parametrize("kind", ["thread", "process"])
@pytest.mark.parametrize("how", ["cancel", "expect-other", "expect-same"])
def test_cancel_and_expect_reach_the_running_job(kind, how):
    worker = new_worker(kind, drafting(step_s=0.01))
    try:
        job = new_job(budget=300 if how != "expect-same" else 5)
        worker.submit(job)
        time.sleep(0.05)
        if how == "cancel":
            worker.cancel(job)
        else:  # the job's first token is 10
            worker.expect(job, 99 if how == "expect-other" else 10)
        worker.wait(job)
        if how == "expect-same":
            assert job.tokens == [10, 11, 12, 13, 14] and not job.cut
        else:
            assert job.cut and 1 <= len(job.tokens) < 300
    finally:
        worker.close()


@pytest.mark.parametrize("kind", ["inline", "thread", "process"])
def test_worker_error_surfaces_with_its_type(kind):
    def explode(job: Job) -> None:
        raise ValueError("draft exploded on purpose")

    worker = new_worker(kind, explode)
    try:
        job = new_job()
        start = time.monotonic()
        with pytest.raises(RuntimeError, match="PEARL draft worker failed: ValueError: draft exploded") as error:
            worker.submit(job)  # the inline worker raises here, the others in wait
            worker.wait(job)
        assert time.monotonic() - start < 2
        if kind == "process":  # the child's traceback comes back with the message
            assert "Draft worker traceback" in str(error.value) and "in explode" in str(error.value)
    finally:
        worker.close()


def test_killed_worker_process_surfaces_quickly():
    def die(job: Job) -> None:
        if os.getpid() != PARENT:
            os.kill(os.getpid(), signal.SIGKILL)

    worker = new_worker("process", die)
    try:
        job = new_job()
        worker.submit(job)
        start = time.monotonic()
        with pytest.raises(RuntimeError, match=r"worker process died \(exit code -9\)"):
            worker.wait(job)
        assert time.monotonic() - start < 2
    finally:
        worker.close()


@pytest.mark.parametrize("kind", ["thread", "process"])
def test_hung_job_times_out_and_stops(kind):
    """A job past timeout_s raises TimeoutError and is cancelled, so close() finds the worker idle."""
    worker = new_worker(kind, drafting(step_s=0.1), timeout_s=0.3)
    try:
        job = new_job(budget=1000)
        worker.submit(job)
        start = time.monotonic()
        with pytest.raises(TimeoutError, match="timeout_s"):
            worker.wait(job)
        assert time.monotonic() - start < 1
    finally:
        start = time.monotonic()
        worker.close()
    assert time.monotonic() - start < 1


def test_stuck_worker_process_is_killed_on_close():
    worker = new_worker("process", lambda job: time.sleep(60), timeout_s=0.2)
    worker.join_timeout_s = 0.3
    job = new_job()
    worker.submit(job)
    with pytest.raises(TimeoutError):
        worker.wait(job)
    start = time.monotonic()
    worker.close()
    assert time.monotonic() - start < 2 and not workers()


def test_thread_worker_restores_the_switch_interval():
    before = sys.getswitchinterval()
    worker = ThreadWorker(drafting(), stats=PearlStats(strategy="test"), switch_interval_s=0.0007)
    job = new_job()
    worker.submit(job)
    assert sys.getswitchinterval() == pytest.approx(0.0007)
    worker.wait(job)
    worker.close()
    assert sys.getswitchinterval() == pytest.approx(before)


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="reads the OS threads from /proc")
def test_thread_worker_is_gone_from_the_os_when_close_returns():
    """join() returns before the thread's native destructors run (MKL frees its GEMM buffers there, under
    a spin lock); a process worker forked in that window never answered. close() waits them out."""

    def multiply(job: Job) -> None:
        matrix = torch.ones(64, 64, dtype=torch.float64)
        job.tokens = [int((matrix @ matrix)[0, 0])]

    for _ in range(20):
        worker = new_worker("thread", multiply)
        job = new_job()
        worker.submit(job)
        worker.wait(job)
        native_id = worker.thread.native_id
        worker.close()
        assert job.tokens == [64]
        assert not os.path.exists(f"/proc/self/task/{native_id}")


# --------------------------------------------------------------------- gamma
def test_gamma_is_the_clamped_ratio_and_measured_once(monkeypatch):
    """Fake step times: the ratio is clamped to [2, max_gamma] and each (pair, cap) is timed once."""
    target, draft, slow_draft = (build_model("llama", hidden=16, layers=1, seed=s) for s in (5, 6, 7))
    seconds = {id(target): 0.1, id(draft): 0.001, id(slow_draft): 0.3}
    timed = []

    def fake_timer(model, tokens, context=32):
        timed.append(model)
        return lambda: seconds[id(model)]

    monkeypatch.setattr(pearl, "cached_forward_timer", fake_timer)
    assert measure_gamma(target, draft) == 8, "ratio 100, clamped to the default max_gamma"
    assert measure_gamma(target, draft, max_gamma=4) == 4
    assert measure_gamma(target, slow_draft) == 2, "a draft slower than the target gets the minimum"
    assert len(timed) == 6, "one timer per model and measurement"
    assert measure_gamma(target, draft) == 8 and measure_gamma(target, draft, max_gamma=4) == 4
    assert len(timed) == 6, "cached: no new measurement"


def test_measured_gamma_on_real_models():
    target, draft = build_model("llama", hidden=64, layers=4), build_model("llama", hidden=16, layers=1, seed=2)
    assert 2 <= measure_gamma(target, draft, max_gamma=8) <= 8
    assert 2 <= measure_gamma(target, draft, max_gamma=3) <= 3
    draft_copy = build_draft(target, "copy")
    assert measure_gamma(target, draft_copy) <= 3, "a draft as expensive as the target gets (about) the minimum"
