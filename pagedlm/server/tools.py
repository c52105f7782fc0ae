"""A chat request's tools: checked, how they shape the output (vLLM's rules), and the parser
that reads the calls back out of it.

- tool_choice "none": the template sees the tools, the output is content.
- "auto" (the default with tools): needs `--enable-auto-tool-choice --tool-call-parser NAME`;
  that parser finds calls in the model's free text.
- "required" and a named function: a JSON-schema constraint makes the model write the calls
  (an array of {"name", "parameters"} objects, anyOf over the tools; or the named function's
  arguments), so they always parse."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pagedlm.server.protocol import ChatCompletionRequest
from pagedlm.server.protocol_tools import ChatTool, NamedToolChoice
from pagedlm.server.serving import APIError
from pagedlm.server.tool_parsers import (
    TOOL_PARSERS,
    NamedToolParser,
    RequiredToolParser,
    ToolParser,
)

NO_ARGUMENTS = {"type": "object", "properties": {}}


@dataclass(frozen=True)
class ToolUse:
    template_tools: list[dict[str, Any]] | None  # what the chat template gets as `tools`
    constraint: dict[str, Any] | None  # StructuredOutputsParams' fields for required / named
    new_parser: Callable[[], ToolParser] | None  # one per choice; None: the output is content
    keeps_special_tokens: bool = False  # the parser reads special tokens in the text


def tool_use(body: ChatCompletionRequest, auto_parser: str | None, constrained: bool) -> ToolUse:
    """Raises APIError (400) for tools or a tool_choice that cannot be served. `auto_parser`:
    the server's --tool-call-parser where --enable-auto-tool-choice is on; `constrained`: the
    body has a constraint of its own (structured_outputs, response_format)."""
    tools = body.tools or []
    _check_unique_names(tools)
    choice = body.tool_choice or ("auto" if tools else "none")
    template_tools = template_tools_of(tools)
    max_calls = None if body.parallel_tool_calls else 1
    if choice == "none" or (choice == "auto" and not tools):
        return ToolUse(template_tools, None, None)
    if choice == "auto":
        if auto_parser is None:
            raise APIError(
                400,
                'tool_choice: "auto" needs the server started with --enable-auto-tool-choice '
                "and --tool-call-parser",
                param="tool_choice",
            )
        parser_class = TOOL_PARSERS[auto_parser]
        schemas = {tool.function.name: tool.function.parameters for tool in tools}
        return ToolUse(
            template_tools,
            None,
            lambda: parser_class(max_calls, schemas),
            parser_class.keeps_special_tokens,
        )
    if constrained:
        raise APIError(
            400,
            "tool_choice: a required or named tool choice sets the output's constraint; "
            "it cannot be combined with structured_outputs or response_format",
            param="tool_choice",
        )
    if choice == "required":
        if not tools:
            raise APIError(400, 'tool_choice: "required" needs tools', param="tool_choice")
        schema = required_schema(tools, body.parallel_tool_calls)
        return ToolUse(template_tools, {"json": schema}, lambda: RequiredToolParser(max_calls))
    tool = _named_tool(tools, choice)
    parameters = tool.function.parameters or NO_ARGUMENTS
    return ToolUse(
        template_tools, {"json": parameters}, lambda: NamedToolParser(tool.function.name)
    )


def template_tools_of(tools: list[ChatTool] | None) -> list[dict[str, Any]] | None:
    """The tools as chat templates read them (Hugging Face's `tools`: OpenAI's shape)."""
    return [tool.model_dump(exclude_none=True) for tool in tools or []] or None


def _check_unique_names(tools: list[ChatTool]) -> None:
    seen: set[str] = set()
    for index, tool in enumerate(tools):
        if tool.function.name in seen:
            raise APIError(
                400,
                f"tools.{index}.function.name: `{tool.function.name}` is given twice; "
                "function names must be unique",
                param="tools",
            )
        seen.add(tool.function.name)


def _named_tool(tools: list[ChatTool], choice: NamedToolChoice) -> ChatTool:
    name = choice.function.name
    for tool in tools:
        if tool.function.name == name:
            return tool
    known = ", ".join(tool.function.name for tool in tools) or "none"
    raise APIError(
        400,
        f"tool_choice: names the function `{name}`, which is not among the tools ({known})",
        param="tool_choice",
    )


def required_schema(tools: list[ChatTool], parallel_tool_calls: bool) -> dict[str, Any]:
    """An array of at least one call (exactly one without parallel calls), each
    {"name": <a tool's name>, "parameters": <its arguments>}. Each tool's `$defs` move to the
    top, where its `#/$defs/...` references point."""
    defs: dict[str, Any] = {}
    variants = []
    for tool in tools:
        parameters = copy.deepcopy(tool.function.parameters or NO_ARGUMENTS)
        tool_defs = parameters.pop("$defs", {})
        if not isinstance(tool_defs, dict):
            raise APIError(
                400, f"tools: `{tool.function.name}`'s $defs must be an object", param="tools"
            )
        for name, definition in tool_defs.items():
            if defs.setdefault(name, definition) != definition:
                raise APIError(
                    400,
                    f"tools: two tools define `$defs.{name}` differently; with "
                    'tool_choice "required" their definitions share one namespace',
                    param="tools",
                )
        variants.append(
            {
                "properties": {
                    "name": {"type": "string", "enum": [tool.function.name]},
                    "parameters": parameters,
                },
                "required": ["name", "parameters"],
            }
        )
    schema: dict[str, Any] = {
        "type": "array",
        "minItems": 1,
        "items": {"type": "object", "anyOf": variants},
    }
    if not parallel_tool_calls:
        schema["maxItems"] = 1
    if defs:
        schema["$defs"] = defs
    return schema
