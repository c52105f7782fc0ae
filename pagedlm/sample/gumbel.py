"""Random draw: argmax(logits + G) with G = -log(E), E ~ Exp(1) from noise.py's hash. It is the
exponential trick argmax(probs / E) in log space (softmax is monotone), so no softmax is needed.
Triton on CUDA (hash, noise and argmax fused: one read of the logits), torch elsewhere."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from pagedlm.sample.noise import GOLDEN, MIX1, MIX2, UNIFORM_BITS, exponential_noise

_BLOCK = 2048


@triton.jit
def gumbel_argmax_kernel(
    best_score_ptr, best_id_ptr,  # [N, num_blocks]: each block's max of logits + G, and where
    logits_ptr,  # [N, V] float32
    keys_ptr,  # [N] int64
    vocab_size, stride_logits, num_blocks,
    GOLDEN: tl.constexpr, MIX1: tl.constexpr, MIX2: tl.constexpr, UNIFORM_BITS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """One program per (row, block of the vocabulary)."""
    row = tl.program_id(0).to(tl.int64)
    block = tl.program_id(1)
    cols = block * BLOCK + tl.arange(0, BLOCK)
    mask = cols < vocab_size
    logits = tl.load(logits_ptr + row * stride_logits + cols, mask=mask, other=float("-inf"))
    key = tl.load(keys_ptr + row).to(tl.uint64, bitcast=True)
    x = key + (cols + 1).to(tl.uint64) * GOLDEN  # uint64: wraps, shifts are logical
    x = (x ^ (x >> 30)) * MIX1
    x = (x ^ (x >> 27)) * MIX2
    x = x ^ (x >> 31)
    uniform = ((x >> (64 - UNIFORM_BITS)).to(tl.float32) + 0.5) * (1.0 / (1 << UNIFORM_BITS))
    score = tl.where(mask, logits - tl.log(-tl.log(uniform)), float("-inf"))
    best, where = tl.max(score, axis=0, return_indices=True)
    tl.store(best_score_ptr + row * num_blocks + block, best)
    tl.store(best_id_ptr + row * num_blocks + block, (block * BLOCK + where).to(tl.int64))


def gumbel_argmax(logits: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """logits [N, V] float32 (-inf: excluded), keys [N] int64 -> sampled ids [N] int64."""
    if logits.is_cuda:
        return gumbel_argmax_triton(logits, keys)
    return gumbel_argmax_torch(logits, keys)


def gumbel_argmax_torch(logits: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    gumbel = exponential_noise(keys, logits.shape[-1]).log_().neg_()  # [N, V]
    return gumbel.add_(logits).argmax(dim=-1)


def gumbel_argmax_triton(logits: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    num_rows, vocab_size = logits.shape
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    num_blocks = triton.cdiv(vocab_size, _BLOCK)
    best_score = torch.empty((num_rows, num_blocks), dtype=torch.float32, device=logits.device)
    best_id = torch.empty((num_rows, num_blocks), dtype=torch.int64, device=logits.device)
    gumbel_argmax_kernel[(num_rows, num_blocks)](
        best_score, best_id, logits, keys.contiguous(), vocab_size, logits.stride(0), num_blocks,
        GOLDEN=GOLDEN, MIX1=MIX1, MIX2=MIX2, UNIFORM_BITS=UNIFORM_BITS, BLOCK=_BLOCK, num_warps=8,
    )
    best_block = best_score.argmax(dim=-1, keepdim=True)  # [N, 1]
    return best_id.gather(1, best_block).squeeze(1)
