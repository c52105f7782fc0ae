"""The front end's watch over the engine core, without a core process: the heartbeat's sockets,
the stalled / dead decisions, what a dead core leaves in the metrics, the drain, the access-log
filter."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

from pagedlm.engine import wire
from pagedlm.engine.heartbeat import (
    HEARTBEAT_INTERVAL_S,
    HeartbeatMonitor,
    HeartbeatSender,
    HeartbeatTimeouts,
)
from pagedlm.server.async_engine import (
    AdmissionLimits,
    AsyncLLM,
    EngineDeadError,
    Overloaded,
)
from pagedlm.server.launch import _HidePolls

TIMEOUTS = HeartbeatTimeouts(unhealthy_s=5, dead_s=30)


@pytest.fixture
def engine() -> Iterator[AsyncLLM]:
    engine = AsyncLLM(config=None, model_name="m", limits=AdmissionLimits(), heartbeat=TIMEOUTS)
    yield engine
    asyncio.run(engine.shutdown())


def test_the_monitor_sees_beats_and_their_absence(tmp_path: Path) -> None:
    ctx = zmq.Context()
    addr = f"ipc://{tmp_path}/heartbeat"
    monitor = HeartbeatMonitor(ctx, addr)
    sender = HeartbeatSender(ctx, addr)
    try:
        sender.start()
        time.sleep(3 * HEARTBEAT_INTERVAL_S)
        assert monitor.silent_s() < 2 * HEARTBEAT_INTERVAL_S
        sender.stop()
        time.sleep(3 * HEARTBEAT_INTERVAL_S)
        assert monitor.silent_s() > 2 * HEARTBEAT_INTERVAL_S
    finally:
        sender.stop()
        monitor.close()
        ctx.term()


@pytest.mark.parametrize(
    ("unhealthy_s", "dead_s", "message"),
    [
        (0.5, 30, "--heartbeat-timeout must be at least 1 s"),
        (5, 4, "--stall-timeout must be at least --heartbeat-timeout (5 s), got 4"),
    ],
)
def test_timeouts_are_checked(unhealthy_s: float, dead_s: float, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        HeartbeatTimeouts(unhealthy_s, dead_s)


def test_a_silent_core_is_stalled_then_healthy_again(engine: AsyncLLM) -> None:
    engine._check_heartbeat(TIMEOUTS.unhealthy_s + 0.1)
    assert engine.health_problem == "the engine core has sent no heartbeat for 5.1 s"
    with pytest.raises(Overloaded, match="no heartbeat for 5.1 s; retry later"):
        engine.admit(1, 1)
    engine._check_heartbeat(0.2)
    assert engine.health_problem is None
    engine.admit(1, 1)


def test_a_core_silent_past_the_stall_timeout_is_dead(engine: AsyncLLM) -> None:
    queue = engine._queues["r"] = asyncio.Queue()
    engine._check_heartbeat(TIMEOUTS.dead_s)
    assert "no heartbeat for 30.0 s" in engine.health_problem
    error = queue.get_nowait()
    assert isinstance(error, EngineDeadError) and "stopped or hung" in str(error)
    with pytest.raises(EngineDeadError):
        engine.admit(1, 1)
    assert asyncio.run(engine.wait_until_dead()) == engine.dead_error


def test_a_dead_core_leaves_no_running_requests_or_kv_in_the_metrics(engine: AsyncLLM) -> None:
    engine._on_message(
        wire.CoreOutputs(
            outputs=[],
            stats=wire.CoreStats(
                num_running=40, num_waiting=3, kv_cache_usage=0.75, prefix_cache_queries=8
            ),
        )
    )
    engine._on_message(wire.Dead(error="Traceback ...\nRuntimeError: boom"))
    late = wire.CoreOutputs(outputs=[], stats=wire.CoreStats(num_running=40))
    engine._on_message(late)  # sent before it died: no longer news
    text = engine.metrics.render().decode()
    for gauge in ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc"):
        assert f'pagedlm:{gauge}{{model_name="m"}} 0.0' in text
    assert 'pagedlm:prefix_cache_queries_total{model_name="m"} 8.0' in text  # what it did stays


def test_drain_waits_for_the_requests_in_flight(engine: AsyncLLM) -> None:
    async def scenario() -> tuple[bool, bool]:
        engine._queues["r"] = asyncio.Queue()
        engine._num_samples["r"] = 1
        engine.stop_accepting()
        timed_out = await engine.drain(0.2)
        asyncio.get_running_loop().call_later(0.2, engine._queues.pop, "r")
        drained = await engine.drain(5)
        return timed_out, drained

    assert asyncio.run(scenario()) == (False, True)
    assert engine.health_problem == "the server is shutting down"
    with pytest.raises(Overloaded, match="shutting down"):
        engine.admit(1, 1)


@pytest.mark.parametrize(
    ("path", "level", "shown"),
    [
        ("/health", logging.INFO, False),
        ("/metrics?x=1", logging.INFO, False),
        ("/v1/completions", logging.INFO, True),
        ("/health", logging.DEBUG, True),
    ],
)
def test_polls_are_left_out_of_the_access_log_at_info(path: str, level: int, shown: bool) -> None:
    access = logging.getLogger("test.access")
    access.setLevel(level)
    record = access.makeRecord(
        "test.access",
        logging.INFO,
        __file__,
        1,
        '%s - "%s %s HTTP/%s" %d',
        ("127.0.0.1:1", "GET", path, "1.1", 200),
        None,
    )
    assert _HidePolls(access).filter(record) is shown
