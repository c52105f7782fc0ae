"""Streamed chunks, serialised once: a stream's envelope (id, object, created, model) is encoded
when it starts; each event encodes only its choices, plain dicts through msgspec (3 µs an event,
where building and dumping the pydantic chunk took 17-30 µs). The JSON is the pydantic chunk
models' (protocol.py: CompletionResponse, ChatCompletionChunk), key for key and null for null;
tests/server/test_stream_chunks.py holds the two side by side."""

from __future__ import annotations

from typing import Any

import msgspec
from pydantic import BaseModel

from pagedlm.server.protocol import ResponseMetrics, UsageInfo

_encode = msgspec.json.Encoder().encode


class ChunkStream:
    """The `data:` events of one streamed response."""

    def __init__(self, response_id: str, kind: str, created: int, model: str) -> None:
        envelope = _encode({"id": response_id, "object": kind, "created": created, "model": model})
        self._head = b"data: " + envelope[:-1] + b',"choices":'

    def event(
        self,
        choices: list[dict[str, Any]],
        usage: UsageInfo | None = None,
        metrics: ResponseMetrics | None = None,
    ) -> str:
        """`metrics` (the last chunk's, speculative decoding) only where set, as the models do
        (they write it first; JSON objects are unordered)."""
        usage_json = b"null" if usage is None else usage.model_dump_json().encode()
        tail = (
            b"}" if metrics is None else b',"metrics":' + metrics.model_dump_json().encode() + b"}"
        )
        return (self._head + _encode(choices) + b',"usage":' + usage_json + tail + b"\n\n").decode()


def completion_choice(
    index: int,
    text: str,
    logprobs: BaseModel | None,
    finish_reason: str | None,
    stop_reason: int | str | None,
) -> dict[str, Any]:
    """A CompletionChoice's fields, in its order."""
    return {
        "index": index,
        "text": text,
        "logprobs": _dumped(logprobs),
        "finish_reason": finish_reason,
        "stop_reason": stop_reason,
    }


def chat_choice(
    index: int,
    delta: dict[str, Any],
    logprobs: BaseModel | None = None,
    finish_reason: str | None = None,
    stop_reason: int | str | None = None,
) -> dict[str, Any]:
    """A ChatStreamChoice's fields, in its order; `delta` from chat_delta."""
    return {
        "index": index,
        "delta": delta,
        "logprobs": _dumped(logprobs),
        "finish_reason": finish_reason,
        "stop_reason": stop_reason,
    }


def chat_delta(
    role: str | None = None,
    content: str | None = None,
    tool_calls: list[BaseModel] | None = None,
    reasoning_content: str | None = None,
) -> dict[str, Any]:
    """A DeltaMessage: only the fields it brings, in its order."""
    delta: dict[str, Any] = {}
    if role is not None:
        delta["role"] = role
    if content is not None:
        delta["content"] = content
    if reasoning_content is not None:
        delta["reasoning_content"] = reasoning_content
    if tool_calls is not None:
        delta["tool_calls"] = [call.model_dump() for call in tool_calls]
    return delta


def _dumped(model: BaseModel | None) -> dict[str, Any] | None:
    return None if model is None else model.model_dump()
