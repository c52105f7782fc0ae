"""Tiny random-weight transformers checkpoints of every supported family, saved as Hugging Face
folders, with transformers' own greedy generation as the reference; small hand-built tokenizers
(engine and CLI tests)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    AutoModelForCausalLM,
    GenerationConfig,
    LlamaConfig,
    MistralConfig,
    PretrainedConfig,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen3Config,
)

VOCAB_SIZE = 256
EOS_TOKEN_ID = 1
MISTRAL_WINDOW = 16
_SHAPE = dict(
    vocab_size=VOCAB_SIZE,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    initializer_range=0.3,
    tie_word_embeddings=False,
    bos_token_id=0,
    eos_token_id=EOS_TOKEN_ID,
    pad_token_id=None,
)

FAMILIES = {
    "llama": lambda: LlamaConfig(**_SHAPE),
    "mistral": lambda: MistralConfig(**_SHAPE, sliding_window=MISTRAL_WINDOW),
    "qwen2": lambda: Qwen2Config(**_SHAPE),
    "qwen3": lambda: Qwen3Config(**_SHAPE, head_dim=16),
}


def save_tiny_model(
    folder: Path,
    family: str,
    seed: int = 0,
    vocab_size: int = VOCAB_SIZE,
    config_overrides: dict[str, Any] | None = None,
) -> torch.nn.Module:
    """Peaked random weights (initializer_range 0.3), so greedy picks are far from ties;
    norms and biases perturbed away from 1s and 0s. config_overrides: attributes set on the
    family's config (e.g. sliding_window)."""
    hf_config: PretrainedConfig = FAMILIES[family]()
    hf_config.vocab_size = vocab_size
    for name, value in (config_overrides or {}).items():
        setattr(hf_config, name, value)
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


def hf_greedy(
    model: torch.nn.Module, prompts: list[list[int]], num_new_tokens: int
) -> list[list[int]]:
    """transformers' greedy generate, one prompt at a time, never stopping at EOS."""
    config = GenerationConfig(do_sample=False, max_new_tokens=num_new_tokens, pad_token_id=0)
    model.generation_config = config  # the saved one names an EOS, which generate would stop at
    outputs = []
    with torch.no_grad():
        for prompt in prompts:
            input_ids = torch.tensor([prompt])
            generated = model.generate(
                input_ids, attention_mask=torch.ones_like(input_ids), generation_config=config
            )
            outputs.append(generated[0, len(prompt) :].tolist())
    return outputs


CORPUS = ["hello world, the cat sat on the mat. Hello again world! Stop here. The end."] * 20
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


def _wrap(tokenizer: Tokenizer) -> Any:
    tokenizer.add_special_tokens(SPECIAL_TOKENS)
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )
    wrapped.chat_template = CHAT_TEMPLATE
    return wrapped


def byte_level_tokenizer() -> Any:
    """GPT-2 style: every byte is a token, spaces are part of the following word (~300 ids)."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(CORPUS, trainer)
    return _wrap(tokenizer)


def sentencepiece_tokenizer() -> Any:
    """Llama-2 style: '▁' marks a word start, the decoder strips the space the first token
    would get, unknown characters fall back to <0xNN> byte tokens."""
    trained = Tokenizer(models.BPE(unk_token="<unk>"))
    trained.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    trained.train_from_iterator(
        CORPUS, trainers.BpeTrainer(vocab_size=80, special_tokens=SPECIAL_TOKENS)
    )
    model = json.loads(trained.to_str())["model"]
    vocab = dict(model["vocab"])
    for byte in range(256):
        vocab[f"<0x{byte:02X}>"] = len(vocab)
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    tokenizer = Tokenizer(models.BPE(vocab, merges, unk_token="<unk>", byte_fallback=True))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    tokenizer.decoder = decoders.Sequence(
        [
            decoders.Replace("▁", " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(" ", 1, 0),
        ]
    )
    return _wrap(tokenizer)


def save_tiny_model_with_tokenizer(folder: Path, family: str = "llama") -> Any:
    """A tiny checkpoint whose folder also holds the byte-level tokenizer (with a chat template)."""
    tokenizer = byte_level_tokenizer()
    save_tiny_model(folder, family, vocab_size=len(tokenizer))
    tokenizer.save_pretrained(folder)
    return tokenizer
