"""Schemathesis against the server's OpenAPI schema for the two generation endpoints: valid and
invalid bodies; no 500 and no hang. Then the engine-core process is killed: /health says 503,
requests get 503, and SIGTERM still exits 0. A tiny-model server with max_model_len 48 keeps
each generation short."""
from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest
import schemathesis
from conftest import ServerProcess, start_server, tiny_server_args
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode

pytestmark = pytest.mark.slow

CALL_TIMEOUT_S = 60  # a call that takes longer counts as a hang


@pytest.fixture(scope="module")
def server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    log_path = tmp_path_factory.mktemp("fuzz") / "server.log"
    server = start_server(tiny_server_args(tiny_model_dir, "--max-model-len", "48"), log_path)
    yield server
    server.stop()


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE],
                         ids=["valid", "invalid"])
@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_fuzz_generation_endpoint(server: ServerProcess, path: str, mode: GenerationMode) -> None:
    schema = schemathesis.openapi.from_url(server.url("/openapi.json"))
    operation = schema[path]["POST"]

    @settings(max_examples=40, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(case=operation.as_strategy(generation_mode=mode))
    def check(case: schemathesis.Case) -> None:
        response = case.call(base_url=server.base_url, timeout=CALL_TIMEOUT_S)
        assert response.status_code < 500, (case.body, response.text[-2000:])
        if response.status_code >= 400:
            assert set(response.json()["error"]) == {"message", "type", "param", "code"}

    check()
    assert httpx.get(server.url("/health")).status_code == 200


def test_dead_engine_is_reported(server: ServerProcess) -> None:
    front_end = psutil.Process(server.proc.pid)
    cores = [p for p in front_end.children() if "spawn_main" in " ".join(p.cmdline())]
    assert len(cores) == 1
    cores[0].send_signal(signal.SIGKILL)
    deadline = time.monotonic() + 10
    while httpx.get(server.url("/health")).status_code != 503:
        assert time.monotonic() < deadline, "/health still 200 after the engine core died"
        time.sleep(0.2)
    response = httpx.post(server.url("/v1/completions"), json={"prompt": "Hi", "max_tokens": 2})
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "engine_dead"
    assert server.stop() == 0
