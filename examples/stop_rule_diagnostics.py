"""What bounds Pacer's stop rule on the demo pair's benchmark prompts (docs/TRAINING.md §5.4). A diagnostic:
it reads the benchmark's prompts, so nothing it prints may be used to choose a setting.

    python examples/stop_rule_diagnostics.py --prompts 8

1. Rounds as generation runs them, drafted to `max_draft_tokens` every time (the pre-verifier with
   threshold 0), recording each drafted token's predicted acceptance and each round's accepted count:
   predicted vs observed P(first token accepted) and P(second | first) per category.
2. Whole `generate` calls at fixed γ = 1..4, timed: a least-squares line seconds = setup + a·rounds +
   b·drafted tokens, and plain decoding's seconds per token.
3. Replay of the recorded rounds under that line: each fixed γ, the oracle, and `expected_gain` given those
   costs (plus the stopping criterion's per-token time), relative to the best fixed γ.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

import pacer_hf
from pacer_hf.costs import CostModel
from pacer_hf.data.prompts import CATEGORIES, build_prompts
from pacer_hf.loops import preverifier_kernel
from pacer_hf.loops.preverifier_kernel import CompiledRoundScorer
from pacer_hf.modeling_pacer import expected_gain_continues
from pacer_hf.pairs import load_pair
from pacer_hf.training.simulate import speedup


class RecordingScorer(CompiledRoundScorer):
    """The compiled scorer, keeping every round's acceptance logits."""

    rounds: list[list[float]] = []

    def start(self, loop: list[float] | None = None) -> None:
        super().start(loop)
        self.rounds.append([])

    def add(self, hidden, logits, token) -> float:
        logit = super().add(hidden, logits, token)
        self.rounds[-1].append(logit)
        return logit


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=8, help="prompts per category")
    parser.add_argument("--preverifier", default=None, help="default: the demo pair's")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    args = parser.parse_args()
    torch.set_num_threads(1)
    pair = load_pair("stdlib")
    shipped = pacer_hf.PacerPreVerifier.from_pretrained(args.preverifier) if args.preverifier else pair.preverifier
    config = shipped.config.to_dict()
    config.update(decision_rule="block", threshold=0.0, block_size=1)
    recorder = pacer_hf.PacerPreVerifier(pacer_hf.PacerConfig(**config))
    recorder.load_state_dict(shipped.state_dict())
    # generation builds its CPU scorer with preverifier_kernel.round_scorer: the recorder's keeps its logits
    preverifier_kernel.round_scorer = lambda model: (RecordingScorer if model is recorder else CompiledRoundScorer)(model)
    cap = recorder.config.max_draft_tokens
    prompts, _ = build_prompts(list(CATEGORIES), lambda text: pair.tokenizer(text).input_ids, args.prompts, 256,
                               target_dir=pair.target.name_or_path)

    def generate(ids: list[int], **kwargs):
        x = torch.tensor([ids])
        start = time.perf_counter()
        pair.target.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=args.max_new_tokens,
                             do_sample=False, **kwargs)
        return time.perf_counter() - start, pacer_hf.last_stats(pair.target)

    recorded: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for category, chosen in prompts.items():
        probs, accepted = [], []
        for prompt in chosen:
            RecordingScorer.rounds = []
            _, stats = generate(list(prompt.ids), assistant_model=pair.draft, pacer=recorder)
            logits = [r for r in RecordingScorer.rounds if r]
            drafted_rounds = [(n, kept) for n, kept in zip(stats.draft_lengths, stats.accepted, strict=True) if n]
            for row, (drafted, kept) in zip(logits, drafted_rounds, strict=True):
                if drafted == cap:  # rounds cut short by the length limit or an EOS say less
                    probs.append(1.0 / (1.0 + np.exp(-np.asarray(row))))
                    accepted.append(kept)
        recorded[category] = np.asarray(probs), np.asarray(accepted)
        p, a = recorded[category]
        print(f"{category:<20} {len(a)} full rounds: P(1st accepted) observed {(a >= 1).mean():.2f}, predicted "
              f"{p[:, 0].mean():.2f}; P(2nd | 1st) observed {(a[a >= 1] >= 2).mean():.2f}, predicted "
              f"{p[a >= 1, 1].mean():.2f}")

    rows, seconds, ar_per_token, scorer_per_token = [], [], [], []
    for chosen in prompts.values():
        for prompt in chosen:
            for gamma in (1, 2, 3, 4):
                spent, stats = generate(list(prompt.ids), assistant_model=pair.draft, pacer=f"sd-fixed-{gamma}")
                rows.append([1.0, len(stats.draft_lengths) - 1, sum(stats.draft_lengths[1:])])
                seconds.append(spent)
            spent, stats = generate(list(prompt.ids), assistant_model=pair.draft, pacer=shipped)
            scorer_per_token.append(stats.preverifier_seconds / max(sum(stats.draft_lengths), 1))
            x = torch.tensor([list(prompt.ids)])
            start = time.perf_counter()
            out = pair.target.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=args.max_new_tokens,
                                       do_sample=False)
            ar_per_token.append((time.perf_counter() - start) / (out.shape[1] - x.shape[1]))
    (_, per_round, per_token), *_ = np.linalg.lstsq(np.asarray(rows), np.asarray(seconds), rcond=None)
    if per_round <= 0 or per_token <= 0:
        raise SystemExit(f"The fitted round line ({1e3 * per_round:.2f} ms + {1e3 * per_token:.2f} ms per drafted token) "
                         "is not a cost: the calls are too short or too few to separate setup from rounds. Rerun "
                         "with more --prompts or --max-new-tokens (the docs' figures: --prompts 8, 64 tokens).")
    step, scorer = float(np.median(ar_per_token)), float(np.median(scorer_per_token))
    print(f"a round: {1e3 * per_round:.2f} ms + {1e3 * per_token:.2f} ms per drafted token (fixed γ = 1..4 calls); "
          f"plain decoding {1e3 * step:.2f} ms per token; the stopping criterion {1e3 * scorer:.2f} ms per drafted token")

    costs = {"draft_cost": 0.0, "verify_cost": [1.0], "preverifier_cost": scorer / step,
             "round_cost": [1.0] + [(per_round + per_token * k) / step for k in range(1, cap + 1)]}
    model = CostModel.from_calibration(costs)
    for category, (probs, accepted) in recorded.items():
        acc = (np.arange(cap)[None] < accepted[:, None]).astype(float)
        fixed = [speedup(acc, np.full(len(acc), g), model) for g in range(1, cap + 1)]
        lengths = np.array([next(n for n in range(1, cap + 1) if n == cap
                                 or not expected_gain_continues(row[:n].tolist(), 1, cap, costs)) for row in probs])
        rule = speedup(acc, lengths, model, preverifier=True)
        oracle = speedup(acc, np.minimum(accepted, cap), model)
        print(f"{category:<20} replay × the target alone: best fixed γ={int(np.argmax(fixed)) + 1} {max(fixed):.3f}, "
              f"expected_gain {rule:.3f} ({rule / max(fixed):.3f}× best fixed, mean draft {lengths.mean():.2f}), "
              f"oracle {oracle:.3f}")


if __name__ == "__main__":
    main()
