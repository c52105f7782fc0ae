"""Tiny random-weight transformers checkpoints of every supported family, saved as Hugging Face
folders, with transformers' own greedy generation as the reference (engine and CLI tests)."""
from __future__ import annotations

from pathlib import Path

import torch
from transformers import (AutoModelForCausalLM, GenerationConfig, LlamaConfig, MistralConfig,
                          PretrainedConfig, Qwen2Config, Qwen3Config)

VOCAB_SIZE = 256
EOS_TOKEN_ID = 1
MISTRAL_WINDOW = 16
_SHAPE = dict(vocab_size=VOCAB_SIZE, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
              initializer_range=0.3, tie_word_embeddings=False, bos_token_id=0,
              eos_token_id=EOS_TOKEN_ID, pad_token_id=None)

FAMILIES = {
    "llama": lambda: LlamaConfig(**_SHAPE),
    "mistral": lambda: MistralConfig(**_SHAPE, sliding_window=MISTRAL_WINDOW),
    "qwen2": lambda: Qwen2Config(**_SHAPE),
    "qwen3": lambda: Qwen3Config(**_SHAPE, head_dim=16),
}


def save_tiny_model(folder: Path, family: str, seed: int = 0) -> torch.nn.Module:
    """Peaked random weights (initializer_range 0.3), so greedy picks are far from ties;
    norms and biases perturbed away from 1s and 0s."""
    hf_config: PretrainedConfig = FAMILIES[family]()
    hf_config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(hf_config, dtype=torch.float32).eval()
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() == 1:
                param.add_(torch.randn_like(param) * 0.1)
    model.save_pretrained(folder, safe_serialization=True)
    return model


def random_prompts(num_prompts: int, min_len: int, max_len: int, seed: int = 0) -> list[list[int]]:
    """Ragged prompts of token ids in [2, VOCAB_SIZE) (no BOS/EOS)."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(min_len, max_len + 1, (num_prompts,), generator=gen).tolist()
    lengths[0], lengths[-1] = min_len, max_len  # both extremes always present
    return [torch.randint(2, VOCAB_SIZE, (n,), generator=gen).tolist() for n in lengths]


def hf_greedy(model: torch.nn.Module, prompts: list[list[int]], num_new_tokens: int) -> list[list[int]]:
    """transformers' greedy generate, one prompt at a time, never stopping at EOS."""
    config = GenerationConfig(do_sample=False, max_new_tokens=num_new_tokens, pad_token_id=0)
    model.generation_config = config  # the saved one names an EOS, which generate would stop at
    outputs = []
    with torch.no_grad():
        for prompt in prompts:
            input_ids = torch.tensor([prompt])
            generated = model.generate(input_ids, attention_mask=torch.ones_like(input_ids),
                                       generation_config=config)
            outputs.append(generated[0, len(prompt):].tolist())
    return outputs
