"""What the pythonic and qwen3_coder parsers make of argument values: Python literals read with
`ast` (never evaluated), and Qwen3-Coder's parameter text typed by the tool's JSON schema."""

from __future__ import annotations

from typing import Any

import pytest

from pagedlm.server.tool_parsers.json_scan import NotJson
from pagedlm.server.tool_parsers.python_literals import expression_end, literal
from pagedlm.server.tool_parsers.qwen3_coder_values import parameter_value


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("'a'", "a"),
        ('"""x\ny"""', "x\ny"),
        ("-2", -2),
        ("+1.5e3", 1500.0),
        ("[1, (2, 3), {'k': None}]", [1, [2, 3], {"k": None}]),
        ("True", True),
        ("'\\u00e9☃'", "é☃"),
    ],
)
def test_literals(text: str, value: Any) -> None:
    assert literal(text) == value


@pytest.mark.parametrize(
    "text",
    [
        "__import__('os').system('true')",
        "open('/etc/passwd')",
        "x",
        "b'bytes'",
        "1j",
        "{1, 2}",
        "{1: 'int key'}",
        "{**d}",
        "float('nan')",
        "1e999",  # inf: no JSON number
        "-True",
        "1 +",
        "[" * 10000,  # no RecursionError out of the parser
    ],
)
def test_non_literals_are_refused(text: str) -> None:
    with pytest.raises(NotJson):
        literal(text)


def test_expression_end_skips_brackets_and_strings() -> None:
    text = """ [1, ")"], {'a': (2, 3)}, '''x,)''' )"""
    assert expression_end(text, 0, ",)") == text.index("]") + 1
    assert expression_end(text, text.index("{"), ",)") == text.index("}") + 1
    tail = text.index("'''")
    assert expression_end(text, tail, ",)") == len(text) - 1
    assert expression_end('"a,', 0, ",)") is None  # in a string: not an end
    assert expression_end('x=""', 2, ",)") is None  # "" may open '''"""'''
    with pytest.raises(NotJson):
        expression_end("1]", 0, ",)")


INTEGER = {"type": "integer"}


@pytest.mark.parametrize(
    ("text", "schema", "value"),
    [
        ("42", None, "42"),  # a parameter the schema does not know stays text
        ("42", {"type": "string"}, "42"),
        ("null", {"type": "string"}, "null"),
        ("None", {"type": ["string", "null"]}, None),
        ("null", {"anyOf": [{"type": "string"}, {"type": "null"}]}, None),
        (" -7 ", INTEGER, -7),
        ("7.5", INTEGER, "7.5"),  # not of its type: stays text
        ("3", {"type": "number"}, 3),
        ("2.5e-1", {"type": "number"}, 0.25),
        ("nan", {"type": "number"}, "nan"),
        ("FALSE", {"type": "boolean"}, False),
        ("yes", {"type": "boolean"}, "yes"),
        ('{"a": [1, "}"]}', {"type": "object"}, {"a": [1, "}"]}),
        ("{'a': (1,)}", {"type": "object"}, {"a": [1]}),
        ("[1,", {"type": "array"}, "[1,"),
        ("null", INTEGER, None),
        ("1", {"enum": [1, 2]}, "1"),  # no type: text, as vLLM reads it
    ],
)
def test_qwen3_coder_parameter_values(text: str, schema: Any, value: Any) -> None:
    got = parameter_value(text, schema)
    assert got == value and type(got) is type(value)
