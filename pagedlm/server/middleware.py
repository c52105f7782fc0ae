"""Checks that run before any route: the API key (on every route but /health), the
request-body size limit, and the X-Request-Id header echoed on the response; and the catch-all
that turns an unexpected exception into a 500 in OpenAI's shape. Plain ASGI, so streaming and
disconnect detection pass through untouched."""

from __future__ import annotations

import hmac
import json
from typing import Any

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from pagedlm.server.serving import internal_error, log_refusal

OPEN_PATHS = frozenset({"/health"})  # for probes that hold no key


class GuardMiddleware:
    def __init__(self, app: ASGIApp, api_key: str | None, max_body_bytes: int) -> None:
        self.app = app
        self.api_key = None if api_key is None else api_key.encode()
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])  # lower-case byte names
        request_id = headers.get(b"x-request-id")
        if request_id is not None:
            send = _echo_request_id(send, request_id)
        error = self._check(scope["path"], headers)
        if error is not None:
            log_refusal(error[0], scope["method"], scope["path"], error[1])
            await _send_error(send, *error)
            return
        await self.app(scope, self._limit_body(receive), send)

    def _check(self, path: str, headers: dict[bytes, bytes]) -> tuple[int, str, str, str] | None:
        """(status, message, type, code) of a refused request, or None."""
        if self.api_key is not None and path not in OPEN_PATHS and not self._authorized(headers):
            return (
                401,
                "Incorrect or missing API key: send the header 'Authorization: Bearer <key>'",
                "authentication_error",
                "invalid_api_key",
            )
        length = headers.get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_body_bytes:
            return (
                413,
                _too_large(self.max_body_bytes),
                "invalid_request_error",
                "request_too_large",
            )
        return None

    def _authorized(self, headers: dict[bytes, bytes]) -> bool:
        """`Authorization: Bearer <key>`; the scheme's case does not matter (RFC 7235), the key
        is compared in constant time."""
        scheme, _, token = headers.get(b"authorization", b"").partition(b" ")
        return scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(b" "), self.api_key)

    def _limit_body(self, receive: Receive) -> Receive:
        """Counts a body sent without (or with a false) Content-Length."""
        num_bytes = 0

        async def limited() -> Message:
            nonlocal num_bytes
            message = await receive()
            if message["type"] == "http.request":
                num_bytes += len(message.get("body", b""))
                if num_bytes > self.max_body_bytes:
                    raise HTTPException(413, _too_large(self.max_body_bytes))
            return message

        return limited


class InternalErrorMiddleware:
    """An exception no route turned into a response becomes a 500 in OpenAI's shape, logged
    with its traceback (Starlette's own answer is a plain-text 500 the openai client cannot
    read). Once a response has started it can no longer change: the exception goes on to
    uvicorn (the streams catch their own, see serving.stream_error_event)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def send_tracked(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, send_tracked)
        except Exception as exc:  # noqa: BLE001 - the catch-all
            if started:
                raise
            error = internal_error(exc, f"{scope['method']} {scope['path']}")
            await _send_json(send, error.status, error.body())


def _too_large(limit: int) -> str:
    return f"the request body is larger than the limit of {limit} bytes (--max-request-body-bytes)"


def _echo_request_id(send: Send, request_id: bytes) -> Send:
    async def send_with_id(message: Message) -> None:
        if message["type"] == "http.response.start":
            message = dict(message)
            message["headers"] = list(message.get("headers", [])) + [(b"x-request-id", request_id)]
        await send(message)

    return send_with_id


async def _send_error(send: Send, status: int, message: str, kind: str, code: str) -> None:
    await _send_json(
        send, status, {"error": {"message": message, "type": kind, "param": None, "code": code}}
    )


async def _send_json(send: Send, status: int, body: dict[str, Any]) -> None:
    data = json.dumps(body).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(data)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": data})
