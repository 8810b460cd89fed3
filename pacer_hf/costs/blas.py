"""Which matrix kernels torch's MKL runs on this CPU, and the one-function library that gives a non-Intel x86 CPU
MKL's fast ones (`pacer-hf mkl-shim`).

Why it matters here: a verify multiplies every weight by a few rows (the drafted tokens), and MKL picks its kernels
by CPU vendor. On a CPU that does not report GenuineIntel it runs generic code, whose products of 2 or 3 rows cost
about 2 or 3 one-row products, so a verify of 2-3 tokens costs 2-3 target steps and short rounds cannot pay. MKL
asks one exported function, `mkl_serv_intel_cpu_true`, whether the CPU is Intel. A library that defines it to
return 1, preloaded before torch (`LD_PRELOAD`), makes MKL take the kernels it takes on Intel CPUs; the CPU's own
instruction set still decides which of those run. That is a choice for the whole process, made before it starts:
pacer_hf never sets it, it only builds the library on request and reports which path the running process takes
(part of `processor_name`, so probed costs are kept apart per path). docs/CPU.md has the measured curves.
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import os
import shutil
import subprocess
from pathlib import Path

import torch

SHIM_NAME = "libpacer_mkl_intel_path.so"
SHIM_SOURCE = "int mkl_serv_intel_cpu_true(void) { return 1; }\n"
_DEFAULT_DIR = Path.home() / ".cache" / "pacer_hf" / "mkl-shim"
_CPUINFO = Path("/proc/cpuinfo")


@functools.cache
def cpuinfo() -> dict[str, str]:
    """Each field's first value in /proc/cpuinfo ({} where there is none), read once: the cost probes name the CPU on
    every call, and on a many-core machine the file is long."""
    fields: dict[str, str] = {}
    try:
        for line in _CPUINFO.read_text().splitlines():
            key, _, value = line.partition(":")
            fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return fields


def cpu_vendor() -> str:
    """The x86 vendor string ("GenuineIntel", "AuthenticAMD", ...) from /proc/cpuinfo, or "" where there is none."""
    return cpuinfo().get("vendor_id", "")


@functools.cache
def _preloaded_answer() -> int | None:
    """What `mkl_serv_intel_cpu_true` answers in the process's global symbol scope, where a preloaded library is
    found before the MKL inside torch; None when the scope has no such function (torch's MKL is not global). Asked
    once: what is preloaded is fixed when the process starts."""
    try:
        function = ctypes.CDLL(None).mkl_serv_intel_cpu_true
    except (AttributeError, OSError, TypeError):
        return None
    function.restype = ctypes.c_int
    return int(function())


def mkl_code_path() -> str:
    """"intel" (MKL's Intel kernels: an Intel CPU, or another with the shim preloaded), "generic" (a non-Intel x86
    CPU without it), or "none" (torch has no MKL, or the CPU is not x86)."""
    vendor = cpu_vendor()
    if not torch.backends.mkl.is_available() or not vendor:
        return "none"
    if vendor == "GenuineIntel" or _preloaded_answer() == 1:
        return "intel"
    return "generic"


def build_shim(out_dir: str | os.PathLike | None = None, compiler: str | None = None) -> Path:
    """Compile the one-function library into `out_dir` (default ~/.cache/pacer_hf/mkl-shim) and return its path."""
    out = Path(out_dir) if out_dir is not None else _DEFAULT_DIR
    cc = compiler or next((name for name in ("cc", "gcc", "clang") if shutil.which(name)), None)
    if cc is None or shutil.which(cc) is None:
        raise RuntimeError(f"No C compiler found ({compiler or 'cc, gcc, clang'}): install one (e.g. `apt install gcc`)"
                           f" or compile this one line yourself into a shared library:\n{SHIM_SOURCE}")
    out.mkdir(parents=True, exist_ok=True)
    source, library = out / "mkl_intel_path.c", out / SHIM_NAME
    source.write_text(SHIM_SOURCE)
    subprocess.run([cc, "-shared", "-fPIC", "-O2", "-o", str(library), str(source)], check=True)
    return library


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default=None, help=f"folder for the library (default {_DEFAULT_DIR})")
    parser.add_argument("--compiler", default=None, help="C compiler (default: the first of cc, gcc, clang found)")
    parser.add_argument("--print-path", action="store_true",
                        help="build and print only the library's path: LD_PRELOAD=$(pacer-hf mkl-shim --print-path)")


def run(args: argparse.Namespace) -> int:
    if args.print_path:
        print(build_shim(args.out, args.compiler))
        return 0
    vendor, path = cpu_vendor() or "not x86", mkl_code_path()
    print(f"CPU vendor: {vendor}; torch's MKL in this process: {path}")
    if path == "none":
        print("Nothing to do: torch here has no MKL, or the CPU is not x86.")
        return 0
    if path == "intel":
        print("Nothing to do: MKL already runs its Intel kernels in this process.")
        return 0
    library = build_shim(args.out, args.compiler)
    print(f"Built {library}. Start the process with it preloaded, e.g.\n"
          f"  export LD_PRELOAD={library}${{LD_PRELOAD:+:$LD_PRELOAD}}\n"
          "then `python -c 'from pacer_hf.costs.blas import mkl_code_path; print(mkl_code_path())'` prints intel.\n"
          "Costs probed under one path are not reused under the other; pacer-hf bench states the path it ran.")
    return 0
