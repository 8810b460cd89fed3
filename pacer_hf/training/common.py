"""Shared by the training commands: one way to report a bad argument or an interrupt."""

from __future__ import annotations


def cli_errors(command: str, interrupted_hint: str = ""):
    """Decorator for `run(args)`: a ValueError (bad argument or input) prints one clear line, exit status 2;
    Ctrl-C prints `interrupted_hint` (how to resume), exit status 130."""
    import functools
    import sys

    def wrap(run):
        @functools.wraps(run)
        def inner(args) -> int:
            try:
                return run(args)
            except ValueError as error:
                print(f"pacer-hf {command}: error: {error}", file=sys.stderr)
                return 2
            except KeyboardInterrupt:
                print(f"pacer-hf {command}: interrupted. {interrupted_hint}".rstrip(), file=sys.stderr)
                return 130

        return inner

    return wrap
