"""Run pacer_hf's strategy battery on every causal-LM family of the installed transformers.

    python scripts/family_sweep.py --out docs/families-5.24.md        # every family (a few minutes)
    python scripts/family_sweep.py mistral gemma2                       # some

For each family a tiny random model is built from its config (tests/families.py: windows of 8 tokens
where the family can window), and each strategy of the battery generates 30 greedy tokens after a
12-token prompt. A family is *exact* when every strategy returns the target's own output, *refused* when
pacer_hf refused every call before generating (the reason is printed), *not built* when no tiny model
could be made from its config (or its plain `generate` fails), and *FAILED* otherwise: a mismatch or a
crash mid-generation. Exits 1 if any family FAILED.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import transformers  # noqa: E402
from conftest import make_lookup_gate, make_preverifier  # noqa: E402
from families import (  # noqa: E402
    BATTERY,
    LOOKUP_PROMPT,
    Refused,
    TinyModelError,
    noisy_copy,
    run_case,
    tiny_model,
    window_of,
)
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES  # noqa: E402

import pacer_hf  # noqa: E402

NEW_TOKENS = 30


def sweep_one(name: str) -> tuple[str, str]:
    """(outcome, detail) for one family."""
    try:
        target = tiny_model(name)
        draft = noisy_copy(target)
        expected = target.generate(LOOKUP_PROMPT, max_new_tokens=NEW_TOKENS, do_sample=False)
    except TinyModelError as error:
        return "not built", str(error).splitlines()[0][:160]
    except Exception as error:  # noqa: BLE001  (a family transformers itself cannot run tiny)
        return "not built", f"plain generate fails: {type(error).__name__}: {str(error).splitlines()[0][:120]}"
    pacer_hf.enable(target)
    pacer_hf.attach(target, make_lookup_gate(target))
    pacer_hf.attach(draft, make_preverifier(draft, block_size=2, threshold=0.5, max_draft_tokens=6))
    results = {}
    for label, pacer, kwargs in BATTERY:
        try:
            out = run_case(target, draft, pacer, LOOKUP_PROMPT, NEW_TOKENS, **kwargs)
            results[label] = "exact" if torch.equal(out, expected) else "DIFFERS"
        except Refused as refusal:
            results[label] = "refused: " + str(refusal).split(": ", 1)[-1][:200]
        except Exception as error:  # noqa: BLE001  (a crash mid-generation is what the sweep looks for)
            results[label] = f"CRASH {type(error).__name__}: {str(error).splitlines()[0][:150]}"
    outcomes = set(results.values())
    window = window_of(target)
    if outcomes == {"exact"}:
        return "exact", f"window {window}" if window else ""
    if all(value.startswith("refused") for value in outcomes):
        return "refused", sorted(outcomes)[0].removeprefix("refused: ")
    bad = {label: value for label, value in results.items() if value != "exact"}
    return "FAILED", "; ".join(f"{label}: {value}" for label, value in bad.items())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("families", nargs="*", help="model_type names (default: every causal-LM family)")
    parser.add_argument("--out", type=Path, help="also write the table as markdown here")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    transformers.logging.set_verbosity_error()
    torch.set_num_threads(1)
    names = args.families or sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
    rows, start = [], time.perf_counter()
    for i, name in enumerate(names, 1):
        outcome, detail = sweep_one(name)
        rows.append((name, outcome, detail))
        print(f"[{i}/{len(names)}] {name}: {outcome} {detail}", flush=True)
    counts = {outcome: sum(row[1] == outcome for row in rows) for outcome in ("exact", "refused", "not built", "FAILED")}
    summary = (f"transformers {transformers.__version__}, torch {torch.__version__}: {len(rows)} families, "
               + ", ".join(f"{n} {outcome}" for outcome, n in counts.items()) + f" ({time.perf_counter() - start:.0f} s)")
    print(summary)
    if args.out:
        lines = [f"# Family sweep: {summary}", "",
                 "`python scripts/family_sweep.py --out <this file>`; battery: "
                 + ", ".join(label for label, _, _ in BATTERY) + ".", "",
                 "| family | outcome | detail |", "|---|---|---|"]
        lines += [f"| {name} | {outcome} | {detail.replace('|', '/')} |" for name, outcome, detail in rows]
        args.out.write_text("\n".join(lines) + "\n")
    return 1 if counts["FAILED"] else 0


if __name__ == "__main__":
    sys.exit(main())
