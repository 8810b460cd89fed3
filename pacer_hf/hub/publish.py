"""Publishing to the Hugging Face Hub: pre-verifier repos with a model card, and the `custom_generate` repo.

A pre-verifier repo holds `model.safetensors`, `config.json` (with `auto_map`), the remote-code files
`configuration_pacer.py`/`modeling_pacer.py` (copied by transformers' `save_pretrained` from this
package, never by hand) and a README.md rendered from `hub_cards/templates/preverifier_card.md`
(`pacer_hf._paths.hub_cards_dir()`: the checkout's hub_cards/, or the copy a wheel carries).
A pre-verifier object from another copy of the code (loaded with `trust_remote_code=True`) is
published like pacer_hf's own (`PacerPreVerifier.from_other_copy`).
The `custom_generate` repo is assembled from this package's own modules (one source of truth):
`hub_generate.py` becomes `custom_generate/generate.py`, the modules it imports sit next to it.
Numbers in a card come only from `config.calibration` or `pacer_metrics.json`; else "not measured".
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._paths import hub_cards_dir
from ..modeling_pacer import PacerPreVerifier
from .custom_generate_code import write_custom_generate_code

if TYPE_CHECKING:
    from huggingface_hub import CommitInfo
    from transformers import PreTrainedModel

HUB_CARDS_DIR = hub_cards_dir()
PREVERIFIER_TEMPLATE = HUB_CARDS_DIR / "templates" / "preverifier_card.md"
CUSTOM_GENERATE_TEMPLATE = HUB_CARDS_DIR / "templates" / "custom_generate_card.md"
METRICS_FILE = "pacer_metrics.json"
TRAIN_RESULTS_FILE = "train_results.json"
DEFAULT_CUSTOM_GENERATE_REPO = "<org>/pacer"
CARD_TAGS = ["pacer", "pacer_hf", "speculative-decoding", "pre-verifier", "custom_code"]
NOT_MEASURED = "not measured"
_PICKLE_PATTERNS = ["*.bin", "*.pt", "*.pth", "*.pkl", "*.ckpt"]
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*$")


# --------------------------------------------------------------------------- model cards
def _hub_id(name: Any) -> str | None:
    """`name` if it reads as a Hub model id (`org/name`) and is not a local path, else None."""
    if not isinstance(name, str) or not _HUB_ID.match(name) or Path(name).exists():
        return None
    return name


def _template(path: Path) -> str:
    if not path.is_file():
        raise FileNotFoundError(
            f"Card template {path} is missing: pacer_hf's card templates live in hub_cards/templates (the "
            "checkout's hub_cards/, or pacer_hf/hub_cards in an installed wheel); reinstall pacer_hf or pass "
            "template=<path>."
        )
    return path.read_text(encoding="utf-8")


def _format_value(value: Any, limit: int = 120) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (dict, list)):
        text = json.dumps(_rounded(value), sort_keys=True)
        return "`" + (text if len(text) <= limit else text[: limit - 1] + "…") + "`"
    return "–" if value is None else str(value).replace("|", "\\|").replace("\n", " ")


def _rounded(value: Any) -> Any:
    if isinstance(value, float):
        return float(f"{value:.4g}")
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    return value


def _table(rows: list[dict]) -> str:
    """A markdown table over the union of the rows' keys, in first-seen order."""
    columns: list[str] = []
    for row in rows:
        columns += [key for key in row if key not in columns]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_format_value(row.get(c)) for c in columns) + " |" for row in rows]
    return "\n".join(lines)


def _settings_table(items: list[tuple[str, Any]]) -> str:
    lines = ["| setting | value |", "|---|---|"]
    return "\n".join(lines + [f"| {name} | {_format_value(value)} |" for name, value in items])


def load_metrics(folder: str | Path) -> dict:
    """The folder's `pacer_metrics.json` (hardware, datasets, measured speedup rows...), or {}."""
    path = Path(folder) / METRICS_FILE
    if not path.is_file():
        return {}
    data = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict):
        raise ValueError(f"{path} must hold a JSON object (see docs/HUB.md for its fields).")
    return data


def _hardware(metrics: dict, calibration: dict) -> str | None:
    if metrics.get("hardware"):
        return str(metrics["hardware"])
    if calibration.get("hardware"):
        return str(calibration["hardware"])
    parts = [calibration.get("processor") or calibration.get("machine")]
    if calibration.get("torch_threads"):
        parts.append(f"{calibration['torch_threads']} torch threads")
    return ", ".join(str(p) for p in parts if p) or None


# Keys of `config.calibration` (pacer_hf.training.calibrate) shown in their own rows or sections.
_CALIBRATION_SHOWN = {"cost_ratio", "draft_cost", "hardware", "machine", "processor", "torch_threads", "chosen",
                      "table", "speedup", "training", "datasets", "draft_model", "target_model"}


def _training_section(config: dict, metrics: dict, datasets: list[str]) -> str:
    training = metrics.get("training") or config.get("training")
    parts = []
    if datasets:
        parts.append(f"Training data: {', '.join(datasets)}.")
    if isinstance(training, dict):
        parts.append(_settings_table(list(training.items())))
    elif training:
        parts.append(str(training))
    if isinstance(metrics.get("evaluation"), dict):
        parts.append("Held-out evaluation:\n\n" + _settings_table(list(metrics["evaluation"].items())))
    if not training:
        parts.append(f"Training data and settings: {NOT_MEASURED} (no training record was published with this "
                     "pre-verifier). An untrained pre-verifier is still exact; it only stops drafting less well.")
    return "\n\n".join(parts)


def _calibration_rows(config: dict, calibration: dict, hardware: str | None) -> list[tuple[str, Any]]:
    cost_ratio = config.get("cost_ratio")
    if cost_ratio is None:
        cost_ratio = calibration.get("cost_ratio", calibration.get("draft_cost"))
    rows = [
        ("cost ratio c = t(draft step) / t(target step)", NOT_MEASURED if cost_ratio is None else cost_ratio),
        ("block size", config.get("block_size")),
        ("threshold", config.get("threshold")),
        ("decision rule", config.get("decision_rule")),
        ("max draft tokens (L_max)", config.get("max_draft_tokens")),
        ("input mode", config.get("input_mode")),
        ("hardware", hardware or NOT_MEASURED),
    ]
    return rows + [(key, value) for key, value in calibration.items() if key not in _CALIBRATION_SHOWN]


def _simulated_section(calibration: dict) -> str:
    table = calibration.get("table")
    if not isinstance(table, dict) or not table:
        return f"Simulated speedup: {NOT_MEASURED} (the pre-verifier was not calibrated on traces)."
    rows = [{"method": name, "simulated speedup": value} for name, value in table.items()
            if not name.endswith("_mean_draft")]
    for row in rows:  # `pacer_mean_draft` (pacer_hf.training.simulate) is a draft length, not a speedup
        if f"{row['method']}_mean_draft" in table:
            row["mean draft length"] = table[f"{row['method']}_mean_draft"]
    where = calibration.get("reported_on", "held-out traces")
    return (f"Simulated from recorded traces ({where}) with the cost model above, not timed:\n\n{_table(rows)}")


def _speedup_section(metrics: dict, hardware: str | None) -> str:
    speedup = metrics.get("speedup")
    if not speedup:
        return (f"Wall-clock speedup: {NOT_MEASURED}. Speedup depends on the hardware and the (draft, target) "
                "pair; measure it on yours before relying on it.")
    rows = speedup if isinstance(speedup, list) else [speedup]
    conditions = f" ({metrics['conditions']})" if metrics.get("conditions") else ""
    section = f"Measured on: {hardware or 'hardware not recorded'}{conditions}.\n\n{_table(rows)}"
    if metrics.get("command"):
        section += f"\n\nReproduce with: `{metrics['command']}`"
    return section


def render_preverifier_card(
    folder: str | Path,
    repo_id: str | None = None,
    *,
    license: str = "apache-2.0",
    datasets: list[str] | None = None,
    tags: list[str] | None = None,
    custom_generate_repo: str = DEFAULT_CUSTOM_GENERATE_REPO,
    template: str | Path | None = None,
) -> str:
    """README.md text for the pre-verifier saved in `folder` (its config.json and pacer_metrics.json).

    YAML metadata first (library_name, tags, base_model = the draft, datasets, license), then usage,
    training, calibration, simulated and measured speedup with the hardware; absent numbers read
    "not measured". Simulated (trace-based) numbers are never presented as wall-clock ones.
    """
    from huggingface_hub import ModelCard, ModelCardData

    folder = Path(folder)
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    if config.get("model_type") != "pacer_preverifier":
        raise ValueError(f"{folder}/config.json is not a Pacer pre-verifier (model_type={config.get('model_type')!r}).")
    metrics = load_metrics(folder)
    calibration = config.get("calibration") or {}
    draft = config.get("draft_model") or calibration.get("draft_model")
    target = config.get("target_model") or calibration.get("target_model")
    datasets = list(datasets or metrics.get("datasets") or [])
    card_data = ModelCardData(
        library_name="transformers",
        license=license,
        tags=sorted(set(CARD_TAGS + list(tags or []))),
        base_model=_hub_id(draft),
        datasets=datasets or None,
    )
    if _hub_id(target):
        card_data.target_model = _hub_id(target)  # not a standard field; the Hub keeps extra keys
    hardware = _hardware(metrics, calibration)
    num_parameters = NOT_MEASURED
    weights = folder / "model.safetensors"
    if weights.is_file():
        from safetensors import safe_open

        with safe_open(str(weights), framework="pt") as handle:
            num_parameters = f"{sum(_numel(handle.get_slice(k).get_shape()) for k in handle.keys()):,}"
    signature = config.get("draft_signature")
    card = ModelCard.from_template(
        card_data,
        template_str=_template(Path(template) if template else PREVERIFIER_TEMPLATE),
        title=f"Pacer pre-verifier {repo_id}" if repo_id else "Pacer pre-verifier",
        repo_id=repo_id or "<org>/<this-repo>",
        custom_generate_repo=custom_generate_repo,
        draft_model=f"`{draft}`" if draft else "not recorded",
        target_model=f"`{target}`" if target else "not recorded",
        draft_signature=_format_value(signature) if signature else "not recorded",
        num_parameters=num_parameters,
        decoding=DECODING_LINES.get(config.get("decoding"), DECODING_LINES[None]),
        training_section=_training_section(config, metrics, datasets),
        calibration_table=_settings_table(_calibration_rows(config, calibration, hardware)),
        simulated_section=_simulated_section(calibration),
        speedup_section=_speedup_section(metrics, hardware),
    )
    return str(card)


DECODING_LINES = {
    "greedy": "greedy (trained on greedy rounds; `pacer_hf.attach` serves greedy calls with it)",
    "sampling": "sampling (trained on sampled rounds with soft labels min(1, p/q); `pacer_hf.attach` serves "
                "`do_sample=True` calls with it)",
    None: "not recorded (`pacer_hf.attach` serves greedy calls with it, and sampled ones when no pre-verifier for "
          "sampling is attached)",
}


def _numel(shape: list[int]) -> int:
    total = 1
    for size in shape:
        total *= int(size)
    return total


# --------------------------------------------------------------------------- pre-verifier repos
def build_preverifier_repo(
    source: str | Path | PreTrainedModel,
    out_dir: str | Path,
    *,
    repo_id: str | None = None,
    metrics: dict | None = None,
    include_custom_generate: bool = False,
    **card_options: Any,
) -> Path:
    """Write the complete Hub repo of a pre-verifier (folder or object) into `out_dir`.

    A folder is re-loaded (safetensors only) and re-saved, so what is published is what loads: weights,
    config with `auto_map`, the remote-code files, `pacer_metrics.json` when known, and README.md.
    An object may come from another copy of the code (`trust_remote_code=True`): it is re-built as
    this package's class, whose files `save_pretrained` then writes.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if not isinstance(source, (str, Path)):
        model = PacerPreVerifier.from_other_copy(source)
    else:
        folder = Path(source)
        if not (folder / "config.json").is_file():
            raise FileNotFoundError(f"{folder} holds no pre-verifier (no config.json); save one with save_pretrained.")
        if not any((folder / name).is_file() for name in ("model.safetensors", "model.safetensors.index.json")):
            raise FileNotFoundError(
                f"{folder} has no model.safetensors: pacer_hf publishes safetensors only (pickle weights can run "
                "code when loaded). Load the weights yourself and save with save_pretrained(safe_serialization=True)."
            )
        model = PacerPreVerifier.from_pretrained(folder)
        metrics = {**load_metrics(folder), **(metrics or {})}
        if (folder / TRAIN_RESULTS_FILE).is_file():  # written by `pacer-hf train`
            shutil.copyfile(folder / TRAIN_RESULTS_FILE, out_dir / TRAIN_RESULTS_FILE)
    model.save_pretrained(out_dir, safe_serialization=True)
    missing = [name for name in ("config.json", "model.safetensors", "configuration_pacer.py", "modeling_pacer.py")
               if not (out_dir / name).is_file()]
    if missing:
        raise RuntimeError(f"save_pretrained did not write {missing}; the repo would not load with trust_remote_code.")
    if metrics:
        (out_dir / METRICS_FILE).write_text(json.dumps(metrics, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    if include_custom_generate:
        write_custom_generate_code(out_dir / "custom_generate")
        card_options.setdefault("custom_generate_repo", repo_id or DEFAULT_CUSTOM_GENERATE_REPO)
    (out_dir / "README.md").write_text(render_preverifier_card(out_dir, repo_id, **card_options), encoding="utf-8")
    return out_dir


def _upload(folder: Path, repo_id: str, *, revision: str | None, tag: str | None, private: bool | None,
            token: str | bool | None, commit_message: str, commit_description: str | None, create_pr: bool,
            delete_patterns: list[str] | None) -> CommitInfo:
    from huggingface_hub import HfApi

    api = HfApi()
    api.create_repo(repo_id, private=private, token=token, exist_ok=True)
    if revision and revision != "main":
        api.create_branch(repo_id, branch=revision, token=token, exist_ok=True)
    info = api.upload_folder(
        repo_id=repo_id, folder_path=str(folder), revision=revision, commit_message=commit_message,
        commit_description=commit_description, token=token, create_pr=create_pr, delete_patterns=delete_patterns,
    )
    if tag:
        api.create_tag(repo_id, tag=tag, revision=info.oid, token=token)
    return info


def push_preverifier(
    source: str | Path | PreTrainedModel,
    repo_id: str,
    *,
    revision: str | None = None,
    tag: str | None = None,
    private: bool | None = None,
    token: str | bool | None = None,
    commit_message: str | None = None,
    commit_description: str | None = None,
    create_pr: bool = False,
    tags: list[str] | None = None,
    metrics: dict | None = None,
    include_custom_generate: bool = False,
    **card_options: Any,
) -> CommitInfo:
    """Upload a pre-verifier (folder or object) as a complete repo; returns huggingface_hub's CommitInfo.

    This is the publishing API (`pacer-hf push` calls it); `PacerPreVerifier.push_to_hub` is transformers'
    plain upload of weights, config and remote code, without the model card or the checks below.

    `revision` names the branch (created from main if new), `tag` tags the new commit. Pickle weight
    files left in the repo by earlier uploads are deleted, so the repo only ever offers safetensors.
    """
    with tempfile.TemporaryDirectory(prefix="pacer-push-") as tmp:
        folder = build_preverifier_repo(source, tmp, repo_id=repo_id, metrics=metrics, tags=tags,
                                        include_custom_generate=include_custom_generate, **card_options)
        return _upload(folder, repo_id, revision=revision, tag=tag, private=private, token=token,
                       commit_message=commit_message or "Upload Pacer pre-verifier with pacer_hf",
                       commit_description=commit_description, create_pr=create_pr, delete_patterns=_PICKLE_PATTERNS)


# --------------------------------------------------------------------------- custom_generate repo
def build_custom_generate_repo(out_dir: str | Path, *, repo_id: str | None = None,
                               template: str | Path | None = None) -> Path:
    """Write the `custom_generate` repo (README.md + custom_generate/) into `out_dir`, from this package."""
    from huggingface_hub import ModelCard, ModelCardData

    from .. import __version__

    out_dir = Path(out_dir)
    write_custom_generate_code(out_dir / "custom_generate")
    requirements = (out_dir / "custom_generate" / "requirements.txt").read_text(encoding="utf-8")
    lines = [line for line in requirements.splitlines() if line.strip() and not line.startswith("#")]
    card = ModelCard.from_template(
        ModelCardData(library_name="transformers", license="apache-2.0",
                      tags=["custom_generate", "speculative-decoding", "pacer", "pacer_hf"]),
        template_str=_template(Path(template) if template else CUSTOM_GENERATE_TEMPLATE),
        repo_id=repo_id or DEFAULT_CUSTOM_GENERATE_REPO,
        version=__version__,
        requirements="\n".join(f"- `{line}`" for line in lines),
    )
    (out_dir / "README.md").write_text(str(card), encoding="utf-8")
    return out_dir


def push_custom_generate(
    repo_id: str,
    *,
    revision: str | None = None,
    tag: str | None = None,
    private: bool | None = None,
    token: str | bool | None = None,
    commit_message: str | None = None,
) -> CommitInfo:
    """Build and upload the `custom_generate` repo; returns huggingface_hub's CommitInfo."""
    with tempfile.TemporaryDirectory(prefix="pacer-generate-") as tmp:
        folder = build_custom_generate_repo(tmp, repo_id=repo_id)
        return _upload(folder, repo_id, revision=revision, tag=tag, private=private, token=token,
                       commit_message=commit_message or "Upload pacer custom_generate with pacer_hf",
                       commit_description=None, create_pr=False, delete_patterns=["custom_generate/*.py"])
