"""RMSNorm, plain and with a fused residual add, as HF Llama computes it: normalise in float32,
round to the input dtype, then scale by the weight. Triton on CUDA, torch elsewhere."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from pagedlm.ops import pdl


@triton.jit
def rms_norm_kernel(
    out_ptr,  # [N, hidden]
    residual_out_ptr,  # [N, hidden]: x + residual (written only if HAS_RESIDUAL)
    x_ptr,
    residual_ptr,  # [N, hidden]
    weight_ptr,  # [hidden]
    eps,
    hidden,
    stride_o,
    stride_ro,
    stride_x,
    stride_r,
    BLOCK: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    PDL: tl.constexpr,
):
    """One program per row."""
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < hidden
    weight = tl.load(weight_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    pdl.wait_for_producers(PDL)
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        residual = tl.load(residual_ptr + row * stride_r + offs, mask=mask, other=0.0).to(
            tl.float32
        )
        x = (x + residual).to(
            residual_out_ptr.dtype.element_ty
        )  # rounded like torch's x + residual
        tl.store(residual_out_ptr + row * stride_ro + offs, x, mask=mask)
        x = x.to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, 0) / hidden + eps)
    normed = (x * rstd).to(out_ptr.dtype.element_ty).to(tl.float32)
    tl.store(
        out_ptr + row * stride_o + offs, (normed * weight).to(out_ptr.dtype.element_ty), mask=mask
    )


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x: [..., hidden], weight: [hidden] -> [..., hidden] in x's dtype."""
    if x.is_cuda:
        return rms_norm_triton(x, weight, eps)
    return rms_norm_torch(x, weight, eps)


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x + residual), x + residual); x and residual [..., hidden], one dtype."""
    if x.is_cuda:
        return fused_add_rms_norm_triton(x, residual, weight, eps)
    return fused_add_rms_norm_torch(x, residual, weight, eps)


def rms_norm_torch(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x_fp32 = x.float()
    normed = (x_fp32 * torch.rsqrt(x_fp32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    return (normed * weight).to(x.dtype)


def fused_add_rms_norm_torch(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    new_residual = x + residual
    return rms_norm_torch(new_residual, weight, eps), new_residual


def rms_norm_triton(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    out, _ = _launch(x, None, weight, eps)
    return out


def fused_add_rms_norm_triton(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    if residual.shape != x.shape or residual.dtype != x.dtype:
        raise ValueError(
            f"residual must match x ({tuple(x.shape)}, {x.dtype}); "
            f"got {tuple(residual.shape)}, {residual.dtype}"
        )
    return _launch(x, residual, weight, eps)


def as_rows(x: torch.Tensor) -> torch.Tensor:
    """[..., d] -> [N, d] with unit stride along d (a view where possible)."""
    rows = x.reshape(-1, x.shape[-1])
    return rows if rows.stride(1) == 1 else rows.contiguous()


def _launch(
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor | None]:
    hidden = x.shape[-1]
    if weight.shape != (hidden,):
        raise ValueError(f"weight must be [{hidden}] (x's last dim); got {tuple(weight.shape)}")
    x_2d = as_rows(x)  # [N, hidden]
    out = torch.empty_like(x_2d)
    residual_2d = x_2d if residual is None else as_rows(residual)
    residual_out = out if residual is None else torch.empty_like(x_2d)
    if x_2d.shape[0] > 0:
        block = triton.next_power_of_2(hidden)
        rms_norm_kernel[(x_2d.shape[0],)](
            out,
            residual_out,
            x_2d,
            residual_2d,
            weight,
            eps,
            hidden,
            out.stride(0),
            residual_out.stride(0),
            x_2d.stride(0),
            residual_2d.stride(0),
            BLOCK=block,
            HAS_RESIDUAL=residual is not None,
            num_warps=min(max(block // 512, 1), 16),
            **pdl.launch_args(x.device),
        )
    new_residual = None if residual is None else residual_out.view(x.shape)
    return out.view(x.shape), new_residual
