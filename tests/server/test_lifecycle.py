"""Admission control (503 with Retry-After, the refusal counter), abort on disconnect (the KV
cache is freed), and SIGTERM during a stream (exit 0, no process left). One tiny-model server
with --max-num-queued-reqs 2; the SIGTERM test runs last and stops it."""
from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest
from server_helpers import ServerProcess, start_server, tiny_server_args

pytestmark = pytest.mark.slow

LONG = {"prompt": "Tell me everything.", "max_tokens": 300, "ignore_eos": True, "temperature": 0}


@pytest.fixture(scope="module")
def server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    log_path = tmp_path_factory.mktemp("lifecycle") / "server.log"
    server = start_server(tiny_server_args(tiny_model_dir, "--max-num-queued-reqs", "2"), log_path)
    yield server
    server.stop()


def wait_for_idle(server: ServerProcess, timeout_s: float = 5.0) -> None:
    """No running or waiting request and no KV block in use, within `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        state = [server.metric("pagedlm:num_requests_running"),
                 server.metric("pagedlm:num_requests_waiting"),
                 server.metric("pagedlm:kv_cache_usage_perc")]
        if state == [0.0, 0.0, 0.0]:
            return
        assert time.monotonic() < deadline, f"not idle after {timeout_s} s: {state}"
        time.sleep(0.2)


def test_admission_control_refuses_over_the_cap(server: ServerProcess) -> None:
    rejected_before = server.metric("pagedlm:num_requests_rejected_total")

    async def fire() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=server.base_url, timeout=300) as client:
            return await asyncio.gather(*(client.post("/v1/completions", json=LONG)
                                          for _ in range(10)))

    responses = asyncio.run(fire())
    accepted = [r for r in responses if r.status_code == 200]
    refused = [r for r in responses if r.status_code == 503]
    assert len(accepted) + len(refused) == 10
    assert 1 <= len(accepted) and len(refused) >= 1
    for response in refused:
        assert response.headers["retry-after"] == "1"
        assert "max_num_queued_reqs=2" in response.json()["error"]["message"]
    for response in accepted:
        assert response.json()["usage"]["completion_tokens"] == 300
    rejected = server.metric("pagedlm:num_requests_rejected_total") - rejected_before
    assert rejected == len(refused)
    wait_for_idle(server)


def test_n_counts_against_the_cap(server: ServerProcess) -> None:
    response = httpx.post(server.url("/v1/completions"), json={**LONG, "n": 3})
    assert response.status_code == 400
    assert "3 of max_num_queued_reqs=2" in response.json()["error"]["message"]


def test_dropped_stream_is_aborted(server: ServerProcess) -> None:
    aborted_before = server.metric("pagedlm:request_success_total", finished_reason="abort")
    with httpx.stream("POST", server.url("/v1/completions"), json={**LONG, "stream": True},
                      timeout=60) as response:
        num_events = 0
        for line in response.iter_lines():
            num_events += line.startswith("data: ")
            if num_events == 3:
                assert server.metric("pagedlm:num_requests_running") == 1
                assert server.metric("pagedlm:kv_cache_usage_perc") > 0
                break  # leaving the iterator closes the connection mid-stream
    wait_for_idle(server)
    assert server.metric("pagedlm:request_success_total", finished_reason="abort") == aborted_before + 1


def test_abandoned_request_is_aborted(server: ServerProcess) -> None:
    """A non-streaming client that gives up (timeout) aborts its request too. The request fills the
    model's length (~500 steps) and the client waits 0.3 s: the engine is far from done (on this
    machine 300 tokens once took just under a second)."""
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.url("/v1/completions"), json={**LONG, "max_tokens": 490}, timeout=0.3)
    wait_for_idle(server)


def test_engine_core_exits_when_the_front_end_is_killed(tiny_model_dir: Path,
                                                       tmp_path: Path) -> None:
    """SIGKILL leaves no chance to clean up: the busy engine core notices its parent is gone."""
    other = start_server(tiny_server_args(tiny_model_dir), tmp_path / "server.log")
    front_end = psutil.Process(other.proc.pid)
    children = front_end.children(recursive=True)
    with httpx.stream("POST", other.url("/v1/completions"), json={**LONG, "stream": True},
                      timeout=60) as response:
        lines = response.iter_lines()
        assert next(line for line in lines if line.startswith("data: "))
        front_end.kill()
    other.proc.wait(10)
    gone, alive = psutil.wait_procs(children, timeout=5)  # sooner than the generation ends
    assert not alive, f"left behind: {alive}"


def test_sigterm_during_a_stream_exits_cleanly(server: ServerProcess) -> None:
    process = psutil.Process(server.proc.pid)
    family = [process, *process.children(recursive=True)]
    assert len(family) >= 2  # the front end and the engine-core process
    with httpx.stream("POST", server.url("/v1/completions"), json={**LONG, "stream": True},
                      timeout=60) as response:
        lines = response.iter_lines()
        assert next(line for line in lines if line.startswith("data: "))
        server.proc.send_signal(signal.SIGTERM)
        rest = [line for line in lines if line.startswith("data: ")]
    assert rest[-1] == "data: [DONE]"
    assert "shutting down" in rest[-2]
    assert server.proc.wait(30) == 0
    gone, alive = psutil.wait_procs(family, timeout=10)
    assert not alive, f"left behind: {alive}"
