"""The request and response parts of structured outputs and tool calling (vLLM's and OpenAI's
names): `structured_outputs`, `response_format`, `tools`, `tool_choice`, tool calls in messages,
responses and stream deltas."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    Discriminator,
    Field,
    Tag,
    model_serializer,
    model_validator,
)
from pydantic_core import PydanticCustomError

from pagedlm.errors import InvalidRequest
from pagedlm.server.protocol_base import RequestBase


def _encodable(value: Any) -> Any:
    """Free-form JSON (a schema, a tag) reaches xgrammar and templates as UTF-8."""
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise PydanticCustomError(
            "lone_surrogate", "holds a lone surrogate: strings must be valid Unicode"
        ) from None
    return value


JsonObject = Annotated[dict[str, Any], AfterValidator(_encodable)]
JsonSchemaText = Annotated[str | dict[str, Any], AfterValidator(_encodable)]

# vLLM's removed request fields, and what replaces each (named in the 400 a request using one gets;
# vLLM ignores them, so a client would lose its constraint without knowing).
REMOVED_GUIDED_FIELDS = {
    "guided_json": "structured_outputs.json, or response_format of type json_schema",
    "guided_regex": "structured_outputs.regex",
    "guided_choice": "structured_outputs.choice",
    "guided_grammar": "structured_outputs.grammar",
    "guided_json_object": "structured_outputs.json_object, or response_format of type json_object",
    "guided_decoding_backend": "nothing: the backend is xgrammar (structured_outputs)",
    "guided_whitespace_pattern": "structured_outputs.disable_any_whitespace",
}


class StructuredOutputsBody(RequestBase):
    """The body's `structured_outputs`: SamplingParams' StructuredOutputsParams, which checks
    that exactly one constraint is set."""

    json_schema: JsonSchemaText | None = Field(None, alias="json")  # `json` is pydantic's
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    structural_tag: JsonSchemaText | None = None
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    whitespace_pattern: str | None = None  # refused by the engine with its reason

    def to_params(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True, exclude_defaults=True)


class TextFormat(RequestBase):
    type: Literal["text"]


class JsonObjectFormat(RequestBase):
    type: Literal["json_object"]


class JsonSchemaSpec(RequestBase):
    name: str
    description: str | None = None
    schema_: JsonObject = Field(alias="schema")  # `schema` is pydantic's
    strict: bool | None = None  # xgrammar's JSON is always strict


class JsonSchemaFormat(RequestBase):
    type: Literal["json_schema"]
    json_schema: JsonSchemaSpec


class StructuralTagItem(RequestBase):
    """vLLM's legacy structural tag: text between `begin` and `end` follows `schema`."""

    begin: str
    schema_: JsonObject = Field(alias="schema")  # `schema` is pydantic's
    end: str


class StructuralTagFormat(RequestBase):
    """xgrammar's structural tag, as vLLM takes it: its current `format` object, or the legacy
    `structures` with their `triggers` (free text until a trigger, then the structure it begins)."""

    type: Literal["structural_tag"]
    format: JsonObject | None = None
    structures: list[StructuralTagItem] | None = None
    triggers: list[str] | None = None

    @model_validator(mode="after")
    def _one_form(self) -> StructuralTagFormat:
        if (self.format is None) == (self.structures is None):
            raise ValueError("give either format or structures (with triggers), not both")
        if self.structures is not None and not self.triggers:
            raise ValueError("structures need triggers: the texts that begin a structure")
        if self.format is not None and self.triggers is not None:
            raise ValueError("triggers go with structures, not with format")
        return self

    def to_xgrammar(self) -> dict[str, Any]:
        """The structural tag in xgrammar's current form (the legacy one as triggered tags)."""
        if self.format is not None:
            return {"type": "structural_tag", "format": self.format}
        tags = [
            {
                "begin": item.begin,
                "content": {"type": "json_schema", "json_schema": item.schema_},
                "end": item.end,
            }
            for item in self.structures or []
        ]
        triggered = {"type": "triggered_tags", "triggers": self.triggers, "tags": tags}
        return {"type": "structural_tag", "format": triggered}


def _type_tag(value: Any) -> str | None:
    return value.get("type") if isinstance(value, dict) else None


ResponseFormat = Annotated[
    Annotated[TextFormat, Tag("text")]
    | Annotated[JsonObjectFormat, Tag("json_object")]
    | Annotated[JsonSchemaFormat, Tag("json_schema")]
    | Annotated[StructuralTagFormat, Tag("structural_tag")],
    Discriminator(
        _type_tag,
        custom_error_type="wrong_type",
        custom_error_message=(
            "must be an object of type text, json_object, json_schema or structural_tag"
        ),
    ),
]


def structured_outputs_of(
    structured: StructuredOutputsBody | None, response_format: Any
) -> tuple[dict[str, Any] | None, str | None]:
    """The request's constraint (StructuredOutputsParams' fields) and the parameter it came
    from; None, None without one. Raises InvalidRequest when both parameters set one."""
    if isinstance(response_format, JsonSchemaFormat):
        from_format = {"json": response_format.json_schema.schema_}
    elif isinstance(response_format, JsonObjectFormat):
        from_format = {"json_object": True}
    elif isinstance(response_format, StructuralTagFormat):
        from_format = {"structural_tag": response_format.to_xgrammar()}
    else:
        from_format = None
    if structured is not None and from_format is not None:
        raise InvalidRequest(
            "response_format: give structured_outputs or response_format, not both",
            param="response_format",
        )
    if structured is not None:
        return structured.to_params(), "structured_outputs"
    return from_format, None if from_format is None else "response_format"


# ---- tools ----------------------------------------------------------------------------------

FunctionName = Annotated[str, Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")]  # OpenAI's rule


class FunctionDefinition(RequestBase):
    name: FunctionName
    description: str | None = None
    parameters: JsonObject | None = None  # a JSON schema; None: no arguments
    strict: bool | None = None  # required and named choices are always enforced


class ChatTool(RequestBase):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(RequestBase):
    name: str


class NamedToolChoice(RequestBase):
    type: Literal["function"]
    function: NamedFunction


def _string_or_object(value: Any) -> str | None:
    return "string" if isinstance(value, str) else "object" if isinstance(value, dict) else None


ToolChoice = Annotated[
    Annotated[Literal["none", "auto", "required"], Tag("string")]
    | Annotated[NamedToolChoice, Tag("object")],
    Discriminator(
        _string_or_object,
        custom_error_type="wrong_shape",
        custom_error_message='must be "none", "auto", "required" or '
        '{"type": "function", "function": {"name": ...}}',
    ),
]


class FunctionCallIn(RequestBase):
    name: str
    arguments: str | JsonObject  # OpenAI's: a JSON string; an object is taken too


class ToolCallIn(RequestBase):
    """A tool call in an assistant message of the conversation."""

    id: str
    type: Literal["function"] = "function"
    function: FunctionCallIn


# ---- responses ------------------------------------------------------------------------------


class FunctionCall(BaseModel):
    name: str
    arguments: str  # JSON text, exactly as generated


class ToolCall(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class _Sparse(BaseModel):
    @model_serializer(mode="wrap")
    def _only_what_changed(self, handler: Any) -> dict[str, Any]:
        """A delta names only what it brings, as OpenAI's do."""
        return {key: value for key, value in handler(self).items() if value is not None}


class DeltaFunctionCall(_Sparse):
    name: str | None = None
    arguments: str | None = None


class DeltaToolCall(_Sparse):
    """A call's first delta has its id, type and name (and the arguments so far); later ones
    carry the next fragment of the arguments."""

    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: DeltaFunctionCall
