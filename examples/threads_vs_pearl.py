"""Both cores to the target, or one each to draft and target? Pacer and the target alone given two torch threads
against PEARL and Pacer + PEARL (the target on one thread, the draft in its worker on the other), interleaved.

    OMP_NUM_THREADS=2 python examples/threads_vs_pearl.py --pair qwen2.5-coder --prompts 1 --max-new-tokens 64

`pacer-hf bench` sets one thread count per run, so comparing the two layouts across runs compares two spells of
the machine as well. Here every prompt runs every setting in turn (the thread count set before each call; the
order rotates per prompt), after one untimed warm-up call each (Pacer's cost probe is taken per thread count).
Greedy; every output is checked identical to the first setting's. Prints tokens/s per category and setting, and
each setting over the better of Pacer and the target alone at two threads.
"""

from __future__ import annotations

import argparse
import json
import statistics
from functools import partial

import torch

import pacer_hf
from pacer_hf.costs import timed
from pacer_hf.data.chat_prompts import chat_prompts
from pacer_hf.pairs import load_pair

SETTINGS = {  # name -> (torch threads for the caller, pacer=)
    "ar@2": (2, None),
    "pacer@2": (2, "preverifier"),
    "sd-fixed-2@2": (2, "sd-fixed-2"),
    "pearl@1+1": (1, "pearl"),
    "pacer+pearl@1+1": (1, "pacer+pearl"),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", default="qwen2.5-coder", choices=("qwen2.5-coder", "smollm2"))
    parser.add_argument("--categories", default="chat-humaneval,chat-docstring,chat-edit")
    parser.add_argument("--prompts", type=int, default=1, help="prompts per category")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--out", help="write the results as JSON here")
    args = parser.parse_args()
    pair = load_pair(args.pair)
    pacer_hf.attach(pair.draft, pair.preverifier)  # pacer+pearl drafts with the attached pre-verifier
    names = list(SETTINGS)

    def call(name: str, ids: torch.Tensor, max_new_tokens: int):
        threads, pacer = SETTINGS[name]
        torch.set_num_threads(threads)
        pacer = pair.preverifier if pacer == "preverifier" else pacer
        kwargs = {"assistant_model": pair.draft, "pacer": pacer} if pacer is not None else {}
        return timed(partial(pair.target.generate, ids, do_sample=False, max_new_tokens=max_new_tokens, **kwargs))

    results: dict[str, dict[str, list[float]]] = {}
    for category in args.categories.split(","):
        prompts = chat_prompts(pair.tokenizer, category, "bench", n=args.prompts)
        for name in names:
            call(name, torch.tensor([prompts[0].ids]), 8)
        for index, prompt in enumerate(prompts):
            ids, reference = torch.tensor([prompt.ids]), None
            order = names[index % len(names):] + names[: index % len(names)]
            for name in order:
                seconds, out = call(name, ids, args.max_new_tokens)
                reference = out if reference is None else reference
                if not torch.equal(out, reference):
                    raise SystemExit(f"{name} differs from {order[0]} on {category} prompt {index}")
                results.setdefault(category, {}).setdefault(name, []).append((out.shape[1] - ids.shape[1]) / seconds)
        rates = {name: statistics.median(values) for name, values in results[category].items()}
        best = max(rates["ar@2"], rates["pacer@2"])
        print(f"{category}: " + ", ".join(f"{n} {r:.2f} tok/s ({r / best:.2f}x)" for n, r in rates.items()))
    if args.out:
        with open(args.out, "w") as handle:
            json.dump(results, handle, indent=1)


if __name__ == "__main__":
    main()
