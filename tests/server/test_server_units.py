"""The server's parts without a model: wire messages, the core loop (with a fake core over
in-process sockets), admission accounting, metrics, deltas of cumulative outputs, errors."""

from __future__ import annotations

import asyncio
import os
import threading
from dataclasses import dataclass

import pytest
import zmq

from pagedlm.core.sched_output import EngineCoreOutput, Logprobs
from pagedlm.engine import wire
from pagedlm.engine.core_process import CoreLoop
from pagedlm.errors import InvalidRequest
from pagedlm.outputs import CompletionOutput
from pagedlm.request import Request
from pagedlm.sampling_params import SamplingParams
from pagedlm.server import serving_chat
from pagedlm.server.api_server import parse_json, validation_api_error
from pagedlm.server.async_engine import (
    AdmissionLimits,
    AsyncLLM,
    EngineDeadError,
    Overloaded,
)
from pagedlm.server.metrics import ServerMetrics
from pagedlm.server.protocol import ChatMessage, CompletionRequest, TextPart
from pagedlm.server.remote_core import RemoteCore
from pagedlm.server.serving import APIError, DeltaTracker


def test_wire_round_trip_keeps_every_field() -> None:
    params = SamplingParams(
        temperature=0.5,
        stop=["\n\n", "END"],
        logit_bias={7: -3.0},
        seed=2**63 - 200,
        logprobs=2,
        max_tokens=9,
    )
    add = wire.AddRequest("r-0", [5, 6, 7], params, max_tokens=9, arrival_time=12.5, priority=-3)
    assert wire.to_core_decoder().decode(wire.encoder().encode(add)) == add
    out = wire.CoreOutputs(
        [
            EngineCoreOutput(
                "r-0",
                [8],
                [Logprobs([8, 3], [-0.5, -0.25], 2)],
                finish_reason="stop",
                stop_reason=2,
                num_cached_tokens=16,
            )
        ],
        wire.CoreStats(num_running=1, kv_cache_usage=0.25, prefix_cache_hits=16),
        first_scheduled={"r-0": 13.0},
        errors={"r-1": "bad"},
    )
    assert wire.from_core_decoder().decode(wire.encoder().encode(out)) == out


@dataclass
class _FakeRequest:
    request: Request
    num_out: int = 0


class FakeCore:
    """One token per step for every live request (token = its step count), until max_tokens."""

    def __init__(self) -> None:
        self.requests: dict[str, _FakeRequest] = {}
        self.aborted: list[str] = []
        self.finished_by_stop: list[str] = []

    def add_request(self, request: Request) -> None:
        if request.request_id in self.requests:
            raise ValueError(f"request_id {request.request_id!r} is already in use")
        request.first_scheduled_time = 100.0
        self.requests[request.request_id] = _FakeRequest(request)

    def abort_requests(self, ids: list[str]) -> list[EngineCoreOutput]:
        self.aborted += ids
        for req_id in ids:
            self.requests.pop(req_id)
        return []

    def finish_requests(self, ids: list[str]) -> None:
        self.finished_by_stop += ids
        for req_id in ids:
            self.requests.pop(req_id)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def has_work(self) -> bool:  # never paused or asleep
        return bool(self.requests)

    def step(self) -> list[EngineCoreOutput]:
        outputs = []
        for req_id, fake in list(self.requests.items()):
            fake.num_out += 1
            done = fake.num_out == fake.request.max_tokens
            outputs.append(
                EngineCoreOutput(req_id, [fake.num_out], finish_reason="length" if done else None)
            )
            if done:
                del self.requests[req_id]
        return outputs

    def get_stats(self) -> wire.CoreStats:
        return wire.CoreStats(num_running=len(self.requests))


def _add(request_id: str, max_tokens: int) -> bytes:
    return wire.encoder().encode(
        wire.AddRequest(request_id, [1, 2, 3], SamplingParams(), max_tokens, arrival_time=99.0)
    )


def test_core_loop_steps_reports_and_stops() -> None:
    ctx = zmq.Context()
    to_core, core_in = ctx.socket(zmq.PUSH), ctx.socket(zmq.PULL)
    core_out, from_core = ctx.socket(zmq.PUSH), ctx.socket(zmq.PULL)
    to_core.bind("inproc://in")
    core_in.connect("inproc://in")
    from_core.bind("inproc://out")
    core_out.connect("inproc://out")
    core = FakeCore()
    loop = CoreLoop(core, (2,), core_in, core_out, parent_pid=os.getppid())
    thread = threading.Thread(target=loop.run)
    thread.start()
    decoder = wire.from_core_decoder()
    try:
        to_core.send(_add("a", max_tokens=3))
        messages = [decoder.decode(from_core.recv()) for _ in range(3)]
        assert [[o.new_token_ids for o in m.outputs] for m in messages] == [[[1]], [[2]], [[3]]]
        assert messages[0].first_scheduled == {"a": 100.0}
        assert messages[-1].outputs[0].finish_reason == "length"
        assert messages[-1].stats.num_running == 0
        to_core.send(_add("b", max_tokens=1000))
        decoder.decode(from_core.recv())
        to_core.send(wire.encoder().encode(wire.AbortRequests(["b"])))
        while core.requests:  # the loop keeps stepping until the abort lands
            decoder.decode(from_core.recv())
        assert core.aborted == ["b"]
        # an id may come back once it has finished, but not while it is live: the first "a" does not
        # finish within the test, so the second always finds it live (with max_tokens=2 the loop could
        # finish it before the second add arrived, and the recv below waited forever: seen in CI)
        to_core.send(_add("a", max_tokens=10**9))
        to_core.send(_add("a", max_tokens=2))
        errors = {}
        while not errors:
            errors = decoder.decode(from_core.recv()).errors
        assert "already in use" in errors["a"]
        to_core.send(wire.encoder().encode(wire.AbortRequests(["a"])))
        while (
            core.requests
        ):  # read on until the abort lands: a full output queue would block the loop
            decoder.decode(from_core.recv())
    finally:
        to_core.send(wire.encoder().encode(wire.Shutdown()))
        thread.join(10)
    assert not thread.is_alive()
    for sock in (to_core, core_in, core_out, from_core):
        sock.close(linger=0)
    ctx.term()


def test_remote_core_accounting_and_metrics() -> None:
    sent: list[bytes] = []
    metrics = ServerMetrics("m")
    core = RemoteCore([sent.append], metrics)
    for req_id, num_prompt in (("a", 3), ("b", 5), ("c", 7)):
        core.add_request(
            Request(
                req_id, list(range(num_prompt)), SamplingParams(), max_tokens=4, arrival_time=10.0
            )
        )
    assert (core.num_in_flight, core.num_prefill_tokens) == (3, 15)
    assert [wire.to_core_decoder().decode(m).request_id for m in sent] == ["a", "b", "c"]
    core.on_outputs(
        wire.CoreOutputs(
            [EngineCoreOutput("a", [9])], wire.CoreStats(), first_scheduled={"a": 10.5}
        )
    )
    assert (core.num_in_flight, core.num_prefill_tokens) == (3, 12)  # a left prefill
    core.on_outputs(
        wire.CoreOutputs([EngineCoreOutput("a", [9, 9], finish_reason="length")], wire.CoreStats())
    )
    core.abort_requests(["b"])
    core.finish_requests(["c"])
    assert (core.num_in_flight, core.num_prefill_tokens) == (0, 0)
    last = wire.to_core_decoder().decode(sent[-1])
    assert isinstance(last, wire.AbortRequests) and last.request_ids == ["c"] and last.stopped
    metrics.update_core_stats(
        wire.CoreStats(
            num_kernel_compiles=2,
            num_grammar_compiles=3,
            grammar_compile_seconds=0.5,
            num_grammar_compile_waits=1,
        )
    )
    text = metrics.render().decode()
    assert 'pagedlm:kernel_compiles_while_serving_total{model_name="m"} 2.0' in text
    assert 'pagedlm:grammar_compiles_total{model_name="m"} 3.0' in text
    assert 'pagedlm:grammar_compile_seconds_total{model_name="m"} 0.5' in text
    assert 'pagedlm:grammar_compile_waits_total{model_name="m"} 1.0' in text
    for reason in ("length", "abort", "stop"):
        assert (
            f'pagedlm:request_success_total{{finished_reason="{reason}",model_name="m"}} 1.0'
            in text
        )
    assert 'pagedlm:generation_tokens_total{model_name="m"} 3.0' in text
    assert 'pagedlm:request_queue_time_seconds_count{model_name="m"} 1.0' in text
    assert 'pagedlm:time_to_first_token_seconds_count{model_name="m"} 1.0' in text


def test_admission_caps_requests_and_prefill_tokens() -> None:
    engine = AsyncLLM(
        config=None,
        model_name="m",
        limits=AdmissionLimits(max_num_queued_reqs=3, max_num_queued_tokens=10),
    )
    engine.core = RemoteCore([[].append], engine.metrics)  # never started: no core process
    try:
        engine.admit(num_requests=2, num_prompt_tokens=8)
        for req_id in ("a", "b"):
            engine.core.add_request(Request(req_id, [1] * 4, SamplingParams(), max_tokens=2))
        with pytest.raises(Overloaded, match="8 in use \\+ 4 requested > max_num_queued_tokens=10"):
            engine.admit(num_requests=1, num_prompt_tokens=4)
        with pytest.raises(Overloaded, match="max_num_queued_reqs=3"):
            engine.admit(num_requests=2, num_prompt_tokens=1)
        with pytest.raises(ValueError, match="needs 4 of max_num_queued_reqs=3 on its own"):
            engine.admit(num_requests=4, num_prompt_tokens=1)
        engine.admit(num_requests=1, num_prompt_tokens=2)
        text = engine.metrics.render().decode()
        for reason in ("max_num_queued_reqs", "max_num_queued_tokens"):
            assert (
                f'pagedlm:num_requests_rejected_total{{model_name="m",reason="{reason}"}} 1.0'
                in text
            )
    finally:
        asyncio.run(engine.shutdown())


def test_a_failure_on_the_outputs_marks_the_engine_dead_and_fails_its_requests() -> None:
    """An exception while the server processes the core's outputs (a detokenizer bug, say) must not
    leave every request waiting forever while /health answers 200."""
    engine = AsyncLLM(config=None, model_name="m", limits=AdmissionLimits())
    try:
        queue = engine._queues["r"] = asyncio.Queue()

        def broken(msg: wire.CoreOutputs, rank: int) -> None:
            raise RuntimeError("boom")

        engine._on_outputs = broken
        engine._on_message(wire.CoreOutputs(outputs=[], stats=wire.CoreStats()))
        assert engine.health_problem is not None
        error = queue.get_nowait()
        assert isinstance(error, EngineDeadError) and "RuntimeError: boom" in str(error)
    finally:
        asyncio.run(engine.shutdown())


def test_delta_tracker_hands_out_only_what_is_new() -> None:
    tracker = DeltaTracker()
    first = tracker.delta(0, CompletionOutput(0, "Hel", [1]))
    assert (first.text, first.token_start, first.token_end, first.first) == ("Hel", 0, 1, True)
    assert tracker.delta(0, CompletionOutput(0, "Hel", [1])) is None
    held = tracker.delta(0, CompletionOutput(0, "Hel", [1, 2]))  # a token, no text yet
    assert (held.text, held.token_start, held.token_end, held.first) == ("", 1, 2, False)
    last = tracker.delta(0, CompletionOutput(0, "Hello", [1, 2, 3], finish_reason="stop"))
    assert (last.text, last.char_start, last.finish_reason) == ("lo", 3, "stop")
    assert tracker.delta(0, CompletionOutput(0, "Hello", [1, 2, 3], finish_reason="stop")) is None
    assert tracker.delta(1, CompletionOutput(1, "x", [4])).first


def test_validation_errors_name_the_parameter() -> None:
    extra = validation_api_error(
        [{"type": "extra_forbidden", "loc": ("best_of",), "msg": "Extra inputs are not permitted"}]
    )
    assert (extra.status, extra.param) == (400, "best_of")
    assert extra.message == "best_of: unrecognized or unsupported parameter"
    nested = validation_api_error(
        [{"type": "literal_error", "loc": ("messages", 0, "role"), "msg": "Input should be 'user'"}]
    )
    assert (nested.param, nested.message) == ("messages", "messages.0.role: Input should be 'user'")
    # an unknown key holding a lone surrogate: the message must still encode as UTF-8
    odd = validation_api_error([{"type": "extra_forbidden", "loc": ("x\ud800",), "msg": "Extra"}])
    assert odd.message == "x\\ud800: unrecognized or unsupported parameter"
    odd.message.encode("utf-8")


@pytest.mark.parametrize(
    "data, fragment",
    [
        (b"{not json", "not valid JSON: Expecting property name"),
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
        (b'{"prompt": "\xff"}', "not valid JSON"),  # not UTF-8
        (b"[]", "valid dictionary"),
    ],
)
def test_a_body_that_is_no_json_object_is_a_400(data: bytes, fragment: str) -> None:
    with pytest.raises(APIError) as caught:
        parse_json(CompletionRequest, data)
    assert caught.value.status == 400 and fragment in caught.value.message


def test_request_to_sampling_params() -> None:
    body = CompletionRequest(prompt="x", top_k=50_000, logit_bias={"7": 2.5}, stop="END")
    params = body.to_sampling_params(max_tokens=16, logprobs=None, vocab_size=49152)
    assert (params.top_k, params.temperature, params.top_p) == (0, 1.0, 1.0)  # k >= vocab: off
    assert params.logit_bias == {7: 2.5} and params.stop == ["END"]
    with pytest.raises(InvalidRequest, match="logit_bias keys must be token ids") as caught:
        CompletionRequest(prompt="x", logit_bias={"a": 1}).to_sampling_params(16, None, 100)
    assert caught.value.param == "logit_bias"
    with pytest.raises(InvalidRequest, match=r"logit_bias values must be in \[-100, 100\]"):
        CompletionRequest(prompt="x", logit_bias={"1": 101}).to_sampling_params(16, None, 100)


def test_developer_messages_render_as_system_and_text_parts_join_by_newline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """OpenAI's developer role reaches the template as system (templates do not know it); a list of
    text parts is one text, joined by newlines as vLLM joins them."""
    seen = {}

    def fake_template(tokenizer: object, conversation: list[dict], tools: object = None) -> str:
        seen["conversation"] = conversation
        return "text"

    monkeypatch.setattr(serving_chat, "render_chat_template", fake_template)
    parts = [TextPart(type="text", text="a"), TextPart(type="text", text="b")]
    messages = [
        ChatMessage(role="developer", content=parts),
        ChatMessage(role="user", content="hi"),
    ]
    serving_chat.render_chat(object(), messages)
    assert seen["conversation"] == [
        {"role": "system", "content": "a\nb"},
        {"role": "user", "content": "hi"},
    ]


def test_core_reports_bad_engine_arguments_as_invalid(tiny_model_dir) -> None:
    """The core builds its own config from the arguments; a bad one is InvalidEngineArgs, which it
    reports without a log of its own (the front end reports the same error from its own build)."""
    from pagedlm.config import EngineArgs
    from pagedlm.engine.core_process import InvalidEngineArgs, build_core

    with pytest.raises(InvalidEngineArgs, match="attention_backend"):
        build_core(EngineArgs(model=str(tiny_model_dir), attention_backend="bogus", device="cpu"))


def test_front_end_refuses_a_core_with_another_config(tiny_model_dir) -> None:
    from pagedlm.config import EngineArgs
    from pagedlm.server.async_engine import check_same_config

    config = EngineArgs(
        model=str(tiny_model_dir), device="cpu", max_model_len=64
    ).create_engine_config()
    check_same_config(wire.Ready.of(config), config)  # the same: accepted
    other = wire.Ready.of(config)
    other.max_model_len = 32
    with pytest.raises(RuntimeError, match="config differs"):
        check_same_config(other, config)
    assert wire.from_core_decoder().decode(
        wire.encoder().encode(wire.Ready.of(config))
    ) == wire.Ready.of(config)
