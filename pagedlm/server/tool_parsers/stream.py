"""A streamed choice's tool calls: the parser reads the whole text at each delta; what its reading
adds to the last one goes out as OpenAI's deltas (content, then `delta.tool_calls[i]`)."""

from __future__ import annotations

import logging

from pagedlm.server.protocol_tools import DeltaFunctionCall, DeltaToolCall
from pagedlm.server.tool_parsers.base import Parsed, ToolParser

logger = logging.getLogger("pagedlm.server")


class ToolCallStream:
    def __init__(self, parser: ToolParser) -> None:
        self._parser = parser
        self._text = ""
        self._content_sent = 0  # characters of content sent
        self._arguments_sent: list[int] = []  # per announced call: characters of arguments sent
        self.call_ids: list[str] = []

    @property
    def called(self) -> bool:
        return bool(self.call_ids)

    def feed(self, text: str) -> tuple[str, list[DeltaToolCall]]:
        """The content and call deltas that `text`, the output's next piece, brings."""
        self._text += text
        return self._new(self._parser.parse(self._text, final=False))

    def finish(self) -> tuple[str, list[DeltaToolCall]]:
        """What the finished output adds. Calls already streamed stand even where the finished
        output turns out not to be calls (cut short by max_tokens): nothing is taken back."""
        parsed = self._parser.parse(self._text, final=True)
        if self.called and not parsed.calls:
            logger.info("a streamed tool call ended unfinished or invalid")
            return "", []
        return self._new(parsed)

    def _new(self, parsed: Parsed) -> tuple[str, list[DeltaToolCall]]:
        content = parsed.content[self._content_sent :]
        self._content_sent = max(self._content_sent, len(parsed.content))
        deltas = []
        for index, call in enumerate(parsed.calls):
            if index == len(self.call_ids):
                if call.name is None:
                    break  # announced in order, each with its name
                self.call_ids.append(self._parser.new_call_id())
                self._arguments_sent.append(0)
                deltas.append(
                    DeltaToolCall(
                        index=index,
                        id=self.call_ids[index],
                        type="function",
                        function=DeltaFunctionCall(name=call.name, arguments=call.arguments),
                    )
                )
            elif len(call.arguments) > self._arguments_sent[index]:
                fragment = call.arguments[self._arguments_sent[index] :]
                deltas.append(
                    DeltaToolCall(index=index, function=DeltaFunctionCall(arguments=fragment))
                )
            self._arguments_sent[index] = len(call.arguments)
        return content, deltas
