"""Account for every millisecond of a speculative round: draft forwards, target forward, pre-verifier, rest.

    python examples/profile_round.py                      # probe-sized pair built from configs
    python examples/profile_round.py --target hub_cards/demo-target --draft hub_cards/demo-draft
    python examples/profile_round.py --pyinstrument       # also print a call-tree profile of pacer's loop
    python examples/profile_round.py --clock cpu --threads 1 --compile-draft
    python examples/profile_round.py --loop lean         # pacer_hf rows through one verification loop only
    python examples/profile_round.py --draft-forward both # pacer_hf rows with the lean and the model's draft forward

`--clock cpu` times with the thread's CPU clock (with one intra-op thread all work runs on this
thread), which stays meaningful on a machine shared with other jobs; `wall` is what a user sees.

"Overhead" is the round time minus the time inside draft forwards, the target forward and the
pre-verifier: Python bookkeeping, logits processing, cache cropping, the verification loop. The
forwards are timed by wrapping `forward` on these model instances, and the lean draft forward
(`pacer_hf.loops.lean_draft.LeanDraft.__call__`) counts as a draft forward (in this script only). It is split
into `drafting_overhead` (inside the candidate generator's `get_candidates`: the drafting loop's own
bookkeeping; for hf-fixed, HF's per-round `assistant_model.generate()` setup) and `loop_overhead`
(everything outside it and outside the target forward: the verification loop, i.e. transformers'
`_assisted_decoding` for hf-fixed and `[transformers]` rows, pacer_hf's lean loop for `[lean]` rows,
transformers' `_sample` for ar).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

import pacer_hf
from pacer_hf import PacerPreVerifier
from pacer_hf.loops.lean_draft import LeanDraft

CLOCKS = {"wall": time.perf_counter, "cpu": time.thread_time}
clock = time.perf_counter


class ForwardTimer:
    """Wraps a model instance's forward to sum its wall time and count its calls."""

    def __init__(self, model: torch.nn.Module):
        self.seconds, self.calls, self._forward = 0.0, 0, model.forward
        model.forward = self

    def __call__(self, *args, **kwargs):
        start = clock()
        try:
            return self._forward(*args, **kwargs)
        finally:
            self.seconds += clock() - start
            self.calls += 1

    def reset(self) -> None:
        self.seconds, self.calls = 0.0, 0


class DraftingTimer:
    """Times `get_candidates` of transformers' and pacer_hf's candidate generators (this script only,
    restored by `close`): drafting time minus draft forwards and pre-verifier = the drafting loop's own
    bookkeeping; the rest of the overhead is transformers' verification loop."""

    def __init__(self):
        from transformers.generation.candidate_generator import AssistedCandidateGenerator

        from pacer_hf.loops.draft_loop import PacerCandidateGenerator

        self.seconds, self.originals = 0.0, {}
        for cls in (AssistedCandidateGenerator, PacerCandidateGenerator):
            original = cls.__dict__["get_candidates"]
            self.originals[cls] = original

            def timed(generator, *args, _original=original, **kwargs):
                start = clock()
                try:
                    return _original(generator, *args, **kwargs)
                finally:
                    self.seconds += clock() - start

            cls.get_candidates = timed

    def reset(self) -> None:
        self.seconds = 0.0

    def close(self) -> None:
        for cls, original in self.originals.items():
            cls.get_candidates = original


def probe_pair() -> tuple[torch.nn.Module, torch.nn.Module]:
    """The issue's probe shapes: a 4-layer/384 target and a 1-layer/192 draft (random weights)."""
    common = {"vocab_size": 8192, "num_attention_heads": 6, "num_key_value_heads": 2, "bos_token_id": None,
              "eos_token_id": None, "pad_token_id": None}
    torch.manual_seed(0)
    target = LlamaForCausalLM(LlamaConfig(hidden_size=384, intermediate_size=1024, num_hidden_layers=4, **common))
    draft = LlamaForCausalLM(LlamaConfig(hidden_size=192, intermediate_size=512, num_hidden_layers=1,
                                         **{**common, "num_attention_heads": 3, "num_key_value_heads": 1}))
    return target.eval(), draft.eval()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target")
    parser.add_argument("--draft")
    parser.add_argument("--gamma", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--pyinstrument", action="store_true")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="wall")
    parser.add_argument("--compile-draft", action="store_true", help="also run sd-fixed with pacer_hf.compile_draft")
    parser.add_argument("--loop", choices=["lean", "transformers", "both"], default="both",
                        help="verification loop(s) of the pacer_hf rows (pacer_loop=); both: one row per loop")
    parser.add_argument("--draft-forward", choices=["auto", "model", "both"], default="auto",
                        help="draft forward of the pacer_hf rows (pacer_draft_forward=); both: one row per forward")
    parser.add_argument("--out", help="write the table as JSON here")
    args = parser.parse_args()
    global clock
    clock = CLOCKS[args.clock]
    torch.set_num_threads(args.threads)
    if args.target:
        target = AutoModelForCausalLM.from_pretrained(args.target, dtype=torch.float32).eval()
        draft = AutoModelForCausalLM.from_pretrained(args.draft, dtype=torch.float32).eval()
    else:
        target, draft = probe_pair()
    pacer_hf.enable(target)
    target_timer, draft_timer = ForwardTimer(target), ForwardTimer(draft)
    draft.generation_config.num_assistant_tokens = args.gamma
    draft.generation_config.num_assistant_tokens_schedule = "constant"
    draft.generation_config.assistant_confidence_threshold = 0.0
    pv = PacerPreVerifier.from_draft(draft, block_size=args.gamma, threshold=0.0, max_draft_tokens=args.gamma)
    pv_timer = ForwardTimer(pv)  # on the chosen clock (stats.preverifier_seconds is always wall time)
    prompt = torch.randint(0, target.config.vocab_size, (1, 64), generator=torch.Generator().manual_seed(1))
    pacer_rows = {
        f"sd-fixed-{args.gamma}": {"assistant_model": draft, "pacer": f"sd-fixed-{args.gamma}"},
        f"pacer (τ=0, b={args.gamma})": {"assistant_model": draft, "pacer": pv},
    }
    if args.compile_draft:
        import copy

        compiled = pacer_hf.compile_draft(copy.deepcopy(draft))
        compiled_timer = ForwardTimer(compiled)
        step = compiled._pacer_decode_step

        def timed_step(**kwargs):  # the compiled one-token step bypasses forward: time it too
            start = clock()
            try:
                return step(**kwargs)
            finally:
                compiled_timer.seconds += clock() - start
                compiled_timer.calls += 1

        compiled.__dict__["_pacer_decode_step"] = timed_step
        pacer_rows[f"sd-fixed-{args.gamma} compiled"] = {"assistant_model": compiled, "pacer": f"sd-fixed-{args.gamma}"}
    loops = ["lean", "transformers"] if args.loop == "both" else [args.loop]
    strategies = {"ar": {}, f"hf-fixed-{args.gamma}": {"assistant_model": draft}}
    forwards = ["auto", "model"] if args.draft_forward == "both" else [args.draft_forward]
    strategies.update({f"{name} [{loop}" + (f", {forward}]" if len(forwards) > 1 else "]"):
                       {**kwargs, "pacer_loop": loop, "pacer_draft_forward": forward}
                       for name, kwargs in pacer_rows.items() for loop in loops for forward in forwards})
    lean_call = LeanDraft.__call__

    def timed_lean(lean, *call_args):  # the lean draft forward bypasses draft.forward: time it as one
        start = clock()
        try:
            return lean_call(lean, *call_args)
        finally:
            draft_timer.seconds += clock() - start
            draft_timer.calls += 1

    LeanDraft.__call__ = timed_lean
    samples: dict[str, list[dict]] = {name: [] for name in strategies}
    drafting = DraftingTimer()
    forward_used: dict[str, str] = {}
    for repeat in range(args.repeats + 1):  # the first pass is warm-up
        for name, kwargs in strategies.items():
            target_timer.reset()
            draft_timer.reset()
            timer = compiled_timer if kwargs.get("assistant_model") is not draft and kwargs else draft_timer
            timer.reset()
            pv_timer.reset()
            drafting.reset()
            start = clock()
            out = target.generate(prompt, max_new_tokens=args.max_new_tokens, do_sample=False, **kwargs)
            total = clock() - start
            if "pacer" in kwargs:
                forward_used[name] = pacer_hf.last_stats(target).draft_forward
            pv_seconds = pv_timer.seconds
            rounds = target_timer.calls
            if repeat:
                samples[name].append({
                    "tokens_per_s": (out.shape[1] - prompt.shape[1]) / total,
                    "round_ms": 1e3 * total / rounds,
                    "draft_ms": 1e3 * timer.seconds / rounds,
                    "draft_forwards_per_round": timer.calls / rounds,
                    "target_ms": 1e3 * target_timer.seconds / rounds,
                    "preverifier_ms": 1e3 * pv_seconds / rounds,
                    "overhead_ms": 1e3 * (total - timer.seconds - target_timer.seconds - pv_seconds) / rounds,
                    # of which: inside get_candidates (drafting loop) / outside it (the verification loop)
                    "drafting_overhead_ms": 1e3 * (drafting.seconds - timer.seconds - pv_seconds) / rounds
                    if kwargs else 0.0,
                    "loop_overhead_ms": 1e3 * (total - drafting.seconds - target_timer.seconds) / rounds,
                })
    drafting.close()
    LeanDraft.__call__ = lean_call
    table = {name: {key: statistics.median(s[key] for s in rows) for key in rows[0]} for name, rows in samples.items()}
    print(f"clock={args.clock} threads={args.threads} gamma={args.gamma} max_new_tokens={args.max_new_tokens} "
          f"repeats={args.repeats} (medians)")
    columns = list(next(iter(table.values())))
    short = {"draft_forwards_per_round": "draft_fw/round", "drafting_overhead_ms": "of it: drafting",
             "loop_overhead_ms": "of it: loop"}
    print(f"{'strategy':<36}" + "".join(f"{short.get(c, c.removesuffix('_ms')):>17}" for c in columns))
    for name, row in table.items():
        print(f"{name:<36}" + "".join(f"{row[c]:>17.3f}" for c in columns))
    print("draft forward that ran (stats.draft_forward): " + ", ".join(f"{k}: {v}" for k, v in forward_used.items()))
    if args.out:
        with open(args.out, "w") as handle:
            json.dump({"args": vars(args), "medians": table, "draft_forward": forward_used}, handle, indent=2)
    if args.pyinstrument:
        from pyinstrument import Profiler

        profiler = Profiler(interval=0.0005)
        with profiler:
            target.generate(prompt, max_new_tokens=args.max_new_tokens, do_sample=False,
                            **next(kw for kw in strategies.values() if kw.get("pacer") == f"sd-fixed-{args.gamma}"))
        print(profiler.output_text(unicode=False, color=False, show_all=False))


if __name__ == "__main__":
    main()
