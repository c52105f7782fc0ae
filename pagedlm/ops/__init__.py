"""Fused Triton kernels for the model's elementwise layers, each with a torch fallback: the public
functions run Triton on CUDA tensors and torch elsewhere; *_triton / *_torch pick one explicitly."""
from pagedlm.ops.activation import silu_and_mul
from pagedlm.ops.norm import fused_add_rms_norm, rms_norm
from pagedlm.ops.rotary import rotary_embedding

__all__ = ["fused_add_rms_norm", "rms_norm", "rotary_embedding", "silu_and_mul"]
