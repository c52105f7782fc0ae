"""CUDA graphs of the draft model's single-token steps (draft_inputs.single_step_batch): draft j
of each sampling request in, draft j + 1 out, one row a request, so a proposal of k drafts
replays one graph k - 1 times instead of launching the draft's layers eagerly each time.

Sizes (draft_graph_sizes): one graph per decode capture size P (SizePolicy.capture_sizes) that
a proposal with single steps may pad to: a step of S sampling requests has at least S sequences
and takes the k of its sequence count (SpeculativeConfig.num_spec_tokens_for_batch), so a size
is captured when some batch of more sequences than the next smaller size drafts k >= 2. A
proposal of more requests than the largest size runs eagerly.

Static inputs (load, before the first replay of a proposal): the ids [P] of each row's draft
j, its position [P] (unclamped), and a SingleSteps of P rows: the sampling requests' rows of the
first forward's table in a table of fixed width (draft_inputs.max_table_cols; columns past the
proposal's are stale and unread: no position of it lies there), their held columns, one query
each. Padding rows [S, P): no held column (slot -1: nothing written), seq_len 0 and no query
(query_start_loc flat at S), which the decode kernels skip; their ids and positions are stale
(ids of the vocabulary, positions clamped), their outputs garbage and never read.

Each graph: single_step_batch over the static buffers, the draft forward, its logits [P, V]
float32 and their argmax (torch.argmax, as the eager path), written over the ids: the next
replay's inputs are this one's greedy drafts; then positions + 1. Probabilistic drafts: the
graph keeps its logits (in the pool) and the proposer draws from them after the replay and
writes the draws over the ids (DraftModelProposer.propose).

Host ints fixed per size, as the target's decode graphs (worker/cuda_graphs.py): max_seq_len =
max_model_len, so the split decode's split count is chosen at capture for the longest context;
the kernels read the real seq_lens on the device. The eager path chooses it for the proposal's
bounds, so its drafts agree with a replay's up to the float sums' order (and the GEMMs' row
count when S < P). On the CPU (tests: the body runs without a capture) the host copies are the
tensors themselves, as on the eager path.

Memory: the target's decode graphs' pool (DecodeGraphs.capture: after them, so no replay of a
draft graph writes the target's live outputs); a replay's logits are valid until the next
replay of any graph in the pool, and the proposer reads them right after it, in stream order.
The graphs bind the draft's KV cache: they go and come with the target's (the runner holds
them in its DecodeGraphs, which the KV cache's allocation, dummy steps on a cache of their own
and sleep without kept addresses drop)."""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np
import torch

from pagedlm.model.llama import LlamaForCausalLM
from pagedlm.spec_decode.config import SpeculativeConfig
from pagedlm.spec_decode.draft_inputs import SingleSteps, single_step_batch
from pagedlm.worker.graph_capture import warmed_up_graph
from pagedlm.worker.sizes import smallest_at_least


def draft_graph_sizes(
    spec: SpeculativeConfig, max_num_seqs: int, capture_sizes: Sequence[int]
) -> list[int]:
    """The capture sizes (ascending) a proposal with single steps may pad to (module notes)."""
    drafting = [b for b in range(1, max_num_seqs + 1) if spec.num_spec_tokens_for_batch(b) >= 2]
    most = max(drafting, default=0)
    return [
        size for i, size in enumerate(capture_sizes) if (capture_sizes[i - 1] if i else 0) < most
    ]


class DraftGraphs:
    """The single-step graphs of one draft model over one KV cache (they bind its address).
    capture() once; per proposal load(), then replay() k - 1 times."""

    def __init__(
        self,
        model: LlamaForCausalLM,
        kv_caches: list[torch.Tensor],
        sizes: Sequence[int],
        table_cols: int,
        block_size: int,
        max_model_len: int,
        keep_logits: bool,
    ) -> None:
        """sizes: ascending; table_cols: the static table's width (max_table_cols);
        keep_logits: probabilistic drafts (the proposer draws from a replay's logits)."""
        self.sizes = list(sizes)
        self._model, self._kv_caches = model, kv_caches
        self._block_size, self._max_model_len = block_size, max_model_len
        self._keep_logits = keep_logits
        rows, device = self.sizes[-1], kv_caches[0].device
        self._on_host = device.type == "cpu"  # host copies: the tensors themselves
        int64 = dict(dtype=torch.int64, device=device)
        query_start_loc = torch.zeros(rows + 1, dtype=torch.int32, device=device)
        # host copies of the capture's batch: the Triton backend reads none of them here
        host_query_start_loc = (
            query_start_loc if self._on_host else torch.zeros(rows + 1, dtype=torch.int32)
        )
        self._ids = torch.zeros(rows, **int64)  # [P]: each row's last draft
        self._positions = torch.zeros(rows, **int64)  # [P]: the position of that draft
        self._arange = torch.arange(rows + 1, dtype=torch.int32, device=device)
        self._steps = SingleSteps(
            block_table=torch.zeros(rows, table_cols, dtype=torch.int32, device=device),
            cols_held=torch.zeros(rows, **int64),
            first_positions=self._positions,  # unread by the graphs (single_step_batch)
            query_start_loc=query_start_loc,
            max_seq_lens=torch.zeros(rows, **int64),
            host_query_start_loc=host_query_start_loc,
            host_seq_len_bounds=np.zeros(rows, dtype=np.int64),
        )
        self._host_seq_lens = torch.zeros(rows, dtype=torch.int32)
        self._loaded_rows: int | None = None  # S of the padding rows the buffers hold
        self._graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self._logits: dict[int, torch.Tensor] = {}  # [P, V] float32, in the pool (keep_logits)

    def size(self, num_rows: int) -> int | None:
        """The graph a proposal of num_rows sampling requests replays; None above the largest."""
        return smallest_at_least(self.sizes, num_rows)

    def load(self, shared: SingleSteps, token_ids: torch.Tensor, size: int) -> None:
        """The proposal's inputs: shared (its S rows, eager single_steps) and draft 1 token_ids
        [S], in the static buffers of the graph of `size` (>= S); padding rows past S."""
        num_rows, num_cols = shared.block_table.shape
        self._ids[:num_rows].copy_(token_ids)
        torch.add(shared.first_positions, 1, out=self._positions[:num_rows])
        steps = self._steps
        steps.block_table[:num_rows, :num_cols].copy_(shared.block_table)
        steps.cols_held[:num_rows].copy_(shared.cols_held)
        if self._loaded_rows != num_rows:  # the padding rows of S (of any size: the largest's)
            self._pad(num_rows)

    def replay(self, size: int) -> torch.Tensor | None:
        """One single step of the loaded proposal: the graph's argmax over the ids (ids()) and
        positions + 1 -> its logits [size, V] float32 (keep_logits; else None)."""
        self._graphs[size].replay()
        return self._logits.get(size)

    def ids(self, num_rows: int) -> torch.Tensor:
        """[num_rows] int64: each row's last draft (the argmax of the last replay, or what the
        proposer wrote over it); the next replay's inputs."""
        return self._ids[:num_rows]

    def capture(self, pool: tuple[int, int]) -> None:
        """On the current (capture) stream, largest first (the smaller reuse its pool blocks),
        each after a warm-up run (Triton's compile, cuBLAS's workspace) over an all-padding
        batch: no KV is read or written."""
        self._pad(0)
        for size in reversed(self.sizes):
            self._graphs[size] = warmed_up_graph(functools.partial(self._run, size), pool)
        self._pad(0)  # the capture's runs moved the positions

    def _run(self, size: int) -> None:
        """What a graph holds (module notes); the capture run's tensors are the graph's."""
        steps = self._steps
        shared = SingleSteps(
            block_table=steps.block_table[:size],
            cols_held=steps.cols_held[:size],
            first_positions=steps.first_positions[:size],
            query_start_loc=steps.query_start_loc[: size + 1],
            max_seq_lens=steps.max_seq_lens[:size],
            host_query_start_loc=steps.host_query_start_loc[: size + 1],
            host_seq_len_bounds=steps.host_seq_len_bounds[:size],
        )
        ids, positions = self._ids[:size], self._positions[:size]
        batch = single_step_batch(
            shared,
            ids,
            positions,
            self._block_size,
            self._max_model_len,
            self._max_model_len,
            None if self._on_host else self._host_seq_lens[:size],
        )
        hidden = self._model(batch.input_ids, batch.positions, self._kv_caches, batch.meta)
        logits = self._model.compute_logits(hidden)  # [size, V] float32
        torch.argmax(logits, dim=-1, out=ids)  # after the embedding read them
        positions.add_(1)
        if self._keep_logits:
            self._logits[size] = logits

    def _pad(self, num_rows: int) -> None:
        """Rows [num_rows, largest) padding (module notes), rows below it live."""
        steps, self._loaded_rows = self._steps, num_rows
        torch.clamp(self._arange, max=num_rows, out=steps.query_start_loc)
        steps.max_seq_lens.fill_(self._max_model_len)
        steps.max_seq_lens[num_rows:].zero_()
        steps.cols_held[num_rows:].zero_()
        if num_rows == 0:  # the capture: in-range ids and positions
            self._ids.zero_()
            self._positions.zero_()
