"""Data parallelism in process (offline LLM, data_parallel_size > 1): one EngineCore per dp rank,
each with its own model replica and scheduler (on CUDA its own GPU, cuda:rank), behind one
LLMEngine, with the EngineCore's interface.

A new request goes to the core with the fewest unfinished requests (queue length, as vLLM's DP
balancer); its aborts and stop-string finishes go to that core. step() steps every core that has
work: each launches its step without waiting on its device (async scheduling), so the GPUs run
side by side while this one host loop plans them in turn. A utility (pause, sleep, collective_rpc,
...) runs on every core: collective_rpc gives every core's results in dp-rank order; a boolean
answer is true when every core's is. A core that raises (a dead TP worker, a failed step) raises
out of step(); shutdown() then stops every core.
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import replace
from typing import Any, TypeVar

from pagedlm.config import EngineConfig
from pagedlm.core.sched_output import EngineCoreOutput
from pagedlm.engine.engine_core import EngineCore, EngineStats
from pagedlm.request import Request

Stats = TypeVar("Stats")


class DataParallelCores:
    def __init__(self, config: EngineConfig, tokenizer: Any = None) -> None:
        size = config.parallel.data_parallel_size
        self.cores = [EngineCore(rank_config(config, rank), tokenizer) for rank in range(size)]
        self._owner: dict[str, EngineCore] = {}  # unfinished request id -> its core

    def add_request(self, request: Request) -> None:
        core = min(self.cores, key=lambda c: len(c.scheduler.requests))  # the first on ties
        core.add_request(request)
        self._owner[request.request_id] = core

    def abort_requests(self, request_ids: list[str]) -> list[EngineCoreOutput]:
        outputs = []
        for core, ids in self._by_core(request_ids).items():
            outputs += core.abort_requests(ids)
        return self._forget_finished(outputs)

    def finish_requests(self, request_ids: list[str]) -> None:
        for core, ids in self._by_core(request_ids).items():
            core.finish_requests(ids)
        for req_id in request_ids:
            self._owner.pop(req_id, None)

    def step(self) -> list[EngineCoreOutput]:
        outputs = []
        for core in self.cores:
            if core.has_work():
                outputs += core.step()
        return self._forget_finished(outputs)

    def has_unfinished_requests(self) -> bool:
        return any(core.has_unfinished_requests() for core in self.cores)

    def has_work(self) -> bool:
        return any(core.has_work() for core in self.cores)

    def call_utility(self, method: str, args: list | tuple = (), kwargs: dict | None = None) -> Any:
        return combine_utility_results(
            method, [core.call_utility(method, args, kwargs) for core in self.cores]
        )

    def get_stats(self) -> EngineStats:
        return sum_stats([core.get_stats() for core in self.cores])

    def shutdown(self) -> None:
        for core in self.cores:
            core.shutdown()
        self._owner.clear()

    def _by_core(self, request_ids: list[str]) -> dict[EngineCore, list[str]]:
        grouped: dict[EngineCore, list[str]] = {}
        for req_id in request_ids:
            core = self._owner.get(req_id)
            if core is not None:
                grouped.setdefault(core, []).append(req_id)
        return grouped

    def _forget_finished(self, outputs: list[EngineCoreOutput]) -> list[EngineCoreOutput]:
        for output in outputs:
            if output.finish_reason is not None:
                self._owner.pop(output.req_id, None)
        return outputs


def combine_utility_results(method: str, results: list[Any]) -> Any:
    """Every core's answer to one utility call (in dp-rank order) as one: collective_rpc's lists
    joined; booleans true when all are; otherwise the first core's."""
    if method == "collective_rpc":
        return [result for core_results in results for result in core_results]
    if all(isinstance(result, bool) for result in results):
        return all(results)
    return results[0]


def sum_stats(every: list[Stats]) -> Stats:
    """The cores' stats (EngineStats, or wire.CoreStats) as one: counts summed, per-position
    counts summed per position, the KV cache's usage their mean."""
    totals = {}
    for f in dataclasses.fields(every[0]):
        values = [getattr(stats, f.name) for stats in every]
        if f.name == "kv_cache_usage":
            totals[f.name] = sum(values) / len(values)
        elif isinstance(values[0], tuple):  # per draft position
            totals[f.name] = tuple(map(sum, itertools.zip_longest(*values, fillvalue=0)))
        else:
            totals[f.name] = sum(values)
    return type(every[0])(**totals)


def rank_config(config: EngineConfig, rank: int) -> EngineConfig:
    """dp rank `rank`'s config: on CUDA its own GPU."""
    import torch

    if config.device.type != "cuda":
        return config
    return replace(config, device=torch.device("cuda", rank))
