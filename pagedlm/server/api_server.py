"""The FastAPI app: OpenAI's endpoints plus vLLM's /health, /version, /metrics, /tokenize,
/detokenize; every error in OpenAI's shape."""
from __future__ import annotations

import importlib.metadata
import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException as StarletteHTTPException

from pagedlm.server.middleware import GuardMiddleware, InternalErrorMiddleware
from pagedlm.server.protocol import (ChatCompletionRequest, CompletionRequest, DetokenizeRequest,
                                     DetokenizeResponse, ModelCard, ModelList, TokenizeRequest,
                                     TokenizeResponse)
from pagedlm.server.serving import APIError, ServingContext
from pagedlm.server.serving_chat import create_chat_completion, render_chat
from pagedlm.server.serving_completion import create_completion

logger = logging.getLogger("pagedlm.server")


def build_app(ctx: ServingContext, api_key: str | None, max_body_bytes: int) -> FastAPI:
    app = FastAPI(title="pagedlm", version=_version(),
                  description="OpenAI-compatible LLM server")
    app.add_middleware(InternalErrorMiddleware)  # inside the guard: its 500 gets X-Request-Id
    app.add_middleware(GuardMiddleware, api_key=api_key, max_body_bytes=max_body_bytes)
    _add_error_handlers(app)
    _add_generation_routes(app, ctx)
    _add_service_routes(app, ctx)
    return app


def _version() -> str:
    try:
        return importlib.metadata.version("pagedlm")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree, not installed
        return "unknown"


def _error_response(error: APIError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers)


def _add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def api_error(_: Request, exc: APIError) -> JSONResponse:
        return _error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        return _error_response(validation_api_error(exc.errors()))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return _error_response(APIError(exc.status_code, str(exc.detail)))


def validation_api_error(errors: Any) -> APIError:
    """pydantic's first complaint as a 400 naming the parameter; the message gives the place
    inside it (`messages.0.role`)."""
    first = list(errors)[0]
    if first.get("type") == "json_invalid":
        return APIError(400, "the request body is not valid JSON: "
                        f"{first.get('ctx', {}).get('error')}")
    loc = [str(part) for part in first.get("loc", ()) if part != "body"]
    where = ".".join(loc)
    if first.get("type") == "extra_forbidden":
        message = f"{where}: unrecognized or unsupported parameter"
    else:
        message = f"{where}: {first.get('msg')}" if where else str(first.get("msg"))
    return APIError(400, message, param=loc[0] if loc else None)


def _add_generation_routes(app: FastAPI, ctx: ServingContext) -> None:
    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, raw: Request) -> Response:
        return await create_completion(ctx, body, raw)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, raw: Request) -> Response:
        return await create_chat_completion(ctx, body, raw)


def _add_service_routes(app: FastAPI, ctx: ServingContext) -> None:
    @app.get("/v1/models")
    async def models() -> ModelList:
        return ModelList(data=[ModelCard(id=ctx.model_name, root=ctx.engine.config.model.model,
                                         max_model_len=ctx.max_model_len)])

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200 if ctx.engine.is_healthy else 503)

    @app.get("/version")
    async def version() -> dict[str, str]:
        return {"version": _version()}

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(ctx.engine.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.post("/tokenize")
    async def tokenize(body: TokenizeRequest) -> TokenizeResponse:
        ctx.check_model(body.model)
        if (body.prompt is None) == (body.messages is None):
            raise APIError(400, "give exactly one of prompt or messages", param="prompt")
        if body.messages is not None:
            tokens = render_chat(ctx, body.messages)["prompt_token_ids"]
        else:
            tokens = list(ctx.tokenizer.encode(body.prompt,
                                               add_special_tokens=body.add_special_tokens))
        return TokenizeResponse(count=len(tokens), max_model_len=ctx.max_model_len, tokens=tokens)

    @app.post("/detokenize")
    async def detokenize(body: DetokenizeRequest) -> DetokenizeResponse:
        ctx.check_model(body.model)
        vocab_size = ctx.engine.config.model.vocab_size
        bad = [t for t in body.tokens if not 0 <= t < vocab_size]
        if bad:
            raise APIError(400, f"tokens must be in [0, vocab_size={vocab_size}), got {bad[:5]}",
                           param="tokens")
        return DetokenizeResponse(prompt=ctx.tokenizer.decode(body.tokens))
