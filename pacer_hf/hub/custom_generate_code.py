"""The code of the `custom_generate` Hub repo: pacer_hf's modules, flattened into one folder.

transformers' remote-code loader fetches only the files named by `from .x import` lines, all from the
one folder next to `generate.py`; it knows no sub-packages. So every pacer_hf module the entry point
(`hub_generate.py`) needs, transitively, is written as one flat file (`strategies/pearl/workers.py`
becomes `strategies__pearl__workers.py`, a package's `__init__.py` takes the package's name) and each
relative import is rewritten to `from .<flat name> import ...`. Top-level modules keep their names, and
their text is unchanged unless they import from a sub-package.
"""

from __future__ import annotations

import ast
from pathlib import Path

from .._paths import PACKAGE_DIR, hub_cards_dir

ENTRY = "hub.hub_generate"  # pacer_hf module shipped as custom_generate/generate.py
REQUIREMENTS = hub_cards_dir() / "custom-generate" / "custom_generate" / "requirements.txt"


def _source(module: str) -> Path:
    """The file of a dotted module name relative to pacer_hf ("strategies.pearl" -> strategies/pearl/__init__.py)."""
    base = PACKAGE_DIR.joinpath(*module.split("."))
    return base / "__init__.py" if base.is_dir() else base.with_suffix(".py")


def flat_name(module: str) -> str:
    return module.replace(".", "__")


def _imports(module: str) -> list[tuple[ast.ImportFrom, str]]:
    """Relative `from X import ...` statements of a module, each with the dotted module X resolves to."""
    path = _source(module)
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.ImportFrom) or not node.level:
            continue
        base = package[: len(package) - node.level + 1]
        if node.module is None or len(base) < len(package) - node.level + 1:
            raise RuntimeError(f"pacer_hf/{path.relative_to(PACKAGE_DIR)}:{node.lineno}: write relative imports as "
                               "`from ..module import name` (transformers' loader fetches no other form).")
        target = ".".join([*base, node.module])
        if not _source(target).is_file():
            raise RuntimeError(f"pacer_hf/{path.relative_to(PACKAGE_DIR)}:{node.lineno} imports {target}, which is "
                               "not a pacer_hf module.")
        found.append((node, target))
    return found


def custom_generate_modules() -> list[str]:
    """Dotted names of the pacer_hf modules the entry point needs, transitively (the entry excluded)."""
    needed, todo = set(), [ENTRY]
    while todo:
        for _, target in _imports(todo.pop()):
            if target not in needed and target != ENTRY:
                needed.add(target)
                todo.append(target)
    return sorted(needed)


def flattened_source(module: str) -> str:
    """The module's text with every relative import that leaves its folder pointing at a flat file."""
    lines = _source(module).read_text(encoding="utf-8").splitlines(keepends=True)
    for node, target in sorted(_imports(module), key=lambda item: -item[0].lineno):
        if node.level == 1 and node.module == flat_name(target):
            continue  # already flat: a top-level module importing a top-level module
        names = ", ".join(alias.name + (f" as {alias.asname}" if alias.asname else "") for alias in node.names)
        first, last = node.lineno - 1, node.end_lineno - 1
        indent = lines[first][: len(lines[first]) - len(lines[first].lstrip())]
        comment = lines[first].rstrip("\n").partition("  #")[2] if first == last else ""
        lines[first : last + 1] = [f"{indent}from .{flat_name(target)} import {names}"
                                   + (f"  #{comment}" if comment else "") + "\n"]
    return "".join(lines)


def write_custom_generate_code(folder: Path) -> list[Path]:
    """Write generate.py, the flattened modules and requirements.txt into `folder`; returns the files."""
    folder.mkdir(parents=True, exist_ok=True)
    written = [folder / "generate.py"]
    written[0].write_text(flattened_source(ENTRY), encoding="utf-8")
    for module in custom_generate_modules():
        path = folder / f"{flat_name(module)}.py"
        path.write_text(flattened_source(module), encoding="utf-8")
        written.append(path)
    if not REQUIREMENTS.is_file():
        raise FileNotFoundError(f"{REQUIREMENTS} is missing (hub_cards/custom-generate: the checkout's hub_cards/, "
                                "or pacer_hf/hub_cards in an installed wheel).")
    (folder / "requirements.txt").write_bytes(REQUIREMENTS.read_bytes())
    return written + [folder / "requirements.txt"]
