"""The pre-verifier's torch paths, shared by the single-row stop rule and the batched loop's (`stop_rule.py`).

Drafted tokens are collected until a block is full; then the pre-verifier scores the block over the round's cached
keys and values, and the round's acceptance logits are read back to the host once, for the decision. Used where the
compiled CPU scorer (`preverifier_kernel`) cannot run: a draft on an accelerator, and batches.

- `BlockScorer`: the eager forward (any device).
- `GraphBlockScorer`: CUDA. A block's work as eager torch is dozens of small kernels (the draft-distribution
  features of every token, then the layer), each a launch of a few microseconds: on a GPU whose target step is
  launch-bound that is a fifth of a round. Here each drafted token costs three copies into static buffers, and each
  block one replay of a CUDA graph captured per (rows, block index): features, layer and logits together. Rows
  are padded to a power of two, so a batch whose rows end one by one replays the graphs it has.
"""

from __future__ import annotations

import os
import threading
import time
import weakref

import torch

from ..modeling_pacer import PacerPreVerifier, draft_features


class BlockScorer:
    """`start(loops)` opens a round; `add(hidden, raw_logits, tokens)` records one drafted token per row and, when a
    block is full, returns the acceptance logits of every token drafted this round, (rows, tokens so far) on the host."""

    path = "torch"

    def __init__(self, preverifier: PacerPreVerifier):
        self.preverifier = preverifier
        self.block_size = preverifier.config.block_size
        self.reads_loop = bool(getattr(preverifier.config, "loop_features", False))
        self.start(None)

    def start(self, loops: list[list[float]] | None) -> None:
        """A new round; `loops`: each row's `loop_features(...)` (read when the config says `loop_features`)."""
        self.hidden: list[torch.Tensor] = []
        self.features: list[torch.Tensor] = []
        self.past = None
        self.logits: torch.Tensor | None = None
        device = self.preverifier.device
        self.loop = torch.tensor(loops, device=device) if self.reads_loop and loops is not None else None

    @torch.no_grad()
    def add(self, hidden: torch.Tensor, raw_logits: torch.Tensor, tokens: torch.Tensor) -> list[list[float]] | None:
        self.hidden.append(hidden)
        self.features.append(draft_features(raw_logits, tokens))  # 3 numbers a token: no logits are kept
        if len(self.hidden) < self.block_size:
            return None
        device = self.preverifier.device
        out = self.preverifier(torch.stack(self.hidden, 1).to(device), torch.stack(self.features, 1).to(device),
                               cache=self.past, loop_features=self.loop)
        self.hidden, self.features, self.past = [], [], out.cache
        self.logits = out.logits if self.logits is None else torch.cat((self.logits, out.logits), 1)
        return self.logits.float().tolist()


class _Buffers:
    """Static tensors of one rows count: the round's inputs, the layer's keys and values, the logits out."""

    def __init__(self, preverifier: PacerPreVerifier, rows: int, vocab: int):
        config, device, dtype = preverifier.config, preverifier.device, preverifier.dtype
        length, heads = config.max_draft_tokens, config.num_attention_heads
        width = config.draft_hidden_size if config.input_mode != "features" else 0  # features only: no hidden read
        self.hidden = torch.zeros(rows, length, width, device=device, dtype=dtype)
        self.logits = torch.zeros(rows, config.block_size, vocab, device=device)  # the block's raw draft logits
        self.tokens = torch.zeros(rows, length, dtype=torch.long, device=device)
        self.loop = torch.zeros(rows, 3, device=device, dtype=dtype)
        self.keys = torch.zeros(rows, heads, length, config.hidden_size // heads, device=device, dtype=dtype)
        self.values = torch.zeros_like(self.keys)
        self.out = torch.zeros(rows, length, device=device, dtype=torch.float32)


class GraphBlockScorer:
    """`BlockScorer` on CUDA with the block's work captured as CUDA graphs (module docstring).

    Equal to `BlockScorer` up to float rounding (tests/test_device_paths.py). The graphs read the pre-verifier's
    parameters where they are when captured: `for_preverifier` recaptures after they move or are replaced, and an
    in-place update (training) is seen by the next replay. `take_seconds` reports the scorer's own time: host work
    plus the graphs' device time, not the wait for the draft's queued kernels that reading a block back absorbs.
    """

    path = "graph"
    _CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # pre-verifier -> {(thread, key): scorer}

    @classmethod
    def for_preverifier(cls, preverifier: PacerPreVerifier) -> GraphBlockScorer:
        """The scorer of `preverifier` for this thread, its graphs kept across calls while its weights stay put."""
        key = tuple((p.data_ptr(), p.dtype, p.device) for p in preverifier.parameters())
        scorers = cls._CACHE.setdefault(preverifier, {})
        thread = threading.get_ident()
        scorer = scorers.get(thread)
        if scorer is None or scorer.key != key:
            scorer = scorers[thread] = cls(preverifier, key)
        return scorer

    def __init__(self, preverifier: PacerPreVerifier, key: tuple = ()):
        if preverifier.device.type != "cuda":
            raise ValueError(f"GraphBlockScorer runs on CUDA; the pre-verifier is on {preverifier.device}.")
        # weakly: the class cache maps the pre-verifier to this scorer, and a strong reference back would keep both
        self._preverifier, self.key = weakref.ref(preverifier), key
        self.block_size = preverifier.config.block_size
        self.reads_loop = bool(getattr(preverifier.config, "loop_features", False))
        # a features-only pre-verifier (the default one) reads no hidden state: any draft's width is fine
        self.reads_hidden = preverifier.config.input_mode != "features"
        self.buffers: dict[tuple[int, int], _Buffers] = {}  # (rows bucket, vocab) -> static tensors
        self.graphs: dict[tuple[int, int, int], torch.cuda.CUDAGraph] = {}  # (rows bucket, vocab, block) -> graph
        self.pool = torch.cuda.graph_pool_handle()  # replays run one at a time on one stream: one pool serves all
        self.events = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
        self.rows, self.bucket, self.n, self.loops = 1, 1, 0, None
        self.pending_gpu, self.waited = False, 0.0

    @property
    def preverifier(self) -> PacerPreVerifier:
        return self._preverifier()

    def start(self, loops: list[list[float]] | None) -> None:
        """A new round; `loops`: each row's `loop_features(...)` (their count is the round's rows)."""
        self.n, self.loops = 0, loops
        self.rows = len(loops) if loops is not None else 1
        self.bucket = 1 << (self.rows - 1).bit_length()  # the graphs' rows: the next power of two

    def _buffers(self, vocab: int) -> _Buffers:
        key = (self.bucket, vocab)
        if key not in self.buffers:
            self.buffers[key] = _Buffers(self.preverifier, self.bucket, vocab)
        return self.buffers[key]

    @torch.no_grad()
    def add(self, hidden: torch.Tensor, raw_logits: torch.Tensor, tokens: torch.Tensor) -> list[list[float]] | None:
        vocab = raw_logits.shape[-1]
        buffers, i = self._buffers(vocab), self.n
        rows = self.rows
        if i == 0 and self.reads_loop:
            buffers.loop[:rows].copy_(torch.tensor(self.loops or [[0.0, 0.0, 0.0]], dtype=buffers.loop.dtype))
        if i >= buffers.tokens.shape[1]:
            raise ValueError(f"{i + 1} drafted tokens exceed max_draft_tokens={buffers.tokens.shape[1]}.")
        if self.reads_hidden:
            buffers.hidden[:rows, i].copy_(hidden)
        buffers.logits[:rows, i % self.block_size].copy_(raw_logits)
        buffers.tokens[:rows, i].copy_(tokens)
        self.n = i + 1
        if self.n % self.block_size:
            return None
        block = self.n // self.block_size - 1
        graph = self.graphs.get((self.bucket, vocab, block)) or self._capture(buffers, vocab, block)
        self.events[0].record()
        graph.replay()
        self.events[1].record()
        self.pending_gpu = True
        start = time.perf_counter()
        logits = buffers.out[:rows, : self.n].tolist()  # the one read back of the block
        self.waited += time.perf_counter() - start
        return logits

    def take_seconds(self, host_seconds: float) -> float:
        """The scorer's own share of `host_seconds` of the caller's time (see the class docstring)."""
        seconds = host_seconds - self.waited
        if self.pending_gpu:
            seconds += self.events[0].elapsed_time(self.events[1]) / 1000
        self.pending_gpu, self.waited = False, 0.0
        return max(seconds, 0.0)

    def _capture(self, buffers: _Buffers, vocab: int, block: int) -> torch.cuda.CUDAGraph:
        """Capture block `block`'s scoring for this rows count (warmed up on a side stream first, as CUDA requires)."""
        pv, size = self.preverifier, self.block_size
        start, end = block * size, (block + 1) * size

        def score() -> None:
            features = draft_features(buffers.logits, buffers.tokens[:, start:end])
            past = (buffers.keys[:, :, :start], buffers.values[:, :, :start]) if start else None
            out = pv(buffers.hidden[:, start:end], features, cache=past,
                     loop_features=buffers.loop if self.reads_loop else None)
            buffers.keys[:, :, start:end].copy_(out.cache[0][:, :, start:end])
            buffers.values[:, :, start:end].copy_(out.cache[1][:, :, start:end])
            buffers.out[:, start:end].copy_(out.logits)

        graph, side = torch.cuda.CUDAGraph(), torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):  # idempotent: it rewrites this block's keys, values and logits from the inputs
                score()
            # capture_begin, not `torch.cuda.graph`: no garbage collection and cache flush in the middle of a call;
            # thread_local: PEARL's draft worker may capture while the target runs in another thread
            graph.capture_begin(pool=self.pool, capture_error_mode="thread_local")
            try:
                score()
            finally:
                graph.capture_end()
        torch.cuda.current_stream().wait_stream(side)
        self.graphs[(self.bucket, vocab, block)] = graph
        return graph


def scorer_for(preverifier: PacerPreVerifier, draft_device: torch.device | None) -> BlockScorer | GraphBlockScorer:
    """The torch scoring path for blocks drafted on `draft_device`: CUDA graphs where draft and pre-verifier share a
    CUDA device (unless the environment sets PACER_HF_CUDA_GRAPHS=0, for debugging), else the eager forward."""
    device = torch.device(draft_device) if draft_device is not None else preverifier.device
    graphs = os.environ.get("PACER_HF_CUDA_GRAPHS", "1") != "0"
    if graphs and device.type == "cuda" and preverifier.device == device:
        return GraphBlockScorer.for_preverifier(preverifier)
    return BlockScorer(preverifier)
