"""StructuredOutputsParams: exactly one constraint, typed fields, a dict accepted; xgrammar's
parse at the boundary names the field at fault (no model needed)."""

from __future__ import annotations

import pytest

from pagedlm.errors import InvalidRequest
from pagedlm.sampling_params import SamplingParams, StructuredOutputsParams
from pagedlm.structured_outputs.grammars import build_grammar, choice_ebnf, grammar_key


@pytest.mark.parametrize(
    "fields, param, match",
    [
        ({}, "structured_outputs", "exactly one of .* got none"),
        ({"json": "{}", "regex": "a"}, "structured_outputs", "got json, regex"),
        ({"json_object": False}, "structured_outputs", "got none"),
        ({"regex": 3}, "structured_outputs.regex", "must be str"),
        ({"choice": ["a", 1]}, "structured_outputs.choice", "non-empty list of strings"),
        (
            {"json": "{}", "whitespace_pattern": " "},
            "structured_outputs.whitespace_pattern",
            "not supported",
        ),
    ],
)
def test_malformed_params_are_refused(fields: dict, param: str, match: str) -> None:
    with pytest.raises(InvalidRequest, match=match) as info:
        StructuredOutputsParams(**fields)
    assert info.value.param == param


def test_a_dict_becomes_params_and_unknown_keys_are_refused() -> None:
    params = SamplingParams(structured_outputs={"regex": "a+", "disable_any_whitespace": True})
    assert params.structured_outputs == StructuredOutputsParams(
        regex="a+", disable_any_whitespace=True
    )
    with pytest.raises(InvalidRequest, match=r"unknown keys \['guided_regex'\]") as info:
        SamplingParams(structured_outputs={"guided_regex": "a+"})
    assert info.value.param == "structured_outputs"


@pytest.mark.parametrize(
    "fields, param, reason",
    [
        (
            {"json": '{"type": "nonsense"}'},
            "structured_outputs.json",
            'Unsupported type "nonsense"',
        ),
        ({"json": "{not json"}, "structured_outputs.json", "Failed to parse JSON"),
        ({"regex": "a(b"}, "structured_outputs.regex", "parenthesis is not closed"),
        ({"grammar": "root ::= undefined_rule"}, "structured_outputs.grammar", "not defined"),
        ({"structural_tag": "{"}, "structured_outputs.structural_tag", "Failed to parse JSON"),
    ],
)
def test_bad_constraints_name_the_field_and_xgrammar_reason(
    fields: dict, param: str, reason: str
) -> None:
    with pytest.raises(InvalidRequest, match=reason) as info:
        build_grammar(StructuredOutputsParams(**fields))
    assert info.value.param == param
    assert ".cc:" not in str(info.value)  # xgrammar's C++ location is cut


def test_equal_constraints_share_a_key() -> None:
    """A dict schema keys by its canonical JSON: key order does not matter; whitespace does."""
    a = StructuredOutputsParams(json={"type": "object", "required": []})
    b = StructuredOutputsParams(json={"required": [], "type": "object"})
    c = StructuredOutputsParams(json=b.json, disable_any_whitespace=True)
    assert grammar_key(a) == grammar_key(b) != grammar_key(c)


def test_choice_strings_are_escaped() -> None:
    """Quotes, backslashes and newlines in a choice stay literal in the EBNF."""
    choices = ['say "hi"', "back\\slash", "two\nlines"]
    assert "root ::=" in str(build_grammar(StructuredOutputsParams(choice=choices)))
    assert choice_ebnf(choices) == r'root ::= "say \"hi\"" | "back\\slash" | "two\nlines"'
