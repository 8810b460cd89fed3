"""The machine a benchmark ran on: physical cores (the default torch thread count) and the facts stated next to
every published number."""

from __future__ import annotations

import os
import platform

import torch
import transformers

import pacer_hf

from ..costs import cpu_name
from ..costs.blas import cpu_vendor, mkl_code_path


def physical_cores() -> int:
    """Physical cores from /proc/cpuinfo ((physical id, core id) pairs); os.cpu_count() elsewhere."""
    try:
        pairs, current = set(), {}
        for line in open("/proc/cpuinfo"):
            key, _, value = line.partition(":")
            key = key.strip()
            if key in ("physical id", "core id"):
                current[key] = value.strip()
            elif not line.strip() and current:
                pairs.add((current.get("physical id"), current.get("core id")))
                current = {}
        if current:
            pairs.add((current.get("physical id"), current.get("core id")))
        if pairs and (None, None) not in pairs:
            return len(pairs)
    except OSError:
        pass
    return os.cpu_count() or 1


def machine_info(threads: int) -> dict:
    """CPU model, cores and library versions: stated next to every published number."""
    from transformers.utils import is_sklearn_available

    return {"cpu": cpu_name(), "physical_cores": physical_cores(), "logical_cpus": os.cpu_count(),
            "torch_threads": threads, "torch": torch.__version__, "transformers": transformers.__version__,
            "python": platform.python_version(), "platform": platform.platform(),
            "scikit_learn": is_sklearn_available(), "pacer_hf": pacer_hf.__version__,
            "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
            "cpu_vendor": cpu_vendor(), "mkl_path": mkl_code_path()}
