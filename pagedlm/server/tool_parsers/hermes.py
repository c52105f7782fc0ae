"""Hermes' format (Qwen2.5, Hermes 2/3, and what the default model is told when its template
knows no tools): each call a JSON object between <tool_call> and </tool_call>, content around
(base.scan_tagged's rules)."""

from __future__ import annotations

from pagedlm.server.tool_parsers.base import CallSoFar, Parsed, ToolParser, read_call, scan_tagged
from pagedlm.server.tool_parsers.json_scan import skip_whitespace

START, END = "<tool_call>", "</tool_call>"


class HermesToolParser(ToolParser):
    def scan(self, text: str, final: bool) -> Parsed:
        return scan_tagged(text, final, START, END, _read_body)


def _read_body(body: str, content: str, calls: list[CallSoFar]) -> None:
    body_start = skip_whitespace(body, 0)
    if body_start < len(body):
        read_call(body, body_start, content, calls)
