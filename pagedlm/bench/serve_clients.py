"""The client side of `pagedlm bench serve`: streamed requests sent at their arrival times, by
one asyncio client in this process or by several spawned client processes, so that at high
rates the load generator is not what limits the figure."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import math
import multiprocessing
import ssl
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

# Spawning a client imports numpy and httpx; a client not at the start line by then is stuck.
_START_TIMEOUT_S = 120.0


@dataclass
class RequestResult:
    success: bool = False
    error: str = ""
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0
    num_cached_tokens: int = 0  # prompt tokens the server took from its prefix cache
    ttft: float = 0.0  # seconds from sending to the first text
    latency: float = 0.0  # seconds from sending to the last byte
    itl: list[float] = field(default_factory=list)  # gaps between later text chunks


@dataclass(frozen=True)
class ClientShare:
    """What one client sends: request bodies, each with its prompt's length and its arrival time
    (seconds after the clients' common start), and the most it may have in flight."""

    base_url: str
    headers: dict[str, str]
    endpoint: str
    timeout: float
    bodies: list[dict]
    num_prompt_tokens: list[int]
    arrivals: list[float]
    max_concurrency: int | None


def split_among_clients(share: ClientShare, num_clients: int) -> list[ClientShare]:
    """Round-robin: client k takes requests k, k + N, ... at their arrival times, so together
    the clients keep the one schedule; their concurrency caps sum to the total."""
    return [
        replace(
            share,
            bodies=share.bodies[k::num_clients],
            num_prompt_tokens=share.num_prompt_tokens[k::num_clients],
            arrivals=share.arrivals[k::num_clients],
            max_concurrency=_concurrency_share(share.max_concurrency, k, num_clients),
        )
        for k in range(num_clients)
    ]


def _concurrency_share(total: int | None, client: int, num_clients: int) -> int | None:
    if total is None:
        return None
    return total // num_clients + (client < total % num_clients)


def run_clients(shares: list[ClientShare]) -> tuple[list[RequestResult], float]:
    """Every share's results, and the seconds from the common start to the last one's end. One
    share runs in this process; more run one per spawned process, started together."""
    if len(shares) == 1:
        return asyncio.run(run_share(shares[0]))
    context = multiprocessing.get_context("spawn")
    start_line = context.Barrier(len(shares), timeout=_START_TIMEOUT_S)
    # N workers for N tasks, each task waiting at the barrier: no worker can take a second.
    with ProcessPoolExecutor(
        len(shares), mp_context=context, initializer=_keep_start_line, initargs=(start_line,)
    ) as pool:
        outcomes = list(pool.map(_run_share_at_start_line, shares))
    results = [result for share_results, _ in outcomes for result in share_results]
    return results, max(duration for _, duration in outcomes)


_start_line: Any = None  # a client process's barrier, set by the pool's initializer


def _keep_start_line(barrier: Any) -> None:
    global _start_line
    _start_line = barrier


def _run_share_at_start_line(share: ClientShare) -> tuple[list[RequestResult], float]:
    return asyncio.run(run_share(share, ready=_start_line.wait))


# httpcore scans its whole connection pool at every event of every request, so one pool of
# 500 streams costs the client O(500) per chunk (most of its time at rate inf, the profile in
# benchmarks/results/2026-12-02-h200-s21/); requests are spread over pools of this many.
_STREAMS_PER_POOL = 32


def open_client(base_url: str, headers: dict[str, str], timeout: float) -> Any:
    import httpx

    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    return httpx.AsyncClient(
        base_url=base_url, headers=headers, limits=limits, timeout=timeout, verify=_ssl_context()
    )


@functools.cache
def _ssl_context() -> ssl.SSLContext:
    """One for every pool: loading the certificates takes ~0.1 s a client."""
    return ssl.create_default_context()


async def run_share(
    share: ClientShare, ready: Callable[[], object] = lambda: None
) -> tuple[list[RequestResult], float]:
    """Sends each request at its arrival time, at most max_concurrency in flight. `ready` blocks
    until every client is set up, so that their arrival times count from one start."""
    max_in_flight = share.max_concurrency or len(share.bodies)
    async with contextlib.AsyncExitStack() as stack:
        clients = [
            await stack.enter_async_context(
                open_client(share.base_url, share.headers, share.timeout)
            )
            for _ in range(max(1, math.ceil(max_in_flight / _STREAMS_PER_POOL)))
        ]
        limit = asyncio.Semaphore(max_in_flight)

        async def one(client: Any, body: dict, num_prompt_tokens: int) -> RequestResult:
            async with limit:
                return await send_request(client, share.endpoint, body, num_prompt_tokens)

        ready()
        start = time.perf_counter()
        tasks = []
        for i, (arrival, body, num_prompt_tokens) in enumerate(
            zip(share.arrivals, share.bodies, share.num_prompt_tokens)
        ):
            delay = start + arrival - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            client = clients[i % len(clients)]
            tasks.append(asyncio.create_task(one(client, body, num_prompt_tokens)))
        results = list(await asyncio.gather(*tasks))
        return results, time.perf_counter() - start


async def send_request(
    client: Any, endpoint: str, body: dict, num_prompt_tokens: int
) -> RequestResult:
    """One streamed request; token chunks time TTFT and ITL, the usage chunk counts tokens."""
    result = RequestResult(num_prompt_tokens=num_prompt_tokens)
    start = last = time.perf_counter()
    num_chunks = 0
    try:
        async with client.stream("POST", endpoint, json=body) as response:
            if response.status_code != 200:
                result.error = f"HTTP {response.status_code}: {(await response.aread())[:500]!r}"
                return result
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[len("data: ") :])
                if "error" in chunk:
                    result.error = str(chunk["error"])
                    return result
                if _is_token_chunk(chunk, first=num_chunks == 0):
                    now = time.perf_counter()
                    if num_chunks == 0:
                        result.ttft = now - start
                    else:
                        result.itl.append(now - last)
                    last = now
                    num_chunks += 1
                usage = chunk.get("usage")
                if usage:
                    result.num_output_tokens = usage["completion_tokens"]
                    result.num_prompt_tokens = usage["prompt_tokens"]
                    details = usage.get("prompt_tokens_details") or {}
                    result.num_cached_tokens = details.get("cached_tokens") or 0
    except Exception as exc:  # noqa: BLE001 - a failed request is counted, not fatal
        result.error = f"{type(exc).__name__}: {exc}"
        return result
    result.latency = time.perf_counter() - start
    result.num_output_tokens = result.num_output_tokens or num_chunks
    result.success = num_chunks > 0
    result.error = "" if result.success else "no output tokens came back"
    return result


def _is_token_chunk(chunk: dict, first: bool) -> bool:
    """Does this chunk bring new output tokens? Completions stream one chunk per step with new
    tokens, whose text is empty when the server has no tokenizer (`--skip-tokenizer-init`); the
    last chunk carries the finish reason, and every token when the server coalesced them all
    (a client that read nothing before: `first`)."""
    choices = chunk.get("choices") or []
    if not choices:
        return False
    choice = choices[0]
    if "text" in choice:
        return bool(choice["text"]) or choice.get("finish_reason") is None or first
    return bool((choice.get("delta") or {}).get("content"))
