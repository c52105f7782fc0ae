"""Mistral's tool calls: content, then [TOOL_CALLS] and a JSON array of {"name", "arguments"}
objects (tokenizers before v11), or each call as [TOOL_CALLS]name[ARGS]{...} (v11 and later).
Content before the calls loses its trailing whitespace; while the text is unfinished, that and
what may be the start of [TOOL_CALLS] wait.
[TOOL_CALLS] is a special token: the server keeps special tokens in the text for this parser,
as vLLM does."""

from __future__ import annotations

import random
import re
import string

from pagedlm.server.tool_parsers.base import (
    CallSoFar,
    Incomplete,
    Parsed,
    ToolParser,
    held_back,
    read_call_array,
)
from pagedlm.server.tool_parsers.json_scan import NotJson, skip_whitespace, value_end

BOT, ARGS = "[TOOL_CALLS]", "[ARGS]"
_NAME = re.compile(r"[A-Za-z0-9_.\-]*")
_ID_CHARACTERS = string.ascii_letters + string.digits


class MistralToolParser(ToolParser):
    keeps_special_tokens = True

    def new_call_id(self) -> str:
        """Mistral's ids: 9 letters and digits (mistral_common refuses others)."""
        return "".join(random.choices(_ID_CHARACTERS, k=9))

    def scan(self, text: str, final: bool) -> Parsed:
        first = text.find(BOT)
        if first == -1:
            if final:
                return Parsed(text)
            return Parsed(text[: len(text) - held_back(text, BOT)].rstrip())  # whitespace waits
        content = text[:first].rstrip()
        calls: list[CallSoFar] = []
        pieces = text[first + len(BOT) :].split(BOT)
        for piece in pieces[:-1]:
            if _read_piece(piece, content, calls) is None:
                raise Incomplete("a call ends unfinished", Parsed(content, calls))
        last = pieces[-1] if final else pieces[-1][: len(pieces[-1]) - held_back(pieces[-1], BOT)]
        if _read_piece(last, content, calls) is None and final:
            raise Incomplete("the last call ends unfinished", Parsed(content, calls))
        return Parsed(content, calls)


def _read_piece(piece: str, content: str, calls: list[CallSoFar]) -> int | None:
    """Reads what follows one [TOOL_CALLS]: an array of calls, or name[ARGS]{...}; the position
    past it (only whitespace may follow), None while it is unfinished."""
    pos = skip_whitespace(piece, 0)
    if pos == len(piece):
        return None
    if piece[pos] == "[":
        end = read_call_array(piece, pos, content, calls)
    else:
        end = _read_named(piece, pos, content, calls)
    if end is not None and skip_whitespace(piece, end) < len(piece):
        raise Incomplete("text after the tool calls", Parsed(content, calls))
    return end


def _read_named(piece: str, pos: int, content: str, calls: list[CallSoFar]) -> int | None:
    name_end = _NAME.match(piece, pos).end()  # type: ignore[union-attr] - it matches ""
    rest = piece[name_end:]
    if not rest.startswith(ARGS) or name_end == pos:
        if ARGS.startswith(rest) and name_end > pos:
            return None  # the name may go on, or [ARGS] is coming
        raise Incomplete(f"expected a function name and {ARGS}", Parsed(content, calls))
    name = piece[pos:name_end]
    start = skip_whitespace(piece, name_end + len(ARGS))
    if start == len(piece):
        calls.append(CallSoFar(name, "", False))
        return None
    if piece[start] != "{":
        raise Incomplete("expected a JSON object of arguments", Parsed(content, calls))
    try:
        end = value_end(piece, start)
    except NotJson as exc:
        raise Incomplete(str(exc), Parsed(content, calls)) from None
    calls.append(
        CallSoFar(name, piece[start : len(piece) if end is None else end], end is not None)
    )
    return end
