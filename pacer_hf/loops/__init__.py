"""The decoding loops and their caches.

- `lean_loop.py`: the verification loop for one sequence (candidates, one target forward, the accept step);
- `batch_loop.py` + `batch_cache.py`: the same for a left-padded batch, rows rolling back on their own;
- `draft_loop.py`: the drafting loop (a transformers `CandidateGenerator`);
- `stop_rule.py`: Pacer's stop rule for every loop (scoring path, costs, decision), with `block_scorer.py` (torch
  and CUDA-graph scoring) and `preverifier_kernel.py` (compiled CPU scoring); `stop_rule_setup.py` builds a call's
  rule and measures the costs it reads;
- `draft_forwards.py` + `lean_draft.py`: the draft's decode step (its own forward, compiled, or lean tensor ops).

What differs between model families (sliding windows, chunked attention, caches that cannot roll back) stays
in the cache helpers of `pacer_hf._hf_compat` (`new_cache`, `crop_cache`, `check_cache_support`), never in a loop.
"""
