"""vLLM's own n-gram rule as a `custom_class` proposer: what the custom-proposer path costs by itself.

vLLM's built-in `ngram` method and this class propose the same drafts (vLLM's compiled search for the longest
2-5-token n-gram, a fixed `num_speculative_tokens`), so the benchmark's gap between them is the price of
vLLM's `custom_class` plumbing that any custom proposer, Pacer's included, pays:

    PYTHONPATH=examples .venv-vllm/bin/pacer-hf bench --engine vllm --pair smollm2 \
        --categories chat-rewrite,chat-docstring --strategies none,ngram-5,custom:vllm_ngram_proposer.NgramAsCustom:5
"""

from __future__ import annotations

import numpy as np


class NgramAsCustom:
    def __init__(self, vllm_config):
        from vllm.v1.spec_decode.ngram_proposer import _find_longest_matched_ngram_and_propose_tokens

        self.search = _find_longest_matched_ngram_and_propose_tokens
        self.k = vllm_config.speculative_config.num_speculative_tokens
        self.max_model_len = vllm_config.model_config.max_model_len

    def load_model(self, *args, **kwargs) -> None:
        pass

    def propose(self, sampled_token_ids: list[list[int]], num_tokens_no_spec: np.ndarray, token_ids_cpu: np.ndarray,
                slot_mappings=None) -> list[list[int]]:
        drafts = []
        for row, sampled in enumerate(sampled_token_ids):
            n = int(num_tokens_no_spec[row])
            drafts.append(self.search(token_ids_cpu[row, :n], 2, 5, self.max_model_len, self.k).tolist() if sampled
                          else [])
        return drafts
