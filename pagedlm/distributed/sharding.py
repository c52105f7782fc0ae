"""Which part of the model a TP rank holds, and which part of each checkpoint tensor it loads.

Heads split evenly: rank r holds query heads [r * H / P, (r + 1) * H / P). KV heads split too
when P divides them; when P > KV heads (P a multiple of them) each rank holds the one KV head its
query heads read, so KV heads are replicated over P / KV ranks (vLLM's rule). gate/up and down
split the intermediate size. The vocabulary splits into P shards of `vocab_shard_rows` rows (a
multiple of 32, so that a structured-output bitmask splits on word boundaries; the last shard's
rows past the vocabulary are zero). Norms (q/k norms included: one weight over every head) and
the biases of row-parallel layers are replicated.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pagedlm.config import ModelConfig

VOCAB_ALIGN = 32


@dataclass(frozen=True)
class TensorSlice:
    """Rows (dim 0) or columns (dim 1) [start, start + length) of a tensor of `full` along dim."""

    dim: int
    start: int
    length: int
    full: int


def check_tp(config: ModelConfig, tp: int) -> None:
    """ValueError unless the model splits over tp ranks."""
    if tp < 1:
        raise ValueError(f"tensor_parallel_size must be at least 1, got {tp}")
    heads, kv_heads = config.num_heads, config.num_kv_heads
    if heads % tp:
        raise ValueError(
            f"tensor_parallel_size ({tp}) must divide the number of attention heads ({heads})"
        )
    if kv_heads % tp and tp % kv_heads:
        raise ValueError(
            f"tensor_parallel_size ({tp}) must divide the number of KV heads ({kv_heads}), "
            "or be a multiple of it (the KV heads are then replicated)"
        )
    if config.intermediate_size % tp:
        raise ValueError(
            f"tensor_parallel_size ({tp}) must divide intermediate_size "
            f"({config.intermediate_size})"
        )


def local_kv_heads(config: ModelConfig, tp: int) -> int:
    return max(config.num_kv_heads // tp, 1)


def vocab_shard_rows(vocab_size: int, tp: int) -> int:
    per_rank = -(-vocab_size // tp)
    return -(-per_rank // VOCAB_ALIGN) * VOCAB_ALIGN


def local_model_config(config: ModelConfig, tp: int) -> ModelConfig:
    """The shapes one rank builds: its heads, KV heads and intermediate size (vocab_size stays the
    model's: the sampler works on full rows)."""
    if tp == 1:
        return config
    return replace(
        config,
        num_heads=config.num_heads // tp,
        num_kv_heads=local_kv_heads(config, tp),
        intermediate_size=config.intermediate_size // tp,
    )


_ATTN = re.compile(r"model\.layers\.\d+\.self_attn\.(q_proj|k_proj|v_proj|o_proj)\.(weight|bias)")
_MLP = re.compile(r"model\.layers\.\d+\.mlp\.(gate_proj|up_proj|down_proj)\.(weight|bias)")
_VOCAB = ("model.embed_tokens.weight", "lm_head.weight")


def checkpoint_slice(name: str, config: ModelConfig, rank: int, tp: int) -> TensorSlice | None:
    """The part of checkpoint tensor `name` rank loads (config: the model's, not the local one);
    None: the whole tensor (replicated)."""
    if tp == 1:
        return None
    if name in _VOCAB:
        rows = vocab_shard_rows(config.vocab_size, tp)
        start = min(rank * rows, config.vocab_size)
        return TensorSlice(0, start, min(rows, config.vocab_size - start), config.vocab_size)
    d = config.head_dim
    if match := _ATTN.fullmatch(name):
        proj, leaf = match.groups()
        if proj == "q_proj":
            heads = config.num_heads // tp
            return TensorSlice(0, rank * heads * d, heads * d, config.num_heads * d)
        if proj in ("k_proj", "v_proj"):
            heads = local_kv_heads(config, tp)
            first = rank * config.num_kv_heads // tp if tp > config.num_kv_heads else rank * heads
            return TensorSlice(0, first * d, heads * d, config.num_kv_heads * d)
        if leaf == "weight":  # o_proj: its input columns, the rank's query heads
            heads = config.num_heads // tp
            return TensorSlice(1, rank * heads * d, heads * d, config.num_heads * d)
        return None  # o_proj's bias: added once, after the all-reduce
    if match := _MLP.fullmatch(name):
        proj, leaf = match.groups()
        size = config.intermediate_size // tp
        if proj != "down_proj":
            return TensorSlice(0, rank * size, size, config.intermediate_size)
        return (
            TensorSlice(1, rank * size, size, config.intermediate_size)
            if leaf == "weight"
            else None
        )
    return None


def narrowed_shape(shape: tuple[int, ...], part: TensorSlice | None, name: str, source: str):
    """The shape of a tensor of `shape` narrowed to part; ValueError when its full size along
    part.dim is not the model's."""
    if part is None:
        return shape
    if len(shape) <= part.dim or shape[part.dim] != part.full:
        raise ValueError(
            f"model: tensor {name} in {source} has shape {shape}; the config expects "
            f"{part.full} along dim {part.dim}"
        )
    return shape[: part.dim] + (part.length,) + shape[part.dim + 1 :]


def narrow(tensor, part: TensorSlice | None, name: str, source: str):
    """tensor (a torch tensor, or a safetensors / numpy slice supporting [] and .shape) narrowed
    to part; ValueError when its full size along part.dim is not the model's."""
    if part is None:
        return tensor
    shape = tuple(tensor.shape) if hasattr(tensor, "shape") else tuple(tensor.get_shape())
    narrowed_shape(shape, part, name, source)
    end = part.start + part.length
    return tensor[part.start : end] if part.dim == 0 else tensor[:, part.start : end]
