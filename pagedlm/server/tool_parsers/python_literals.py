"""Python literals in a model's output, read with `ast` and never evaluated: constants, negative
numbers, lists, tuples (as lists) and dicts with string keys, i.e. what JSON can hold. Also
where such a value ends in text that is still being generated."""

from __future__ import annotations

import ast
import math

from pagedlm.server.tool_parsers.json_scan import NotJson

_OPEN, _CLOSE = "([{", ")]}"


def literal(text: str) -> object:
    """The JSON-able value of a Python literal; NotJson where the text is anything else."""
    try:
        return literal_value(ast.parse(text.strip(), mode="eval").body)
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        raise NotJson(f"not a Python literal: {exc}") from None


def literal_value(node: ast.expr) -> object:
    if isinstance(node, ast.Constant):
        value = node.value
        if value is None or isinstance(value, (str, bool, int)):
            return value
        if isinstance(value, float) and math.isfinite(value):
            return value
    elif (
        isinstance(node, ast.UnaryOp)
        and isinstance(node.op, (ast.USub, ast.UAdd))
        and isinstance(node.operand, ast.Constant)
        and type(node.operand.value) in (int, float)  # not bool: -True is no literal
    ):
        number = literal_value(node.operand)
        return -number if isinstance(node.op, ast.USub) else number  # type: ignore[operator]
    elif isinstance(node, (ast.List, ast.Tuple)):
        return [literal_value(item) for item in node.elts]
    elif isinstance(node, ast.Dict):
        result = {}
        for key, value in zip(node.keys, node.values, strict=True):
            if not (isinstance(key, ast.Constant) and isinstance(key.value, str)):
                raise NotJson("a dict's keys must be strings")
            result[key.value] = literal_value(value)
        return result
    raise NotJson(f"not a literal: {ast.dump(node)[:60]}")


def expression_end(text: str, pos: int, stops: str) -> int | None:
    """Where the expression at text[pos] ends: the first of `stops` outside brackets and
    strings; None where the text ends first (or inside what may be a string's quotes). Raises
    NotJson for a closing bracket that closes nothing."""
    depth = 0
    while pos < len(text):
        char = text[pos]
        if depth == 0 and char in stops:
            return pos
        if char in "'\"":
            end = _string_end(text, pos)
            if end is None:
                return None
            pos = end
            continue
        if char in _OPEN:
            depth += 1
        elif char in _CLOSE:
            if depth == 0:
                raise NotJson(f"unbalanced {char!r}")
            depth -= 1
        pos += 1
    return None


def _string_end(text: str, pos: int) -> int | None:
    """Past the string whose first quote is text[pos] (a prefix such as r or b is read as the
    name before it). A backslash always escapes the next character's meaning as a quote."""
    quote = text[pos]
    if text.startswith(quote * 3, pos):
        delimiter = quote * 3
    elif len(text) - pos < 3 and text[pos:] == quote * (len(text) - pos):
        return None  # "" at the very end may open a triple-quoted string
    else:
        delimiter = quote
    pos += len(delimiter)
    while pos < len(text):
        if text[pos] == "\\":
            pos += 2
        elif text.startswith(delimiter, pos):
            return pos + len(delimiter)
        elif len(delimiter) == 1 and text[pos] == "\n":
            raise NotJson("a newline inside a string")
        else:
            pos += 1
    return None
