"""The output path at saturation, without a model: stream chunks serialised once (the same JSON
as the pydantic chunk models), a lagging stream's outputs coalesced, several steps' messages taken
as one batch with the event loop free between batches, start-up's objects out of the GC's way."""

from __future__ import annotations

import asyncio
import gc
import json

import pytest
import zmq

from pagedlm.core.sched_output import EngineCoreOutput
from pagedlm.engine import wire
from pagedlm.engine.output_processor import OutputProcessor
from pagedlm.outputs import RequestOutput
from pagedlm.sampling_params import SamplingParams
from pagedlm.server import async_engine
from pagedlm.server.async_engine import AdmissionLimits, AsyncLLM
from pagedlm.server.launch import freeze_start_up_objects
from pagedlm.server.protocol import (
    ChatChoiceLogprobs,
    ChatCompletionChunk,
    ChatLogprob,
    ChatStreamChoice,
    CompletionChoice,
    CompletionLogprobs,
    CompletionResponse,
    DeltaMessage,
    PromptTokensDetails,
    ResponseMetrics,
    TopLogprob,
    UsageInfo,
)
from pagedlm.server.protocol_tools import DeltaFunctionCall, DeltaToolCall
from pagedlm.server.serving import _coalesced
from pagedlm.server.stream_chunks import ChunkStream, chat_choice, chat_delta, completion_choice

USAGE = UsageInfo(
    prompt_tokens=5,
    completion_tokens=3,
    total_tokens=8,
    prompt_tokens_details=PromptTokensDetails(cached_tokens=2),
)
LOGPROBS = CompletionLogprobs(
    tokens=[" é", "✓"],
    token_logprobs=[-0.123456789, float("-inf")],
    top_logprobs=[{" é": -0.123456789, "x": -2.5}, {"✓": -1e-7}],
    text_offset=[3, 5],
)


@pytest.mark.parametrize(
    "text, logprobs, finish_reason, stop_reason, usage",
    [
        (' héllo "✓"\n\\', None, None, None, None),
        ("", LOGPROBS, "stop", "END", USAGE),
        ("x", None, "length", 7, None),
    ],
)
def test_completion_chunks_are_the_pydantic_models_json(
    text: str,
    logprobs: CompletionLogprobs | None,
    finish_reason: str | None,
    stop_reason: int | str | None,
    usage: UsageInfo | None,
) -> None:
    choice = dict(
        index=3, text=text, logprobs=logprobs, finish_reason=finish_reason, stop_reason=stop_reason
    )
    expected = CompletionResponse(
        id="cmpl-1", model="m/ü", choices=[CompletionChoice(**choice)], usage=usage, created=17
    )
    chunks = ChunkStream("cmpl-1", "text_completion", 17, "m/ü")
    assert chunks.event([completion_choice(**choice)], usage) == _sse(expected)


CHAT_LOGPROBS = ChatChoiceLogprobs(
    content=[
        ChatLogprob(
            token="é",
            logprob=-0.5,
            bytes=[195, 169],
            top_logprobs=[TopLogprob(token="é", logprob=-0.5, bytes=[195, 169])],
        )
    ]
)
CALLS = [
    DeltaToolCall(
        index=0, id="call_1", type="function", function=DeltaFunctionCall(name="f", arguments="{")
    ),
    DeltaToolCall(index=1, function=DeltaFunctionCall(arguments='"a": 1}')),
]


@pytest.mark.parametrize(
    "delta, logprobs, finish_reason, stop_reason",
    [
        (dict(role="assistant", content=""), None, None, None),
        (dict(content="¿qué?"), CHAT_LOGPROBS, None, None),
        (dict(reasoning_content="hmm"), None, None, None),
        (dict(content="4", reasoning_content="so"), None, None, None),
        (dict(tool_calls=CALLS), None, "tool_calls", None),
        ({}, None, "stop", 2),  # the last chunk may bring nothing but its end
    ],
)
def test_chat_chunks_are_the_pydantic_models_json(
    delta: dict, logprobs: ChatChoiceLogprobs | None, finish_reason: str | None, stop_reason: int
) -> None:
    expected = ChatCompletionChunk(
        id="chatcmpl-1",
        model="m",
        created=5,
        choices=[
            ChatStreamChoice(
                index=1,
                delta=DeltaMessage(**delta),
                logprobs=logprobs,
                finish_reason=finish_reason,
                stop_reason=stop_reason,
            )
        ],
    )
    chunks = ChunkStream("chatcmpl-1", "chat.completion.chunk", 5, "m")
    event = chunks.event(
        [chat_choice(1, chat_delta(**delta), logprobs, finish_reason, stop_reason)]
    )
    assert event == _sse(expected)


def test_a_usage_chunk_has_no_choices() -> None:
    expected = ChatCompletionChunk(id="c", model="m", created=5, choices=[], usage=USAGE)
    assert ChunkStream("c", "chat.completion.chunk", 5, "m").event([], USAGE) == _sse(expected)


def test_the_last_chunk_carries_metrics_where_set() -> None:
    metrics = ResponseMetrics(speculative_decoding={"num_drafts": 3, "acceptance_rate": 0.5})
    expected = CompletionResponse(id="c", model="m", created=5, choices=[], usage=USAGE)
    expected.metrics = metrics
    event = ChunkStream("c", "text_completion", 5, "m").event([], USAGE, metrics)
    assert event.startswith("data: ") and event.endswith("\n\n")
    assert json.loads(event[len("data: ") :]) == json.loads(expected.model_dump_json())


def _sse(model: CompletionResponse | ChatCompletionChunk) -> str:
    return f"data: {model.model_dump_json()}\n\n"


def _output(request_id: str) -> RequestOutput:
    return RequestOutput(request_id, None, [1], [], finished=False)


def test_a_lagging_streams_outputs_are_coalesced_to_the_newest() -> None:
    """Outputs are cumulative: of each prompt's queued outputs only the newest is sent; its end
    (None) and errors stay, in order."""
    a1, a2, a3, b1 = (_output(name) for name in ("a1", "a2", "a3", "b1"))
    error = ValueError("boom")
    queue: asyncio.Queue = asyncio.Queue()
    for item in [(1, b1), (0, a2), (0, a3), (0, None), (1, error)]:
        queue.put_nowait(item)
    assert _coalesced((0, a1), queue) == [(0, a3), (1, b1), (0, None), (1, error)]
    assert queue.empty()
    assert _coalesced((0, a1), queue) == [(0, a1)]


def test_several_steps_join_into_one_message() -> None:
    def step(num: int, first_scheduled: dict, errors: dict) -> wire.CoreOutputs:
        return wire.CoreOutputs(
            outputs=[EngineCoreOutput("r", [num])],
            stats=wire.CoreStats(num_running=num),
            first_scheduled=first_scheduled,
            errors=errors,
        )

    joined = wire.join_outputs([step(1, {"r": 1.0}, {}), step(2, {}, {"q": "bad"})])
    assert [out.new_token_ids for out in joined.outputs] == [[1], [2]]
    assert joined.stats.num_running == 2  # the last step's
    assert (joined.first_scheduled, joined.errors) == ({"r": 1.0}, {"q": "bad"})


def test_joined_steps_give_one_output_per_request_with_every_token() -> None:
    processor = OutputProcessor(tokenizer=None)
    processor.add_request("a", None, [1, 2], SamplingParams(max_tokens=3), 0.0, [1, 2])
    processor.add_request("b", None, [1, 2], SamplingParams(max_tokens=3), 0.0, [1, 2])
    steps = [
        EngineCoreOutput("a", [5]),
        EngineCoreOutput("b", [7]),
        EngineCoreOutput("a", [6]),
        EngineCoreOutput("a", [8], finish_reason="length"),
        EngineCoreOutput("b", [9]),
    ]
    outputs = processor.process_outputs(steps).request_outputs
    assert [(o.request_id, o.outputs[0].token_ids, o.finished) for o in outputs] == [
        ("a", [5, 6, 8], True),
        ("b", [7, 9], False),
    ]


def test_the_output_loop_takes_bounded_batches_and_lets_streams_run_between(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Messages already there are taken at once, at most _MAX_MESSAGES_PER_BATCH; the event loop
    runs other tasks (the streams) before the next batch, and a utility result keeps its place
    after the outputs sent before it."""
    monkeypatch.setattr(async_engine, "_MAX_MESSAGES_PER_BATCH", 4)
    engine = AsyncLLM(config=None, model_name="m", limits=AdmissionLimits())
    seen: list[object] = []  # what _on_message got, and "stream" each time another task ran
    monkeypatch.setattr(engine, "_on_message", lambda msg, rank: seen.append(msg))
    step = wire.CoreOutputs(outputs=[EngineCoreOutput("r", [1])], stats=wire.CoreStats())
    messages = [step, step, wire.UtilityResult(call_id=3), step, step, step, step, step]

    async def run() -> None:
        push = zmq.Context.instance().socket(zmq.PUSH)
        push.connect(engine._cores[0].addresses.output)
        encoder = wire.encoder()
        for msg in messages:
            push.send(encoder.encode(msg))
        await asyncio.sleep(0.3)  # every message is in the socket by then
        loop = asyncio.create_task(engine._output_loop(engine._cores[0]))
        for _ in range(6):
            seen.append("stream")
            await asyncio.sleep(0)
        loop.cancel()
        push.close(linger=0)

    try:
        asyncio.run(run())
    finally:
        asyncio.run(engine.shutdown())
    batches = [
        "stream"
        if m == "stream"
        else ("utility" if isinstance(m, wire.UtilityResult) else len(m.outputs))
        for m in seen
    ]
    while batches[-1] == "stream":
        batches.pop()
    # 4 messages (2 steps, the utility, 1 step), then the other 4 steps
    assert [b for b in batches if b != "stream"] == [2, "utility", 1, 4]
    assert batches.index(4) > batches.index(1) + 1  # another task ran between the two batches


def test_start_up_objects_are_frozen_out_of_collections() -> None:
    try:
        freeze_start_up_objects()
        assert gc.get_freeze_count() > 1000  # this test process's modules, at least
    finally:
        gc.unfreeze()
