"""Read a llama.cpp GGUF file as Hugging Face named float32 tensors (dequantised at load), and its
RoPE frequency factors (`rope_freqs`), which no config field describes.

Both read one parse of the file (`reader`, cached until `release_readers`): parsing the default
model's file takes ~2 s on the CI machine (its tokenizer's 49k-entry arrays), and the model is
built (rope_freqs) before its weights are filled. While `one_parse()` is open, transformers' config
and tokenizer loads (which construct gguf.GGUFReader themselves) get that parse too."""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from pagedlm.config import ModelConfig
from pagedlm.distributed.sharding import TensorSlice, narrow
from pagedlm.model.gguf_quant import quantized_from_blocks
from pagedlm.model.quant_linear import QuantizedTensor

if TYPE_CHECKING:
    from gguf import GGUFReader, ReaderTensor

ROPE_FREQS = "rope_freqs.weight"

_GLOBAL_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
_BLOCK_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


def hf_name(gguf_name: str) -> str | None:
    """`blk.3.attn_q.weight` -> `model.layers.3.self_attn.q_proj.weight`; None if not a model weight
    (e.g. `rope_freqs`, which gguf_rope_freqs reads for the rotary embedding)."""
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


def _unpermuted(
    weight: torch.Tensor | QuantizedTensor, num_heads: int
) -> torch.Tensor | QuantizedTensor:
    if isinstance(weight, QuantizedTensor):
        return weight.map_rows(lambda rows: unpermute_rows(rows, num_heads))
    return unpermute_rows(weight, num_heads)


def reader(path: str) -> GGUFReader:
    """The parsed GGUF file at path (memory-mapped), shared until release_readers()."""
    return _parse(str(Path(path).resolve()))


@functools.lru_cache(maxsize=1)
def _parse(path: str) -> GGUFReader:
    import gguf  # only for GGUF files: the GPU machine's environment has no gguf package

    construct = gguf.GGUFReader
    return getattr(construct, "unshared", construct)(path)  # inside one_parse: the real constructor


def release_readers() -> None:
    """Drop the cached parse (and its memory map), once the model is loaded."""
    _parse.cache_clear()


_ONE_PARSE = threading.RLock()  # one patch of gguf.GGUFReader at a time; a nested span shares it


@contextlib.contextmanager
def one_parse(model: str | None) -> Iterator[None]:
    """For a GGUF model (None: the default model, one): inside, gguf.GGUFReader(path) of a .gguf file
    returns reader(path), so transformers' config and tokenizer loads take the parse the loader
    shares; released at exit. Other models run as they are (gguf is not imported). Engines built
    in other threads meanwhile wait; a span opened inside another adds nothing."""
    if model is not None and not model.endswith(".gguf"):
        yield
        return
    try:
        import gguf
    except ImportError:  # the load that needs it says so
        yield
        return
    with _ONE_PARSE:
        construct = gguf.GGUFReader
        if hasattr(construct, "unshared"):  # inside another span: it shares and releases
            yield
            return

        def shared(path, *args, **kwargs) -> GGUFReader:
            if str(path).endswith(".gguf") and not args and not kwargs:
                return reader(path)
            return construct(path, *args, **kwargs)

        shared.unshared = construct
        gguf.GGUFReader = shared
        try:
            yield
        finally:
            gguf.GGUFReader = construct
            release_readers()


def iter_gguf_tensors(
    config: ModelConfig,
    quantized: bool = False,
    shard: Callable[[str], TensorSlice | None] | None = None,
) -> Iterator[tuple[str, torch.Tensor | QuantizedTensor]]:
    """(Hugging Face name, float32 tensor) for every tensor of config.model that the model knows;
    with `quantized`, a QuantizedTensor for each quantized matrix instead (gguf_quant.py). With
    `shard` (a TP rank; config: its shapes, so q/k rows unpermute per local head), each tensor's
    part is cut from the file's blocks before dequantising: the rank reads its part only."""
    path, parsed = _parsed(config)
    # only llama.cpp's llama converter (also used for Mistral) permutes q/k rows
    arch_field = parsed.fields.get("general.architecture")
    permuted = arch_field is not None and arch_field.contents() == "llama"
    for tensor in parsed.tensors:
        name = hf_name(tensor.name)
        if name is None:
            continue
        if shard is not None:
            data = _sliced_blocks(tensor, shard(name), name, path)
            weight = _dequantize(tensor, path, data)
        else:
            weight = quantized_from_blocks(tensor.data, tensor.tensor_type) if quantized else None
            weight = _dequantize(tensor, path) if weight is None else weight
        if permuted and ".q_proj." in name:
            weight = _unpermuted(weight, config.num_heads)
        elif permuted and ".k_proj." in name:
            weight = _unpermuted(weight, config.num_kv_heads)
        yield name, weight


def iter_gguf_shapes(config: ModelConfig) -> Iterator[tuple[str, tuple[int, ...]]]:
    """(Hugging Face name, shape) for every tensor of config.model that the model knows, without
    dequantising them; the smallest tensor of each quantisation type is dequantised once, so a
    type that cannot be raises here, before any weight is copied."""
    path, parsed = _parsed(config)
    smallest: dict[object, ReaderTensor] = {}
    for tensor in parsed.tensors:
        name = hf_name(tensor.name)
        if name is None:
            continue
        known = smallest.get(tensor.tensor_type)
        if known is None or tensor.n_elements < known.n_elements:
            smallest[tensor.tensor_type] = tensor
        yield name, tuple(int(d) for d in reversed(tensor.shape))  # GGUF lists dims innermost first
    for tensor in smallest.values():
        _dequantize(tensor, path)


def _parsed(config: ModelConfig) -> tuple[Path, GGUFReader]:
    path = Path(config.model)
    if path.suffix != ".gguf" or not path.is_file():
        raise ValueError(
            f"model: load_format gguf needs an existing .gguf file; got {config.model!r}"
        )
    return path, reader(str(path))


def gguf_rope_freqs(config: ModelConfig) -> torch.Tensor | None:
    """[head_dim // 2] float32 RoPE frequency factors of a GGUF model (llama.cpp: theta_i = pos *
    inv_freq_i / factor_i), or None if config.model is not a GGUF file or has none. convert_hf_to_gguf
    writes Llama 3.1/3.2's llama3 RoPE scaling only this way, and transformers' GGUF config reader does not
    turn it back into rope_scaling: without these factors such a model runs with plain RoPE."""
    if config.gguf_file is None:
        return None
    path = Path(config.model)
    tensor = next((t for t in reader(str(path)).tensors if t.name == ROPE_FREQS), None)
    if tensor is None:
        return None
    factors = _dequantize(tensor, path).reshape(-1)
    num_freqs = config.head_dim // 2
    if factors.numel() != num_freqs:
        raise ValueError(
            f"model: tensor {ROPE_FREQS} in {path} has {factors.numel()} factors; "
            f"head_dim {config.head_dim} needs {num_freqs}"
        )
    if not bool(torch.isfinite(factors).all() and (factors > 0).all()):  # sync-ok: CPU, at load
        raise ValueError(
            f"model: tensor {ROPE_FREQS} in {path} must hold finite positive factors; "
            f"got {factors.tolist()}"
        )  # sync-ok: a CPU tensor, at load, in an error
    return factors


def _sliced_blocks(tensor: ReaderTensor, part: TensorSlice | None, name: str, path: Path):
    """The tensor's raw data (numpy, rows first) narrowed to part: rows as they are; columns of a
    quantized type by whole blocks (their bytes), which part must align to."""
    import gguf

    data = tensor.data
    if part is None or part.dim == 0 or data.dtype != "uint8":  # rows first in either case
        return narrow(data, part, name, str(path))
    block, type_bytes = gguf.GGML_QUANT_SIZES[tensor.tensor_type]
    if part.start % block or part.length % block:
        raise ValueError(
            f"model: tensor {name} in {path}: its {block}-wide quantized blocks do not split at "
            f"column {part.start} (+{part.length}) for tensor_parallel_size"
        )
    full_bytes = part.full // block * type_bytes
    as_bytes = TensorSlice(
        1, part.start // block * type_bytes, part.length // block * type_bytes, full_bytes
    )
    return np.ascontiguousarray(narrow(data, as_bytes, name, str(path)))


def _dequantize(tensor: ReaderTensor, path: Path, data=None) -> torch.Tensor:
    """A GGUFReader tensor (or `data`, a slice of its raw blocks) as a float32 torch tensor of its
    (numpy) shape."""
    import gguf

    try:
        data = gguf.quants.dequantize(tensor.data if data is None else data, tensor.tensor_type)
    except NotImplementedError as exc:
        raise ValueError(
            f"model: tensor {tensor.name} in {path} has type "
            f"{tensor.tensor_type.name}, which cannot be dequantised"
        ) from exc
    return torch.from_numpy(data.copy())
