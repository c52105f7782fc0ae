"""Build the model and fill its weights: a Hugging Face safetensors folder, a GGUF file, or dummy."""

from __future__ import annotations

import json
import weakref
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from pathlib import Path

import torch

from pagedlm.attention.backend import AttentionBackend
from pagedlm.config import ModelConfig
from pagedlm.distributed.sharding import TensorSlice, narrow, narrowed_shape
from pagedlm.model.gguf_loader import (
    gguf_rope_freqs,
    iter_gguf_shapes,
    iter_gguf_tensors,
    release_readers,
)
from pagedlm.model.llama import LlamaForCausalLM, WeightShard
from pagedlm.model.quant_linear import QuantizedTensor, concat_rows, takes_quantized

DUMMY_SEED = 0
DUMMY_STD = 0.02

# a TP rank's part of a checkpoint tensor by its Hugging Face name (None: all of it); sharding.py
Shard = Callable[[str], TensorSlice | None]


def load_model(
    config: ModelConfig,
    attn_backend: AttentionBackend,
    device: torch.device,
    shard: Shard | None = None,
    dummy_seed: int = DUMMY_SEED,
) -> LlamaForCausalLM:
    """The model in config.dtype on device, in eval mode, every weight filled, no grad. A TP rank
    (config: its shapes) gives `shard`: it reads only its part of each tensor; its quantized GGUF
    blocks load dequantised (dense)."""
    try:
        with torch.device(device):
            model = LlamaForCausalLM(config, attn_backend)
        with torch.no_grad():
            if config.load_format == "dummy":
                fill_dummy_weights(model, device, dummy_seed)
            else:
                quantized = shard is None and takes_quantized(device, config.dtype)
                tensors = iter_tensors(config, quantized, shard)
                fill_weights(model, tensors, config.model, shard)
    finally:
        release_readers()  # the GGUF parse the model's build and its weights shared
    return model.eval()


def iter_tensors(
    config: ModelConfig, quantized: bool = False, shard: Shard | None = None
) -> Iterator[tuple[str, torch.Tensor | QuantizedTensor]]:
    """(Hugging Face name, tensor) of every tensor of config.model's checkpoint; with `quantized`,
    a GGUF file's quantized matrices as QuantizedTensors; with `shard`, each narrowed to it."""
    if config.load_format == "safetensors":
        return iter_safetensors(config.model, shard)
    if config.load_format == "gguf":
        return iter_gguf_tensors(config, quantized, shard)
    raise ValueError(f"load_format must be safetensors, gguf or dummy; got {config.load_format!r}")


def iter_shapes(config: ModelConfig) -> Iterator[tuple[str, tuple[int, ...]]]:
    """(Hugging Face name, shape) of every tensor of config.model's checkpoint, its data unread."""
    if config.load_format == "safetensors":
        return iter_safetensors_shapes(config.model)
    if config.load_format == "gguf":
        return iter_gguf_shapes(config)
    raise ValueError(f"load_format must be safetensors or gguf; got {config.load_format!r}")


def fill_weights(
    model: LlamaForCausalLM,
    tensors: Iterable[tuple[str, torch.Tensor | QuantizedTensor]],
    source: str,
    shard: Shard | None = None,
) -> None:
    """Copy each known checkpoint tensor into its (slice of a) parameter, one at a time; unknown
    names (rotary_emb.inv_freq, lm_head of a tied model) are ignored, a missing one is an error.
    QuantizedTensors are gathered per parameter and loaded into its module (load_quantized).
    With `shard`, the tensors come narrowed (iter_tensors) and a vocabulary shard fills the rows
    of its parameter it covers."""
    targets = checkpoint_targets(model, shard=shard)
    layout = checkpoint_layout(model)
    filled: set[str] = set()
    quantized: dict[str, dict[int, QuantizedTensor]] = {}  # param -> row_start -> shard
    for name, tensor in tensors:
        target = target_of(targets, name, tuple(tensor.shape), source)
        if target is None:
            continue
        if isinstance(tensor, QuantizedTensor):
            quantized.setdefault(layout[name].param, {})[layout[name].row_start] = tensor
        else:
            target.copy_(tensor)
        filled.add(name)
    tied_head = check_complete(targets.keys(), filled, source)
    if tied_head and "model.embed_tokens.weight" in quantized:
        quantized["lm_head.weight"] = quantized["model.embed_tokens.weight"]
    elif tied_head:
        targets["lm_head.weight"].copy_(targets["model.embed_tokens.weight"])
    params = dict(model.named_parameters())
    for param, shards in quantized.items():
        _load_quantized(model, params[param], param, shards)


def _load_quantized(
    model: LlamaForCausalLM, param: torch.Tensor, name: str, shards: dict[int, QuantizedTensor]
) -> None:
    """A parameter whose shards all came quantized goes packed into its module; one that mixes
    them with float shards stays dense (its quantized shards dequantised into it)."""
    if sum(shard.shape[0] for shard in shards.values()) == param.shape[0]:
        weight = concat_rows([shards[start] for start in sorted(shards)])
        model.get_submodule(name.rpartition(".")[0]).load_quantized(weight)
        return
    for start, shard in shards.items():
        param.narrow(0, start, shard.shape[0]).copy_(shard.dequantize())


def check_dense(model: LlamaForCausalLM) -> None:
    """Weight updates copy into parameters: a model loaded quantized has none to copy into."""
    if any(getattr(module, "quant", None) is not None for module in model.modules()):
        raise ValueError(
            "weights: this model holds quantized weights (a GGUF file on the CPU in bfloat16); "
            'updating them needs dense ones: load it with dtype="float32"'
        )


class PartialReload(RuntimeError):
    """A reload failed after its first copy: some weights are new, some old."""


def reload_weights(
    model: LlamaForCausalLM, config: ModelConfig, weights_path: str, shard: Shard | None = None
) -> None:
    """Refill every weight in place (the same parameter storages: CUDA graphs bind them) from a
    folder or GGUF file of the model's architecture (a TP rank: its `shard` of each tensor). Every tensor's name and shape is checked
    against the model, its data unread, before the first copy: a mismatch raises ValueError and
    leaves the weights as they were; the tensors are then read and copied one at a time (a read
    failing midway raises PartialReload: the weights are then mixed)."""
    is_gguf = weights_path.endswith(".gguf")
    if not (Path(weights_path).is_dir() or is_gguf):
        raise ValueError(
            f"weights_path must be a Hugging Face folder or a .gguf file; got {weights_path!r}"
        )
    source = replace(config, model=weights_path, load_format="gguf" if is_gguf else "safetensors")
    check_dense(model)
    try:
        targets = checkpoint_targets(model, shard=shard)
        found = set()
        for name, shape in iter_shapes(source):
            local = _local_shape(shape, shard, name, weights_path)
            if target_of(targets, name, local, weights_path) is not None:
                found.add(name)
        check_complete(targets.keys(), found, weights_path)
        check_rope_freqs(model, source)
        with torch.no_grad():
            try:
                fill_weights(model, iter_tensors(source, shard=shard), weights_path, shard)
            except Exception as exc:  # a read failing midway: the checks above passed
                raise PartialReload(f"reading {weights_path} failed midway: {exc}") from exc
    finally:
        release_readers()


def _local_shape(
    shape: tuple[int, ...], shard: Shard | None, name: str, source: str
) -> tuple[int, ...]:
    return shape if shard is None else narrowed_shape(shape, shard(name), name, source)


def update_weights(
    model: LlamaForCausalLM,
    named_tensors: Iterable[tuple[str, torch.Tensor]],
    source: str,
    shard: Shard | None = None,
) -> int:
    """Copy some checkpoint tensors (Hugging Face names, any subset) into their parameters in
    place, after checking every name, shape and dtype: a mismatch raises ValueError and copies
    nothing. A TP rank gives its `shard`: the tensors are its slices already (a vocabulary
    slice fills its rows of the padded shard). Returns how many tensors were copied (the
    ignored names aside)."""
    check_dense(model)
    pairs = list(named_tensors)
    for pair in pairs:
        if not isinstance(pair, (tuple, list)) or len(pair) != 2 or not isinstance(pair[0], str):
            raise ValueError(f"{source}: named_tensors must be (name, tensor) pairs; got {pair!r}")
    targets = checkpoint_targets(model, [name for name, _ in pairs], shard)
    copies = []
    for name, tensor in pairs:
        if not isinstance(tensor, torch.Tensor) or not tensor.is_floating_point():
            kind = tensor.dtype if isinstance(tensor, torch.Tensor) else type(tensor).__name__
            raise ValueError(f"{source}: tensor {name} must be a floating-point tensor, not {kind}")
        target = target_of(targets, name, tuple(tensor.shape), source)
        if target is not None:
            copies.append((target, tensor))
    with torch.no_grad():
        for target, tensor in copies:
            target.copy_(tensor)
    return len(copies)


def checkpoint_targets(
    model: LlamaForCausalLM, names: Iterable[str] | None = None, shard: Shard | None = None
) -> dict[str, torch.Tensor]:
    """Hugging Face tensor name -> the view of the (fused) parameter it fills; with `names`, only
    theirs (a weight update's chunk: the other views are not made); with `shard` (a TP rank), a
    vocabulary shard's view covers the rows its slice fills (the padding rows past the vocabulary
    left out)."""
    params = dict(model.named_parameters())
    layout = checkpoint_layout(model)
    wanted = layout if names is None else [name for name in names if name in layout]
    targets = {}
    for name in wanted:
        where = layout[name]
        part = None if shard is None else shard(name)
        rows = where.num_rows if part is None or part.dim else min(where.num_rows, part.length)
        targets[name] = params[where.param].narrow(0, where.row_start, rows)
    return targets


_LAYOUTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> its layout


def checkpoint_layout(model: LlamaForCausalLM) -> dict[str, WeightShard]:
    """model.checkpoint_layout(), made once per model: it depends on the architecture alone, and
    a weight transfer asks for it once per chunk. Read only."""
    layout = _LAYOUTS.get(model)
    if layout is None:
        layout = _LAYOUTS[model] = model.checkpoint_layout()
    return layout


def target_of(
    targets: dict[str, torch.Tensor], name: str, shape: tuple[int, ...], source: str
) -> torch.Tensor | None:
    """The view a checkpoint tensor of this name and shape fills; None for a name the loader
    ignores; ValueError for an unknown name or a wrong shape."""
    target = targets.get(name)
    if target is None:
        if name.endswith("rotary_emb.inv_freq") or name == "lm_head.weight":
            return None  # RoPE tables are recomputed; lm_head of a tied model
        raise ValueError(
            f"model: checkpoint {source} has tensor {name}, which the config does not describe"
        )
    if shape != tuple(target.shape):
        raise ValueError(
            f"model: tensor {name} in {source} has shape {shape}, "
            f"the config expects {tuple(target.shape)}"
        )
    return target


def check_complete(names: Iterable[str], filled: set[str], source: str) -> bool:
    """ValueError if a checkpoint leaves a weight unfilled; True when only lm_head is missing,
    which is then tied to the embeddings (the caller copies them)."""
    missing = sorted(set(names) - filled)
    if missing == ["lm_head.weight"]:
        return True
    if missing:
        raise ValueError(
            f"model: checkpoint {source} is missing tensor {missing[0]}"
            + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else "")
        )
    return False


def check_rope_freqs(model: LlamaForCausalLM, source: ModelConfig) -> None:
    """A GGUF's RoPE frequency factors shape the model's cos/sin table at build time: a reload
    must bring the same ones (or none, as the model was built with none)."""
    new = gguf_rope_freqs(source)
    old = model.model.rope_freq_factors
    same = (new is None and old is None) or (
        new is not None and old is not None and torch.equal(new, old)
    )
    if not same:
        raise ValueError(
            f"model: {source.model} has other RoPE frequency factors (rope_freqs) than the "
            "loaded model: not the same architecture"
        )


def fill_dummy_weights(
    model: LlamaForCausalLM, device: torch.device, seed: int = DUMMY_SEED
) -> None:
    """Seeded random weights: norms 1, everything else normal(0, DUMMY_STD)."""
    generator = torch.Generator(device=device).manual_seed(seed)
    for name, param in model.named_parameters():
        if name.endswith("norm.weight"):
            param.fill_(1.0)
        else:
            param.normal_(0.0, DUMMY_STD, generator=generator)


def safetensors_files(folder: str) -> list[Path]:
    """model.safetensors, or the shards a model.safetensors.index.json names."""
    root = Path(folder)
    if not root.is_dir():
        raise ValueError(f"model: load_format safetensors needs a folder; got {folder!r}")
    single, index = root / "model.safetensors", root / "model.safetensors.index.json"
    if single.is_file():
        return [single]
    if not index.is_file():
        raise ValueError(
            f"model: folder {folder!r} has neither model.safetensors nor "
            "model.safetensors.index.json"
        )
    shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    files = [root / shard for shard in shards]
    for file in files:
        if not file.is_file():
            raise ValueError(f"model: weight file {file} named by {index.name} does not exist")
    return files


def iter_safetensors_shapes(folder: str) -> Iterator[tuple[str, tuple[int, ...]]]:
    from safetensors import safe_open

    for file in safetensors_files(folder):
        with safe_open(str(file), framework="pt", device="cpu") as handle:
            for name in handle.keys():
                yield name, tuple(handle.get_slice(name).get_shape())


def iter_safetensors(folder: str, shard: Shard | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """With `shard`, a sharded tensor is read through its slice: only the rank's part is read."""
    from safetensors import safe_open

    for file in safetensors_files(folder):
        with safe_open(str(file), framework="pt", device="cpu") as handle:
            for name in handle.keys():
                part = None if shard is None else shard(name)
                if part is None:
                    yield name, handle.get_tensor(name)
                else:
                    yield name, narrow(handle.get_slice(name), part, name, str(file))
