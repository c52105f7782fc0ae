"""The base of every request body: unknown fields forbidden, strict types, finite floats, valid
Unicode (protocol.py's docstring has the rules)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, field_validator
from pydantic_core import PydanticCustomError


def _surrogate_path(value: Any) -> str | None:
    """Where a lone surrogate is in a validated field value: "" for the value itself, ".3" for
    its item 3, ".<key>" for a dict key; None where there is none. Nested request models check
    their own fields."""
    if isinstance(value, str):
        return None if value.isascii() or _encodes(value) else ""
    if isinstance(value, dict):
        if any(_surrogate_path(key) is not None for key in value):
            return ".<key>"
        value = list(value.values())
    # Validated lists are homogeneous (list[int], list[str], list[list[int]], ...): a list whose
    # first item is not a string or a list holds none.
    if isinstance(value, list) and value and isinstance(value[0], (str, list)):
        for index, item in enumerate(value):
            inner = _surrogate_path(item)
            if inner is not None:
                return f".{index}{inner}"
    return None


def _encodes(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # only a lone surrogate cannot be encoded
        return False
    return True


class RequestBase(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)

    @field_validator("*")
    @classmethod
    def _valid_unicode(cls, value: Any) -> Any:
        """The tokenizer and UTF-8 cannot carry a lone surrogate: a 400 naming the field."""
        path = _surrogate_path(value)
        if path is not None:
            raise PydanticCustomError(
                "lone_surrogate",
                '{where}a lone surrogate (such as "\\ud800"): strings must be valid Unicode',
                {"where": f"item {path[1:]}: " if path else ""},
            )
        return value
