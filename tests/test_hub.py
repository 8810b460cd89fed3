"""Hub round trips through a loopback Hub server (tests/hub_server.py), with the real clients.

huggingface_hub reads HF_ENDPOINT when it is imported, so every client runs in a subprocess with
HF_ENDPOINT=http://127.0.0.1:<port>, its own empty HF_HOME and a fake token; nothing leaves
127.0.0.1. One publisher process pushes everything once (pre-verifiers on main, a branch and a
tag, the custom_generate repo, tampered repos) and records the outputs of `pacer_hf.enable`; the
tests then load and generate in fresh processes, one of them with pacer_hf made unimportable.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import pytest
import torch
from huggingface_hub import ModelCard
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.dynamic_module_utils import get_imports

from pacer_hf import PacerPreVerifier
from pacer_hf.hub import (
    build_custom_generate_repo,
    build_preverifier_repo,
    render_preverifier_card,
)
from pacer_hf.hub.custom_generate_code import ENTRY, custom_generate_modules, flat_name, flattened_source

ROOT = Path(__file__).resolve().parent.parent
SERVER = Path(__file__).resolve().parent / "hub_server.py"
TOKEN = "hf_pacer_fake_test_token"
CLIENT_TIMEOUT = 180

# Built identically in every process from a seed: a 2-layer target and a noisy copy as draft (float64,
# so greedy choices never hinge on rounding), plus a 1-layer draft for the "wrong draft" case.
PAIR = """
import copy, torch
from transformers import LlamaConfig, LlamaForCausalLM
torch.set_num_threads(1)
def build(layers, seed):
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, initializer_range=0.3,
                         bos_token_id=None, eos_token_id=None, pad_token_id=None)
    return LlamaForCausalLM(config).to(torch.float64).eval()
target = build(2, 0)
target.name_or_path = "org/tiny-target"
draft = copy.deepcopy(target)
with torch.no_grad():
    for p in draft.parameters():
        p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(1), dtype=p.dtype))
draft.name_or_path = "org/tiny-draft"
other_draft = build(1, 2)
other_draft.name_or_path = "org/other-draft"
prompt = torch.randint(0, 96, (1, 10), generator=torch.Generator().manual_seed(3))
GEN = dict(max_new_tokens=24, do_sample=False)
def checksum(model):
    return float(sum(p.detach().double().sum() for p in model.parameters()))
"""

PUBLISH = """
import json, shutil, sys, tempfile
from pathlib import Path
import torch
import pacer_hf
from huggingface_hub import HfApi, ModelCard
from pacer_hf import PacerPreVerifier
from pacer_hf.cli import main as cli
from pacer_hf.hub import build_preverifier_repo, push_preverifier
out = {}
api = HfApi()
pv = PacerPreVerifier.from_draft(draft, target_model="org/tiny-target", hidden_size=16, num_attention_heads=2,
                                 intermediate_size=32, block_size=2, max_draft_tokens=8, threshold=0.5)
out["checksum"] = checksum(pv)
info = push_preverifier(pv, "org/pv")  # the publishing API: full repo + card, returns a CommitInfo
out["main_commit"] = info.oid
from transformers.dynamic_module_utils import get_class_from_dynamic_module
remote_pv = get_class_from_dynamic_module("modeling_pacer.PacerPreVerifier", "org/pv").from_pretrained("org/pv")
assert type(remote_pv) is not PacerPreVerifier  # a copy loaded with trust_remote_code publishes the same way
push_preverifier(remote_pv, "org/pv-remote")
dev = PacerPreVerifier.from_draft(draft, target_model="org/tiny-target", hidden_size=16, num_attention_heads=2,
                                  intermediate_size=32, block_size=2, max_draft_tokens=8, threshold=0.2)
metrics = {"hardware": "loopback test (numbers are fixtures)", "datasets": ["org/tiny-corpus"],
           "training": {"steps": 1, "learning_rate": 0.001}, "speedup": [{"method": "pacer", "speedup": 1.0}]}
push_preverifier(dev, "org/pv", revision="dev", tag="v1", metrics=metrics)
push_preverifier(PacerPreVerifier.from_draft(other_draft), "org/pv-wrong")
with tempfile.TemporaryDirectory() as tmp:
    pv.save_pretrained(f"{tmp}/saved")
    assert cli(["push", f"{tmp}/saved", "org/pv-cli", "--with-custom-generate"]) == 0
    assert cli(["push-generate", "org/pacer"]) == 0
    corrupt = build_preverifier_repo(pv, f"{tmp}/corrupt")
    weights = corrupt / "model.safetensors"
    weights.write_bytes((10 ** 12).to_bytes(8, "little") + weights.read_bytes()[8:])  # header length lies
    api.create_repo("org/pv-corrupt")
    api.upload_folder(repo_id="org/pv-corrupt", folder_path=str(corrupt))
    pickled = build_preverifier_repo(pv, f"{tmp}/pickled")
    (pickled / "model.safetensors").unlink()
    torch.save(pv.state_dict(), pickled / "pytorch_model.bin")
    api.create_repo("org/pv-pickle")
    api.upload_folder(repo_id="org/pv-pickle", folder_path=str(pickled))
card = ModelCard.load("org/pv")
card.validate()  # the server's validate-yaml
out["card_base_model"] = card.data.base_model
target = pacer_hf.enable(target)
out["plain"] = target.generate(prompt, **GEN).tolist()
for name, value in (("main", pv), ("dev", dev), ("fixed", "sd-fixed-3")):
    out[name] = target.generate(prompt, assistant_model=draft, pacer=value, **GEN).tolist()
    out[name + "_lengths"] = pacer_hf.last_stats(target).draft_lengths
out["strategies"] = sorted(pacer_hf.STRATEGIES)
out["ouroboros"] = target.generate(prompt, assistant_model=draft, pacer="ouroboros", **GEN).tolist()
torch.manual_seed(7)
out["sample"] = target.generate(prompt, assistant_model=draft, pacer=pv, max_new_tokens=24, do_sample=True,
                                top_k=0, temperature=1.0).tolist()
json.dump(out, open(sys.argv[1], "w"))
"""

LOAD = """
import json, sys
import pytest
import pacer_hf
from huggingface_hub import HfApi, ModelCard
from pacer_hf import PacerPreVerifier
expected = json.load(open(sys.argv[1]))
refs = HfApi().list_repo_refs("org/pv")
assert {b.name for b in refs.branches} == {"main", "dev"} and [t.name for t in refs.tags] == ["v1"], refs
main = PacerPreVerifier.from_pretrained("org/pv")
assert main.config.threshold == 0.5 and checksum(main) == expected["checksum"]
assert main.config.draft_model == "org/tiny-draft" and main.config.target_model == "org/tiny-target"
assert PacerPreVerifier.from_pretrained("org/pv", revision="dev").config.threshold == 0.2
assert PacerPreVerifier.from_pretrained("org/pv", revision="v1").config.threshold == 0.2
assert PacerPreVerifier.from_pretrained("org/pv", revision=expected["main_commit"]).config.threshold == 0.5
assert PacerPreVerifier.from_pretrained("org/pv-cli").config.threshold == 0.5
assert checksum(PacerPreVerifier.from_pretrained("org/pv-remote")) == expected["checksum"]
pacer_hf.enable(target)
assert target.generate(prompt, **GEN).tolist() == expected["plain"]
out = target.generate(prompt, assistant_model=draft, pacer="org/pv", **GEN)
assert out.tolist() == expected["plain"] == expected["main"]
assert pacer_hf.last_stats(target).draft_lengths == expected["main_lengths"]
dev = PacerPreVerifier.from_pretrained("org/pv", revision="v1")
assert target.generate(prompt, assistant_model=draft, pacer=dev, **GEN).tolist() == expected["plain"]
lengths = pacer_hf.last_stats(target).draft_lengths
assert lengths == expected["dev_lengths"] != expected["main_lengths"], (lengths, expected["main_lengths"])
from transformers.dynamic_module_utils import get_class_from_dynamic_module
remote_class = get_class_from_dynamic_module("modeling_pacer.PacerPreVerifier", "org/pv")  # the repo's code
remote_pv = remote_class.from_pretrained("org/pv")
assert type(remote_pv) is not PacerPreVerifier and type(remote_pv).__module__.startswith("transformers_modules.")
assert target.generate(prompt, assistant_model=draft, pacer=remote_pv, **GEN).tolist() == expected["main"]
assert pacer_hf.last_stats(target).draft_lengths == expected["main_lengths"]
with pytest.raises(ValueError, match="trained for draft org/other-draft"):
    target.generate(prompt, assistant_model=draft, pacer="org/pv-wrong", **GEN)
card = ModelCard.load("org/pv", repo_type="model")
assert card.data.base_model == "org/tiny-draft" and "speculative-decoding" in card.data.tags
assert card.data.library_name == "transformers" and card.data.license == "apache-2.0"
from huggingface_hub import hf_hub_download
dev_card = ModelCard.load(hf_hub_download("org/pv", "README.md", revision="dev"))
assert dev_card.data.datasets == ["org/tiny-corpus"] and "loopback test" in dev_card.text
"""

ERRORS = """
import pytest, torch
from huggingface_hub import hf_hub_download
from huggingface_hub.errors import EntryNotFoundError, RepositoryNotFoundError, RevisionNotFoundError
import pacer_hf
from pacer_hf import PacerPreVerifier
from transformers import AutoModel

def cause_chain(error):
    while error is not None:
        yield error
        error = error.__cause__ or error.__context__

with pytest.raises(RepositoryNotFoundError):
    hf_hub_download("org/missing", "config.json")
with pytest.raises(EntryNotFoundError):
    hf_hub_download("org/pv", "no-such-file.json")
with pytest.raises(RevisionNotFoundError):
    hf_hub_download("org/pv", "config.json", revision="no-such-branch")
with pytest.raises(OSError) as info:
    PacerPreVerifier.from_pretrained("org/missing")
assert any(isinstance(e, RepositoryNotFoundError) for e in cause_chain(info.value)), repr(info.value)
with pytest.raises(OSError) as info:
    PacerPreVerifier.from_pretrained("org/pv", revision="no-such-branch")
assert any(isinstance(e, RevisionNotFoundError) for e in cause_chain(info.value)), repr(info.value)
pacer_hf.enable(target)
with pytest.raises(OSError):
    target.generate(prompt, assistant_model=draft, pacer="org/missing", **GEN)
with pytest.raises(OSError, match="(?s)models--org--pv-corrupt.*model.safetensors.*force_download=True"):
    PacerPreVerifier.from_pretrained("org/pv-corrupt")  # names the cached file and the fix

def no_pickle(*args, **kwargs):
    raise AssertionError("a pre-verifier must never be unpickled")
torch.load = no_pickle
with pytest.raises(OSError, match="model.safetensors"):
    PacerPreVerifier.from_pretrained("org/pv-pickle")
with pytest.raises(OSError, match="model.safetensors"):
    AutoModel.from_pretrained("org/pv-pickle", trust_remote_code=True)
with pytest.raises(ValueError, match="safetensors weights only"):
    PacerPreVerifier.from_pretrained("org/pv", use_safetensors=False)
"""

# The pacer_hf consumer runs LOAD then ERRORS in one process (ERRORS replaces torch.load): one interpreter
# start (~6 s of CPU importing torch and transformers) less; each test checks its own section.
SECTIONS = """
import sys, traceback
for _name, _code in (("load", LOAD), ("errors", ERRORS)):
    try:
        exec(compile(_code, _name, "exec"), {**globals()})
        print(f"SECTION {_name} OK", flush=True)
    except BaseException:
        print(f"SECTION {_name} FAILED", flush=True)
        traceback.print_exc()
        sys.stdout.flush()
"""

NO_PACER = """
import json, sys
sys.modules["pacer_hf"] = None  # `import pacer_hf` now raises ImportError, whatever is installed
try:
    import pacer_hf  # noqa: F401
    raise SystemExit("pacer_hf is importable")
except ImportError:
    pass
from transformers import AutoModel
expected = json.load(open(sys.argv[1]))
pv = AutoModel.from_pretrained("org/pv", trust_remote_code=True)
assert type(pv).__name__ == "PacerPreVerifier" and type(pv).__module__.startswith("transformers_modules."), type(pv)
assert checksum(pv) == expected["checksum"] and pv.config.threshold == 0.5
remote = dict(custom_generate="org/pacer", trust_remote_code=True, assistant_model=draft)
out = target.generate(prompt, pacer="org/pv", **remote, **GEN)
assert out.tolist() == expected["main"] == expected["plain"], (out.tolist(), expected["main"])
assert target._pacer_last_stats.draft_lengths == expected["main_lengths"]
assert "generate" not in target.__dict__ and not hasattr(target.generation_config, "pacer")
out = target.generate(prompt, pacer=pv, **remote, **GEN)  # an AutoModel-loaded pre-verifier object
assert out.tolist() == expected["main"] and target._pacer_last_stats.draft_lengths == expected["main_lengths"]
assert target.generate(prompt, pacer="sd-fixed-3", **remote, **GEN).tolist() == expected["fixed"]
assert target._pacer_last_stats.draft_lengths == expected["fixed_lengths"]
torch.manual_seed(7)
sample = target.generate(prompt, pacer="org/pv", **remote, max_new_tokens=24, do_sample=True, top_k=0,
                         temperature=1.0)
assert sample.tolist() == expected["sample"], "custom_generate sampling differs from pacer_hf.enable"
assert target.generate(prompt, pacer="ouroboros", **remote, **GEN).tolist() == expected["ouroboros"]
registry = [v for k, v in sys.modules.items() if k.endswith(".custom_generate.strategies__registry") and v is not None]
assert sorted(registry[0].STRATEGIES) == expected["strategies"], sorted(registry[0].STRATEGIES)
ids = torch.cat([prompt, torch.cat([torch.full((1, 4), 0), prompt[:, 4:]], 1)])  # a left-padded batch of 2
mask = (torch.arange(10) >= torch.tensor([[0], [4]])).long()
batched = target.generate(ids, attention_mask=mask, pacer="org/pv", pad_token_id=0, **remote, **GEN)
assert torch.equal(batched, target.generate(ids, attention_mask=mask, pad_token_id=0, **GEN)), "batch via the Hub"
assert len(target._pacer_last_stats.rows) == 2
both = dict(remote, custom_generate="org/pv-cli")  # a pre-verifier repo that also ships custom_generate/
assert target.generate(prompt, pacer="org/pv-cli", **both, **GEN).tolist() == expected["main"]
loaded = sorted(m for m, v in sys.modules.items() if v is not None and m.split(".")[0] == "pacer_hf")
assert not loaded, loaded
print("NO_PACER OK")
"""


def _client_env(endpoint: str, hf_home: Path) -> dict:
    inherited = ("HF_", "HUGGINGFACE_", "TRANSFORMERS_")  # caches, offline flags, tokens of the outer env
    env = {k: v for k, v in os.environ.items() if not k.upper().endswith("_PROXY") and not k.startswith(inherited)}
    env.update(HF_ENDPOINT=endpoint, HF_HOME=str(hf_home), HF_TOKEN=TOKEN, HF_HUB_DISABLE_TELEMETRY="1",
               HF_HUB_DISABLE_PROGRESS_BARS="1", NO_PROXY="127.0.0.1,localhost",
               TRANSFORMERS_VERBOSITY="error", DISABLE_SAFETENSORS_CONVERSION="1", OMP_NUM_THREADS="1",
               TOKENIZERS_PARALLELISM="false", PYTHONDONTWRITEBYTECODE="1")
    return env


class Client:
    """PAIR + `script` in a fresh interpreter against the test hub, started now, checked by `output()`."""

    def __init__(self, hub: dict, script: str, hf_home: Path, *args: str):
        hf_home.mkdir(parents=True, exist_ok=True)
        self.hub, self.out, self.err = hub, open(hf_home / "stdout", "w+"), open(hf_home / "stderr", "w+")  # noqa: SIM115
        code = textwrap.dedent(PAIR) + textwrap.dedent(script)
        self.stdout: str | None = None
        self.stderr = ""
        self.process = subprocess.Popen([sys.executable, "-c", code, *args], cwd=hf_home, stdout=self.out,
                                        stderr=self.err, env=_client_env(hub["endpoint"], hf_home))

    def output(self) -> str:
        """The client's stdout once it has exited; fails the test with its output and the server log."""
        if self.stdout is not None:
            return self.stdout
        try:
            returncode = self.process.wait(timeout=CLIENT_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.process.kill()
            returncode = self.process.wait()
        self.out.seek(0)
        self.err.seek(0)
        stdout, stderr = self.out.read(), self.err.read()
        self.out.close()
        self.err.close()
        self.stdout, self.stderr = stdout, stderr
        if returncode != 0:
            log = Path(self.hub["log"]).read_text()[-3000:] if Path(self.hub["log"]).exists() else ""
            pytest.fail(f"client failed ({returncode}):\n{stdout[-3000:]}\n{stderr[-6000:]}\n"
                        f"--- server log tail ---\n{log}")
        return stdout


def run_client(hub: dict, script: str, hf_home: Path, *args: str) -> str:
    """Run PAIR + `script` in a fresh interpreter against the test hub; fail with its output."""
    return Client(hub, script, hf_home, *args).output()


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    """The loopback Hub server: a subprocess on a free 127.0.0.1 port, stopped by its PID."""
    folder = tmp_path_factory.mktemp("hub")
    port_file, log = folder / "port", folder / "requests.log"
    stderr = open(folder / "stderr", "w")  # noqa: SIM115 - closed after the server stops
    process = subprocess.Popen([sys.executable, str(SERVER), "--port-file", str(port_file), "--log", str(log),
                                "--token", TOKEN], stdout=subprocess.DEVNULL, stderr=stderr)
    deadline = time.monotonic() + 30
    while not port_file.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            pytest.fail(f"test hub server did not start: {(folder / 'stderr').read_text()}")
        time.sleep(0.05)
    yield {"endpoint": f"http://127.0.0.1:{port_file.read_text()}", "log": str(log), "pid": process.pid}
    os.kill(process.pid, signal.SIGTERM)
    process.wait(timeout=10)
    stderr.close()


@pytest.fixture(scope="module")
def published(hub, tmp_path_factory):
    """Everything pushed once by a pacer_hf process; returns the outputs it recorded with pacer_hf.enable."""
    folder = tmp_path_factory.mktemp("publisher")
    run_client(hub, PUBLISH, folder / "hf_home", str(folder / "expected.json"))
    return json.loads((folder / "expected.json").read_text())


@pytest.fixture(scope="module")
def consumers(hub, published, tmp_path_factory):
    """The three consumer processes, started together (each its own empty HF_HOME): they overlap."""
    folder = tmp_path_factory.mktemp("consumers")
    expected = folder / "expected.json"
    expected.write_text(json.dumps(published))
    with_pacer = f"LOAD = {textwrap.dedent(LOAD)!r}\nERRORS = {textwrap.dedent(ERRORS)!r}\n" + textwrap.dedent(SECTIONS)
    clients = {name: Client(hub, script, folder / name, str(expected))
               for name, script in (("pacer_hf", with_pacer), ("no_pacer", NO_PACER))}
    yield clients
    for client in clients.values():
        if client.process.poll() is None:
            client.process.kill()
            client.process.wait()


def _api(hub: dict, path: str, payload: dict | None = None):
    request = urllib.request.Request(hub["endpoint"] + path, data=None if payload is None else json.dumps(payload).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"null")


def test_push_writes_complete_repos(hub, published):
    status, tree = _api(hub, "/api/models/org/pv/tree/main?recursive=true")
    assert status == 200
    files = {entry["path"] for entry in tree if entry["type"] == "file"}
    assert {"config.json", "model.safetensors", "configuration_pacer.py", "modeling_pacer.py", "README.md"} <= files
    assert not any(name.endswith((".bin", ".pt", ".pkl")) for name in files)
    with urllib.request.urlopen(hub["endpoint"] + "/org/pv/resolve/main/config.json", timeout=30) as response:
        config = json.loads(response.read())
    assert config["auto_map"] == {"AutoConfig": "configuration_pacer.PacerConfig",
                                  "AutoModel": "modeling_pacer.PacerPreVerifier"}
    assert config["model_type"] == "pacer_preverifier" and config["draft_model"] == "org/tiny-draft"
    status, tree = _api(hub, "/api/models/org/pacer/tree/main?recursive=true")
    generate_files = {entry["path"] for entry in tree if entry["type"] == "file"}
    expected = {f"custom_generate/{flat_name(m)}.py" for m in custom_generate_modules()}
    assert expected | {"custom_generate/generate.py", "custom_generate/requirements.txt", "README.md"} <= generate_files
    status, tree = _api(hub, "/api/models/org/pv-cli/tree/main?recursive=true")
    assert "custom_generate/generate.py" in {entry["path"] for entry in tree}
    # pushed from an instance of the repo's remote code: re-built as pacer_hf's class, same files and card
    status, tree = _api(hub, "/api/models/org/pv-remote/tree/main?recursive=true")
    assert status == 200 and {"model.safetensors", "modeling_pacer.py", "README.md"} <= {e["path"] for e in tree}
    with urllib.request.urlopen(hub["endpoint"] + "/org/pv-remote/resolve/main/modeling_pacer.py", timeout=30) as response:
        assert response.read() == (ROOT / "pacer_hf" / "modeling_pacer.py").read_bytes()
    assert published["card_base_model"] == "org/tiny-draft"


def _section(client: Client, name: str) -> None:
    output = client.output()
    if f"SECTION {name} OK" not in output:
        pytest.fail(f"section {name!r} failed:\n{output[-6000:]}\n{client.stderr[-6000:]}")


def test_load_from_hub_default_branch_tag_and_generate_exact(consumers):
    _section(consumers["pacer_hf"], "load")


def test_hub_errors_are_the_real_client_exceptions_and_weights_are_safetensors_only(consumers):
    _section(consumers["pacer_hf"], "errors")


def test_remote_code_and_custom_generate_without_pacer_hf(consumers):
    assert "NO_PACER OK" in consumers["no_pacer"].output()


def _tiny_preverifier(**overrides) -> PacerPreVerifier:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1)
    draft = LlamaForCausalLM(config)
    draft.name_or_path = "org/tiny-draft"
    return PacerPreVerifier.from_draft(draft, hidden_size=16, num_attention_heads=2, intermediate_size=32, **overrides)


def _validate_card(hub: dict, text: str) -> ModelCard:
    status, answer = _api(hub, "/api/validate-yaml", {"content": text, "repoType": "model"})
    assert status == 200 and not answer["errors"], answer
    card = ModelCard(text)  # huggingface_hub's own parser
    assert card.data.library_name == "transformers" and "speculative-decoding" in card.data.tags
    return card


def test_model_card_renders_and_validates(hub, tmp_path):
    preverifier = _tiny_preverifier(target_model="org/tiny-target")
    preverifier.save_pretrained(tmp_path / "untrained")
    card = _validate_card(hub, render_preverifier_card(tmp_path / "untrained", "org/pv"))
    assert card.data.base_model == "org/tiny-draft" and card.data.license == "apache-2.0"
    assert 'pacer="org/pv"' in card.text and "| cost ratio c = t(draft step) / t(target step) | not measured |" in card.text
    assert "Simulated speedup: not measured" in card.text and "Wall-clock speedup: not measured" in card.text
    assert "| threshold | 0.5 |" in card.text and "| block size | 4 |" in card.text

    # the structure pacer_hf.training writes: config.calibration (calibrate) and config.training (train)
    calibration = {"draft_cost": 0.125, "verify_cost": [1.0, 1.05, 1.1], "chosen": {"block_size": 2, "threshold": 0.3},
                   "table": {"fixed-1": 1.12, "oracle": 1.9, "pacer": 1.4}, "auc": 0.8, "ece": 0.05,
                   "reported_on": "report split", "processor": "x86_64", "torch_threads": 2,
                   "costs": "measured: context 64, 5 interleaved repeats, medians"}
    training = {"train_data": "runs/traces", "epochs": 2, "loss": "bce", "metrics": {"auc": 0.81, "ece": 0.04}}
    preverifier = _tiny_preverifier(cost_ratio=0.125, calibration=calibration, training=training, threshold=0.3,
                                    block_size=2)
    preverifier.save_pretrained(tmp_path / "trained")
    metrics = {"datasets": ["org/corpus"], "hardware": "2-core CPU, torch 2.13",
               "speedup": [{"method": "pacer", "tokens_per_s": 120.5, "speedup": 1.31},
                           {"method": "sd-fixed-4", "tokens_per_s": 101.0, "speedup": 1.1}],
               "command": "pacer-hf bench --pair demo", "conditions": "nothing else running"}
    (tmp_path / "trained" / "pacer_metrics.json").write_text(json.dumps(metrics))
    card = _validate_card(hub, render_preverifier_card(tmp_path / "trained", "org/pv2"))
    text = card.text
    simulated, measured = text.split("## Simulated speedup")[1].split("## Measured speedup")
    assert card.data.datasets == ["org/corpus"] and "not measured" not in text
    assert "| cost ratio c = t(draft step) / t(target step) | 0.125 |" in text and "| threshold | 0.3 |" in text
    assert "| epochs | 2 |" in text and "| auc | 0.8 |" in text and "measured: context 64" in text
    assert "| pacer | 1.4 |" in simulated and "not timed" in simulated and "120.5" not in simulated
    assert "| pacer | 120.5 | 1.31 |" in measured and "Measured on: 2-core CPU, torch 2.13 (nothing else running)." in measured

    status, answer = _api(hub, "/api/validate-yaml", {"content": "---\ntags: 5\nbase_model: ./local\n---\n"})
    assert status == 400 and len(answer["errors"]) == 2  # the server's validator does reject bad metadata


def test_custom_generate_repo_is_generated_from_package_sources(tmp_path):
    """One flat folder (the loader knows no sub-packages): every module, its relative imports made flat."""
    out = build_custom_generate_repo(tmp_path / "repo", repo_id="org/pacer")
    package = ROOT / "pacer_hf"
    entry = (out / "custom_generate" / "generate.py").read_text()
    assert entry == flattened_source(ENTRY)  # pacer_hf/hub/hub_generate.py, its imports made flat
    assert "def generate(" in entry
    modules = custom_generate_modules()
    assert {"strategies.registry", "strategies.pearl.workers", "generation", "modeling_pacer"} <= set(modules)
    for module in modules:
        shipped = (out / "custom_generate" / f"{flat_name(module)}.py").read_text()
        source = (package / module.replace(".", "/")).with_suffix(".py")
        source = source if source.is_file() else package / module.replace(".", "/") / "__init__.py"
        imports_subpackage = re.search(r"^\s*from \.\w+\.", source.read_text(), re.MULTILINE)
        if source.name != "__init__.py" and "." not in module and not imports_subpackage:
            assert shipped == source.read_text(), module  # top-level modules ship unchanged
        assert not re.search(r"^\s*from \.\.", shipped, re.MULTILINE), module
        for target in re.findall(r"^\s*from \.(\S+) import", shipped, re.MULTILINE):
            assert (out / "custom_generate" / f"{target}.py").is_file(), (module, target)
    for path in (out / "custom_generate").glob("*.py"):  # what transformers' loader requires to be installed
        assert "pacer_hf" not in get_imports(path), path
    assert "custom_generate" in ModelCard((out / "README.md").read_text()).data.tags


def test_demo_preverifier_card(hub, tmp_path):
    folder = ROOT / "hub_cards" / "demo-preverifier"
    if not (folder / "config.json").is_file():
        pytest.skip("hub_cards/demo-preverifier has not been published yet")
    _validate_card(hub, render_preverifier_card(folder, "org/demo-preverifier"))


def test_push_refuses_a_folder_without_safetensors(tmp_path):
    preverifier = _tiny_preverifier()
    preverifier.config.save_pretrained(tmp_path / "pickled")
    torch.save(preverifier.state_dict(), tmp_path / "pickled" / "pytorch_model.bin")
    with pytest.raises(FileNotFoundError, match="safetensors only"):
        build_preverifier_repo(tmp_path / "pickled", tmp_path / "repo")
    with pytest.raises(OSError, match="loads safetensors weights only"):
        PacerPreVerifier.from_pretrained(tmp_path / "pickled")


def test_shipped_remote_code_is_the_package_code():
    """hub_cards folders carry the code `save_pretrained` writes for trust_remote_code: it must be the package's
    own, or a Hub copy of a shipped folder loads other code than pacer_hf runs."""
    shipped = [p for p in (ROOT / "hub_cards").rglob("*.py") if p.name.startswith(("configuration_", "modeling_"))]
    seen = {str(p.parent.relative_to(ROOT / "hub_cards")) for p in shipped}
    assert seen >= {"demo-preverifier", "default-lookup-gate", "default-preverifier/sampling"}, "the glob sees them"
    stale = [str(p.relative_to(ROOT)) for p in shipped if p.read_bytes() != (ROOT / "pacer_hf" / p.name).read_bytes()]
    assert not stale, f"stale copies (copy pacer_hf/<name> over them, or rebuild the folder): {stale}"
