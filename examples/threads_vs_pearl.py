"""Both cores to the target, or one each to draft and target? Pacer and the target alone given two torch threads
against PEARL and Pacer + PEARL (the target on one thread, the draft in its worker on the other), interleaved.

    OMP_NUM_THREADS=2 python examples/threads_vs_pearl.py --pair qwen2.5-coder --prompts 1 --max-new-tokens 64

`pacer-hf bench` sets one thread count per run, so comparing the two layouts across runs compares two spells of
the machine as well. Here every prompt runs every setting in turn (the thread count set before each call; the
order rotates per prompt), after one untimed warm-up call each (Pacer's cost probe is taken per thread count).
Greedy; every output is checked identical to the first setting's. Prints tokens/s per category and setting, and
each setting over the better of Pacer and the target alone at two threads.

`--step-times` measures instead what bounds the overlap: one draft step, one target step and a verify forward
of k + 1 tokens on a cached prefix (interleaved medians, `pacer_hf.loops.probes.measure_costs`), at one and at
two threads, and the round times they give: γ draft steps then a verify on two threads (Pacer, sd-fixed)
against the slower of the two on one thread each (PEARL's overlap, with nothing lost to synchronisation).
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
    parser.add_argument("--step-times", action="store_true", help="measure draft, target and verify times at 1 and "
                        "2 threads and the round times they bound (no generate calls)")
    parser.add_argument("--repeats", type=int, default=7, help="--step-times: interleaved repeats per timing")
    args = parser.parse_args()
    pair = load_pair(args.pair)
    if args.step_times:
        return step_times(pair, args)
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


def step_times(pair, args) -> None:
    """Draft step, target step and verify forwards at 1 and 2 threads (seconds), and per γ the round time of
    drafting then verifying on two threads against PEARL's ideal overlap on one thread each."""
    from pacer_hf.loops.probes import measure_costs

    gammas = (1, 2, 3, 4, 6)
    measured = {}
    for threads in (1, 2):
        torch.set_num_threads(threads)
        costs = measure_costs(pair.target, pair.draft, context=256, max_k=max(gammas), repeats=args.repeats)
        step = costs.step_seconds
        measured[threads] = {"target_step_s": step, "draft_step_s": costs.draft_cost * step,
                             "verify_s": {k: costs.verify_cost[k] * step for k in range(max(gammas) + 1)}}
        m = measured[threads]
        print(f"{threads} thread(s): target step {step * 1000:.0f} ms, draft step {m['draft_step_s'] * 1000:.0f} ms "
              f"({costs.draft_cost:.2f} of a target step), verify k+1 tokens: "
              + ", ".join(f"k={k} {v * 1000:.0f} ms" for k, v in m["verify_s"].items()))
    one, two = measured[1], measured[2]
    print("round time per γ (ms): sequential on 2 threads = γ·draft@2 + verify@2; PEARL ideal = max(γ·draft@1, verify@1)")
    rounds = {}
    for g in gammas:
        sequential = g * two["draft_step_s"] + two["verify_s"][g]
        overlap = max(g * one["draft_step_s"], one["verify_s"][g])
        rounds[g] = {"sequential_2_threads_s": sequential, "pearl_ideal_s": overlap}
        print(f"  γ={g}: sequential@2 {sequential * 1000:.0f}, PEARL ideal {overlap * 1000:.0f} "
              f"({sequential / overlap:.2f}x in PEARL's favour at equal acceptance)")
    if args.out:
        with open(args.out, "w") as handle:
            json.dump({"threads": measured, "rounds": rounds}, handle, indent=1)


if __name__ == "__main__":
    main()
