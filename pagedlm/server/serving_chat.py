"""POST /v1/chat/completions: the model's chat template over system/user/assistant messages,
n choices, whole or streamed (a role chunk first per choice, then content deltas)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
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
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatLogprob,
    ChatMessage,
    ChatMessageOut,
    ChatStreamChoice,
    DeltaMessage,
    TopLogprob,
)
from pagedlm.server.serving import (
    GENERATION_ERRORS,
    SSE_DONE,
    APIError,
    Delta,
    DeltaTracker,
    Generation,
    ServingContext,
    admit,
    build_params,
    generation_error,
    new_request_id,
    process_prompt,
    sse,
    stream_error_event,
    tokenize_within_context,
    usage,
)


async def create_chat_completion(
    ctx: ServingContext, body: ChatCompletionRequest, raw: Request
) -> Response:
    ctx.check_model(body.model)
    if body.top_logprobs is not None and not body.logprobs:
        raise APIError(400, "top_logprobs needs logprobs=true", param="top_logprobs")
    max_tokens = body.max_completion_tokens or body.max_tokens
    params = build_params(
        ctx, body, max_tokens, (body.top_logprobs or 0) if body.logprobs else None
    )
    processed = await ctx.pool.run_with_tokenizer(_process_chat, ctx, body, params)
    admit(ctx, [processed], body.n)
    request_id = new_request_id(raw, body)
    writer = _ChatWriter(ctx, body, f"chatcmpl-{request_id}")
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
) -> ProcessedRequest:
    prompt = tokenize_chat(tokenizer, ctx, body.messages)
    return process_prompt(tokenizer, ctx, prompt, params, body, "messages")


def tokenize_chat(
    tokenizer: Tokenizer | None, ctx: ServingContext, messages: list[ChatMessage]
) -> dict[str, Any]:
    """The conversation through the chat template, as a prompt for process_request (on a pool
    thread, with its tokenizer)."""
    text = render_chat(tokenizer, messages)
    # the template holds the special tokens already
    token_ids = tokenize_within_context(ctx, tokenizer, text, "messages", add_special_tokens=False)
    return {"prompt": text, "prompt_token_ids": token_ids}


def render_chat(tokenizer: Tokenizer | None, messages: list[ChatMessage]) -> str:
    conversation = [
        {"role": m.template_role(), "content": m.text(), **({"name": m.name} if m.name else {})}
        for m in messages
    ]
    if tokenizer is None:
        raise APIError(
            400, "messages: chat needs a tokenizer (the server skips it)", param="messages"
        )
    try:
        return render_chat_template(tokenizer, conversation)
    except Exception as exc:  # noqa: BLE001 - a template may raise anything on odd input
        raise APIError(
            400, f"messages: the chat template failed: {exc}", param="messages"
        ) from None


class _ChatWriter:
    def __init__(self, ctx: ServingContext, body: ChatCompletionRequest, response_id: str) -> None:
        self.body = body
        self.response_id = response_id
        self.model_name = ctx.model_name
        self.created = int(time.time())
        self.tokenizer = ctx.tokenizer

    def response(self, final: RequestOutput) -> ChatCompletionResponse:
        choices = [
            ChatChoice(
                index=c.index,
                message=ChatMessageOut(content=c.text),
                logprobs=self._logprobs(c, 0, len(c.token_ids)),
                finish_reason=c.finish_reason,
                stop_reason=c.stop_reason,
            )
            for c in final.outputs
        ]
        return ChatCompletionResponse(
            id=self.response_id, model=self.model_name, choices=choices, usage=usage([final])
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
        final: RequestOutput | None = None
        try:
            async for _, final in generation:
                for choice in final.outputs:
                    delta = tracker.delta(choice.index, choice)
                    if delta is not None:
                        # one event per choice update, as OpenAI sends them
                        usage_info = usage([final]) if self.body.continuous_usage else None
                        yield "".join(
                            sse(self._chunk([update], usage_info))
                            for update in self._stream_choices(choice, delta)
                        )
            if self.body.include_usage:
                yield sse(self._chunk([], usage([final])))
        except Exception as exc:  # noqa: BLE001 - an error event, not a cut-off stream
            yield stream_error_event(exc, self.response_id)
        yield SSE_DONE

    def _stream_choices(self, choice: CompletionOutput, delta: Delta) -> list[ChatStreamChoice]:
        """A role chunk first for a new choice, then its content (and end, if it came)."""
        result = []
        if delta.first:
            result.append(
                ChatStreamChoice(
                    index=choice.index, delta=DeltaMessage(role="assistant", content="")
                )
            )
        new_logprobs = choice.logprobs is not None and delta.token_end > delta.token_start
        if delta.text or delta.finish_reason is not None or new_logprobs:
            result.append(
                ChatStreamChoice(
                    index=choice.index,
                    delta=DeltaMessage(content=delta.text or None),
                    logprobs=self._logprobs(choice, delta.token_start, delta.token_end),
                    finish_reason=delta.finish_reason,
                    stop_reason=choice.stop_reason,
                )
            )
        return result

    def _chunk(
        self, choices: list[ChatStreamChoice], usage_info: Any = None
    ) -> ChatCompletionChunk:
        return ChatCompletionChunk(
            id=self.response_id,
            model=self.model_name,
            choices=choices,
            usage=usage_info,
            created=self.created,
        )


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
