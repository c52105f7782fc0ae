"""Tokenizer loading (Hugging Face folders and GGUF files) and chat-template application."""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenizers import decoders

from pagedlm.config import ModelConfig
from pagedlm.errors import InvalidRequest

Tokenizer = Any  # a transformers fast tokenizer (tokenizers-backed)
Conversation = list[dict[str, Any]]


def auto_tokenizer(source: str) -> Tokenizer:
    """transformers' AutoTokenizer of a folder or of a GGUF file (its folder, `gguf_file` its name);
    raises what transformers raises."""
    from transformers import AutoTokenizer

    path = Path(source)
    if path.suffix == ".gguf":
        return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    return AutoTokenizer.from_pretrained(source)


def load_tokenizer(model_config: ModelConfig) -> Tokenizer | None:
    """None when `skip_tokenizer_init`; otherwise the fast tokenizer at `model_config.tokenizer`."""
    source = model_config.tokenizer
    if source is None:
        return None
    try:
        tokenizer = auto_tokenizer(source)
    except Exception as exc:  # missing or malformed tokenizer files
        raise ValueError(f"tokenizer: cannot load a tokenizer from {source!r}: {exc}") from exc
    if getattr(tokenizer, "backend_tokenizer", None) is None:
        raise ValueError(
            f"tokenizer: {source!r} has no fast (tokenizers-backed) tokenizer; "
            "pagedlm needs one for incremental detokenisation"
        )
    return tokenizer


def encode_prompt(tokenizer: Tokenizer, text: str) -> list[int]:
    """A plain text prompt, with the special tokens (e.g. BOS) the tokenizer adds."""
    return list(tokenizer.encode(text))


def apply_chat_template(
    tokenizer: Tokenizer,
    conversation: Conversation,
    chat_template_kwargs: dict[str, Any] | None = None,
    tools: list[dict[str, Any]] | None = None,
) -> tuple[str, list[int]]:
    """The templated text and its token ids; the template already holds the special tokens,
    so they are not added a second time."""
    text = render_chat_template(tokenizer, conversation, chat_template_kwargs, tools)
    return text, list(tokenizer.encode(text, add_special_tokens=False))


def render_chat_template(
    tokenizer: Tokenizer,
    conversation: Conversation,
    chat_template_kwargs: dict[str, Any] | None = None,
    tools: list[dict[str, Any]] | None = None,
) -> str:
    """The conversation through the tokenizer's chat template, as text. `tools` (OpenAI's
    function definitions) go to the template as Hugging Face's `tools`; a template that knows
    no tools (the default model's) gets them in the system message, and assistant tool calls in
    the content, in Hermes' format (what the hermes tool-call parser reads)."""
    if not getattr(tokenizer, "chat_template", None):
        raise InvalidRequest(
            "messages: the tokenizer has no chat template; use generate() instead", param="messages"
        )
    if not isinstance(conversation, list) or not all(isinstance(m, dict) for m in conversation):
        raise InvalidRequest(
            "messages must be a list of {'role': ..., 'content': ...} dicts "
            "or a list of such lists",
            param="messages",
        )
    template = tokenizer.get_chat_template(None, tools)
    if "tool_calls" not in template:
        conversation = [_tool_calls_as_text(message) for message in conversation]
    if tools and "tools" not in template:
        conversation, tools = _tools_in_system_message(conversation, tools), None
    kwargs = {"add_generation_prompt": True, **(chat_template_kwargs or {}), "tokenize": False}
    if tools:
        kwargs["tools"] = tools
    return tokenizer.apply_chat_template(conversation, **kwargs)


_HERMES_TOOLS = """# Tools

You may call one or more of these functions, whose signatures are within <tools></tools>:
<tools>
{tools}
</tools>

To call a function, answer with a JSON object of its name and arguments within \
<tool_call></tool_call>, one for each call:
<tool_call>
{{"name": <function-name>, "arguments": <args-json-object>}}
</tool_call>"""


def _tools_in_system_message(
    conversation: Conversation, tools: list[dict[str, Any]]
) -> Conversation:
    listing = "\n".join(json.dumps(tool, ensure_ascii=False) for tool in tools)
    text = _HERMES_TOOLS.format(tools=listing)
    if conversation and conversation[0].get("role") == "system":
        first = conversation[0]
        return [{**first, "content": f"{first.get('content') or ''}\n\n{text}"}, *conversation[1:]]
    return [{"role": "system", "content": text}, *conversation]


def _tool_calls_as_text(message: dict[str, Any]) -> dict[str, Any]:
    calls = message.get("tool_calls")
    if not calls:
        return message
    rendered = [
        "<tool_call>\n"
        + json.dumps(
            {"name": call["function"]["name"], "arguments": call["function"]["arguments"]},
            ensure_ascii=False,
        )
        + "\n</tool_call>"
        for call in calls
    ]
    text = "\n".join([message["content"], *rendered] if message.get("content") else rendered)
    return {key: value for key, value in message.items() if key != "tool_calls"} | {"content": text}


# What may come before the vocabulary without dropping or merging characters of the text:
# normalizers, pre-tokenizers (by their JSON type) and the splitting behaviours they may have.
_KEEPING_NORMALIZERS = {"Prepend", "Replace", "Sequence"}
_KEEPING_PRE_TOKENIZERS = {"ByteLevel", "Metaspace", "Split", "Digits", "Punctuation", "Sequence"}


@dataclass(frozen=True)
class TokenCountBound:
    """A lower bound on a text's token count, found without tokenizing it: each token covers at
    most `max_chars` characters of the text, and every character but the `dropped` ones (which
    the vocabulary has no token for) lands in some token."""

    max_chars: int
    dropped: frozenset[str]

    def min_tokens(self, text: str) -> int:
        kept = len(text) - sum(text.count(char) for char in self.dropped)
        return -(-kept // self.max_chars)


def token_count_bound(tokenizer: Tokenizer) -> TokenCountBound | None:
    """The tokenizer's TokenCountBound, or None where none holds: a normalizer that may shrink
    the text, a pre-tokenizer or added token that drops characters (whitespace splitting,
    stripping), an unknown token that swallows a run, a model other than BPE. A token's
    vocabulary string is at least as long as the text it covers (a byte-level string has one
    character per byte, a byte-fallback `<0x..>` stands for one byte)."""
    spec = json.loads(tokenizer.backend_tokenizer.to_str())
    vocab = tokenizer.backend_tokenizer.get_vocab(with_added_tokens=True)
    dropped = _dropped_characters(spec, vocab)
    keeps_characters = (
        spec["model"]["type"] == "BPE"
        and dropped is not None
        and _keeps(spec.get("normalizer"), _KEEPING_NORMALIZERS, "normalizers")
        and _keeps(spec.get("pre_tokenizer"), _KEEPING_PRE_TOKENIZERS, "pretokenizers")
        and not any(t.get("lstrip") or t.get("rstrip") for t in spec.get("added_tokens", []))
    )
    if not keeps_characters:
        return None
    return TokenCountBound(max(len(piece) for piece in vocab), dropped)


def _dropped_characters(spec: dict[str, Any], vocab: dict[str, int]) -> frozenset[str] | None:
    """The characters a BPE model covers by no token; None where they are not a known set.
    Outside its vocabulary a character becomes byte-fallback tokens, or one unknown token, or
    (byte-level) its bytes' characters, of which those not in the vocabulary are dropped."""
    model = spec["model"]
    if model.get("byte_fallback") or (model.get("unk_token") and not model.get("fuse_unk")):
        return frozenset()
    if not _has_byte_level(spec.get("pre_tokenizer")):
        return None
    missing = {byte for char, byte in _byte_decoder().items() if char not in vocab}
    if any(0x80 <= byte < 0xC0 for byte in missing):  # continuation bytes: no simple set
        return None
    # A character of several bytes keeps its continuation bytes; one of one byte is dropped.
    return frozenset(chr(byte) for byte in missing if byte < 0x80)


def _has_byte_level(pre_tokenizer: dict[str, Any] | None) -> bool:
    if pre_tokenizer is None:
        return False
    return pre_tokenizer["type"] == "ByteLevel" or any(
        _has_byte_level(child) for child in pre_tokenizer.get("pretokenizers", [])
    )


def _keeps(component: dict[str, Any] | None, keeping: set[str], children: str) -> bool:
    """Whether a normalizer / pre-tokenizer (JSON) keeps every character of its input."""
    if component is None:
        return True
    if component["type"] not in keeping or component.get("behavior") == "Removed":
        return False
    if component["type"] == "Replace":  # may only replace a string by one at least as long
        pattern = component["pattern"].get("String")
        return pattern is not None and len(component["content"]) >= len(pattern)
    return all(_keeps(child, keeping, children) for child in component.get(children, []))


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
        if isinstance(tokenizer.backend_tokenizer.decoder, decoders.ByteLevel) and all(
            c in byte_of for c in piece
        ):
            return [byte_of[c] for c in piece]
        if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
            return [int(piece[3:5], 16)]
    return list(decoded.encode("utf-8"))
