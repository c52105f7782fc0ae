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
from server_helpers import ServerProcess, start_server, tiny_server_args
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


@pytest.mark.parametrize("extra", [
    {"temperature": 1e300}, {"temperature": 1e-5}, {"min_p": 1.0},
    {"repetition_penalty": 1e-300}, {"repetition_penalty": 1e300}, {"top_k": 1},
    {"logit_bias": {"5": 100, "6": -100}}, {"seed": -(2**63)}, {"n": 128, "logprobs": 20},
    {"stop_token_ids": [0, 1, 2], "min_tokens": 3}, {"presence_penalty": 2, "frequency_penalty": -2},
    {"top_p": 1e-300},  # rounds to 0 in float32: the sampler must still keep one token
], ids=str)
def test_extreme_valid_values(server: ServerProcess, extra: dict) -> None:
    """Valid values at the edges of their ranges generate, and leave the engine alive."""
    body = {"prompt": "Hi", "max_tokens": 3, "temperature": 1.0, **extra}
    response = httpx.post(server.url("/v1/completions"), json=body, timeout=CALL_TIMEOUT_S)
    assert response.status_code == 200, response.text
    assert len(response.json()["choices"]) == body.get("n", 1)
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
