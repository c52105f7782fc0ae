"""tool_choice "auto" through the real `openai` client for each --tool-call-parser other than
hermes (test_structured_outputs_http.py's), and --reasoning-parser, on a tiny random model whose
output a grammar writes: the whole answer and the stream's deltas must give the same reasoning,
content and calls, with finish_reason "tool_calls" and vLLM's ids."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from server_helpers import ServerProcess, start_server, tiny_server_args

pytestmark = pytest.mark.slow

CITY = {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": CITY}},
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}},
]
ARGUMENTS = '{"city": "Zürich {\\"x\\"}", "days": 3}'
EXPECTED_CALLS = [("get_weather", ARGUMENTS), ("get_time", "{}")]
# parser -> (what the model writes, the content, the ids' format)
OUTPUTS = {
    "mistral": (
        f"Sure.\n[TOOL_CALLS]get_weather[ARGS]{ARGUMENTS}[TOOL_CALLS]get_time[ARGS]{{}}",
        "Sure.",
        r"[A-Za-z0-9]{9}",
    ),
    "pythonic": (
        '[get_weather(city="Zürich {\\"x\\"}", days=3), get_time()]',
        None,
        r"chatcmpl-tool-[0-9a-f]{32}",
    ),
    "qwen3_coder": (
        'Sure.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nZürich {"x"}\n'
        "</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>\n"
        "<tool_call>\n<function=get_time>\n</function>\n</tool_call>",
        "Sure.",
        r"call_[0-9a-f]{24}",
    ),
}


# Qwen3-Coder's server also splits Qwen3's think blocks: outputs without one are content.
REASONING = {"qwen3_coder": "qwen3", "hermes": "deepseek_r1"}


def _server(tiny_model_dir: Path, log_path: Path, parser: str) -> ServerProcess:
    args = ["--max-model-len", "512", "--enable-auto-tool-choice", "--tool-call-parser", parser]
    if parser in REASONING:
        args += ["--reasoning-parser", REASONING[parser]]
    return start_server(tiny_server_args(tiny_model_dir, *args), log_path)


@pytest.fixture(scope="module", params=sorted(OUTPUTS))
def parser_server(
    request: pytest.FixtureRequest, tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, ServerProcess]]:
    name = request.param
    server = _server(tiny_model_dir, tmp_path_factory.mktemp(f"tools_{name}") / "log", name)
    yield name, server
    server.stop()


def chat(server: ServerProcess, stream: bool, output: str, **kwargs: Any) -> dict[str, Any]:
    """The first choice as {content, tool_calls: [(id, name, arguments)], finish_reason}, from
    the whole answer or assembled from the stream's deltas; the grammar writes `output`."""
    client = openai.OpenAI(base_url=server.url("/v1"), api_key="none", timeout=300)
    kwargs = {
        "model": client.models.list().data[0].id,
        "messages": [{"role": "user", "content": "The weather in Zürich?"}],
        "tools": TOOLS,
        "max_tokens": 200,
        "temperature": 0,  # one of the ways to tokenize the output, the same each time
        "extra_body": {
            "structured_outputs": {"grammar": f"root ::= {json.dumps(output, ensure_ascii=False)}"}
        },
        **kwargs,
    }
    if not stream:
        choice = client.chat.completions.create(**kwargs).choices[0]
        calls = [
            (c.id, c.function.name, c.function.arguments) for c in choice.message.tool_calls or []
        ]
        return {
            "reasoning": choice.message.reasoning_content,  # an extra field to the client
            "content": choice.message.content,
            "tool_calls": calls,
            "finish_reason": choice.finish_reason,
        }
    reasoning, content, streamed, finish_reason = None, None, {}, None
    for chunk in client.chat.completions.create(stream=True, **kwargs):
        delta = chunk.choices[0].delta
        if getattr(delta, "reasoning_content", None):
            reasoning = (reasoning or "") + delta.reasoning_content
        if delta.content:
            content = (content or "") + delta.content
        for call in delta.tool_calls or []:
            if call.index not in streamed:
                assert call.id and call.type == "function" and call.function.name, call
                streamed[call.index] = [call.id, call.function.name, ""]
            else:
                assert call.id is None and call.function.name is None, call
            streamed[call.index][2] += call.function.arguments or ""
        finish_reason = chunk.choices[0].finish_reason or finish_reason
    return {
        "reasoning": reasoning,
        "content": content,
        "tool_calls": [tuple(call) for call in streamed.values()],
        "finish_reason": finish_reason,
    }


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_auto_tool_choice_reads_the_parsers_calls(
    parser_server: tuple[str, ServerProcess], stream: bool
) -> None:
    name, server = parser_server
    output, content, id_format = OUTPUTS[name]
    answer = chat(server, stream, output)
    assert answer["content"] == content, answer
    assert [call[1:] for call in answer["tool_calls"]] == EXPECTED_CALLS, answer
    assert answer["finish_reason"] == "tool_calls"
    for call_id, _, _ in answer["tool_calls"]:
        assert re.fullmatch(id_format, call_id), call_id
    one = chat(server, stream, output, parallel_tool_calls=False)
    assert [call[1:] for call in one["tool_calls"]] == EXPECTED_CALLS[:1]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_malformed_call_is_content(
    parser_server: tuple[str, ServerProcess], stream: bool
) -> None:
    """An output cut short (max_tokens) is no call: the text comes back as content (a stream
    keeps what it sent), never an error."""
    name, server = parser_server
    output = OUTPUTS[name][0]
    whole = chat(server, False, output, max_tokens=12)
    assert whole["tool_calls"] == [] and whole["finish_reason"] == "length"
    assert output.startswith(whole["content"])
    if stream:
        streamed = chat(server, True, output, max_tokens=12)
        assert streamed["finish_reason"] == "length"
        assert whole["content"].startswith(streamed["content"] or "")
        for (_, name, arguments), (expected_name, expected) in zip(
            streamed["tool_calls"], EXPECTED_CALLS, strict=False
        ):  # what was sent before the cut stands: a start of the call
            assert name == expected_name and expected.startswith(arguments)


THOUGHT = "\nThe user wants {weather}; </think is not the end.\n"


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_qwen3_thinks_then_calls(parser_server: tuple[str, ServerProcess], stream: bool) -> None:
    """The think block is reasoning_content; the calls are read from what follows it."""
    name, server = parser_server
    if name not in REASONING:
        pytest.skip("this parser's server splits no think blocks")
    output, content, _ = OUTPUTS[name]
    answer = chat(server, stream, f"<think>{THOUGHT}</think>\n\n{output}")
    assert answer["reasoning"] == THOUGHT
    assert answer["content"] == "\n\n" + content
    assert [call[1:] for call in answer["tool_calls"]] == EXPECTED_CALLS


@pytest.fixture(scope="module")
def deepseek_r1_server(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    server = _server(tiny_model_dir, tmp_path_factory.mktemp("deepseek_r1") / "log", "hermes")
    yield server
    server.stop()


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_deepseek_r1_splits_the_think_block(
    deepseek_r1_server: ServerProcess, stream: bool
) -> None:
    """(The output that starts inside the block, which the template opened, is in
    test_reasoning.py: here a grammar writes the output, and under a constraint only an explicit
    <think> opens the block.)"""
    answer = chat(deepseek_r1_server, stream, f"<think>{THOUGHT}</think>\n\nIt is sunny.")
    assert (answer["reasoning"], answer["content"]) == (THOUGHT, "\n\nIt is sunny.")
    assert answer["tool_calls"] == [] and answer["finish_reason"] == "stop"
    cut = chat(
        deepseek_r1_server, stream, f"<think>{THOUGHT}</think>\n\nIt is sunny.", max_tokens=6
    )
    assert THOUGHT.startswith(cut["reasoning"]) and cut["content"] is None  # still thinking
    plain = chat(deepseek_r1_server, stream, f"{THOUGHT}</think>It is sunny.")
    assert (plain["reasoning"], plain["content"]) == (None, f"{THOUGHT}</think>It is sunny.")
