"""Unexpected exceptions, logs and /metrics, with the `openai` client over loopback. The server
runs in this process (uvicorn on a thread, the engine core in its own process as in `pagedlm
serve`, on the tiny random Llama) so a test can monkeypatch what a handler calls and read what
it logs: an exception in a handler is a 500 in OpenAI's error shape (logged with its traceback),
one in a stream is an error event and [DONE], and the engine serves the next request; every 4xx
and every client disconnect is logged at INFO with its reason. /metrics has no `*_created`
series and every other series of the registry."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import uvicorn
from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from server_helpers import API_KEY, free_port, tiny_server_args

from pagedlm.cli import build_parser
from pagedlm.config import EngineArgs
from pagedlm.server import serving_completion
from pagedlm.server.api_server import build_app
from pagedlm.server.async_engine import AdmissionLimits, AsyncLLM
from pagedlm.server.cli import DEFAULT_MAX_BODY_BYTES
from pagedlm.server.serving import DeltaTracker, ServingContext

pytestmark = pytest.mark.slow

MODEL = "tiny"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
CHAT = [{"role": "user", "content": "Hi"}]
SECRET = "secret detail of the server"  # in the injected exception: must not reach the client
START_TIMEOUT_S = 300


class ServerThread(threading.Thread):
    """build_app + uvicorn on a thread with its own event loop, as launch.serve without the
    signal handling (signals belong to the main thread)."""

    def __init__(self, model_dir: Path) -> None:
        super().__init__(name="test-server", daemon=True)
        # the folder as --model: `serve`'s positional MODEL is moved there by run_serve
        args = build_parser().parse_args(["serve", "--model", *tiny_server_args(model_dir)])
        self.config = EngineArgs.from_cli_args(args).create_engine_config()
        self.base_url = f"http://127.0.0.1:{free_port()}"
        self.engine: AsyncLLM | None = None
        self.server: uvicorn.Server | None = None

    def run(self) -> None:
        asyncio.run(self._serve())

    async def _serve(self) -> None:
        self.engine = AsyncLLM(self.config, MODEL, AdmissionLimits())
        try:
            await self.engine.start()
            app = build_app(ServingContext(self.engine, MODEL), API_KEY, DEFAULT_MAX_BODY_BYTES)
            port = int(self.base_url.rsplit(":", 1)[1])
            self.server = uvicorn.Server(
                uvicorn.Config(
                    app, host="127.0.0.1", port=port, lifespan="off", log_level="warning"
                )
            )
            await self.server.serve()
        finally:
            await self.engine.shutdown()

    def wait_healthy(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            assert self.is_alive(), "the server thread ended while starting (see its log)"
            try:
                if httpx.get(self.base_url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        pytest.fail(f"server not healthy in {START_TIMEOUT_S} s")

    def stop(self) -> None:
        if self.server is not None:
            self.server.should_exit = True
        self.join(60)
        assert not self.is_alive(), "the server thread did not stop in 60 s"


@pytest.fixture(scope="module")
def server(tiny_model_dir: Path) -> Iterator[ServerThread]:
    thread = ServerThread(tiny_model_dir)
    thread.start()
    thread.wait_healthy()
    yield thread
    thread.stop()


@pytest.fixture(scope="module")
def client(server: ServerThread) -> openai.OpenAI:
    # no retries: a 500 is retried by default, and each test counts the calls it breaks
    return openai.OpenAI(
        base_url=server.base_url + "/v1", api_key=API_KEY, timeout=60, max_retries=0
    )


class RecordList(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def server_log() -> Iterator[RecordList]:
    """What the server logs to `pagedlm.server` during the test."""
    handler = RecordList()
    logger = logging.getLogger("pagedlm.server")
    level = logger.level
    logger.setLevel(logging.INFO)  # as `pagedlm serve` logs (no entry point configured this one)
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def raise_on_call(number: int, fn: Callable[..., Any]) -> Callable[..., Any]:
    """fn, except that call `number` (1-based) raises RuntimeError(SECRET)."""
    num_calls = 0

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        nonlocal num_calls
        num_calls += 1
        if num_calls == number:
            raise RuntimeError(SECRET)
        return fn(*args, **kwargs)

    return wrapped


def assert_logged_with_traceback(log: RecordList, where: str) -> None:
    """One error record naming `where`, with the exception's message and traceback."""
    records = [r for r in log.records if where in r.getMessage()]
    assert len(records) == 1, [r.getMessage() for r in log.records]
    assert records[0].levelno == logging.ERROR
    text = logging.Formatter().format(records[0])
    assert SECRET in text and "Traceback" in text  # the whole story, on the server


def assert_internal_error(error: Any) -> None:
    """OpenAI's error shape, naming the exception's class, without its message or traceback."""
    assert isinstance(error, dict), error  # Starlette's own 500 is plain text
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "InternalServerError"
    assert error["code"] == "internal_server_error"
    assert "RuntimeError" in error["message"]
    assert SECRET not in error["message"] and "Traceback" not in error["message"]


def assert_serves(client: openai.OpenAI) -> None:
    result = client.completions.create(
        model=MODEL, prompt="Hello", max_tokens=3, extra_body={"ignore_eos": True}
    )
    assert result.usage.completion_tokens == 3


def test_exception_in_a_handler_is_a_500_in_openai_shape(
    client: openai.OpenAI,
    server: ServerThread,
    server_log: RecordList,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(
        serving_completion, "_prompt_list", raise_on_call(1, serving_completion._prompt_list)
    )
    with pytest.raises(openai.InternalServerError) as caught:
        client.completions.create(model=MODEL, prompt="Hello", max_tokens=3)
    assert caught.value.status_code == 500
    assert_internal_error(caught.value.body)
    assert caught.value.response.headers["content-type"] == "application/json"
    assert_logged_with_traceback(server_log, "POST /v1/completions")
    monkeypatch.undo()
    assert_serves(client)


def test_the_500_echoes_the_request_id(
    server: ServerThread, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        serving_completion, "_prompt_list", raise_on_call(1, serving_completion._prompt_list)
    )
    response = httpx.post(
        server.base_url + "/v1/completions",
        headers={**AUTH, "X-Request-Id": "req-500"},
        json={"prompt": "Hi"},
        timeout=60,
    )
    assert response.status_code == 500
    assert response.headers["x-request-id"] == "req-500"
    assert_internal_error(response.json()["error"])


def aborted(server: ServerThread) -> float:
    """Requests finished by an abort, from /metrics."""
    text = httpx.get(server.base_url + "/metrics", headers=AUTH, timeout=10).text
    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "pagedlm:request_success_total" and s.labels["finished_reason"] == "abort"
    )


@pytest.mark.parametrize(
    "path, body",
    [
        ("/v1/completions", {"prompt": "Hello"}),
        ("/v1/chat/completions", {"messages": CHAT}),
    ],
    ids=["completions", "chat"],
)
def test_exception_mid_stream_sends_an_error_event_and_ends(
    client: openai.OpenAI,
    server: ServerThread,
    server_log: RecordList,
    monkeypatch: pytest.MonkeyPatch,
    path: str,
    body: dict,
) -> None:
    """The second update of the stream raises: the first was sent, then an error event and
    [DONE]; the engine request is aborted and the engine serves the next request."""
    aborted_before = aborted(server)
    monkeypatch.setattr(DeltaTracker, "delta", raise_on_call(2, DeltaTracker.delta))
    request = {**body, "max_tokens": 400, "ignore_eos": True, "stream": True}
    with httpx.stream(
        "POST", server.base_url + path, json=request, headers=AUTH, timeout=60
    ) as response:
        assert response.status_code == 200
        lines = [line for line in response.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    events = [json.loads(line[len("data: ") :]) for line in lines[:-1]]
    assert events[:-1] and all("choices" in event for event in events[:-1]), events
    assert_internal_error(events[-1]["error"])
    assert_logged_with_traceback(server_log, "the stream of ")
    deadline = time.monotonic() + 10
    while aborted(server) < aborted_before + 1:
        assert time.monotonic() < deadline, "the failed stream's request was not aborted"
        time.sleep(0.1)
    monkeypatch.undo()
    assert_serves(client)


def test_openai_client_raises_on_the_stream_error_event(
    client: openai.OpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(DeltaTracker, "delta", raise_on_call(2, DeltaTracker.delta))
    stream = client.chat.completions.create(
        model=MODEL, messages=CHAT, max_tokens=400, stream=True, extra_body={"ignore_eos": True}
    )
    chunks = []
    with pytest.raises(openai.APIError) as caught:
        for chunk in stream:
            chunks.append(chunk)
    assert chunks  # what came before the error
    assert_internal_error(caught.value.body)


def test_validation_error_is_still_a_400(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model=MODEL, prompt="Hello", max_tokens=3, temperature=-1)
    assert caught.value.status_code == 400
    error = caught.value.body
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error" and error["param"] == "temperature"


def info_messages(log: RecordList) -> list[str]:
    return [r.getMessage() for r in log.records if r.levelno == logging.INFO]


@pytest.mark.parametrize(
    "path, body, headers, logged",
    [
        (
            "/v1/completions",
            {"prompt": "Hi", "temperature": -1},
            AUTH,
            "400 POST /v1/completions: temperature: Input should be greater than or equal to 0",
        ),
        (
            "/v1/chat/completions",
            {"messages": CHAT, "model": "gpt-17"},
            AUTH,
            "404 POST /v1/chat/completions: The model `gpt-17` does not exist.",
        ),
        ("/tokenize", {"prompt": "Hi"}, {}, "401 POST /tokenize: Incorrect or missing API key"),
        (
            "/v1/completions",
            {"prompt": "Hi", "model": "x\nINFO forged line"},
            AUTH,
            "404 POST /v1/completions: The model `x\\nINFO forged line` does not exist.",
        ),
    ],
    ids=["400", "404", "401", "one line"],
)
def test_each_4xx_is_logged_at_info_with_its_reason(
    server: ServerThread, server_log: RecordList, path: str, body: dict, headers: dict, logged: str
) -> None:
    response = httpx.post(server.base_url + path, json=body, headers=headers, timeout=60)
    assert 400 <= response.status_code < 500
    assert any(message.startswith(logged) for message in info_messages(server_log)), info_messages(
        server_log
    )


def test_a_disconnect_is_logged_at_info(server: ServerThread, server_log: RecordList) -> None:
    request = {
        "prompt": "Hello",
        "max_tokens": 400,
        "ignore_eos": True,
        "stream": True,
        "request_id": "dropped-7",
    }
    with httpx.stream(
        "POST", server.base_url + "/v1/completions", json=request, headers=AUTH, timeout=60
    ) as response:
        for line in response.iter_lines():
            if line.startswith("data: "):
                break  # closes the connection mid-stream
    deadline = time.monotonic() + 10
    while not any(
        "dropped-7" in m and "client disconnected" in m for m in info_messages(server_log)
    ):
        assert time.monotonic() < deadline, info_messages(server_log)
        time.sleep(0.1)


def series(text: str) -> set[tuple[str, tuple[tuple[str, str], ...]]]:
    return {
        (s.name, tuple(sorted(s.labels.items())))
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_metrics_have_no_created_series_and_keep_the_rest(
    client: openai.OpenAI, server: ServerThread
) -> None:
    assert_serves(client)  # every histogram has observations
    served = httpx.get(server.base_url + "/metrics", headers=AUTH, timeout=10).text
    assert "_created" not in served
    everything = generate_latest(server.engine.metrics.registry).decode()
    created = {s for s in series(everything) if s[0].endswith("_created")}
    assert created  # prometheus_client adds them: the filter is what removes them
    assert series(served) == series(everything) - created
    assert 'pagedlm:request_success_total{finished_reason="length",model_name="tiny"}' in served
    # the filter is the server's alone: another registry in the process keeps its series
    other = CollectorRegistry()
    Counter("other_requests", "another user's counter", registry=other).inc()
    assert "other_requests_created" in generate_latest(other).decode()
