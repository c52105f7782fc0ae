"""SiLU-and-multiply for gated MLPs: [..., 2d] (gate then up) -> [..., d] silu(gate) * up,
computed in float32 and rounded once. Triton on CUDA, torch elsewhere."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from pagedlm.ops import pdl
from pagedlm.ops.norm import as_rows

BLOCK_D = 1024


@triton.jit
def silu_and_mul_kernel(
    out_ptr,  # [N, d]
    x_ptr,  # [N, 2 * d]
    d,
    stride_o,
    stride_x,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr,
):
    """One program per (row, BLOCK columns)."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < d
    pdl.wait_for_producers(PDL)
    gate = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + d + cols, mask=mask, other=0.0).to(tl.float32)
    out = gate / (1.0 + tl.exp(-gate)) * up
    tl.store(out_ptr + row * stride_o + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """x: [..., 2 * d] -> [..., d]."""
    if x.is_cuda:
        return silu_and_mul_triton(x)
    return silu_and_mul_torch(x)


def silu_and_mul_torch(x: torch.Tensor) -> torch.Tensor:
    gate, up = x.float().chunk(2, dim=-1)
    return (torch.nn.functional.silu(gate) * up).to(x.dtype)


def silu_and_mul_triton(x: torch.Tensor) -> torch.Tensor:
    if x.shape[-1] % 2:
        raise ValueError(f"x's last dim must be even (gate and up halves); got {x.shape[-1]}")
    d = x.shape[-1] // 2
    x_2d = as_rows(x)  # [N, 2 * d]
    out = torch.empty(x_2d.shape[0], d, dtype=x.dtype, device=x.device)
    if out.numel() > 0:
        block = min(BLOCK_D, triton.next_power_of_2(d))
        silu_and_mul_kernel[(x_2d.shape[0], triton.cdiv(d, block))](
            out,
            x_2d,
            d,
            out.stride(0),
            x_2d.stride(0),
            BLOCK=block,
            num_warps=4,
            **pdl.launch_args(x.device),
        )
    return out.view(*x.shape[:-1], d)
