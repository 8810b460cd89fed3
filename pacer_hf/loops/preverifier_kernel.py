"""The pre-verifier's per-token work on CPU as one compiled call: draft features, the layer, the logit.

Inside the drafting loop every drafted token needs three numbers from the draft's logits (`draft_features`), one
step of the pre-verifier's layer over the round's cached keys and values, and its acceptance logit. As torch or
numpy operations that is a few dozen small calls, ≈ 0.2 ms a token between two draft steps whose caches the
target's forward has just evicted: almost a lean draft step of the demo pair. Compiled with numba it is one call
over the same float32 weights (LayerNorm affines folded into the linear layers after them), equal to
`PacerPreVerifier.forward(cache=)` and `draft_features` to float rounding (tests/test_core_preverifier.py).
Only the stop decision reads it; no token depends on it.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from numba import njit

from ..modeling_pacer import PacerPreVerifier


def compiled(**options):
    """`numba.njit(cache=True, **options)` where numba finds a place for its cache (next to the source, else the
    user's cache folder), plain `njit` where it finds none (a read-only install without a writable home): there
    the functions compile once per process instead of failing to import."""

    def decorate(function):
        try:
            return njit(cache=True, **options)(function)
        except RuntimeError:  # "cannot cache function ...: no locator available"
            return njit(**options)(function)

    return decorate


_NO_WEIGHTS = np.zeros((0, 0), dtype=np.float32)
_NO_BIAS = np.zeros(0, dtype=np.float32)


# Reassociation lets LLVM vectorise the pass over the vocabulary; no "fast" flag that assumes away infinities or NaNs.
_VECTOR_MATH = {"reassoc", "contract", "nsz", "arcp"}
_EXP2_POLY = (0.6931472, 0.2402265, 0.05550411, 0.009618129, 0.001333355, 0.0001540353)  # 2^f on [0, 1), rel. err ~2e-7


@compiled(fastmath=_VECTOR_MATH)
def _features(logits, token, out, mantissas, exponents):
    """draft_features: (log p(token) clamped at -30, entropy, p1 - p2) of raw `logits`, into `out`.

    exp(x - max) = 2^k * poly(f): one pass writes poly(f) and the bits of the float 2^k into the scratch arrays
    `mantissas` and `exponents` (int32, as long as `logits`), a second multiplies and sums them. Both are
    branch- and gather-free, so they vectorise: ≈ 12 µs for 8192 entries (a table lookup of 2^k per entry kept
    the pass scalar: ≈ 32 µs; calling exp: more). Sums in float64."""
    top1 = logits[0]
    for value in logits:
        top1 = max(top1, value)
    top2, ties = np.float32(-3.0e38), 0
    for value in logits:
        ties += value == top1
        top2 = max(top2, value if value < top1 else np.float32(-3.0e38))
    if ties > 1:
        top2 = top1
    c1, c2, c3, c4, c5, c6 = _EXP2_POLY
    for i in range(logits.shape[0]):
        t = max(logits[i] - top1, np.float32(-80.0)) * np.float32(1.4426950408889634)
        k = np.floor(t)
        f = t - k
        mantissas[i] = np.float32(1.0) + f * (np.float32(c1) + f * (np.float32(c2) + f * (np.float32(c3) + f * (
            np.float32(c4) + f * (np.float32(c5) + f * np.float32(c6))))))
        exponents[i] = (np.int32(k) + np.int32(127)) << 23  # the bits of the float32 2^k
    powers = exponents.view(np.float32)
    total, weighted = 0.0, 0.0
    for i in range(logits.shape[0]):
        e = mantissas[i] * powers[i]
        total += e
        weighted += e * max(logits[i] - top1, np.float32(-80.0))
    log_total = math.log(total)
    out[0] = max(logits[token] - top1 - log_total, -30.0)
    out[1] = log_total - weighted / total
    out[2] = (1.0 - math.exp(top2 - top1)) / total


@compiled()
def _normalized(x, eps):
    centered = x - x.sum() / x.shape[0]
    return centered / math.sqrt((centered * centered).sum() / x.shape[0] + eps)


@compiled()
def _affine(x, weight, bias, out):
    """out += x @ weight + bias, `weight` (in, out) row-major: loops, so numba needs no BLAS (SciPy)."""
    out += bias
    for i in range(x.shape[0]):
        xi = x[i]
        for j in range(out.shape[0]):
            out[j] += xi * weight[i, j]
    return out


@compiled()
def _round_rows(position, state, weight, bias, out):
    """out = position + (state @ weight + bias): every position's input bias for a round that starts in `state`."""
    row = _affine(state, weight, bias, np.zeros(bias.shape[0], dtype=np.float32))
    for n in range(position.shape[0]):
        out[n] = position[n] + row
    return out


@compiled()
def _score(logits, mantissas, exponents, token, hidden, row, hidden_w, hidden_b, feature_w, feature_b, qkv_w, qkv_b, out_w, out_b,
           mlp_in_w, mlp_in_b, mlp_out_w, mlp_out_b, head_w, head_b, eps, keys, values, n, scale, features):
    """The acceptance logit of the round's token n; writes its keys/values at n and its features into `features`."""
    _features(logits, token, features, mantissas, exponents)
    x = row.copy()
    if hidden_w.shape[0] > 0:
        _affine(hidden, hidden_w, hidden_b, x)
    if feature_w.shape[0] > 0:
        _affine(features, feature_w, feature_b, x)
    heads, _, head_dim = keys.shape
    width = heads * head_dim
    qkv = _affine(_normalized(x, eps[0]), qkv_w, qkv_b, np.zeros(3 * width, dtype=np.float32))
    attended = np.zeros(width, dtype=np.float32)
    scores = np.empty(n + 1, dtype=np.float32)
    for h in range(heads):
        base = h * head_dim
        keys[h, n] = qkv[width + base:width + base + head_dim]
        values[h, n] = qkv[2 * width + base:2 * width + base + head_dim]
        for t in range(n + 1):
            total = 0.0
            for d in range(head_dim):
                total += keys[h, t, d] * qkv[base + d]
            scores[t] = total * scale
        weights = np.exp(scores - scores.max())
        weights /= weights.sum()
        for t in range(n + 1):
            for d in range(head_dim):
                attended[base + d] += weights[t] * values[h, t, d]
    _affine(attended, out_w, out_b, x)
    inner = _affine(_normalized(x, eps[1]), mlp_in_w, mlp_in_b, np.zeros(mlp_in_b.shape[0], dtype=np.float32))
    for i in range(inner.shape[0]):  # nn.GELU: x * Φ(x)
        inner[i] = 0.5 * inner[i] * (1.0 + math.erf(inner[i] / math.sqrt(2.0)))
    _affine(inner, mlp_out_w, mlp_out_b, x)
    return (_normalized(x, eps[2]) * head_w).sum() + head_b


@compiled()
def _continues(logits, n, block_size, max_tokens, table, per_token):
    """`modeling_pacer.expected_gain_continues` for one row under measured round costs `table` (seconds of a round
    drafting k = 0..max_tokens tokens, no pre-verifier term), from the acceptance logits of the n tokens drafted so
    far: the same arithmetic in the same order, without the Python calls that made it most of the rule's time per
    token. `per_token` >= 0 (greedy, trimming): stopping now proposes the best prefix, none included, each drafted
    token left out still costing `per_token` (`modeling_pacer.stop_rate`); < 0: the whole round (stop-only)."""
    tokens, survival, future = 1.0, 1.0, 0.0
    best = 1.0 / (table[0] + n * per_token) if per_token >= 0 else 0.0
    for i in range(n):
        p = 1.0 / (1.0 + math.exp(-min(max(logits[i], -60.0), 60.0)))
        survival *= p
        tokens += survival
        if per_token >= 0:
            best = max(best, tokens / (table[i + 1] + (n - i - 1) * per_token))
        if i >= n - block_size:
            future += p
    future /= max(min(block_size, n), 1)
    rate_now = best if per_token >= 0 else tokens / table[n]
    for extra in range(1, (max_tokens - n) // block_size + 1):
        for _ in range(block_size):
            survival *= future
            tokens += survival
        if tokens / table[n + extra * block_size] > rate_now:
            return True
    return False


@compiled()
def _best_prefix(logits, n, table, per_token):
    """`modeling_pacer.best_prefix` under measured round costs: how many of the n drafted tokens to propose (greedy),
    the prefix with the highest expected rate, the drafting paid (`per_token` per token left out); ties to the
    shorter."""
    tokens, survival = 1.0, 1.0
    best, best_rate = 0, 1.0 / (table[0] + n * per_token)
    for k in range(1, n + 1):
        survival *= 1.0 / (1.0 + math.exp(-min(max(logits[k - 1], -60.0), 60.0)))
        tokens += survival
        rate = tokens / (table[k] + (n - k) * per_token)
        if rate > best_rate:
            best, best_rate = k, rate
    return best


def round_scorer(model: PacerPreVerifier) -> CompiledRoundScorer | None:
    """The compiled scorer of `model`'s current weights when it runs on CPU; None elsewhere (the torch forward)."""
    return CompiledRoundScorer(model) if model.device.type == "cpu" else None


class CompiledRoundScorer:
    """A pre-verifier's inference on CPU, one drafted token at a time, from a snapshot of its weights.

    `start(loop)` opens a round (its `loop_features`, when the pre-verifier reads them); `add(hidden, logits,
    token)` scores the round's next drafted token from the draft's last hidden state and raw logits (CPU
    tensors) and returns its acceptance logit; `features` holds that token's `draft_features`.
    Build a new one after training.
    """

    def __init__(self, model: PacerPreVerifier):
        config = model.config
        weights = {name: value.detach().float().cpu().numpy() for name, value in model.state_dict().items()}
        self.max_tokens = config.max_draft_tokens
        self.num_heads = config.num_attention_heads
        self.scale = np.float32(1.0 / math.sqrt(config.hidden_size // config.num_attention_heads))
        self.position = weights["position.weight"]
        self.hidden_proj = _linear(weights, "hidden_proj") if config.input_mode != "features" else (_NO_WEIGHTS, _NO_BIAS)
        self.feature_proj = _linear(weights, "feature_proj") if config.input_mode != "hidden" else (_NO_WEIGHTS, _NO_BIAS)
        self.loop_proj = _linear(weights, "loop_proj") if getattr(config, "loop_features", False) else None
        self.qkv = _folded(weights, "layer.attn_norm", "layer.qkv")
        self.out = _linear(weights, "layer.out")
        self.mlp_in = _folded(weights, "layer.mlp_norm", "layer.mlp.0")
        self.mlp_out = _linear(weights, "layer.mlp.2")
        head_w, head_b = _folded(weights, "norm", "head")
        self.head = (np.ascontiguousarray(head_w[:, 0]), np.float32(head_b[0]))
        self.eps = np.array([model.layer.attn_norm.eps, model.layer.mlp_norm.eps, model.norm.eps], dtype=np.float32)
        self.features = np.zeros(3, dtype=np.float32)
        self.mantissas, self.exponents = np.empty(0, dtype=np.float32), np.empty(0, dtype=np.int32)
        self.logits = np.zeros(self.max_tokens, dtype=np.float64)  # the round's acceptance logits so far
        self.loop_rows = np.empty_like(self.position)
        width = config.hidden_size
        self.keys = np.zeros((self.num_heads, self.max_tokens, width // self.num_heads), dtype=np.float32)
        self.values = np.zeros_like(self.keys)
        self.start()

    def start(self, loop: list[float] | None = None, logit_map: tuple[float, float] = (1.0, 0.0)) -> None:
        """A new round; `loop`: its `loop_features(...)` (ignored unless the pre-verifier reads them); `logit_map`:
        (a, b) such that the rule decides on a * logit + b (an online calibration, `PacerStopRule`)."""
        self.scale_logits, self.shift_logits = logit_map
        self.rows = self.position
        if self.loop_proj is not None:  # numba, not numpy: a BLAS call between two target forwards costs ≈ 70 µs
            state = np.array(loop if loop is not None else [0.0, 0.0, 0.0], dtype=np.float32)
            self.rows = _round_rows(self.position, state, *self.loop_proj, self.loop_rows)
        self.length = 0

    def add(self, hidden: torch.Tensor, logits: torch.Tensor, token: int) -> float:
        """The acceptance logit of the round's next drafted token (`hidden (draft_hidden,)`, `logits (vocab,)`), as
        the pre-verifier gives it (the rule reads it mapped by `start`'s `logit_map`)."""
        n = self.length
        if n >= self.max_tokens:
            raise ValueError(f"{n + 1} drafted tokens exceed max_draft_tokens={self.max_tokens}.")
        self.length = n + 1
        logits = _array(logits)
        if self.mantissas.shape[0] != logits.shape[0]:  # scratch for the features' pass over the vocabulary
            self.mantissas = np.empty(logits.shape[0], dtype=np.float32)
            self.exponents = np.empty(logits.shape[0], dtype=np.int32)
        raw = _score(
            logits, self.mantissas, self.exponents, token, _array(hidden), self.rows[n], *self.hidden_proj,
            *self.feature_proj, *self.qkv, *self.out, *self.mlp_in, *self.mlp_out, *self.head, self.eps, self.keys,
            self.values, n, self.scale, self.features)
        self.logits[n] = self.scale_logits * raw + self.shift_logits
        return float(raw)

    def continues(self, round_seconds: np.ndarray, block_size: int, trim_per_token: float = -1.0) -> bool:
        """The expected-gain rule on the round scored so far, under measured round costs (seconds for
        k = 0..max_draft_tokens drafted tokens): what `PacerPreVerifier.decide` answers for them, compiled.
        `trim_per_token` >= 0: the trimming rule (greedy), a drafted token left out costing that much."""
        return bool(_continues(self.logits, self.length, block_size, self.max_tokens, round_seconds, trim_per_token))

    def best_prefix(self, round_seconds: np.ndarray, per_token: float) -> int:
        """How many of the round's drafted tokens to propose (greedy): `modeling_pacer.best_prefix`, compiled."""
        return int(_best_prefix(self.logits, self.length, round_seconds, per_token))


def _array(tensor: torch.Tensor) -> np.ndarray:
    """A float32 numpy view of a CPU tensor (a copy only when it is another dtype or not contiguous)."""
    if tensor.dtype != torch.float32:
        tensor = tensor.float()
    return tensor.contiguous().numpy()


def _linear(weights: dict, name: str) -> tuple[np.ndarray, np.ndarray]:
    return np.ascontiguousarray(weights[f"{name}.weight"].T), weights[f"{name}.bias"]


def _folded(weights: dict, norm: str, name: str) -> tuple[np.ndarray, np.ndarray]:
    """`LayerNorm(x) @ W.T + b` as `normalized(x) @ W'.T + b'`: the norm's affine folded into the linear."""
    gain, shift = weights[f"{norm}.weight"], weights[f"{norm}.bias"]
    matrix, bias = weights[f"{name}.weight"], weights[f"{name}.bias"]
    return np.ascontiguousarray((matrix * gain).T), (bias + matrix @ shift).astype(np.float32)
