"""Tools without a server: the JSON schema that enforces tool_choice "required" (vLLM's shape),
"auto" without the server's flags, and how chat templates get tools and earlier tool calls."""

from __future__ import annotations

import argparse
import json
from typing import Any

import pytest
import tiny_hf_models

from pagedlm.engine.tokenizer import render_chat_template
from pagedlm.server.cli import add_serve_parser
from pagedlm.server.protocol import ChatCompletionRequest
from pagedlm.server.protocol_tools import StructuralTagFormat
from pagedlm.server.serving import APIError
from pagedlm.server.tools import required_schema, tool_use

CITY = {
    "type": "object",
    "properties": {"city": {"$ref": "#/$defs/name"}},
    "$defs": {"name": {"type": "string"}},
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": CITY}},
    {"type": "function", "function": {"name": "get_time"}},
]
HI = [{"role": "user", "content": "Hi"}]


def request(**fields: Any) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"messages": HI, "tools": TOOLS, **fields})


def test_required_is_an_array_of_calls_anyof_the_tools() -> None:
    body = request(tool_choice="required", parallel_tool_calls=False)
    schema = tool_use(body, None, constrained=False).constraint["json"]
    assert schema == required_schema(body.tools, parallel_tool_calls=False)
    assert (schema["type"], schema["minItems"], schema["maxItems"]) == ("array", 1, 1)
    assert schema["$defs"] == CITY["$defs"]  # hoisted to where "#/$defs/name" points
    weather, time = schema["items"]["anyOf"]
    assert weather["properties"]["name"] == {"type": "string", "enum": ["get_weather"]}
    assert weather["properties"]["parameters"] == {k: v for k, v in CITY.items() if k != "$defs"}
    assert time["properties"]["parameters"] == {"type": "object", "properties": {}}
    assert weather["required"] == ["name", "parameters"]
    assert "maxItems" not in required_schema(body.tools, parallel_tool_calls=True)


def test_named_choice_is_its_parameters_and_none_reads_no_calls() -> None:
    named = tool_use(
        request(tool_choice={"type": "function", "function": {"name": "get_weather"}}), None, False
    )
    assert named.constraint == {"json": CITY}
    assert named.new_parser().parse('{"city": "Oslo"}', final=True).calls[0].name == "get_weather"
    none = tool_use(request(tool_choice="none"), None, False)
    assert none.constraint is None and none.new_parser is None and len(none.template_tools) == 2


def test_auto_needs_the_server_flags() -> None:
    """tools without tool_choice mean "auto", as in OpenAI's API; vLLM's 400 without the flags."""
    with pytest.raises(APIError) as caught:
        tool_use(request(), None, False)
    assert caught.value.status == 400 and caught.value.param == "tool_choice"
    assert "--enable-auto-tool-choice" in caught.value.message
    assert "--tool-call-parser" in caught.value.message
    assert tool_use(request(), "hermes", False).new_parser is not None
    parser = argparse.ArgumentParser()
    add_serve_parser(parser.add_subparsers())
    args = parser.parse_args(["serve", "--enable-auto-tool-choice"])
    with pytest.raises(ValueError, match="needs --tool-call-parser"):
        args.func(args)


def test_auto_parsers_get_the_tools_and_mistral_keeps_special_tokens() -> None:
    """qwen3_coder types values by the tools' schemas; [TOOL_CALLS] is a special token, which
    the mistral parser must see (vLLM turns skip_special_tokens off for it too)."""
    qwen = tool_use(request(), "qwen3_coder", False)
    assert qwen.new_parser().tools["get_weather"] == CITY and not qwen.keeps_special_tokens
    assert tool_use(request(), "mistral", False).keeps_special_tokens
    assert not tool_use(request(tool_choice="none"), "mistral", False).keeps_special_tokens


def test_tools_with_conflicting_defs_under_required() -> None:
    other = {"type": "object", "$defs": {"name": {"type": "integer"}}}
    tools = [TOOLS[0], {"type": "function", "function": {"name": "f", "parameters": other}}]
    with pytest.raises(APIError, match=r"\$defs.name") as caught:
        tool_use(request(tools=tools, tool_choice="required"), None, False)
    assert caught.value.param == "tools"
    not_an_object = {"type": "function", "function": {"name": "f", "parameters": {"$defs": 5}}}
    with pytest.raises(APIError, match=r"\$defs must be an object"):
        tool_use(request(tools=[not_an_object], tool_choice="required"), None, False)


TOOL_AWARE_TEMPLATE = (
    "{% if tools %}TOOLS={{ tools | tojson }}\n{% endif %}"
    "{% for m in messages %}{{ m.role }}: {{ m.content }}"
    "{% for c in m.tool_calls or [] %}CALL {{ c.function.name }} {{ c.function.arguments.city }}"
    "{% endfor %}\n{% endfor %}"
)
CALL_HISTORY = [
    *HI,
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": "1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": {"city": "Oslo"}},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "1", "content": "sunny"},
]


@pytest.fixture
def tokenizer() -> Any:
    return tiny_hf_models.byte_level_tokenizer()


def test_a_template_that_knows_tools_gets_them(tokenizer: Any) -> None:
    tokenizer.chat_template = TOOL_AWARE_TEMPLATE
    text = render_chat_template(tokenizer, CALL_HISTORY, tools=TOOLS)
    assert text.startswith("TOOLS=[") and '"get_weather"' in text
    assert "CALL get_weather Oslo" in text  # the arguments as an object


def test_a_template_without_tools_gets_them_in_hermes_format(tokenizer: Any) -> None:
    """The default model's kind of template (role: content lines): the tools in a system
    message, earlier calls as <tool_call> text, what the hermes parser reads."""
    text = render_chat_template(tokenizer, CALL_HISTORY, tools=TOOLS)
    assert text.startswith("system: # Tools")
    assert json.dumps(TOOLS[0]) in text and "<tool_call>" in text
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    assert f"assistant: {call}\n" in text
    assert text.endswith("tool: sunny\nassistant:")
    without_tools = render_chat_template(tokenizer, HI)
    assert without_tools == "user: Hi\nassistant:"


def test_a_grammar_that_fails_in_the_core_ends_the_request_with_a_400() -> None:
    """The core fails a request whose grammar does not compile in time (RequestOutput.error);
    the client gets a 400 with the reason, not a finished answer."""
    import asyncio
    from types import SimpleNamespace

    from pagedlm.server.serving import GENERATION_ERRORS, Generation, generation_error

    reason = "structured_outputs: the grammar did not compile within 30 s"

    class FakeEngine:
        def add_request(self, *args: object, **kwargs: object) -> None:
            pass

        async def outputs(self, engine_id: str):
            yield SimpleNamespace(error=reason)

        def release(self, engine_id: str) -> None:
            pass

    class Connected:
        async def receive(self) -> dict:
            await asyncio.sleep(3600)
            return {}

    async def run() -> Exception:
        ctx = SimpleNamespace(engine=FakeEngine())
        body = SimpleNamespace(priority=0, stream=False)
        generation = Generation(ctx, Connected(), "r", [object()], body)
        try:
            async for _ in generation:
                pass
        except GENERATION_ERRORS as exc:
            return exc
        raise AssertionError("the failed request finished")

    error = generation_error(asyncio.run(run()))
    assert (error.status, error.message) == (400, reason)


def _accepts(structural_tag: dict[str, Any], text: str) -> bool:
    """Whether xgrammar's matcher for the structural tag takes the whole text and may end."""
    import xgrammar as xgr

    from pagedlm.sampling_params import StructuredOutputsParams
    from pagedlm.structured_outputs.grammars import build_grammar

    grammar = build_grammar(StructuredOutputsParams(structural_tag=structural_tag))
    vocab = [chr(c) for c in range(32, 127)]  # one character a token: any text is spelt
    compiled = xgr.GrammarCompiler(xgr.TokenizerInfo(vocab)).compile_grammar(grammar)
    matcher = xgr.GrammarMatcher(compiled, terminate_without_stop_token=True)
    return matcher.accept_string(text) and matcher.is_terminated()


def test_legacy_structural_tag_becomes_xgrammar_triggered_tags() -> None:
    """vLLM's legacy form (structures + triggers): free text until a trigger, then the structure
    it begins, whose content follows its schema."""
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    body = {
        "type": "structural_tag",
        "structures": [{"begin": "<f>", "schema": schema, "end": "</f>"}],
        "triggers": ["<f"],
    }
    tag = StructuralTagFormat.model_validate(body).to_xgrammar()
    assert _accepts(tag, 'so: <f>{"a": 1}</f> done')
    assert not _accepts(tag, 'so: <f>{"a": "one"}</f>')  # the content breaks the schema
