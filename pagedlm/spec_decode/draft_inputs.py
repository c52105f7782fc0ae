"""The draft model's batches, laid out on the device from the target's step, with no host sync.

The draft's KV cache has the target's block ids: token position t of a request lives at the same
slot in both caches, so the draft needs nothing from the scheduler but the target's block table.

After the target's step, request b (q_b query tokens at positions start_b .. seq_len_b - 1) has
emitted its tokens; its next token n_b (the last it emitted) lands at position start_b + v_b: the
first v_b of its inputs are verified. The draft then runs:

- the first forward (`first_forward_inputs`), every request of the step: its q_b inputs, plus one
  row for each sampling request (q_b + 1 rows), at positions start_b + j (contiguous, as attention
  needs). A sampling request's ids come from the proposer's token table, which holds the emitted
  tokens already (row v_b is n_b; its inputs may be placeholders the host did not know), the
  others' (prefill chunks, known to the host) from the step's inputs. The rows up to v_b write
  the draft's KV of verified tokens (all that later steps read); the rows past it write KV at
  positions the next step writes again before it reads them. Draft 1 is the logits at row v_b.
- k - 1 single-token steps (`single_step_inputs`) over the sampling requests, draft j at
  position start_b + v_b + j.

Positions reach seq_len_b + k - 1, past the blocks the request holds (vLLM's scheduler reserves
k lookahead slots for them): here a sampling request's columns after its own take scratch blocks
of the draft cache (`Scratch`), written and read within the proposal. A position in no block
(past the table, the null block) or at or past max_model_len gets slot -1: nothing is written
and that draft is only worse, never wrong (the target verifies every draft).

Host copies of the metadata: the first forward's are exact (the host knows the layout); a single
step's lengths depend on num_rejected, so on CUDA the host holds bounds (the Triton kernels read
the lengths on the device and only max_seq_len on the host) and on the CPU the device tensor
itself (the CPU backends read host lengths; there the device is the host)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from pagedlm.attention.backend import AttentionMetadata
from pagedlm.core.block_pool import NULL_BLOCK_ID


@dataclass(slots=True)
class DraftStep:
    """What the draft reads of one target step, after its tokens are in the token table."""

    meta: AttentionMetadata  # the target's: query_start_loc, seq_lens, block_table, host copies
    input_ids: torch.Tensor  # [T] int64: the target's inputs, right at least where none samples
    token_table: torch.Tensor  # [rows, W] int32: every row's tokens, this step's emitted ones too
    sample_rows: torch.Tensor  # [S] int64: each sampling request's row of the token table
    sample_seqs: torch.Tensor  # [S] int64: the batch index of each sampling request, ascending
    sample_seqs_np: np.ndarray  # [S] int64: the same on the host
    next_positions: torch.Tensor  # [S] int64: the position of each one's last emitted token


@dataclass(slots=True)
class DraftBatch:
    """One forward of the draft: its inputs and the rows whose logits give the drafts."""

    input_ids: torch.Tensor  # [N] int64
    positions: torch.Tensor  # [N] int64
    meta: AttentionMetadata
    logits_rows: torch.Tensor  # [S] int64: the row of each sampling request's draft
    cols_held: torch.Tensor  # [rows of meta.block_table] int64: the columns it may write in


def first_forward_inputs(
    step: DraftStep, block_size: int, max_model_len: int, scratch: Scratch
) -> DraftBatch:
    """The step's inputs and one more row for each sampling request (the module doc). A
    sampling request's seq_len is below max_model_len (its token lands there), so its extra row
    fits; the clamps only keep a malformed step inside the tables."""
    meta = step.meta
    num_seqs, device = meta.num_seqs, meta.query_start_loc.device
    qsl = meta.query_start_loc.long()  # [B + 1]
    query_lens = qsl[1:] - qsl[:-1]  # [B]
    extra = torch.zeros(num_seqs, dtype=torch.int64, device=device)
    extra.index_fill_(0, step.sample_seqs, 1)  # [B]: 1 where the request samples
    qsl_out = torch.cat([qsl[:1], qsl[1:] + extra.cumsum(0)])  # [B + 1]
    starts = meta.seq_lens.long() - query_lens  # [B]: each request's first input position
    num_rows = meta.num_tokens + step.sample_seqs_np.shape[0]
    rows = torch.arange(num_rows, device=device)  # [N]
    seq = torch.searchsorted(qsl_out[1:], rows, right=True).clamp_(max=num_seqs - 1)  # [N]
    offset = rows - qsl_out[seq]  # [N]: the row's index in its request
    positions = starts[seq] + offset  # [N]
    source = qsl[seq] + torch.minimum(offset, query_lens[seq] - 1)  # [N]: a target row
    input_ids = _input_ids(step, extra, seq, positions, source)  # [N]
    sample_starts = qsl_out.index_select(0, step.sample_seqs)  # [S]
    verified = step.next_positions - starts.index_select(0, step.sample_seqs)  # [S]: v_b
    logits_rows = torch.minimum(
        sample_starts + verified, qsl_out.index_select(0, step.sample_seqs + 1) - 1
    )  # [S]
    table, cols_held = draft_block_table(meta, step.sample_seqs, block_size, scratch)
    host_qsl, host_seq_lens = _host_layout(meta, step.sample_seqs_np, max_model_len)
    out_meta = AttentionMetadata(
        num_tokens=num_rows,
        num_seqs=num_seqs,
        max_query_len=int(np.diff(host_qsl).max()),
        max_seq_len=int(host_seq_lens.max()),
        query_start_loc=qsl_out.to(torch.int32),
        seq_lens=(meta.seq_lens.long() + extra).clamp_(max=max_model_len).to(torch.int32),
        slot_mapping=slot_mapping(table, cols_held, seq, positions, block_size, max_model_len),
        block_table=table,
        query_start_loc_cpu=torch.from_numpy(host_qsl),
        seq_lens_cpu=torch.from_numpy(host_seq_lens),
    )
    clamped = positions.clamp(max=max_model_len - 1)
    return DraftBatch(input_ids, clamped, out_meta, logits_rows, cols_held)


def _input_ids(
    step: DraftStep,
    samples: torch.Tensor,
    seq: torch.Tensor,
    positions: torch.Tensor,
    source: torch.Tensor,
) -> torch.Tensor:
    """[N] int64: a sampling request's rows from the token table (its inputs may be tokens the
    host did not know, and its extra row is the token it just emitted), the others' from the
    step's inputs (source [N]: a target row of the same request)."""
    table_row = torch.zeros_like(samples).index_copy_(0, step.sample_seqs, step.sample_rows)
    width = step.token_table.shape[1]
    from_table = step.token_table[table_row[seq], positions.clamp(max=width - 1)].long()
    return torch.where(samples[seq] > 0, from_table, step.input_ids.index_select(0, source))


def _host_layout(
    meta: AttentionMetadata, sample_seqs_np: np.ndarray, max_model_len: int
) -> tuple[np.ndarray, np.ndarray]:
    """The first forward's query_start_loc [B + 1] and seq_lens [B] (int32) on the host."""
    extra = np.zeros(meta.num_seqs, dtype=np.int64)
    extra[sample_seqs_np] = 1
    query_start_loc = meta.query_start_loc_cpu.numpy() + np.concatenate([[0], extra.cumsum()])
    seq_lens = np.minimum(meta.seq_lens_cpu.numpy() + extra, max_model_len)
    return query_start_loc.astype(np.int32), seq_lens.astype(np.int32)


@dataclass(frozen=True, slots=True)
class Scratch:
    """The draft cache's blocks past the pool's: num_cols a sampling request, for its positions
    past the blocks it holds (the scheduler reserves no lookahead slots). Their KV is written
    and read within one proposal only: the next step's first forward writes those positions
    again, in the blocks the request then holds."""

    first_block: int  # the pool's block count: scratch block ids start there
    num_cols: int  # cdiv(k, block_size) a sampling request; 0: none (a step that drafts nothing)


def draft_block_table(
    meta: AttentionMetadata, sample_seqs: torch.Tensor, block_size: int, scratch: Scratch
) -> tuple[torch.Tensor, torch.Tensor]:
    """The draft's table [B, C'] int32 and the leading columns [B] int64 it may write in. The
    step's table covers each request's positions; a request surely holds the blocks of its
    seq_len positions only (entries past them may name blocks a rejected tail gave back: the
    worker cuts its rows without clearing them). Sampling request i takes scratch blocks
    first_block + i * num_cols + e in the num_cols columns after its own."""
    table = meta.block_table
    cols_held = torch.div(meta.seq_lens.long() + block_size - 1, block_size, rounding_mode="floor")
    # every request's columns, its extra row's and its scratch
    num_cols = max(
        -(-meta.max_seq_len // block_size) + scratch.num_cols,
        -(-(meta.max_seq_len + 1) // block_size),
    )
    table = torch.nn.functional.pad(table, (0, max(num_cols - table.shape[1], 0)))  # a copy
    if scratch.num_cols == 0 or sample_seqs.shape[0] == 0:
        return table, cols_held
    extra = torch.arange(scratch.num_cols, device=table.device)  # [E]
    rows = sample_seqs[:, None].expand(-1, scratch.num_cols)  # [S, E]
    cols = cols_held.index_select(0, sample_seqs)[:, None] + extra  # [S, E]
    order = torch.arange(sample_seqs.shape[0], device=table.device)[:, None]  # [S, 1]
    ids = scratch.first_block + order * scratch.num_cols + extra  # [S, E]
    table.index_put_((rows, cols), ids.to(table.dtype))
    return table, cols_held.index_add_(
        0, sample_seqs, torch.full_like(sample_seqs, scratch.num_cols)
    )


@dataclass(slots=True)
class SingleSteps:
    """What the k - 1 single-token steps share: the sampling requests' rows of the table. A CUDA
    graph's (draft_graphs.py) are static buffers of its padded size, rows [S, P) padding."""

    block_table: torch.Tensor  # [S, C'] int32
    cols_held: torch.Tensor  # [S] int64: the leading columns that hold each request's blocks
    first_positions: torch.Tensor  # [S] int64: where each request's next token landed
    query_start_loc: torch.Tensor  # [S + 1] int32: one query each (a padding row: none)
    max_seq_lens: torch.Tensor  # [S] int64: max_model_len (a padding row: 0, it attends to nothing)
    host_query_start_loc: torch.Tensor  # [S + 1] int32, on the host
    host_seq_len_bounds: np.ndarray  # [S] int64: at least each next token's seq_len


def single_steps(step: DraftStep, first: DraftBatch, max_model_len: int) -> SingleSteps:
    num_samples = step.sample_seqs_np.shape[0]
    device = first.positions.device
    host_seq_lens = first.meta.seq_lens_cpu.numpy()[step.sample_seqs_np]
    return SingleSteps(
        block_table=first.meta.block_table.index_select(0, step.sample_seqs),
        cols_held=first.cols_held.index_select(0, step.sample_seqs),
        first_positions=first.positions.index_select(0, first.logits_rows),
        query_start_loc=torch.arange(num_samples + 1, dtype=torch.int32, device=device),
        max_seq_lens=torch.full((num_samples,), max_model_len, dtype=torch.int64, device=device),
        host_query_start_loc=torch.arange(num_samples + 1, dtype=torch.int32),
        host_seq_len_bounds=host_seq_lens.astype(np.int64),
    )


def single_step_inputs(
    shared: SingleSteps, token_ids: torch.Tensor, j: int, block_size: int, max_model_len: int
) -> DraftBatch:
    """Draft j + 1 (1 <= j < k) of each sampling request from token_ids [S] (draft j), at the
    next token's position + j (the eager path; host copies of bounds, or on the CPU of the
    device tensors themselves)."""
    bounds = np.minimum(shared.host_seq_len_bounds + j, max_model_len)  # [S]
    on_host = token_ids.device.type == "cpu"
    host_seq_lens = None if on_host else torch.from_numpy(bounds.astype(np.int32))
    positions = shared.first_positions + j  # [S]
    return single_step_batch(
        shared, token_ids, positions, block_size, max_model_len, int(bounds.max()), host_seq_lens
    )


def single_step_batch(
    shared: SingleSteps,
    token_ids: torch.Tensor,
    positions: torch.Tensor,
    block_size: int,
    max_model_len: int,
    max_seq_len: int,
    host_seq_lens: torch.Tensor | None,
) -> DraftBatch:
    """One single-token step: token_ids [S] at positions [S] (unclamped), device work only (a
    CUDA graph's body too). max_seq_len, host_seq_lens: the host copies (None: seq_lens itself,
    on the CPU)."""
    num_rows = token_ids.shape[0]
    rows = torch.arange(num_rows, device=token_ids.device)
    slots = slot_mapping(
        shared.block_table, shared.cols_held, rows, positions, block_size, max_model_len
    )
    clamped = positions.clamp(max=max_model_len - 1)
    seq_lens = torch.minimum(clamped + 1, shared.max_seq_lens).to(torch.int32)  # [S]
    meta = AttentionMetadata(
        num_tokens=num_rows,
        num_seqs=num_rows,
        max_query_len=1,
        max_seq_len=max_seq_len,
        query_start_loc=shared.query_start_loc,
        seq_lens=seq_lens,
        slot_mapping=slots,
        block_table=shared.block_table,
        query_start_loc_cpu=shared.host_query_start_loc,
        seq_lens_cpu=seq_lens if host_seq_lens is None else host_seq_lens,
    )
    return DraftBatch(token_ids, clamped, meta, rows, shared.cols_held)


def slot_mapping(
    block_table: torch.Tensor,
    cols_held: torch.Tensor,
    seq: torch.Tensor,
    positions: torch.Tensor,
    block_size: int,
    max_model_len: int,
) -> torch.Tensor:
    """[N] int64 slots of (seq [N], positions [N]) in block_table [B, C]; -1 where the request
    holds no block for the position (past cols_held [B] or the table's columns, the null block)
    or past max_model_len."""
    num_cols = block_table.shape[1]
    col = torch.div(positions, block_size, rounding_mode="floor")  # [N]
    block = block_table[seq, col.clamp(max=num_cols - 1)].long()  # [N]
    slots = block * block_size + positions % block_size
    held = (col < cols_held[seq]) & (col < num_cols) & (block != NULL_BLOCK_ID)
    return torch.where(held & (positions < max_model_len), slots, -1)


def max_table_cols(max_model_len: int, block_size: int, k: int) -> int:
    """The widest table draft_block_table makes for proposals of at most k drafts: a request's
    columns of max_model_len positions (the target's table), then the more of its scratch
    columns and its extra row's one."""
    return -(-max_model_len // block_size) + max(-(-k // block_size), 1)
