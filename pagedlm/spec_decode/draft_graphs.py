"""CUDA graphs of the draft model (issue 26: the draft has graphs of its own), so that a
proposal launches a few graphs instead of the draft's layers, k times over.

Shapes (P, r) (draft_graph_shapes), P a decode capture size (SizePolicy.capture_sizes):
- r = 1: the single-token steps (draft_inputs.single_step_batch), draft j of each sampling
  request in, draft j + 1 out, one row a request: a proposal of k drafts replays one k - 1
  times. A step of S sampling requests has at least S sequences and takes the k of its
  sequence count (SpeculativeConfig.num_spec_tokens_for_batch), so P is captured when some
  batch of more sequences than the next smaller size drafts k >= 2.
- r >= 2: the first forward (draft_inputs.first_forward_inputs) of a uniform step, every one of
  its S sequences sampling with q = r - 1 inputs (q = 1 + n: its n drafts verified; q = 1:
  none): r rows each, draft 1 at each one's logits row. The shapes: each uniform target step's
  (P, q) at a size that drafts, q = 1 included (worker/spec_graphs.spec_graph_shapes). A ragged step (prefill
  chunks, requests that do not sample, other query lengths) runs its first forward eagerly.
A proposal of more requests than a shape's largest P, or of a shape not captured, runs eagerly.

Inputs: static buffers (draft_graph_inputs.py) that a proposal loads once, before the first
replay of each kind, padded to P: the ids [P] of each row's last draft, a block table of fixed
width (draft_inputs.max_table_cols; columns past the proposal's are stale and unread: no
position of it lies there), the single steps' positions and held columns, the first
forward's eager inputs copied. Each graph: the draft forward, its logits [P, V] float32 (the
first forward's at its logits rows) and their argmax (torch.argmax, as the eager path),
written over the ids: the next replay's inputs are this one's greedy drafts; a single step
then adds 1 to its positions. Probabilistic drafts: the graph also copies its logits into a
static buffer [P, V], from which the proposer draws after the replay, and writes the draws
over the ids (DraftModelProposer._replayed_step).

Host ints fixed per shape, as the target's graphs (worker/cuda_graphs.py, spec_graphs.py):
max_seq_len = max_model_len, so the split decode's split count is chosen at capture for the
longest context; the kernels read the real seq_lens on the device. The eager path chooses it
for the proposal's bounds, so its drafts agree with a replay's up to the float sums' order
(and the GEMMs' row count when S < P). On the CPU (tests: the bodies run without a capture)
the host copies are the tensors themselves, as on the eager path.

Memory: the target's decode graphs' pool (DecodeGraphs.capture: after them, so no replay of a
draft graph writes the target's live outputs); the graphs' outputs are static buffers, read
right after the replay in stream order. The graphs bind the draft's KV cache: they go and come
with the target's (the runner holds them in its DecodeGraphs, which the KV cache's allocation,
dummy steps on a cache of their own and sleep without kept addresses drop)."""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch

from pagedlm.model.llama import LlamaForCausalLM
from pagedlm.spec_decode.config import SpeculativeConfig
from pagedlm.spec_decode.draft_graph_inputs import FirstForwardBuffers, SingleStepBuffers
from pagedlm.spec_decode.draft_inputs import DraftBatch, SingleSteps
from pagedlm.worker.graph_capture import warmed_up_graph
from pagedlm.worker.sizes import SizePolicy, smallest_at_least
from pagedlm.worker.spec_graphs import spec_graph_shapes

Shape = tuple[int, int]  # (padded sequences P, rows a sequence r; r = 1: a single step)


def single_step_sizes(
    spec: SpeculativeConfig, max_num_seqs: int, capture_sizes: Sequence[int]
) -> list[int]:
    """The capture sizes (ascending) a proposal with single steps may pad to (module notes)."""
    drafting = [b for b in range(1, max_num_seqs + 1) if spec.num_spec_tokens_for_batch(b) >= 2]
    most = max(drafting, default=0)
    return [
        size for i, size in enumerate(capture_sizes) if (capture_sizes[i - 1] if i else 0) < most
    ]


def draft_graph_shapes(
    spec: SpeculativeConfig, max_num_seqs: int, sizes: SizePolicy
) -> list[Shape]:
    """The single steps' (P, 1), then the first forwards' (P, r), ascending (module notes)."""
    single = [(size, 1) for size in single_step_sizes(spec, max_num_seqs, sizes.capture_sizes)]
    first = [(size, q + 1) for size, q in spec_graph_shapes(spec, sizes, min_query_len=1)]
    return single + first


class DraftGraphs:
    """The graphs of one draft model over one KV cache (they bind its address). capture()
    once; per proposal, where its shapes are captured: load_first() and replay() of the first
    forward, load_single() and k - 1 replay()s of the single step."""

    def __init__(
        self,
        model: LlamaForCausalLM,
        kv_caches: list[torch.Tensor],
        shapes: Sequence[Shape],
        table_cols: int,
        block_size: int,
        max_model_len: int,
        keep_logits: bool,
    ) -> None:
        """shapes: draft_graph_shapes'; table_cols: the static table's width
        (max_table_cols); keep_logits: probabilistic drafts (the proposer draws from a
        replay's logits)."""
        self.shapes = list(shapes)
        self._sizes: dict[int, list[int]] = {}  # rows a sequence -> its sizes, ascending
        for size, query_len in sorted(self.shapes):
            self._sizes.setdefault(query_len, []).append(size)
        self._model, self._kv_caches = model, kv_caches
        self._block_size, self._max_model_len = block_size, max_model_len
        rows, device = max(size for size, _ in self.shapes), kv_caches[0].device
        tokens = max(size * query_len for size, query_len in self.shapes)
        table = torch.zeros(rows, table_cols, dtype=torch.int32, device=device)
        self._ids = torch.zeros(rows, dtype=torch.int64, device=device)  # each row's last draft
        self._single = SingleStepBuffers(rows, table, max_model_len)
        self._first = FirstForwardBuffers(rows, tokens, table)
        vocab_size = model.config.vocab_size
        self._logits = (  # [rows, V] float32: the last replay's (probabilistic drafts)
            torch.zeros(rows, vocab_size, device=device) if keep_logits else None
        )
        self._graphs: dict[Shape, torch.cuda.CUDAGraph] = {}

    def single_shape(self, num_rows: int) -> Shape | None:
        """The single step's graph for num_rows sampling requests; None: none holds them."""
        size = smallest_at_least(self._sizes.get(1, ()), num_rows)
        return None if size is None else (size, 1)

    def first_shape(self, first: DraftBatch, num_samples: int) -> Shape | None:
        """The graph of a first forward (first_forward_inputs') where every sequence samples
        with the same rows (at least 2: its inputs and its next token); None: a ragged one, or
        none holds it."""
        meta, query_len = first.meta, first.meta.max_query_len
        if meta.num_seqs != num_samples or meta.num_tokens != num_samples * query_len:
            return None
        size = smallest_at_least(self._sizes.get(query_len, ()), num_samples)
        return None if size is None else (size, query_len)

    def load_first(self, first: DraftBatch) -> None:
        """A uniform first forward's inputs (eager first_forward_inputs) in the buffers."""
        self._first.load(first)

    def load_single(self, shared: SingleSteps, token_ids: torch.Tensor) -> None:
        """The single steps' inputs: shared (the proposal's S rows, eager single_steps) and
        draft 1 token_ids [S]."""
        num_rows, num_cols = shared.block_table.shape
        self._ids[:num_rows].copy_(token_ids)
        self._first.block_table[:num_rows, :num_cols].copy_(shared.block_table)
        self._single.load(shared)

    def replay(self, shape: Shape) -> torch.Tensor | None:
        """The graph of `shape` over the loaded inputs: its argmax over the ids (ids()) ->
        its logits [P, V] float32 (keep_logits; else None), valid until the next replay."""
        self._graphs[shape].replay()
        return None if self._logits is None else self._logits[: shape[0]]

    def ids(self, num_rows: int) -> torch.Tensor:
        """[num_rows] int64: each row's last draft (the argmax of the last replay, or what the
        proposer wrote over it); a single step's next inputs."""
        return self._ids[:num_rows]

    def capture(self, pool: tuple[int, int]) -> None:
        """On the current (capture) stream, most rows first (the smaller reuse their pool
        blocks), each after a warm-up run (Triton's compile, cuBLAS's workspace) over an
        all-padding batch: no KV is read or written."""
        for shape in sorted(self.shapes, key=lambda pr: (pr[0] * pr[1], pr), reverse=True):
            self._graphs[shape] = warmed_up_graph(functools.partial(self.run, shape), pool)
        self._single.pad(0)  # the capture's runs moved the positions
        self._ids.zero_()

    def run(self, shape: Shape) -> None:
        """What the graph of `shape` holds (module notes; the capture run's tensors are the
        graph's); on the CPU the same, uncaptured (tests)."""
        size, query_len = shape
        ids = self._ids[:size]
        if query_len == 1:
            batch = self._single.batch(ids, self._block_size)
            hidden = self._model(batch.input_ids, batch.positions, self._kv_caches, batch.meta)
        else:
            input_ids, positions, meta, rows = self._first.inputs(
                size, query_len, self._max_model_len
            )
            hidden = self._model(input_ids, positions, self._kv_caches, meta).index_select(0, rows)
        logits = self._model.compute_logits(hidden)  # [size, V] float32
        torch.argmax(logits, dim=-1, out=ids)  # a single step's after its embedding read them
        if query_len == 1:
            self._single.positions[:size].add_(1)
        if self._logits is not None:
            self._logits[:size].copy_(logits)
