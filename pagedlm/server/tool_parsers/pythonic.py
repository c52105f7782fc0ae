"""Pythonic tool calls (Llama 3.2, Llama 4, ToolACE): the whole output is a Python list of
calls with keyword arguments, `[get_weather(city="Paris"), f(x=[1, 2])]`, optionally between
Llama 4's <|python_start|> and <|python_end|>; any other output is content. Arguments are
literals read with `ast` (python_literals.py), never evaluated, and go out as JSON."""

from __future__ import annotations

import re

from pagedlm.server.tool_parsers.base import (
    CallSoFar,
    Incomplete,
    Parsed,
    ToolParser,
    arguments_text,
)
from pagedlm.server.tool_parsers.json_scan import NotJson, skip_whitespace
from pagedlm.server.tool_parsers.python_literals import expression_end, literal

START, END = "<|python_start|>", "<|python_end|>"
_IDENTIFIER = re.compile(r"[A-Za-z_]\w*")
_KEYWORD = re.compile(r"([A-Za-z_]\w*)\s*=(?!=)")
_UNFINISHED_KEYWORD = re.compile(r"[A-Za-z_]\w*\s*")


class PythonicToolParser(ToolParser):
    def scan(self, text: str, final: bool) -> Parsed:
        pos = skip_whitespace(text, 0)
        if text.startswith(START, pos):
            pos = skip_whitespace(text, pos + len(START))
        elif not final and START.startswith(text[pos:]):  # undecided (also when empty)
            return Parsed("")
        if pos == len(text):
            return Parsed(text if final else "")
        if text[pos] != "[":
            return Parsed(text)  # content: no call can follow
        calls: list[CallSoFar] = []
        try:
            end = _read_list(text, pos + 1, calls)
        except NotJson as exc:
            if not calls:
                return Parsed(text)  # content, such as "[1] Smith et al."
            raise Incomplete(str(exc), Parsed("", calls)) from None
        if end is not None:
            rest = text[skip_whitespace(text, end) :]
            if rest and rest != END and not (not final and END.startswith(rest)):
                raise Incomplete("text after the list of calls", Parsed("", calls))
        elif final:
            raise Incomplete("the list of calls is unfinished", Parsed("", calls))
        return Parsed("", calls)


def _read_list(text: str, pos: int, calls: list[CallSoFar]) -> int | None:
    """Appends the calls of the list that opened before text[pos]; past its "]", None while it is
    open. Raises NotJson where the text cannot be such a list."""
    while (pos := skip_whitespace(text, pos)) < len(text):
        if text[pos] == "]" and (not calls or calls[-1].complete):
            return pos + 1
        if calls and calls[-1].complete:
            if text[pos] != ",":
                raise NotJson("expected ',' or ']' after a call")
            pos = skip_whitespace(text, pos + 1)
            if pos == len(text):
                return None
        name = _IDENTIFIER.match(text, pos)
        if name is None:
            raise NotJson("expected a function's name")
        if name.end() == len(text):
            return None
        if text[name.end()] != "(":
            raise NotJson("expected '(' after a function's name")
        pos = _read_arguments(text, name.end() + 1, name.group(), calls)
        if pos is None:
            return None
    return None


def _read_arguments(text: str, pos: int, name: str, calls: list[CallSoFar]) -> int | None:
    """Appends the call whose "(" came before text[pos]; past its ")", None while it is open."""
    members: list[tuple[str, object]] = []
    call = CallSoFar(name, arguments_text(members, False), False)
    calls.append(call)
    while (pos := skip_whitespace(text, pos)) < len(text):
        if text[pos] == ")":
            call.arguments, call.complete = arguments_text(members, True), True
            return pos + 1
        keyword = _KEYWORD.match(text, pos)
        if keyword is None:
            if _UNFINISHED_KEYWORD.fullmatch(text, pos):
                return None
            raise NotJson("a call's arguments must be keyword=literal")
        end = expression_end(text, keyword.end(), ",)")
        if end is None:
            return None
        members.append((keyword.group(1), literal(text[keyword.end() : end])))
        try:
            call.arguments = arguments_text(members, False)
        except ValueError as exc:
            raise NotJson(str(exc)) from None
        pos = end + 1 if text[end] == "," else end
    return None
