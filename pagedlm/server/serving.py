"""What both generation endpoints share: errors in OpenAI's shape, model and parameter checks,
prompt processing with the context check, admission, merged output streams, disconnects, SSE."""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request
from pydantic import BaseModel

from pagedlm.engine.llm_engine import ProcessedRequest
from pagedlm.engine.tokenizer import TokenCountBound, Tokenizer, token_count_bound
from pagedlm.errors import CONTEXT_LENGTH_EXCEEDED, InvalidRequest
from pagedlm.outputs import CompletionOutput, RequestOutput
from pagedlm.sampling_params import SamplingParams
from pagedlm.server.async_engine import (
    AsyncLLM,
    EngineDeadError,
    Overloaded,
    RequestAborted,
)
from pagedlm.server.protocol import (
    PromptTokensDetails,
    ResponseMetrics,
    SamplingFields,
    UsageInfo,
)
from pagedlm.server.protocol_tools import structured_outputs_of
from pagedlm.server.tokenizer_pool import TokenizerPool

logger = logging.getLogger("pagedlm.server")

RETRY_AFTER_S = 1


class APIError(Exception):
    """An error answered in OpenAI's shape: {"error": {"message", "type", "param", "code"}}."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers

    @property
    def type(self) -> str:
        return _ERROR_TYPES.get(
            self.status, "invalid_request_error" if self.status < 500 else "server_error"
        )

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


_ERROR_TYPES = {
    401: "authentication_error",
    500: "InternalServerError",  # vLLM's 500 type
    503: "service_unavailable_error",
}


def internal_error(exc: Exception, where: str) -> APIError:
    """A 500 for an exception nothing expected, logged here with its traceback. The client
    learns the exception's class only: its message and traceback may hold server internals."""
    name = type(exc).__name__
    logger.error("unexpected %s in %s", name, where, exc_info=exc)
    return APIError(
        500,
        f"Internal server error: {name} (the server log has the details)",
        code="internal_server_error",
    )


def log_refusal(status: int, method: str, path: str, message: str) -> None:
    """A 4xx at INFO with its reason, on one line whatever the client put in it."""
    logger.info("%d %s %s: %s", status, method, _one_line(path), _one_line(message))


def _one_line(text: str) -> str:
    return text.replace("\r", "\\r").replace("\n", "\\n")


@dataclass(frozen=True)
class Constraint:
    """A request's constraint on its output (StructuredOutputsParams' fields) and the parameter
    the client set it with, which the engine's errors about it name."""

    fields: dict[str, Any]
    param: str  # structured_outputs, response_format or tools (tool_choice required / named)

    def rename(self, exc: InvalidRequest) -> InvalidRequest:
        """The engine names structured_outputs.<field>; the client may have used another."""
        if self.param == "structured_outputs" or not (exc.param or "").startswith(
            "structured_outputs"
        ):
            return exc
        where = _CONSTRAINT_PLACES.get(exc.param, {}).get(self.param, self.param)
        return InvalidRequest(str(exc).replace(exc.param, where, 1), param=self.param)


# Where the client wrote the constraint the engine names: engine's field -> client's parameter
# -> the place in the client's body.
_CONSTRAINT_PLACES = {
    "structured_outputs.json": {
        "response_format": "response_format.json_schema.schema",
        "tools": "tools: the function's parameters (a JSON schema)",
    },
    "structured_outputs.structural_tag": {"response_format": "response_format (structural_tag)"},
}


def constraint_of(body: SamplingFields) -> Constraint | None:
    """The body's structured_outputs or response_format (a 400 for both)."""
    try:
        fields, param = structured_outputs_of(body.structured_outputs, body.response_format)
    except InvalidRequest as exc:
        raise bad_request(exc) from None
    return None if fields is None else Constraint(fields, param)


def bad_request(
    exc: ValueError, prompt_param: str = "prompt", constraint: Constraint | None = None
) -> APIError:
    """A refused request as a 400 with the parameter and code the engine's InvalidRequest names
    (a chat request's prompt is its `messages`; a constraint's, the parameter that set it)."""
    if not isinstance(exc, InvalidRequest):
        return APIError(400, str(exc))
    if constraint is not None:
        exc = constraint.rename(exc)
    param = prompt_param if exc.param == "prompt" else exc.param
    return APIError(400, str(exc), param=param, code=exc.code)


@dataclass
class ServingContext:
    engine: AsyncLLM  # started
    model_name: str
    # --tool-call-parser where --enable-auto-tool-choice is on: tool_choice "auto" reads calls
    tool_parser: str | None = None
    # --reasoning-parser: chat answers' think block goes to reasoning_content
    reasoning_parser: str | None = None
    # Parsing, chat templates and tokenisation run here, off the event loop.
    pool: TokenizerPool = field(init=False)
    # Refuses a text too long for max_model_len before it is tokenized (None: no bound holds).
    token_bound: TokenCountBound | None = field(init=False)

    def __post_init__(self) -> None:
        tokenizer = self.tokenizer
        self.pool = TokenizerPool(tokenizer)
        self.token_bound = None if tokenizer is None else token_count_bound(tokenizer)

    def check_model(self, model: str | None) -> None:
        if model is not None and model != self.model_name:
            raise APIError(
                404, f"The model `{model}` does not exist.", param="model", code="model_not_found"
            )

    @property
    def tokenizer(self) -> Any:
        return self.engine.llm_engine.tokenizer

    @property
    def max_model_len(self) -> int:
        return self.engine.config.model.max_model_len


_request_counter = itertools.count()


def new_request_id(raw: Request, body: SamplingFields) -> str:
    """The caller's request_id (body) or X-Request-Id (header), else a random one."""
    return body.request_id or raw.headers.get("x-request-id") or uuid.uuid4().hex


def build_params(
    ctx: ServingContext,
    body: SamplingFields,
    max_tokens: int | None,
    logprobs: int | None,
    constraint: Constraint | None,
) -> SamplingParams:
    if body.stream_options is not None and not body.stream:
        raise APIError(400, "stream_options: only allowed with stream=true", param="stream_options")
    if body.priority != 0 and ctx.engine.config.scheduler.policy != "priority":
        raise APIError(
            400, "priority: only supported with --scheduling-policy priority", param="priority"
        )
    try:
        return body.to_sampling_params(
            max_tokens,
            logprobs,
            ctx.engine.config.model.vocab_size,
            None if constraint is None else constraint.fields,
        )
    except ValueError as exc:
        raise bad_request(exc, constraint=constraint) from None


def tokenize_within_context(
    ctx: ServingContext,
    tokenizer: Tokenizer | None,
    text: str,
    param: str,
    add_special_tokens: bool = True,
) -> list[int]:
    """The text's token ids (on a pool thread, with its tokenizer); a text whose length alone
    rules out max_model_len is refused before it is tokenized, so its size bounds no work."""
    if tokenizer is None:
        raise APIError(
            400,
            f"{param}: text needs a tokenizer, but the server skips it "
            "(--skip-tokenizer-init); send token ids",
            param=param,
        )
    min_tokens = 0 if ctx.token_bound is None else ctx.token_bound.min_tokens(text)
    if min_tokens >= ctx.max_model_len:
        raise APIError(
            400,
            f"This model's maximum context length is {ctx.max_model_len} tokens "
            f"(max_model_len), but the {param} has {len(text)} characters: at least {min_tokens} "
            f"tokens (a token holds at most {ctx.token_bound.max_chars} characters). Reduce the "
            f"{param}.",
            param=param,
            code=CONTEXT_LENGTH_EXCEEDED,
        )
    return list(tokenizer.encode(text, add_special_tokens=add_special_tokens))


def process_prompt(
    tokenizer: Tokenizer | None,
    ctx: ServingContext,
    prompt: Any,
    params: SamplingParams,
    body: SamplingFields,
    prompt_param: str = "prompt",
    constraint: Constraint | None = None,
) -> ProcessedRequest:
    """Tokenises (a text, on a pool thread with its tokenizer) and validates one prompt: a
    string, token ids, or a prompt dict; a prompt plus max_tokens over the context is a 400
    (OpenAI's rule: the engine alone would cut max_tokens to the room left)."""
    if isinstance(prompt, str):
        prompt = {
            "prompt": prompt,
            "prompt_token_ids": tokenize_within_context(ctx, tokenizer, prompt, prompt_param),
        }
    try:
        return ctx.engine.llm_engine.process_request(
            _salted_prompt(prompt, body.cache_salt), params, reject_over_context=True
        )
    except ValueError as exc:
        raise bad_request(exc, prompt_param, constraint) from None


def _salted_prompt(prompt: Any, cache_salt: str | None) -> Any:
    """The prompt (token ids or a prompt dict) as a prompt dict carrying the body's cache_salt,
    as vLLM puts it into the engine prompt; unchanged without one."""
    if cache_salt is None:
        return prompt
    if isinstance(prompt, list):
        prompt = {"prompt_token_ids": prompt}
    return {**prompt, "cache_salt": cache_salt}


def admit(ctx: ServingContext, processed: list[ProcessedRequest], n: int) -> None:
    num_tokens = n * sum(len(p.prompt_token_ids) for p in processed)
    try:
        ctx.engine.admit(n * len(processed), num_tokens)
    except Overloaded as exc:
        raise APIError(
            503, str(exc), code=exc.code, headers={"Retry-After": str(RETRY_AFTER_S)}
        ) from None
    except EngineDeadError as exc:
        raise APIError(503, str(exc), code="engine_dead") from None
    except ValueError as exc:
        raise APIError(400, str(exc)) from None


class ClientDisconnected(Exception):
    pass


class Generation:
    """One HTTP request's engine requests (one per prompt), added at once, with their outputs
    merged in arrival order. A client disconnect, or closing the iteration early, aborts them."""

    def __init__(
        self,
        ctx: ServingContext,
        raw: Request,
        request_id: str,
        processed: list[ProcessedRequest],
        body: SamplingFields,
    ) -> None:
        self._engine = ctx.engine
        self._name = f"{request_id}-{next(_request_counter)}"  # callers may reuse request ids
        self._ids = [f"{self._name}-{i}" for i in range(len(processed))]
        for engine_id, prompt in zip(self._ids, processed):
            self._engine.add_request(engine_id, prompt, body.priority, final_only=not body.stream)
        self._queue: asyncio.Queue = asyncio.Queue()
        self._pumps = [
            asyncio.create_task(self._pump(i, engine_id)) for i, engine_id in enumerate(self._ids)
        ]
        self._watcher = asyncio.create_task(self._watch(raw))

    async def _pump(self, index: int, engine_id: str) -> None:
        try:
            async for output in self._engine.outputs(engine_id):
                self._queue.put_nowait((index, output))
            self._queue.put_nowait((index, None))
        except Exception as exc:  # noqa: BLE001 - handed to the consumer
            self._queue.put_nowait((index, exc))

    async def _watch(self, raw: Request) -> None:
        while (await raw.receive())["type"] != "http.disconnect":
            pass
        logger.info("request %s aborted: the client disconnected", self._name)
        self._abort()
        self._queue.put_nowait((-1, ClientDisconnected()))

    def _abort(self) -> None:
        for task in self._pumps:
            task.cancel()
        for engine_id in self._ids:
            self._engine.release(engine_id)

    async def __aiter__(self) -> AsyncIterator[tuple[int, RequestOutput]]:
        """(prompt index, cumulative output) until every prompt has finished."""
        try:
            num_running = len(self._pumps)
            while num_running:
                for index, item in _coalesced(await self._queue.get(), self._queue):
                    if isinstance(item, Exception):
                        raise item
                    if item is None:
                        num_running -= 1
                    elif item.error is not None:  # e.g. its grammar did not compile in time
                        raise InvalidRequest(item.error)
                    else:
                        yield index, item
        finally:
            self._watcher.cancel()
            self._abort()


QueueItem = tuple[int, RequestOutput | Exception | None]


def _coalesced(first: QueueItem, queue: asyncio.Queue) -> list[QueueItem]:
    """`first` and whatever else is queued, each prompt's outputs reduced to its newest: they
    are cumulative, so a consumer that fell behind sends one event for all it missed."""
    items = [first]
    while not queue.empty():
        items.append(queue.get_nowait())
    result: list[QueueItem] = []
    newest: dict[int, int] = {}  # prompt index -> where its newest output is in result
    for index, item in items:
        if isinstance(item, RequestOutput) and index in newest:
            result[newest[index]] = (index, item)
            continue
        if isinstance(item, RequestOutput):
            newest[index] = len(result)
        else:
            newest.pop(index, None)
        result.append((index, item))
    return result


def generation_error(exc: Exception) -> APIError:
    """An error that ends a request the engine had accepted."""
    if isinstance(exc, RequestAborted):
        return APIError(503, str(exc), code="shutting_down")
    if isinstance(exc, EngineDeadError):
        return APIError(500, str(exc), code="engine_dead")
    if isinstance(exc, ClientDisconnected):
        return APIError(499, "client disconnected")
    return bad_request(exc)


GENERATION_ERRORS = (RequestAborted, EngineDeadError, ClientDisconnected, ValueError)


def stream_error_event(exc: Exception, response_id: str) -> str:
    """The SSE error event that ends a stream cut short by `exc` (the caller then sends
    [DONE]); the headers (200) are already sent, so the error can only travel in the stream."""
    if isinstance(exc, GENERATION_ERRORS):
        return sse(generation_error(exc).body())
    return sse(internal_error(exc, f"the stream of {response_id}").body())


def usage(outputs: list[RequestOutput | None]) -> UsageInfo:
    """Prompt tokens count once per prompt; completion tokens over every choice."""
    done = [o for o in outputs if o is not None]
    prompt = sum(len(o.prompt_token_ids) for o in done)
    completion = sum(len(c.token_ids) for o in done for c in o.outputs)
    cached = sum(o.num_cached_tokens for o in done)
    return UsageInfo(
        prompt_tokens=prompt,
        completion_tokens=completion,
        total_tokens=prompt + completion,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=cached),
    )


def response_metrics(outputs: list[RequestOutput | None]) -> ResponseMetrics | None:
    """The speculative-decoding metrics of a response of one choice (None: more choices, or
    none to report: speculation or per-request metrics off)."""
    choices = [c for o in outputs if o is not None for c in o.outputs]
    if len(choices) != 1 or choices[0].spec_decode_metrics is None:
        return None
    return ResponseMetrics(speculative_decoding=choices[0].spec_decode_metrics.to_dict())


def sse(payload: BaseModel | dict[str, Any]) -> str:
    """An event; a model's None fields are sent as null (OpenAI's chunks carry
    `finish_reason: null` until the last one)."""
    data = payload.model_dump_json() if isinstance(payload, BaseModel) else json.dumps(payload)
    return f"data: {data}\n\n"


SSE_DONE = "data: [DONE]\n\n"


@dataclass(slots=True)
class Delta:
    """What a choice gained since the last chunk."""

    text: str
    token_start: int  # its new tokens are token_ids[token_start:token_end]
    token_end: int
    char_start: int  # where the new text starts in the choice's text
    first: bool  # the choice's first chunk
    finish_reason: str | None


class DeltaTracker:
    """Outputs are cumulative: remember per choice what was sent, hand out only the new part."""

    def __init__(self) -> None:
        self._sent: dict[int, tuple[int, int]] = {}  # choice index -> (num chars, num tokens)
        self._done: set[int] = set()

    def delta(self, index: int, choice: CompletionOutput) -> Delta | None:
        if index in self._done:
            return None
        num_chars, num_tokens = self._sent.get(index, (0, 0))
        first = index not in self._sent
        text = choice.text[num_chars:]
        if not text and len(choice.token_ids) == num_tokens and choice.finish_reason is None:
            return None
        self._sent[index] = (len(choice.text), len(choice.token_ids))
        if choice.finish_reason is not None:
            self._done.add(index)
        return Delta(
            text, num_tokens, len(choice.token_ids), num_chars, first, choice.finish_reason
        )
