"""A faulty engine core, on tiny-model servers: killed (SIGKILL), the server fails what is in flight
and exits 1 within seconds (for its supervisor to restart it); stopped (SIGSTOP), /health and new
requests get 503 after --heartbeat-timeout, and the server recovers on SIGCONT or, stopped past
--stall-timeout, declares the core dead and exits 1 the same way."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest
from server_helpers import (
    ServerProcess,
    StreamInBackground,
    assert_gone,
    start_server,
    tiny_server_args,
)

pytestmark = pytest.mark.slow

HEARTBEAT_TIMEOUT_S = 2.0
STALL_TIMEOUT_S = 8.0
LONGEST = {
    "prompt": "Tell me everything.",
    "max_tokens": 490,
    "ignore_eos": True,
    "temperature": 0,
    "stream_options": {"include_usage": True},
}
SHORTER = {**LONGEST, "max_tokens": 60}  # a stream that runs to its end


@pytest.fixture(scope="module")
def server(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    """Short heartbeat timeouts; the last test ends it."""
    log_path = tmp_path_factory.mktemp("faults") / "server.log"
    server = start_server(
        tiny_server_args(
            tiny_model_dir,
            "--heartbeat-timeout",
            str(HEARTBEAT_TIMEOUT_S),
            "--stall-timeout",
            str(STALL_TIMEOUT_S),
        ),
        log_path,
    )
    yield server
    server.stop()


def assert_exits_1_failing_its_streams(
    server: ServerProcess,
    family: list[psutil.Process],
    streams: list[StreamInBackground],
    within_s: float,
    why: str,
) -> None:
    start = time.monotonic()
    assert server.proc.wait(within_s + 30) == 1
    assert time.monotonic() - start < within_s, "the server took too long to exit"
    assert_gone(family)
    for stream in streams:
        error = stream.result(10)[-1]["error"]
        assert error["code"] == "engine_dead" and why in error["message"], error
    assert "exiting with code 1 (for a supervisor to restart the server)" in server.log()


def test_a_stopped_core_is_unhealthy_until_it_runs_again(server: ServerProcess) -> None:
    stream = StreamInBackground(server, "/v1/completions", SHORTER)
    stream.wait_for_events(3)
    core = server.core_process()
    core.suspend()
    try:
        # the last beat came up to one interval (0.5 s) before the stop
        assert server.wait_for_health(503, HEARTBEAT_TIMEOUT_S + 2) >= HEARTBEAT_TIMEOUT_S - 0.5
        refused = httpx.post(
            server.url("/v1/completions"), json={"prompt": "Hi", "max_tokens": 1}, timeout=10
        )
        assert refused.status_code == 503, refused.text
        assert "no heartbeat" in refused.json()["error"]["message"]
        assert refused.json()["error"]["code"] == "engine_stalled"
        health = httpx.get(server.url("/health"), timeout=5)
        assert health.status_code == 503 and "no heartbeat" in health.json()["error"]["message"]
    finally:
        core.resume()
    server.wait_for_health(200, timeout_s=3)
    events = stream.result()
    assert events[-1].get("usage", {}).get("completion_tokens") == SHORTER["max_tokens"], events[
        -2:
    ]
    assert "error" not in events[-2]
    server.wait_for_idle()
    log = server.log()
    assert "engine core: no heartbeat for" in log and "engine core: beating again" in log


def test_a_core_stopped_past_the_stall_timeout_is_dead(server: ServerProcess) -> None:
    """Ends the module's server."""
    family = server.family()
    stream = StreamInBackground(server, "/v1/completions", LONGEST)
    stream.wait_for_events(3)
    server.core_process().suspend()
    assert_exits_1_failing_its_streams(
        server, family, [stream], STALL_TIMEOUT_S + 5, "no heartbeat for"
    )


def test_a_killed_core_ends_the_server_with_code_1(tiny_model_dir: Path, tmp_path: Path) -> None:
    other = start_server(tiny_server_args(tiny_model_dir), tmp_path / "server.log")
    family = other.family()
    streams = [StreamInBackground(other, "/v1/completions", LONGEST) for _ in range(3)]
    for stream in streams:
        stream.wait_for_events(2)
    other.core_process().send_signal(signal.SIGKILL)
    assert_exits_1_failing_its_streams(other, family, streams, 5, "exited with code -9")
