"""Reading JSON that is still being generated: where a value, an object's members and a string
end, as far as the text goes. The scanners check the structure (brackets, quotes, colons,
commas), never the scalars: a finished value is checked by json.loads."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

_WHITESPACE = " \t\n\r"
_STRING_STOP = re.compile(r'["\\]')  # what ends or escapes inside a string
_NESTING = re.compile(r'["{}\[\]]')  # what a nested value's end depends on
_SCALAR_END = re.compile(r"[,}\]\s]")


class NotJson(ValueError):
    """The text cannot be the start of the JSON expected there, whatever follows."""


@dataclass(frozen=True, slots=True)
class Member:
    key: str
    start: int  # the value's first character (len(text) while only whitespace follows the colon)
    end: int | None  # past the value's last character; None while the value is unfinished


def loads(text: str) -> object:
    """A finished JSON value; NotJson where it is none (a bad escape, a bad literal)."""
    try:
        return json.loads(text)
    except ValueError as exc:
        raise NotJson(str(exc)) from None


def skip_whitespace(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in _WHITESPACE:
        pos += 1
    return pos


def string_end(text: str, pos: int) -> int | None:
    """Past the closing quote of the string whose opening quote is text[pos]."""
    pos += 1
    while (stop := _STRING_STOP.search(text, pos)) is not None:
        if stop.group() == '"':
            return stop.end()
        pos = stop.end() + 1  # an escape: skip the escaped character
    return None


def value_end(text: str, pos: int) -> int | None:
    """Past the JSON value that starts at text[pos] (not whitespace); None where the text ends
    first, including a number or literal at the very end (more digits may follow)."""
    first = text[pos]
    if first == '"':
        return string_end(text, pos)
    if first in "{[":
        return _nested_end(text, pos)
    if first in ",:}]":
        raise NotJson(f"a value cannot start with {first!r}")
    stop = _SCALAR_END.search(text, pos)
    return None if stop is None else stop.start()


def _nested_end(text: str, pos: int) -> int | None:
    depth = 0
    while (mark := _NESTING.search(text, pos)) is not None:
        char = mark.group()
        if char == '"':
            end = string_end(text, mark.start())
            if end is None:
                return None
            pos = end
            continue
        depth += 1 if char in "{[" else -1
        pos = mark.end()
        if depth == 0:
            return pos
    return None


def object_members(text: str, pos: int) -> tuple[list[Member], int | None]:
    """The members of the object whose "{" is text[pos], as far as the text goes, and the
    position past its "}" (None while it is open)."""
    if text[pos] != "{":
        raise NotJson("expected a JSON object")
    members: list[Member] = []
    pos = skip_whitespace(text, pos + 1)
    if pos < len(text) and text[pos] == "}":
        return members, pos + 1
    while pos < len(text):
        if text[pos] != '"':
            raise NotJson("expected a key")
        key_end = string_end(text, pos)
        if key_end is None:
            return members, None
        key = loads(text[pos:key_end])
        pos = skip_whitespace(text, key_end)
        if pos == len(text):
            return members, None
        if text[pos] != ":":
            raise NotJson("expected ':' after a key")
        pos = skip_whitespace(text, pos + 1)
        end = value_end(text, pos) if pos < len(text) else None
        members.append(Member(key, pos, end))
        if end is None:
            return members, None
        pos = skip_whitespace(text, end)
        if pos < len(text) and text[pos] == "}":
            return members, pos + 1
        if pos < len(text):
            if text[pos] != ",":
                raise NotJson("expected ',' or '}' after a value")
            pos = skip_whitespace(text, pos + 1)
    return members, None
