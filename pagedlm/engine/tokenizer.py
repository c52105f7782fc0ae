"""Tokenizer loading (Hugging Face folders and GGUF files) and chat-template application."""
from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from tokenizers import decoders

from pagedlm.config import ModelConfig

Tokenizer = Any  # a transformers fast tokenizer (tokenizers-backed)
Conversation = list[dict[str, Any]]


def load_tokenizer(model_config: ModelConfig) -> Tokenizer | None:
    """None when `skip_tokenizer_init`; otherwise the fast tokenizer at `model_config.tokenizer`."""
    source = model_config.tokenizer
    if source is None:
        return None
    from transformers import AutoTokenizer

    path = Path(source)
    try:
        if path.suffix == ".gguf":
            tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        else:
            tokenizer = AutoTokenizer.from_pretrained(source)
    except Exception as exc:  # missing or malformed tokenizer files
        raise ValueError(f"tokenizer: cannot load a tokenizer from {source!r}: {exc}") from exc
    if getattr(tokenizer, "backend_tokenizer", None) is None:
        raise ValueError(f"tokenizer: {source!r} has no fast (tokenizers-backed) tokenizer; "
                         "pagedlm needs one for incremental detokenisation")
    return tokenizer


def encode_prompt(tokenizer: Tokenizer, text: str) -> list[int]:
    """A plain text prompt, with the special tokens (e.g. BOS) the tokenizer adds."""
    return list(tokenizer.encode(text))


def apply_chat_template(tokenizer: Tokenizer, conversation: Conversation,
                        chat_template_kwargs: dict[str, Any] | None = None) -> tuple[str, list[int]]:
    """The templated text and its token ids; the template already holds the special tokens,
    so they are not added a second time."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("messages: the tokenizer has no chat template; use generate() instead")
    if not isinstance(conversation, list) or not all(isinstance(m, dict) for m in conversation):
        raise ValueError("messages must be a list of {'role': ..., 'content': ...} dicts "
                         "or a list of such lists")
    kwargs = {"add_generation_prompt": True, **(chat_template_kwargs or {}), "tokenize": False}
    text = tokenizer.apply_chat_template(conversation, **kwargs)
    return text, list(tokenizer.encode(text, add_special_tokens=False))


def bad_words_token_ids(tokenizer: Tokenizer, bad_words: list[str]) -> list[list[int]]:
    """Each bad word as a token sequence, alone and after a space (as it appears mid-text)."""
    sequences: list[list[int]] = []
    for word in bad_words:
        for variant in (word.lstrip(), " " + word.lstrip()):
            ids = list(tokenizer.encode(variant, add_special_tokens=False))
            if ids and ids not in sequences:
                sequences.append(ids)
    return sequences


@functools.cache
def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet, inverted: the printable character that stands for each byte."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    return {char: byte for byte, char in bytes_to_unicode().items()}


def token_bytes(tokenizer: Tokenizer | None, token_id: int, decoded: str) -> list[int]:
    """The raw bytes of one token (part of a character, for byte-level and byte-fallback
    vocabularies), not the UTF-8 of its decoded text."""
    if tokenizer is not None:
        piece = tokenizer.convert_ids_to_tokens(token_id)
        byte_of = _byte_decoder()
        if isinstance(tokenizer.backend_tokenizer.decoder, decoders.ByteLevel) and all(c in byte_of for c in piece):
            return [byte_of[c] for c in piece]
        if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
            return [int(piece[3:5], 16)]
    return list(decoded.encode("utf-8"))
