"""The SmolLM2 draft builder (`pacer_hf.recipes.smollm2_draft`) end to end on a tiny Llama target built from a
config and a tiny word-level tokenizer: no SmolLM2 weights needed."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from pacer_hf.recipes import smollm2_draft as builder
from pacer_hf.recipes import smollm2_draft_train as trainer

VOCAB = 64
EOS = 1


def tiny_target() -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=2, initializer_range=0.3,
                         tie_word_embeddings=True, bos_token_id=None, eos_token_id=EOS, pad_token_id=EOS)
    model = LlamaForCausalLM(config).eval()
    model.generation_config.eos_token_id = EOS
    model.generation_config.pad_token_id = EOS
    return model


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<pad>": 0, "<eos>": EOS, **{f"w{i}": i for i in range(2, VOCAB)}}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<eos>", pad_token="<pad>")


def tiny_prompts(n: int) -> list[tuple[str, str, list[int]]]:
    generator = torch.Generator().manual_seed(1)
    return [(f"cat{i % 2}/p{i}", f"cat{i % 2}",
             torch.randint(2, VOCAB, (int(torch.randint(3, 9, (1,), generator=generator)),),
                           generator=generator).tolist()) for i in range(n)]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    torch.set_num_threads(1)
    work = tmp_path_factory.mktemp("work")
    target, tokenizer = tiny_target(), tiny_tokenizer()
    prompts = tiny_prompts(20)
    assert any(builder.is_heldout(key) for key, _, _ in prompts) and not all(
        builder.is_heldout(key) for key, _, _ in prompts)
    return target, tokenizer, prompts, work


def test_responses_stage_resumes(built):
    target, _, prompts, work = built
    kwargs = dict(max_new_tokens=6, batch_size=3, top_k=4, progress=False)
    path = builder.stage_responses(target, None, prompts[:5], work, **kwargs)
    first = builder.read_records(path)
    assert [r["key"] for r in first] and {r["key"] for r in first} == {p[0] for p in prompts[:5]}
    with path.open("a") as handle:  # a torn last line, as a killed run leaves it
        handle.write('{"key": "torn"')
    builder.stage_responses(target, None, prompts, work, **kwargs)
    records = builder.read_records(path)
    assert records[:5] == first  # done prompts were skipped, not redone
    assert sorted(r["key"] for r in records) == sorted(p[0] for p in prompts)
    for record in records:  # the answers are the target's greedy continuations of the unpadded prompt
        ids = torch.tensor([record["prompt"]])
        expected = target.generate(ids, max_new_tokens=6, do_sample=False)[0, ids.shape[1]:].tolist()
        end = next((i + 1 for i, t in enumerate(expected) if t == EOS), len(expected))
        assert record["response"] == expected[:end]
        assert [top[0] for top in record["top_ids"]] == record["response"]
        assert len(record["top_logp"]) == len(record["response"]) and len(record["top_ids"][0]) == 4


def test_train_stage_trials_then_resumes(built):
    target, _, _, work = built
    options = dict(lr=3e-3, accumulate=2, progress=False)
    trainer.choose_layers(target, work, candidates=((0, 2), (1,)), trial_s=0.6, schedule_s=3.0, **options)
    trials = json.loads((work / "train" / "trials.json").read_text())
    assert set(trials["agreement"]) == {"trial-0-2", "trial-1"}
    state = torch.load(work / "train" / trainer.CHECKPOINT, weights_only=False)
    steps, evaluations = state["step"], len(state["history"])
    assert steps > 0 and evaluations == 2 and state["layers"] in ([0, 2], [1])
    assert (work / "train" / trainer.BEST / "config.json").is_file()
    trainer.stage_train(target, work, budget_s=3.0, checkpoint_every=0.5, **options)  # resumes the winner
    resumed = torch.load(work / "train" / trainer.CHECKPOINT, weights_only=False)
    assert resumed["layers"] == state["layers"]
    assert resumed["step"] > steps and len(resumed["history"]) > evaluations
    assert resumed["history"][:evaluations] == state["history"]
    assert resumed["elapsed"] >= 3.0
    history = json.loads((work / "train" / "history.json").read_text())["history"]
    assert max(h["agreement"] for h in history) >= history[0]["agreement"]
    trainer.choose_layers(target, work, candidates=((0, 2), (1,)), trial_s=0.6, **options)  # done: no-op
    assert torch.load(work / "train" / trainer.CHECKPOINT, weights_only=False)["step"] == resumed["step"]


def test_ship_stage_loads_and_is_exact(built):
    target, tokenizer, prompts, work = built
    out = work / "shipped"
    trainer.stage_ship(target, tokenizer, work, out, prompts=[p[2] for p in prompts[:2]], max_new_tokens=8)
    assert {"config.json", "model.safetensors", "tokenizer.json", "README.md"} <= {p.name for p in out.iterdir()}
    draft = AutoModelForCausalLM.from_pretrained(out).eval()
    layers = json.loads((work / "train" / "history.json").read_text())["layers"]
    assert draft.config.num_hidden_layers == len(layers) and draft.dtype == torch.bfloat16
    assert torch.equal(draft.lm_head.weight.float(), target.lm_head.weight.bfloat16().float())
    draft = draft.float()
    ids = torch.tensor([prompts[3][2]])
    assert torch.equal(target.generate(ids, assistant_model=draft, pacer="sd-fixed-3", max_new_tokens=10,
                                       do_sample=False),
                       target.generate(ids, max_new_tokens=10, do_sample=False))
    measured = json.loads((work / "measured.json").read_text())
    assert measured["costs"]["c"] > 0 and set(measured["end_to_end"]) == {"ar", "sd-fixed-2", "sd-fixed-3"}
    assert "Greedy agreement" in (out / "README.md").read_text()
