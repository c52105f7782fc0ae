"""A StructuredOutputsParams as an xgrammar Grammar (no tokenizer needed) and its cache key.

`check_structured_outputs` is what the engine boundary runs: it parses the constraint, so a bad
schema, regex or grammar is refused with xgrammar's reason before the request enters the core."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from pagedlm.errors import InvalidRequest
from pagedlm.sampling_params import StructuredOutputsParams

if TYPE_CHECKING:
    import xgrammar as xgr

# (kind, the constraint as a canonical string, any_whitespace): equal keys compile to one grammar.
GrammarKey = tuple[str, str, bool]


def grammar_key(params: StructuredOutputsParams) -> GrammarKey:
    kind = params.kind
    value = getattr(params, kind)
    if kind == "json_object":
        text = ""
    elif isinstance(value, str):
        text = value
    else:  # a dict schema or tag, or the choice list
        text = json.dumps(value, sort_keys=True, ensure_ascii=False)
    return kind, text, not params.disable_any_whitespace


def build_grammar(params: StructuredOutputsParams) -> xgr.Grammar:
    """The constraint parsed by xgrammar; raises InvalidRequest naming the field on failure."""
    import xgrammar as xgr

    kind, text, any_whitespace = grammar_key(params)
    try:
        if kind == "json":
            return xgr.Grammar.from_json_schema(text, any_whitespace=any_whitespace)
        if kind == "json_object":
            return xgr.Grammar.builtin_json_grammar()
        if kind == "regex":
            return xgr.Grammar.from_regex(text)
        if kind == "grammar":
            return xgr.Grammar.from_ebnf(text)
        if kind == "choice":
            return xgr.Grammar.from_ebnf(choice_ebnf(params.choice or []))
        return xgr.Grammar.from_structural_tag(text)
    except (RuntimeError, ValueError, TypeError) as exc:  # xgrammar's parse errors
        raise InvalidRequest(
            f"structured_outputs.{kind} is invalid: {_reason(exc)}",
            param=f"structured_outputs.{kind}",
        ) from exc


def check_structured_outputs(params: StructuredOutputsParams | None) -> None:
    if params is not None:
        build_grammar(params)


def choice_ebnf(choices: list[str]) -> str:
    """root ::= "a" | "b" ...; JSON string escapes are xgrammar EBNF string escapes."""
    return "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)


def _reason(exc: Exception) -> str:
    """xgrammar's message without its C++ source prefix ("[time] file.cc:94: ")."""
    message = str(exc).strip()
    head, sep, tail = message.partition(".cc:")
    if sep and head.startswith("["):
        message = tail.partition(": ")[2] or message
    return message.removeprefix("Check failed: (error.empty()) is false: ")
