"""The lookup candidate generator: prompt-lookup tokens, as many as the gate allows, else the draft."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch
from transformers import GenerationConfig

from ..._hf_compat import CandidateGenerator, eos_ids
from ...candidates.suffix import CACHE, SuffixSource, gate_features
from ...costs import RoundCosts
from ...loops.draft_loop import PacerCandidateGenerator
from ...loops.online_calibration import MAX_LOGIT, OnlineCalibration
from ...loops.stop_rule import RoundRecord
from ...modeling_lookup_gate import PacerLookupGate, feature_rows, find_lookup
from ...stats import PacerStats


@dataclass
class LookupStats(PacerStats):
    """PacerStats plus lookup's share: `lookup_lengths[i]` of round i's proposed tokens came from lookup
    (the rest, if any, from the draft); `matches` counts rounds where lookup found a match.
    `lookup_seconds` is the lookup search's time, `preverifier_seconds` the gate's alone (features, scoring,
    the length choice and the target's confidence; with a draft, also its pre-verifier's): the search runs with or
    without a gate."""

    lookup_lengths: list[int] = field(default_factory=list)
    matches: int = 0
    cache_matches: int = 0  # rounds whose match came from a SuffixCache (earlier requests), not this request
    lookup_seconds: float = 0.0

    @property
    def lookup_acceptance(self) -> float:
        """Accepted tokens / proposed tokens over the rounds that proposed lookup tokens."""
        pairs = [(n, a) for n, a in zip(self.lookup_lengths, self.accepted) if n]
        proposed = sum(n for n, _ in pairs)
        return sum(a for _, a in pairs) / proposed if proposed else 0.0

    def to_dict(self) -> dict:
        return {**super().to_dict(), "lookup_acceptance": self.lookup_acceptance}


class LookupCandidateGenerator(CandidateGenerator):
    """Each round: find the lookup continuation, let the gate (if any) choose how much of it to propose;
    with none proposed, `drafting` (a draft model's generator) proposes instead, or nothing does."""

    def __init__(self, generation_config: GenerationConfig, *, num_tokens: int, max_ngram: int,
                 gate: PacerLookupGate | None, stats: LookupStats, drafting: PacerCandidateGenerator | None = None,
                 costs: RoundCosts | None = None, source: SuffixSource | None = None,
                 calibration: OnlineCalibration | None = None):
        self.num_tokens = num_tokens
        self.source = source  # the request's suffix index (and a cache of earlier requests); None: find_lookup
        self.costs = costs  # what a round proposing k lookup tokens costs here; refined by every round
        self.record = RoundRecord(stats, costs=costs)  # the lookup rounds (a draft round: the draft generator's own)
        self.delegated = False  # the round in flight was the draft's
        self.max_ngram = max_ngram
        self.gate = gate
        self.stats = stats
        self.drafting = drafting
        self.max_length = generation_config.max_length
        self.sampling = bool(generation_config.do_sample)
        self.eos = eos_ids(generation_config.eos_token_id)
        self.prompt_length: int | None = None
        self.confidence: float | None = None  # the target's probability of the last token it chose
        self.scorer = gate.scorer() if gate is not None else None
        self.calibration = calibration  # the gate's map to this target's acceptances, refined by every round
        self.proposed_logits: np.ndarray | None = None  # the gate's log-odds of the tokens in flight

    @torch.no_grad()
    def get_candidates(self, input_ids: torch.LongTensor, **kwargs) -> tuple[torch.LongTensor, torch.Tensor | None]:
        start = time.perf_counter()
        cur_len = input_ids.shape[1]
        first = self.prompt_length is None
        if first:
            self.prompt_length = cur_len
        budget = min(self.num_tokens, self.max_length - cur_len - 1)
        tokens = self._lookup(input_ids[0], budget) if budget > 0 else []
        self.stats.lookup_lengths.append(len(tokens))
        self.delegated = not tokens and self.drafting is not None
        if self.delegated:
            return self.drafting.get_candidates(input_ids)
        self.record.proposed(len(tokens), None if first else start)  # the first round also reads the prompt
        if not tokens:
            return input_ids, None
        proposal = torch.tensor([tokens], dtype=input_ids.dtype, device=input_ids.device)
        return torch.cat((input_ids, proposal), dim=1), None

    def _lookup(self, ids: torch.Tensor, budget: int) -> list[int]:
        start = time.perf_counter()
        if self.source is not None:
            match = self.source.find(ids.cpu(), budget)
            describe = gate_features
        else:
            match, describe = find_lookup(ids.cpu(), budget, self.max_ngram), feature_rows
        searched = time.perf_counter()
        self.stats.lookup_seconds += searched - start
        tokens: list[int] = []
        if match is not None:
            self.stats.matches += 1
            self.stats.cache_matches += getattr(match, "source", None) == CACHE
            tokens = match.tokens.tolist()
            if self.gate is not None:
                features = describe(match, ids.shape[0], self.prompt_length, self.confidence,
                                    self.gate.config.max_lookup_tokens, self.gate.config.max_ngram_size,
                                    self.sampling)
                logits = np.clip(self.scorer.log_odds(features).astype(np.float64), -MAX_LOGIT, MAX_LOGIT)
                p = self.calibration.apply(logits) if self.calibration is not None else 1.0 / (1.0 + np.exp(-logits))
                costs = self.costs.seconds() if self.costs is not None else None
                tokens = tokens[: self.gate.choose_length(np.cumprod(p).tolist(), costs)]
                self.proposed_logits = logits[: len(tokens)]
                self.stats.preverifier_seconds += time.perf_counter() - searched
            for i, token in enumerate(tokens):
                if token in self.eos:  # nothing after EOS can be accepted
                    tokens = tokens[: i + 1]
                    break
        return tokens

    def update_candidate_strategy(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, num_matches) -> None:
        """Record the outcome and what the round cost (a draft round: in the draft generator, whose costs and loop
        features it refines); keep the target's probability of its last choice for the gate's next round."""
        if self.delegated:
            self.drafting.update_candidate_strategy(input_ids, scores, num_matches)
        else:
            self.record.verified(int(num_matches), scores)
            if self.calibration is not None and self.stats.lookup_lengths[-1]:
                self.calibration.update(self.proposed_logits[: self.stats.lookup_lengths[-1]], int(num_matches))
        if self.gate is not None:
            start = time.perf_counter()
            self.confidence = float(torch.softmax(scores[0, int(num_matches)].float(), dim=-1).max())
            self.stats.preverifier_seconds += time.perf_counter() - start
