"""Speculative decoding through `pagedlm serve --speculative-config` and the real `openai` client:
the response's top-level metrics.speculative_decoding (whole, and on the final usage chunk of a
stream), none for n > 1, and the per-request sums equal the Prometheus counters'. Synthetic
acceptance (every step drafts k tokens, each accepted at the rate) on the tiny random model, so
speculation happens whatever the weights."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from server_helpers import API_KEY, ServerProcess, start_server, tiny_server_args

pytestmark = pytest.mark.slow

SPEC = {"method": "ngram", "num_speculative_tokens": 3, "rejection_sample_method": "synthetic",
        "synthetic_acceptance_rates": 0.6}  # fmt: skip
COUNTERS = ("num_drafts", "num_draft_tokens", "num_accepted_tokens")


@pytest.fixture(scope="module")
def server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    log_path = tmp_path_factory.mktemp("spec_server") / "server.log"
    args = tiny_server_args(
        tiny_model_dir,
        "--speculative-config",
        json.dumps(SPEC),
        "--per-request-spec-decode-metrics",
        "detailed",
        "--api-key",
        API_KEY,
    )
    server = start_server(args, log_path)
    yield server
    server.stop()


def _counters(server: ServerProcess) -> dict[str, float]:
    return {name: server.metric(f"pagedlm:spec_decode_{name}_total") for name in COUNTERS}


def test_responses_carry_metrics_that_reconcile_with_the_counters(server: ServerProcess) -> None:
    client = openai.OpenAI(base_url=server.url("/v1"), api_key=API_KEY, max_retries=0)
    model = client.models.list().data[0].id
    before = _counters(server)
    raw = client.completions.with_raw_response.create(
        model=model,
        prompt="one two three",
        max_tokens=24,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    whole = json.loads(raw.text)["metrics"]["speculative_decoding"]
    assert whole["num_spec_steps"] > 0 and whole["num_draft_tokens"] > 0
    assert sum(whole["acceptance_histogram"]) == whole["num_spec_steps"]
    assert sum(whole["per_step_drafted"]) == whole["num_draft_tokens"]
    assert whole["mean_acceptance_length"] == pytest.approx(
        1 + whole["num_accepted_draft_tokens"] / whole["num_spec_steps"]
    )
    stream = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "count"}],
        max_tokens=20,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    chunks = list(stream)
    assert all("metrics" not in (c.model_extra or {}) for c in chunks[:-1])
    streamed = chunks[-1].model_extra["metrics"]["speculative_decoding"]
    assert chunks[-1].usage.completion_tokens == 20 and streamed["num_spec_steps"] > 0
    deadline = time.monotonic() + 10  # the counters arrive with the core's stats
    while True:
        after = _counters(server)
        delta = {name: after[name] - before[name] for name in COUNTERS}
        singles = {
            "num_drafts": whole["num_spec_steps"] + streamed["num_spec_steps"],
            "num_draft_tokens": whole["num_draft_tokens"] + streamed["num_draft_tokens"],
            "num_accepted_tokens": whole["num_accepted_draft_tokens"]
            + streamed["num_accepted_draft_tokens"],
        }
        if delta == singles or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert delta == singles and singles["num_drafts"] > 0, (delta, singles)
    per_pos = server.metric("pagedlm:spec_decode_num_accepted_tokens_per_pos_total")
    assert per_pos == after["num_accepted_tokens"]
    two = json.loads(
        client.completions.with_raw_response.create(
            model=model, prompt="x", max_tokens=5, n=2, extra_body={"ignore_eos": True}
        ).text
    )
    assert "metrics" not in two  # one choice only
