"""Prompts and corpora read by the benchmark, the recipes and the vLLM benchmark alike (below all three)."""
