"""Can two decode loops run at once on this machine, as two processes or as two threads?

    python examples/parallel_capacity.py [--model hub_cards/demo-target] [--steps 150]

Each loop makes single-token forwards with a KV cache (the demo target by default), one intra-op
thread each. Capacity = 2 x (time of one loop alone) / (time of the slower of two concurrent loops):
2.0 means two cores' worth of work got done, 1.0 means the two loops only took turns. Small models'
decode steps are dominated by Python-side dispatch that holds the GIL, so threads can take turns
even with two idle cores; processes cannot. (PEARL's draft worker is a thread: docs/PEARL.md.)
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import threading
import time

import torch
import transformers

from pacer_hf._hf_compat import CACHE_KWARG, output_cache

MODEL = "hub_cards/demo-target"


def load(path: str = MODEL):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


@torch.no_grad()
def loop(model, steps: int = 150) -> float:
    torch.set_num_threads(1)
    cache = output_cache(model(torch.arange(64)[None], use_cache=True))
    tok = torch.tensor([[5]])
    t = time.perf_counter()
    for _ in range(steps):
        cache = output_cache(model(input_ids=tok, use_cache=True, logits_to_keep=1, **{CACHE_KWARG: cache}))
    return time.perf_counter() - t

def worker(path: str, steps: int, queue) -> None:
    model = load(path)
    loop(model, 20)
    queue.put(loop(model, steps))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=MODEL)
    parser.add_argument("--steps", type=int, default=150)
    args = parser.parse_args()
    transformers.logging.set_verbosity_error()
    torch.set_num_threads(1)
    first = load(args.model)
    loop(first, 20)
    alone = loop(first, args.steps)
    print(f"one loop alone: {alone:.2f} s for {args.steps} steps")
    context = mp.get_context("spawn")
    queue = context.Queue()
    processes = [context.Process(target=worker, args=(args.model, args.steps, queue)) for _ in range(2)]
    for process in processes:
        process.start()
    times = [queue.get(), queue.get()]
    for process in processes:
        process.join()
    print(f"two processes at once: {times[0]:.2f} s, {times[1]:.2f} s -> capacity {2 * alone / max(times):.2f}x")
    second = load(args.model)
    loop(second, 20)
    times = []
    threads = [threading.Thread(target=lambda m=m: times.append(loop(m, args.steps))) for m in (first, second)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    print(f"two threads at once: {times[0]:.2f} s, {times[1]:.2f} s -> capacity {2 * alone / max(times):.2f}x")


if __name__ == "__main__":
    main()
