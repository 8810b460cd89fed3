"""PEARL (pacer="pearl"): exact like every strategy (DESIGN §5); its worker (process or thread) never leaks or hangs."""

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
from conftest import (
    ARCHITECTURES,
    DRAFT_KINDS,
    build_draft,
    build_model,
    logits_processor_case,
    make_preverifier,
    plain_greedy,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_core_exactness import prompt
from test_core_sampling import exact_distributions, goodness_of_fit, sample_counts, sampling_pair  # noqa: F401

import pacer_hf
from pacer_hf.generation import STRATEGIES
from pacer_hf.pearl import PearlConfig, measure_gamma, register, worker_mode

WORKER = "pacer-hf-pearl-draft"


@pytest.fixture(scope="module", autouse=True)
def pearl_strategies():
    """Fixed-gamma variants (the auto gamma of equal-size test pairs is always 2)."""
    names = []
    for gamma in (2, 3, 5):
        for parallel in (True, False):
            name = f"pearl-test-{gamma}-{'par' if parallel else 'seq'}"
            register(name, PearlConfig(gamma=gamma, parallel=parallel))
            names.append(name)
    for gamma in (3, 5):  # the thread worker (what a CUDA draft uses) next to the default process worker on a CPU
        register(f"pearl-test-{gamma}-thread", PearlConfig(gamma=gamma, worker="thread"))
        names.append(f"pearl-test-{gamma}-thread")
    register("pacer+pearl-test", PearlConfig(use_preverifier=True))
    register("pearl-test-3-resync", PearlConfig(gamma=3, resync_tokens=2))
    register("pearl-test-5-resync-seq", PearlConfig(gamma=5, resync_tokens=1, parallel=False))
    names += ["pacer+pearl-test", "pearl-test-3-resync", "pearl-test-5-resync-seq"]
    yield
    for name in names:
        del STRATEGIES[name]


def workers() -> list:
    """Live PEARL workers: threads of this process and child processes (active_children also reaps)."""
    threads = [t for t in threading.enumerate() if t.name == WORKER]
    return threads + [p for p in multiprocessing.active_children() if p.name == WORKER]


@pytest.fixture(autouse=True)
def no_leaked_worker():
    yield
    assert not workers(), "a PEARL worker (thread or process) outlived generate"


@pytest.mark.parametrize("arch", ARCHITECTURES)
@pytest.mark.parametrize("kind", DRAFT_KINDS)
def test_greedy_identical(pair, arch, kind):
    target, draft = pair(arch, kind)
    ids = prompt(seed=sum(map(ord, arch + kind)))
    expected = plain_greedy(target, ids, max_new_tokens=21)
    names = ["pearl", "pearl-resync", "pearl-test-3-resync", "pearl-test-5-resync-seq"]
    modes = [f"pearl-test-{g}-{m}" for g in (2, 3, 5) for m in ("par", "seq")] + ["pearl-test-3-thread", "pearl-thread"]
    for name in names + modes:
        out = target.generate(ids, max_new_tokens=21, do_sample=False, assistant_model=draft, pacer=name)
        assert torch.equal(out, expected), name
        stats = pacer_hf.last_stats(target)
        assert stats.new_tokens == 21 and len(stats.accepted) == len(stats.draft_lengths) == stats.target_forwards
        assert all(a <= d for a, d in zip(stats.accepted, stats.draft_lengths))
        assert max(stats.draft_lengths) <= stats.gamma - 1 or "resync" in name
        if kind == "copy" and "resync" not in name:
            assert stats.jobs_kept >= stats.jobs - 2, "an exact copy keeps every job but the one cut by max length"
        if kind == "random":
            assert stats.jobs_kept <= stats.jobs // 2


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_greedy_identical_float32_and_sequential_equivalence(pair, arch):
    target, draft = pair(arch, "noisy", torch.float32)
    for seed in range(3):
        ids = prompt(seed=seed)
        expected = plain_greedy(target, ids, max_new_tokens=24)
        rounds = {}
        for mode, worker in (("par", "process"), ("seq", "sequential"), ("thread", "thread")):
            out = target.generate(ids, max_new_tokens=24, do_sample=False, assistant_model=draft,
                                  pacer=f"pearl-test-3-{mode}")
            assert torch.equal(out, expected)
            stats = pacer_hf.last_stats(target)
            assert stats.worker == worker
            rounds[mode] = (stats.draft_lengths, stats.accepted, stats.jobs_kept)
        assert rounds["par"] == rounds["seq"] == rounds["thread"], "concurrency must not change a single decision"


@pytest.mark.parametrize("arch", ARCHITECTURES)
@pytest.mark.parametrize("eos_position", [1, 2, 5])
def test_eos_inside_a_job(pair, arch, eos_position):
    target, draft = pair(arch, "copy")
    ids = prompt(seed=11)
    free = plain_greedy(target, ids, max_new_tokens=12)
    eos = int(free[0, ids.shape[1] + eos_position])
    expected = plain_greedy(target, ids, max_new_tokens=12, eos_token_id=eos, pad_token_id=eos)
    for name in ("pearl-test-5-par", "pearl-test-5-seq", "pearl-test-5-thread", "pearl-test-5-resync-seq"):
        out = target.generate(ids, max_new_tokens=12, do_sample=False, assistant_model=draft, pacer=name,
                              eos_token_id=eos, pad_token_id=eos)
        assert torch.equal(out, expected)
        assert out.shape[1] <= ids.shape[1] + eos_position + 1


@pytest.mark.parametrize("max_new_tokens", [1, 2, 3, 5, 8, 13])
def test_max_new_tokens_edges(pair, max_new_tokens):
    target, draft = pair("llama", "copy")
    ids = prompt(seed=2)
    expected = plain_greedy(target, ids, max_new_tokens=max_new_tokens)
    for name in ("pearl-test-5-par", "pearl-test-2-par", "pearl-test-3-resync"):
        out = target.generate(ids, max_new_tokens=max_new_tokens, do_sample=False, assistant_model=draft, pacer=name)
        assert torch.equal(out, expected)
        assert pacer_hf.last_stats(target).new_tokens == max_new_tokens


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_logits_processors_active(pair, arch):
    target, draft = pair(arch, "noisy")
    ids = prompt(seed=4)
    kwargs, expected = logits_processor_case(target, ids)
    for name in ("pearl-test-3-par", "pearl-test-5-seq", "pearl-test-3-thread", "pearl-test-3-resync"):
        out = target.generate(ids, do_sample=False, assistant_model=draft, pacer=name, **kwargs)
        assert torch.equal(out, expected)


@pytest.mark.parametrize("threshold", [0.0, 0.5, 1.0])
def test_pacer_plus_pearl_greedy_identical(pair, threshold):
    target, draft = pair("llama", "noisy")
    pacer_hf.attach(draft, make_preverifier(draft, block_size=2, threshold=threshold, max_draft_tokens=6))
    try:
        lengths = set()
        for seed in range(3):
            ids = prompt(seed=seed)
            expected = plain_greedy(target, ids, max_new_tokens=20)
            out = target.generate(ids, max_new_tokens=20, do_sample=False, assistant_model=draft,
                                  pacer="pacer+pearl-test")
            assert torch.equal(out, expected)
            lengths.update(pacer_hf.last_stats(target).draft_lengths)
        if threshold == 1.0:
            assert lengths <= {0, 1}, "threshold 1 ends every job after its first block of 2"
    finally:
        del draft._pacer_preverifier


def test_pacer_plus_pearl_needs_an_attached_preverifier(pair):
    target, draft = pair("llama", "random")
    with pytest.raises(ValueError, match="attach"):
        target.generate(prompt(), max_new_tokens=3, do_sample=False, assistant_model=draft, pacer="pacer+pearl")


@settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    arch=st.sampled_from(ARCHITECTURES),
    kind=st.sampled_from(DRAFT_KINDS),
    tokens=st.lists(st.integers(0, 95), min_size=1, max_size=12),
    name=st.sampled_from([f"pearl-test-{g}-{m}" for g in (2, 3, 5) for m in ("par", "seq")]
                         + ["pearl-test-3-resync", "pearl-test-5-resync-seq", "pearl-test-3-thread"]),
    max_new_tokens=st.integers(1, 25),
)
def test_property_greedy_identical(pair, arch, kind, tokens, name, max_new_tokens):
    target, draft = pair(arch, kind)
    ids = torch.tensor([tokens])
    expected = plain_greedy(target, ids, max_new_tokens=max_new_tokens)
    out = target.generate(ids, max_new_tokens=max_new_tokens, do_sample=False, assistant_model=draft, pacer=name)
    assert torch.equal(out, expected)


@pytest.mark.parametrize("name", ["pearl-test-3-par", "pearl-test-3-resync", "pearl-test-3-thread"])
def test_sampling_matches_target_distribution(sampling_pair, name):  # noqa: F811
    target, draft = sampling_pair
    p1, p12 = exact_distributions(target)
    first, joint, accepted = sample_counts(target, draft, name, seed=0, samples=500)
    assert 0 < sum(accepted), "some draft-ahead jobs must be kept for the test to mean much"
    assert goodness_of_fit(first, p1) > 1e-3
    assert goodness_of_fit(joint, p12) > 1e-3


def test_sampling_is_reproducible_and_independent_of_concurrency(sampling_pair):  # noqa: F811
    """The draft samples with its own per-job-seeded generator: process == thread == sequential under one seed."""
    target, draft = sampling_pair
    outputs = {}
    for mode in ("par", "seq", "thread"):
        torch.manual_seed(7)
        outputs[mode] = [target.generate(torch.tensor([[1, 7, 3, 3, 8]]), max_new_tokens=12, do_sample=True,
                                         temperature=0.9, top_k=0, assistant_model=draft,
                                         pacer=f"pearl-test-3-{mode}") for _ in range(6)]
    assert all(torch.equal(a, b) for a, b in zip(outputs["par"], outputs["seq"]))
    assert all(torch.equal(a, b) for a, b in zip(outputs["thread"], outputs["seq"]))


class _Failing(torch.nn.Module):
    """Wraps a draft; its forward raises (or sleeps) from call `after` on."""

    def __init__(self, draft, after: int, sleep: float | None = None):
        super().__init__()
        self.inner, self.after, self.sleep, self.calls = draft, after, sleep, 0
        self.config, self.generation_config = draft.config, draft.generation_config

    def forward(self, *args, **kwargs):
        self.calls += 1
        if self.calls >= self.after:
            if self.sleep is None:
                raise RuntimeError("draft exploded on purpose")
            time.sleep(self.sleep)
        return self.inner(*args, **kwargs)

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.inner, name)


@pytest.mark.parametrize("mode", ["par", "thread"])
@pytest.mark.parametrize("after", [1, 4])
def test_worker_error_surfaces_quickly(pair, after, mode):
    target, draft = pair("llama", "copy")
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="PEARL draft worker failed: RuntimeError: draft exploded on purpose"):
        target.generate(prompt(), max_new_tokens=30, do_sample=False, assistant_model=_Failing(draft, after),
                        pacer=f"pearl-test-3-{mode}")
    assert time.monotonic() - start < 5
    assert not workers()


class _Killed(_Failing):
    """Its forward kills the process it runs in from call `after` on, unless that is the test process."""

    def forward(self, *args, **kwargs):
        self.calls += 1
        if self.calls >= self.after and os.getpid() != PARENT:
            os.kill(os.getpid(), signal.SIGKILL)
        return self.inner(*args, **kwargs)


PARENT = os.getpid()


@pytest.mark.parametrize("after", [1, 3])
def test_killed_worker_process_surfaces_quickly(pair, after):
    target, draft = pair("llama", "copy")
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=r"worker process died \(exit code -9\)"):
        target.generate(prompt(), max_new_tokens=30, do_sample=False, assistant_model=_Killed(draft, after),
                        pacer="pearl-test-3-par")
    assert time.monotonic() - start < 5
    assert not workers()


@pytest.mark.parametrize("worker", ["process", "thread"])
def test_hung_worker_times_out(pair, worker):
    target, draft = pair("llama", "copy")
    register("pearl-test-timeout", PearlConfig(gamma=3, timeout_s=0.3, worker=worker))
    try:
        start = time.monotonic()
        with pytest.raises(TimeoutError, match="timeout_s"):
            target.generate(prompt(), max_new_tokens=30, do_sample=False,
                            assistant_model=_Failing(draft, 3, sleep=1.0), pacer="pearl-test-timeout")
        assert time.monotonic() - start < 5
    finally:
        del STRATEGIES["pearl-test-timeout"]


@pytest.mark.parametrize("mode", ["par", "thread"])
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
                            pacer=f"pearl-test-5-{mode}")
    finally:
        handle.remove()
    assert not workers()
    assert sys.getswitchinterval() == pytest.approx(0.005), "the GIL switch interval is restored"


def test_gamma_is_measured_once_per_pair():
    target, draft = build_model("llama", hidden=64, layers=4), build_model("llama", hidden=16, layers=1, seed=2)
    gamma = measure_gamma(target, draft)
    assert 2 <= gamma <= 16
    start = time.perf_counter()
    assert measure_gamma(target, draft) == gamma
    assert time.perf_counter() - start < 1e-3
    draft_copy = build_draft(target, "copy")
    assert measure_gamma(target, draft_copy) <= 3, "a draft as expensive as the target gets the minimum gamma"


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


def test_caller_thread_count_untouched(pair):
    """The worker sets its own intra-op thread count; the caller's (the target's) stays as it was."""
    target, draft = pair("llama", "noisy")
    torch.set_num_threads(2)
    try:
        for mode in ("par", "thread"):
            target.generate(prompt(), max_new_tokens=8, do_sample=False, assistant_model=draft,
                            pacer=f"pearl-test-3-{mode}")
            assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(1)
    assert pacer_hf.last_stats(target).parallel and pacer_hf.last_stats(target).jobs > 0


def test_pearl_under_inference_mode(pair):
    """The worker drafts in the caller's autograd mode (modes are thread-local)."""
    target, draft = pair("llama", "noisy")
    ids = prompt(seed=3)
    expected = plain_greedy(target, ids, max_new_tokens=16)
    with torch.inference_mode():
        out = target.generate(ids, max_new_tokens=16, do_sample=False, assistant_model=draft, pacer="pearl")
    assert torch.equal(out, expected)
