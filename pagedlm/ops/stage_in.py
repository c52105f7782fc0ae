"""Stage-in: a kernel copies a step's inputs from a pinned host staging set into the device set, for
the CUDA graphs of small decode batches, which launch it as their first node.

Why: a batch-1 step that copies its inputs with cudaMemcpyAsync and its sampled id back the same way
left the GPU idle ~20 µs between two graph replays (L2: 668.5 µs a step against 645.8 µs for the graph
alone, session 14 run 1): each copy is a copy-engine operation on the compute stream, with the
hand-overs between the engines around it. A kernel reads pinned host memory directly (unified
addressing: the host pointer is a device pointer), so the graph reads its inputs itself and the
step needs no copy-engine operation (the graph's argmax writes the sampled ids to pinned memory too:
ops/argmax.py).

The header (int64, in the staging set's head, written by the host before the launch): the number of
int32 words to copy (from the end of the head on, as StepBuffers.copy_from copies bytes), and the rows
and columns of the compact block table copied this step, which the kernel also writes into the
graphs' fixed-width block table (0 columns: the table did not change). The first `block` words (the
caller's choice: a steady step's sections fit in them) are loaded together with the header (one round
trip over the bus instead of two); later ones, and the table, in loops of `block` words. Host memory is
read with the .cv cache modifier (fetch again, cached system-memory lines count as stale): the host
rewrites a staging set every other step, so no line cached by an earlier read may be used.

Launched without PDL: it writes the buffers the previous step's kernels read, so it starts after
they have all finished, and every PDL kernel of the graph starts two or more launches after it
(pagedlm/ops/pdl.py, rules 1 and 3).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from pagedlm.ops.triton_compat import patch_interpreter

patch_interpreter()  # the loops' bounds are loaded values

BLOCK = 1024  # int32 words a loop iteration copies, by default
HEADER_WORDS = 3  # num_words, table rows, table columns


@triton.jit
def stage_in_kernel(
    header_ptr,  # int64 [HEADER_WORDS], host: words to copy, table rows, table columns
    src_ptr,  # int32 [capacity], host: the staging set past its head
    dst_ptr,  # int32 [capacity], device: the device set past its head
    table_src_ptr,  # int32 [rows * cols], host: the compact block table of this step's layout
    table_dst_ptr,  # int32 [>= rows, >= cols], device: the graphs' fixed-width block table
    stride_table, capacity,
    BLOCK: tl.constexpr,
):
    """One program: the copy of the header's word count, then the table rows (if any)."""
    offs = tl.arange(0, BLOCK)
    num_words = tl.load(header_ptr, cache_modifier=".cv").to(tl.int32)
    first = tl.load(src_ptr + offs, mask=offs < capacity, cache_modifier=".cv")  # with the header, before it is known
    tl.store(dst_ptr + offs, first, mask=offs < num_words)
    for start in range(BLOCK, num_words, BLOCK):
        words = start + offs
        in_range = words < num_words
        tl.store(dst_ptr + words, tl.load(src_ptr + words, mask=in_range, cache_modifier=".cv"), mask=in_range)
    num_cols = tl.load(header_ptr + 2, cache_modifier=".cv").to(tl.int32)
    num_elems = tl.load(header_ptr + 1, cache_modifier=".cv").to(tl.int32) * num_cols
    for start in range(0, num_elems, BLOCK):
        elems = start + offs
        in_range = elems < num_elems
        values = tl.load(table_src_ptr + elems, mask=in_range, cache_modifier=".cv")
        tl.store(table_dst_ptr + (elems // num_cols) * stride_table + elems % num_cols, values, mask=in_range)


def stage_in(header: torch.Tensor, src: torch.Tensor, dst: torch.Tensor, table_src: torch.Tensor,
             table_dst: torch.Tensor, block: int = BLOCK) -> None:
    """header: int64 [>= HEADER_WORDS] and src, table_src: int32, pinned host memory (CPU tensors under
    the Triton interpreter); dst: int32 [src's size], table_dst: int32 [max rows, max cols], device.
    Copies src[:header[0]] into dst, and table_src[:rows * cols] as [rows, cols] into table_dst's
    leading corner (rows, cols = header[1], header[2]), `block` words (a power of two) at a time.
    Reads the header when it runs, not now."""
    if header.dtype != torch.int64 or header.numel() < HEADER_WORDS:
        raise ValueError(f"header must be int64 with >= {HEADER_WORDS} entries; got {header.dtype} {tuple(header.shape)}")
    if not src.dtype == dst.dtype == table_src.dtype == table_dst.dtype == torch.int32:
        raise ValueError("src, dst, table_src and table_dst must be int32")
    if src.numel() != dst.numel() or table_dst.dim() != 2 or table_dst.stride(1) != 1:
        raise ValueError(f"src and dst must be of one size and table_dst 2-D with unit column stride; got "
                         f"{src.numel()}, {dst.numel()}, {tuple(table_dst.shape)}")
    stage_in_kernel[(1,)](header, src, dst, table_src, table_dst, table_dst.stride(0), src.numel(),
                          BLOCK=block, num_warps=4)
