"""The greedy pick of a few rows of logits: each row's argmax over the vocabulary (ties to the
first index, as torch.argmax), returned and also written into a token table at given entries.

For the CUDA graphs of small decode batches (sizes.MAX_LOGITS_ROWS rows at most), which pick
their greedy tokens and write them into last_sampled. torch.argmax reduces a row in one block, several
times slower on a vocabulary-sized row (benchmarks/RESULTS.md, "Measured choices"), and index_copy_
then writes the table. Here two kernels: NUM_CHUNKS programs a row each reduce an interleaved
share of the row (blocks chunk, chunk + NUM_CHUNKS, ...) to its max and that max's first index;
one program a row reduces those and writes the id twice (three times with host_ids: pinned host memory,
which the CUDA graphs of ops/stage_in.py's steps read their ids from without a copy). NaN counts as
+inf (torch.argmax takes NaN as the largest value: the same pick unless a row holds +inf before its
first NaN), so the id is always in [0, V), even for a graph's padding rows, whose hidden states are
garbage.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from pagedlm.ops import pdl
from pagedlm.ops.triton_compat import patch_interpreter

patch_interpreter()  # the chunk loop's start is a program-id tensor

BLOCK = 512  # logits a program reads at a time
MAX_CHUNKS = 128  # programs a row (128 x 512 measured fastest of 32/64/128 chunks)


@triton.jit
def _load_keys(ptrs, mask):
    """Logits at ptrs as float32 comparison keys: NaN as +inf, -inf where masked off."""
    x = tl.load(ptrs, mask=mask, other=float("-inf")).to(tl.float32)
    return tl.where(x != x, float("inf"), x)


@triton.jit
def argmax_chunks_kernel(
    logits_ptr,  # [N, V]
    vals_ptr,  # [N, NUM_CHUNKS] float32: the chunk's max
    idx_ptr,  # [N, NUM_CHUNKS] int32: its first index (>= V for a chunk with no logit)
    vocab,
    stride_row,
    NUM_CHUNKS: tl.constexpr,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr,
):
    """One program per (row, chunk): blocks chunk, chunk + NUM_CHUNKS, ... of the row. Each lane
    keeps its first maximum (it sees its indices in increasing order and takes only a larger
    value), so the smallest index among the lanes holding the max is the chunk's first."""
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    row_ptr = logits_ptr + row.to(tl.int64) * stride_row
    offs = chunk * BLOCK + tl.arange(0, BLOCK)
    pdl.wait_for_producers(PDL)
    best = _load_keys(row_ptr + offs, offs < vocab)
    best_idx = offs
    for start in range((chunk + NUM_CHUNKS) * BLOCK, vocab, NUM_CHUNKS * BLOCK):
        offs = start + tl.arange(0, BLOCK)
        x = _load_keys(row_ptr + offs, offs < vocab)
        better = x > best
        best = tl.where(better, x, best)
        best_idx = tl.where(better, offs, best_idx)
    top = tl.max(best, 0)
    tl.store(vals_ptr + row * NUM_CHUNKS + chunk, top)
    tl.store(
        idx_ptr + row * NUM_CHUNKS + chunk, tl.min(tl.where(best == top, best_idx, 2147483647), 0)
    )


@triton.jit
def argmax_pick_kernel(
    vals_ptr,
    idx_ptr,  # [N, NUM_CHUNKS] each, from argmax_chunks_kernel
    ids_ptr,  # [N] int64 out
    table_ptr,  # int64: the token table
    table_rows_ptr,  # [N] int64: the table entry of each row (a step input)
    host_ids_ptr,  # [N] int64 out, pinned host memory (unused unless HOST_IDS)
    NUM_CHUNKS: tl.constexpr,
    HOST_IDS: tl.constexpr,
    PDL: tl.constexpr,
):
    """One program per row: the first index of the largest chunk max, into ids and the table (and
    host_ids)."""
    row = tl.program_id(0)
    table_row = tl.load(table_rows_ptr + row)
    pdl.wait_for_producers(PDL)
    chunks = row * NUM_CHUNKS + tl.arange(0, NUM_CHUNKS)
    vals = tl.load(vals_ptr + chunks)
    idx = tl.load(idx_ptr + chunks)
    pick = tl.min(tl.where(vals == tl.max(vals, 0), idx, 2147483647), 0).to(tl.int64)
    tl.store(ids_ptr + row, pick)
    tl.store(table_ptr + table_row, pick)
    if HOST_IDS:
        tl.store(host_ids_ptr + row, pick)


def greedy_pick(
    logits: torch.Tensor,
    table: torch.Tensor,
    table_rows: torch.Tensor,
    host_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """logits [N, V] -> [N] int64, each row's argmax, also written into table[table_rows]
    (table: int64 [M]; table_rows: [N] int64, entries < M) and, if given, into host_ids[:N] (int64,
    pinned host memory). Triton on CUDA, torch elsewhere."""
    _check(logits, table, table_rows, host_ids)
    if logits.is_cuda:
        return greedy_pick_triton(logits, table, table_rows, host_ids)
    ids = logits.argmax(dim=-1)
    table.index_copy_(0, table_rows, ids)
    if host_ids is not None:
        host_ids[: ids.shape[0]].copy_(ids)
    return ids


def greedy_pick_triton(
    logits: torch.Tensor,
    table: torch.Tensor,
    table_rows: torch.Tensor,
    host_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    num_rows, vocab = logits.shape
    num_chunks = min(MAX_CHUNKS, triton.next_power_of_2(triton.cdiv(vocab, BLOCK)))
    vals = torch.empty(num_rows, num_chunks, dtype=torch.float32, device=logits.device)
    idx = torch.empty(num_rows, num_chunks, dtype=torch.int32, device=logits.device)
    ids = torch.empty(num_rows, dtype=torch.int64, device=logits.device)
    if num_rows == 0:
        return ids
    launch = pdl.launch_args(logits.device)
    argmax_chunks_kernel[(num_rows, num_chunks)](
        logits,
        vals,
        idx,
        vocab,
        logits.stride(0),
        NUM_CHUNKS=num_chunks,
        BLOCK=BLOCK,
        num_warps=4,
        **launch,
    )
    argmax_pick_kernel[(num_rows,)](
        vals,
        idx,
        ids,
        table,
        table_rows,
        host_ids,
        NUM_CHUNKS=num_chunks,
        HOST_IDS=host_ids is not None,
        num_warps=1,
        **launch,
    )
    return ids


def _check(
    logits: torch.Tensor,
    table: torch.Tensor,
    table_rows: torch.Tensor,
    host_ids: torch.Tensor | None,
) -> None:
    if logits.dim() != 2 or logits.shape[1] == 0 or logits.stride(1) != 1:
        raise ValueError(
            f"logits must be [N, V >= 1] with stride 1 in V; got {tuple(logits.shape)}"
        )
    if table.dim() != 1 or table.dtype != torch.int64:
        raise ValueError(f"table must be 1-D int64; got {tuple(table.shape)} {table.dtype}")
    if table_rows.shape != (logits.shape[0],) or table_rows.dtype != torch.int64:
        raise ValueError(
            f"table_rows must be [N={logits.shape[0]}] int64; "
            f"got {tuple(table_rows.shape)} {table_rows.dtype}"
        )
    if host_ids is not None and (
        host_ids.dim() != 1
        or host_ids.dtype != torch.int64
        or host_ids.shape[0] < logits.shape[0]
        or host_ids.device.type != "cpu"
    ):
        raise ValueError(
            f"host_ids must be 1-D int64 host memory of >= {logits.shape[0]} entries; "
            f"got {tuple(host_ids.shape)} {host_ids.dtype} on {host_ids.device}"
        )
    if not logits.device == table.device == table_rows.device:
        raise ValueError(
            f"logits, table and table_rows must share a device; got {logits.device}, "
            f"{table.device}, {table_rows.device}"
        )
