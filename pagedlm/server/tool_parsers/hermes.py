"""Hermes' format (Qwen2.5, Hermes 2/3, and what the default model is told when its template
knows no tools): each call a JSON object between <tool_call> and </tool_call>, content around.
Content beside calls loses its trailing whitespace (the newlines around the tags); while the
text is unfinished, trailing whitespace and what may be the start of a tag wait."""

from __future__ import annotations

from pagedlm.server.tool_parsers.base import CallSoFar, Parsed, ToolParser, held_back, read_call
from pagedlm.server.tool_parsers.json_scan import skip_whitespace

START, END = "<tool_call>", "</tool_call>"


class HermesToolParser(ToolParser):
    def scan(self, text: str, final: bool) -> Parsed:
        content: list[str] = []
        calls: list[CallSoFar] = []
        pos = 0
        while pos < len(text) and (start := text.find(START, pos)) != -1:
            content.append(text[pos:start])
            end = text.find(END, start)
            body = text[start + len(START) : len(text) if end == -1 else end]
            body_start = skip_whitespace(body, 0)
            if body_start < len(body):
                read_call(body, body_start, "".join(content).rstrip(), calls)
            pos = len(text) if end == -1 else end + len(END)
        tail = text[pos:]
        content.append(tail if final else tail[: len(tail) - held_back(tail, START)])
        if final and not calls:
            return Parsed(text)
        return Parsed("".join(content).rstrip(), calls)
