"""Train a lookup gate (Pacer for prompt lookup) for SmolLM2-135M-Instruct from its own answers.

Reproducible and resumable; every stage writes under --work-dir:
  responses  the target's greedy answers to TRAIN-split chat prompts (`pacer-hf build-draft --stage
             responses`, shared with the draft builder: pass its --work-dir to reuse them), and its T=1
             samples for the first --sampled-prompts of them (on-policy data for sampling);
  examples   every answer position is a possible round start: the lookup match there (the same
             `find_lookup`/`lookup_features` that generation runs), and for each proposed token whether
             the target's answer continues with it (labels up to the first mismatch), and the target's
             T=1 probability of that token on the same path (from the answers' top-16 log-probabilities;
             0 outside them); a second pass runs the answers in order with a `SuffixCache` of the earlier
             ones (as `generate(..., suffix_cache=)` and the vLLM proposer's cache hold earlier requests)
             and keeps the rounds where the cache's match is the longer one, with the features
             `candidates.suffix.gate_features` gives a cache match, so the gate learns what such a match
             is worth;
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

from ..candidates.suffix import SuffixCache, gate_features
from ..configuration_lookup_gate import NUM_LOOKUP_FEATURES, PacerLookupGateConfig
from ..modeling_lookup_gate import PacerLookupGate, find_lookup, lookup_features
from .lookup_gate_sim import measure_round_cost, speed_table

EXAMPLES = "lookup_examples.pt"
EXAMPLES_FORMAT = 3  # bump when record_examples changes: cached examples of another format are rebuilt
SAMPLING_FEATURE = 9  # index of FEATURES' "sampling"
TRAINED = "lookup_gate_trained"
COSTS = "lookup_costs.json"


# -- examples ------------------------------------------------------------------------------------------------


def record_examples(record: dict, max_tokens: int, max_ngram: int, cache: SuffixCache | None = None) -> dict:
    """Every round start of one answer: features (rounds, max_tokens, F), greedy labels, T=1 acceptance
    probabilities (`sampled_labels`), the label mask, the number of proposed tokens the greedy answer
    accepts (`accepted`) and the number available (`available`). With `cache` (earlier answers), a round
    takes the cache's match where it is longer than the answer's own, as generation does (`from_cache`)."""
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
    from_cache = np.zeros(rounds, dtype=bool)
    for r in range(rounds):
        t = len(prompt) + r
        match = find_lookup(ids[:t], max_tokens, max_ngram)
        confidence = math.exp(top_logp[r - 1][0]) if r > 0 and top_logp else None
        cached = cache.find(ids[:t].numpy(), max_tokens, max_ngram) if cache is not None else None
        if cached is not None and (match is None or cached.match_length > match.match_length):
            tokens = torch.from_numpy(cached.tokens)
            rows = torch.from_numpy(gate_features(cached, t, len(prompt), confidence, max_tokens, max_ngram))
            from_cache[r] = True
        elif match is not None:
            tokens = match.tokens
            rows = lookup_features(match, t, len(prompt), confidence, max_tokens, max_ngram)
        else:
            continue
        k = tokens.shape[0]
        features[r, :k] = rows
        truth = ids[t : t + k]
        kept = (tokens[: truth.shape[0]] == truth).int().cumprod(0)  # 1 while the answer follows it
        a = int(kept.sum())
        labels[r, : truth.shape[0]] = kept.float()
        mask[r, : min(a + 1, truth.shape[0])] = 1  # up to and including the first mismatch; unknown past the answer
        if top_ids:  # on the greedy path up to the first mismatch the target's distribution is known
            for j in range(min(a + 1, truth.shape[0])):
                ids_j, logp_j = top_ids[r + j], top_logp[r + j]
                token = int(tokens[j])
                sampled[r, j] = math.exp(logp_j[ids_j.index(token)]) if token in ids_j else 0.0
        accepted[r], available[r] = a, k
    return {"features": features, "labels": labels, "sampled_labels": sampled, "label_mask": mask,
            "accepted": accepted, "available": available, "from_cache": from_cache}


def cache_pass(records: list[dict], max_tokens: int, max_ngram: int, progress: bool = True) -> list[dict]:
    """The answers in order, each with a cache of the earlier ones of its kind (greedy or sampled, so a sampled
    answer never sees the greedy answer to its own prompt): examples whose training rounds are those where
    the cache gave the match (`train_rounds`)."""
    from tqdm.auto import tqdm

    caches = {False: SuffixCache(), True: SuffixCache()}
    out = []
    for record in tqdm(records, desc="lookup examples with a cache", unit="answer", disable=not progress):
        cache = caches[bool(record.get("sampled"))]
        entry = record_examples(record, max_tokens, max_ngram, cache)
        entry["train_rounds"] = entry["from_cache"] & (entry["available"] > 0)
        out.append(entry)
        cache.add(record["prompt"] + record["response"])
    return out


def stage_examples(records: list[dict], work: Path, max_tokens: int, max_ngram: int, progress: bool = True,
                   with_cache: bool = True) -> dict:
    """Examples of all records and, `with_cache`, of the cache pass (records marked "cache"); cached in
    work/lookup_examples.pt for these settings."""
    from tqdm.auto import tqdm

    path = work / EXAMPLES
    settings = {"format": EXAMPLES_FORMAT, "max_tokens": max_tokens, "max_ngram": max_ngram,
                "records": [r["key"] for r in records], "with_cache": with_cache}
    if path.is_file():
        cached = torch.load(path, weights_only=False)
        if cached["settings"] == settings:
            return cached
    per_record = [record_examples(r, max_tokens, max_ngram)
                  for r in tqdm(records, desc="lookup examples", unit="answer", disable=not progress)]
    kept = [{"key": r["key"], "category": r["category"], "heldout": r["heldout"], "sampled": r.get("sampled", False)}
            for r in records]
    if with_cache:
        per_record += cache_pass(records, max_tokens, max_ngram, progress)
        kept += [{**r, "key": "cache:" + r["key"], "cache": True} for r in kept]
    examples = {"settings": settings, "records": kept, "per_record": per_record}
    torch.save(examples, path)
    return examples


# -- the stdlib demo target's prompts -------------------------------------------------------------------------


def stdlib_prompts(tokenizer, splits_file: Path, n: int = 480, prompt_tokens: int = 192,
                   seed: int = 0) -> list[tuple[str, str, list[int]]]:
    """(key, category, prompt ids) for the stdlib demo target's answers: windows of its TRAIN-split files
    ("stdlib-train", ordinary library code) and of the stdlib's test suites outside the benchmark's tenth
    ("stdlib-tests", the repetitive code the benchmark's `boilerplate` category samples). Never a file the
    benchmark draws from."""
    import random
    import sysconfig

    from ..data.prompts import stdlib_test_files

    root = Path(sysconfig.get_paths()["stdlib"])
    train = [root / rel for rel in json.loads(Path(splits_file).read_text())["train"]]
    benchmarked = set(stdlib_test_files())
    tests = [p for p in sorted((root / "test").glob("test_*.py")) if p not in benchmarked]
    rng = random.Random(seed)
    out = []
    for category, files, count in (("stdlib-train", train, n - n // 3), ("stdlib-tests", tests, n // 3)):
        for _ in range(count):
            path = rng.choice(files)
            ids = tokenizer(path.read_text(encoding="utf-8", errors="replace"))["input_ids"]
            if len(ids) < prompt_tokens + 64:
                continue
            start = rng.randrange(0, len(ids) - prompt_tokens - 64)
            out.append((f"{category}/{path.relative_to(root).as_posix()}@{start}", category,
                        ids[start : start + prompt_tokens]))
    return out


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
        keep = torch.cat([torch.as_tensor(e.get("train_rounds", e["available"] > 0)) for e in entries])
        features = torch.cat([e["features"] for e in entries])[keep]
        features[..., SAMPLING_FEATURE] = sampling
        return (features, torch.cat([e[labels] for e in entries])[keep],
                torch.cat([e["label_mask"] for e in entries])[keep])

    def __len__(self) -> int:
        return self.features.shape[0]

    def __getitem__(self, i: int) -> dict:
        return {"features": self.features[i], "labels": self.labels[i], "label_mask": self.label_mask[i]}


def stage_train(examples: dict, work: Path, *, max_tokens: int, max_ngram: int, epochs: float, lr: float,
                batch_size: int, seed: int, target_name: str, vocab_size: int | None,
                name: str = TRAINED) -> PacerLookupGate:
    """Train a gate on `examples` (Trainer; held-out answers are the eval set), cached in work/<name>."""
    from transformers import Trainer, TrainingArguments

    out = work / name
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
        output_dir=str(work / f"trainer-{name}"), per_device_train_batch_size=batch_size, per_device_eval_batch_size=1024,
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


# -- the command ---------------------------------------------------------------------------------------------


TARGETS = {"smollm2": "SmolLM2-135M-Instruct", "stdlib": "the stdlib demo target (pacer_hf hub_cards/demo-target)"}


def add_arguments(parser) -> None:
    parser.add_argument("--work-dir", default="smollm2-lookup-work", help="where stages keep their results")
    parser.add_argument("--stage", default="all", choices=("all", "responses", "train", "ship"),
                        help="responses, then train (examples + Trainer + costs), then ship")
    parser.add_argument("--targets", default="smollm2",
                        help="comma-separated pairs whose targets' answers train the gate (smollm2, stdlib). One target: "
                        "a gate for it, shipped with its measured round costs as a prior. Several: the default "
                        "gate for any causal LM (no cost table; leave-one-target-out results in its card); "
                        "each target's stages run in --work-dir/<target>")
    parser.add_argument("--cache-dir", default=None, help="load_pair('smollm2', cache_dir=...)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--sampled-prompts", type=int, default=320,
                        help="train prompts also answered with T=1 samples (the sampling rows' data)")
    parser.add_argument("--responses-minutes", type=float, default=None,
                        help="per target: stop starting new batches of greedy answers after this (sampled: a third)")
    parser.add_argument("--max-tokens", type=int, default=10, help="most lookup tokens per round (scored)")
    parser.add_argument("--max-ngram", type=int, default=3, help="longest n-gram searched")
    parser.add_argument("--epochs", type=float, default=4.0)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--cost-context", type=int, default=400, help="cached prefix for the verify timings")
    parser.add_argument("--out", default=None, help="ship folder (default hub_cards/smollm2-lookup-gate, or "
                        "hub_cards/default-lookup-gate with several targets)")
    parser.add_argument("--seed", type=int, default=0)


def target_records(name: str, work: Path, args) -> tuple[list[dict], object]:
    """(answers of target `name` tagged with it, its pair), generating them first when the stage asks."""
    from ..pairs import load_pair
    from .smollm2_draft import RESPONSES, SAMPLED_RESPONSES, smollm2_prompts, stage_responses
    from .smollm2_draft_train import read_records

    if name == "smollm2":
        pair = load_pair("smollm2", cache_dir=args.cache_dir, cards_dir=work / "no-cards")
        prompts, batch = smollm2_prompts(pair.tokenizer), 8
    else:
        from .._paths import hub_cards_dir

        pair = load_pair("stdlib")
        prompts, batch = stdlib_prompts(pair.tokenizer, hub_cards_dir() / "demo-target" / "corpus_splits.json"), 32
    if args.stage in ("all", "responses"):
        budget = None if args.responses_minutes is None else 60 * args.responses_minutes
        stage_responses(pair.target, pair.tokenizer, prompts, work, batch_size=batch, budget_s=budget)
        if args.sampled_prompts:
            stage_responses(pair.target, pair.tokenizer, prompts[: args.sampled_prompts], work, batch_size=batch,
                            do_sample=True, budget_s=budget and budget / 3)
    records = read_records(work / RESPONSES) + [
        {**r, "key": "sampled:" + r["key"], "sampled": True} for r in read_records(work / SAMPLED_RESPONSES)]
    if not records and args.stage != "responses":
        raise SystemExit(f"No answers in {work / RESPONSES}: run --stage responses first.")
    return [{**r, "target": name} for r in records], pair


def target_costs(pair, work: Path, args) -> dict:
    """This machine's round costs for the pair's target (work/lookup_costs.json): for the simulations and a
    single-target gate's prior."""
    path = work / COSTS
    if not path.is_file():
        path.write_text(json.dumps(measure_round_cost(pair.target, args.max_tokens, args.cost_context), indent=1))
    return json.loads(path.read_text())


def merge(parts: list[dict]) -> dict:
    """One examples dict from several (records and per-record tensors side by side)."""
    return {"records": [r for p in parts for r in p["records"]], "per_record": [e for p in parts for e in p["per_record"]]}


def run(args) -> int:
    torch.set_num_threads(args.threads)
    names = [n.strip() for n in args.targets.split(",") if n.strip()]
    unknown = sorted(set(names) - set(TARGETS))
    if unknown or not names:
        raise SystemExit(f"--targets {args.targets!r}: choose from {', '.join(TARGETS)}.")
    work = Path(args.work_dir)
    several = len(names) > 1
    examples, costs, pairs = {}, {}, {}
    for name in names:
        target_work = work / name if several else work
        target_work.mkdir(parents=True, exist_ok=True)
        records, pairs[name] = target_records(name, target_work, args)
        if args.stage == "responses":
            continue
        examples[name] = stage_examples(records, target_work, args.max_tokens, args.max_ngram)
        for record in examples[name]["records"]:
            record["target"] = name
        costs[name] = target_costs(pairs[name], target_work, args)
        print(f"{name}: round cost (k proposed tokens -> relative time):", costs[name]["round_cost"])
    if args.stage == "responses":
        return 0
    options = dict(max_tokens=args.max_tokens, max_ngram=args.max_ngram, epochs=args.epochs, lr=args.lr,
                   batch_size=args.batch_size, seed=args.seed)
    vocab = None if several else pairs[names[0]].target.get_output_embeddings().out_features
    gate = stage_train(merge(list(examples.values())), work, target_name=" + ".join(TARGETS[n] for n in names),
                       vocab_size=vocab, **options)
    if args.stage == "train":
        return 0
    tables, left_out, with_cache = {}, {}, {}
    for name in names:
        tables[name] = speed_table(gate, examples[name], costs[name]["round_cost"], args.max_tokens)
        with_cache[name] = speed_table(gate, examples[name], costs[name]["round_cost"], args.max_tokens, cache=True)
        if several:  # the gate trained without this target's answers, on this target's held-out answers
            others = merge([examples[n] for n in names if n != name])
            alone = stage_train(others, work, target_name="without " + name, vocab_size=None,
                                name=f"{TRAINED}-without-{name}", **options)
            left_out[name] = speed_table(alone, examples[name], costs[name]["round_cost"], args.max_tokens)
        for category, row in tables[name].items():
            print(f"{name:8s} {category:20s} " + " ".join(f"{k}={v}" for k, v in row.items()))
            if several:
                print(f"{'':8s} {'(target left out)':20s} gate={left_out[name][category]['gate']}")
            cached = with_cache[name].get(category)
            if cached:
                print(f"{'':8s} {'(with a cache)':20s} " + " ".join(f"{k}={v}" for k, v in cached.items()))
    gate.config.decision_rule = "expected_gain"
    gate.config.round_cost = None if several else costs[names[0]]["round_cost"]
    all_records = [r for n in names for r in examples[n]["records"] if not r.get("cache")]  # each answer once
    answers = {n: [r for r in all_records if r["target"] == n] for n in names}
    tokens = {n: {"greedy": 0, "sampled": 0} for n in names}
    for name in names:
        for entry, record in zip(examples[name]["per_record"], examples[name]["records"]):
            if not record.get("cache"):
                tokens[name]["sampled" if record.get("sampled") else "greedy"] += len(entry["accepted"])
    gate.config.training = {
        **(gate.config.training or {}), "targets": names,
        "answers": {n: {"greedy": sum(not r.get("sampled") for r in answers[n]),
                        "sampled": sum(bool(r.get("sampled")) for r in answers[n]), "tokens": tokens[n]} for n in names},
        "costs": costs, "simulated_speed": tables, "simulated_speed_target_left_out": left_out or None,
        "simulated_speed_with_cache": with_cache,
        "command": {k: v for k, v in vars(args).items()
                    if not k.startswith("_") and k not in ("command", "stage", "out", "cache_dir", "work_dir")},
        "built": time.strftime("%Y-%m-%d"),
    }
    from .._paths import hub_cards_dir

    out = Path(args.out) if args.out else hub_cards_dir() / ("default-lookup-gate" if several else "smollm2-lookup-gate")
    gate.save_pretrained(out)
    from .lookup_gate_card import write_card

    # from the saved config (its JSON sorts keys), so the card is what anyone rebuilds from the shipped folder
    write_card(out / "README.md", PacerLookupGateConfig.from_pretrained(out), TARGETS)
    print(f"saved the lookup gate to {out}")
    return 0
