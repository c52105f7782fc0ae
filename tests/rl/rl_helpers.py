"""Helpers of the weight-update tests: the prompts, greedy outputs of an engine, a GGUF writer."""

from __future__ import annotations

import multiprocessing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tiny_hf_models
import torch

from pagedlm import SamplingParams
from pagedlm.model.gguf_loader import hf_name

PROMPTS = tiny_hf_models.random_prompts(3, 3, 9, seed=5)
NUM_TOKENS = 6


@dataclass(frozen=True)
class TinyModel:
    folder: Path
    hf_model: Any  # the transformers model
    greedy: list[list[int]]  # its greedy outputs of PROMPTS, NUM_TOKENS each


def save_tiny(folder: Path, seed: int) -> TinyModel:
    hf_model = tiny_hf_models.save_tiny_model(folder, "llama", seed=seed)
    return TinyModel(folder, hf_model, tiny_hf_models.hf_greedy(hf_model, PROMPTS, NUM_TOKENS))


def greedy(llm: Any) -> list[list[int]]:
    params = SamplingParams(temperature=0.0, max_tokens=NUM_TOKENS, ignore_eos=True)
    outputs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
    return [out.outputs[0].token_ids for out in outputs]


def hf_tensors(model: TinyModel) -> list[tuple[str, torch.Tensor]]:
    """A trainer's parameters under Hugging Face names, q/k/v and gate/up apart."""
    return [(name, param.detach()) for name, param in model.hf_model.named_parameters()]


def serve_trainer(
    llm: Any, weights_folder: Path, device: str, transport: str, timeout_s: float = 120
) -> dict:
    """Runs rl_trainer.run in a spawned process and serves its pipe: its collective_rpc calls go to
    llm, its ("generate", label) records greedy(llm) under label, its ("record", label, value)
    the value. Returns those outputs."""
    import rl_trainer

    context = multiprocessing.get_context("spawn")
    conn, child_conn = context.Pipe()
    trainer = context.Process(
        target=rl_trainer.run, args=(child_conn, str(weights_folder), device, transport)
    )
    trainer.start()
    outputs = {}
    try:
        while True:
            assert conn.poll(timeout_s), "the trainer went quiet"
            message = conn.recv()
            if message[0] == "done":
                break
            assert message[0] != "failed", message[1]
            if message[0] == "record":
                outputs[message[1]] = message[2]
                continue
            if message[0] == "generate":
                outputs[message[1]] = greedy(llm)
                conn.send(("ok", None))
                continue
            _, method, kwargs = message
            try:
                conn.send(("ok", llm.collective_rpc(method, kwargs=kwargs)))
            except Exception as exc:  # the trainer raises it
                conn.send(("error", repr(exc)))
    finally:
        trainer.join(timeout_s)
        if trainer.is_alive():
            trainer.kill()
    assert trainer.exitcode == 0
    return outputs


def save_gguf(path: Path, hf_model: Any, rope_freqs: torch.Tensor | None = None) -> Path:
    """hf_model's weights as llama.cpp writes a Llama: GGUF names, q/k rows permuted; with
    RoPE frequency factors if given ([head_dim // 2])."""
    import gguf

    config = hf_model.config
    gguf_names = {}
    for template in gguf.TENSOR_NAMES.values():
        for layer in range(config.num_hidden_layers):
            for leaf in ("weight", "bias"):
                name = f"{template.format(bid=layer)}.{leaf}"
                if hf_name(name) is not None:
                    gguf_names[hf_name(name)] = name
    writer = gguf.GGUFWriter(str(path), "llama")
    for name, tensor in hf_model.state_dict().items():
        weight = tensor.detach().float()
        if ".q_proj." in name:
            weight = _llama_cpp_permute(weight, config.num_attention_heads)
        elif ".k_proj." in name:
            weight = _llama_cpp_permute(weight, config.num_key_value_heads)
        writer.add_tensor(gguf_names[name], weight.numpy())
    if rope_freqs is not None:
        writer.add_tensor("rope_freqs.weight", rope_freqs.float().numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _llama_cpp_permute(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    rows = weight.shape[0]
    per_head = weight.reshape(num_heads, 2, rows // num_heads // 2, *weight.shape[1:])
    return per_head.swapaxes(1, 2).reshape(weight.shape)


def save_tied(folder: Path, seed: int) -> TinyModel:
    """A tiny Llama whose LM head is its embeddings (as SmolLM2): no lm_head in the checkpoint."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(**{**tiny_hf_models._SHAPE, "tie_word_embeddings": True})
    torch.manual_seed(seed)
    hf_model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    hf_model.save_pretrained(folder)
    return TinyModel(folder, hf_model, tiny_hf_models.hf_greedy(hf_model, PROMPTS, NUM_TOKENS))
