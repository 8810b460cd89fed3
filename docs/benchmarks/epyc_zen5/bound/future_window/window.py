"""The rule's estimate of the tokens not drafted yet read from the last W drafted tokens' mean instead of the last
block's (W = 3 here; the shipped rule's block size is 1), installed for this process only on the compiled CPU path
(`preverifier_kernel._continues`, what a CPU call runs) for pre-verifier objects marked `_future_window`.
The variant is derived from the shipped function's source, so the two differ only where the estimate is formed."""
import inspect
import textwrap

import numba

import pacer_hf.loops.preverifier_kernel as kernel

WINDOW = 3
SHIPPED = ("        if i >= n - block_size:\n            future += p\n    future /= max(min(block_size, n), 1)\n")
VARIANT = (f"        if i >= n - max(block_size, {WINDOW}):\n            future += p\n"
           f"    future /= max(min(max(block_size, {WINDOW}), n), 1)\n")


def _variant():
    source = textwrap.dedent(inspect.getsource(kernel._continues.py_func))
    if SHIPPED not in source:
        raise SystemExit("preverifier_kernel._continues no longer forms its estimate as this script expects.")
    source = source.replace(SHIPPED, VARIANT).replace("@compiled()\n", "")
    namespace = dict(vars(kernel))
    exec(source, namespace)
    return numba.njit(namespace["_continues"])


def install() -> None:
    continues = _variant()
    shipped_init, shipped_continues = kernel.CompiledRoundScorer.__init__, kernel.CompiledRoundScorer.continues

    def init(self, model):
        shipped_init(self, model)
        self.future_window = bool(getattr(model, "_future_window", False))

    def windowed(self, round_seconds, block_size, trim_per_token=-1.0):
        if not self.future_window:
            return shipped_continues(self, round_seconds, block_size, trim_per_token)
        return bool(continues(self.logits, self.length, block_size, self.max_tokens, round_seconds, trim_per_token))

    kernel.CompiledRoundScorer.__init__ = init
    kernel.CompiledRoundScorer.continues = windowed
