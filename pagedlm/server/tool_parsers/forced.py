"""The outputs that tool_choice "required" and a named tool_choice force with a JSON schema
(pagedlm/server/tools.py builds it): an array of {"name", "parameters"} objects, or the named
function's arguments object alone."""

from __future__ import annotations

from pagedlm.server.tool_parsers.base import CallSoFar, Parsed, ToolParser, read_call_array
from pagedlm.server.tool_parsers.json_scan import skip_whitespace


class NamedToolParser(ToolParser):
    """The whole output is the arguments of the named function."""

    def __init__(self, name: str) -> None:
        super().__init__(max_calls=1)
        self.name = name

    def scan(self, text: str, final: bool) -> Parsed:
        return Parsed("", [CallSoFar(self.name, text.strip(), final)])


class RequiredToolParser(ToolParser):
    """A JSON array of calls."""

    def scan(self, text: str, final: bool) -> Parsed:
        calls: list[CallSoFar] = []
        pos = skip_whitespace(text, 0)
        if pos < len(text):
            read_call_array(text, pos, "", calls)
        return Parsed("", calls)
