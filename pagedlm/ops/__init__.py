"""Fused Triton kernels for the model's elementwise layers, each with a torch fallback: the public
functions run Triton on CUDA tensors and torch elsewhere; *_triton / *_torch pick one explicitly.
(RoPE is torch only here: on CUDA it is fused into pagedlm.attention.prepare_qkv.)"""

from pagedlm.ops.activation import silu_and_mul
from pagedlm.ops.norm import fused_add_rms_norm, rms_norm

__all__ = ["fused_add_rms_norm", "rms_norm", "silu_and_mul"]
