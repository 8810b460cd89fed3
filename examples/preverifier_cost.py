"""What one pre-verifier decision costs per drafted token, next to a draft step (demo pair, 1 thread).

    python examples/preverifier_cost.py

Times `PacerStoppingCriteria.add_token` over 8-token rounds at block size 1 (three draft features, the
layer over the new token with the round's cached keys and values, the decision) with the numpy round scorer
generation uses on CPU and with the torch forward block by block (what runs on other devices), the same
round re-running the torch layer over the whole round every token, and the lean draft step at a 128-token
context. Medians of 5.
"""

from __future__ import annotations

import statistics
import time

import torch

import pacer_hf
from pacer_hf.candidate_generator import PacerStoppingCriteria
from pacer_hf.pairs import load_pair
from pacer_hf.stats import PacerStats
from pacer_hf.timing import draft_step_timer


def main() -> None:
    torch.set_num_threads(1)
    pair = load_pair("stdlib")
    pv = pair.preverifier
    pv.config.decision_rule, pv.config.block_size, pv.config.threshold = "block", 1, 0.0  # score every token
    hidden = torch.randn(8, 1, pair.draft.config.hidden_size)
    logits = torch.randn(8, 1, pair.draft.config.vocab_size)

    scorer_stop = PacerStoppingCriteria(pv, PacerStats(strategy="cost"))
    torch_stop = PacerStoppingCriteria(pv, PacerStats(strategy="cost"))
    torch_stop.scorer = None

    def rounds(stop: PacerStoppingCriteria):
        def round_() -> None:
            stop.start_round()
            for i in range(8):
                stop.add_token(hidden[i], logits[i], logits[i].argmax(-1, keepdim=True))
        return round_

    @torch.no_grad()
    def full_rerun() -> None:
        seen, features = [], []
        for i in range(8):
            seen.append(hidden[i])
            features.append(pacer_hf.draft_features(logits[i], logits[i].argmax(-1)))
            pv.decide(pv(torch.stack(seen, 1), torch.stack(features, 1)).logits[0])

    settings = {"numpy scorer": rounds(scorer_stop), "torch, block by block": rounds(torch_stop),
                "torch, full re-run": full_rerun}
    per_token: dict[str, list[float]] = {name: [] for name in settings}
    for round_ in settings.values():
        round_()
    for _ in range(5):
        for name, round_ in settings.items():
            start = time.perf_counter()
            for _ in range(50):
                round_()
            per_token[name].append((time.perf_counter() - start) / 400 * 1000)
    for name, values in per_token.items():
        print(f"pre-verifier, {name}: {statistics.median(values):.3f} ms per drafted token")
    step = draft_step_timer(pair.draft, 128)
    step()
    print(f"lean draft step: {1000 * statistics.median(step() for _ in range(50)):.3f} ms")


if __name__ == "__main__":
    main()
