"""The server's data parallelism without core processes: RemoteCore's routing (fewest core
requests in flight, a request's samples together, aborts and stop-string finishes to the owner),
a utility's gathering over the cores, and the cores' stats summed into the metrics."""

from __future__ import annotations

import asyncio

import pytest

from pagedlm.config import EngineArgs
from pagedlm.core.sched_output import EngineCoreOutput
from pagedlm.engine import wire
from pagedlm.errors import InvalidRequest
from pagedlm.request import Request
from pagedlm.sampling_params import SamplingParams
from pagedlm.server.async_engine import AdmissionLimits, AsyncLLM
from pagedlm.server.metrics import ServerMetrics
from pagedlm.server.remote_core import RemoteCore


def _decoded(sent: list[bytes]) -> list[wire.ToCore]:
    decoder = wire.to_core_decoder()
    return [decoder.decode(data) for data in sent]


def _request(req_id: str) -> Request:
    return Request(req_id, [1, 2, 3], SamplingParams(), max_tokens=4)


def test_remote_core_routes_to_the_fewest_in_flight_and_aborts_to_the_owner() -> None:
    sent: tuple[list[bytes], list[bytes]] = ([], [])
    metrics = ServerMetrics("m", num_engines=2)
    core = RemoteCore([sent[0].append, sent[1].append], metrics)
    for req_id in "abc":
        core.add_request(_request(req_id))
    assert [[m.request_id for m in _decoded(s)] for s in sent] == [["a", "c"], ["b"]]
    core.on_outputs(
        wire.CoreOutputs([EngineCoreOutput("a", [9], finish_reason="length")], wire.CoreStats())
    )
    assert core.num_in_flight_per_rank == [1, 1]
    core.add_request(_request("d"))  # a tie: the first rank
    assert core.num_in_flight_per_rank == [2, 1] and core.num_in_flight == 3
    sent[0].clear(), sent[1].clear()
    core.abort_requests(["b", "d", "a"])  # a has finished: no rank hears of it
    core.finish_requests(["c"])
    assert _decoded(sent[0]) == [wire.AbortRequests(["d"]), wire.AbortRequests(["c"], stopped=True)]
    assert _decoded(sent[1]) == [wire.AbortRequests(["b"])]
    assert core.num_in_flight_per_rank == [0, 0]
    core.add_request(_request("e"))
    with core.one_rank():  # the samples of one request: where the fewest are (rank 1)
        for sample in ("f_0", "f_1", "f_2"):
            core.add_request(_request(sample))
    core.add_request(_request("g"))
    assert core.num_in_flight_per_rank == [2, 3]
    sent[0].clear(), sent[1].clear()
    core.send_to_all(wire.Shutdown())
    assert [_decoded(s) for s in sent][1][-1] == wire.Shutdown() == _decoded(sent[0])[-1]
    text = metrics.render().decode()
    assert 'pagedlm:engine_requests_routed_total{engine="0",model_name="m"} 5.0' in text
    assert 'pagedlm:engine_requests_routed_total{engine="1",model_name="m"} 4.0' in text


@pytest.fixture
def dp2_engine() -> AsyncLLM:
    """Never started: RemoteCore's sends go to lists (`engine.sent`)."""
    engine = AsyncLLM(EngineArgs(data_parallel_size=2), "m", AdmissionLimits())
    engine.sent = ([], [])
    engine.core = RemoteCore([engine.sent[0].append, engine.sent[1].append], engine.metrics)
    yield engine
    asyncio.run(engine.shutdown())


def _answer(engine: AsyncLLM, method: str, *args: object, replies: dict) -> object:
    """Calls the utility; each rank answers (in the order of `replies`: rank -> UtilityResult
    keyword arguments)."""

    async def run() -> object:
        call = asyncio.create_task(engine.call_utility(method, *args))
        await asyncio.sleep(0)
        for sent in engine.sent:
            (msg,) = [m for m in _decoded(sent) if isinstance(m, wire.UtilityCall)]
            assert msg.method == method
            sent.clear()
        for rank, reply in replies.items():
            engine._on_message(wire.UtilityResult(msg.call_id, **reply), rank)
        return await asyncio.wait_for(call, 1)

    return asyncio.run(run())


def test_a_utility_reaches_every_core_and_their_answers_are_gathered(dp2_engine: AsyncLLM) -> None:
    rpc = _answer(
        dp2_engine,
        "collective_rpc",
        "get_weight_version",
        replies={1: {"result": ["v1"]}, 0: {"result": ["v0"]}},
    )
    assert rpc == ["v0", "v1"]  # in dp-rank order, whichever answered first
    both = {0: {"result": True}, 1: {"result": True}}
    assert _answer(dp2_engine, "reset_prefix_cache", replies=both) is True
    one = {0: {"result": True}, 1: {"result": False}}
    assert _answer(dp2_engine, "reset_prefix_cache", replies=one) is False
    refused = {1: {"error": "no such method", "invalid": True, "param": "method"}}
    with pytest.raises(InvalidRequest, match="no such method"):
        _answer(dp2_engine, "collective_rpc", "rm_rf", replies=refused)


def test_the_cores_stats_are_summed(dp2_engine: AsyncLLM) -> None:
    for rank, (running, hits, usage) in enumerate(((2, 10, 0.5), (3, 5, 0.25))):
        stats = wire.CoreStats(num_running=running, prefix_cache_hits=hits, kv_cache_usage=usage)
        dp2_engine._on_stats(stats, rank)
    text = dp2_engine.metrics.render().decode()
    assert 'pagedlm:num_requests_running{model_name="m"} 5.0' in text
    assert 'pagedlm:prefix_cache_hits_total{model_name="m"} 15.0' in text
    assert 'pagedlm:kv_cache_usage_perc{model_name="m"} 0.375' in text
    later = wire.CoreStats(num_running=1, prefix_cache_hits=12, kv_cache_usage=0.5)
    dp2_engine._on_stats(later, 0)
    text = dp2_engine.metrics.render().decode()
    assert 'pagedlm:num_requests_running{model_name="m"} 4.0' in text
    assert 'pagedlm:prefix_cache_hits_total{model_name="m"} 17.0' in text
