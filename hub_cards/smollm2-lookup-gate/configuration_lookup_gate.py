"""Configuration of the lookup gate: Pacer's stop rule for prompt-lookup candidates.

Self-contained (imports only transformers) so that a Hub repository can ship this file next to
`modeling_lookup_gate.py` and load with `trust_remote_code=True` without pacer_hf installed.
"""

from __future__ import annotations

from transformers import PretrainedConfig

LOOKUP_DECISION_RULES = ("expected_gain", "threshold")
NUM_LOOKUP_FEATURES = 10  # see modeling_lookup_gate.FEATURES


class PacerLookupGateConfig(PretrainedConfig):
    r"""Configuration of a [`PacerLookupGate`].

    Args:
        max_lookup_tokens (`int`): the most lookup tokens one round proposes (the gate scores each of them).
        max_ngram_size (`int`): longest suffix n-gram searched for in the text so far (longest first).
        hidden_size (`int`): width of the gate's MLP.
        decision_rule (`str`): `"expected_gain"` proposes the k tokens that maximise expected tokens per
            unit of time, `(1 + sum of the first k survival probabilities) / round_cost[k]`;
            `"threshold"` proposes tokens while their survival probability is >= `threshold`.
        round_cost (`list[float]`, *optional*): cost of a round that proposes k = 0..max_lookup_tokens tokens,
            relative to k = 0 (one target decoding step), on the machine that trained the gate. A prior only:
            `generate` measures the machine it runs on (`pacer_costs="measure"`, the default) and uses this
            table only with `pacer_costs="prior"`.
        threshold (`float`): survival probability a proposed token needs under `"threshold"`.
        target_model (`str`): the target(s) whose answers the gate was trained on (informational).
        vocab_size (`int`): that target's vocabulary size (informational: no feature depends on it).
        training (`dict`): what the gate was trained on and what it measured (written by the trainer).
    """

    model_type = "pacer_lookup_gate"

    def __init__(
        self,
        max_lookup_tokens: int = 10,
        max_ngram_size: int = 3,
        hidden_size: int = 32,
        decision_rule: str = "threshold",
        round_cost: list[float] | None = None,
        threshold: float = 0.5,
        target_model: str | None = None,
        vocab_size: int | None = None,
        training: dict | None = None,
        initializer_range: float = 0.1,
        **kwargs,
    ):
        if decision_rule not in LOOKUP_DECISION_RULES:
            raise ValueError(f"decision_rule={decision_rule!r} is not one of {LOOKUP_DECISION_RULES}.")
        if max_lookup_tokens < 1 or max_ngram_size < 1:
            raise ValueError(f"max_lookup_tokens={max_lookup_tokens} and max_ngram_size={max_ngram_size} must be >= 1.")
        if round_cost is not None and len(round_cost) != max_lookup_tokens + 1:
            raise ValueError(
                f"round_cost holds the cost of proposing k = 0..{max_lookup_tokens} tokens: {max_lookup_tokens + 1} "
                f"numbers; got {len(round_cost)}."
            )
        if not 0.0 <= float(threshold) <= 1.0:
            raise ValueError(f"threshold={threshold} must lie in [0, 1].")
        self.max_lookup_tokens = max_lookup_tokens
        self.max_ngram_size = max_ngram_size
        self.hidden_size = hidden_size
        self.decision_rule = decision_rule
        self.round_cost = None if round_cost is None else [float(c) for c in round_cost]
        self.threshold = float(threshold)
        self.target_model = target_model
        self.vocab_size = vocab_size
        self.training = training
        self.initializer_range = initializer_range
        super().__init__(**kwargs)


# save_pretrained writes `auto_map` and this file, so the Hub repo loads without pacer_hf installed.
PacerLookupGateConfig.register_for_auto_class()
