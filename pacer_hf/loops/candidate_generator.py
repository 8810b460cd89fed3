"""pacer_hf's drafting loop: the draft runs on its own KV cache, and Pacer decides when it stops.

Verification runs in the lean loop (lean_loop.py) or transformers' `_assisted_decoding`; this module
is the drafting side. The draft never re-enters `generate()` (the per-round setup that makes stock
assisted generation lose on small models): one `forward(pending, cache) -> (hidden, logits)` is
chosen per call (`draft_forwards.py`) and `_draft` is a plain decode loop over it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from transformers import GenerationConfig, LogitsProcessorList, StoppingCriteria

from .._hf_compat import CandidateGenerator, crop_cache, eos_ids
from ..costs import RoundClock
from ..modeling_pacer import PacerPreVerifier, loop_features
from ..stats import PacerStats
from .block_scorer import BlockScorer
from .draft_forwards import choose_draft_forward

if TYPE_CHECKING:
    from ..costs import RoundCosts


def next_round_loop(preverifier: PacerPreVerifier, accepted: int, drafted: int, target_scores: torch.Tensor) -> list[float]:
    """`loop_features` for the round after a verified one; `target_scores`: the target's scores where it chose its
    last token (its confidence there is their top probability)."""
    confidence = float(torch.softmax(target_scores.float(), dim=-1).max())
    return loop_features(accepted, drafted, confidence, preverifier.config.max_draft_tokens)


class PacerStoppingCriteria(StoppingCriteria):
    """The pre-verifier as a drafting stop criterion: after every `block_size` tokens it asks
    `PacerPreVerifier.decide` whether the next block is worth drafting.

    Stop-only: a failed block has been drafted and is still verified, which keeps sampling exact.
    With `trim_failed_block` (greedy only) `trim` says how many trailing tokens to drop instead.
    """

    def __init__(self, preverifier: PacerPreVerifier, stats: PacerStats, costs: RoundCosts | None = None,
                 draft_device: torch.device | None = None):
        self.preverifier = preverifier.eval()
        self.costs = costs  # expected_gain: what a round drafting k tokens costs here (else the config's calibration)
        self.block_size = preverifier.config.block_size
        self.stats = stats
        from .preverifier_kernel import round_scorer  # numba, imported when Pacer first runs

        # CPU: compiled, token by token; None: the torch forward, block by block. The compiled scorer reads the draft's
        # tensors as numpy arrays, so a draft elsewhere (CUDA) takes the torch path even with a pre-verifier on CPU.
        on_cpu = draft_device is None or torch.device(draft_device).type == "cpu"
        self.scorer = round_scorer(preverifier) if on_cpu else None
        self.blocks = BlockScorer(self.preverifier)  # the torch path, where `scorer` is None
        self.token_logits: list[float] = []  # acceptance logits of every token drafted this round
        self.trim = 0
        self.reads_loop = bool(getattr(preverifier.config, "loop_features", False))
        self.loop = loop_features(0, 0, 0.0, preverifier.config.max_draft_tokens)  # before the first round

    def end_round(self, accepted: int, drafted: int, target_scores: torch.Tensor) -> None:
        """What the next round's decisions may read (`config.loop_features`): the round just verified and the
        target's confidence in the last token it chose (`target_scores`: its scores at that position)."""
        if self.reads_loop:
            self.loop = next_round_loop(self.preverifier, accepted, drafted, target_scores)

    def start_round(self) -> None:
        self.token_logits, self.trim = [], 0
        if self.scorer is not None:
            self.scorer.start(self.loop)
        else:
            self.blocks.start([self.loop])

    @torch.no_grad()
    def add_token(self, hidden: torch.Tensor, logits: torch.Tensor, token: torch.Tensor) -> bool:
        """Record one drafted token (draft hidden state, raw logits, id); True when drafting should stop.

        On CPU each token is scored as it comes (`CompiledRoundScorer`: features and layer in one compiled call);
        elsewhere the torch layer scores each block at its boundary over the round's cached keys and values. Either
        way the decision is taken at block boundaries."""
        start = time.perf_counter()
        if self.scorer is not None:
            self.token_logits.append(self.scorer.add(hidden[0], logits[0], int(token[0, 0])))
            done = len(self.token_logits) % self.block_size == 0
        else:
            scored = self.blocks.add(hidden, logits, token[:, 0])
            done = scored is not None
            if done:
                self.token_logits = scored[0].float().tolist()
        stop = False
        if done:
            costs = None
            if self.costs is not None:  # draft_cost: what trimming a drafted token cannot save (best_prefix)
                costs = {"round_cost": self.costs.seconds(), "draft_cost": self.costs.token_seconds()}
            stop, self.trim = self.preverifier.decide(self.token_logits, costs)
        self.stats.preverifier_seconds += time.perf_counter() - start
        return stop

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs) -> torch.BoolTensor:
        """StoppingCriteria form: `draft_hidden=` the draft's last hidden state of the token just drafted."""
        stop = self.add_token(kwargs["draft_hidden"], scores, input_ids[:, -1:])
        return torch.full((input_ids.shape[0],), stop, dtype=torch.bool, device=input_ids.device)


class PacerCandidateGenerator(CandidateGenerator):
    """Drafts up to `max_draft_tokens` per round; with `stop`, Pacer decides when to stop.

    Without a stop criterion it is fixed-length speculative decoding (`sd-fixed-<γ>`).
    """

    def __init__(
        self,
        draft,
        generation_config: GenerationConfig,
        logits_processor: LogitsProcessorList | None = None,
        *,
        max_draft_tokens: int,
        stats: PacerStats,
        stop: PacerStoppingCriteria | None = None,
        draft_forward: str = "auto",
    ):
        self.draft = draft
        self.max_draft_tokens = max_draft_tokens
        self.max_length = generation_config.max_length
        self.stop = stop
        self.stats = stats
        self.processors = LogitsProcessorList(logits_processor or [])
        self.do_sample = bool(generation_config.do_sample)
        self.eos = eos_ids(generation_config.eos_token_id)
        self.ids = torch.empty((1, self.max_length), dtype=torch.long, device=draft.device)
        self.forward, self.cache = choose_draft_forward(draft, draft_forward, self.max_length, stats)
        self.clock = RoundClock(stop.costs if stop is not None else None)  # timing for the stop rule's costs
        self.rounds = 0

    @torch.no_grad()
    def get_candidates(self, input_ids: torch.LongTensor, **kwargs) -> tuple[torch.LongTensor, torch.Tensor | None]:
        start = time.perf_counter()
        cur_len = input_ids.shape[1]
        self.stats.target_forwards += 1
        budget = min(self.max_draft_tokens, self.max_length - cur_len - 1)
        n, processed = self._draft(input_ids, budget) if budget > 0 else (0, [])
        self.stats.draft_lengths.append(n)
        self.rounds += 1
        # untimed: the first round (it also reads the prompt) and a trimmed one (it drafted more than it proposes)
        self.clock.handed_out(n, start if self.rounds > 1 and len(processed) == n else None)
        if n == 0:
            return input_ids, None
        # A view: the verification loop reads the candidates before the next round writes `ids` again.
        return self.ids[:, : cur_len + n], torch.stack(processed[:n], dim=1) if self.do_sample else None

    def _draft(
        self,
        sequence: torch.LongTensor,
        budget: int,
        generator: torch.Generator | None = None,
        interrupt: Callable[[int, int], bool] | None = None,
    ) -> tuple[int, list[torch.Tensor]]:
        """Draft up to `budget` tokens after `sequence` into `self.ids`: the one drafting loop.

        Returns how many drafted tokens to propose (a trimmed failed block excluded) and the processed
        logits of every drafted token. `interrupt(n, token)`, called after each token, ends drafting
        early (PEARL's cancellation); `generator` is the RNG for sampled drafts (default: torch's).
        """
        cur_len = sequence.shape[1]
        keep = min(self.cache.get_seq_length(), cur_len - 1)  # the draft cache holds ids[:keep] == sequence[:keep]
        crop_cache(self.cache, keep)
        ids = self.ids
        ids[:, keep:cur_len] = sequence[:, keep:]
        pending, processed, n = ids[:, keep:cur_len], [], 0
        if self.stop is not None:
            self.stop.start_round()
        for n in range(1, budget + 1):
            hidden, raw = self.forward(pending, self.cache)
            scores = self.processors(ids[:, : cur_len + n - 1], raw) if self.processors else raw
            if self.do_sample:  # float32, so the q the verifier recomputes is the one sampled from
                scores = scores.float()
                token = torch.multinomial(torch.softmax(scores, dim=-1), 1, generator=generator)
            else:
                token = scores.argmax(dim=-1, keepdim=True)
            ids[:, cur_len + n - 1] = token[:, 0]
            processed.append(scores)
            pending = token
            value = token.item()  # one host read per token, for the EOS stop (free for a CPU draft)
            if interrupt is not None and interrupt(n, value):
                break
            if self.stop is not None and self.stop.add_token(hidden, raw, token):
                n -= self.stop.trim
                break
            if value in self.eos:
                break
        self.stats.draft_forwards += len(processed)
        return n, processed

    def update_candidate_strategy(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, num_matches) -> None:
        """No schedule to update (the draft length is decided while drafting); record the outcome and, for a
        stop rule deciding by cost, what the round cost."""
        self.clock.verdict()
        self.stats.accepted.append(int(num_matches))
        if self.stop is not None:
            self.stop.end_round(int(num_matches), self.clock.proposed, scores[0, int(num_matches)])
