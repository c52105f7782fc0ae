"""POST /v1/chat/completions: the model's chat template over the messages (and tools), n choices,
whole or streamed (a role chunk first per choice, then content and tool-call deltas)."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from pagedlm.engine.llm_engine import ProcessedRequest
from pagedlm.engine.tokenizer import Tokenizer, render_chat_template, token_bytes
from pagedlm.outputs import CompletionOutput, RequestOutput, SampleLogprobs
from pagedlm.sampling_params import SamplingParams
from pagedlm.server.protocol import (
    ChatChoice,
    ChatChoiceLogprobs,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatLogprob,
    ChatMessage,
    ChatMessageOut,
    TopLogprob,
)
from pagedlm.server.protocol_tools import FunctionCall, ToolCall
from pagedlm.server.reasoning import REASONING_PARSERS, ReasoningParser, ReasoningStream
from pagedlm.server.serving import (
    GENERATION_ERRORS,
    SSE_DONE,
    APIError,
    Constraint,
    Delta,
    DeltaTracker,
    Generation,
    ServingContext,
    admit,
    build_params,
    constraint_of,
    generation_error,
    new_request_id,
    process_prompt,
    response_metrics,
    stream_error_event,
    tokenize_within_context,
    usage,
)
from pagedlm.server.stream_chunks import ChunkStream, chat_choice, chat_delta
from pagedlm.server.tool_parsers import ToolParser
from pagedlm.server.tool_parsers.stream import ToolCallStream
from pagedlm.server.tools import tool_use


async def create_chat_completion(
    ctx: ServingContext, body: ChatCompletionRequest, raw: Request
) -> Response:
    ctx.check_model(body.model)
    if body.top_logprobs is not None and not body.logprobs:
        raise APIError(400, "top_logprobs needs logprobs=true", param="top_logprobs")
    max_tokens = body.max_completion_tokens or body.max_tokens
    constraint = constraint_of(body)
    tools = tool_use(body, ctx.tool_parser, constrained=constraint is not None)
    if tools.keeps_special_tokens:  # the calls start with one (vLLM's mistral parser's rule)
        body = body.model_copy(update={"skip_special_tokens": False})
    if tools.constraint is not None:
        constraint = Constraint(tools.constraint, "tools")
    logprobs = (body.top_logprobs or 0) if body.logprobs else None
    params = build_params(ctx, body, max_tokens, logprobs, constraint)
    processed = await ctx.pool.run_with_tokenizer(
        _process_chat, ctx, body, params, tools.template_tools, constraint
    )
    admit(ctx, [processed], body.n)
    request_id = new_request_id(raw, body)
    reasoning = None
    if ctx.reasoning_parser is not None:
        reasoning = REASONING_PARSERS[ctx.reasoning_parser]
        reasoning = reasoning if constraint is None else reasoning.constrained()
    writer = _ChatWriter(ctx, body, f"chatcmpl-{request_id}", tools.new_parser, reasoning)
    generation = Generation(ctx, raw, request_id, [processed], body)
    if body.stream:
        return StreamingResponse(writer.stream(generation), media_type="text/event-stream")
    final: RequestOutput | None = None
    try:
        async for _, final in generation:  # noqa: B007 - the last one is the answer
            pass
    except GENERATION_ERRORS as exc:
        raise generation_error(exc) from None
    return JSONResponse(writer.response(final).model_dump())


def _process_chat(
    tokenizer: Tokenizer | None,
    ctx: ServingContext,
    body: ChatCompletionRequest,
    params: SamplingParams,
    tools: list[dict[str, Any]] | None,
    constraint: Constraint | None,
) -> ProcessedRequest:
    prompt = tokenize_chat(tokenizer, ctx, body.messages, tools)
    return process_prompt(tokenizer, ctx, prompt, params, body, "messages", constraint)


def tokenize_chat(
    tokenizer: Tokenizer | None,
    ctx: ServingContext,
    messages: list[ChatMessage],
    tools: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The conversation through the chat template, as a prompt for process_request (on a pool
    thread, with its tokenizer)."""
    text = render_chat(tokenizer, messages, tools)
    # the template holds the special tokens already
    token_ids = tokenize_within_context(ctx, tokenizer, text, "messages", add_special_tokens=False)
    return {"prompt": text, "prompt_token_ids": token_ids}


def render_chat(
    tokenizer: Tokenizer | None,
    messages: list[ChatMessage],
    tools: list[dict[str, Any]] | None = None,
) -> str:
    conversation = [_template_message(index, m) for index, m in enumerate(messages)]
    if tokenizer is None:
        raise APIError(
            400, "messages: chat needs a tokenizer (the server skips it)", param="messages"
        )
    try:
        return render_chat_template(tokenizer, conversation, tools=tools)
    except Exception as exc:  # noqa: BLE001 - a template may raise anything on odd input
        raise APIError(
            400, f"messages: the chat template failed: {exc}", param="messages"
        ) from None


def _template_message(index: int, message: ChatMessage) -> dict[str, Any]:
    """A message as chat templates read it; a tool call's arguments as an object (templates
    write them with `tojson`), as vLLM passes them."""
    result: dict[str, Any] = {"role": message.template_role(), "content": message.text()}
    if message.name:
        result["name"] = message.name
    if message.tool_call_id is not None:
        result["tool_call_id"] = message.tool_call_id
    if message.tool_calls:
        result["tool_calls"] = [
            {
                "id": call.id,
                "type": call.type,
                "function": {
                    "name": call.function.name,
                    "arguments": _arguments(call.function.arguments, f"messages.{index}"),
                },
            }
            for call in message.tool_calls
        ]
    return result


def _arguments(arguments: str | dict[str, Any], where: str) -> Any:
    if not isinstance(arguments, str):
        return arguments
    try:
        return json.loads(arguments)
    except ValueError:
        raise APIError(
            400,
            f"{where}.tool_calls: a function's arguments must be a JSON text, got {arguments!r:.80}",
            param="messages",
        ) from None


class _ChatWriter:
    def __init__(
        self,
        ctx: ServingContext,
        body: ChatCompletionRequest,
        response_id: str,
        new_parser: Callable[[], ToolParser] | None,
        reasoning: ReasoningParser | None,
    ) -> None:
        self.body = body
        self.new_parser = new_parser  # None: the output is content
        self.reasoning = reasoning  # None: no think block is split out
        self.response_id = response_id
        self.model_name = ctx.model_name
        self.created = int(time.time())
        self.tokenizer = ctx.tokenizer

    def response(self, final: RequestOutput) -> ChatCompletionResponse:
        choices = [
            ChatChoice(
                index=c.index,
                message=self._message(c.text),
                logprobs=self._logprobs(c, 0, len(c.token_ids)),
                finish_reason=c.finish_reason,
                stop_reason=c.stop_reason,
            )
            for c in final.outputs
        ]
        for choice in choices:
            if choice.message.tool_calls:
                choice.finish_reason = _with_calls(choice.finish_reason)
        return ChatCompletionResponse(
            id=self.response_id,
            model=self.model_name,
            choices=choices,
            usage=usage([final]),
            metrics=response_metrics([final]),
        )

    def _message(self, text: str) -> ChatMessageOut:
        reasoning = None
        if self.reasoning is not None:
            reasoning, text = self.reasoning.split(text, final=True)
        calls = []
        if self.new_parser is not None:
            parser = self.new_parser()
            parsed = parser.parse(text, final=True)
            text = parsed.content
            calls = [
                ToolCall(
                    id=parser.new_call_id(),
                    function=FunctionCall(name=call.name, arguments=call.arguments),
                )
                for call in parsed.calls
            ]
        content = (text or None) if calls or reasoning else text  # OpenAI's null beside them
        return ChatMessageOut(
            content=content, tool_calls=calls, reasoning_content=reasoning or None
        )

    def _logprobs(
        self, choice: CompletionOutput, start: int, end: int
    ) -> ChatChoiceLogprobs | None:
        if choice.logprobs is None:
            return None
        return ChatChoiceLogprobs(
            content=_chat_logprobs(
                choice.logprobs[start:end], self.body.top_logprobs or 0, self.tokenizer
            )
        )

    async def stream(self, generation: Generation) -> AsyncIterator[str]:
        tracker = DeltaTracker()
        chunks = ChunkStream(
            self.response_id, "chat.completion.chunk", self.created, self.model_name
        )
        final: RequestOutput | None = None
        calls: dict[int, ToolCallStream] = {}  # choice index -> its calls so far
        thinking: dict[int, ReasoningStream] = {}  # choice index -> its split so far
        try:
            async for _, final in generation:
                for choice in final.outputs:
                    delta = tracker.delta(choice.index, choice)
                    if delta is not None:
                        stream = self._calls(calls, choice.index)
                        split = self._thinking(thinking, choice.index)
                        # one event per choice update, as OpenAI sends them
                        usage_info = usage([final]) if self.body.continuous_usage else None
                        yield "".join(
                            chunks.event([update], usage_info)
                            for update in self._stream_choices(choice, delta, stream, split)
                        )
            if self.body.include_usage:
                yield chunks.event([], usage([final]), response_metrics([final]))
        except Exception as exc:  # noqa: BLE001 - an error event, not a cut-off stream
            yield stream_error_event(exc, self.response_id)
        yield SSE_DONE

    def _calls(self, streams: dict[int, ToolCallStream], index: int) -> ToolCallStream | None:
        """Choice `index`'s tool-call stream; None where the output is content only."""
        if self.new_parser is None:
            return None
        if index not in streams:
            streams[index] = ToolCallStream(self.new_parser())
        return streams[index]

    def _thinking(self, streams: dict[int, ReasoningStream], index: int) -> ReasoningStream | None:
        """Choice `index`'s reasoning split; None where no think block is split out."""
        if self.reasoning is None:
            return None
        if index not in streams:
            streams[index] = ReasoningStream(self.reasoning)
        return streams[index]

    def _stream_choices(
        self,
        choice: CompletionOutput,
        delta: Delta,
        calls: ToolCallStream | None,
        split: ReasoningStream | None,
    ) -> list[dict[str, Any]]:
        """A role chunk first for a new choice, then its reasoning, content or tool-call deltas
        (and end, if it came); each a ChatStreamChoice's fields (stream_chunks.chat_choice). The
        tool-call parser reads the content part only."""
        result = []
        if delta.first:
            result.append(chat_choice(choice.index, chat_delta(role="assistant", content="")))
        content, call_deltas, finish_reason = delta.text, [], delta.finish_reason
        reasoning = ""
        if split is not None:
            reasoning, content = split.feed(content)
            if finish_reason is not None:
                more_reasoning, more_content = split.finish()
                reasoning, content = reasoning + more_reasoning, content + more_content
        if calls is not None:
            content, call_deltas = calls.feed(content)
            if finish_reason is not None:
                more_content, more_deltas = calls.finish()
                content, call_deltas = content + more_content, call_deltas + more_deltas
                finish_reason = _with_calls(finish_reason) if calls.called else finish_reason
        new_logprobs = choice.logprobs is not None and delta.token_end > delta.token_start
        if content or reasoning or call_deltas or finish_reason is not None or new_logprobs:
            result.append(
                chat_choice(
                    choice.index,
                    chat_delta(
                        content=content or None,
                        tool_calls=call_deltas or None,
                        reasoning_content=reasoning or None,
                    ),
                    self._logprobs(choice, delta.token_start, delta.token_end),
                    finish_reason,
                    choice.stop_reason,
                )
            )
        return result


def _with_calls(finish_reason: str | None) -> str | None:
    """OpenAI's finish_reason for a message whose calls ended it."""
    return "tool_calls" if finish_reason == "stop" else finish_reason


def _chat_logprobs(positions: SampleLogprobs, num_top: int, tokenizer: Any) -> list[ChatLogprob]:
    result = []
    for position in positions:
        sampled_id, sampled = next(iter(position.items()))  # the sampled token comes first
        ranked = sorted(
            position.items(), key=lambda kv: kv[1].rank if kv[1].rank is not None else 1 << 30
        )
        top = [_top(tokenizer, i, lp.decoded_token, lp.logprob) for i, lp in ranked[:num_top]]
        result.append(
            ChatLogprob(
                **_top(tokenizer, sampled_id, sampled.decoded_token, sampled.logprob).model_dump(),
                top_logprobs=top,
            )
        )
    return result


def _top(tokenizer: Any, token_id: int, token: str | None, logprob: float) -> TopLogprob:
    token = token or ""
    return TopLogprob(token=token, logprob=logprob, bytes=token_bytes(tokenizer, token_id, token))
