"""`pagedlm bench serve` against a live tiny-model server: both endpoints, Poisson and
all-at-once arrivals, one client or several client processes, every request counted, latencies
measured, the JSON written."""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from server_helpers import ServerProcess, start_server, tiny_server_args

from pagedlm.bench import serve_clients
from pagedlm.bench.serve import add_parser, arrival_times, main, summarize
from pagedlm.bench.serve_clients import (
    ClientShare,
    RequestResult,
    _is_token_chunk,
    split_among_clients,
)
from pagedlm.cli import main as cli_main

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    log_path = tmp_path_factory.mktemp("bench") / "server.log"
    server = start_server(tiny_server_args(tiny_model_dir, "--api-key", "bench-key"), log_path)
    yield server
    server.stop()


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="pagedlm bench")
    add_parser(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(["serve", *argv])


@pytest.mark.parametrize("num_clients", [1, 2])
@pytest.mark.parametrize(
    "endpoint, rate", [("/v1/completions", "inf"), ("/v1/chat/completions", "20")]
)
def test_bench_serve_counts_and_times_every_request(
    server: ServerProcess, tmp_path: Path, endpoint: str, rate: str, num_clients: int
) -> None:
    out = tmp_path / "result.json"
    args = parse(
        "--base-url",
        server.base_url,
        "--api-key",
        "bench-key",
        "--endpoint",
        endpoint,
        "--request-rate",
        rate,
        "--max-concurrency",
        "4",
        "--num-clients",
        str(num_clients),
        "--num-prompts",
        "10",
        "--input-len",
        "12",
        "--output-len",
        "6",
        "--output-json",
        str(out),
    )
    result = main(args)
    assert json.loads(out.read_text()) == result
    assert (result["successful_requests"], result["failed_requests"]) == (10, 0)
    assert result["total_output_tokens"] == 10 * 6  # ignore_eos by default
    if endpoint == "/v1/completions":
        assert result["total_input_tokens"] == 10 * 12  # token ids sent as they are
    for name in ("ttft", "tpot", "itl", "e2el"):
        assert 0 < result[f"median_{name}_ms"] <= result[f"p99_{name}_ms"]
    assert result["mean_ttft_ms"] < result["mean_e2el_ms"]
    assert result["output_throughput"] == pytest.approx(60 / result["duration_s"])
    assert result["num_clients"] == num_clients


def test_a_client_spreads_its_streams_over_pools(
    server: ServerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """httpcore scans a whole pool at every event of every stream: a client keeps at most
    _STREAMS_PER_POOL in flight per pool, so 500 streams cost it O(32) a chunk, not O(500)."""
    monkeypatch.setattr(serve_clients, "_STREAMS_PER_POOL", 3)
    opened = []
    open_client = serve_clients.open_client

    def counted(*args: object) -> object:
        opened.append(args)
        return open_client(*args)

    monkeypatch.setattr(serve_clients, "open_client", counted)
    args = parse(
        "--base-url",
        server.base_url,
        "--api-key",
        "bench-key",
        "--max-concurrency",
        "8",
        "--num-prompts",
        "10",
        "--input-len",
        "8",
        "--output-len",
        "4",
    )
    result = main(args)
    assert (result["successful_requests"], result["failed_requests"]) == (10, 0)
    assert result["total_output_tokens"] == 10 * 4
    assert len(opened) == 3  # ceil(8 / 3) pools for the run (the warm-up has its own)


def test_bench_serve_warms_up_off_the_dataset_and_counts_cached_tokens(
    server: ServerProcess,
) -> None:
    """Issue 4's 2x: a run's prompts already in the server's prefix cache skip their prefill.
    The warm-up must not put a dataset prompt there (a first run takes nothing from the cache);
    the same prompts sent again come from the cache, all but each prompt's last token, in
    whole blocks of 16, and the report counts them."""
    argv = (
        "--base-url",
        server.base_url,
        "--api-key",
        "bench-key",
        "--num-prompts",
        "3",
        "--input-len",
        "40",
        "--output-len",
        "2",
        "--dataset-seed",
        "7",
    )
    first = main(parse(*argv))
    again = main(parse(*argv))
    assert (first["successful_requests"], again["successful_requests"]) == (3, 3)
    assert first["total_cached_tokens"] == 0
    assert again["total_cached_tokens"] == 3 * 32  # (40 - 1) // 16 = 2 blocks per prompt


def test_bench_serve_stops_when_the_first_request_fails(server: ServerProcess) -> None:
    """A wrong key: the first request fails, so nothing is measured."""
    args = parse(
        "--base-url",
        server.base_url,
        "--api-key",
        "wrong",
        "--model",
        "m",
        "--num-prompts",
        "2",
        "--input-len",
        "4",
        "--output-len",
        "2",
    )
    with pytest.raises(ValueError, match="the first request failed.*HTTP 401"):
        main(args)


def test_bench_serve_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="request_rate must be positive"):
        main(parse("--request-rate", "0"))


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--num-clients", "0"], "num_clients must be positive, got 0"),
        (["--num-clients", "-2"], "num_clients must be positive, got -2"),
        (
            ["--num-clients", "3", "--max-concurrency", "2"],
            "max_concurrency (2) must be at least num_clients (3)",
        ),
    ],
)
def test_bench_serve_refuses_bad_client_counts_in_one_line(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["bench", "serve", *argv])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_clients_split_one_schedule_and_the_concurrency() -> None:
    """Round-robin over 3 clients: each request goes to exactly one client at its own arrival
    time, and the concurrency caps (8 over 3: 3, 3, 2) sum to the total."""
    arrivals = arrival_times(seed=0, request_rate=10.0, num_requests=8)
    every_request = ClientShare(
        base_url="http://x",
        headers={},
        endpoint="/v1/completions",
        timeout=1.0,
        bodies=[{"prompt": [i]} for i in range(8)],
        num_prompt_tokens=list(range(8)),
        arrivals=arrivals,
        max_concurrency=8,
    )
    shares = split_among_clients(every_request, 3)
    assert [s.max_concurrency for s in shares] == [3, 3, 2]
    sent = sorted(
        (arrival, body["prompt"][0], n)
        for s in shares
        for arrival, body, n in zip(s.arrivals, s.bodies, s.num_prompt_tokens)
    )
    assert sent == [(arrivals[i], i, i) for i in range(8)]
    assert all(s.arrivals == sorted(s.arrivals) for s in shares)
    unlimited = split_among_clients(replace(every_request, max_concurrency=None), 2)
    assert [s.max_concurrency for s in unlimited] == [None, None]


def test_arrivals_are_one_poisson_process_at_the_rate() -> None:
    arrivals = arrival_times(seed=1, request_rate=50.0, num_requests=5000)
    assert arrivals == sorted(arrivals) and arrivals[0] > 0
    assert 5000 / arrivals[-1] == pytest.approx(50.0, rel=0.05)
    assert arrival_times(seed=1, request_rate=float("inf"), num_requests=3) == [0.0] * 3


def test_summary_counts_failures_and_uses_only_successes() -> None:
    ok = RequestResult(
        success=True,
        num_prompt_tokens=5,
        num_output_tokens=3,
        ttft=0.1,
        latency=0.5,
        itl=[0.2, 0.2],
        num_cached_tokens=4,
    )
    failed = RequestResult(error="HTTP 503: busy", num_prompt_tokens=7, num_cached_tokens=7)
    summary = summarize([ok, failed, ok], duration=2.0)
    assert (summary["successful_requests"], summary["failed_requests"]) == (2, 1)
    assert summary["errors"] == ["HTTP 503: busy"]
    assert (summary["total_input_tokens"], summary["total_output_tokens"]) == (10, 6)
    assert summary["total_cached_tokens"] == 8
    assert summary["request_throughput"] == 1.0 and summary["output_throughput"] == 3.0
    assert summary["median_tpot_ms"] == pytest.approx(200.0)  # (0.5 - 0.1) / (3 - 1)
    assert summary["p99_itl_ms"] == pytest.approx(200.0)


def test_token_chunks_without_text_are_counted() -> None:
    """A server without a tokenizer streams empty texts: a step's chunk still brings tokens, the
    finish-only chunk does not, unless it is the first (the server coalesced every token)."""

    def chunk(text: str, finish: str | None) -> dict:
        return {"choices": [{"index": 0, "text": text, "finish_reason": finish}]}

    assert _is_token_chunk(chunk("", None), first=False)
    assert _is_token_chunk(chunk("hi", "length"), first=False)
    assert not _is_token_chunk(chunk("", "length"), first=False)
    assert _is_token_chunk(chunk("", "length"), first=True)
    assert not _is_token_chunk({"choices": [], "usage": {"completion_tokens": 3}}, first=True)
    role_only = {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}
    assert not _is_token_chunk(role_only, first=True)


def test_vocab_size_needs_the_completions_endpoint() -> None:
    with pytest.raises(ValueError, match="vocab_size needs the /v1/completions endpoint"):
        main(parse("--vocab-size", "100", "--endpoint", "/v1/chat/completions"))
