"""The model card of a lookup gate trained by `pacer-hf train-lookup-gate` (recipes/lookup_gate.py)."""

from __future__ import annotations

from pathlib import Path

from ..configuration_lookup_gate import NUM_LOOKUP_FEATURES, PacerLookupGateConfig

PRIOR_NOTE = " The table in `round_cost` is the training machine's, used only with `pacer_costs='prior'`."
UNSEEN_NOTE = (" The last column is a gate trained without that target's answers: how the gate does on a target it "
               "never saw.")


def _speed_rows(table: dict, left_out: dict | None) -> str:
    names = list(next(iter(table.values())))
    head = names + (["gate, target left out of training"] if left_out else [])
    rows = [f"| {cat} | " + " | ".join(str(row[n]) for n in names)
            + (f" | {left_out[cat]['gate']}" if left_out else "") + " |" for cat, row in table.items()]
    return f"| category | {' | '.join(head)} |\n|---|{'---|' * len(head)}\n" + "\n".join(rows)


def write_card(path: Path, config: PacerLookupGateConfig, target_names: dict[str, str]) -> None:
    """`target_names`: pair name -> how the card names its target."""
    info = config.training
    names = info["targets"]
    several = len(names) > 1
    data = "\n".join(
        f"  - {target_names[n]}: {a['greedy']} greedy answers ({a['tokens']['greedy']} tokens) and {a['sampled']} T=1 "
        f"samples ({a['tokens']['sampled']} tokens)" for n, a in info["answers"].items())
    costs = "\n".join(
        f"  - {n}: {c['round_cost']} (ms: {c['verify_ms']}; {c['context']}-token cached prefix, {c['threads']} thread, "
        f"median of {c['repeats']})" for n, c in info["costs"].items())
    speeds = "\n\n".join(f"**{target_names[n]}**\n\n" + _speed_rows(info["simulated_speed"][n],
                                                                 (info.get("simulated_speed_target_left_out") or {}).get(n))
                         for n in names)
    cached = info.get("simulated_speed_with_cache") or {}
    if any(cached.values()):
        speeds += ("\n\n### With a cache of earlier answers\nThe same held-out answers run in order with a "
                   "`SuffixCache` of all earlier answers of that target (train and held-out, never the answer "
                   "itself), as `generate(..., suffix_cache=)` runs a dataset:\n\n"
                   + "\n\n".join(f"**{target_names[n]}**\n\n" + _speed_rows(cached[n], None) for n in names if cached.get(n)))
    cache_pass = ("" if "simulated_speed_with_cache" not in info else
                  " A second pass runs the answers in order with a cache of the earlier ones\n  and adds the rounds "
                  "where the cache's match is longer than the answer's own, with the features a cache match\n  gets "
                  "(`candidates.suffix.gate_features`: prompt text at distance 1, which no single request reaches).")
    title = "Default lookup gate (any causal LM)" if several else f"Lookup gate for {target_names[names[0]]}"
    use = ("out = model.generate(ids, prompt_lookup_num_tokens=10, pacer=True)  # any enabled model: this gate "
           "by default" if several else
           "pair = load_pair(\"smollm2\")          # attaches this gate to pair.target\n    "
           "out = pair.target.generate(ids, prompt_lookup_num_tokens=10, pacer=True, max_new_tokens=128)")
    command = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in sorted(info["command"].items()) if v is not None)
    path.write_text(f"""---
library_name: pacer_hf
tags: [speculative-decoding, prompt-lookup, pacer]
---
# {title}

Pacer's stop rule for prompt lookup: with it, `generate(..., prompt_lookup_num_tokens=N, pacer=True)` proposes,
each round, only as many lookup tokens as it expects to pay (zero included). It is an MLP ({config.hidden_size}
wide, {NUM_LOOKUP_FEATURES} features of the lookup match: `pacer_hf.modeling_lookup_gate.FEATURES`, none of them
tied to a vocabulary or a model size) that scores each of up to {config.max_lookup_tokens} lookup tokens;
`decision_rule="{config.decision_rule}"` proposes the prefix with the most expected tokens per unit of time
under the round costs `generate` measures on the machine it runs on (a probe on first use, refined by the
call's own rounds; `last_stats(model).costs` says which).{"" if several else PRIOR_NOTE}

    import pacer_hf
    {use}

## Training
- Data: answers of {len(names)} target{"s" if several else ""} to their train-split prompts (never the
  benchmark's), answers held out by key for evaluation:
{data}
- Every answer position with a lookup match is a round: in greedy answers labelled with whether the answer
  continues with each lookup token (feature `sampling` = 0), in sampled answers with the target's T=1
  probability of it (`sampling` = 1): {info['train_rounds']} training rows, {info['eval_rounds']} held out;
  held-out loss {info['eval_loss']}.{cache_pass} `transformers.Trainer`, {info['epochs']} epochs, lr {info['lr']}.
- Round costs of the training machine used for the simulations below (relative to one token):
{costs}
- Command: `pacer-hf train-lookup-gate --work-dir W {command}`

## Simulated speed over plain decoding on held-out answers (greedy)
Replaying each held-out answer round by round under its target's measured round costs; fixed-N proposes every
lookup token up to N, `oracle` proposes the best length per round knowing the answer.{UNSEEN_NOTE if several else ""}
Measured speeds come from `pacer-hf bench` (pacer_hf's docs/LOOKUP.md).

{speeds}
""")
