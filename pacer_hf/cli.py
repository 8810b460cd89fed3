"""`pacer-hf` command line: one subcommand per module listed in COMMANDS.

Each module defines `add_arguments(parser)` and `run(args) -> int`, and a module docstring whose
first line is the subcommand's help. Only the module of the subcommand being run is imported (the
others' help lines are read from their source), so `pacer-hf demo` never loads the demo-pair
builder or the training stack.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import importlib.util
import sys
from pathlib import Path

COMMANDS = {
    "demo": "pacer_hf.demo",
    "build-demo-pair": "pacer_hf.recipes.demo_pair",
    "build-draft": "pacer_hf.recipes.smollm2_draft",
    "build-qwen-coder": "pacer_hf.recipes.qwen_coder",
    "train-lookup-gate": "pacer_hf.recipes.lookup_gate",
    "push": "pacer_hf.hub.push",
    "push-generate": "pacer_hf.hub.push_generate",
    "fit": "pacer_hf.training.fit_cli",
    "collect": "pacer_hf.training.collect",
    "train": "pacer_hf.training.train",
    "calibrate": "pacer_hf.training.calibrate",
    "align-draft": "pacer_hf.training.align",
    "bench": "pacer_hf.bench",
    "mkl-shim": "pacer_hf.costs.blas",
}


def _docstring(module_name: str) -> str | None:
    """A module's docstring, read from its source without importing it or its parent packages (whose own
    imports, e.g. `datasets` for training, need not be installed to run another command)."""
    path = Path(__file__).resolve().parent.joinpath(*module_name.split(".")[1:])
    source = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    if not source.is_file():
        return None
    return ast.get_docstring(ast.parse(source.read_text(encoding="utf-8")))


def _build_parser(argv: list[str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pacer-hf", description="Adaptive speculative decoding for transformers.")
    sub = parser.add_subparsers(dest="command", required=True)
    chosen = next((arg for arg in argv if not arg.startswith("-")), None)
    for name, module_name in COMMANDS.items():
        module = importlib.import_module(module_name) if name == chosen else None
        doc = module.__doc__ if module is not None else _docstring(module_name)
        help_line = doc.strip().splitlines()[0] if doc else None
        command = sub.add_parser(name, help=help_line, description=doc,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
        if module is not None:
            module.add_arguments(command)
            command.set_defaults(_module=module)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = _build_parser(argv).parse_args(argv)
    return int(args._module.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
