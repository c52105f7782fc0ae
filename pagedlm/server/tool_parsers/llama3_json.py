"""Llama 3.1+'s JSON tool calls: an output that starts with a JSON object (after an optional
<|python_tag|>) is calls, {"name": ..., "parameters": {...}}, separated by ";"; any other
output is content."""

from __future__ import annotations

from pagedlm.server.tool_parsers.base import (
    CallSoFar,
    Incomplete,
    Parsed,
    ToolParser,
    read_call,
)
from pagedlm.server.tool_parsers.json_scan import skip_whitespace

PYTHON_TAG = "<|python_tag|>"


class Llama3JsonToolParser(ToolParser):
    def scan(self, text: str, final: bool) -> Parsed:
        pos = skip_whitespace(text, 0)
        if text.startswith(PYTHON_TAG, pos):
            pos = skip_whitespace(text, pos + len(PYTHON_TAG))
        elif not final and PYTHON_TAG.startswith(text[pos:]):  # undecided (also when empty)
            return Parsed("")
        if pos == len(text):
            return Parsed(text if final else "")
        if text[pos] != "{":
            return Parsed(text)  # content: no call can follow
        calls: list[CallSoFar] = []
        while pos < len(text):
            end = read_call(text, pos, "", calls)
            if end is None:
                break
            pos = skip_whitespace(text, end)
            if pos < len(text) and text[pos] == ";":
                pos = skip_whitespace(text, pos + 1)
            elif pos < len(text):
                raise Incomplete("expected ';' between calls", Parsed("", calls))
        return Parsed("", calls)
