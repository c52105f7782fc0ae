"""Structured outputs and tool calls through the real `openai` client on the default model:
response_format (a nested JSON schema, json_object), structured_outputs (regex, choice, EBNF)
on both endpoints, and tool_choice required / named / auto (hermes), whole and streamed. A
stream at temperature 0 must add up to the whole answer exactly. (Bad inputs: test_errors.py;
the parsers on crafted text: test_tool_parsers.py.)"""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
import jsonschema
import openai
import pytest
from server_helpers import API_KEY, ServerProcess

pytestmark = pytest.mark.slow

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 10},
        "age": {"type": "integer", "minimum": 18, "maximum": 99},
        "role": {"enum": ["admin", "user"]},
        "tags": {
            "type": "array",
            "items": {"type": "string", "maxLength": 6},
            "minItems": 1,
            "maxItems": 2,
        },
        "address": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 10}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "age", "role", "tags", "address"],
    "additionalProperties": False,
}
CITY = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 10}},
    "required": ["city"],
    "additionalProperties": False,
}
TIME_ZONE = {
    "type": "object",
    "properties": {"tz": {"enum": ["CET", "UTC", "PST"]}},
    "required": ["tz"],
    "additionalProperties": False,
}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city",
            "parameters": CITY,
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "description": "The time in a zone",
            "parameters": TIME_ZONE,
        },
    },
]
SCHEMAS = {tool["function"]["name"]: tool["function"]["parameters"] for tool in TOOLS}
WEATHER_QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def client(default_server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=default_server.url("/v1"), api_key=API_KEY, timeout=300)


@pytest.fixture(scope="module")
def model(client: openai.OpenAI) -> str:
    return client.models.list().data[0].id


def chat(client: openai.OpenAI, model: str, stream: bool, **kwargs: Any) -> dict[str, Any]:
    """The first choice as {content, tool_calls: [(id, name, arguments)], finish_reason}, from
    the whole answer or assembled from the stream's deltas."""
    kwargs = {"model": model, "temperature": 0, "max_tokens": 60, **kwargs}
    if not stream:
        choice = client.chat.completions.create(**kwargs).choices[0]
        calls = [(c.id, c.function.name, c.function.arguments) for c in choice.message.tool_calls]
        return {
            "content": choice.message.content,
            "tool_calls": calls,
            "finish_reason": choice.finish_reason,
        }
    content, calls, finish_reason = None, {}, None
    for chunk in client.chat.completions.create(stream=True, **kwargs):
        delta = chunk.choices[0].delta
        if delta.content:
            content = (content or "") + delta.content
        for call in delta.tool_calls or []:
            if call.index not in calls:
                assert call.id and call.type == "function" and call.function.name, call
                calls[call.index] = [call.id, call.function.name, ""]
            else:
                assert call.id is None and call.function.name is None, call
            calls[call.index][2] += call.function.arguments or ""
        finish_reason = chunk.choices[0].finish_reason or finish_reason
    return {
        "content": content,
        "tool_calls": [tuple(call) for call in calls.values()],
        "finish_reason": finish_reason,
    }


def without_ids(answer: dict[str, Any]) -> dict[str, Any]:
    return {**answer, "tool_calls": [call[1:] for call in answer["tool_calls"]]}


@pytest.fixture(scope="module")
def person_answers(client: openai.OpenAI, model: str) -> dict[bool, dict[str, Any]]:
    response_format = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
    messages = [{"role": "user", "content": "Describe a user of a web shop as JSON."}]
    return {
        stream: chat(
            client,
            model,
            stream,
            messages=messages,
            response_format=response_format,
            max_tokens=100,
        )
        for stream in (False, True)
    }


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_json_schema_response_format_validates(
    person_answers: dict[bool, dict[str, Any]], stream: bool
) -> None:
    answer = person_answers[stream]
    assert answer["finish_reason"] == "stop"
    jsonschema.validate(json.loads(answer["content"]), PERSON)


def test_a_stream_adds_up_to_the_whole_answer(person_answers: dict[bool, dict[str, Any]]) -> None:
    assert person_answers[True] == person_answers[False]


def test_json_object_response_format(client: openai.OpenAI, model: str) -> None:
    messages = [{"role": "user", "content": 'Reply with the JSON object {"ok": true}.'}]
    answer = chat(client, model, False, messages=messages, response_format={"type": "json_object"})
    assert answer["finish_reason"] == "stop"
    assert isinstance(json.loads(answer["content"]), dict)


@pytest.mark.parametrize(
    "constraint, check",
    [
        ({"regex": r"\d{3}-[a-z]{2}"}, lambda text: re.fullmatch(r"\d{3}-[a-z]{2}", text)),
        ({"choice": ["yes", "no", "maybe"]}, lambda text: text in ("yes", "no", "maybe")),
        (
            {"grammar": 'root ::= "The sky is " ("red" | "blue") "."'},
            lambda text: text in ("The sky is red.", "The sky is blue."),
        ),
    ],
    ids=["regex", "choice", "grammar"],
)
def test_structured_outputs_on_completions(
    client: openai.OpenAI, model: str, constraint: dict, check: Any
) -> None:
    result = client.completions.create(
        model=model,
        prompt="Answer:",
        max_tokens=20,
        temperature=0,
        extra_body={"structured_outputs": constraint},
    )
    assert result.choices[0].finish_reason == "stop"
    assert check(result.choices[0].text), result.choices[0].text


def test_response_format_on_completions(client: openai.OpenAI, model: str) -> None:
    schema = {"name": "time", "schema": TIME_ZONE}
    result = client.completions.create(
        model=model,
        prompt="A time zone as JSON:",
        max_tokens=20,
        temperature=0,
        extra_body={"response_format": {"type": "json_schema", "json_schema": schema}},
    )
    jsonschema.validate(json.loads(result.choices[0].text), TIME_ZONE)


def test_structural_tag_response_format(client: openai.OpenAI, model: str) -> None:
    """xgrammar's current form: the whole output is the tag around JSON valid for the schema."""
    tag = {"type": "tag", "begin": "<zone>", "end": "</zone>"}
    tag["content"] = {"type": "json_schema", "json_schema": TIME_ZONE}
    response_format = {"type": "structural_tag", "format": tag}
    result = client.completions.create(
        model=model,
        prompt="A time zone as JSON:",
        max_tokens=40,
        temperature=0,
        extra_body={"response_format": response_format},
    )
    text = result.choices[0].text
    assert result.choices[0].finish_reason == "stop", text
    assert text.startswith("<zone>") and text.endswith("</zone>"), text
    jsonschema.validate(json.loads(text.removeprefix("<zone>").removesuffix("</zone>")), TIME_ZONE)


def assert_calls_valid(answer: dict[str, Any], names: list[str]) -> None:
    assert answer["finish_reason"] == "tool_calls" and answer["content"] is None, answer
    assert [name for _, name, _ in answer["tool_calls"]] == names
    for call_id, name, arguments in answer["tool_calls"]:
        assert call_id.startswith("chatcmpl-tool-")
        jsonschema.validate(json.loads(arguments), SCHEMAS[name])


@pytest.mark.parametrize(
    "tool_choice",
    ["required", {"type": "function", "function": {"name": "get_time"}}],
    ids=["required", "named"],
)
def test_forced_tool_calls_whole_and_streamed(
    client: openai.OpenAI, model: str, tool_choice: Any
) -> None:
    """One call (parallel_tool_calls false), valid for its tool's schema; the stream's id, name
    and argument fragments add up to the whole answer."""
    answers = [
        chat(
            client,
            model,
            stream,
            messages=WEATHER_QUESTION,
            tools=TOOLS,
            tool_choice=tool_choice,
            parallel_tool_calls=False,
        )
        for stream in (False, True)
    ]
    names = ["get_time"] if isinstance(tool_choice, dict) else [answers[0]["tool_calls"][0][1]]
    for answer in answers:
        assert_calls_valid(answer, names)
    assert without_ids(answers[0]) == without_ids(answers[1])


HERMES_CALLS = (
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "get_time", "arguments": {"tz": "CET"}}\n</tool_call>'
)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_auto_tool_choice_reads_hermes_calls(
    client: openai.OpenAI, model: str, stream: bool
) -> None:
    """The server's --tool-call-parser hermes reads the calls out of the text (written here by a
    grammar, so that the small model writes two of them)."""
    fields = {
        "messages": WEATHER_QUESTION,
        "tools": TOOLS,
        "max_tokens": 100,
        "extra_body": {"structured_outputs": {"grammar": f"root ::= {json.dumps(HERMES_CALLS)}"}},
    }
    answer = chat(client, model, stream, **fields)
    assert_calls_valid(answer, ["get_weather", "get_time"])
    assert [arguments for *_, arguments in answer["tool_calls"]] == [
        '{"city": "Paris"}',
        '{"tz": "CET"}',
    ]
    if not stream:
        one = chat(client, model, stream, parallel_tool_calls=False, **fields)
        assert [name for _, name, _ in one["tool_calls"]] == ["get_weather"]


def test_auto_tool_choice_without_a_call_is_content(client: openai.OpenAI, model: str) -> None:
    answers = [
        chat(client, model, stream, messages=WEATHER_QUESTION, tools=TOOLS, max_tokens=8)
        for stream in (False, True)
    ]
    assert answers[0] == answers[1]
    assert answers[0]["tool_calls"] == [] and answers[0]["content"]


def test_a_conversation_with_tool_calls_and_results(client: openai.OpenAI, model: str) -> None:
    """An assistant's earlier calls (arguments as a JSON string) and the tool's result render
    through the default model's template."""
    messages = [
        *WEATHER_QUESTION,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": '{"celsius": 21}'},
    ]
    answer = chat(client, model, False, messages=messages, tools=TOOLS, max_tokens=4)
    assert answer["finish_reason"] in ("stop", "length") and answer["content"]


def test_tokenize_renders_the_tools(default_server: ServerProcess) -> None:
    def count(**fields: Any) -> int:
        body = {"messages": WEATHER_QUESTION, **fields}
        headers = {"Authorization": f"Bearer {API_KEY}"}
        response = httpx.post(default_server.url("/tokenize"), json=body, headers=headers)
        assert response.status_code == 200, response.text
        return response.json()["count"]

    assert count(tools=TOOLS) > count() + 50  # the tools' signatures in the system message
