"""The error a caller's bad request raises at the engine boundary, typed so that a front end maps
it to its own error shape without reading the message."""

from __future__ import annotations

CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"  # OpenAI's code


class InvalidRequest(ValueError):
    """A request the engine refuses. `param`: the parameter at fault, named as the OpenAI / vLLM
    API names it ("prompt", "max_tokens", "temperature", ...), None when no one parameter is.
    `code`: a machine-readable reason where OpenAI has one (CONTEXT_LENGTH_EXCEEDED), else None.
    The message names the parameter and the limit for a human."""

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.param = param
        self.code = code

    def prefixed(self, prefix: str) -> InvalidRequest:
        """The same error, its message after `prefix` (e.g. which prompt of a batch)."""
        return InvalidRequest(f"{prefix}{self}", param=self.param, code=self.code)
