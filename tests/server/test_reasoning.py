"""--reasoning-parser's split of <think>...</think> out of a chat answer: the finished split, and
streams cut at every position, whose parts must add up to it exactly; then the tool-call parser
on the content part, and the chunks' JSON."""

from __future__ import annotations

import random

import pytest
from test_tool_parsers import cuts, mutated

from pagedlm.server.cli import REASONING_PARSER_NAMES
from pagedlm.server.reasoning import REASONING_PARSERS, ReasoningStream
from pagedlm.server.tool_parsers.hermes import HermesToolParser

# (parser, text, expected reasoning, expected content)
CASES = {
    "r1_opened_by_the_template": ("deepseek_r1", "Hmm, 2+2.</think>\n\n4", "Hmm, 2+2.", "\n\n4"),
    "r1_with_its_own_tag": ("deepseek_r1", "<think>\nA < B</think>C", "\nA < B", "C"),
    "r1_unclosed_is_all_reasoning": (
        "deepseek_r1",
        "still thinking </thi",
        "still thinking </thi",
        "",
    ),
    "r1_empty": ("deepseek_r1", "", "", ""),
    "qwen3_thinks": (
        "qwen3",
        "<think>\nsoit 東京\n</think>\n\nTōkyō.",
        "\nsoit 東京\n",
        "\n\nTōkyō.",
    ),
    "qwen3_without_a_tag_is_content": (
        "qwen3",
        "Just </think> an answer",
        "",
        "Just </think> an answer",
    ),
    "qwen3_tag_later_is_content": ("qwen3", "A <think>b</think>", "", "A <think>b</think>"),
    "qwen3_unclosed_is_reasoning": ("qwen3", "  <think>cut sho", "cut sho", ""),
    "qwen3_a_start_of_the_tag_is_content": ("qwen3", "<thin", "", "<thin"),
}


def streamed(parser_name: str, pieces: list[str]) -> tuple[str, str]:
    stream = ReasoningStream(REASONING_PARSERS[parser_name])
    parts = [stream.feed(piece) for piece in pieces] + [stream.finish()]
    return "".join(r for r, _ in parts), "".join(c for _, c in parts)


@pytest.mark.parametrize("case", CASES)
def test_split_whole_and_streamed_at_every_cut(case: str) -> None:
    name, text, reasoning, content = CASES[case]
    assert REASONING_PARSERS[name].split(text, final=True) == (reasoning, content)
    for pieces in cuts(text) if len(text) > 1 else [[text]]:
        assert streamed(name, pieces) == (reasoning, content), pieces


def test_tool_calls_are_read_from_the_content_part() -> None:
    """A call inside the think block is the model musing, not a call."""
    text = (
        '<tool_call>{"name": "no", "arguments": {}}</tool_call></think>Sure.\n'
        '<tool_call>{"name": "f", "arguments": {"a": "</think>"}}</tool_call>'
    )
    reasoning, content = REASONING_PARSERS["deepseek_r1"].split(text, final=True)
    parsed = HermesToolParser().parse(content, final=True)
    assert reasoning.startswith("<tool_call>") and parsed.content == "Sure."
    assert [(c.name, c.arguments) for c in parsed.calls] == [("f", '{"a": "</think>"}')]


def test_the_cli_offers_every_parser() -> None:
    assert sorted(REASONING_PARSER_NAMES) == sorted(REASONING_PARSERS)


def test_a_constrained_output_reasons_only_after_an_explicit_tag() -> None:
    """The constraint writes the output from its first token: no block was opened before it."""
    parser = REASONING_PARSERS["deepseek_r1"].constrained()
    assert parser.split('{"a": 1}', final=True) == ("", '{"a": 1}')
    assert parser.split("<think>x</think>{}", final=True) == ("x", "{}")


@pytest.mark.parametrize("name", sorted(REASONING_PARSERS))
def test_mangled_outputs_stream_as_they_split(name: str) -> None:
    """The cases' outputs mangled at random: a stream fed a character at a time adds up to the
    finished split, whose content is the end of the text."""
    rng = random.Random(name)
    texts = [text for _, text, _, _ in CASES.values()]
    pieces = ["<think>", "</think>", "<", "/", ">", "\n", " "]
    for _ in range(400):
        text = rng.choice(texts)
        for _ in range(rng.randint(0, 3)):
            text = mutated(rng, text, pieces)
        reasoning, content = REASONING_PARSERS[name].split(text, final=True)
        assert streamed(name, list(text)) == (reasoning, content), text
        assert len(reasoning) + len(content) <= len(text) and text.endswith(content)
