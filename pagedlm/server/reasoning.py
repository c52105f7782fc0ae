"""`--reasoning-parser` (vLLM's names): a chat answer's <think>...</think> block goes to
`message.reasoning_content` (streamed: `delta.reasoning_content`, vLLM 0.x's field name), the
rest is the content, which the tool-call parser then reads.

- deepseek_r1: the chat template opens the block, so the output may start inside it: text
  before </think> is reasoning (all of it while </think> has not come); a leading <think> is
  dropped.
- qwen3: only an output that opens with <think> reasons; any other output is content.

Under a constraint (structured outputs, a required or named tool choice) both read as qwen3
does: the constraint writes the output from its first token (the engine does not hold it back
until the block ends, as vLLM's reasoning-aware structured outputs do), so no block the template
opened comes before it; a grammar that writes <think>...</think> itself is still split.

Like a tool parser's reading (tool_parsers/base.py), a split is a pure function of the text so
far whose parts only grow, so a stream sends what each reading adds and adds up to the whole
answer."""

from __future__ import annotations

from dataclasses import dataclass

from pagedlm.server.tool_parsers.base import held_back

START, END = "<think>", "</think>"


@dataclass(frozen=True, slots=True)
class ReasoningParser:
    opened_by_template: bool  # the output may start inside the think block

    def constrained(self) -> ReasoningParser:
        """How a constrained output is read (the module's docstring)."""
        return ReasoningParser(opened_by_template=False)

    def split(self, text: str, final: bool) -> tuple[str, str]:
        """(reasoning, content) as far as the text goes; unfinished, what may be the start of a
        tag waits."""
        stripped = text.lstrip()
        if stripped.startswith(START):
            body = stripped[len(START) :]
        elif not final and START.startswith(stripped):  # undecided (also when empty)
            return "", ""
        elif self.opened_by_template:
            body = text
        else:
            return "", text
        end = body.find(END)
        if end == -1:
            return (body if final else body[: len(body) - held_back(body, END)]), ""
        return body[:end], body[end + len(END) :]


REASONING_PARSERS = {
    "deepseek_r1": ReasoningParser(opened_by_template=True),
    "qwen3": ReasoningParser(opened_by_template=False),
}


class ReasoningStream:
    """One streamed choice's split: what each piece of the output adds to either part."""

    def __init__(self, parser: ReasoningParser) -> None:
        self._parser = parser
        self._text = ""
        self._sent = (0, 0)  # characters of reasoning and of content sent

    def feed(self, text: str) -> tuple[str, str]:
        self._text += text
        return self._new(*self._parser.split(self._text, final=False))

    def finish(self) -> tuple[str, str]:
        return self._new(*self._parser.split(self._text, final=True))

    def _new(self, reasoning: str, content: str) -> tuple[str, str]:
        sent_reasoning, sent_content = self._sent
        self._sent = (max(sent_reasoning, len(reasoning)), max(sent_content, len(content)))
        return reasoning[sent_reasoning:], content[sent_content:]
