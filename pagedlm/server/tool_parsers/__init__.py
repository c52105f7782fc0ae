"""Tool-call parsers by `--tool-call-parser` name (vLLM's names), and the stream that turns a
parser's successive readings into OpenAI's tool-call deltas."""

from __future__ import annotations

from pagedlm.server.tool_parsers.base import CallSoFar, Parsed, ToolParser
from pagedlm.server.tool_parsers.forced import NamedToolParser, RequiredToolParser
from pagedlm.server.tool_parsers.hermes import HermesToolParser
from pagedlm.server.tool_parsers.llama3_json import Llama3JsonToolParser
from pagedlm.server.tool_parsers.mistral import MistralToolParser
from pagedlm.server.tool_parsers.pythonic import PythonicToolParser
from pagedlm.server.tool_parsers.qwen3_coder import Qwen3CoderToolParser

TOOL_PARSERS: dict[str, type[ToolParser]] = {
    "hermes": HermesToolParser,
    "llama3_json": Llama3JsonToolParser,
    "mistral": MistralToolParser,
    "pythonic": PythonicToolParser,
    "llama4_pythonic": PythonicToolParser,  # vLLM's name for Llama 4's (python_start/end tags)
    "qwen3_coder": Qwen3CoderToolParser,
}

__all__ = [
    "TOOL_PARSERS",
    "CallSoFar",
    "NamedToolParser",
    "Parsed",
    "RequiredToolParser",
    "ToolParser",
]
