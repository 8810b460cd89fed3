"""Interleaved A/B of stop rules on the benchmark's greedy prompts: fixed γ against pre-verifiers and, with
--oracle, against the stop-rule ceiling measured inside generate.

    python examples/compare_stop_rules.py hub_cards/demo-preverifier /path/to/other-preverifier --runs 2
    python examples/compare_stop_rules.py hub_cards/demo-preverifier --oracle --gammas 5,6,7,8,10,12 --prompts 8 --runs 1
    python examples/compare_stop_rules.py --pair qwen2.5-coder --oracle --gammas 1,2,3,4,6,8 --prompts 2 --runs 1
    python examples/compare_stop_rules.py fitted-folder default --target ID_OR_DIR --draft ID_OR_DIR --oracle

Every setting decodes every prompt once per run, interleaved (so machine load hits them alike), after one untimed
warm-up call each, and every output is checked against plain decoding
(`pacer_hf.training.validate.compare_in_generate`). `--pair qwen2.5-coder` runs the Qwen2.5-Coder pair (its cheap draft)
on the benchmark's code chat categories, with its shipped pre-verifier when no folder is given; `--target/--draft`
run a user's own pair (Hub ids or folders, as `pacer-hf bench` loads them) on the chat categories. A pre-verifier
named `default` is pacer_hf's default one (what `pacer=True` uses for a draft without one). `--costs CURVE` runs
each pre-verifier twice, as measured where it runs (probe and online refit) and as "NAME@recorded" deciding with a
recorded curve (`scripts/record_cost_curve.py`): whether the probe reads the machine well enough. Prints tokens/s and
speed over the target alone per category,
the median over categories, and each setting's speed over the best fixed γ of the same category; writes them as
JSON with --out. `--hf` adds transformers' own schedules, as the benchmark runs them: `hf-confidence` (the default
dynamic one) and `hf-heuristic`.

--oracle adds a stop criterion that knows the target's greedy continuation (decoded once per prompt, untimed) and
ends each round at the first drafted token the target will reject, capped at the first pre-verifier's
`max_draft_tokens` (else the largest γ). "oracle" keeps that token, as Pacer's stop-only rule does (a perfect
pre-verifier); "oracle-trim" drops it (the round verifies exactly the accepted tokens). Both pay every draft forward
up to the rejected token and nothing for a pre-verifier, so they bound what any stop rule can gain on this machine
(the benchmark's `oracle` row is modelled instead); each setting's share of oracle-trim's gain is printed too.
"oracle-curve" knows the same and the machine's round costs (the probe the stop rule reads): a round that meets a
rejected token gains the same tokens at any longer length, so it drafts on to the cheapest one. Where verifying more
tokens can cost less (CPU kernels that make some widths slow) a stop-only oracle is no ceiling; this one is nearer.
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import dataclass
from types import SimpleNamespace
from typing import ClassVar

import torch

import pacer_hf
from pacer_hf.bench.strategy_calls import call_context, resolve_strategies
from pacer_hf.costs import cached_probe, fastest, forward_costs, model_key
from pacer_hf.costs.cost_model import recorded_calibration
from pacer_hf.data.chat_prompts import CHAT_CATEGORIES, chat_prompts
from pacer_hf.data.prompts import CATEGORIES, build_prompts
from pacer_hf.loops.draft_forwards import draft_step_timer
from pacer_hf.loops.draft_loop import PacerCandidateGenerator
from pacer_hf.modeling_pacer import calibrated_round_time
from pacer_hf.pairs import load_pair
from pacer_hf.stats import PacerStats
from pacer_hf.strategies.registry import StrategyCall, StrategyContext
from pacer_hf.training.validate import compare_in_generate

REFERENCES: dict[tuple[int, ...], list[int]] = {}  # prompt ids -> the target's greedy output (prompt included)


class ReferenceStop:
    """Ends a round at the first drafted token that differs from the target's known greedy continuation."""

    costs = None  # no cost model to feed
    block_size = 1  # it decides after every token

    def __init__(self, trim: bool, seconds: list[float] | None = None):
        self.trim_rejected, self.reference, self.position, self.drafted, self.trim = trim, [], 0, 0, 0
        self.seconds = seconds  # round seconds for k = 0..cap proposed tokens ("oracle-curve": no trim), else None
        self.until: int | None = None  # past the first rejection: the length this round drafts on to

    def drafts_this_round(self, unread: int = 1, left: int | None = None) -> bool:
        return True

    def read(self, tokens: int, seconds: float) -> None:
        """Nothing to learn from the draft's reading speed: every round drafts."""

    def start_round(self) -> None:
        self.drafted, self.trim, self.until = 0, 0, None

    def observe(self, proposed: int, accepted: int) -> None:
        """Nothing to calibrate: the reference knows every verdict."""

    def add_token(self, hidden: torch.Tensor, logits: torch.Tensor, token: torch.Tensor) -> bool:
        at = self.position + self.drafted
        self.drafted += 1
        if self.until is not None:
            return self.drafted >= self.until
        if at < len(self.reference) and int(token[0, 0]) == self.reference[at]:
            return False
        if self.seconds is not None:  # the round gains the same tokens at any length from here: take the cheapest
            self.until = min(range(self.drafted, len(self.seconds)), key=self.seconds.__getitem__)
            return self.drafted >= self.until
        self.trim = int(self.trim_rejected)
        return True

    def end_round(self, *outcome) -> None:
        pass


class OracleGenerator(PacerCandidateGenerator):
    """Tells the reference stop where each round starts (and, on the first, which prompt this is)."""

    def get_candidates(self, input_ids: torch.LongTensor, **kwargs):
        if self.record.rounds == 0:
            self.stop.reference = REFERENCES[tuple(input_ids[0].tolist())]
        self.stop.position = input_ids.shape[1]
        return super().get_candidates(input_ids, **kwargs)


@dataclass(frozen=True)
class OracleStopConfig(pacer_hf.StrategyConfig):
    strategy_type: ClassVar[str] = "oracle-stop"
    gamma: int = 12
    trim: bool = True
    curve: bool = False  # past the first rejected token, draft on to the cheapest round length (`round_seconds`)
    use_preverifier: bool = False

    @property
    def name(self) -> str:
        return "oracle-curve" if self.curve else "oracle-trim" if self.trim else "oracle"


def round_seconds(target, draft, cap: int) -> list[float]:
    """Seconds of a round proposing k = 0..cap tokens on this machine: the target's cached forward over k + 1 tokens
    and k draft steps, each probed once per process as the stop rule probes them (`draft_costs`)."""
    _, _, verify, _ = forward_costs(target, cap + 1)
    step, _ = cached_probe(model_key(draft) + "|draft-step", lambda: fastest(draft_step_timer(draft), 5))
    return [verify[k] + k * step for k in range(cap + 1)]


def build(config: OracleStopConfig, context: StrategyContext) -> StrategyCall:
    stats = PacerStats(strategy=config.name)

    def make(generation_config, logits_processor) -> OracleGenerator:
        return OracleGenerator(context.draft, generation_config, logits_processor, max_draft_tokens=config.gamma,
                               stats=stats, draft_forward=context.draft_forward,
                               stop=ReferenceStop(config.trim, round_seconds(context.model, context.draft, config.gamma)
                                                  if config.curve else None))

    return StrategyCall(name=config.name, make=make, stats=stats)


pacer_hf.register_strategy(OracleStopConfig, build)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("preverifiers", nargs="*", help="pre-verifier folders")
    parser.add_argument("--gammas", default="1,2,3,4")
    parser.add_argument("--oracle", action="store_true", help="add the measured oracle stop rules")
    parser.add_argument("--hf", action="store_true", help="add transformers' hf-confidence and hf-heuristic schedules")
    parser.add_argument("--prompts", type=int, default=3, help="prompts per category")
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--out", help="write the results as JSON here")
    parser.add_argument("--pair", default="stdlib", choices=("stdlib", "qwen2.5-coder"))
    parser.add_argument("--target", help="a user's target (Hub id or folder) instead of --pair; needs --draft")
    parser.add_argument("--draft", help="the user's draft (a folder with cheap_draft.json is made cheap as it says)")
    parser.add_argument("--tokenizer", help="with --target: the tokenizer, when the target's folder or id has none")
    parser.add_argument("--costs", help="a recorded cost curve (scripts/record_cost_curve.py): each pre-verifier also "
                                        "runs deciding with it (`pacer_costs=` its table), beside the probe it measures")
    parser.add_argument("--categories", help="comma-separated (default: the stdlib categories for the demo pair, "
                                             "the code chat categories for qwen2.5-coder)")
    args = parser.parse_args()
    if bool(args.target) != bool(args.draft):
        parser.error("--target and --draft go together (a user's pair); or use --pair.")
    torch.set_num_threads(1)
    pair = _user_pair(args) if args.target else load_pair(args.pair)
    prompts = _prompts(pair, args)
    gammas = [int(g) for g in args.gammas.split(",")]
    settings = {f"sd-fixed-{g}": f"sd-fixed-{g}" for g in gammas}
    settings.update({path: pacer_hf.default_preverifier(False, pair.draft.device) if path == "default"
                     else pacer_hf.PacerPreVerifier.from_pretrained(path) for path in args.preverifiers})
    if not args.preverifiers and args.pair != "stdlib" and not args.target:
        settings["pacer"] = pair.preverifier
    setting_kwargs = {}
    if args.costs:  # a twin of each pre-verifier setting that decides with the recorded curve instead of the probe
        table = recorded_round_costs(args.costs)
        for name, value in list(settings.items()):
            if isinstance(value, pacer_hf.PacerPreVerifier):
                settings[f"{name}@recorded"], setting_kwargs[f"{name}@recorded"] = value, {"pacer_costs": table}
    first = next((v for v in settings.values() if isinstance(v, pacer_hf.PacerPreVerifier)), None)
    if args.oracle:
        cap = first.config.max_draft_tokens if first is not None else max(gammas)
        settings.update({"oracle": OracleStopConfig(cap, trim=False), "oracle-trim": OracleStopConfig(cap, trim=True),
                         "oracle-curve": OracleStopConfig(cap, trim=False, curve=True)})
    contexts = {}
    hf = [s for s in resolve_strategies(["hf-confidence", "hf-heuristic"], False) if s.family == "hf"] if args.hf else []
    for strategy in hf:
        settings[strategy.name] = False  # transformers' own assisted generation, its schedule set per call
        contexts[strategy.name] = lambda s=strategy: call_context(s, pair.target, pair.draft)
    results: dict[str, dict] = {}
    for category, chosen in prompts.items():
        ids = [list(p.ids) for p in chosen]
        for prompt in ids if args.oracle else ():
            out = pair.target.generate(torch.tensor([prompt]), max_new_tokens=args.max_new_tokens, do_sample=False)
            REFERENCES[tuple(prompt)] = out[0].tolist()
        rows = compare_in_generate(pair.target, pair.draft, ids, settings, args.runs, args.max_new_tokens, warmup=True,
                                   contexts=contexts, setting_kwargs=setting_kwargs)
        best_fixed = max(row["vs_ar"] for name, row in rows.items() if name.startswith("sd-fixed"))
        gap = rows["oracle-trim"]["vs_ar"] - best_fixed if args.oracle else 0.0
        for name, row in rows.items():
            capture = (row["vs_ar"] - best_fixed) / gap if gap > 0 else float("nan")
            results.setdefault(name, {})[category] = {**row, "vs_best_fixed": row["vs_ar"] / best_fixed,
                                                      "capture": capture}
            print(f"{category:<20} {name:<40} {row['tokens_per_s']:6.1f} tok/s  {row['vs_ar']:.3f}x ar  "
                  f"{row['vs_ar'] / best_fixed:.3f}x best fixed  capture {capture:+.2f}  "
                  f"mean draft {row['mean_draft']:.2f}  tau {row['tau']:.2f}")
    print("median over categories (x ar, x best fixed γ of the category, share of oracle-trim's gain):")
    for name, rows in results.items():
        print(f"  {name:<40} {statistics.median(r['vs_ar'] for r in rows.values()):.3f}x  "
              f"{statistics.median(r['vs_best_fixed'] for r in rows.values()):.3f}x  "
              f"{statistics.median(r['capture'] for r in rows.values()):+.2f}")
    if args.out:
        with open(args.out, "w") as handle:
            json.dump(results, handle, indent=1)


def recorded_round_costs(path: str) -> list[float]:
    """A recorded curve's round costs in target steps, k = 0.. drafted tokens, priced as `generate` prices a stored
    calibration (`calibrated_round_time`: k draft steps and pre-verifier scorings, a verify of k + 1)."""
    costs = recorded_calibration(path)
    if costs is None:
        raise SystemExit(f"--costs {path}: the curve has no draft step (record it with a draft), so it prices no round.")
    time = calibrated_round_time(costs)
    return [time(k) for k in range(len(costs["verify_cost"]))]


def _user_pair(args: argparse.Namespace) -> SimpleNamespace:
    """A user's pair loaded and checked as `pacer-hf bench --target --draft` does (float32; --tokenizer, else the
    target's)."""
    from pacer_hf.bench.user_pair import load_draft, tokenizer_of
    from pacer_hf.loading import check_pair, load_causal_lm

    pair = SimpleNamespace(target=load_causal_lm(args.target), draft=load_draft(args.draft, "float32"),
                           tokenizer=tokenizer_of(args, args.target))
    check_pair(pair.target, pair.draft, pair.tokenizer)
    return pair


def _prompts(pair, args) -> dict:
    """category -> prompts: held-out stdlib text for the demo pair, the bench split's chat requests else (every chat
    category for a user's chat model, the code ones for the Qwen pair)."""
    chat = getattr(pair.tokenizer, "chat_template", None) is not None
    if (args.pair == "stdlib" and not args.target) or (args.target and not chat):
        categories = args.categories.split(",") if args.categories else list(CATEGORIES)
        prompts, _ = build_prompts(categories, lambda text: pair.tokenizer(text).input_ids, args.prompts, 256,
                                   target_dir=pair.target.name_or_path)
        return prompts
    default = ",".join(CHAT_CATEGORIES) if args.target else "chat-humaneval,chat-docstring,chat-edit"
    categories = (args.categories or default).split(",")
    unknown = sorted(set(categories) - set(CHAT_CATEGORIES))
    if unknown:
        raise SystemExit(f"--categories: {unknown} are not chat categories; choose from {', '.join(CHAT_CATEGORIES)}.")
    return {c: chat_prompts(pair.tokenizer, c, "bench", n=args.prompts) for c in categories}


if __name__ == "__main__":
    main()
