"""Side-by-side demo on the shipped draft/target pair: plain decoding, fixed-length SD, HF's dynamic drafts, Pacer.

Loads hub_cards/demo-target and hub_cards/demo-draft (built by `pacer-hf build-demo-pair`), and
hub_cards/demo-preverifier when it exists (otherwise an untrained `PacerPreVerifier.from_draft`).
Generates greedily from a few HumanEval prompts with each strategy, runs interleaved and repeated,
checks every output is identical to plain decoding, and prints tokens/s, speedup, tau (tokens per
target forward) and mean draft length, then one example completion.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

import pacer_hf
from pacer_hf import PacerPreVerifier

SHIPPED_DIR = Path(__file__).resolve().parent.parent / "hub_cards"
REBUILD_HINT = "Rebuild them with `pacer-hf build-demo-pair` (about an hour on a 2-core CPU; see docs/DEMO_PAIR.md)."
REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "generation_config.json")


class DemoPairMissing(RuntimeError):
    """The shipped demo folders are absent or unreadable; the message says how to rebuild them."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--prompts", type=int, default=3, help="number of HumanEval prompts")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved timed repeats (median reported)")
    parser.add_argument("--gamma", type=int, default=6, help="draft length of the sd-fixed baseline")
    parser.add_argument("--folder", default=str(SHIPPED_DIR), help="folder holding demo-target/, demo-draft/")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (0: torch's default); 1 because two OpenMP threads on a shared 2-core CPU "
                        "stall at barriers (measured: 10-100x slower, erratic generate calls)")


def load_demo_pair(folder: str | Path = SHIPPED_DIR):
    """(target, draft, tokenizer) from the shipped Hub-format folders, in float32, eval mode.

    Raises DemoPairMissing, naming the rebuild command, when a file is missing or does not load."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = Path(folder)
    models = []
    for role in ("target", "draft"):
        path = folder / f"demo-{role}"
        missing = [name for name in REQUIRED_FILES if not (path / name).is_file()]
        if missing:
            raise DemoPairMissing(f"The demo {role} at {path} is missing {', '.join(missing)}. {REBUILD_HINT}")
        try:
            model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        except Exception as err:  # corrupted safetensors / config: say how to fix it, keep the cause
            raise DemoPairMissing(f"The demo {role} at {path} could not be loaded ({err}). {REBUILD_HINT}") from err
        models.append(model)
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder / "demo-target")
    except Exception as err:
        raise DemoPairMissing(f"The demo tokenizer at {folder / 'demo-target'} could not be loaded ({err}). "
                              f"{REBUILD_HINT}") from err
    target, draft = models
    if target.config.vocab_size != draft.config.vocab_size:
        raise DemoPairMissing(f"The demo target and draft in {folder} have different vocabularies. {REBUILD_HINT}")
    return target, draft, tokenizer


def load_demo_preverifier(draft, folder: str | Path = SHIPPED_DIR) -> tuple[PacerPreVerifier, str]:
    """The shipped pre-verifier if hub_cards/demo-preverifier exists, else an untrained one (and a note)."""
    path = Path(folder) / "demo-preverifier"
    if (path / "config.json").is_file():
        return pacer_hf.load_preverifier(str(path)).eval(), f"pre-verifier: {path}"
    note = (f"note: {path} does not exist yet, so Pacer runs an UNTRAINED pre-verifier "
            "(PacerPreVerifier.from_draft(draft)); its stop decisions are arbitrary, outputs are still exact.")
    return PacerPreVerifier.from_draft(draft).eval(), note


def hf_dynamic_settings(draft) -> None:
    """HF's stock assisted generation reads its draft length from the draft's generation_config: set it
    explicitly (HF's defaults: 20 tokens, constant schedule, confidence threshold 0.4)."""
    draft.generation_config.num_assistant_tokens = 20
    draft.generation_config.num_assistant_tokens_schedule = "constant"
    draft.generation_config.assistant_confidence_threshold = 0.4


@dataclass
class _Counter:
    """Counts forward calls of a model (a forward pre-hook), to report tau and draft lengths uniformly."""

    calls: int = 0
    handles: list = field(default_factory=list)

    def attach(self, model) -> _Counter:
        self.handles.append(model.register_forward_pre_hook(self._hook))
        return self

    def _hook(self, module, args) -> None:
        self.calls += 1

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


@dataclass
class Row:
    name: str
    tokens_per_s: list[float] = field(default_factory=list)
    new_tokens: int = 0
    target_forwards: int = 0
    draft_forwards: int = 0


def compare(target, draft, tokenizer, prompts: list[str], strategies: dict[str, dict], max_new_tokens: int,
            repeats: int) -> tuple[list[Row], list[torch.Tensor]]:
    """Greedy generation with each strategy, interleaved, `repeats` timed passes after one warm-up pass.

    Raises AssertionError if any output differs from plain greedy decoding."""
    pacer_hf.enable(target)
    encoded = [tokenizer(p, return_tensors="pt").input_ids for p in prompts]
    gen = {"max_new_tokens": max_new_tokens, "do_sample": False, "pad_token_id": tokenizer.eos_token_id}
    reference = [target.generate(ids, **gen) for ids in encoded]  # also the warm-up of plain decoding
    rows = {name: Row(name) for name in strategies}
    for repeat in range(repeats + 1):
        for name, kwargs in strategies.items():
            counters = (_Counter().attach(target), _Counter().attach(draft))
            tokens, seconds = 0, 0.0
            try:
                for ids, expected in zip(encoded, reference):
                    start = time.perf_counter()
                    out = target.generate(ids, **gen, **kwargs)
                    seconds += time.perf_counter() - start
                    if not torch.equal(out, expected):
                        raise AssertionError(f"{name}: output differs from plain greedy decoding (a bug; please report it)")
                    tokens += out.shape[1] - ids.shape[1]
            finally:
                for counter in counters:
                    counter.remove()
            if repeat == 0:  # warm-up pass: also the one that counts forwards
                row = rows[name]
                row.new_tokens, row.target_forwards, row.draft_forwards = tokens, counters[0].calls, counters[1].calls
            else:
                rows[name].tokens_per_s.append(tokens / seconds)
    return list(rows.values()), reference


def format_table(rows: list[Row]) -> str:
    base = statistics.median(rows[0].tokens_per_s)
    lines = [f"{'strategy':<28}{'tokens/s':>10}{'spread':>14}{'speedup':>9}{'tau':>7}{'mean draft':>12}"]
    for row in rows:
        tps = statistics.median(row.tokens_per_s)
        spread = f"{min(row.tokens_per_s):.1f}-{max(row.tokens_per_s):.1f}"
        tau = row.new_tokens / max(row.target_forwards, 1)
        mean_draft = row.draft_forwards / max(row.target_forwards, 1)
        lines.append(f"{row.name:<28}{tps:>10.1f}{spread:>14}{tps / base:>8.2f}x{tau:>7.2f}{mean_draft:>12.2f}")
    return "\n".join(lines)


def default_strategies(draft, preverifier: PacerPreVerifier, gamma: int) -> dict[str, dict]:
    """name -> extra generate kwargs; the first is the plain-decoding baseline."""
    hf_dynamic_settings(draft)
    return {
        "plain": {},
        f"sd-fixed-{gamma} (pacer_hf loop)": {"assistant_model": draft, "pacer": f"sd-fixed-{gamma}"},
        "HF dynamic (stock)": {"assistant_model": draft},
        "pacer": {"assistant_model": draft, "pacer": preverifier},
    }


def run(args: argparse.Namespace) -> int:
    from .demo_pair import humaneval_prompts

    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        target, draft, tokenizer = load_demo_pair(args.folder)
    except DemoPairMissing as err:
        print(f"error: {err}")
        return 2
    preverifier, note = load_demo_preverifier(draft, args.folder)
    print(note)
    prompts = humaneval_prompts(args.prompts)
    strategies = default_strategies(draft, preverifier, args.gamma)
    start = time.perf_counter()
    rows, outputs = compare(target, draft, tokenizer, prompts, strategies, args.max_new_tokens, args.repeats)
    print(f"{len(prompts)} HumanEval prompts x {args.max_new_tokens} new tokens, greedy, median of {args.repeats} "
          f"interleaved runs, {torch.get_num_threads()} torch threads ({time.perf_counter() - start:.0f} s)")
    print(format_table(rows))
    print("all outputs identical to plain greedy decoding")
    print("\nexample (HumanEval/0 prompt, then the target's greedy completion):\n" + "-" * 60)
    print(tokenizer.decode(outputs[0][0], skip_special_tokens=True))
    return 0


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
