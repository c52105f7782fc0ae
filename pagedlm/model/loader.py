"""Build the model and fill its weights: a Hugging Face safetensors folder, a GGUF file, or dummy."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path

import torch

from pagedlm.attention.backend import AttentionBackend
from pagedlm.config import ModelConfig
from pagedlm.model.gguf_loader import iter_gguf_tensors, release_readers
from pagedlm.model.llama import LlamaForCausalLM

DUMMY_SEED = 0
DUMMY_STD = 0.02


def load_model(
    config: ModelConfig, attn_backend: AttentionBackend, device: torch.device
) -> LlamaForCausalLM:
    """The model in config.dtype on device, in eval mode, every weight filled, no grad."""
    try:
        with torch.device(device):
            model = LlamaForCausalLM(config, attn_backend)
        with torch.no_grad():
            if config.load_format == "dummy":
                fill_dummy_weights(model, device)
            elif config.load_format == "safetensors":
                fill_weights(model, iter_safetensors(config.model), config.model)
            elif config.load_format == "gguf":
                fill_weights(model, iter_gguf_tensors(config), config.model)
            else:
                raise ValueError(
                    f"load_format must be safetensors, gguf or dummy; got {config.load_format!r}"
                )
    finally:
        release_readers()  # the GGUF parse the model's build and its weights shared
    return model.eval()


def fill_weights(
    model: LlamaForCausalLM, tensors: Iterable[tuple[str, torch.Tensor]], source: str
) -> None:
    """Copy each known checkpoint tensor into its (slice of a) parameter; unknown names
    (rotary_emb.inv_freq, lm_head of a tied model) are ignored, a missing one is an error."""
    layout = model.checkpoint_layout()
    params = dict(model.named_parameters())
    filled: set[str] = set()
    for name, tensor in tensors:
        shard = layout.get(name)
        if shard is None:
            if name.endswith("rotary_emb.inv_freq") or name == "lm_head.weight":
                continue  # RoPE tables are recomputed; lm_head of a tied model
            raise ValueError(
                f"model: checkpoint {source} has tensor {name}, which the config does not describe"
            )
        target = params[shard.param].narrow(0, shard.row_start, shard.num_rows)
        if tensor.shape != target.shape:
            raise ValueError(
                f"model: tensor {name} in {source} has shape {tuple(tensor.shape)}, "
                f"the config expects {tuple(target.shape)}"
            )
        target.copy_(tensor)
        filled.add(name)
    missing = sorted(layout.keys() - filled)
    if missing == ["lm_head.weight"]:  # no lm_head in the checkpoint: tied to the embeddings
        params["lm_head.weight"].copy_(params["model.embed_tokens.weight"])
        missing = []
    if missing:
        raise ValueError(
            f"model: checkpoint {source} is missing tensor {missing[0]}"
            + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else "")
        )


def fill_dummy_weights(model: LlamaForCausalLM, device: torch.device) -> None:
    """Seeded random weights: norms 1, everything else normal(0, DUMMY_STD)."""
    generator = torch.Generator(device=device).manual_seed(DUMMY_SEED)
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


def iter_safetensors(folder: str) -> Iterator[tuple[str, torch.Tensor]]:
    from safetensors import safe_open

    for file in safetensors_files(folder):
        with safe_open(str(file), framework="pt", device="cpu") as handle:
            for name in handle.keys():
                yield name, handle.get_tensor(name)
