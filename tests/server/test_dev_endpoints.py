"""The memory-lifecycle and RL endpoints (pagedlm/server/dev_endpoints.py) over HTTP, through the
server's core process: sleep / wake_up (503 while asleep, /health 200, the sleep-state gauge, the
same text after wake), pause / resume with a stream in flight, reset_prefix_cache, collective_rpc,
SGLang's aliases; gated by --enable-dev-endpoints and the API key."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
from fastapi.testclient import TestClient
from server_helpers import (
    API_KEY,
    ServerProcess,
    StreamInBackground,
    start_server,
    tiny_server_args,
)

from pagedlm.server.api_server import build_app
from pagedlm.server.serving import ServingContext

pytestmark = pytest.mark.slow

GREEDY = {"prompt": "Once upon a time", "max_tokens": 24, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def server(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    log_path = tmp_path_factory.mktemp("dev_endpoints") / "server.log"
    args = ["--enable-dev-endpoints", "--enable-sleep-mode", "--api-key", API_KEY]
    server = start_server(tiny_server_args(tiny_model_dir, *args), log_path)
    yield server
    server.stop()


def post(server: ServerProcess, path: str, **kwargs: object) -> httpx.Response:
    return httpx.post(server.url(path), headers=server.auth, timeout=60, **kwargs)


def get(server: ServerProcess, path: str) -> dict:
    response = httpx.get(server.url(path), headers=server.auth, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()


def complete(server: ServerProcess) -> httpx.Response:
    return post(server, "/v1/completions", json=GREEDY)


def completion_text(server: ServerProcess) -> str:
    response = complete(server)
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["text"]


def test_sleep_and_wake_up(server: ServerProcess, tiny_model_dir: Path) -> None:
    before = completion_text(server)
    for level, state in ((1, "weights_offloaded"), (2, "discard_all")):
        answer = post(server, f"/sleep?level={level}")
        assert answer.json() == {"status": "sleeping", "level": level}
        assert get(server, "/is_sleeping") == {"is_sleeping": True}
        assert server.metric("pagedlm:engine_sleep_state", sleep_state=state) == 1
        assert server.metric("pagedlm:engine_sleep_state", sleep_state="awake") == 0
        refused = complete(server)
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "engine_sleeping"
        assert httpx.get(server.url("/health"), timeout=10).status_code == 200
        answer = post(server, "/wake_up?tags=weights")
        assert answer.json() == {"status": "sleeping", "tags": ["weights"]}
        if level == 2:
            rpc = {"method": "reload_weights", "kwargs": {"weights_path": str(tiny_model_dir)}}
            assert post(server, "/collective_rpc", json=rpc).status_code == 200
        assert post(server, "/wake_up?tags=kv_cache").json()["status"] == "awake"
        assert server.metric("pagedlm:engine_sleep_state", sleep_state="awake") == 1
        assert completion_text(server) == before
    bad = post(server, "/sleep?level=3")
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "level"


def test_pause_keep_freezes_a_stream_and_resume_finishes_it(server: ServerProcess) -> None:
    expected = completion_text(server)
    stream = StreamInBackground(server, "/v1/completions", GREEDY, server.auth)
    stream.wait_for_events(3)
    assert post(server, "/pause?mode=keep").json() == {"status": "paused", "mode": "keep"}
    assert get(server, "/is_paused") == {"is_paused": True}
    num_events = len(stream.payloads)
    time.sleep(0.5)
    assert len(stream.payloads) == num_events  # no step runs
    refused = complete(server)
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "engine_paused"
    assert post(server, "/resume").json() == {"status": "resumed"}
    text = "".join(event["choices"][0]["text"] for event in stream.result() if event["choices"])
    assert text == expected
    assert get(server, "/is_paused") == {"is_paused": False}


def test_pause_abort_ends_a_stream(server: ServerProcess) -> None:
    body = {**GREEDY, "max_tokens": 400}
    stream = StreamInBackground(server, "/v1/completions", body, server.auth)
    stream.wait_for_events(2)
    assert post(server, "/pause?mode=abort").status_code == 200
    events = stream.result()
    assert events[-1]["choices"][0]["finish_reason"] == "abort"
    assert post(server, "/resume").status_code == 200
    server.wait_for_idle()


def test_collective_rpc_and_reset_prefix_cache(server: ServerProcess) -> None:
    answer = post(server, "/collective_rpc", json={"method": "memory_footprint"})
    (footprint,) = answer.json()["results"]
    assert footprint["weights_bytes"] > 0 and footprint["kv_cache_bytes"] > 0
    unknown = post(server, "/collective_rpc", json={"method": "rm_rf"})
    assert unknown.status_code == 400 and unknown.json()["error"]["param"] == "method"
    extra = post(server, "/collective_rpc", json={"method": "memory_footprint", "x": 1})
    assert extra.status_code == 400
    completion_text(server)
    assert post(server, "/reset_prefix_cache").json() == {"success": True}
    assert completion_text(server)  # the engine still serves


def test_weight_version_routes(server: ServerProcess, tiny_model_dir: Path) -> None:
    before = completion_text(server)
    version = get(server, "/weight_info")["weight_version"]
    answer = post(server, "/update_weight_version", json={"new_version": "step-7"})
    assert answer.json() == {"weight_version": "step-7"}
    assert get(server, "/weight_info") == {"weight_version": "step-7"}
    early = post(server, "/start_weight_update")  # no transfer group: the caller's mistake
    assert early.status_code == 400 and "init_weight_transfer_engine" in early.text
    reload = post(server, "/update_weights_from_disk", json={"model_path": str(tiny_model_dir)})
    assert reload.json()["success"] and reload.json()["weight_version"] not in (version, "step-7")
    assert completion_text(server) == before  # the same checkpoint: the same text


def test_sglang_aliases(server: ServerProcess) -> None:
    before = completion_text(server)
    assert post(server, "/release_memory_occupation", json={}).json() == {"success": True}
    assert get(server, "/is_sleeping") == {"is_sleeping": True}
    assert post(server, "/resume_memory_occupation", json={"tags": None}).status_code == 200
    assert post(server, "/flush_cache").json() == {"success": True}
    assert post(server, "/pause_generation", json={"mode": "in_place"}).status_code == 200
    assert get(server, "/is_paused") == {"is_paused": True}
    assert post(server, "/continue_generation").status_code == 200
    assert completion_text(server) == before


def _app(dev_endpoints: bool) -> TestClient:
    engine = SimpleNamespace(llm_engine=SimpleNamespace(tokenizer=None), health_problem=None)
    return TestClient(build_app(ServingContext(engine, "m"), API_KEY, 1000, dev_endpoints))


def test_the_endpoints_need_the_flag_and_the_api_key() -> None:
    auth = {"Authorization": f"Bearer {API_KEY}"}
    off, on = _app(dev_endpoints=False), _app(dev_endpoints=True)
    for path in (
        "/sleep",
        "/wake_up",
        "/pause",
        "/resume",
        "/collective_rpc",
        "/flush_cache",
        "/update_weights",
    ):
        assert off.post(path, headers=auth).status_code == 404
        assert on.post(path).status_code == 401
    assert off.get("/is_sleeping", headers=auth).status_code == 404
    assert on.get("/is_paused").status_code == 401
