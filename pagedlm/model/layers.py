"""Building blocks of the Llama family, one op per module. The elementwise ops come from
pagedlm.ops: fused Triton kernels on CUDA tensors, plain torch elsewhere. Parameters are
created uninitialised (torch.empty, in the model dtype): the loader fills every one of them.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from pagedlm import envs, ops
from pagedlm.model.quant_linear import Int4Matmul, Int8Matmul, QuantizedTensor, pack
from pagedlm.ops import gate_up_silu, gemv
from pagedlm.ops.gemv import PendingNorm, ResidualSum

# the residual add and the norms folded into the GEMVs around them (see Linear); PAGEDLM_FUSE_NORMS=0
# keeps them in the norm kernel, for A/B measurements. Read once: Linear.forward runs per layer.
FUSE_NORMS = envs.PAGEDLM_FUSE_NORMS


class Linear(nn.Module):
    """y = act(x) W^T (+ b), without nn.Linear's random init (the loader overwrites it anyway).
    act "silu_and_mul": x is [gate | up] and the product sees silu(gate) * up. On CUDA, batch-1 decode
    (K <= gemv.MAX_FMA_K) and small-batch decode on narrow outputs (gemv.prefer_gemv) go through the Triton
    GEMV, with the activation fused into its prologue; the rest through cuBLAS.

    Norm fusion (pagedlm/ops/gemv.py): x may be a PendingNorm, which the GEMV normalises in its
    prologue (cuBLAS gets it materialised first); given the residual, the GEMV path returns the
    ResidualSum y + residual, while cuBLAS returns y alone and leaves the add to the next norm."""

    def __init__(self, in_features: int, out_features: int, bias: bool, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = nn.Parameter(
            torch.empty(out_features, in_features, dtype=dtype), requires_grad=False
        )
        self.bias = (
            nn.Parameter(torch.empty(out_features, dtype=dtype), requires_grad=False)
            if bias
            else None
        )
        self.quant: Int4Matmul | Int8Matmul | None = None  # set by load_quantized

    def load_quantized(self, weight: QuantizedTensor) -> None:
        """Hold weight packed for the CPU's quantized kernels (quant_linear.py), not self.weight."""
        self.quant = pack(weight, self.weight.dtype)
        self.weight = None

    def forward(
        self,
        x: torch.Tensor | PendingNorm,
        act: str | None = None,
        residual: torch.Tensor | None = None,
        bias: bool = True,
    ) -> torch.Tensor | ResidualSum:
        """x: [T, in_features] ([T, 2 * in_features] with act) -> y [T, out_features], or (GEMV path,
        residual [T, out_features] given) the ResidualSum of y + residual. Without `bias` the bias
        is left out (a row-parallel layer adds it after its all-reduce)."""
        b = self.bias if bias else None
        if self.quant is not None:
            return self._quantized_forward(x, act, b)
        if takes_gemv(gemv.input_rows(x), self.weight):
            return gemv.gemv(x, self.weight, b, act=act, residual=residual if FUSE_NORMS else None)
        if isinstance(x, PendingNorm):
            x = x.materialize()
        if act is not None:
            x = ops.silu_and_mul(x)
        return F.linear(x, self.weight, b)

    def _quantized_forward(
        self, x: torch.Tensor | PendingNorm, act: str | None, bias: torch.Tensor | None
    ) -> torch.Tensor:
        if isinstance(x, PendingNorm):
            x = x.materialize()
        if act is not None:
            x = ops.silu_and_mul(x)
        y = self.quant(x)  # [T, out_features]
        return y if bias is None else y + bias

    def gated(self, x: torch.Tensor | PendingNorm) -> torch.Tensor | None:
        """For a gate_up projection (rows gate, then up): silu(x W_gate^T) * (x W_up^T) [T, out_features / 2]
        from the fused GEMM (ops/gate_up_silu.py) where it applies (prefill-sized 16-bit batches on CUDA),
        else None: the caller passes this layer's output to the next with act="silu_and_mul"."""
        if (
            self.quant is not None
            or isinstance(x, PendingNorm)
            or not gate_up_silu.takes_fused(x, self.weight, self.bias)
        ):
            return None
        return gate_up_silu.gate_up_silu(x, self.weight)


def takes_gemv(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether Linear sends x [T, K] @ weight [N, K].T to the Triton GEMV (else cuBLAS / torch)."""
    return x.is_cuda and gemv.prefer_gemv(x.shape[0], *weight.shape)


class Embedding(nn.Module):
    def __init__(self, num_embeddings: int, embedding_dim: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = nn.Parameter(
            torch.empty(num_embeddings, embedding_dim, dtype=dtype), requires_grad=False
        )
        self.quant: Int8Matmul | None = None  # set by load_quantized

    def load_quantized(self, weight: QuantizedTensor) -> None:
        """Hold weight as int8 rows (also the tied LM head's matmul), not self.weight."""
        self.quant = Int8Matmul(weight, self.weight.dtype)
        self.weight = None

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.quant is not None:
            return self.quant.rows(input_ids)  # [T, embedding_dim]
        return F.embedding(input_ids, self.weight)  # [T, embedding_dim]


class RMSNorm(nn.Module):
    """HF Llama RMSNorm (normalise in float32, scale in the input dtype), with an optional
    fused residual add: forward(x, residual) normalises x + residual and returns the sum too.
    Given a ResidualSum (the add already done by a GEMV), it only returns the norm as a PendingNorm
    for the next Linear to apply."""

    def __init__(self, hidden_size: int, eps: float, dtype: torch.dtype) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(hidden_size, dtype=dtype), requires_grad=False)

    def forward(
        self, x: torch.Tensor | ResidualSum, residual: torch.Tensor | None = None
    ) -> tuple[torch.Tensor | PendingNorm, torch.Tensor]:
        if isinstance(x, ResidualSum):
            return PendingNorm(x.h, x.sumsq, self.weight, self.eps), x.h
        if residual is None:
            return ops.rms_norm(x, self.weight, self.eps), x
        return ops.fused_add_rms_norm(x, residual, self.weight, self.eps)


def rope_inv_freq(
    head_dim: int,
    rope_theta: float,
    rope_scaling: dict | None,
    freq_factors: torch.Tensor | None = None,
) -> torch.Tensor:
    """[head_dim // 2] float32 inverse frequencies; plain, `linear` or `llama3` scaling, or llama.cpp's
    per-frequency factors (a GGUF's `rope_freqs`, [head_dim // 2]), which replace rope_scaling."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
    inv_freq = 1.0 / (rope_theta**exponents)
    rope_type = (rope_scaling or {}).get("rope_type", "default")
    if freq_factors is not None:
        return _inv_freq_from_factors(inv_freq, freq_factors, rope_type, rope_scaling)
    return _scaled_inv_freq(inv_freq, rope_type, rope_scaling)


def _inv_freq_from_factors(
    inv_freq: torch.Tensor, freq_factors: torch.Tensor, rope_type: str, rope_scaling: dict | None
) -> torch.Tensor:
    """llama.cpp divides each frequency by its factor (convert_hf_to_gguf writes llama3 RoPE scaling this
    way). A rope_scaling the config also claims must give the same frequencies: applying both would scale
    twice, and where they contradict, which one the model was trained with is unknown."""
    scaled = inv_freq / freq_factors.to(inv_freq.device, torch.float32)
    if rope_type == "default":
        return scaled
    claimed = _scaled_inv_freq(inv_freq, rope_type, rope_scaling)
    # rtol 1e-3: factors stored as float16 still agree
    if not torch.allclose(claimed, scaled, rtol=1e-3, atol=0.0):  # sync-ok: once, at model build
        raise ValueError(
            f"rope_scaling: the config's {rope_type} scaling {rope_scaling} disagrees with the "
            f"checkpoint's rope_freqs factors {freq_factors.tolist()}"
        )  # sync-ok: error path
    return scaled


def _scaled_inv_freq(
    inv_freq: torch.Tensor, rope_type: str, rope_scaling: dict | None
) -> torch.Tensor:
    if rope_type == "default":
        return inv_freq
    if rope_type == "linear":
        return inv_freq / rope_scaling["factor"]
    if rope_type == "llama3":
        return _llama3_inv_freq(inv_freq, rope_scaling)
    raise ValueError(
        f"rope_scaling: rope_type {rope_type!r} is not supported; "
        "supported: default, linear, llama3"
    )


def _llama3_inv_freq(inv_freq: torch.Tensor, scaling: dict) -> torch.Tensor:
    """Llama 3.1: long wavelengths divided by `factor`, short kept, a smooth blend between."""
    factor = scaling["factor"]
    low_freq_factor = scaling["low_freq_factor"]
    high_freq_factor = scaling["high_freq_factor"]
    old_context_len = scaling["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    blended = (1 - smooth) * inv_freq / factor + smooth * inv_freq
    scaled = torch.where(wavelen > old_context_len / low_freq_factor, inv_freq / factor, inv_freq)
    is_medium = (wavelen >= old_context_len / high_freq_factor) & (
        wavelen <= old_context_len / low_freq_factor
    )
    return torch.where(is_medium, blended, scaled)


class RotaryEmbedding(nn.Module):
    """Neox / HF rotate-half RoPE's table: cos and sin for every position below max_position,
    computed in float32 once: `cos_sin_cache` [max_position, head_dim] holds cos in the first
    half and sin in the second. The rotation itself is fused into attention's prepare_qkv."""

    def __init__(
        self,
        head_dim: int,
        max_position: int,
        rope_theta: float,
        rope_scaling: dict | None,
        dtype: torch.dtype,
        freq_factors: torch.Tensor | None = None,
    ) -> None:
        super().__init__()
        inv_freq = rope_inv_freq(head_dim, rope_theta, rope_scaling, freq_factors)
        positions = torch.arange(max_position, dtype=torch.float32)
        freqs = torch.outer(positions, inv_freq)  # [max_position, head_dim // 2]
        self.register_buffer(
            "cos_sin_cache", torch.cat((freqs.cos(), freqs.sin()), dim=-1), persistent=False
        )
