"""POST /v1/completions: one prompt or many (text or token ids), n choices each, whole or streamed.
Choice i*n + j is sample j of prompt i, as in OpenAI's API."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from pagedlm.engine.llm_engine import ProcessedRequest
from pagedlm.engine.tokenizer import Tokenizer
from pagedlm.outputs import CompletionOutput, RequestOutput, SampleLogprobs
from pagedlm.sampling_params import SamplingParams
from pagedlm.server.protocol import (
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    CompletionResponse,
)
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
    usage,
)
from pagedlm.server.stream_chunks import ChunkStream, completion_choice


async def create_completion(ctx: ServingContext, body: CompletionRequest, raw: Request) -> Response:
    ctx.check_model(body.model)
    if body.suffix:
        raise APIError(400, "suffix is not supported", param="suffix")
    if body.echo and body.logprobs is not None:
        raise APIError(
            400,
            "logprobs together with echo (prompt logprobs) is not supported yet",
            param="logprobs",
        )
    constraint = constraint_of(body)
    params = build_params(ctx, body, body.max_tokens, body.logprobs, constraint)
    processed = await ctx.pool.run_with_tokenizer(_process_prompts, ctx, body, params, constraint)
    admit(ctx, processed, body.n)
    request_id = new_request_id(raw, body)
    writer = _CompletionWriter(ctx, body, f"cmpl-{request_id}", processed)
    generation = Generation(ctx, raw, request_id, processed, body)
    if body.stream:
        return StreamingResponse(writer.stream(generation), media_type="text/event-stream")
    finals: list[RequestOutput | None] = [None] * len(processed)
    try:
        async for index, output in generation:
            finals[index] = output
    except GENERATION_ERRORS as exc:
        raise generation_error(exc) from None
    return JSONResponse(writer.response(finals).model_dump())


def _process_prompts(
    tokenizer: Tokenizer | None,
    ctx: ServingContext,
    body: CompletionRequest,
    params: SamplingParams,
    constraint: Constraint | None,
) -> list[ProcessedRequest]:
    return [
        process_prompt(tokenizer, ctx, prompt, params, body, constraint=constraint)
        for prompt in _prompt_list(body.prompt)
    ]


def _prompt_list(prompt: str | list[str] | list[int] | list[list[int]]) -> list[Any]:
    """A batch of prompts, each a string or a list of token ids."""
    if isinstance(prompt, str) or (prompt and isinstance(prompt[0], int)):
        return [prompt]
    if not prompt:
        raise APIError(400, "prompt must not be empty", param="prompt")
    return list(prompt)


class _CompletionWriter:
    def __init__(
        self,
        ctx: ServingContext,
        body: CompletionRequest,
        response_id: str,
        processed: list[ProcessedRequest],
    ) -> None:
        self.body = body
        self.response_id = response_id
        self.model_name = ctx.model_name
        self.created = int(time.time())
        self.echo_texts = [_prompt_text(ctx, p) if body.echo else "" for p in processed]
        # choice index -> text_offset after its tokens sent so far (a chunk's tokens follow them)
        self._next_offsets: dict[int, int] = {}

    def _choice(self, prompt_index: int, choice: CompletionOutput, delta: Delta) -> dict[str, Any]:
        """The choice's fields for this delta (stream_chunks.completion_choice)."""
        index = prompt_index * self.body.n + choice.index
        echo = self.echo_texts[prompt_index] if delta.first else ""
        logprobs = None
        if choice.logprobs is not None:
            offset = self._next_offsets.get(index, len(self.echo_texts[prompt_index]))
            logprobs = _completion_logprobs(
                choice.logprobs[delta.token_start : delta.token_end], offset
            )
            self._next_offsets[index] = offset + sum(len(token) for token in logprobs.tokens)
        return completion_choice(
            index, echo + delta.text, logprobs, delta.finish_reason, choice.stop_reason
        )

    def response(self, finals: list[RequestOutput | None]) -> CompletionResponse:
        choices = []
        for prompt_index, output in enumerate(finals):
            for choice in output.outputs:
                delta = DeltaTracker().delta(0, choice)
                choices.append(CompletionChoice(**self._choice(prompt_index, choice, delta)))
        return CompletionResponse(
            id=self.response_id,
            model=self.model_name,
            choices=choices,
            usage=usage(finals),
            metrics=response_metrics(finals),
        )

    async def stream(self, generation: Generation) -> AsyncIterator[str]:
        tracker = DeltaTracker()
        chunks = ChunkStream(self.response_id, "text_completion", self.created, self.model_name)
        finals: list[RequestOutput | None] = [None] * len(self.echo_texts)
        try:
            async for prompt_index, output in generation:
                finals[prompt_index] = output
                for choice in output.outputs:
                    delta = tracker.delta(prompt_index * self.body.n + choice.index, choice)
                    if delta is not None:
                        yield chunks.event(
                            [self._choice(prompt_index, choice, delta)],
                            usage(finals) if self.body.continuous_usage else None,
                        )
            if self.body.include_usage:
                yield chunks.event([], usage(finals), response_metrics(finals))
        except Exception as exc:  # noqa: BLE001 - an error event, not a cut-off stream
            yield stream_error_event(exc, self.response_id)
        yield SSE_DONE


def _prompt_text(ctx: ServingContext, processed: ProcessedRequest) -> str:
    if processed.prompt is not None:
        return processed.prompt
    return ctx.tokenizer.decode(processed.prompt_token_ids) if ctx.tokenizer is not None else ""


def _completion_logprobs(positions: SampleLogprobs, text_offset: int) -> CompletionLogprobs:
    """OpenAI's legacy format; top_logprobs holds the sampled token and the top-N, as in vLLM."""
    result = CompletionLogprobs()
    for position in positions:
        sampled = next(iter(position.values()))  # the sampled token comes first
        token = sampled.decoded_token or ""
        result.tokens.append(token)
        result.token_logprobs.append(sampled.logprob)
        result.top_logprobs.append({lp.decoded_token or "": lp.logprob for lp in position.values()})
        result.text_offset.append(text_offset)
        text_offset += len(token)
    return result
