"""Qwen3-Coder's XML tool calls, each

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    </function>
    </tool_call>

with content around (base.scan_tagged's rules). A parameter's value is text (one newline after
its tag and one before </parameter> are the format's, not the value's), converted by the type
the tool's JSON schema gives it, as vLLM's qwen3_coder parser does (parameter_value)."""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping
from typing import Any

from pagedlm.server.tool_parsers.base import (
    CallSoFar,
    Incomplete,
    Parsed,
    ToolParser,
    arguments_text,
    scan_tagged,
)
from pagedlm.server.tool_parsers.json_scan import NotJson, skip_whitespace
from pagedlm.server.tool_parsers.qwen3_coder_values import parameter_value

START, END = "<tool_call>", "</tool_call>"
FUNCTION, FUNCTION_END = "<function=", "</function>"
PARAMETER, PARAMETER_END = "<parameter=", "</parameter>"
_NAME = re.compile(r"[^<>\n]*")  # a function's or parameter's name, up to its ">"


class Qwen3CoderToolParser(ToolParser):
    def new_call_id(self) -> str:
        return f"call_{uuid.uuid4().hex[:24]}"

    def scan(self, text: str, final: bool) -> Parsed:
        def read_body(body: str, content: str, calls: list[CallSoFar]) -> None:
            try:
                _read_function(body, self.tools, calls)
            except NotJson as exc:
                raise Incomplete(str(exc), Parsed(content, calls)) from None

        return scan_tagged(text, final, START, END, read_body)


def _read_function(body: str, tools: Mapping[str, Any], calls: list[CallSoFar]) -> None:
    """Appends the call in one <tool_call>'s body (as far as it goes); raises NotJson where the
    body cannot be one."""
    pos = skip_whitespace(body, 0)
    if not _opens(body, pos, FUNCTION):
        raise NotJson(f"expected {FUNCTION}")
    name, pos = _tag_name(body, pos + len(FUNCTION))
    if name is None:
        return
    schema = tools.get(name)
    properties = schema.get("properties") if isinstance(schema, dict) else None
    members: list[tuple[str, object]] = []
    call = CallSoFar(name, arguments_text(members, False), False)
    calls.append(call)
    while (pos := skip_whitespace(body, pos)) < len(body):
        if body.startswith(FUNCTION_END, pos):
            call.arguments, call.complete = arguments_text(members, True), True
            if skip_whitespace(body, pos + len(FUNCTION_END)) < len(body):
                raise NotJson(f"text after {FUNCTION_END}")
            return
        if FUNCTION_END.startswith(body[pos:]):
            return  # may be </function> coming
        if not _opens(body, pos, PARAMETER):
            raise NotJson(f"expected {PARAMETER} or {FUNCTION_END}")
        key, pos = _tag_name(body, pos + len(PARAMETER))
        if key is None:
            return
        end = body.find(PARAMETER_END, pos)
        if end == -1:
            return
        value = body[pos:end].removeprefix("\n").removesuffix("\n")
        members.append((key, parameter_value(value, _schema_of(properties, key))))
        try:
            call.arguments = arguments_text(members, False)
        except ValueError as exc:
            raise NotJson(str(exc)) from None
        pos = end + len(PARAMETER_END)


def _opens(body: str, pos: int, tag: str) -> bool:
    """The tag starts at body[pos], or may: the body ends inside it."""
    return body.startswith(tag, pos) or (pos < len(body) and tag.startswith(body[pos:]))


def _tag_name(body: str, pos: int) -> tuple[str | None, int]:
    """The name that runs from body[pos] to its ">" and the position past it; None while the
    ">" has not come."""
    if pos > len(body):
        return None, pos  # inside the tag's start
    end = _NAME.match(body, pos).end()  # type: ignore[union-attr] - it matches ""
    if end == len(body):
        return None, end
    if body[end] != ">" or not body[pos:end].strip():
        raise NotJson("expected a name and '>'")
    return body[pos:end].strip(), end + 1


def _schema_of(properties: object, key: str) -> object:
    return properties.get(key) if isinstance(properties, dict) else None
