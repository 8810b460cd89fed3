"""The lookup gate: how many prompt-lookup tokens a round should propose, zero included.

Prompt lookup (`generate(prompt_lookup_num_tokens=N)`) copies the tokens that followed an earlier
occurrence of the text's last n-gram. They cost nothing to draft but the target pays for verifying
them, so proposing N after every match loses wherever matches do not hold. The gate scores each
lookup token with a small MLP over cheap features of the match (below), turns the scores into
survival probabilities (the chance that the target accepts the first j tokens) and proposes the
prefix length with the most expected tokens per unit of time under the measured round costs.
Stop-only: it shortens a deterministic proposal, so greedy output and the sampling distribution are
the target's.

Self-contained (imports only torch, transformers and its configuration) so that it can ship as Hub
remote code. `find_lookup` and `lookup_features` are the single source of the features, used both
when generating and when building training examples.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel
from transformers.utils import ModelOutput

from .configuration_lookup_gate import NUM_LOOKUP_FEATURES, PacerLookupGateConfig

MAX_MATCH_LENGTH = 32  # the backward extension of a match stops here
MAX_OCCURRENCES = 256  # only the most recent occurrences of the n-gram are considered
FEATURES = (
    "position: (j + 1) / max_lookup_tokens",
    "match length: log1p(tokens before the continuation that equal the text's last tokens) / log1p(32)",
    "occurrences of the n-gram: log1p(count) / log1p(256)",
    "agreement: share of the occurrences whose continuation equals the proposal up to token j",
    "the match lies in the prompt (1) or in the generated text (0)",
    "distance: log1p(tokens between the continuation and the end of the text) / log1p(4096)",
    "confidence: the target's probability of the last token it chose (0 before its first step)",
    "first round: 1 before the target's first step, else 0",
    "n-gram order / max_ngram_size",
    "sampling: 1 when generate samples (trained on the target's T=1 acceptance probabilities), 0 for greedy",
)
assert len(FEATURES) == NUM_LOOKUP_FEATURES


@dataclass
class LookupMatch:
    """The continuation of the best earlier occurrence of the text's last n-gram, and its features."""

    tokens: torch.Tensor  # (k,) the proposal, k <= max_tokens
    ngram: int
    match_length: int
    occurrences: int
    start: int  # index of tokens[0] in the text
    agreement: torch.Tensor  # (k,) float


def find_lookup(ids: torch.Tensor | np.ndarray, max_tokens: int, max_ngram: int) -> LookupMatch | None:
    """Search `ids` (1-D: the text so far) for its last n-gram, longest n first (as HF's prompt lookup).

    Of the occurrences of that n-gram, the one whose preceding tokens match the text's furthest back
    (ties: the one followed by more tokens, then the most recent) gives the proposal: the up to
    `max_tokens` tokens that followed it. In numpy: a round's search is a few dozen small array operations,
    and numpy's are several times cheaper to dispatch than torch's."""
    ids = ids.numpy() if isinstance(ids, torch.Tensor) else np.asarray(ids)
    length = ids.shape[0]
    for n in range(min(max_ngram, length - 1), 0, -1):
        same = ids[: length - n] == ids[length - n]  # i: does ids[i:i+n] (followed by ids[i+n]) equal the end?
        for j in range(1, n):
            same &= ids[j : length - n + j] == ids[length - n + j]
        hits = np.flatnonzero(same)[-MAX_OCCURRENCES:]
        if hits.size == 0:
            continue
        back = np.arange(1, min(MAX_MATCH_LENGTH, length) + 1)
        before = hits[:, None] + n - back  # the occurrence's tokens, end first
        same = (ids[np.maximum(before, 0)] == ids[length - back][None]) & (before >= 0)
        match_lengths = same.cumprod(axis=1).sum(axis=1)
        continuation = np.minimum(length - hits - n, max_tokens)
        # the longest match, then the longest continuation (up to max_tokens), then the most recent
        best = int(((match_lengths * (max_tokens + 1) + continuation) * (length + 1) + hits).argmax())
        start = int(hits[best]) + n
        tokens = ids[start : min(start + max_tokens, length)]
        offsets = hits[:, None] + n + np.arange(tokens.shape[0])
        available = offsets < length
        agree = ((ids[np.minimum(offsets, length - 1)] == tokens[None]) & available).cumprod(axis=1)
        agreement = agree.sum(axis=0) / np.maximum(available.sum(axis=0), 1)
        return LookupMatch(torch.from_numpy(tokens.copy()), n, int(match_lengths[best]), int(hits.size), start,
                           torch.from_numpy(agreement.astype(np.float32)))
    return None


def feature_rows(match: LookupMatch, text_length: int, prompt_length: int, confidence: float | None,
                 max_tokens: int, max_ngram: int, sampling: bool = False) -> np.ndarray:
    """(k, NUM_LOOKUP_FEATURES) float32 features of a match, one row per proposed token (FEATURES)."""
    k = match.tokens.shape[0]
    features = np.empty((k, NUM_LOOKUP_FEATURES), dtype=np.float32)
    features[:] = (
        0.0,
        math.log1p(match.match_length) / math.log1p(MAX_MATCH_LENGTH),
        math.log1p(match.occurrences) / math.log1p(MAX_OCCURRENCES),
        0.0,
        float(match.start < prompt_length),
        math.log1p(text_length - match.start) / math.log1p(4096),
        0.0 if confidence is None else float(confidence),
        float(confidence is None),
        match.ngram / max_ngram,
        float(sampling),
    )
    features[:, 0] = np.arange(1, k + 1) / max_tokens
    features[:, 3] = match.agreement.numpy()
    return features


def lookup_features(match: LookupMatch, text_length: int, prompt_length: int, confidence: float | None,
                    max_tokens: int, max_ngram: int, sampling: bool = False) -> torch.Tensor:
    """`feature_rows` as a torch tensor (training, and gates scored by their torch forward)."""
    return torch.from_numpy(feature_rows(match, text_length, prompt_length, confidence, max_tokens, max_ngram,
                                         sampling))


def threshold_length(survival: list[float], threshold: float) -> int:
    """How many leading tokens have survival probability >= `threshold`."""
    return next((k for k, s in enumerate(survival) if s < threshold), len(survival))


def expected_gain_length(survival: list[float], round_cost: list[float]) -> int:
    """The k in 0..len(survival) with the most expected tokens per unit of time, (1 + sum(survival[:k])) /
    round_cost[k]: a round yields its accepted tokens plus the target's own next token. Ties go to the shorter
    prefix, as in the rule's other copies (docs/ALGORITHM.md, "The best prefix")."""
    best, best_rate, expected = 0, 1.0 / round_cost[0], 1.0
    for k, s in enumerate(survival[: len(round_cost) - 1], start=1):
        expected += s
        if expected / round_cost[k] > best_rate:
            best, best_rate = k, expected / round_cost[k]
    return best


@dataclass
class PacerLookupGateOutput(ModelOutput):
    loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None


class PacerLookupGate(PreTrainedModel):
    """Scores prompt-lookup tokens and decides how many a round proposes (`choose_length`).

    `logits[..., j]` is the log-odds that the target accepts lookup token j given it accepted the ones
    before; survival probabilities are their running product. No feature depends on the target's
    vocabulary or size, so one gate serves any causal LM (`pacer_hf.default_lookup_gate()`).
    """

    config_class = PacerLookupGateConfig
    base_model_prefix = "lookup_gate"
    main_input_name = "features"

    def __init__(self, config: PacerLookupGateConfig):
        super().__init__(config)
        width = config.hidden_size
        self.mlp = nn.Sequential(nn.Linear(NUM_LOOKUP_FEATURES, width), nn.GELU(), nn.Linear(width, width), nn.GELU(),
                                 nn.Linear(width, 1))
        self.post_init()

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=self.config.initializer_range)
            nn.init.zeros_(module.bias)

    def forward(self, features: torch.Tensor, labels: torch.Tensor | None = None,
                label_mask: torch.Tensor | None = None) -> PacerLookupGateOutput:
        """`features` (..., k, NUM_LOOKUP_FEATURES); `labels` 1 where the token was accepted; `label_mask` 1 where
        the label counts (the tokens up to and including the first rejected one)."""
        logits = self.mlp(features).squeeze(-1)
        loss = None
        if labels is not None:
            mask = torch.ones_like(logits) if label_mask is None else label_mask.to(logits.dtype)
            losses = F.binary_cross_entropy_with_logits(logits, labels.to(logits.dtype), reduction="none")
            loss = (losses * mask).sum() / mask.sum().clamp(min=1)
        return PacerLookupGateOutput(loss=loss, logits=logits)

    @torch.no_grad()
    def survival(self, features: torch.Tensor) -> torch.Tensor:
        """(k,) probability that the target accepts at least the first j + 1 tokens."""
        return torch.sigmoid(self.mlp(features).squeeze(-1)).cumprod(dim=-1)

    def scorer(self) -> GateScorer:
        """A numpy scorer of the gate's current weights: what generation runs every round (build a new one after
        training)."""
        return GateScorer(self)

    def choose_length(self, survival: list[float], round_cost: list[float] | None = None) -> int:
        """How many of the scored tokens to propose (0..len(survival)), by the config's decision rule.

        `round_cost`: what proposing k = 0, 1, ... tokens costs where the call runs (generate measures it,
        `costs/round_costs.py`); without it, the config's table (the machine that trained the gate)."""
        if self.config.decision_rule == "threshold":
            return threshold_length(survival, self.config.threshold)
        costs = round_cost if round_cost is not None else self.config.round_cost
        if costs is None:
            raise ValueError("decision_rule='expected_gain' needs round costs: pass round_cost= (generate measures "
                             "them on this machine) or set config.round_cost.")
        return expected_gain_length(survival, costs)

    @classmethod
    def from_other_copy(cls, module: nn.Module) -> PacerLookupGate:
        """This class's twin of a gate built by another copy of this code (pacer_hf or Hub remote code):
        `isinstance` fails across copies, so config and weights are carried over."""
        if isinstance(module, cls):
            return module
        config = getattr(module, "config", None)
        if getattr(config, "model_type", None) != PacerLookupGateConfig.model_type:
            raise TypeError(f"{type(module).__name__} is not a Pacer lookup gate.")
        local = cls(PacerLookupGateConfig(**config.to_dict()))
        local.load_state_dict(module.state_dict())
        parameter = next(module.parameters(), None)
        if parameter is not None:
            local.to(device=parameter.device, dtype=parameter.dtype)
        return local.train(module.training)


class GateScorer:
    """The gate's survival probabilities in numpy, for generation: the MLP is a few hundred multiply-adds over
    at most `max_lookup_tokens` rows, where torch's per-operation dispatch would be most of the cost (a round of
    a small target takes a few milliseconds). Equal to `PacerLookupGate.survival` to float rounding (GELU by
    Abramowitz & Stegun 7.1.26, error < 1.5e-7; tests/test_lookup.py)."""

    def __init__(self, gate: PacerLookupGate):
        layers = [m for m in gate.mlp if isinstance(m, nn.Linear)]
        self.layers = [(m.weight.detach().float().cpu().numpy().T.copy(), m.bias.detach().float().cpu().numpy())
                       for m in layers]

    @staticmethod
    def _gelu(x: np.ndarray) -> np.ndarray:
        z = np.abs(x) * (1.0 / math.sqrt(2.0))
        t = 1.0 / (1.0 + 0.3275911 * z)
        poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
        erf = 1.0 - poly * np.exp(-z * z)
        return 0.5 * x * (1.0 + np.copysign(erf, x))

    def log_odds(self, features: np.ndarray) -> np.ndarray:
        """(rows,) the log-odds before the gate's sigmoid: what an online recalibration refits."""
        x = features
        for weight, bias in self.layers[:-1]:
            x = self._gelu(x @ weight + bias)
        weight, bias = self.layers[-1]
        return (x @ weight + bias)[:, 0]

    def accept_probabilities(self, features: np.ndarray) -> np.ndarray:
        """(rows,) probability that the target accepts each row's token given it accepted the ones before it: rows
        of several proposals can share one call (their survival is each proposal's running product)."""
        return 1.0 / (1.0 + np.exp(-np.clip(self.log_odds(features), -60.0, 60.0)))

    def survival(self, features: np.ndarray) -> list[float]:
        """(k,) probability that the target accepts at least the first j + 1 tokens, as a list."""
        return np.cumprod(self.accept_probabilities(features)).tolist()


PacerLookupGate.register_for_auto_class("AutoModel")
