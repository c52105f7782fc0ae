"""Stage-in: a kernel copies a step's inputs from a pinned host staging set into the device set, for
the CUDA graphs of small decode batches, which launch it as their first node.

Why: a step that copies its inputs with cudaMemcpyAsync (and its sampled id back the same way) leaves
the GPU idle between two graph replays: each copy is a copy-engine operation on the compute stream,
with the hand-overs between the engines around it. A kernel reads pinned host memory directly
(unified addressing: the host pointer is a device pointer), so the graph reads its inputs itself and
the step needs no copy-engine operation (the graph's argmax writes the sampled ids to pinned memory
too: ops/argmax.py). Measured on L2: benchmarks/RESULTS.md, "Measured choices".

The header (int64, in the staging set's head, written by the host before the launch) is the number of
int32 words to copy, from the end of the head on, as StepBuffers.copy_from copies bytes. The first
`block` words (the caller's choice: a steady step's sections fit in them) are loaded together with the
header, one round trip over the bus; any later ones in a loop, a round trip each. So the runner stages
only steps that copy no block table (a batch of 8 at a 32k context brings 64 KB of table: a copy then
costs far less than ~128 round trips). Host memory is read with the .cv cache modifier (fetch again,
cached system-memory lines count as stale): the host rewrites a staging set every other step, so no
line cached by an earlier read may be used (volatile loads of a 4 KB first block were slower).

Launched without PDL: it writes the buffers the previous step's kernels read, so it starts after
they have all finished, and every PDL kernel of the graph starts two or more launches after it
(pagedlm/ops/pdl.py, rules 1 and 3).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from pagedlm.ops.triton_compat import patch_interpreter

patch_interpreter()  # the loop's bound is a loaded value

BLOCK = 1024  # int32 words a loop iteration copies, by default


@triton.jit
def stage_in_kernel(
    header_ptr,  # int64 [1], host: the number of words to copy
    src_ptr,  # int32 [capacity], host: the staging set past its head
    dst_ptr,  # int32 [capacity], device: the device set past its head
    capacity,
    BLOCK: tl.constexpr,
):
    """One program: src[:num_words] into dst."""
    offs = tl.arange(0, BLOCK)
    num_words = tl.load(header_ptr, cache_modifier=".cv").to(tl.int32)
    first = tl.load(
        src_ptr + offs, mask=offs < capacity, cache_modifier=".cv"
    )  # with the header, before it is known
    tl.store(dst_ptr + offs, first, mask=offs < num_words)
    for start in range(BLOCK, num_words, BLOCK):
        words = start + offs
        in_range = words < num_words
        tl.store(
            dst_ptr + words,
            tl.load(src_ptr + words, mask=in_range, cache_modifier=".cv"),
            mask=in_range,
        )


def stage_in(
    header: torch.Tensor, src: torch.Tensor, dst: torch.Tensor, block: int = BLOCK
) -> None:
    """header: int64 [>= 1] and src: int32, pinned host memory (CPU tensors under the Triton interpreter);
    dst: int32 [src's size], device. Copies src[:header[0]] into dst, `block` words (a power of two) at
    a time. Reads the header when it runs, not now."""
    if header.dtype != torch.int64 or header.numel() < 1:
        raise ValueError(
            f"header must be int64 with >= 1 entry; got {header.dtype} {tuple(header.shape)}"
        )
    if not src.dtype == dst.dtype == torch.int32 or src.numel() != dst.numel():
        raise ValueError(
            f"src and dst must be int32 of one size; got {src.dtype} [{src.numel()}], "
            f"{dst.dtype} [{dst.numel()}]"
        )
    stage_in_kernel[(1,)](header, src, dst, src.numel(), BLOCK=block, num_warps=4)
