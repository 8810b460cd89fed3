"""A/B for the busy-engine run: PacerLookupProposer without its cache (as pacer-fresh) that never spends a step
plain to time the batch's own size (the behaviour before measures_plain_step)."""
from pacer_hf.vllm.proposer import PacerLookupProposer


class NoExplore(PacerLookupProposer):
    def __init__(self, vllm_config, gate=None):
        super().__init__(vllm_config, gate)
        self.suffix_cache = None

    def measures_plain_step(self, rows):
        return False
