"""The OpenAI-compatible server against OpenAI's API and vLLM, on one tiny-model server (an API
key, the default body limit, max_model_len 512). The tests marked "bug"
failed on the code they were written against; the others cover paths no other test reaches
(each names the source mutation that makes it fail)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from server_helpers import API_KEY, ServerProcess, start_server, tiny_server_args

pytestmark = pytest.mark.slow

AUTH = {"Authorization": f"Bearer {API_KEY}"}
CHAT = [{"role": "user", "content": "Hi"}]
NEVER = "z" * 30  # a stop string the tiny model never writes: streamed text stays 29 chars behind
LONG = {"max_tokens": 400, "ignore_eos": True, "temperature": 0}  # ~2 s on a 2-core CPU


@pytest.fixture(scope="module")
def server(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    log_path = tmp_path_factory.mktemp("robustness") / "server.log"
    server = start_server(tiny_server_args(tiny_model_dir, "--api-key", API_KEY), log_path)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url("/v1"), api_key=API_KEY, timeout=120)


@pytest.fixture(scope="module")
def model(client: openai.OpenAI) -> str:
    return client.models.list().data[0].id


def sse_events(server: ServerProcess, path: str, body: dict) -> list[dict]:
    """The JSON events of a stream, after checking it ends with [DONE]."""
    with httpx.stream(
        "POST", server.url(path), json={**body, "stream": True}, headers=AUTH, timeout=120
    ) as response:
        assert response.status_code == 200, response.read()
        lines = [line for line in response.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    return [json.loads(line[len("data: ") :]) for line in lines[:-1]]


def metric_samples(server: ServerProcess) -> dict[str, Metric]:
    """/metrics through prometheus_client's own parser: family name -> family."""
    text = httpx.get(server.url("/metrics"), headers=AUTH, timeout=10).text
    return {family.name: family for family in text_string_to_metric_families(text)}


def metric_value(families: dict[str, Metric], family: str, sample: str, **labels: str) -> float:
    return sum(
        s.value
        for s in families[family].samples
        if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items())
    )


# ---- bugs ------------------------------------------------------------------------------


def test_huge_prompt_does_not_stall_streams_in_flight(server: ServerProcess) -> None:
    """Bug: a text prompt is tokenised on the event loop (serving.process_prompt), so one
    oversized prompt -- 3 MB, under the default 4 MiB body limit, refused anyway as too
    long -- freezes every stream in flight for as long as tokenisation takes (~2-3 s here)."""
    arrivals: list[float] = []

    def read_stream() -> None:
        body = {"prompt": "Hi", **LONG, "stream": True}
        with httpx.stream(
            "POST", server.url("/v1/completions"), json=body, headers=AUTH, timeout=120
        ) as response:
            for line in response.iter_lines():
                if line.startswith("data: {"):
                    arrivals.append(time.monotonic())

    reader = threading.Thread(target=read_stream)
    reader.start()
    while len(arrivals) < 10:  # the stream is under way
        assert reader.is_alive(), "the stream ended before it began"
        time.sleep(0.01)
    huge = json.dumps({"prompt": "hello world " * 250_000, "max_tokens": 1}).encode()
    sent_at = time.monotonic()
    response = httpx.post(
        server.url("/v1/completions"),
        content=huge,
        timeout=120,
        headers={**AUTH, "Content-Type": "application/json"},
    )
    reader.join(120)
    assert (
        response.status_code == 400
        and response.json()["error"]["code"] == "context_length_exceeded"
    )
    assert arrivals[-1] - sent_at > 0.5, "the stream ended before the huge prompt arrived"
    max_gap = max(b - a for a, b in zip(arrivals, arrivals[1:]))
    assert max_gap < 0.75, f"a stream in flight stalled {max_gap:.2f} s behind one bad request"


def test_chat_stream_sends_every_token_logprob(client: openai.OpenAI, model: str) -> None:
    """Bug: a chat stream sends a token's logprob only in a chunk with text or a finish
    (serving_chat._ChatWriter._stream_choices) while the DeltaTracker has already counted the
    token as sent: tokens whose text is held back (stop strings, an incomplete UTF-8
    character) lose their logprobs. Here 1 of 8 arrived."""
    params = dict(
        model=model,
        messages=CHAT,
        max_tokens=8,
        temperature=0,
        stop=[NEVER],
        logprobs=True,
        top_logprobs=1,
    )
    whole = client.chat.completions.create(**params)
    chunks = list(client.chat.completions.create(**params, stream=True))
    streamed = [
        entry
        for c in chunks
        if c.choices and c.choices[0].logprobs
        for entry in c.choices[0].logprobs.content
    ]
    assert whole.usage.completion_tokens == 8
    assert [(e.token, e.logprob) for e in streamed] == [
        (e.token, e.logprob) for e in whole.choices[0].logprobs.content
    ]


def test_completion_stream_text_offset_equals_whole(client: openai.OpenAI, model: str) -> None:
    """Bug: a streamed chunk's text_offset starts at where the chunk's *text* starts
    (serving_completion._CompletionWriter._choice: `delta.char_start`), but its tokens are not
    that text when text is held back for a stop string: offsets came out [0, 0, 0, 0, 0, 1, 7,
    13] instead of [0, 6, 12, ...]."""
    params = dict(
        model=model, prompt="Hello there", max_tokens=8, temperature=0, stop=[NEVER], logprobs=1
    )
    whole = client.completions.create(**params).choices[0].logprobs
    chunks = list(client.completions.create(**params, stream=True))
    offsets = [o for c in chunks if c.choices for o in c.choices[0].logprobs.text_offset]
    tokens = [t for c in chunks if c.choices for t in c.choices[0].logprobs.tokens]
    assert tokens == whole.tokens
    assert whole.text_offset == [sum(map(len, whole.tokens[:i])) for i in range(len(whole.tokens))]
    assert offsets == whole.text_offset


def test_non_ascii_authorization_is_401(server: ServerProcess) -> None:
    """Bug: GuardMiddleware._check compares str with hmac.compare_digest, which raises
    TypeError for non-ASCII text: any client sending a non-ASCII Authorization header gets a
    plain 500 (and a traceback in the log) instead of OpenAI's 401."""
    for value in ("Bearer cl\u00e9".encode("latin-1"), "Bearer \u00e9".encode()):
        response = httpx.get(server.url("/v1/models"), headers={"Authorization": value})
        assert response.status_code == 401, response.text
        assert response.json()["error"]["type"] == "authentication_error"


def test_chat_logprob_bytes_are_the_token_bytes(
    client: openai.OpenAI, model: str, server: ServerProcess
) -> None:
    """Bug: `bytes` is the UTF-8 of the token's decoded text (serving_chat._top), so a token
    that holds part of a character reports U+FFFD's bytes [239, 191, 189] instead of its own.
    OpenAI's `bytes` exists for exactly these tokens (to rebuild characters split over tokens).
    Token 173 of SmolLM2's byte-level vocabulary is the lone byte 0xE2 (a 3-byte lead)."""
    detokenized = httpx.post(
        server.url("/detokenize"), json={"tokens": [173]}, headers=AUTH
    ).json()["prompt"]
    assert detokenized == "\ufffd"  # on its own, an incomplete character
    result = client.chat.completions.create(
        model=model, messages=CHAT, max_tokens=1, logprobs=True, logit_bias={"173": 100}
    )
    assert result.choices[0].logprobs.content[0].bytes == [0xE2]


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_stream_chunks_share_created(server: ServerProcess, path: str) -> None:
    """Bug: every chunk takes `created` from the clock when it is built (protocol.py's
    default_factory), so a stream longer than a second changes it mid-stream; OpenAI: "Each
    chunk has the same timestamp" (vLLM stamps the stream once)."""
    body = {"prompt": "Hi"} if path == "/v1/completions" else {"messages": CHAT}
    time.sleep((0.9 - time.time() % 1) % 1)  # start just before a second boundary; ~2 s long
    events = sse_events(server, path, {**body, **LONG})
    assert len({e["created"] for e in events}) == 1
    assert len({e["id"] for e in events}) == 1


# ---- covered paths that passed ---------------------------------------------------------


def test_stop_string_across_tokens_streams_like_whole(client: openai.OpenAI, model: str) -> None:
    """A stop string that starts in one token and ends in the next: the stream never shows its
    start and ends where the whole response ends. Fails when the detokenizer holds no text back
    (IncrementalDetokenizer: `self._num_held_chars = 0`)."""
    base = dict(model=model, prompt="Once upon", max_tokens=16, temperature=1.0, seed=11)
    tokens = client.completions.create(**base, logprobs=0).choices[0].logprobs.tokens
    k = next(
        (i for i in range(1, len(tokens) - 1) if len(tokens[i]) >= 3 and len(tokens[i + 1]) >= 3),
        None,
    )
    assert k is not None, f"no two adjacent tokens of 3+ characters in {tokens}"
    stop = tokens[k][-2:] + tokens[k + 1][:2]  # spans the boundary of tokens k and k+1
    whole = client.completions.create(**base, stop=[stop]).choices[0]
    assert whole.finish_reason == "stop" and stop not in whole.text
    chunks = list(client.completions.create(**base, stop=[stop], stream=True))
    assert "".join(c.choices[0].text for c in chunks) == whole.text
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert chunks[-1].choices[0].model_extra["stop_reason"] == stop


def test_batched_n2_echo_stream_equals_whole(client: openai.OpenAI, model: str) -> None:
    """Two prompts x n=2, echoed and streamed with usage: choice 2i+j is sample j of prompt i,
    each starts with its prompt, and the stream equals the whole response. Fails when the
    stream numbers choices without the prompt (serving_completion: `index=prompt_index +
    choice.index`)."""
    prompts = ["Hello there", "Good morning friend"]
    params = dict(
        model=model, prompt=prompts, n=2, max_tokens=3, temperature=1.0, seed=3, echo=True
    )
    whole = client.completions.create(**params)
    chunks = list(
        client.completions.create(**params, stream=True, stream_options={"include_usage": True})
    )
    texts: dict[int, str] = {}
    finishes: dict[int, str] = {}
    for chunk in chunks[:-1]:
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + choice.text
            if choice.finish_reason is not None:
                finishes[choice.index] = choice.finish_reason
    assert texts == {c.index: c.text for c in whole.choices}
    assert finishes == {c.index: c.finish_reason for c in whole.choices}
    assert [texts[i].startswith(prompts[i // 2]) for i in range(4)] == [True] * 4
    assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage
    assert whole.usage.completion_tokens == 4 * 3


def test_dropped_chat_stream_with_n2_aborts_both_samples(server: ServerProcess) -> None:
    """A chat stream of n=2 dropped mid-way: both core requests are aborted and their KV blocks
    freed. Fails when an abort forgets a request's samples (OutputProcessor.abort_requests:
    `core_request_ids(request_id, 1)`)."""
    aborted_before = metric_value(
        metric_samples(server),
        "pagedlm:request_success",
        "pagedlm:request_success_total",
        finished_reason="abort",
    )
    body = {"messages": CHAT, "n": 2, **LONG, "stream": True}
    with httpx.stream(
        "POST", server.url("/v1/chat/completions"), json=body, headers=AUTH, timeout=60
    ) as response:
        num_events = 0
        for line in response.iter_lines():
            num_events += line.startswith("data: ")
            if num_events == 6:
                break  # closes the connection mid-stream
    deadline = time.monotonic() + 10
    while True:
        families = metric_samples(server)
        state = [
            metric_value(families, name, name)
            for name in (
                "pagedlm:num_requests_running",
                "pagedlm:num_requests_waiting",
                "pagedlm:kv_cache_usage_perc",
            )
        ]
        if state == [0.0, 0.0, 0.0]:
            break
        assert time.monotonic() < deadline, f"not idle 10 s after the drop: {state}"
        time.sleep(0.2)
    aborted = metric_value(
        families,
        "pagedlm:request_success",
        "pagedlm:request_success_total",
        finished_reason="abort",
    )
    assert aborted == aborted_before + 2


def test_metrics_parse_and_count_a_request(
    server: ServerProcess, client: openai.OpenAI, model: str
) -> None:
    """/metrics through prometheus_client's parser: vLLM's names and types, and one n=2
    request counted twice (per sample, as vLLM's engine requests) in requests, prompt tokens,
    generated tokens and latencies. Fails when finished requests stop counting their prompt
    (ServerMetrics.observe_finished without `prompt_tokens.inc`)."""
    expected = {
        "pagedlm:num_requests_running": "gauge",
        "pagedlm:num_requests_waiting": "gauge",
        "pagedlm:kv_cache_usage_perc": "gauge",
        "pagedlm:prefix_cache_queries": "counter",
        "pagedlm:prefix_cache_hits": "counter",
        "pagedlm:num_preemptions": "counter",
        "pagedlm:prompt_tokens": "counter",
        "pagedlm:generation_tokens": "counter",
        "pagedlm:request_success": "counter",
        "pagedlm:time_to_first_token_seconds": "histogram",
        "pagedlm:inter_token_latency_seconds": "histogram",
        "pagedlm:request_time_per_output_token_seconds": "histogram",
        "pagedlm:e2e_request_latency_seconds": "histogram",
        "pagedlm:request_queue_time_seconds": "histogram",
    }
    before = metric_samples(server)
    assert {name: before[name].type for name in expected} == expected
    result = client.completions.create(
        model=model,
        prompt="Hello there",
        n=2,
        max_tokens=3,
        temperature=1.0,
        extra_body={"ignore_eos": True},
    )
    after = metric_samples(server)

    def grew(family: str, sample: str, **labels: str) -> float:
        return metric_value(after, family, sample, **labels) - metric_value(
            before, family, sample, **labels
        )

    assert (
        grew("pagedlm:request_success", "pagedlm:request_success_total", finished_reason="length")
        == 2
    )
    assert (
        grew("pagedlm:prompt_tokens", "pagedlm:prompt_tokens_total")
        == 2 * result.usage.prompt_tokens
    )
    assert (
        grew("pagedlm:generation_tokens", "pagedlm:generation_tokens_total")
        == result.usage.completion_tokens
        == 6
    )
    for histogram in (
        "time_to_first_token_seconds",
        "e2e_request_latency_seconds",
        "request_time_per_output_token_seconds",
    ):
        name = f"pagedlm:{histogram}"
        assert grew(name, name + "_count") == 2


def test_cache_salt_isolates_cached_tokens(client: openai.OpenAI, model: str) -> None:
    """vLLM's `cache_salt` body field reaches the core process (wire.AddRequest) on both
    endpoints: a prompt's cached blocks serve only requests with the same salt. The unsalted
    pair is the control (the prompt's blocks do get cached); dropping the salt anywhere on the
    way makes the first "a" request hit them."""
    story = "A salted story about a lighthouse keeper and the sea. " * 4  # > 2 blocks of 16
    endpoints = {
        "completions": (client.completions.create, {"prompt": story}),
        "chat": (
            client.chat.completions.create,
            {"messages": [{"role": "user", "content": story}]},
        ),
    }
    for name, (create, body) in endpoints.items():
        hits = []
        for salt in (None, None, "a", "b", "a"):
            extra_body = {} if salt is None else {"cache_salt": salt}
            result = create(model=model, max_tokens=1, temperature=0, extra_body=extra_body, **body)
            hits.append(result.usage.prompt_tokens_details.cached_tokens)
        assert hits[1] >= 32 and hits[2:4] == [0, 0] and hits[4] >= 32, (name, hits)


@pytest.mark.parametrize("path", ["completions", "chat"])
@pytest.mark.parametrize("salt", ["", 3])
def test_bad_cache_salt_is_a_400_naming_it(
    client: openai.OpenAI, model: str, path: str, salt: object
) -> None:
    create = client.completions.create if path == "completions" else client.chat.completions.create
    body = {"prompt": "Hi"} if path == "completions" else {"messages": CHAT}
    with pytest.raises(openai.BadRequestError) as caught:
        create(model=model, max_tokens=1, extra_body={"cache_salt": salt}, **body)
    error = caught.value.body
    assert error["type"] == "invalid_request_error" and error["param"] == "cache_salt", error
