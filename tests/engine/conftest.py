"""Fixtures for the engine tests: two small hand-built tokenizers (byte-level BPE as in GPT-2 /
SmolLM, SentencePiece-style BPE with byte fallback as in Llama 2 / Mistral) and a tiny model."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from tiny_hf_models import save_tiny_model
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

CORPUS = ["hello world, the cat sat on the mat. Hello again world! Stop here. The end."] * 20
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>"]


def _wrap(tokenizer: Tokenizer) -> Any:
    tokenizer.add_special_tokens(SPECIAL_TOKENS)
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="<unk>", bos_token="<s>",
                                   eos_token="</s>")


@pytest.fixture(scope="session")
def byte_level_tokenizer() -> Any:
    """GPT-2 style: every byte is a token, spaces are part of the following word."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(CORPUS, trainer)
    return _wrap(tokenizer)


@pytest.fixture(scope="session")
def sentencepiece_tokenizer() -> Any:
    """Llama-2 style: '▁' marks a word start, the decoder strips the space the first token
    would get, unknown characters fall back to <0xNN> byte tokens."""
    trained = Tokenizer(models.BPE(unk_token="<unk>"))
    trained.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    trained.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=80,
                                                            special_tokens=SPECIAL_TOKENS))
    model = json.loads(trained.to_str())["model"]
    vocab = dict(model["vocab"])
    for byte in range(256):
        vocab[f"<0x{byte:02X}>"] = len(vocab)
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    tokenizer = Tokenizer(models.BPE(vocab, merges, unk_token="<unk>", byte_fallback=True))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    tokenizer.decoder = decoders.Sequence([
        decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
        decoders.Strip(" ", 1, 0)])
    return _wrap(tokenizer)


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tiny_llama")
    save_tiny_model(folder, "llama")
    return folder


@pytest.fixture(scope="session")
def tiny_llm(tiny_llama_dir: Path) -> Any:
    """Token ids only (no tokenizer); max_model_len 64."""
    from pagedlm import LLM

    return LLM(str(tiny_llama_dir), skip_tokenizer_init=True, dtype="float32", max_model_len=64,
               num_gpu_blocks_override=64, device="cpu")
