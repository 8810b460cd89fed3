"""Which kernels torch's MKL runs (`costs.blas`): the vendor read, the path reported, the shim built and seen by a
process that preloads it, and the path kept apart in where costs were measured (`processor_name`, the bench)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from pacer_hf.bench.machine import machine_info
from pacer_hf.bench.report import machine_lines
from pacer_hf.costs import blas, measure

COMPILER = next((name for name in ("cc", "gcc", "clang") if shutil.which(name)), None)


@pytest.fixture
def fresh_cpuinfo():
    """`blas.cpuinfo` reads the file once per process: forget it around a test that swaps the file."""
    blas.cpuinfo.cache_clear()
    yield blas.cpuinfo.cache_clear
    blas.cpuinfo.cache_clear()


def test_the_vendor_is_read_from_cpuinfo(tmp_path, monkeypatch, fresh_cpuinfo):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC\n")
    monkeypatch.setattr(blas, "_CPUINFO", info)
    assert blas.cpu_vendor() == "AuthenticAMD"
    assert measure.cpu_name() == "AMD EPYC"
    info.write_text("processor\t: 0\nmodel name\t: some ARM core\n")
    fresh_cpuinfo()
    assert blas.cpu_vendor() == ""
    monkeypatch.setattr(blas, "_CPUINFO", tmp_path / "missing")
    fresh_cpuinfo()
    assert blas.cpu_vendor() == ""


@pytest.mark.parametrize(("vendor", "mkl", "answer", "path"), [
    ("GenuineIntel", True, None, "intel"),
    ("AuthenticAMD", True, None, "generic"),
    ("AuthenticAMD", True, 0, "generic"),
    ("AuthenticAMD", True, 1, "intel"),
    ("AuthenticAMD", False, 1, "none"),
    ("", True, None, "none"),
])
def test_the_path_follows_vendor_mkl_and_preloaded_answer(monkeypatch, vendor, mkl, answer, path):
    monkeypatch.setattr(blas, "cpu_vendor", lambda: vendor)
    monkeypatch.setattr(blas.torch.backends.mkl, "is_available", lambda: mkl)
    monkeypatch.setattr(blas, "_preloaded_answer", lambda: answer)
    assert blas.mkl_code_path() == path


def test_no_compiler_is_refused_with_the_fix(tmp_path):
    with pytest.raises(RuntimeError, match="(?s)No C compiler found.*apt install gcc.*mkl_serv_intel_cpu_true"):
        blas.build_shim(tmp_path, compiler="no-such-compiler-here")


@pytest.mark.skipif(COMPILER is None, reason="no C compiler on this machine")
def test_a_process_that_preloads_the_shim_gets_the_intel_answer(tmp_path):
    library = blas.build_shim(tmp_path)
    assert library.name == blas.SHIM_NAME and library.is_file()
    probe = "from pacer_hf.costs.blas import _preloaded_answer; print(_preloaded_answer())"
    env = {**os.environ, "LD_PRELOAD": str(library)}
    preloaded = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
    assert preloaded.stdout.strip() == "1"
    env.pop("LD_PRELOAD")
    plain = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
    assert plain.stdout.strip() != "1" or blas.cpu_vendor() == "GenuineIntel"


def test_costs_measured_under_the_intel_path_on_another_vendor_are_kept_apart(monkeypatch):
    monkeypatch.setattr(measure.torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(measure, "cpu_name", lambda: "AMD EPYC")
    monkeypatch.setattr(measure, "cpu_vendor", lambda: "AuthenticAMD")
    monkeypatch.setattr(measure, "mkl_code_path", lambda: "generic")
    assert measure.processor_name() == "AMD EPYC"
    monkeypatch.setattr(measure, "mkl_code_path", lambda: "intel")
    assert measure.processor_name() == "AMD EPYC (MKL Intel path)"
    monkeypatch.setattr(measure, "cpu_vendor", lambda: "GenuineIntel")
    assert measure.processor_name() == "AMD EPYC"


def test_the_bench_states_the_path_it_ran():
    machine = machine_info(1)
    assert machine["mkl_path"] == blas.mkl_code_path() and machine["cpu_vendor"] == blas.cpu_vendor()
    assert f"MKL kernels: {machine['mkl_path']}" in machine_lines({"machine": machine})
    del machine["mkl_path"]
    assert "MKL kernels" not in machine_lines({"machine": machine})
