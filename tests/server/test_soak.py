"""A bounded soak on loopback (CI-sized: about a minute on 2 cores): rounds of concurrent requests on
one tiny-model server, drawn with a fixed seed from streamed and whole completions and chats (n 1 or
2), streams dropped after a few events, clients that give up, and bad requests.

Checked: every well-formed request that runs to its end has exactly n * max_tokens tokens (no EOS,
no stop strings); every bad one gets a 4xx in OpenAI's shape; nothing gets a 5xx; every core
request the server took finished once, by length or abort (every dropped one by abort); after
each round no request runs and every KV block is back within seconds; at the end a normal request
succeeds, and the server's processes (front end and core) grew by less than RSS_GROWTH_LIMIT
between the first round and the last."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from server_helpers import ServerProcess, start_server, tiny_server_args

pytestmark = pytest.mark.slow

SEED = 0
NUM_ROUNDS = 8
REQUESTS_PER_ROUND = 24  # all at once
RSS_GROWTH_LIMIT = 64 * 2**20  # bytes, between the end of round 1 and the end of the last
WORDS = "the cat sat on a mat while seven quiet birds sang about rivers and stone".split()
KINDS = ("stream", "stream", "stream", "whole", "drop", "drop", "give_up", "bad")
LEFT_EARLY_MAX_TOKENS = 200
# Each is refused before it runs, whatever the server's other limits.
BAD_BODIES: list[tuple[str, object]] = [
    ("/v1/completions", {"prompt": "Hi", "max_tokens": -1}),
    ("/v1/completions", {"prompt": "Hi", "max_tokens": 4, "best_of_everything": 2}),
    ("/v1/completions", {"prompt": "Hi " * 5000, "max_tokens": 4}),
    ("/v1/completions", {"prompt": "Hi", "max_tokens": 4, "temperature": -1}),
    ("/v1/completions", {"prompt": "Hi", "max_tokens": 4, "n": 0}),
    ("/v1/completions", {"prompt": "Hi", "max_tokens": 4, "model": "no-such-model"}),
    ("/v1/completions", {"prompt": [], "max_tokens": 4}),
    ("/v1/completions", b'{"prompt": "Hi", "max_tokens": '),
    ("/v1/chat/completions", {"messages": [], "max_tokens": 4}),
    ("/v1/chat/completions", {"messages": [{"role": "wizard", "content": "Hi"}]}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "top_p": 2}),
    ("/v1/chat/completions", {"messages": "Hi"}),
]


@pytest.fixture(scope="module")
def server(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    log_path = tmp_path_factory.mktemp("soak") / "server.log"
    server = start_server(tiny_server_args(tiny_model_dir), log_path)
    yield server
    server.stop()


class Soak:
    """Draws and sends the requests; counts what happened."""

    def __init__(self, server: ServerProcess) -> None:
        self.server = server
        self.rng = random.Random(SEED)
        self.outcomes: Counter[str] = Counter()
        self.num_core_requests = 0  # engine requests the server took (n each)
        self.num_completed = 0  # of those, the ones whose client read them to their end
        self.num_dropped = 0  # of those, the streams dropped mid-way

    def draw(self) -> tuple[str, str, dict]:
        kind = self.rng.choice(KINDS)
        n = self.rng.choice((1, 1, 2))
        # A request whose client leaves early is long: it can only end by being aborted.
        max_tokens = (
            LEFT_EARLY_MAX_TOKENS if kind in ("drop", "give_up") else self.rng.randint(4, 32)
        )
        text = " ".join(self.rng.choices(WORDS, k=self.rng.randint(1, 40)))
        if self.rng.random() < 0.5:
            path, body = "/v1/completions", {"prompt": text}
        else:
            path, body = "/v1/chat/completions", {"messages": [{"role": "user", "content": text}]}
        body.update(
            max_tokens=max_tokens,
            n=n,
            ignore_eos=True,
            temperature=1.0,
            seed=self.rng.randint(0, 2**31),
        )
        return kind, path, body

    async def run_round(self, client: httpx.AsyncClient) -> None:
        await asyncio.gather(*(self.one(client, *self.draw()) for _ in range(REQUESTS_PER_ROUND)))

    async def one(self, client: httpx.AsyncClient, kind: str, path: str, body: dict) -> None:
        if kind == "bad":
            await self.bad(client, *self.rng.choice(BAD_BODIES))
        elif kind == "give_up":
            with contextlib.suppress(httpx.TimeoutException):  # the check in test_soak allows it
                await self.whole(client, path, body, timeout_s=0.05)
        elif kind == "whole":
            await self.whole(client, path, body, timeout_s=120)
        else:
            await self.stream(
                client, path, body, drop_after=self.rng.randint(1, 4) if kind == "drop" else None
            )
        self.outcomes[kind] += 1

    async def whole(
        self, client: httpx.AsyncClient, path: str, body: dict, timeout_s: float
    ) -> None:
        response = await client.post(path, json=body, timeout=timeout_s)
        assert response.status_code == 200, response.text
        self.num_core_requests += body["n"]
        self.check_complete(response.json()["usage"], response.json()["choices"], body)

    async def stream(
        self, client: httpx.AsyncClient, path: str, body: dict, drop_after: int | None
    ) -> None:
        body = {**body, "stream": True, "stream_options": {"include_usage": True}}
        events: list[dict] = []
        async with client.stream("POST", path, json=body) as response:
            assert response.status_code == 200, await response.aread()
            self.num_core_requests += body["n"]
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                events.append(json.loads(line[len("data: ") :]))
                assert "error" not in events[-1], events[-1]
                if len(events) == drop_after:
                    self.num_dropped += body["n"]
                    return  # leaving the block closes the connection mid-stream
        finishes = [c for e in events for c in e["choices"] if c.get("finish_reason")]
        self.check_complete(events[-1]["usage"], finishes, body)

    def check_complete(self, usage: dict, choices: list[dict], body: dict) -> None:
        assert usage["completion_tokens"] == body["n"] * body["max_tokens"], (usage, body)
        assert sorted(c["finish_reason"] for c in choices) == ["length"] * body["n"], choices
        self.num_completed += body["n"]

    async def bad(self, client: httpx.AsyncClient, path: str, body: object) -> None:
        if isinstance(body, bytes):
            response = await client.post(
                path, content=body, headers={"Content-Type": "application/json"}
            )
        else:
            response = await client.post(path, json=body)
        assert 400 <= response.status_code < 500, (body, response.status_code, response.text)
        assert response.json()["error"]["message"], response.text


def family_rss(server: ServerProcess) -> int:
    return sum(process.memory_info().rss for process in server.family())


def test_soak(server: ServerProcess) -> None:
    soak = Soak(server)
    finished_before = {
        reason: server.metric("pagedlm:request_success_total", finished_reason=reason)
        for reason in ("length", "abort", "stop")
    }

    async def run() -> list[int]:
        rss = []
        limits = httpx.Limits(max_connections=REQUESTS_PER_ROUND)
        async with httpx.AsyncClient(
            base_url=server.base_url, timeout=120, limits=limits
        ) as client:
            for _ in range(NUM_ROUNDS):
                await soak.run_round(client)
                server.wait_for_idle(timeout_s=10)
                rss.append(family_rss(server))
        return rss

    rss = asyncio.run(run())
    finished = {
        reason: server.metric("pagedlm:request_success_total", finished_reason=reason) - before
        for reason, before in finished_before.items()
    }
    # A client that gave up may or may not have been taken: the others are counted exactly.
    num_given_up = soak.outcomes["give_up"]
    taken = finished["length"] + finished["abort"]
    assert finished["stop"] == 0
    assert soak.num_core_requests <= taken <= soak.num_core_requests + 2 * num_given_up, (
        finished,
        soak.num_core_requests,
        soak.outcomes,
    )
    assert finished["length"] >= soak.num_completed
    assert finished["abort"] >= soak.num_dropped
    assert rss[-1] - rss[0] < RSS_GROWTH_LIMIT, f"RSS per round (MiB): {[r >> 20 for r in rss]}"
    check = httpx.post(
        server.url("/v1/completions"),
        json={"prompt": "Hi", "max_tokens": 5, "ignore_eos": True},
        timeout=60,
    )
    assert check.status_code == 200 and check.json()["usage"]["completion_tokens"] == 5
    server.wait_for_idle()
    assert "Traceback" not in server.log()
    print(
        f"soak: {sum(soak.outcomes.values())} requests {dict(soak.outcomes)}, "
        f"{soak.num_core_requests}+ core requests, finished {finished}, "
        f"RSS per round (MiB) {[r >> 20 for r in rss]}"
    )
