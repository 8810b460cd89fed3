"""Pacer inside vLLM: `PacerLookupProposer`, prompt-lookup drafts gated by Pacer's lookup gate.

    from vllm import LLM
    llm = LLM(model, speculative_config={"method": "custom_class",
                                         "model": "pacer_hf.vllm.PacerLookupProposer",
                                         "num_speculative_tokens": 10})

Install with `pip install "pacer-hf[vllm]"` in an environment of its own (vLLM pins its transformers), then
remove the CUDA builds of torchvision, torchaudio and torchcodec it pulls in (`check_environment()` says so;
docs/VLLM.md). The gate is pacer_hf's default one unless `$PACER_HF_VLLM_GATE` or
`additional_config={"pacer_hf": {"gate": <folder or Hub id>}}` names another. This package imports no vLLM
module: vLLM imports it.
"""

from ..costs.step_costs import StepCosts
from .allocation import allocate
from .environment import check_environment
from .proposer import GATE_ENV, STATS_ENV, PacerLookupProposer

PROPOSER_PATH = "pacer_hf.vllm.PacerLookupProposer"

__all__ = ["GATE_ENV", "PROPOSER_PATH", "STATS_ENV", "PacerLookupProposer", "StepCosts", "allocate",
           "check_environment"]
