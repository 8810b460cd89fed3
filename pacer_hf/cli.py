"""`pacer-hf` command line: one subcommand per module listed in COMMANDS.

Each module defines `add_arguments(parser)` and `run(args) -> int`, and a module docstring whose
first line is the subcommand's help. Modules are imported when the parser is built.
"""

from __future__ import annotations

import argparse
import importlib
import sys

COMMANDS = {
    "demo": "pacer_hf.demo",
    "build-demo-pair": "pacer_hf.demo_pair",
    "push": "pacer_hf.push",
    "push-generate": "pacer_hf.push_generate",
    "collect": "pacer_hf.training.collect",
    "train": "pacer_hf.training.train",
    "calibrate": "pacer_hf.training.calibrate",
    "align-draft": "pacer_hf.training.align",
    "bench": "pacer_hf.bench",
}


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pacer-hf", description="Adaptive speculative decoding for transformers.")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, module_name in COMMANDS.items():
        module = importlib.import_module(module_name)
        help_line = (module.__doc__ or "").strip().splitlines()[0] if module.__doc__ else None
        command = sub.add_parser(name, help=help_line, description=module.__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
        module.add_arguments(command)
        command.set_defaults(_module=module)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _build_parser().parse_args(argv)
    return int(args._module.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
