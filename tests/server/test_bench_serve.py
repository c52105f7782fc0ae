"""`pagedlm bench serve` against the live default-model server: both endpoints, Poisson and
all-at-once arrivals, every request counted, latencies measured, the JSON written."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
from conftest import API_KEY, ServerProcess

from pagedlm.bench.serve import add_parser, main

pytestmark = pytest.mark.slow


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="pagedlm bench")
    add_parser(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(["serve", *argv])


@pytest.mark.parametrize("endpoint, rate", [("/v1/completions", "inf"),
                                            ("/v1/chat/completions", "20")])
def test_bench_serve_counts_and_times_every_request(default_server: ServerProcess, tmp_path: Path,
                                                    endpoint: str, rate: str) -> None:
    out = tmp_path / "result.json"
    args = parse("--base-url", default_server.base_url, "--api-key", API_KEY,
                 "--endpoint", endpoint, "--request-rate", rate, "--max-concurrency", "4",
                 "--num-prompts", "6", "--input-len", "12", "--output-len", "4",
                 "--output-json", str(out))
    result = main(args)
    assert json.loads(out.read_text()) == result
    assert (result["successful_requests"], result["failed_requests"]) == (6, 0)
    assert result["total_output_tokens"] == 6 * 4  # ignore_eos by default
    if endpoint == "/v1/completions":
        assert result["total_input_tokens"] == 6 * 12  # token ids sent as they are
    for name in ("ttft", "tpot", "itl", "e2el"):
        assert 0 < result[f"median_{name}_ms"] <= result[f"p99_{name}_ms"]
    assert result["mean_ttft_ms"] < result["mean_e2el_ms"]
    assert result["output_throughput"] == pytest.approx(24 / result["duration_s"])


def test_bench_serve_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="request_rate must be positive"):
        main(parse("--request-rate", "0"))
