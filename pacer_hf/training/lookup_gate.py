"""Train a lookup gate (Pacer for prompt lookup) for SmolLM2-135M-Instruct from its own answers.

Reproducible and resumable; every stage writes under --work-dir:
  responses  the target's greedy answers to TRAIN-split chat prompts (`pacer-hf build-draft --stage
             responses`, shared with the draft builder: pass its --work-dir to reuse them), and its T=1
             samples for the first --sampled-prompts of them (on-policy data for sampling);
  examples   every answer position is a possible round start: the lookup match there (the same
             `find_lookup`/`lookup_features` that generation runs), and for each proposed token whether
             the target's answer continues with it (labels up to the first mismatch), and the target's
             T=1 probability of that token on the same path (from the answers' top-16 log-probabilities;
             0 outside them);
  train      `transformers.Trainer` on both (binary cross-entropy per token, conditional on the tokens
             before it being accepted): greedy answers with greedy labels (`sampling` feature 0),
             sampled answers with T=1 probabilities (`sampling` feature 1); answers held out by the
             responses stage are the eval set;
  costs      what proposing k = 0..N tokens costs on this machine: one target forward of k + 1 new tokens
             after a cached prefix, relative to k = 0 (interleaved medians) -> the gate's round_cost;
  ship       the simulated speed on the held-out answers (fixed N, the gate's rules, the per-round
             oracle, per category) and the gate with decision_rule="expected_gain" and a model card
             in --out (default hub_cards/smollm2-lookup-gate).
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import numpy as np
import torch

from ..configuration_lookup_gate import NUM_LOOKUP_FEATURES, PacerLookupGateConfig
from ..modeling_lookup_gate import (
    PacerLookupGate,
    expected_gain_length,
    find_lookup,
    lookup_features,
    threshold_length,
)

EXAMPLES = "lookup_examples.pt"
EXAMPLES_FORMAT = 2  # bump when record_examples changes: cached examples of another format are rebuilt
SAMPLING_FEATURE = 9  # index of FEATURES' "sampling"
TRAINED = "lookup_gate_trained"
COSTS = "lookup_costs.json"


# -- examples ------------------------------------------------------------------------------------------------


def record_examples(record: dict, max_tokens: int, max_ngram: int) -> dict:
    """Every round start of one answer: features (rounds, max_tokens, F), greedy labels, T=1 acceptance
    probabilities (`sampled_labels`), the label mask, the number of proposed tokens the greedy answer
    accepts (`accepted`) and the number available (`available`)."""
    prompt, response = record["prompt"], record["response"]
    ids = torch.tensor(prompt + response)
    top_logp, top_ids = record.get("top_logp"), record.get("top_ids")
    rounds = len(response)
    features = torch.zeros(rounds, max_tokens, NUM_LOOKUP_FEATURES)
    labels = torch.zeros(rounds, max_tokens)
    sampled = torch.zeros(rounds, max_tokens)
    mask = torch.zeros(rounds, max_tokens)
    accepted = np.zeros(rounds, dtype=np.int64)
    available = np.zeros(rounds, dtype=np.int64)
    for r in range(rounds):
        t = len(prompt) + r
        match = find_lookup(ids[:t], max_tokens, max_ngram)
        if match is None:
            continue
        confidence = math.exp(top_logp[r - 1][0]) if r > 0 and top_logp else None
        k = match.tokens.shape[0]
        features[r, :k] = lookup_features(match, t, len(prompt), confidence, max_tokens, max_ngram)
        truth = ids[t : t + k]
        kept = (match.tokens[: truth.shape[0]] == truth).int().cumprod(0)  # 1 while the answer follows it
        a = int(kept.sum())
        labels[r, : truth.shape[0]] = kept.float()
        mask[r, : min(a + 1, truth.shape[0])] = 1  # up to and including the first mismatch; unknown past the answer
        if top_ids:  # on the greedy path up to the first mismatch the target's distribution is known
            for j in range(min(a + 1, truth.shape[0])):
                ids_j, logp_j = top_ids[r + j], top_logp[r + j]
                token = int(match.tokens[j])
                sampled[r, j] = math.exp(logp_j[ids_j.index(token)]) if token in ids_j else 0.0
        accepted[r], available[r] = a, k
    return {"features": features, "labels": labels, "sampled_labels": sampled, "label_mask": mask,
            "accepted": accepted, "available": available}


def stage_examples(records: list[dict], work: Path, max_tokens: int, max_ngram: int, progress: bool = True) -> dict:
    """Examples of all records (cached in work/lookup_examples.pt for these settings)."""
    from tqdm.auto import tqdm

    path = work / EXAMPLES
    settings = {"format": EXAMPLES_FORMAT, "max_tokens": max_tokens, "max_ngram": max_ngram,
                "records": [r["key"] for r in records]}
    if path.is_file():
        cached = torch.load(path, weights_only=False)
        if cached["settings"] == settings:
            return cached
    per_record = [record_examples(r, max_tokens, max_ngram)
                  for r in tqdm(records, desc="lookup examples", unit="answer", disable=not progress)]
    examples = {
        "settings": settings,
        "records": [{"key": r["key"], "category": r["category"], "heldout": r["heldout"],
                     "sampled": r.get("sampled", False)} for r in records],
        "per_record": per_record,
    }
    torch.save(examples, path)
    return examples


# -- training ------------------------------------------------------------------------------------------------


class GateExamples(torch.utils.data.Dataset):
    """Rounds with a lookup match, as Trainer rows (features, labels, label_mask): rounds of greedy answers
    with greedy labels (sampling feature 0), rounds of sampled answers (`sampled[i]`) with T=1 acceptance
    probabilities (sampling feature 1). Without any sampled answer, the greedy rounds also give the sampling
    rows (T=1 probabilities along the greedy path)."""

    def __init__(self, per_record: list[dict], sampled: list[bool] | None = None):
        sampled = sampled or [False] * len(per_record)
        greedy = [e for e, s in zip(per_record, sampled) if not s]
        sampling = [e for e, s in zip(per_record, sampled) if s] or greedy
        parts = [self._rows(greedy, "labels", 0.0), self._rows(sampling, "sampled_labels", 1.0)]
        self.features, self.labels, self.label_mask = (torch.cat(column) for column in zip(*parts))

    @staticmethod
    def _rows(entries: list[dict], labels: str, sampling: float) -> tuple[torch.Tensor, ...]:
        if not entries:
            return torch.zeros(0, 0, NUM_LOOKUP_FEATURES), torch.zeros(0, 0), torch.zeros(0, 0)
        keep = torch.cat([torch.as_tensor(e["available"] > 0) for e in entries])
        features = torch.cat([e["features"] for e in entries])[keep]
        features[..., SAMPLING_FEATURE] = sampling
        return (features, torch.cat([e[labels] for e in entries])[keep],
                torch.cat([e["label_mask"] for e in entries])[keep])

    def __len__(self) -> int:
        return self.features.shape[0]

    def __getitem__(self, i: int) -> dict:
        return {"features": self.features[i], "labels": self.labels[i], "label_mask": self.label_mask[i]}


def stage_train(examples: dict, work: Path, *, max_tokens: int, max_ngram: int, epochs: float, lr: float,
                batch_size: int, seed: int, target_name: str, vocab_size: int) -> PacerLookupGate:
    from transformers import Trainer, TrainingArguments

    out = work / TRAINED
    if (out / "config.json").is_file():
        return PacerLookupGate.from_pretrained(out).eval()
    pairs = list(zip(examples["per_record"], examples["records"]))
    held = [(e, r.get("sampled", False)) for e, r in pairs if r["heldout"]]
    train = [(e, r.get("sampled", False)) for e, r in pairs if not r["heldout"]]
    config = PacerLookupGateConfig(max_lookup_tokens=max_tokens, max_ngram_size=max_ngram, target_model=target_name,
                                   vocab_size=vocab_size)
    torch.manual_seed(seed)
    gate = PacerLookupGate(config)
    args = TrainingArguments(
        output_dir=str(work / "trainer"), per_device_train_batch_size=batch_size, per_device_eval_batch_size=1024,
        num_train_epochs=epochs, learning_rate=lr, lr_scheduler_type="cosine", warmup_steps=0.05,
        eval_strategy="epoch", save_strategy="no", logging_steps=50, report_to=[], use_cpu=True, seed=seed,
        dataloader_num_workers=0,
    )
    trainer = Trainer(model=gate, args=args, train_dataset=GateExamples(*map(list, zip(*train))),
                      eval_dataset=GateExamples(*map(list, zip(*held))))
    trainer.train()
    gate.config.training = {"train_rounds": len(trainer.train_dataset), "eval_rounds": len(trainer.eval_dataset),
                            "eval_loss": round(trainer.evaluate()["eval_loss"], 4), "epochs": epochs, "lr": lr}
    gate.save_pretrained(out)
    return gate.eval()


# -- costs and simulation ------------------------------------------------------------------------------------


def measure_round_cost(target, max_tokens: int, context: int = 400, repeats: int = 15) -> dict:
    """Proposing k = 0..max_tokens lookup tokens costs a target forward of k + 1 tokens after a cached
    `context`-token prefix: calibrate's measured verify costs (interleaved medians, no draft), as ms and
    relative to one token (`round_cost`)."""
    from .calibrate import measure_costs

    costs = measure_costs(target, None, context=context, max_k=max_tokens, repeats=repeats)
    return {"verify_ms": [round(1000 * costs.step_seconds * v, 2) for v in costs.verify_cost],
            "round_cost": [round(v, 4) for v in costs.verify_cost], "context": context, "repeats": repeats,
            "threads": torch.get_num_threads()}


def simulate(accepted: np.ndarray, available: np.ndarray, lengths: np.ndarray, cost: list[float]) -> float:
    """Speed over plain decoding of proposing `lengths[t]` tokens at each round start t (greedy rounds)."""
    t, spent, n = 0, 0.0, len(accepted)
    while t < n:
        k = int(min(lengths[t], available[t], n - t - 1))
        spent += cost[k]
        t += min(k, int(accepted[t])) + 1
    return n / spent


def policy_lengths(gate: PacerLookupGate, entry: dict, cost: list[float] | None,
                   threshold: float = 0.5) -> np.ndarray:
    """The gate's proposal length at every round start of one answer: expected gain under `cost`, or
    (cost None) the tokens whose survival is >= threshold."""
    survival = gate.survival(entry["features"]).numpy()
    out = np.zeros(len(entry["available"]), dtype=np.int64)
    for t, k in enumerate(entry["available"]):
        if k:
            s = survival[t, :k].tolist()
            out[t] = expected_gain_length(s, cost) if cost is not None else threshold_length(s, threshold)
    return out


def speed_table(gate: PacerLookupGate, examples: dict, cost: list[float], max_tokens: int) -> dict:
    """Simulated speed over plain decoding on the held-out answers, per category and policy (mean over answers)."""
    table: dict[str, dict[str, list[float]]] = {}
    for entry, record in zip(examples["per_record"], examples["records"]):
        if not record["heldout"] or record.get("sampled") or len(entry["accepted"]) < 2:
            continue
        acc, avail = entry["accepted"], entry["available"]
        row = table.setdefault(record["category"], {})
        for n in (1, 2, 3, 4, 5, max_tokens):
            row.setdefault(f"fixed-{n}", []).append(simulate(acc, avail, np.full(len(acc), n), cost))
        row.setdefault("gate", []).append(simulate(acc, avail, policy_lengths(gate, entry, cost), cost))
        row.setdefault("gate-threshold-0.5", []).append(simulate(acc, avail, policy_lengths(gate, entry, None), cost))
        oracle = np.array([max(range(int(k) + 1), key=lambda j, a=int(a): (min(j, a) + 1) / cost[j])
                           for a, k in zip(acc, avail)])
        row.setdefault("oracle", []).append(simulate(acc, avail, oracle, cost))
    return {cat: {name: round(float(np.mean(v)), 3) for name, v in row.items()} | {"answers": len(row["gate"])}
            for cat, row in sorted(table.items())}


# -- the command ---------------------------------------------------------------------------------------------


def add_arguments(parser) -> None:
    parser.add_argument("--work-dir", default="smollm2-lookup-work", help="where stages keep their results")
    parser.add_argument("--stage", default="all", choices=("all", "responses", "train", "ship"),
                        help="responses, then train (examples + Trainer + costs), then ship")
    parser.add_argument("--cache-dir", default=None, help="load_pair('smollm2', cache_dir=...)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--sampled-prompts", type=int, default=320,
                        help="train prompts also answered with T=1 samples (the sampling rows' data)")
    parser.add_argument("--max-tokens", type=int, default=10, help="most lookup tokens per round (scored)")
    parser.add_argument("--max-ngram", type=int, default=3, help="longest n-gram searched")
    parser.add_argument("--epochs", type=float, default=4.0)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--cost-context", type=int, default=400, help="cached prefix for the verify timings")
    parser.add_argument("--out", default=None, help="ship folder (default hub_cards/smollm2-lookup-gate)")
    parser.add_argument("--seed", type=int, default=0)


def run(args) -> int:
    from ..pairs import load_pair
    from .smollm2_draft import RESPONSES, SAMPLED_RESPONSES, smollm2_prompts, stage_responses
    from .smollm2_draft_train import read_records

    torch.set_num_threads(args.threads)
    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    pair = load_pair("smollm2", cache_dir=args.cache_dir, cards_dir=work / "no-cards")
    if args.stage in ("all", "responses"):
        prompts = smollm2_prompts(pair.tokenizer)
        stage_responses(pair.target, pair.tokenizer, prompts, work)
        if args.sampled_prompts:
            stage_responses(pair.target, pair.tokenizer, prompts[: args.sampled_prompts], work, do_sample=True)
    if args.stage == "responses":
        return 0
    records = read_records(work / RESPONSES) + [
        {**r, "key": "sampled:" + r["key"], "sampled": True} for r in read_records(work / SAMPLED_RESPONSES)]
    if not records:
        raise SystemExit(f"No answers in {work / RESPONSES}: run --stage responses first.")
    examples = stage_examples(records, work, args.max_tokens, args.max_ngram)
    gate = stage_train(examples, work, max_tokens=args.max_tokens, max_ngram=args.max_ngram, epochs=args.epochs,
                       lr=args.lr, batch_size=args.batch_size, seed=args.seed, target_name="SmolLM2-135M-Instruct",
                       vocab_size=pair.target.get_output_embeddings().weight.shape[0])
    costs_path = work / COSTS
    if not costs_path.is_file():
        costs_path.write_text(json.dumps(measure_round_cost(pair.target, args.max_tokens, args.cost_context), indent=1))
    costs = json.loads(costs_path.read_text())
    print("round cost (k proposed tokens -> relative time):", costs["round_cost"])
    if args.stage == "train":
        return 0
    table = speed_table(gate, examples, costs["round_cost"], args.max_tokens)
    for category, row in table.items():
        print(f"{category:16s} " + " ".join(f"{k}={v}" for k, v in row.items()))
    gate.config.decision_rule = "expected_gain"
    gate.config.round_cost = costs["round_cost"]
    gate.config.training = {**(gate.config.training or {}), "costs": costs, "simulated_speed": table,
                            "answers": sum(not r.get("sampled") for r in records),
                            "answer_tokens": sum(len(r["response"]) for r in records if not r.get("sampled")),
                            "sampled_answers": sum(bool(r.get("sampled")) for r in records),
                            "sampled_tokens": sum(len(r["response"]) for r in records if r.get("sampled")),
                            "command": {k: v for k, v in vars(args).items()
                                        if not k.startswith("_") and k not in ("command", "stage", "out", "cache_dir",
                                                                               "work_dir")},
                            "built": time.strftime("%Y-%m-%d")}
    from .._paths import hub_cards_dir

    out = Path(args.out) if args.out else hub_cards_dir() / "smollm2-lookup-gate"
    gate.save_pretrained(out)
    write_card(out / "README.md", gate.config)
    print(f"saved the lookup gate to {out}")
    return 0


def write_card(path: Path, config: PacerLookupGateConfig) -> None:
    info = config.training
    costs = info["costs"]
    names = list(next(iter(info["simulated_speed"].values())))
    rows = "\n".join(f"| {cat} | " + " | ".join(str(row[n]) for n in names) + " |"
                     for cat, row in info["simulated_speed"].items())
    path.write_text(f"""---
library_name: pacer_hf
tags: [speculative-decoding, prompt-lookup, pacer]
base_model: HuggingFaceTB/SmolLM2-135M-Instruct
---
# Lookup gate for SmolLM2-135M-Instruct

Pacer's stop rule for prompt lookup: with it, `generate(..., prompt_lookup_num_tokens=N, pacer=True)` proposes,
each round, only as many lookup tokens as it expects to pay (zero included). It is an MLP ({config.hidden_size}
wide, {NUM_LOOKUP_FEATURES} features of the lookup match: `pacer_hf.modeling_lookup_gate.FEATURES`) that scores each
of up to {config.max_lookup_tokens} lookup tokens; `decision_rule="{config.decision_rule}"` proposes the prefix with
the most expected tokens per unit of time under `round_cost`, measured on the machine that trained it.

    import pacer_hf
    from pacer_hf.pairs import load_pair
    pair = load_pair("smollm2")          # attaches this gate to pair.target
    out = pair.target.generate(ids, prompt_lookup_num_tokens=10, pacer=True, max_new_tokens=128)

## Training
- Data: {info['answers']} greedy answers of SmolLM2-135M-Instruct ({info['answer_tokens']} tokens) to train-split
  chat prompts of `pacer_hf.bench.chat_prompts` (never the benchmark's prompts), and {info['sampled_answers']}
  T=1 sampled answers ({info['sampled_tokens']} tokens) to the first of them; answers held out by key for
  evaluation. Every answer position with a lookup match is a round: in greedy answers labelled with whether
  the answer continues with each lookup token (feature `sampling` = 0), in sampled answers with the
  target's T=1 probability of it (`sampling` = 1): {info['train_rounds']} training rows, {info['eval_rounds']}
  held out; held-out loss {info['eval_loss']}.
- `transformers.Trainer`, {info['epochs']} epochs, lr {info['lr']}.
- Round cost (target forward of k + 1 tokens after a {costs['context']}-token cached prefix, relative to one
  token, {costs['threads']} thread, median of {costs['repeats']}): {costs['round_cost']}
  (ms: {costs['verify_ms']}).
- Command: `pacer-hf train-lookup-gate --work-dir W {' '.join(f'--{k.replace("_", "-")} {v}'
                                                       for k, v in info['command'].items() if v is not None)}`

## Simulated speed over plain decoding on held-out answers (greedy)
Replaying each answer round by round with the measured round cost; fixed-N proposes every lookup
token up to N, `oracle` proposes the best length per round knowing the answer. Measured speeds, greedy
and sampling, come from `pacer-hf bench --pair smollm2` (pacer_hf's docs/LOOKUP.md).

| category | {' | '.join(names)} |
|---|{'---|' * len(names)}
{rows}
""")
