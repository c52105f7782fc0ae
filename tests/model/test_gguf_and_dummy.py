"""The default GGUF model against transformers reading the same file; dummy weights."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from paged_batch import make_cache, make_step
from transformers import AutoModelForCausalLM, LlamaConfig

from pagedlm.attention.torch_ref import TorchAttentionBackend
from pagedlm.config import build_model_config, default_model_path
from pagedlm.model import LlamaForCausalLM, load_model
from pagedlm.model.gguf_loader import hf_name, unpermute_rows

# "The capital of France is" in the SmolLM2 tokenizer (fixed ids: no tokenizer load needed)
PROMPT_IDS = [504, 3575, 282, 4649, 314]
# Both sides dequantise the same Q4_1/Q8_0 data to float32; measured max |diff| 4.8e-5 on
# logits of magnitude up to 27 (float32 summation order only).
GGUF_TOL = 2e-4
CPU = torch.device("cpu")


def run_prompt(model: LlamaForCausalLM, ids: list[int]) -> torch.Tensor:
    cache = make_cache(model.config, 1, len(ids), 16)
    input_ids, positions, meta = make_step(cache, [(ids, 0)])
    with torch.no_grad():
        return model.compute_logits(model(input_ids, positions, cache.kv_caches, meta))


@pytest.mark.slow
def test_default_gguf_matches_transformers() -> None:
    path = Path(default_model_path())
    config = build_model_config(None, "auto", "float32", CPU, 64, True)
    assert config.load_format == "gguf" and config.tie_word_embeddings
    got = run_prompt(load_model(config, TorchAttentionBackend(), CPU), PROMPT_IDS)
    hf_model = AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    ).eval()
    with torch.no_grad():
        want = hf_model(torch.tensor([PROMPT_IDS])).logits[0]
    assert (got - want).abs().max() <= GGUF_TOL
    assert torch.equal(got.argmax(-1), want.argmax(-1))


def test_unpermute_matches_transformers_and_inverts_llama_cpp() -> None:
    from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor

    num_heads, head_dim, cols = 3, 8, 5
    original = torch.randn(num_heads * head_dim, cols)
    # llama.cpp convert_hf_to_gguf: reshape(n_head, 2, rows // n_head // 2, ...).swapaxes(1, 2)
    permuted = (
        original.reshape(num_heads, 2, head_dim // 2, cols).transpose(1, 2).reshape(original.shape)
    )
    assert not torch.equal(permuted, original)
    assert torch.equal(unpermute_rows(permuted, num_heads), original)
    bias = torch.randn(num_heads * head_dim)
    permuted_bias = bias.reshape(num_heads, 2, head_dim // 2).transpose(1, 2).reshape(bias.shape)
    assert torch.equal(unpermute_rows(permuted_bias, num_heads), bias)
    theirs = LlamaTensorProcessor()._reverse_permute_weights(permuted.numpy(), num_heads, num_heads)
    assert torch.equal(unpermute_rows(permuted, num_heads), torch.from_numpy(theirs))


def test_gguf_names() -> None:
    assert hf_name("token_embd.weight") == "model.embed_tokens.weight"
    assert hf_name("output.weight") == "lm_head.weight"
    assert hf_name("output_norm.weight") == "model.norm.weight"
    assert hf_name("blk.12.attn_q.bias") == "model.layers.12.self_attn.q_proj.bias"
    assert hf_name("blk.0.attn_k_norm.weight") == "model.layers.0.self_attn.k_norm.weight"
    assert hf_name("blk.3.ffn_norm.weight") == "model.layers.3.post_attention_layernorm.weight"
    assert hf_name("rope_freqs.weight") is None


def test_dummy_from_config_only(tmp_path: Path) -> None:
    LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    ).save_pretrained(tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["config.json"]
    config = build_model_config(str(tmp_path), "dummy", "float32", CPU, 32, True)
    first = run_prompt(load_model(config, TorchAttentionBackend(), CPU), [5, 17, 200])
    second = run_prompt(load_model(config, TorchAttentionBackend(), CPU), [5, 17, 200])
    assert first.shape == (3, 256) and torch.isfinite(first).all()
    assert first.std() > 0
    assert torch.equal(first, second), "dummy weights are seeded"
