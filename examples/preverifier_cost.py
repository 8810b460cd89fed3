"""What one pre-verifier decision costs per drafted token, next to a draft step (demo pair, 1 thread).

    python examples/preverifier_cost.py

Times `PacerStopRule.add_token` over 8-token rounds at block size 1 (three draft features, the
layer over the new token with the round's cached keys and values, the decision) with the compiled round scorer
generation uses on CPU and with the torch forward block by block (what runs on other devices), the same
round re-running the torch layer over the whole round every token, and the lean draft step at a 128-token
context. Medians of 5.
"""

from __future__ import annotations

import statistics
import time

import torch

import pacer_hf
from pacer_hf.loops.draft_forwards import draft_step_timer
from pacer_hf.loops.stop_rule import preverifier_token_timer
from pacer_hf.modeling_pacer import loop_features
from pacer_hf.pairs import load_pair


def main() -> None:
    torch.set_num_threads(1)
    pair = load_pair("stdlib")
    pv = pair.preverifier
    hidden = torch.randn(8, 1, pair.draft.config.hidden_size)
    logits = torch.randn(8, 1, pair.draft.config.vocab_size)
    loop = torch.tensor([loop_features(2, 8, 0.9, pv.config.max_draft_tokens)]) \
        if pv.config.loop_features else None

    @torch.no_grad()
    def full_rerun() -> float:
        start = time.perf_counter()
        seen, features = [], []
        for i in range(8):
            seen.append(hidden[i])
            features.append(pacer_hf.draft_features(logits[i], logits[i].argmax(-1)))
            pv.decide(pv(torch.stack(seen, 1), torch.stack(features, 1), loop_features=loop).logits[0])
        return (time.perf_counter() - start) / 8

    settings = {"compiled scorer": preverifier_token_timer(pv, pair.draft),
                "torch, block by block": preverifier_token_timer(pv, pair.draft, scorer=False),
                "torch, full re-run": full_rerun}
    per_token: dict[str, list[float]] = {name: [] for name in settings}
    for once in settings.values():
        once()
    for _ in range(5):
        for name, once in settings.items():
            per_token[name].append(statistics.median(once() for _ in range(50)) * 1000)
    for name, values in per_token.items():
        print(f"pre-verifier, {name}: {statistics.median(values):.3f} ms per drafted token")
    step = draft_step_timer(pair.draft, 128)
    step()
    print(f"lean draft step: {1000 * statistics.median(step() for _ in range(50)):.3f} ms")


if __name__ == "__main__":
    main()
