"""What a round costs by proposal length, as `generate` observed it: prompt lookup with the pair's gate on chat
prompts, then each length's median next to the probe and the online fit (`costs/round_costs.py`).

    OMP_NUM_THREADS=1 python scripts/round_medians.py --pair smollm2 --categories chat-qa,chat-summarize --temperature 1
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

import pacer_hf
from pacer_hf.costs import round_costs
from pacer_hf.data.chat_prompts import chat_prompts
from pacer_hf.pairs import load_pair


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", default="smollm2")
    parser.add_argument("--categories", default="chat-qa,chat-summarize")
    parser.add_argument("--prompts", type=int, default=3, help="bench-split prompts per category")
    parser.add_argument("--temperature", type=float, default=1.0, help="0: greedy")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    args = parser.parse_args()
    torch.set_num_threads(1)
    pair = load_pair(args.pair)
    target = pacer_hf.enable(pair.target)
    sampling = {"do_sample": True, "temperature": args.temperature} if args.temperature > 0 else {"do_sample": False}
    for category in args.categories.split(","):
        for prompt in chat_prompts(pair.tokenizer, category, "bench", n=args.prompts):
            torch.manual_seed(0)
            target.generate(torch.tensor([list(prompt.ids)]), max_new_tokens=args.max_new_tokens,
                            prompt_lookup_num_tokens=10, pacer=True, **sampling)
    for costs in round_costs._PROCESS.values():
        xs, medians, counts = costs.medians()
        table, probe = costs.seconds(), np.asarray(costs.probe)
        print(f"fit a = {costs.fit[0]:.3f}, b = {1000 * costs.fit[1]:.2f} ms")
        for x, median, count in zip(xs.tolist(), medians, counts):
            print(f"k = {x:2d}: {int(count):4d} rounds, median {1000 * median:7.2f} ms, probe {1000 * probe[x]:7.2f} ms, "
                  f"estimate {1000 * table[x]:7.2f} ms")


if __name__ == "__main__":
    main()
