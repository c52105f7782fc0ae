"""Read a llama.cpp GGUF file as Hugging Face named float32 tensors (dequantised at load)."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import torch

from pagedlm.config import ModelConfig

_GLOBAL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_BLOCK_NAMES = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm", "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


def hf_name(gguf_name: str) -> str | None:
    """`blk.3.attn_q.weight` -> `model.layers.3.self_attn.q_proj.weight`; None if unknown
    (e.g. `rope_freqs`, which the config already describes)."""
    parts = gguf_name.split(".")
    if len(parts) == 2 and parts[0] in _GLOBAL_NAMES:
        return f"{_GLOBAL_NAMES[parts[0]]}.{parts[1]}"
    if len(parts) == 4 and parts[0] == "blk" and parts[2] in _BLOCK_NAMES:
        return f"model.layers.{parts[1]}.{_BLOCK_NAMES[parts[2]]}.{parts[3]}"
    return None


def unpermute_rows(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Undo llama.cpp's convert_hf_to_gguf q/k permutation (it interleaves the two rotary
    halves of each head, for its GPT-J style RoPE) on a weight [rows, cols] or bias [rows]."""
    half = weight.shape[0] // num_heads // 2
    per_head = weight.reshape(num_heads, half, 2, *weight.shape[1:])
    return per_head.transpose(1, 2).reshape(weight.shape)


def iter_gguf_tensors(config: ModelConfig) -> Iterator[tuple[str, torch.Tensor]]:
    """(Hugging Face name, float32 tensor) for every tensor of config.model that the model knows."""
    import gguf

    path = Path(config.model)
    if path.suffix != ".gguf" or not path.is_file():
        raise ValueError(f"model: load_format gguf needs an existing .gguf file; got {config.model!r}")
    reader = gguf.GGUFReader(str(path))
    arch_field = reader.fields.get("general.architecture")
    # only llama.cpp's llama converter (also used for Mistral) permutes q/k rows
    permuted = arch_field is not None and arch_field.contents() == "llama"
    for tensor in reader.tensors:
        name = hf_name(tensor.name)
        if name is None:
            continue
        try:
            data = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        except NotImplementedError as exc:
            raise ValueError(f"model: tensor {tensor.name} in {path} has type "
                             f"{tensor.tensor_type.name}, which cannot be dequantised") from exc
        weight = torch.from_numpy(data.copy())
        if permuted and ".q_proj." in name:
            weight = unpermute_rows(weight, config.num_heads)
        elif permuted and ".k_proj." in name:
            weight = unpermute_rows(weight, config.num_kv_heads)
        yield name, weight
