"""PEARL (arXiv 2408.11850) inside `generate`: the draft drafts round k+1 while the target verifies round k.

    target.generate(ids, assistant_model=draft, pacer="pearl")             # or any preset below
    target.generate(ids, assistant_model=draft, pacer=PearlConfig(gamma=5, worker="thread"))

Presets: "pearl", "pearl-sequential" (same policy, no concurrency), "pearl-thread", "pacer+pearl"
(the Pacer pre-verifier may end a job early) and "pearl-resync" (not in the paper). The verification
loop is unchanged; only the candidate generator differs. Layout: `config.py` (PearlConfig,
PearlStats), `workers.py` (where jobs run: inline, thread, forked process), `generator.py` (the
policy). See docs/PEARL.md for the concurrency model, why it is exact, and measurements.
"""

from __future__ import annotations

import dataclasses
import weakref

import torch
from transformers import PreTrainedModel

from ...costs import cached_forward_timer, fastest
from ...loops.stop_rule_setup import stop_rule_for
from ..registry import STRATEGIES, StrategyCall, StrategyContext, register_strategy
from .config import PearlConfig, PearlStats
from .generator import PearlCandidateGenerator
from .workers import worker_mode

__all__ = ["PearlCandidateGenerator", "PearlConfig", "PearlStats", "build", "measure_gamma", "worker_mode"]

# target -> draft -> (dtypes, devices, threads, cap) -> gamma; weak, so freed models drop their entries
_GAMMA_CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _step_seconds(model: PreTrainedModel, tokens: int, reps: int = 7, context: int = 32) -> float:
    """Fastest of `reps` cached forwards over `tokens` new tokens after a `context`-token prefix.

    The minimum, not the median: on a shared machine other jobs only ever add time.
    """
    return fastest(cached_forward_timer(model, tokens, context), reps)


def measure_gamma(target: PreTrainedModel, draft: PreTrainedModel, max_gamma: int = 8) -> int:
    """PEARL's gamma: the target/draft step-time ratio (one cached token each), clamped to [2, max_gamma].

    Cached per model pair and thread count. The paper's scripts use 3-5; a large ratio with a
    mediocre draft loses more per miss than it hides, hence the default cap of 8 (see docs/PEARL.md).
    """
    per_pair = _GAMMA_CACHE.setdefault(target, weakref.WeakKeyDictionary()).setdefault(draft, {})
    key = (target.dtype, draft.dtype, target.device, draft.device, torch.get_num_threads(), max_gamma)
    if key not in per_pair:
        ratio = _step_seconds(target, 1) / _step_seconds(draft, 1)
        per_pair[key] = max(2, min(max_gamma, round(ratio)))
    return per_pair[key]


def _name(config: PearlConfig) -> str:
    """The preset name of `config`, else "pearl(<fields that differ from the defaults>)"."""
    for name, preset in STRATEGIES.items():
        if preset == config:
            return name
    changed = [f"{f.name}={getattr(config, f.name)!r}" for f in dataclasses.fields(config)
               if getattr(config, f.name) != f.default]
    return f"pearl({', '.join(changed)})"


def build(config: PearlConfig, context: StrategyContext) -> StrategyCall:
    """One `generate` call's PEARL: gamma, worker mode and the draft's sampling seed are fixed here."""
    stats = PearlStats(strategy=_name(config))
    preverifier = context.preverifier
    gamma = config.gamma or (max(2, preverifier.config.max_draft_tokens) if preverifier is not None else None)
    mode = worker_mode(config, context.draft)
    gamma = gamma or measure_gamma(context.model, context.draft, config.max_gamma)
    stats.gamma, stats.parallel, stats.worker = gamma, config.parallel, mode
    # The draft's sampling seed comes from the global RNG once, in the caller's thread: reproducible
    # under torch.manual_seed, and the worker never touches the global generator.
    seed = int(torch.randint(0, 2**62, (1,)).item()) if context.do_sample else 0
    generators: list[PearlCandidateGenerator] = []

    def make(generation_config, logits_processor) -> PearlCandidateGenerator:
        generator = PearlCandidateGenerator(context.draft, generation_config, logits_processor, config=config,
                                            mode=mode, gamma=gamma, stats=stats,
                                            stop=stop_rule_for(context, stats, gamma), seed=seed,
                                            draft_forward=context.draft_forward)
        generators.append(generator)
        return generator

    def close() -> None:
        while generators:
            generators.pop().close()

    return StrategyCall(name=stats.strategy, make=make, stats=stats, closers=[close])


register_strategy(
    PearlConfig,
    build,
    presets={
        "pearl": PearlConfig(),
        "pearl-sequential": PearlConfig(parallel=False),
        "pearl-thread": PearlConfig(worker="thread"),
        "pacer+pearl": PearlConfig(use_preverifier=True),
        "pearl-resync": PearlConfig(resync_tokens=2),  # not in the paper: an SD round instead of a 1-token round
    },
)
