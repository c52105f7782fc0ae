"""Model layers against their transformers counterparts, with fresh random inputs."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.llama.modeling_llama import (
    LlamaRMSNorm,
    LlamaRotaryEmbedding,
    apply_rotary_pos_emb,
)

from pagedlm.model.layers import RMSNorm, RotaryEmbedding, rope_inv_freq
from pagedlm.ops import silu_and_mul
from pagedlm.ops.rotary import rotary_embedding_torch

HEAD_DIM = 16
ROPE_SCALINGS = {
    "default": None,
    "linear": {"rope_type": "linear", "factor": 4.0},
    "llama3": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 32,
    },
}


def hf_rope_config(scaling: dict | None) -> LlamaConfig:
    return LlamaConfig(
        hidden_size=4 * HEAD_DIM,
        num_attention_heads=4,
        max_position_embeddings=64,
        rope_theta=500.0,
        rope_scaling=scaling,
    )


@pytest.mark.parametrize("name", list(ROPE_SCALINGS))
def test_rope_inv_freq_matches_transformers(name: str) -> None:
    scaling = ROPE_SCALINGS[name]
    config = hf_rope_config(scaling)
    if scaling is None:
        want = 1.0 / (500.0 ** (torch.arange(0, HEAD_DIM, 2).float() / HEAD_DIM))
    else:
        want, _ = ROPE_INIT_FUNCTIONS[name](config, torch.device("cpu"))
    got = rope_inv_freq(HEAD_DIM, 500.0, scaling)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=0)


@pytest.mark.parametrize("name", list(ROPE_SCALINGS))
def test_rotary_matches_transformers(name: str) -> None:
    scaling = ROPE_SCALINGS[name]
    hf_rotary = LlamaRotaryEmbedding(hf_rope_config(scaling))
    rotary = RotaryEmbedding(HEAD_DIM, 64, 500.0, scaling, torch.float32)
    positions = torch.tensor([0, 1, 7, 31, 63, 5])
    q, k = torch.randn(6, 4, HEAD_DIM), torch.randn(6, 2, HEAD_DIM)
    got_q, got_k = rotary_embedding_torch(positions, q, k, rotary.cos_sin_cache)
    cos, sin = hf_rotary(q, positions[None])  # [1, T, head_dim]
    # HF layout [batch, heads, T, head_dim]
    want_q, want_k = apply_rotary_pos_emb(
        q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos, sin
    )
    torch.testing.assert_close(got_q, want_q[0].transpose(0, 1))
    torch.testing.assert_close(got_k, want_k[0].transpose(0, 1))


def test_unsupported_rope_type() -> None:
    with pytest.raises(ValueError, match="rope_scaling"):
        rope_inv_freq(HEAD_DIM, 10000.0, {"rope_type": "yarn", "factor": 2.0})


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_with_residual(dtype: torch.dtype) -> None:
    hf_norm = LlamaRMSNorm(32, eps=1e-5)
    with torch.no_grad():
        hf_norm.weight.copy_(torch.randn(32))
    hf_norm = hf_norm.to(dtype)
    norm = RMSNorm(32, 1e-5, dtype)
    norm.weight.copy_(hf_norm.weight)
    x, residual = torch.randn(5, 32, dtype=dtype), torch.randn(5, 32, dtype=dtype)
    normed, new_residual = norm(x, residual)
    assert torch.equal(new_residual, x + residual)
    assert torch.equal(normed, hf_norm(x + residual))
    normed_alone, same = norm(x)
    assert same is x and torch.equal(normed_alone, hf_norm(x))


def test_silu_and_mul() -> None:
    gate, up = torch.randn(3, 8), torch.randn(3, 8)
    torch.testing.assert_close(
        silu_and_mul(torch.cat([gate, up], dim=-1)), torch.nn.functional.silu(gate) * up
    )
