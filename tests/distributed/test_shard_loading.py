"""A TP rank reads only its part of each checkpoint tensor: from the default model's GGUF file
(quantized blocks cut before dequantising, q/k rows unpermuted per local head) and from a
safetensors folder; each part equals the full tensor's slice."""

from __future__ import annotations

import functools

import pytest
import torch

from pagedlm.config import EngineArgs
from pagedlm.distributed.sharding import checkpoint_slice, local_model_config, narrow
from pagedlm.model.gguf_loader import hf_name, iter_gguf_tensors, one_parse, reader
from pagedlm.model.loader import iter_safetensors

TP = 3  # SmolLM2-135M: 9 heads, 3 KV heads, intermediate 1536, vocabulary 49152
NAMES = {
    "model.layers.0.self_attn.q_proj.weight",  # rows, llama.cpp-permuted
    "model.layers.0.self_attn.k_proj.weight",
    "model.layers.0.self_attn.o_proj.weight",  # columns of Q8_0 / Q4_1 blocks
    "model.layers.0.mlp.down_proj.weight",
    "model.layers.0.mlp.gate_proj.weight",
    "model.layers.0.input_layernorm.weight",  # replicated
}


def _slice(name: str, model, rank: int):
    return checkpoint_slice(name, model, rank, TP)


def _tensors(iterator) -> dict[str, torch.Tensor]:
    return {name: tensor for name, tensor in iterator if name in NAMES}


def test_gguf_shards_are_slices_of_the_dequantised_tensors() -> None:
    with one_parse(None):  # the config's read and the loader's share one parse of the file
        model = EngineArgs(device="cpu", dtype="float32").create_engine_config().model
        parsed = reader(model.model)  # narrowed to NAMES, for speed
        parsed.tensors = [t for t in parsed.tensors if hf_name(t.name) in NAMES]
        full = _tensors(iter_gguf_tensors(model))
        assert set(full) == NAMES
        for rank in range(TP):
            shard = functools.partial(_slice, model=model, rank=rank)
            local = _tensors(iter_gguf_tensors(local_model_config(model, TP), shard=shard))
            for name in NAMES:
                expected = narrow(full[name], shard(name), name, "full")
                assert local[name].shape == expected.shape, name
                torch.testing.assert_close(local[name], expected, rtol=0, atol=0)


def test_safetensors_shards_read_through_slices(tiny_llama_dir) -> None:
    model = (
        EngineArgs(model=str(tiny_llama_dir), device="cpu", skip_tokenizer_init=True)
        .create_engine_config()
        .model
    )
    full = dict(iter_safetensors(str(tiny_llama_dir)))
    shard = lambda name: checkpoint_slice(name, model, 1, 2)  # noqa: E731
    for name, tensor in iter_safetensors(str(tiny_llama_dir), shard):
        torch.testing.assert_close(tensor, narrow(full[name], shard(name), name, "full"))
    with pytest.raises(ValueError, match="expects 32 along dim 0"):
        narrow(
            torch.zeros(6, 4),
            checkpoint_slice("model.layers.0.self_attn.k_proj.weight", model, 0, 2),
            "k",
            "bad",
        )
