"""`pagedlm serve` with a fake engine core: the front end's capacity, without a model.

The core process runs the real CoreLoop (ZeroMQ, msgspec, stats) over a core that computes
nothing: each step takes `--step-ms` (a sleep, as a GPU step of that length would leave the host
idle), admits waiting requests within `--token-budget` prompt tokens, and gives every running
request one token. Whatever the served figure lacks against the core's own rate
(`--step-ms` and the batch) is the front end's: HTTP, SSE, detokenisation, the output path.

  PYTHONPATH=. python benchmarks/fake_core_serve.py --step-ms 20 -- <pagedlm serve arguments>
  pagedlm bench serve --vocab-size 49152 --num-prompts 500 ...

`--profile FILE` writes a cProfile of the front end's event loop (the main thread) at exit."""

from __future__ import annotations

import argparse
import cProfile
import gc
import sys
import time
from collections import deque
from typing import Any

from pagedlm.core.sched_output import EngineCoreOutput
from pagedlm.engine import core_process
from pagedlm.engine.engine_core import EngineStats
from pagedlm.request import Request


class FakeCore:
    """Steps at a fixed period; the token a request gets is a function of its id and length,
    so runs are repeatable."""

    def __init__(self, config: Any, step_s: float, token_budget: int) -> None:
        self.config = config
        self.step_s = step_s
        self.token_budget = token_budget
        self.waiting: deque[Request] = deque()
        self.running: dict[str, Request] = {}
        self.has_drained_outputs = False
        self._next_step = 0.0
        self._vocab = config.model.vocab_size

    def add_request(self, request: Request) -> None:
        self.waiting.append(request)

    def abort_requests(self, ids: list[str]) -> list[EngineCoreOutput]:
        gone = set(ids)
        self.waiting = deque(r for r in self.waiting if r.request_id not in gone)
        for req_id in ids:
            self.running.pop(req_id, None)
        return []

    def finish_requests(self, ids: list[str]) -> None:
        self.abort_requests(ids)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def has_unfinished_requests(self) -> bool:
        return self.has_work()

    def call_utility(self, method: str, args: list, kwargs: dict) -> Any:
        raise ValueError(f"the fake core has no utility {method!r}")

    def get_stats(self) -> EngineStats:
        return EngineStats(len(self.running), len(self.waiting), 0.0, 0, 0, 0)

    def step(self) -> list[EngineCoreOutput]:
        self._admit()
        now = time.perf_counter()
        self._next_step = max(self._next_step + self.step_s, now)
        time.sleep(max(0.0, self._next_step - now))
        outputs = []
        for req_id, request in list(self.running.items()):
            token = (hash(req_id) + 7919 * request.num_output_tokens) % (self._vocab - 200) + 100
            request.output_token_ids.append(token)
            done = request.num_output_tokens >= request.max_tokens
            outputs.append(
                EngineCoreOutput(req_id, [token], finish_reason="length" if done else None)
            )
            if done:
                del self.running[req_id]
        return outputs

    def _admit(self) -> None:
        budget = self.token_budget
        while self.waiting and (budget > 0 or not self.running):
            request = self.waiting.popleft()
            budget -= request.num_prompt_tokens
            request.first_scheduled_time = time.time()
            self.running[request.request_id] = request


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--step-ms", type=float, default=20.0)
    parser.add_argument("--token-budget", type=int, default=16384)
    parser.add_argument("--profile", default=None)
    args, serve_args = parser.parse_known_args()
    serve_args = [a for a in serve_args if a != "--"]
    _use_fake_core(args.step_ms / 1000.0, args.token_budget)
    from pagedlm.cli import main as cli_main

    gc_log = _GcLog()
    gc.callbacks.append(gc_log)
    # CPU time, not wall time: on a shared machine waiting for a core is not the front end's cost
    profile = cProfile.Profile(time.process_time) if args.profile else None
    if profile is not None:
        profile.enable()
    try:
        cli_main(["serve", *serve_args])
    finally:
        if profile is not None:
            profile.disable()
            profile.dump_stats(args.profile)
        print(gc_log.summary(), file=sys.stderr)


class _GcLog:
    """The front end's garbage collections: how many per generation, their seconds."""

    def __init__(self) -> None:
        self.count = [0, 0, 0]
        self.seconds = [0.0, 0.0, 0.0]
        self.longest = [0.0, 0.0, 0.0]
        self._start = 0.0
        self.full: list[str] = []  # when each full collection ended, and its length

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._start = time.perf_counter()
            return
        gen, took = info["generation"], time.perf_counter() - self._start
        self.count[gen] += 1
        self.seconds[gen] += took
        self.longest[gen] = max(self.longest[gen], took)
        if gen == 2:
            self.full.append(f"{time.strftime('%H:%M:%S')} {took * 1e3:.0f} ms")

    def summary(self) -> str:
        return (
            "front-end gc: "
            + ", ".join(
                f"gen{g} {self.count[g]} x, {self.seconds[g] * 1e3:.0f} ms, longest "
                f"{self.longest[g] * 1e3:.1f} ms"
                for g in range(3)
            )
            + f"; {len(gc.get_objects())} objects tracked; full: {', '.join(self.full)}"
        )


def _use_fake_core(step_s: float, token_budget: int) -> None:
    from pagedlm.server import async_engine

    async_engine.run_core = _FakeCoreEntry(step_s, token_budget)


class _FakeCoreEntry:
    """run_core with build_core replaced (picklable, for the spawned process)."""

    def __init__(self, step_s: float, token_budget: int) -> None:
        self.step_s = step_s
        self.token_budget = token_budget

    def __call__(self, source: Any, addresses: Any, parent_pid: int) -> None:
        def build(source: Any) -> FakeCore:
            from pagedlm.model.gguf_loader import one_parse

            with one_parse(source.model):
                config = source.create_engine_config()
            return FakeCore(config, self.step_s, self.token_budget)

        core_process.build_core = build
        core_process.run_core(source, addresses, parent_pid)


if __name__ == "__main__":
    sys.exit(main())
