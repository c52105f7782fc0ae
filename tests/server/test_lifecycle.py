"""Admission control (503 with Retry-After, the refusal counter), abort on disconnect (the KV
cache is freed), the access log, and the shutdown: SIGTERM drains (new requests 503, those in
flight finish, exit 0, no process left), a second signal exits at once, --shutdown-timeout aborts
what is left. One tiny-model server with --max-num-queued-reqs 2; the drain test runs last and
stops it; the other shutdown tests have servers of their own."""

from __future__ import annotations

import asyncio
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

LONG = {"prompt": "Tell me everything.", "max_tokens": 300, "ignore_eos": True, "temperature": 0}
# Nearly the tiny model's whole context (512): from 1.5 s to 30 s of generation on a busy 2-core CPU.
LONGEST = {**LONG, "max_tokens": 490, "stream_options": {"include_usage": True}}
DRAINED = {**LONGEST, "max_tokens": 60}  # well within the default --shutdown-timeout (20 s)


@pytest.fixture(scope="module")
def server(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    log_path = tmp_path_factory.mktemp("lifecycle") / "server.log"
    server = start_server(tiny_server_args(tiny_model_dir, "--max-num-queued-reqs", "2"), log_path)
    yield server
    server.stop()


def test_admission_control_refuses_over_the_cap(server: ServerProcess) -> None:
    rejected_before = server.metric("pagedlm:num_requests_rejected_total")

    async def fire() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=server.base_url, timeout=300) as client:
            return await asyncio.gather(
                *(client.post("/v1/completions", json=LONG) for _ in range(10))
            )

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
    server.wait_for_idle()


def test_n_counts_against_the_cap(server: ServerProcess) -> None:
    response = httpx.post(server.url("/v1/completions"), json={**LONG, "n": 3})
    assert response.status_code == 400
    assert "3 of max_num_queued_reqs=2" in response.json()["error"]["message"]


def test_dropped_stream_is_aborted(server: ServerProcess) -> None:
    aborted_before = server.metric("pagedlm:request_success_total", finished_reason="abort")
    with httpx.stream(
        "POST", server.url("/v1/completions"), json={**LONG, "stream": True}, timeout=60
    ) as response:
        num_events = 0
        for line in response.iter_lines():
            num_events += line.startswith("data: ")
            if num_events == 3:
                assert server.metric("pagedlm:num_requests_running") == 1
                assert server.metric("pagedlm:kv_cache_usage_perc") > 0
                break  # leaving the iterator closes the connection mid-stream
    server.wait_for_idle()
    assert (
        server.metric("pagedlm:request_success_total", finished_reason="abort")
        == aborted_before + 1
    )


def test_abandoned_request_is_aborted(server: ServerProcess) -> None:
    """A non-streaming client that gives up (timeout) aborts its request too. The request fills the
    model's length (~500 steps) and the client waits 0.3 s: the engine is far from done (on this
    machine 300 tokens once took just under a second)."""
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.url("/v1/completions"), json={**LONG, "max_tokens": 490}, timeout=0.3)
    server.wait_for_idle()


def test_engine_core_exits_when_the_front_end_is_killed(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """SIGKILL leaves no chance to clean up: the busy engine core notices its parent is gone."""
    other = start_server(tiny_server_args(tiny_model_dir), tmp_path / "server.log")
    front_end = psutil.Process(other.proc.pid)
    children = front_end.children(recursive=True)
    with httpx.stream(
        "POST", other.url("/v1/completions"), json={**LONG, "stream": True}, timeout=60
    ) as response:
        lines = response.iter_lines()
        assert next(line for line in lines if line.startswith("data: "))
        front_end.kill()
    other.proc.wait(10)
    assert_gone(children, timeout_s=5)  # sooner than the generation ends


def test_health_and_metrics_polls_stay_out_of_the_access_log(server: ServerProcess) -> None:
    for path in ("/health", "/metrics", "/health?probe=1"):
        assert httpx.get(server.url(path), timeout=10).status_code == 200
    httpx.get(server.url("/v1/models"), timeout=10)
    time.sleep(0.5)  # the log is written by another process
    log = server.log()
    assert '"GET /v1/models HTTP/1.1" 200' in log  # the access log is on
    assert '"GET /health' not in log and '"GET /metrics' not in log, log[-2000:]


def test_sigterm_drains_the_streams_in_flight_then_exits_0(server: ServerProcess) -> None:
    """Runs last: it stops the module's server. The core is stopped (SIGSTOP) while the drain's
    refusals are checked, so that the stream is surely still in flight however fast it runs."""
    family = server.family()
    assert len(family) >= 2  # the front end and the engine-core process
    stream = StreamInBackground(server, "/v1/completions", DRAINED)
    stream.wait_for_events(3)
    core = server.core_process()
    core.suspend()
    try:
        server.proc.send_signal(signal.SIGTERM)
        server.wait_for_health(503)
        refused = httpx.post(
            server.url("/v1/completions"), json={**LONG, "max_tokens": 1}, timeout=10
        )
    finally:
        core.resume()
    assert refused.status_code == 503 and "shutting down" in refused.json()["error"]["message"]
    events = stream.result()
    assert "error" not in events[-2], events[-2]
    assert events[-1].get("usage", {}).get("completion_tokens") == DRAINED["max_tokens"], events[
        -2:
    ]
    assert server.proc.wait(30) == 0
    assert_gone(family)
    assert "SIGTERM: draining" in server.log()


def test_a_second_signal_exits_at_once(tiny_model_dir: Path, tmp_path: Path) -> None:
    """The core is stopped (SIGSTOP) so that the stream cannot finish: only the second signal
    (SIGINT, as a second Ctrl-C) ends the drain, well before --shutdown-timeout."""
    other = start_server(
        tiny_server_args(tiny_model_dir, "--shutdown-timeout", "60"), tmp_path / "server.log"
    )
    family = other.family()
    stream = StreamInBackground(other, "/v1/completions", LONGEST)
    stream.wait_for_events(3)
    other.core_process().suspend()
    other.proc.send_signal(signal.SIGTERM)
    other.wait_for_health(503)
    other.proc.send_signal(signal.SIGINT)
    sent_at = time.monotonic()
    assert other.proc.wait(30) == 0
    assert time.monotonic() - sent_at < 3
    assert_gone(family)
    stream.join(10)
    assert not stream.is_alive()  # ended (its error event is sent if the loop gets to it)


def test_the_shutdown_timeout_aborts_what_is_left(tiny_model_dir: Path, tmp_path: Path) -> None:
    """One sequence at a time: of three long streams, the two waiting cannot even start within
    1 s once the first one runs."""
    other = start_server(
        tiny_server_args(tiny_model_dir, "--shutdown-timeout", "1", "--max-num-seqs", "1"),
        tmp_path / "server.log",
    )
    streams = [StreamInBackground(other, "/v1/completions", LONGEST) for _ in range(3)]
    deadline = time.monotonic() + 60
    # one streaming and the other two queued in the core: a request still on its way when SIGTERM
    # lands gets the draining server's 503 instead (seen on a loaded machine)
    while not (
        any(len(stream.payloads) >= 3 for stream in streams)
        and other.metric("pagedlm:num_requests_waiting") >= 2
    ):
        assert time.monotonic() < deadline, "no stream under way and two waiting in 60 s"
        time.sleep(0.01)
    other.proc.send_signal(signal.SIGTERM)
    sent_at = time.monotonic()
    assert other.proc.wait(30) == 0
    assert 1 <= time.monotonic() - sent_at < 8
    errors = [
        events[-1]["error"] for events in (s.result(10) for s in streams) if "error" in events[-1]
    ]
    assert len(errors) >= 2 and all("shutting down" in e["message"] for e in errors), errors
    assert "--shutdown-timeout passed: aborting the" in other.log()
