"""A Qwen3-Coder parameter's text as the JSON value its schema's type names (vLLM's rules): a
string stays text, numbers and booleans are read, objects and arrays are JSON (or a Python
literal), "null" is null where the type is not a string's. Text that is not of its type stays
text, as with a parameter the schema does not know."""

from __future__ import annotations

import json
import math
import re

from pagedlm.server.tool_parsers.json_scan import NotJson
from pagedlm.server.tool_parsers.python_literals import literal

_INTEGER = re.compile(r"\s*[-+]?\d+\s*")
_NULLS = ("null", "none")  # Qwen3.5's template writes a null argument as Python's None


def parameter_value(text: str, schema: object) -> object:
    if not isinstance(schema, dict):
        return text
    types = _types(schema)
    kind = next((t for t in types if t != "null"), "string")
    if text.strip().lower() in _NULLS and ("null" in types or kind != "string"):
        return None
    if kind == "string":
        return text
    if kind == "integer":
        return int(text) if _INTEGER.fullmatch(text) else text
    if kind == "number":
        return _number(text)
    if kind == "boolean":
        return {"true": True, "false": False}.get(text.strip().lower(), text)
    return _structured(text, python=kind in ("object", "array"))


def _types(schema: dict) -> list[str]:
    """The type names a schema allows: its "type" (a name or a list), else its anyOf/oneOf
    options' types."""
    declared = schema.get("type")
    if isinstance(declared, str):
        return [declared.lower()]
    if isinstance(declared, list):
        return [t.lower() for t in declared if isinstance(t, str)]
    options = schema.get("anyOf") or schema.get("oneOf") or []
    types = []
    for option in options if isinstance(options, list) else []:
        if isinstance(option, dict):
            types.extend(_types(option))
    return types


def _number(text: str) -> object:
    if _INTEGER.fullmatch(text):
        return int(text)
    try:
        value = float(text)
    except ValueError:
        return text
    return value if math.isfinite(value) else text


def _structured(text: str, python: bool) -> object:
    try:
        return json.loads(text)
    except ValueError:
        pass
    if python:
        try:
            return literal(text)
        except NotJson:
            pass
    return text
