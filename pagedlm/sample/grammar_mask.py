"""Structured outputs' token bitmask applied to the logits in place: logits[indices[m], j] = -inf
where bit j of bitmask[m] is 0 (xgrammar's packing: word j // 32, bit j % 32, little end first).
A bitmask may be narrower than the vocabulary (the grammar's vocabulary is the tokenizer's, the
model's may be padded past it): the tokens past its words are banned.

On CUDA one Triton kernel (a program per (mask row, vocabulary block)) writes only the masked
entries, taking the rows as a device tensor: no sync. On the CPU xgrammar's own C++ loop (64 rows
of 49,152: 3-4x faster than the torch path, s21); the torch path, which unpacks the bits, is the
reference the GPU tests hold the kernel against.
"""

from __future__ import annotations

from collections.abc import Collection

import torch
import triton
import triton.language as tl

from pagedlm.ops.warm_up import WarmUpTarget

BLOCK_SIZE = 4096  # logits per program: 128 bitmask words
_TRITON_DEVICE_TYPES = frozenset({"cuda"})


@triton.jit(do_not_specialize=["bitmask_stride"])  # its width is the tokenizer's: one compile
def _apply_bitmask_kernel(
    logits_ptr,
    bitmask_ptr,
    indices_ptr,
    vocab_size,
    logits_stride,
    bitmask_stride,
    BLOCK: tl.constexpr,
):
    mask_row = tl.program_id(0)
    start = tl.program_id(1) * BLOCK
    logits_row = tl.load(indices_ptr + mask_row).to(tl.int64)
    words = tl.load(
        bitmask_ptr + mask_row * bitmask_stride + start // 32 + tl.arange(0, BLOCK // 32),
        mask=start // 32 + tl.arange(0, BLOCK // 32) < bitmask_stride,
        other=0,
    )  # [BLOCK / 32] int32
    banned = ((words[:, None] >> tl.arange(0, 32)[None, :]) & 1) == 0  # [BLOCK / 32, 32]
    banned = tl.reshape(banned, (BLOCK,))
    offsets = start + tl.arange(0, BLOCK)
    tl.store(
        logits_ptr + logits_row * logits_stride + offsets,
        float("-inf"),
        mask=banned & (offsets < vocab_size),
    )


def apply_grammar_bitmask(
    logits: torch.Tensor,
    indices: torch.Tensor,
    bitmask: torch.Tensor,
    triton_device_types: Collection[str] = _TRITON_DEVICE_TYPES,
) -> None:
    """logits [N, V] float32 (rows contiguous), indices [M] int64 (distinct rows of logits),
    bitmask [M, W] int32 contiguous, W <= ceil(V / 32), all on logits' device. In place."""
    num_rows, vocab_size = indices.shape[0], logits.shape[1]
    if logits.device.type in triton_device_types:
        grid = (num_rows, triton.cdiv(vocab_size, BLOCK_SIZE))
        _apply_bitmask_kernel[grid](
            logits,
            bitmask,
            indices,
            vocab_size,
            logits.stride(0),
            bitmask.stride(0),
            BLOCK=BLOCK_SIZE,
        )
        return
    if logits.device.type == "cpu":
        _apply_on_cpu(logits, indices, bitmask)
        return
    allowed = unpack_bitmask(bitmask, vocab_size)  # [M, V] bool
    rows = logits.index_select(0, indices).masked_fill_(~allowed, float("-inf"))
    logits.index_copy_(0, indices, rows)


def _apply_on_cpu(logits: torch.Tensor, indices: torch.Tensor, bitmask: torch.Tensor) -> None:
    """xgrammar's CPU kernel, whose indices address the bitmask's rows as the logits': the rows
    go into an all-allowing [N, ceil(V / 32)] mask (1/32 of the logits' bytes), zero past W."""
    import xgrammar as xgr

    num_words = triton.cdiv(logits.shape[1], 32)
    rows = torch.zeros(bitmask.shape[0], num_words, dtype=torch.int32)
    rows[:, : bitmask.shape[1]] = bitmask
    full = torch.full((logits.shape[0], num_words), -1, dtype=torch.int32)
    full.index_copy_(0, indices, rows)
    xgr.apply_token_bitmask_inplace(logits, full, indices=indices.tolist(), backend="cpu")


def unpack_bitmask(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[M, W] int32 -> [M, vocab_size] bool, True where allowed (False past W words)."""
    shifts = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    bits = (bitmask[:, :, None] >> shifts) & 1  # [M, W, 32]
    bits = bits.reshape(bitmask.shape[0], -1)[:, :vocab_size].bool()  # [M, min(32 W, V)]
    allowed = torch.zeros(bitmask.shape[0], vocab_size, dtype=torch.bool, device=bitmask.device)
    allowed[:, : bits.shape[1]] = bits
    return allowed


def warm_up(target: WarmUpTarget) -> None:
    """ops/warm_up.py: the kernel at the model's vocabulary size (its one specialisation)."""
    device = target.device
    logits = torch.zeros(2, target.vocab_size, device=device)
    bitmask = torch.full((1, triton.cdiv(target.vocab_size, 32)), -1, dtype=torch.int32)
    indices = torch.ones(1, dtype=torch.int64, device=device)
    apply_grammar_bitmask(logits, indices, bitmask.to(device))
