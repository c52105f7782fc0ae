"""The tool-call parsers on crafted model text: the finished reading, and streams cut at every
position, whose content and argument fragments must add up to the finished reading exactly."""

from __future__ import annotations

import json
import random
import re

import pytest

from pagedlm.server.cli import TOOL_PARSER_NAMES
from pagedlm.server.tool_parsers import (
    TOOL_PARSERS,
    NamedToolParser,
    Parsed,
    RequiredToolParser,
    ToolParser,
)
from pagedlm.server.tool_parsers.stream import ToolCallStream

WEATHER = '{"city": "Paris \\"centre\\" {x}", "days": [1, {"n": null}], "unit": "c"}'
HERMES_TWO_CALLS = (
    "Let me look.\n<tool_call>\n"
    f'{{"name": "get_weather", "arguments": {WEATHER}}}\n</tool_call>\n'
    '<tool_call>\n{"arguments": {}, "name": "get_time"}\n</tool_call>\n'
)

# (parser, text, expected content, expected [(name, arguments)])
CASES = {
    "hermes_two_calls": (
        "hermes",
        HERMES_TWO_CALLS,
        "Let me look.",
        [("get_weather", WEATHER), ("get_time", "{}")],
    ),
    "hermes_no_call_keeps_the_text": ("hermes", "a < b <tool x>\n\n", "a < b <tool x>\n\n", []),
    "hermes_call_only": (
        "hermes",
        '<tool_call>{"name": "f", "arguments": {"a": "</tool"}}</tool_call>',
        "",
        [("f", '{"a": "</tool"}')],
    ),
    "hermes_without_arguments": (
        "hermes",
        '<tool_call>{"name": "f"}</tool_call>',
        "",
        [("f", "{}")],
    ),
    "hermes_bad_json_is_content": (
        "hermes",
        '<tool_call>{"name": oops}</tool_call>',
        '<tool_call>{"name": oops}</tool_call>',
        [],
    ),
    "hermes_unclosed_call_at_the_end": (
        "hermes",
        'Hi <tool_call>{"name": "f", "arguments": {"q": 1}}',
        "Hi",
        [("f", '{"q": 1}')],
    ),
    "hermes_truncated_call_is_content": (
        "hermes",
        '<tool_call>{"name": "f", "arguments": {"q": ',
        '<tool_call>{"name": "f", "arguments": {"q": ',
        [],
    ),
    "llama3_json_two_calls": (
        "llama3_json",
        '<|python_tag|>{"name": "f", "parameters": {"x": 1.5e3}}; {"name": "g", "parameters": {}}',
        "",
        [("f", '{"x": 1.5e3}'), ("g", "{}")],
    ),
    "llama3_json_content": ("llama3_json", "The answer is {42}.", "The answer is {42}.", []),
    "llama3_json_bad_call_is_content": (
        "llama3_json",
        '{"name": "f", "parameters": {}} junk',
        '{"name": "f", "parameters": {}} junk',
        [],
    ),
    "mistral_array_two_calls": (
        "mistral",
        f'Sure.\n[TOOL_CALLS][{{"name": "get_weather", "arguments": {WEATHER}}}, '
        '{"arguments": {}, "name": "get_time"}]',
        "Sure.",
        [("get_weather", WEATHER), ("get_time", "{}")],
    ),
    "mistral_v11_two_calls": (
        "mistral",
        f"[TOOL_CALLS]get_weather[ARGS]{WEATHER}[TOOL_CALLS]get_time[ARGS]{{}}\n",
        "",
        [("get_weather", WEATHER), ("get_time", "{}")],
    ),
    "mistral_unicode": (
        "mistral",
        'Voilà [TOOL_CALLS]get_weather[ARGS]{"city": "Zürich ☃ \\u00e9"}',
        "Voilà",
        [("get_weather", '{"city": "Zürich ☃ \\u00e9"}')],
    ),
    "mistral_no_call_keeps_the_text": (
        "mistral",
        "[TOOL] calls [ARGS] {x}",
        "[TOOL] calls [ARGS] {x}",
        [],
    ),
    "mistral_bad_json_is_content": (
        "mistral",
        '[TOOL_CALLS][{"name": oops}]',
        '[TOOL_CALLS][{"name": oops}]',
        [],
    ),
    "mistral_bad_name_is_content": (
        "mistral",
        "[TOOL_CALLS]get weather[ARGS]{}",
        "[TOOL_CALLS]get weather[ARGS]{}",
        [],
    ),
    "mistral_truncated_call_is_content": (
        "mistral",
        '[TOOL_CALLS]f[ARGS]{"a": ',
        '[TOOL_CALLS]f[ARGS]{"a": ',
        [],
    ),
    "pythonic_two_calls": (
        "pythonic",
        """[get_weather(city="Paris \\"centre\\" {x}", days=[1, {'n': None}], unit='c'), """
        "get_time()]",
        "",
        [("get_weather", WEATHER), ("get_time", "{}")],
    ),
    "pythonic_llama4_literals": (
        "pythonic",
        '<|python_start|>[f(s="""a)\n"b",""", n=-1.5, t=(1, True), u=\'Zürich\',)]<|python_end|>',
        "",
        [("f", '{"s": "a)\\n\\"b\\",", "n": -1.5, "t": [1, true], "u": "Zürich"}')],
    ),
    "pythonic_bad_empty_list_is_content": ("pythonic", " []", " []", []),
    "mistral_bad_empty_array_is_content": ("mistral", "A [TOOL_CALLS][]", "A [TOOL_CALLS][]", []),
    "pythonic_content": ("pythonic", "[1] Smith et al. (2020)", "[1] Smith et al. (2020)", []),
    "pythonic_bad_call_is_content": (
        "pythonic",
        '[f(x=open("/etc/passwd"))]',
        '[f(x=open("/etc/passwd"))]',
        [],
    ),
    "pythonic_bad_positional_is_content": ("pythonic", "[f(1)]", "[f(1)]", []),
    "pythonic_bad_tail_is_content": ("pythonic", "[f(x=1)] and", "[f(x=1)] and", []),
    "pythonic_truncated_call_is_content": (
        "pythonic",
        "[f(x=1), g(y=",
        "[f(x=1), g(y=",
        [],
    ),
    "qwen3_coder_two_calls": (
        "qwen3_coder",
        "Let me look.\n<tool_call>\n<function=get_weather>\n"
        '<parameter=city>\nParis "centre" {x}\n</parameter>\n'
        '<parameter=days>\n[1, {"n": null}]\n</parameter>\n'
        "<parameter=unit>\nc\n</parameter>\n</function>\n</tool_call>\n"
        "<tool_call>\n<function=get_time>\n</function>\n</tool_call>",
        "Let me look.",
        [("get_weather", WEATHER), ("get_time", "{}")],
    ),
    "qwen3_coder_typed_values": (
        "qwen3_coder",
        "<tool_call>\n<function=typed>\n<parameter=n>\n-3\n</parameter>\n"
        "<parameter=x>\n2.5\n</parameter>\n<parameter=ok>\nTrue\n</parameter>\n"
        "<parameter=opt>\nnull\n</parameter>\n<parameter=code>\nif a < b:\n    "
        "return '</function>'\n</parameter>\n<parameter=extra>\n7\n</parameter>\n"
        "</function>\n</tool_call>",
        "",
        [
            (
                "typed",
                '{"n": -3, "x": 2.5, "ok": true, "opt": null, '
                '"code": "if a < b:\\n    return \'</function>\'", "extra": "7"}',
            )
        ],
    ),
    "qwen3_coder_no_call_keeps_the_text": (
        "qwen3_coder",
        "a <function=b> c\n",
        "a <function=b> c\n",
        [],
    ),
    "qwen3_coder_bad_call_is_content": (
        "qwen3_coder",
        "<tool_call>\n<parameter=x>1</parameter>\n</tool_call>",
        "<tool_call>\n<parameter=x>1</parameter>\n</tool_call>",
        [],
    ),
    "qwen3_coder_truncated_call_is_content": (
        "qwen3_coder",
        "<tool_call>\n<function=f>\n<parameter=a>\n1",
        "<tool_call>\n<function=f>\n<parameter=a>\n1",
        [],
    ),
}
# The tools' parameters, which qwen3_coder types its values by.
SCHEMAS = {
    "get_weather": {
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "days": {"type": "array"},
            "unit": {"enum": ["c", "f"]},
        },
    },
    "typed": {
        "type": "object",
        "properties": {
            "n": {"type": "integer"},
            "x": {"type": "number"},
            "ok": {"type": "boolean"},
            "opt": {"anyOf": [{"type": "string"}, {"type": "null"}]},
            "code": {"type": "string"},
        },
    },
}


def parser_named(name: str, max_calls: int | None = None) -> ToolParser:
    return TOOL_PARSERS[name](max_calls, SCHEMAS)


def streamed(parser: ToolParser, pieces: list[str]) -> Parsed:
    """What a client assembles from the deltas of a stream of `pieces`."""
    stream = ToolCallStream(parser)
    content = ""
    calls: dict[int, list[str]] = {}  # index -> [id, name, arguments]
    updates = [stream.feed(piece) for piece in pieces] + [stream.finish()]
    for new_content, deltas in updates:
        content += new_content
        for delta in deltas:
            if delta.index not in calls:
                assert delta.index == len(calls), "calls are announced in order"
                assert delta.id and delta.type == "function" and delta.function.name
                calls[delta.index] = [delta.id, delta.function.name, ""]
            else:
                assert delta.id is None and delta.function.name is None
            calls[delta.index][2] += delta.function.arguments or ""
    assert len({call[0] for call in calls.values()}) == len(calls), "ids are unique"
    return Parsed(content, [(name, arguments) for _, name, arguments in calls.values()])


def cuts(text: str) -> list[list[str]]:
    """The text in two pieces at every position, one character at a time, and random pieces."""
    rng = random.Random(0)
    splits = [[text[:i], text[i:]] for i in range(len(text) + 1)] + [list(text)]
    for _ in range(20):
        bounds = sorted(rng.sample(range(1, len(text)), min(6, len(text) - 1)))
        splits.append([text[a:b] for a, b in zip([0, *bounds], [*bounds, len(text)])])
    return splits


@pytest.mark.parametrize("case", CASES)
def test_finished_output_parses(case: str) -> None:
    name, text, content, calls = CASES[case]
    parsed = parser_named(name).parse(text, final=True)
    assert parsed.content == content
    assert [(c.name, c.arguments) for c in parsed.calls] == calls
    for _, arguments in calls:
        json.loads(arguments)


@pytest.mark.parametrize(
    "case", [c for c in CASES if "bad" not in c and "truncated" not in c]
)  # a stream cannot take back what it sent before the text turned out not to be calls
def test_streams_add_up_to_the_finished_output_at_every_cut(case: str) -> None:
    name, text, content, calls = CASES[case]
    for pieces in cuts(text):
        got = streamed(parser_named(name), pieces)
        assert (got.content, got.calls) == (content, calls), pieces


@pytest.mark.parametrize(
    "case",
    [
        "hermes_bad_json_is_content",
        "mistral_bad_json_is_content",
        "mistral_bad_name_is_content",
        "pythonic_content",
        "qwen3_coder_bad_call_is_content",
    ],
)
def test_a_stream_whose_call_turns_out_bad_keeps_what_it_sent(case: str) -> None:
    """Text that cannot be a call never reaches the client as a call; content stays content."""
    name, text, content, _ = CASES[case]
    for pieces in cuts(text):
        got = streamed(parser_named(name), pieces)
        assert got.calls == [], pieces
        assert content.startswith(got.content), pieces


@pytest.mark.parametrize("case", [c for c in CASES if c.endswith("_two_calls")])
def test_parallel_tool_calls_false_keeps_the_first_call(case: str) -> None:
    name, text, _, calls = CASES[case]
    parsed = parser_named(name, max_calls=1).parse(text, final=True)
    assert [(c.name, c.arguments) for c in parsed.calls] == calls[:1]
    assert streamed(parser_named(name, max_calls=1), list(text)).calls == calls[:1]


def test_call_ids_take_vllms_format_per_parser() -> None:
    """Mistral's tokenizer refuses ids other than 9 letters and digits."""
    formats = {
        "hermes": r"chatcmpl-tool-[0-9a-f]{32}",
        "llama3_json": r"chatcmpl-tool-[0-9a-f]{32}",
        "pythonic": r"chatcmpl-tool-[0-9a-f]{32}",
        "llama4_pythonic": r"chatcmpl-tool-[0-9a-f]{32}",
        "mistral": r"[A-Za-z0-9]{9}",
        "qwen3_coder": r"call_[0-9a-f]{24}",
    }
    assert sorted(formats) == sorted(TOOL_PARSERS)
    for name, pattern in formats.items():
        ids = {parser_named(name).new_call_id() for _ in range(20)}
        assert len(ids) == 20 and all(re.fullmatch(pattern, i) for i in ids), ids


def test_required_array_and_named_arguments() -> None:
    text = f' [{{"name": "get_weather", "parameters": {WEATHER}}}, {{"parameters": {{}}, "name": "t"}}]'
    expected = [("get_weather", WEATHER), ("t", "{}")]
    parsed = RequiredToolParser().parse(text, final=True)
    assert (parsed.content, [(c.name, c.arguments) for c in parsed.calls]) == ("", expected)
    named_text = f"\n{WEATHER} "
    parsed = NamedToolParser("get_weather").parse(named_text, final=True)
    assert [(c.name, c.arguments) for c in parsed.calls] == [("get_weather", WEATHER)]
    for pieces in cuts(text):
        assert streamed(RequiredToolParser(), pieces) == Parsed("", expected), pieces
    for pieces in cuts(named_text):
        assert streamed(NamedToolParser("get_weather"), pieces) == Parsed(
            "", [("get_weather", WEATHER)]
        )


def test_truncated_forced_output_is_content() -> None:
    """Cut short by max_tokens, a forced output is not a call (and says so as content)."""
    assert RequiredToolParser().parse('[{"name": "f", "para', final=True) == Parsed(
        '[{"name": "f", "para'
    )
    assert NamedToolParser("f").parse('{"a": ', final=True) == Parsed('{"a": ')


def test_the_cli_offers_every_parser() -> None:
    assert sorted(TOOL_PARSER_NAMES) == sorted(TOOL_PARSERS)


def mutated(rng: random.Random, text: str, pieces: list[str]) -> str:
    """The text, or it cut short, with a character gone, or with a piece of the format put in."""
    at = rng.randint(0, len(text))
    return rng.choice(
        [text, text[:at], text[:at] + text[at + 1 :], text[:at] + rng.choice(pieces) + text[at:]]
    )


@pytest.mark.parametrize("name", sorted({parser for parser, *_ in CASES.values()}))
def test_mangled_outputs_never_raise_and_streams_match_valid_calls(name: str) -> None:
    """The cases' outputs mangled at random, up to three times: every reading of every prefix
    returns (a model's bad output is content, never a 500), and where the finished output is
    calls, the stream fed a character at a time gives exactly them."""
    rng = random.Random(name)
    texts = [text for parser, text, _, _ in CASES.values() if parser == name]
    pieces = sorted({piece for text in texts for piece in re.findall(r"<[^<>]*>|\[\w+\]|\W", text)})
    results = {True: 0, False: 0}  # whether the finished output was calls
    for _ in range(400):
        text = rng.choice(texts)
        for _ in range(rng.randint(0, 3)):
            text = mutated(rng, text, pieces)
        final = parser_named(name).parse(text, final=True)
        got = streamed(parser_named(name), list(text))
        results[bool(final.calls)] += 1
        if final.calls:
            assert got == Parsed(final.content, [(c.name, c.arguments) for c in final.calls]), text
            for call in final.calls:
                json.loads(call.arguments)
        else:
            assert final.content == text
    assert min(results.values()) > 20, results  # both kinds were tried
