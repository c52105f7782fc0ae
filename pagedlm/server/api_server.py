"""The FastAPI app: OpenAI's endpoints plus vLLM's /health, /version, /metrics, /tokenize,
/detokenize; every error in OpenAI's shape.

Request bodies are parsed and validated on the tokenizer pool, not by FastAPI on the event loop:
a large body takes up to a second of CPU, which would stall every stream and /health. Their
schemas still reach /openapi.json (for clients, /docs and the fuzz test)."""

from __future__ import annotations

import gc
import importlib.metadata
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import msgspec
from fastapi import FastAPI, Request
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from pagedlm.engine.tokenizer import Tokenizer
from pagedlm.server.dev_endpoints import add_dev_routes
from pagedlm.server.middleware import GuardMiddleware, InternalErrorMiddleware
from pagedlm.server.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    DetokenizeResponse,
    ModelCard,
    ModelList,
    TokenizeRequest,
    TokenizeResponse,
)
from pagedlm.server.protocol_tools import REMOVED_GUIDED_FIELDS
from pagedlm.server.serving import (
    APIError,
    ServingContext,
    log_refusal,
    tokenize_within_context,
)
from pagedlm.server.serving_chat import create_chat_completion, tokenize_chat
from pagedlm.server.serving_completion import create_completion
from pagedlm.server.tools import template_tools_of

Body = TypeVar("Body", bound=BaseModel)
REQUEST_BODIES = (CompletionRequest, ChatCompletionRequest, TokenizeRequest, DetokenizeRequest)


def build_app(
    ctx: ServingContext, api_key: str | None, max_body_bytes: int, dev_endpoints: bool = False
) -> FastAPI:
    """dev_endpoints (--enable-dev-endpoints): the lifecycle and RL routes (dev_endpoints.py)."""
    app = FastAPI(title="pagedlm", version=_version(), description="OpenAI-compatible LLM server")
    app.add_middleware(InternalErrorMiddleware)  # inside the guard: its 500 gets X-Request-Id
    app.add_middleware(GuardMiddleware, api_key=api_key, max_body_bytes=max_body_bytes)
    _add_error_handlers(app)
    _add_generation_routes(app, ctx)
    _add_service_routes(app, ctx)
    if dev_endpoints:
        add_dev_routes(app, ctx.engine, lambda raw, model: parse_body(ctx, raw, model))
    _document_request_bodies(app)
    return app


def _version() -> str:
    try:
        return importlib.metadata.version("pagedlm")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree, not installed
        return "unknown"


def _error_response(error: APIError, request: Request) -> JSONResponse:
    if error.status < 500:
        log_refusal(error.status, request.method, request.url.path, error.message)
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers)


def _add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def api_error(request: Request, exc: APIError) -> JSONResponse:
        return _error_response(exc, request)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return _error_response(APIError(exc.status_code, str(exc.detail)), request)


async def parse_body(ctx: ServingContext, raw: Request, model: type[Body]) -> Body:
    """The request's JSON body as `model`, parsed and validated on the pool."""
    return await ctx.pool.run(parse_json, model, await raw.body())


# A large body's parse and validation hold the GIL in C for up to ~0.3 s at a time (4 MiB of
# small arrays); large bodies take turns, so the event loop waits for one such call at most,
# never for a chain of them.
LARGE_BODY_BYTES = 256 * 1024
_large_body_turn = threading.Lock()


def parse_json(model: type[Body], data: bytes) -> Body:
    """`data` as `model`; a 400 naming the parameter where it is not."""
    if len(data) <= LARGE_BODY_BYTES:
        return _validated(model, data)
    with _large_body_turn, _gc_paused():
        return _validated(model, data)


@contextmanager
def _gc_paused() -> Iterator[None]:
    """No cyclic garbage collection while a large body's objects are built: each collection
    walks every object built so far, holding the GIL (a body of a million small arrays set off
    collections that held the event loop for 2.4 s, 0.2 s without them). Reference counting
    still frees whatever holds no cycle."""
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _validated(model: type[Body], data: bytes) -> Body:
    try:
        return model.model_validate(_load_json(data))
    except ValidationError as exc:
        raise validation_api_error(exc.errors(include_url=False, include_input=False)) from None


def _load_json(data: bytes) -> Any:
    """msgspec's parser, 2-4x faster than json's: it holds the GIL, so its time is time every
    stream and /health wait. What it refuses goes to json.loads, which gives the error message, or
    parses it after all: a lone surrogate (which validation then refuses naming the field),
    NaN or 1e400 (refused as not finite), integers past 64 bits."""
    try:
        return msgspec.json.decode(data)
    except (msgspec.DecodeError, RecursionError):
        pass
    try:
        return json.loads(data)
    except RecursionError:
        raise APIError(400, "the request body is not valid JSON: nested too deeply") from None
    except ValueError as exc:  # also UnicodeDecodeError: bytes that are not UTF-8
        raise APIError(400, f"the request body is not valid JSON: {exc}") from None


def validation_api_error(errors: Any) -> APIError:
    """pydantic's first complaint as a 400 naming the parameter; the message gives the place
    inside it (`messages.0.role`)."""
    first = list(errors)[0]
    loc = [_printable(str(part)) for part in first.get("loc", ())]
    where = ".".join(loc)
    if first.get("type") == "extra_forbidden" and where in REMOVED_GUIDED_FIELDS:
        message = f"{where}: removed (as in vLLM); use {REMOVED_GUIDED_FIELDS[where]}"
    elif first.get("type") == "extra_forbidden":
        message = f"{where}: unrecognized or unsupported parameter"
    else:
        message = f"{where}: {first.get('msg')}" if where else str(first.get("msg"))
    return APIError(400, message, param=loc[0] if loc else None)


def _printable(text: str) -> str:
    """The text with lone surrogates (an unknown key may hold one) spelled out as escapes: the
    error response must encode as UTF-8."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _json_body(model: type[BaseModel]) -> dict[str, Any]:
    """The OpenAPI requestBody of a route that parses `model` itself."""
    return {
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {"schema": {"$ref": f"#/components/schemas/{model.__name__}"}}
            },
        }
    }


def _document_request_bodies(app: FastAPI) -> None:
    """/openapi.json with the REQUEST_BODIES' schemas among its components."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(
                title=app.title, version=app.version, description=app.description, routes=app.routes
            )
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            for model in REQUEST_BODIES:
                model_schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
                components.update(model_schema.pop("$defs", {}))
                components[model.__name__] = model_schema
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi


def _add_generation_routes(app: FastAPI, ctx: ServingContext) -> None:
    @app.post("/v1/completions", openapi_extra=_json_body(CompletionRequest))
    async def completions(raw: Request) -> Response:
        return await create_completion(ctx, await parse_body(ctx, raw, CompletionRequest), raw)

    @app.post("/v1/chat/completions", openapi_extra=_json_body(ChatCompletionRequest))
    async def chat_completions(raw: Request) -> Response:
        body = await parse_body(ctx, raw, ChatCompletionRequest)
        return await create_chat_completion(ctx, body, raw)


def _model_card(ctx: ServingContext) -> ModelCard:
    # root: the served name, not the model's path on the server's disk
    return ModelCard(id=ctx.model_name, root=ctx.model_name, max_model_len=ctx.max_model_len)


def _add_service_routes(app: FastAPI, ctx: ServingContext) -> None:
    @app.get("/v1/models")
    async def models() -> ModelList:
        return ModelList(data=[_model_card(ctx)])

    @app.get("/v1/models/{model_id:path}")  # :path: a served name may hold slashes (org/name)
    async def model(model_id: str) -> ModelCard:
        ctx.check_model(model_id)
        return _model_card(ctx)

    @app.get("/health")
    async def health(request: Request) -> Response:
        problem = ctx.engine.health_problem
        if problem is None:
            return Response(status_code=200)
        return _error_response(APIError(503, problem, code="unhealthy"), request)

    @app.get("/version")
    async def version() -> dict[str, str]:
        return {"version": _version()}

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(ctx.engine.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.post("/tokenize", openapi_extra=_json_body(TokenizeRequest))
    async def tokenize(raw: Request) -> TokenizeResponse:
        body = await parse_body(ctx, raw, TokenizeRequest)
        ctx.check_model(body.model)
        if (body.prompt is None) == (body.messages is None):
            raise APIError(400, "give exactly one of prompt or messages", param="prompt")
        tokens = await ctx.pool.run_with_tokenizer(_tokenize, ctx, body)
        return TokenizeResponse(count=len(tokens), max_model_len=ctx.max_model_len, tokens=tokens)

    @app.post("/detokenize", openapi_extra=_json_body(DetokenizeRequest))
    async def detokenize(raw: Request) -> DetokenizeResponse:
        body = await parse_body(ctx, raw, DetokenizeRequest)
        ctx.check_model(body.model)
        text = await ctx.pool.run_with_tokenizer(
            _detokenize, ctx.engine.config.model.vocab_size, body.tokens
        )
        return DetokenizeResponse(prompt=text)


def _tokenize(tokenizer: Tokenizer | None, ctx: ServingContext, body: TokenizeRequest) -> list[int]:
    if body.messages is not None:
        tools = template_tools_of(body.tools)
        return tokenize_chat(tokenizer, ctx, body.messages, tools)["prompt_token_ids"]
    return tokenize_within_context(ctx, tokenizer, body.prompt, "prompt", body.add_special_tokens)


def _detokenize(tokenizer: Tokenizer | None, vocab_size: int, tokens: list[int]) -> str:
    if tokenizer is None:
        raise APIError(
            400,
            "tokens: detokenizing needs a tokenizer, but the server skips it "
            "(--skip-tokenizer-init)",
            param="tokens",
        )
    bad = [t for t in tokens if not 0 <= t < vocab_size]
    if bad:
        raise APIError(
            400, f"tokens must be in [0, vocab_size={vocab_size}), got {bad[:5]}", param="tokens"
        )
    return tokenizer.decode(tokens)
