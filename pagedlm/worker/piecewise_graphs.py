"""Piecewise CUDA graphs: the model's forward for a step that replays no decode graph (a prefill
or mixed batch, or a decode batch above the largest decode-graph size), cut at each attention
call. Everything between two attention calls (norms, GEMMs, RoPE and the KV-cache write, the MLP)
is one graph per padded token count; the attention runs eagerly between them with the step's own
metadata, so any mix of prompts and decodes takes the same pieces (vLLM's piecewise graphs).

Why: an eager forward is ~10 launches a layer, each through Python, torch and Triton's launcher, so
a short prompt of a small model costs the host many times its GPU time (benchmarks/first_token.py;
benchmarks/RESULTS.md, "Measured choices"). Replaying 29 pieces and launching 28 attentions costs
the host a few hundred µs.

Capture (per size P, largest first, all in one memory pool, after a warm-up run of that size):
every layer's attention backend is swapped for a _Cutter, which ends the graph being captured,
notes the attention's inputs (an alias of q's pool memory, the layer's KV cache, scale and
window), begins the next graph and returns the static attention output, which the next piece
reads. The last piece ends with the final norm's output, the hidden states, which stay allocated
in the pool. The piecewise graphs are captured before the decode graphs (ModelRunner._new_graphs).

Sizes (the runner's SizePolicy, sizes.piecewise_sizes): powers of two up to 128 tokens, then 8 a
doubling up to 2,048, so that padding above 128 rows costs at most 1/8 of a step's GEMMs. After the
capture keep_fastest times each size's pieces and drops a size that the next kept larger one replays
markedly faster (the rule and timing of the decode graphs, sizes.fastest_sizes: cuBLAS picks a poor
kernel at some row counts); --no-graph-size-timing keeps every size.

Inputs: static ids, positions and slots (one row per KV cache group: a model of sliding and full
layers writes each layer's KV through its group's slots, worker/group_tables.py) of this module,
filled for each replay (rows [n, P) get slot -1: prepare_qkv skips their KV write, so a padding row never touches the cache; their other
values are stale and their output rows are never read: every op inside a piece is row-independent).
The attention reads the step's metadata of its layer's group and writes rows [0, n) of the
static output.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from pagedlm.attention.backend import AttentionBackend, AttentionMetadata
from pagedlm.model.llama import LlamaAttention, LlamaForCausalLM, model_kv_groups
from pagedlm.worker import cuda_graphs
from pagedlm.worker.sizes import Moves, SizePolicy


@dataclass(frozen=True, slots=True)
class _Attention:
    """One attention call between two pieces, as captured."""

    q: torch.Tensor  # [P, num_heads, head_dim]: an alias of the pool memory the piece writes q to
    kv_cache: torch.Tensor
    scale: float
    sliding_window: int | None
    kv_group: int  # its layer's KV cache group: whose metadata the replay hands it


@dataclass(slots=True)
class _Pieces:
    """The graphs of one size: graphs[i] runs up to attentions[i]; the last one to the end."""

    graphs: list[torch.cuda.CUDAGraph]
    attentions: list[_Attention]
    hidden: torch.Tensor | None = None  # [P, hidden_size], in the pool


class _Cutter:
    """Every layer's attention backend while a size is warmed up or captured."""

    def __init__(
        self,
        pieces: _Pieces,
        out: torch.Tensor,
        pool: tuple[int, int] | None,
        group_of: Callable[[AttentionMetadata], int],
    ) -> None:
        self._pieces, self._out, self._pool = pieces, out, pool  # pool None: the warm-up run
        self._group_of = group_of  # the KV cache group of the metadata a layer hands over

    def attend(
        self,
        q: torch.Tensor,
        kv_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
        sliding_window: int | None,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if self._pool is not None:
            group = self._group_of(meta)
            self._pieces.attentions.append(
                _Attention(_alias(q), kv_cache, scale, sliding_window, group)
            )
            self._pieces.graphs[-1].capture_end()
            graph = torch.cuda.CUDAGraph()
            self._pieces.graphs.append(graph)
            graph.capture_begin(pool=self._pool)
        return self._out[: q.shape[0]]


def _alias(t: torch.Tensor) -> torch.Tensor:
    """A tensor over t's memory that does not keep it allocated (as torch's own cudagraph trees
    alias pool memory): once the model drops q, the pool gives its memory to the next pieces, which
    a replay runs only after this attention read it. Holding q itself would keep every layer's q of
    every size allocated (~1 GB for llama3-8b). torch._C._construct_storage_from_data_pointer is
    private: checked on torch 2.11 (the GPU machine) and 2.13."""
    storage = t.untyped_storage()
    alias = torch._C._construct_storage_from_data_pointer(
        storage.data_ptr(), t.device, storage.nbytes()
    )
    return torch.empty(0, dtype=t.dtype, device=t.device).set_(
        alias, t.storage_offset(), t.shape, t.stride()
    )


class PiecewiseGraphs:
    """capture() once; then replay(size, ...) for a step of at most size tokens, size one of `sizes`."""

    def __init__(
        self,
        model: LlamaForCausalLM,
        backend: AttentionBackend,
        kv_caches: list[torch.Tensor],
        sizes: SizePolicy,
        device: torch.device,
    ) -> None:
        """sizes: the runner's, whose piecewise sizes these graphs are (captured, then kept by
        keep_fastest)."""
        self._sizes = sizes
        self.max_size = sizes.max_piecewise_size
        self._model, self._backend, self._kv_caches = model, backend, kv_caches
        config = model.config
        self._ids = torch.zeros(self.max_size, dtype=torch.int64, device=device)  # [P_max]
        self._positions = torch.zeros(self.max_size, dtype=torch.int64, device=device)  # [P_max]
        num_groups = len(model_kv_groups(config))
        # [G, P_max]: each KV cache group's slots (worker/group_tables.py)
        self._slots = torch.full((num_groups, self.max_size), -1, dtype=torch.int64, device=device)
        # [P_max, num_heads, head_dim]: every layer's attention output, which the next piece reads
        self._out = torch.zeros(
            self.max_size, config.num_heads, config.head_dim, dtype=config.dtype, device=device
        )
        # what the pieces read of a captured step's metadata: slot_mapping (the rest is never read)
        self._capture_meta = AttentionMetadata(
            num_tokens=0,
            num_seqs=1,
            max_query_len=0,
            max_seq_len=0,
            query_start_loc=torch.zeros(2, dtype=torch.int32, device=device),
            seq_lens=torch.zeros(1, dtype=torch.int32, device=device),
            slot_mapping=self._slots[0],
            block_table=torch.zeros(1, 1, dtype=torch.int32, device=device),
            query_start_loc_cpu=torch.zeros(2, dtype=torch.int32),
            seq_lens_cpu=torch.zeros(1, dtype=torch.int32),
        )
        self._capture_meta.groups = tuple(
            dataclasses.replace(self._capture_meta, slot_mapping=slots, plans={})
            for slots in self._slots[1:]
        )
        self._pieces: dict[int, _Pieces] = {}

    @property
    def sizes(self) -> list[int]:
        """The token counts captured and replayed (the policy's piecewise sizes), ascending."""
        return self._sizes.piecewise_sizes

    @torch.inference_mode()
    def capture(self, stream: torch.cuda.Stream) -> None:
        device = self._ids.device
        pool = torch.cuda.graph_pool_handle()
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream), _attention_swapped(self._model) as swap:
            for size in reversed(self.sizes):
                swap(_Cutter(_Pieces([], []), self._out, None, self._group_of))
                self._run(size)  # warm-up: Triton compiles, cuBLAS's workspace on this stream
                pieces = _Pieces([torch.cuda.CUDAGraph()], [])
                swap(_Cutter(pieces, self._out, pool, self._group_of))
                pieces.graphs[0].capture_begin(pool=pool)
                try:
                    pieces.hidden = self._run(size)
                finally:  # not again after a failed capture_end: the first error is the one to see
                    if torch.cuda.is_current_stream_capturing():
                        pieces.graphs[-1].capture_end()
                self._pieces[size] = pieces
        torch.cuda.current_stream(device).wait_stream(stream)

    def keep_fastest(self) -> Moves:
        """Times each size's pieces over padding rows (GEMMs and elementwise work at that size; no
        attention); the size policy keeps the fastest sizes (SizePolicy.keep_fastest_piecewise: a size
        goes when the next kept larger one replays markedly faster, as cuBLAS picks a poor kernel at
        some row counts) and the others' pieces go. Start-up only: it waits for the GPU. -> each size
        dropped: (the size its steps now replay, its ms, that size's ms)."""
        self._slots.fill_(-1)  # no KV write
        times = cuda_graphs.least_times_ms(self.sizes, self._replay_pieces, self._ids.device)
        moves = self._sizes.keep_fastest_piecewise(times)
        for size in moves:
            del self._pieces[size]
        return moves

    def _replay_pieces(self, size: int) -> None:
        for graph in self._pieces[size].graphs:
            graph.replay()

    def replay(
        self, size: int, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata
    ) -> torch.Tensor:
        """size: the policy's piecewise_size(n); input_ids, positions: [n] of the step (n =
        meta.num_tokens), its KV slots in meta.slot_mapping -> [n, hidden_size] hidden states, in the
        pool (valid until the next replay)."""
        n = meta.num_tokens
        self._ids[:n].copy_(input_ids)
        self._positions[:n].copy_(positions)
        group_metas = (meta, *meta.groups)
        for slots, group_meta in zip(self._slots, group_metas):
            slots[:n].copy_(group_meta.slot_mapping)
        if n < size:
            self._slots[:, n:size].fill_(-1)
        out = self._out[:n]
        pieces = self._pieces[size]
        for graph, attention in zip(pieces.graphs, pieces.attentions):
            graph.replay()
            self._backend.attend(
                attention.q[:n],
                attention.kv_cache,
                group_metas[attention.kv_group],
                attention.scale,
                attention.sliding_window,
                out=out,
            )
        pieces.graphs[-1].replay()
        return pieces.hidden[:n]

    def _run(self, size: int) -> torch.Tensor:
        """The model over the first `size` static rows (every slot -1 at capture: no KV write)."""
        meta = self._capture_meta
        for group_meta, slots in zip((meta, *meta.groups), self._slots):
            group_meta.num_tokens, group_meta.slot_mapping = size, slots[:size]
        return self._model(self._ids[:size], self._positions[:size], self._kv_caches, meta)

    def _group_of(self, meta: AttentionMetadata) -> int:
        """The KV cache group of one of the capture's metadata (the layers pick their group's)."""
        groups = self._capture_meta.groups
        return next((1 + g for g, group in enumerate(groups) if group is meta), 0)


@contextlib.contextmanager
def _attention_swapped(model: LlamaForCausalLM) -> Iterator[Callable[[object], None]]:
    """Yields swap(backend), which sets every attention layer's backend; the originals come back on exit."""
    layers = [m for m in model.modules() if isinstance(m, LlamaAttention)]
    saved = [layer.attn_backend for layer in layers]

    def swap(backend: object) -> None:
        for layer in layers:
            layer.attn_backend = backend

    try:
        yield swap
    finally:
        for layer, backend in zip(layers, saved):
            layer.attn_backend = backend
