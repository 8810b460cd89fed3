"""PEARL's policy as a candidate generator: the draft drafts round k+1 while the target verifies round k.

Each `get_candidates` call:

1. waits for the draft-ahead job launched in the previous call (it ran during the target forward);
2. keeps the job's tokens only when they continue from the token the target settled on: every
   candidate of the last round was accepted *and* the job's first token equals HF's bonus token.
   The job's remaining tokens become this round's candidates ("post-verify"); otherwise there are
   none ("pre-verify": the target forwards a single token while the draft drafts ahead), or, with
   `resync_tokens`, a few tokens drafted serially now;
3. launches the next job from the optimistic prefix (input + candidates), so it overlaps the target
   forward that the verification loop runs next, and returns.

Where a job runs is the `DraftWorker`'s business (workers.py); this module only decides.

Why it stays exact: greedy candidates are only ever accepted by HF's argmax match. Under sampling the
draft samples from its processed distribution q with its own per-job-seeded `torch.Generator` (the
global RNG belongs to the target's sampling in the caller's thread), the keep decision depends only
on the job's first token and the target's token, so kept candidates are distributed exactly as
q-drafts from the current prefix, and their q logits are the ones they were sampled from.
"""

from __future__ import annotations

import time

import torch
from transformers import GenerationConfig, LogitsProcessorList, PreTrainedModel

from ...loops.draft_loop import PacerCandidateGenerator
from ...loops.stop_rule import PacerStopRule
from .config import PearlConfig, PearlStats
from .workers import Job, make_worker

_RESYNC_SEED_OFFSET = 1 << 40  # resync drafts use their own seed stream, disjoint from the jobs'


class PearlCandidateGenerator(PacerCandidateGenerator):
    """Draft-ahead candidate generator. While a job is in flight the worker owns the draft (cache,
    `ids` buffer, RNG); the caller touches them only through the worker."""

    def __init__(self, draft: PreTrainedModel, generation_config: GenerationConfig,
                 logits_processor: LogitsProcessorList | None = None, *, config: PearlConfig, mode: str, gamma: int,
                 stats: PearlStats, stop: PacerStopRule | None = None, seed: int = 0,
                 draft_forward: str = "auto"):
        super().__init__(draft, generation_config, logits_processor, max_draft_tokens=gamma, stats=stats, stop=stop,
                         draft_forward=draft_forward)
        self.config, self.gamma, self.seed = config, gamma, seed
        self.job: Job | None = None  # the job in flight
        self.jobs_made = 0
        self.pending = 0  # candidates sent in the current round
        self.round = 0
        self.rng = torch.Generator(device=self.draft.device) if self.do_sample else None
        self.sent_at = 0.0
        self.launched: list[Job | None] = []  # the job launched in each round (None: none launched)
        self.worker = make_worker(mode, self._run_job, config=config, stats=stats, draft=draft,
                                  max_length=self.max_length, slots=max(gamma, config.resync_tokens),
                                  do_sample=self.do_sample)

    # ----------------------------------------------------------------- caller's thread
    def share_prompt_kv(self, target, target_cache) -> bool:
        """Never: the worker owns the draft's cache, and drafts the first round while the target reads the prompt."""
        return False

    @torch.no_grad()
    def get_candidates(self, input_ids: torch.LongTensor, **kwargs) -> tuple[torch.LongTensor, torch.Tensor | None]:
        job, self.job = self.job, None
        pending, scores = None, None
        if job is not None:
            start = time.perf_counter()
            self.worker.wait(job)
            self.stats.wait_seconds += time.perf_counter() - start
            self.stats.jobs_cancelled += int(job.cut)
            if self._continues(job, input_ids):
                self.stats.jobs_kept += 1
                pending = torch.tensor([job.tokens[1:]], dtype=input_ids.dtype, device=input_ids.device)
                scores = torch.stack(job.scores[1:], dim=1) if self.do_sample else None
            else:
                self.stats.draft_tokens_wasted += len(job.tokens)
                pending, scores = self._resync(input_ids)
        candidates = input_ids if pending is None else torch.cat([input_ids, pending], dim=1)
        self.pending = 0 if pending is None else pending.shape[1]
        self.record.proposed(self.pending, None)  # untimed: the draft's time overlaps the target's
        budget = min(self.gamma, self.max_length - candidates.shape[1] - 1)
        launched = None
        if budget >= 2:  # a job of one token could only be pre-verified, never sent
            launched = self._new_job(candidates.clone(), budget, self.seed + self.round)
            self.stats.jobs += 1
            self.job = launched
            self.worker.submit(launched)
        self.launched.append(launched)
        self.round += 1
        self.sent_at = time.perf_counter()
        return candidates, scores

    def update_candidate_strategy(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, num_matches) -> None:
        """Record the round; tell the in-flight job as early as possible whether it can still be kept."""
        self.stats.target_seconds.append(time.perf_counter() - self.sent_at)
        matches = int(num_matches)
        self.record.verified(matches, scores)  # jobs made from now on read this round's outcome (not one in flight)
        if self.job is None:
            return
        if matches < self.pending:
            self.worker.cancel(self.job)
        else:  # kept only if its first token is the target's: the job stops at a mismatch
            self.worker.expect(self.job, int(input_ids[0, -1]))

    def close(self) -> None:
        """Stop the worker (runs when generate returns or raises) and record the jobs' times."""
        if self.job is not None:
            self.worker.cancel(self.job)
        self.worker.close()
        self.job = None
        self.stats.job_seconds.extend(job.seconds if job is not None and job.done.is_set() else 0.0
                                      for job in self.launched)
        self.launched.clear()

    def _new_job(self, seq: torch.Tensor, budget: int, seed: int) -> Job:
        self.jobs_made += 1
        return Job(self.jobs_made, seq, budget, seed, list(self.stop.loop) if self.stop is not None else None)

    def _continues(self, job: Job, input_ids: torch.Tensor) -> bool:
        """The job continues from the target's token: all candidates accepted, first token == bonus token."""
        return (
            len(job.tokens) >= 2
            and input_ids.shape[1] == job.seq.shape[1] + 1
            and job.tokens[0] == int(input_ids[0, -1])
            and torch.equal(job.seq[0], input_ids[0, :-1].to(job.seq.device))
        )

    def _resync(self, input_ids: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """After a miss, optionally draft `resync_tokens` now (serially) so the round still verifies candidates."""
        budget = min(self.config.resync_tokens, self.max_length - input_ids.shape[1] - 1)
        if budget < 1:
            return None, None
        job = self._new_job(input_ids.clone(), budget, self.seed + _RESYNC_SEED_OFFSET + self.round)
        start = time.perf_counter()
        self.worker.submit(job)  # the worker is idle: the job runs at once
        self.worker.wait(job)
        self.stats.resync_seconds += time.perf_counter() - start
        pending = torch.tensor([job.tokens], dtype=input_ids.dtype, device=input_ids.device)
        return pending, torch.stack(job.scores, dim=1) if self.do_sample else None

    # ----------------------------------------------------------------- in the worker
    @torch.no_grad()
    def _run_job(self, job: Job) -> None:
        """Draft up to `job.budget` tokens after `job.seq` with the shared drafting loop; the worker calls this."""
        if self.rng is not None:
            self.rng.manual_seed(job.seed)
        first: list[int] = []

        def interrupt(n: int, token: int) -> bool:
            if n == 1:
                first.append(token)
            return job.interrupted(first[0] if first else None)

        if job.interrupted(None):
            return
        if self.stop is not None and job.loop is not None:
            self.stop.loop = job.loop
        n, processed = self._draft(job.seq, job.budget, generator=self.rng, interrupt=interrupt)
        kept = max(1, n) if processed else 0  # the first token is always kept: it is what pre-verify checks
        seq_len = job.seq.shape[1]
        job.tokens = self.ids[0, seq_len : seq_len + kept].tolist()
        job.scores = processed[:kept] if self.do_sample else []
