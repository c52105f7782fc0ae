"""A tool-call parser splits a model's output into content and tool calls, for a finished output
and for one still being streamed (the OpenAI delta format: `delta.tool_calls[i]`)."""

from __future__ import annotations

import json
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pagedlm.server.tool_parsers.json_scan import (
    Member,
    NotJson,
    loads,
    object_members,
    skip_whitespace,
)

ARGUMENT_KEYS = ("arguments", "parameters")


@dataclass(slots=True)
class CallSoFar:
    name: str | None  # known once its string is complete
    arguments: str  # the JSON text of the arguments so far, exactly as generated
    complete: bool


@dataclass(slots=True)
class Parsed:
    content: str
    calls: list[CallSoFar] = field(default_factory=list)


class Incomplete(NotJson):
    """The text can be no tool calls; `partial` is what was read before that point."""

    def __init__(self, reason: str, partial: Parsed) -> None:
        super().__init__(reason)
        self.partial = partial


class ToolParser(ABC):
    """`parse` is a pure function of the text so far. Unfinished (final=False), its content and
    each call's arguments only grow as the text grows, and a call's name appears whole: what a
    stream sends from it is never taken back. Finished, it is the answer: every call complete
    with valid JSON arguments, or (vLLM's rule) no calls and the whole text as content."""

    # The calls start with a special token, which the text must keep (skip_special_tokens off)
    keeps_special_tokens = False

    def __init__(
        self, max_calls: int | None = None, tools: Mapping[str, Any] | None = None
    ) -> None:
        self.max_calls = max_calls  # 1 when parallel_tool_calls is false
        self.tools = tools or {}  # function name -> its parameters' JSON schema (or None)

    def new_call_id(self) -> str:
        """A call's id, in the format vLLM's parser of this name gives."""
        return new_tool_call_id()

    @abstractmethod
    def scan(self, text: str, final: bool) -> Parsed:
        """Content and calls as far as the text goes; raises Incomplete where it goes wrong."""

    def parse(self, text: str, final: bool) -> Parsed:
        try:
            parsed = self.scan(text, final)
        except Incomplete as exc:
            if final:
                return Parsed(text)
            parsed = exc.partial
        parsed.calls = parsed.calls[: self.max_calls]
        if final and not (parsed.calls and all(map(_valid, parsed.calls))):
            return Parsed(text)  # also an empty list of calls, such as "[]"
        return parsed


def _valid(call: CallSoFar) -> bool:
    if not call.complete or not isinstance(call.name, str) or not call.name:
        return False
    try:
        json.loads(call.arguments)
    except ValueError:
        return False
    return True


def read_call(text: str, pos: int, content: str, calls: list[CallSoFar]) -> int | None:
    """Appends the call object ({"name": ..., "arguments": {...}}) at text[pos] to `calls`; the
    position past it, None while it is open. Raises Incomplete (content, calls so far)."""
    try:
        members, end = object_members(text, pos)
        names = [
            loads(text[m.start : m.end]) for m in members if m.key == "name" and m.end is not None
        ]
    except NotJson as exc:
        raise Incomplete(str(exc), Parsed(content, calls)) from None
    name = names[0] if names else None
    arguments = None
    for member in members:
        if member.key in ARGUMENT_KEYS and arguments is None:
            arguments = _value_text(text, member)
    if end is not None and arguments is None:
        arguments = "{}"  # a call without arguments takes none
    calls.append(  # an empty name names no function: such a call is never announced
        CallSoFar(
            name if isinstance(name, str) and name else None, arguments or "", end is not None
        )
    )
    return end


def _value_text(text: str, member: Member) -> str:
    """An unfinished value runs to the end of the text (an object's inner whitespace included:
    the finished value holds it too)."""
    return text[member.start : member.end]


def read_call_array(text: str, pos: int, content: str, calls: list[CallSoFar]) -> int | None:
    """Appends the calls of the JSON array of call objects whose "[" is text[pos]; the position
    past its "]", None while it is open. Raises Incomplete (content, calls so far)."""
    if text[pos] != "[":
        raise Incomplete("expected a JSON array of tool calls", Parsed(content, calls))
    pos = skip_whitespace(text, pos + 1)
    while pos < len(text) and text[pos] != "]":
        end = read_call(text, pos, content, calls)
        if end is None:
            return None
        pos = skip_whitespace(text, end)
        if pos < len(text) and text[pos] == ",":
            pos = skip_whitespace(text, pos + 1)
        elif pos < len(text) and text[pos] != "]":
            raise Incomplete("expected ',' or ']' after a call", Parsed(content, calls))
    return pos + 1 if pos < len(text) else None


# Reads the body of one tagged call (the text between its start and end tags, or to the end of
# the text while the end tag has not come) into `calls`; raises Incomplete.
BodyReader = Callable[[str, str, list[CallSoFar]], None]


def scan_tagged(text: str, final: bool, start: str, end: str, read_body: BodyReader) -> Parsed:
    """Calls each between a `start` and an `end` tag (the last one may lack its end tag), the
    rest content. Content beside calls loses its trailing whitespace (the newlines around the
    tags); while the text is unfinished, trailing whitespace and what may be the start of a tag
    wait."""
    content: list[str] = []
    calls: list[CallSoFar] = []
    pos = 0
    while pos < len(text) and (tag := text.find(start, pos)) != -1:
        content.append(text[pos:tag])
        close = text.find(end, tag)
        read_body(
            text[tag + len(start) : len(text) if close == -1 else close],
            "".join(content).rstrip(),
            calls,
        )
        pos = len(text) if close == -1 else close + len(end)
    tail = text[pos:]
    content.append(tail if final else tail[: len(tail) - held_back(tail, start)])
    if final and not calls:
        return Parsed(text)
    return Parsed("".join(content).rstrip(), calls)


def arguments_text(members: list[tuple[str, object]], complete: bool) -> str:
    """The JSON text of arguments read as values (not JSON text) so far, each member whole:
    every reading is a prefix of the next, and the complete one is json.dumps of the object."""
    keys = [key for key, _ in members]
    if len(set(keys)) < len(keys):
        raise ValueError("an argument is given twice")
    body = ", ".join(f"{_dumps(key)}: {_dumps(value)}" for key, value in members)
    return "{" + body + ("}" if complete else "")


def _dumps(value: object) -> str:
    return json.dumps(value, ensure_ascii=False, allow_nan=False)


def held_back(text: str, marker: str) -> int:
    """How many characters at the end of `text` may be the start of `marker`."""
    for length in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:length]):
            return length
    return 0


def new_tool_call_id() -> str:
    return f"chatcmpl-tool-{uuid.uuid4().hex}"
