"""What a batched verify forward costs: the target's forward over B rows × W new tokens on a cached prefix.

Speculative decoding pays when verifying W tokens costs little more than decoding one. In a batch each
round verifies B × W tokens in one forward, so the question is how that grows with B and W on the
machine at hand (docs/BATCH.md quotes this table):

    OMP_NUM_THREADS=1 python examples/batch_verify_cost.py [--pair stdlib] [--context 150]

Prints milliseconds per forward (median of --repeats) and the ratio to one token per row (W = 1).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from transformers import DynamicCache

from pacer_hf._hf_compat import CACHE_KWARG
from pacer_hf.pairs import load_pair


def forward_ms(model, batch: int, width: int, context: int, repeats: int) -> float:
    """Median milliseconds of one forward of `width` new tokens per row after a `context`-token prefix."""
    generator = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    prefix = torch.randint(1, vocab, (batch, context), generator=generator)
    new = torch.randint(1, vocab, (batch, width), generator=generator)
    mask = torch.ones(batch, context + width, dtype=torch.long)
    positions = torch.arange(context, context + width)[None].expand(batch, width)
    times = []
    with torch.no_grad():
        cache = DynamicCache(config=model.config)
        model(prefix, use_cache=True, **{CACHE_KWARG: cache})
        for _ in range(repeats + 2):  # two untimed warm-ups
            start = time.perf_counter()
            model(new, attention_mask=mask, position_ids=positions, use_cache=True, **{CACHE_KWARG: cache},
                  logits_to_keep=width)
            times.append(time.perf_counter() - start)
            cache.crop(-width)
    return 1000 * statistics.median(times[2:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", default="stdlib", choices=["stdlib", "smollm2"])
    parser.add_argument("--batch-sizes", default="1,2,4,8")
    parser.add_argument("--widths", default="1,2,3,4,6,9")
    parser.add_argument("--context", type=int, default=150)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    target = load_pair(args.pair).target
    widths = [int(w) for w in args.widths.split(",")]
    print(f"target forward, ms (× W = 1), {args.context}-token cached prefix, {args.threads} thread(s)")
    print("B \\ W | " + " | ".join(str(w) for w in widths))
    for batch in (int(b) for b in args.batch_sizes.split(",")):
        cells = [forward_ms(target, batch, width, args.context, args.repeats) for width in widths]
        print(f"{batch} | " + " | ".join(f"{ms:.1f} ({ms / cells[0]:.2f}×)" for ms in cells))


if __name__ == "__main__":
    main()
