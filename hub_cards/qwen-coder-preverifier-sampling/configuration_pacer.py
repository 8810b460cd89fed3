"""Configuration of the Pacer pre-verifier.

Self-contained (imports only transformers) so that a Hub repository can ship this file next to
`modeling_pacer.py` and load with `trust_remote_code=True` without pacer_hf installed.
"""

from __future__ import annotations

from transformers import PretrainedConfig

DECISION_RULES = ("block", "cumulative", "expected_gain")
INPUT_MODES = ("both", "hidden", "features")
DECODINGS = ("greedy", "sampling", None)
NUM_DRAFT_FEATURES = 3  # log-prob of the chosen token, entropy, top-1/top-2 probability margin
NUM_LOOP_FEATURES = 3  # the previous round's accepted share and whether it was a full round, the target's confidence


class PacerConfig(PretrainedConfig):
    r"""Configuration of a [`PacerPreVerifier`].

    Args:
        draft_hidden_size (`int`): width of the draft's last hidden state (input of its `lm_head`).
        hidden_size (`int`): width of the pre-verifier's own transformer layer.
        num_attention_heads (`int`): heads of that layer.
        intermediate_size (`int`): MLP width of that layer.
        max_draft_tokens (`int`): hard cap L_max on the tokens drafted per round.
        block_size (`int`): the pre-verifier decides after every `block_size` drafted tokens.
        threshold (`float`): a block passes when its predicted survival probability is >= threshold.
            `0` never stops early; `1` always stops after the first block.
        decision_rule (`str`): `"block"` scores the survival of the block just drafted (product of its
            per-token acceptance probabilities) against `threshold`; `"cumulative"` scores the whole draft of
            the round; `"expected_gain"` drafts on while a longer draft is expected to yield more tokens per
            unit of time, under the cost model in `calibration` (set by `pacer-hf calibrate`).
        input_mode (`str`): `"both"`, `"hidden"` (draft hidden states only) or `"features"`
            (draft-distribution features only); used by the ablations.
        trim_failed_block (`bool`): greedy only: a stopped round proposes a prefix of its drafted tokens instead of
            sending them all: under `"expected_gain"` the prefix with the best expected rate under the costs
            (the drafting paid), else the failed block cut at `trim_cutoff`. Never exact for sampling, so generate
            refuses it there.
        trim_first_block (`bool`): greedy calls under `"expected_gain"` with measured costs: a round the rule stops
            at its first block proposes that block's best prefix, none included, so where a narrow verify costs
            more than a plain step (two target steps for two tokens on some CPUs) a doubtful round ends with a plain
            step. Only the first block: a longer round is sent whole, as stop-only sends it. Sampled calls and the
            batched loop's rows send what they drafted, whatever this says.
        trim_cutoff (`float`): with `trim_failed_block` and a threshold rule, a failed block keeps its tokens up
            to the first one whose predicted acceptance probability is below this.
        reject_weight (`float`): loss weight of the reject class (label 0) in training.
        draft_model (`str`): name or path of the draft this pre-verifier was built or trained for.
        target_model (`str`): name or path of the target it was trained against.
        draft_signature (`dict`): architecture of that draft (`model_type`, `hidden_size`,
            `num_hidden_layers`, `vocab_size`); a different draft is refused at generate time.
        cost_ratio (`float`): measured t(draft step) / t(target step) used to calibrate block size
            and threshold, with `calibration` holding the rest of that measurement.
        loop_features (`bool`): also read what the speculative loop knows before a round starts and the draft
            cannot see (`modeling_pacer.loop_features`): how many of the previous round's drafted tokens the target
            accepted, whether that was `max_draft_tokens`, and the target's probability of the last token it chose.
        decoding (`str`): what its training rounds were drafted and labelled for: `"greedy"` (greedy drafts, hard
            labels) or `"sampling"` (sampled drafts, soft labels min(1, p/q)); None when not recorded. A pre-verifier
            is calibrated for one of them: `pacer_hf.attach` keeps one of each, and generate picks by `do_sample`.
        online_calibration (`bool`): refit a logistic map of the acceptance logits, p = sigmoid(a * z + b), to the
            rounds the target verifies, kept per pair and decoding mode between calls: for a pre-verifier trained
            on other pairs (the default one), whose probabilities are another pair's acceptance.
    """

    model_type = "pacer_preverifier"

    def __init__(
        self,
        draft_hidden_size: int = 256,
        hidden_size: int = 64,
        num_attention_heads: int = 4,
        intermediate_size: int = 128,
        max_draft_tokens: int = 16,
        block_size: int = 4,
        threshold: float = 0.5,
        decision_rule: str = "block",
        input_mode: str = "both",
        trim_failed_block: bool = False,
        trim_first_block: bool = True,
        trim_cutoff: float = 0.5,
        reject_weight: float = 1.0,
        draft_model: str | None = None,
        target_model: str | None = None,
        draft_signature: dict | None = None,
        cost_ratio: float | None = None,
        calibration: dict | None = None,
        initializer_range: float = 0.02,
        loop_features: bool = False,
        decoding: str | None = None,
        online_calibration: bool = False,
        **kwargs,
    ):
        if decision_rule not in DECISION_RULES:
            raise ValueError(f"decision_rule={decision_rule!r} is not one of {DECISION_RULES}.")
        if decision_rule == "expected_gain" and not {"draft_cost", "verify_cost"} <= set(calibration or {}):
            raise ValueError("decision_rule='expected_gain' needs the pair's measured costs in calibration "
                             "(draft_cost, verify_cost): run `pacer-hf calibrate`, or use decision_rule='block'.")
        if decoding not in DECODINGS:
            raise ValueError(f"decoding={decoding!r} is not one of {DECODINGS}.")
        if input_mode not in INPUT_MODES:
            raise ValueError(f"input_mode={input_mode!r} is not one of {INPUT_MODES}.")
        if not 0.0 <= float(threshold) <= 1.0:
            raise ValueError(f"threshold={threshold} must lie in [0, 1] (0 never stops early, 1 stops after one block).")
        if not 0.0 <= float(trim_cutoff) <= 1.0:
            raise ValueError(f"trim_cutoff={trim_cutoff} must lie in [0, 1].")
        if block_size < 1 or max_draft_tokens < 1:
            raise ValueError(f"block_size={block_size} and max_draft_tokens={max_draft_tokens} must both be >= 1.")
        if hidden_size % num_attention_heads:
            raise ValueError(f"hidden_size={hidden_size} must be divisible by num_attention_heads={num_attention_heads}.")
        self.draft_hidden_size = draft_hidden_size
        self.hidden_size = hidden_size
        self.num_attention_heads = num_attention_heads
        self.intermediate_size = intermediate_size
        self.max_draft_tokens = max_draft_tokens
        self.block_size = block_size
        self.threshold = float(threshold)
        self.decision_rule = decision_rule
        self.input_mode = input_mode
        self.trim_failed_block = trim_failed_block
        self.trim_first_block = bool(trim_first_block)
        self.trim_cutoff = float(trim_cutoff)
        self.reject_weight = reject_weight
        self.draft_model = draft_model
        self.target_model = target_model
        self.draft_signature = draft_signature
        self.cost_ratio = cost_ratio
        self.calibration = calibration
        self.initializer_range = initializer_range
        self.loop_features = bool(loop_features)
        self.decoding = decoding
        self.online_calibration = bool(online_calibration)
        super().__init__(**kwargs)


# save_pretrained writes `auto_map` and this file, so the Hub repo loads without pacer_hf installed.
PacerConfig.register_for_auto_class()
