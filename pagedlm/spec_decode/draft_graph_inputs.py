"""The static input buffers of the draft model's CUDA graphs (draft_graphs.py): what a proposal
loads before it replays them, padded to the graph's rows.

Padding, as the target's graphs pad (worker/cuda_graphs.py): sequences past the proposal's S
have seq_len 0 and no query (query_start_loc flat), so the attention kernels skip them; tokens
past its own write no KV (slot -1, or no held column); their ids are of the vocabulary and
their positions below max_model_len (zeros at the capture, stale values after), so every
gather stays in range; their outputs are garbage, never read. A buffer's padding is written
for all its rows, so a proposal's load serves the graph of any size >= S; it is written again
only when S (or the rows a request) changes."""

from __future__ import annotations

import numpy as np
import torch

from pagedlm.attention.backend import AttentionMetadata
from pagedlm.spec_decode.draft_inputs import DraftBatch, SingleSteps, single_step_batch


def _host_copy(device_tensor: torch.Tensor) -> torch.Tensor:
    """A host copy for the metadata: on the CPU the tensor itself (the CPU backends read host
    copies, as the eager path's); on CUDA zeros of the capture (the Triton backend reads none
    of them in these graphs, and a replay could not refresh them)."""
    if device_tensor.device.type == "cpu":
        return device_tensor
    return torch.zeros(device_tensor.shape, dtype=device_tensor.dtype)


class SingleStepBuffers:
    """The single steps' inputs (draft_inputs.single_step_batch) for up to `rows` rows: each
    row's position [rows] (unclamped; the graph adds 1 after each step) and a SingleSteps of
    the static block table, the rows' held columns (0: padding), one query each."""

    def __init__(self, rows: int, block_table: torch.Tensor, max_model_len: int) -> None:
        device, int64 = block_table.device, dict(dtype=torch.int64, device=block_table.device)
        self.positions = torch.zeros(rows, **int64)
        self._max_model_len = max_model_len
        self._arange = torch.arange(rows + 1, dtype=torch.int32, device=device)
        query_start_loc = torch.zeros(rows + 1, dtype=torch.int32, device=device)
        self._steps = SingleSteps(
            block_table=block_table,
            cols_held=torch.zeros(rows, **int64),
            first_positions=self.positions,  # unread by single_step_batch
            query_start_loc=query_start_loc,
            max_seq_lens=torch.zeros(rows, **int64),
            host_query_start_loc=_host_copy(query_start_loc),
            host_seq_len_bounds=np.zeros(rows, dtype=np.int64),  # unread likewise
        )
        self._host_seq_lens = torch.zeros(rows, dtype=torch.int32)
        self._padded: int | None = None  # the S whose padding rows the buffers hold
        self.pad(0)

    def load(self, shared: SingleSteps) -> None:
        """shared: a proposal's S rows (eager draft_inputs.single_steps), draft 1 next."""
        num_rows = shared.cols_held.shape[0]
        torch.add(shared.first_positions, 1, out=self.positions[:num_rows])
        self._steps.cols_held[:num_rows].copy_(shared.cols_held)
        if self._padded != num_rows:
            self.pad(num_rows)

    def pad(self, num_rows: int) -> None:
        """Rows [num_rows, rows) padding: no held column, seq_len 0, no query."""
        steps, self._padded = self._steps, num_rows
        torch.clamp(self._arange, max=num_rows, out=steps.query_start_loc)
        steps.max_seq_lens.fill_(self._max_model_len)
        steps.max_seq_lens[num_rows:].zero_()
        steps.cols_held[num_rows:].zero_()
        if num_rows == 0:  # the capture's
            self.positions.zero_()

    def batch(self, ids: torch.Tensor, block_size: int) -> DraftBatch:
        """The single step over the first len(ids) rows (a graph's body), max_seq_len at
        max_model_len (the host ints of a graph: fixed)."""
        size, steps = ids.shape[0], self._steps
        shared = SingleSteps(
            block_table=steps.block_table[:size],
            cols_held=steps.cols_held[:size],
            first_positions=steps.first_positions[:size],
            query_start_loc=steps.query_start_loc[: size + 1],
            max_seq_lens=steps.max_seq_lens[:size],
            host_query_start_loc=steps.host_query_start_loc[: size + 1],
            host_seq_len_bounds=steps.host_seq_len_bounds[:size],
        )
        host_seq_lens = None if ids.device.type == "cpu" else self._host_seq_lens[:size]
        max_len = self._max_model_len
        return single_step_batch(
            shared, ids, self.positions[:size], block_size, max_len, max_len, host_seq_lens
        )


class FirstForwardBuffers:
    """The first forward's inputs (draft_inputs.first_forward_inputs) of a uniform step, every
    one of its S sequences sampling with r rows, for up to `rows` sequences of `tokens` rows
    in all, over the static block table."""

    def __init__(self, rows: int, tokens: int, block_table: torch.Tensor) -> None:
        device, int64 = block_table.device, dict(dtype=torch.int64, device=block_table.device)
        self.block_table = block_table  # [rows, C] int32
        self.input_ids = torch.zeros(tokens, **int64)
        self.positions = torch.zeros(tokens, **int64)  # clamped, as first_forward_inputs'
        self.slot_mapping = torch.zeros(tokens, **int64)
        self.query_start_loc = torch.zeros(rows + 1, dtype=torch.int32, device=device)
        self.seq_lens = torch.zeros(rows, dtype=torch.int32, device=device)
        self.logits_rows = torch.zeros(rows, **int64)  # the row of each one's draft 1
        self._host_query_start_loc = _host_copy(self.query_start_loc)
        self._host_seq_lens = _host_copy(self.seq_lens)
        self._padded: tuple[int, int] | None = None  # the (S, r) whose padding they hold
        self.pad(0, 1)

    def load(self, first: DraftBatch) -> None:
        """The eager first_forward_inputs of a uniform step (S sequences of r rows)."""
        meta = first.meta
        num_seqs, num_tokens = meta.num_seqs, meta.num_tokens
        self.input_ids[:num_tokens].copy_(first.input_ids)
        self.positions[:num_tokens].copy_(first.positions)
        self.slot_mapping[:num_tokens].copy_(meta.slot_mapping)
        self.query_start_loc[: num_seqs + 1].copy_(meta.query_start_loc)
        self.seq_lens[:num_seqs].copy_(meta.seq_lens)
        self.logits_rows[:num_seqs].copy_(first.logits_rows)
        num_cols = meta.block_table.shape[1]
        self.block_table[:num_seqs, :num_cols].copy_(meta.block_table)
        if self._padded != (num_seqs, meta.max_query_len):
            self.pad(num_seqs, meta.max_query_len)

    def pad(self, num_seqs: int, query_len: int) -> None:
        """Sequences [num_seqs, rows) and tokens [num_seqs x query_len, tokens) padding (the
        logits rows of padding sequences: row 0, in range)."""
        num_tokens, self._padded = num_seqs * query_len, (num_seqs, query_len)
        self.slot_mapping[num_tokens:].fill_(-1)
        self.query_start_loc[num_seqs + 1 :].fill_(num_tokens)
        self.seq_lens[num_seqs:].zero_()
        self.logits_rows[num_seqs:].zero_()
        if num_seqs == 0:  # the capture's
            self.input_ids.zero_()
            self.positions.zero_()
            self.query_start_loc.zero_()

    def inputs(
        self, num_seqs: int, query_len: int, max_model_len: int
    ) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata, torch.Tensor]:
        """The first num_seqs sequences of query_len rows each (a graph's body): input ids,
        positions [N], the metadata (host ints fixed: max_seq_len at max_model_len; the
        varlen kernel's query tiles), the logits rows [num_seqs]."""
        num_tokens = num_seqs * query_len
        meta = AttentionMetadata(
            num_tokens=num_tokens,
            num_seqs=num_seqs,
            max_query_len=query_len,
            max_seq_len=max_model_len,
            query_start_loc=self.query_start_loc[: num_seqs + 1],
            seq_lens=self.seq_lens[:num_seqs],
            slot_mapping=self.slot_mapping[:num_tokens],
            block_table=self.block_table[:num_seqs],
            query_start_loc_cpu=self._host_query_start_loc[: num_seqs + 1],
            seq_lens_cpu=self._host_seq_lens[:num_seqs],
            decode_order=None,
            num_decodes=0,
        )
        ids, positions = self.input_ids[:num_tokens], self.positions[:num_tokens]
        return ids, positions, meta, self.logits_rows[:num_seqs]
