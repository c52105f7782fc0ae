"""`pagedlm serve -dp 2` on the CPU, through the openai client: the same greedy text as -dp 1,
both engine cores take work (queue-length balancing), utilities reach both cores and their
answers are gathered, and a killed core ends the server with code 1 (the last test)."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from server_helpers import (
    ServerProcess,
    StreamInBackground,
    assert_gone,
    start_server,
    tiny_server_args,
)

from pagedlm.config import default_model_path

pytestmark = pytest.mark.slow

PROMPTS = [f"Question {i}: what is {i} plus {i}? Answer:" for i in range(6)]
GREEDY = {"max_tokens": 8, "temperature": 0.0, "ignore_eos": True}
ROUTED = "pagedlm:engine_requests_routed_total"


@pytest.fixture(scope="module")
def dp1_texts(tiny_model_dir: Path) -> list[str]:
    """The offline engine's greedy text at dp = 1 (the server at dp = 1 gives the offline text:
    test_openai_client.py), in the order _completions gives."""
    from pagedlm import LLM, SamplingParams

    llm = LLM(str(tiny_model_dir), tokenizer=default_model_path(), kv_cache_memory_gib=0.05)
    try:
        params = [SamplingParams(n=2 if i == 0 else 1, **GREEDY) for i in range(len(PROMPTS))]
        outputs = llm.generate(PROMPTS, params, use_tqdm=False)
    finally:
        llm.shutdown()
    return [sample.text for output in outputs for sample in output.outputs]


@pytest.fixture(scope="module")
def dp2(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """Ended by the last test (a killed core)."""
    log_path = tmp_path_factory.mktemp("dp2") / "server.log"
    server = start_server(
        tiny_server_args(tiny_model_dir, "-dp", "2", "--enable-dev-endpoints"), log_path
    )
    yield server
    server.stop()


async def _completions(server: ServerProcess) -> list[str]:
    """Every prompt at once (so that both cores get some), greedy; one of them with n = 2."""
    client = openai.AsyncOpenAI(base_url=server.url("/v1"), api_key="none", timeout=120)
    (model,) = [m.id async for m in client.models.list()]

    async def one(prompt: str, n: int) -> list[str]:
        result = await client.completions.create(
            model=model,
            prompt=prompt,
            n=n,
            max_tokens=GREEDY["max_tokens"],
            temperature=GREEDY["temperature"],
            extra_body={"ignore_eos": True},
        )
        return [choice.text for choice in result.choices]

    answers = await asyncio.gather(*(one(p, 2 if i == 0 else 1) for i, p in enumerate(PROMPTS)))
    return [text for texts in answers for text in texts]


def test_dp2_gives_dp1_text_and_both_cores_take_work(
    dp2: ServerProcess, dp1_texts: list[str]
) -> None:
    assert [dp2.metric(ROUTED, engine=rank) for rank in "01"] == [0.0, 0.0]
    texts = asyncio.run(_completions(dp2))
    assert texts == dp1_texts and len(texts) == len(PROMPTS) + 1
    routed = [dp2.metric(ROUTED, engine=rank) for rank in "01"]
    assert sum(routed) == len(PROMPTS) + 1 and min(routed) > 0, routed
    assert dp2.metric("pagedlm:generation_tokens_total") == GREEDY["max_tokens"] * len(texts)
    assert dp2.metric("pagedlm:prefix_cache_queries_total") > 0  # summed over the cores
    dp2.wait_for_idle()


def test_utilities_reach_both_cores(dp2: ServerProcess) -> None:
    def post(path: str, **kwargs: object) -> httpx.Response:
        return httpx.post(dp2.url(path), timeout=60, **kwargs)

    footprints = post("/collective_rpc", json={"method": "memory_footprint"}).json()["results"]
    assert len(footprints) == 2 and all(f["weights_bytes"] > 0 for f in footprints)
    assert post("/update_weight_version", json={"new_version": "v7"}).status_code == 200
    versions = post("/collective_rpc", json={"method": "get_weight_version"}).json()["results"]
    assert versions == ["v7", "v7"]
    assert post("/reset_prefix_cache").json() == {"success": True}
    assert post("/pause").status_code == 200
    assert httpx.get(dp2.url("/is_paused")).json() == {"is_paused": True}
    assert post("/resume").status_code == 200
    unknown = post("/collective_rpc", json={"method": "rm_rf"})
    assert unknown.status_code == 400 and unknown.json()["error"]["param"] == "method"
    assert asyncio.run(_completions(dp2))  # both still serve


def test_a_killed_core_ends_the_server_with_code_1(dp2: ServerProcess) -> None:
    family = dp2.family()
    cores = dp2.core_processes()
    assert len(cores) == 2, cores
    body = {"prompt": "Tell me everything.", "max_tokens": 400, "ignore_eos": True}
    streams = [StreamInBackground(dp2, "/v1/completions", body) for _ in range(4)]
    for stream in streams:
        stream.wait_for_events(2)
    cores[1].send_signal(signal.SIGKILL)
    assert dp2.proc.wait(30) == 1, dp2.log()[-3000:]
    assert_gone(family)
    for stream in streams:
        error = stream.result(10)[-1]["error"]
        assert error["code"] == "engine_dead" and "exited with code -9" in error["message"], (
            error,
            dp2.log()[-3000:],
        )
    assert "exiting with code 1 (for a supervisor to restart the server)" in dp2.log()
