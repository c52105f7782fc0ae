"""Sleep mode's worker side: release the weights' and the KV cache's memory, and take it back.

Tags (vLLM's): "weights" and "kv_cache". Level 1 moves the weights to host memory (on CUDA into
one flat page-locked buffer, worker/host_offload.py; on a CPU device the tensors themselves are
kept, they are host memory already); level 2 keeps only each weight's shape and dtype, and
wake_up(["weights"]) gives them back uninitialised, to be filled by reload_weights or a weight
update. The model's buffers (RoPE tables) stay either way. The KV
cache is dropped whole and allocated again, zeroed, on wake_up(["kv_cache"]); the prefix cache
that pointed into it is reset by the engine core first. A speculative draft model sleeps with
them: its KV cache as the target's, its weights moved to host memory at either level (no
weight update or reload reaches a draft, so level 2 could not give them back).

The CUDA graphs bind the addresses of both. On CUDA, where worker/cumem.py works (MemoryPools),
the addresses are kept: the weights and the KV cache live in cuMem pools, one per tag; sleep
copies what must survive to host (level 1: the parameters and buffers; level 2: the buffers) and
unmaps the pools' physical memory; wake maps new memory at the same addresses, copies the values
back and zeroes the KV cache. The tensors and the graphs stay; nothing is captured again.
Elsewhere (or with PAGEDLM_SLEEP_KEEP_ADDRESSES=0) the graphs go at sleep and are captured again
(with the kernel warm-up, ModelRunner.prepare_steps) once both are awake; the engine's
gc.freeze() would keep a reference cycle through them alive, so the sleep runs a full collection
first.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import logging
import time
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from pagedlm.worker import cumem
from pagedlm.worker.host_offload import HostCopy

if TYPE_CHECKING:
    from pagedlm.worker.model_runner import ModelRunner

logger = logging.getLogger("pagedlm")

SLEEP_TAGS = ("weights", "kv_cache")
GiB = 1 << 30


@dataclass(slots=True)
class _AsleepWeight:
    shape: torch.Size
    dtype: torch.dtype
    host: torch.Tensor | None  # level 1: the values (on CUDA a view of the HostCopy); 2: None


@dataclass
class SleepingParts:
    """What a sleeping runner needs to wake up."""

    weights: dict[str, _AsleepWeight] | None = None  # by parameter name, while weights sleep
    host_copy: HostCopy | None = None  # level 1 on CUDA: the buffer weights' host views are in
    draft_weights: dict[str, _AsleepWeight] | None = None  # the draft model's, while they sleep
    draft_host_copy: HostCopy | None = None
    num_kv_blocks: int | None = None  # while the KV cache sleeps
    kept: list[torch.Tensor] | None = None  # kept addresses: the tensors host_copy has values of


class MemoryPools:
    """A runner's cuMem pools by tag, where sleep keeps the addresses; else none (use() does
    nothing and sleep frees through torch, then captures the graphs again)."""

    def __init__(self, pools: dict[str, cumem.CuMemPool] | None = None) -> None:
        self._pools = pools

    @classmethod
    def create(cls, enable_sleep_mode: bool, device: torch.device) -> MemoryPools:
        if not enable_sleep_mode or device.type != "cuda":
            return cls()
        allocator = cumem.process_allocator()
        if allocator is None:
            return cls()
        with torch.cuda.device(device):  # a MemPool belongs to the current device
            return cls({tag: allocator.new_pool(tag) for tag in SLEEP_TAGS})

    @property
    def keeps_addresses(self) -> bool:
        return self._pools is not None

    def use(self, tag: str) -> contextlib.AbstractContextManager:
        """The device allocations inside go to the tag's pool."""
        if self._pools is None:
            return contextlib.nullcontext()
        pool = self._pools[tag]
        return pool.allocator.use(pool)

    def asleep(self, tag: str) -> bool:
        return self._pools is not None and self._pools[tag].asleep

    def sleep(self, tag: str) -> None:
        self._pools[tag].sleep()

    def wake(self, tag: str) -> None:
        self._pools[tag].wake()


def release(runner: ModelRunner, parts: SleepingParts, level: int, tags: set[str]) -> None:
    """Frees the tagged memory (see the module's docstring). No step may be in flight."""
    start, free_before = time.perf_counter(), _device_free_bytes(runner.device)
    runner.remove_all_requests()
    if runner.pools.keeps_addresses:
        _unmap(runner, parts, level, tags)
    else:
        _free(runner, parts, level, tags)
    _return_memory(runner.device)
    freed = _device_free_bytes(runner.device) - free_before
    logger.info(
        "sleep level %d (%s): %.2f GiB of device memory freed in %.2f s%s",
        level,
        ", ".join(sorted(tags)),
        freed / GiB,
        time.perf_counter() - start,
        ", addresses kept" if runner.pools.keeps_addresses else "",
    )


def _free(runner: ModelRunner, parts: SleepingParts, level: int, tags: set[str]) -> None:
    runner.graphs = runner.piecewise = None  # they bind the addresses of both
    draft = runner.draft_model()
    if "kv_cache" in tags:
        parts.num_kv_blocks = runner.input_batch.num_kv_blocks
        runner.kv_caches = []
        if draft is not None:
            draft.kv_caches = []
    if "weights" in tags:
        parts.weights, parts.host_copy = _release_weights(runner.model, keep_values=level == 1)
        if draft is not None:
            parts.draft_weights, parts.draft_host_copy = _release_weights(draft.model, True)


def _unmap(runner: ModelRunner, parts: SleepingParts, level: int, tags: set[str]) -> None:
    torch.cuda.synchronize(runner.device)  # nothing may still read or write the pools
    if "weights" in tags:
        model, draft = runner.model, runner.draft_model()
        kept = [b for b in model.buffers() if b.device.type == "cuda"]
        if level == 1:
            kept += [p.data for p in model.parameters() if p.device.type == "cuda"]
        if draft is not None:  # in the weights' pool too (ModelRunner.load_model)
            kept += [t for t in _tensors(draft.model) if t.device.type == "cuda"]
        parts.kept, parts.host_copy = kept, HostCopy(kept) if kept else None
        runner.pools.sleep("weights")
        if level == 2:
            logger.info("sleep level 2: the weights are uninitialised after wake_up until a reload")
    if "kv_cache" in tags:
        runner.pools.sleep("kv_cache")


def restore(runner: ModelRunner, parts: SleepingParts, tags: set[str]) -> None:
    """Takes the tagged memory back; once nothing sleeps, the graphs are captured again (unless
    their addresses were kept)."""
    start = time.perf_counter()
    if runner.pools.keeps_addresses:
        _remap(runner, parts, tags)
    else:
        _reallocate(runner, parts, tags)
    logger.info("wake_up (%s) in %.2f s", ", ".join(sorted(tags)), time.perf_counter() - start)


def _reallocate(runner: ModelRunner, parts: SleepingParts, tags: set[str]) -> None:
    if "weights" in tags:
        if any(weight.host is None for weight in parts.weights.values()):
            logger.info("wake_up: the weights (level 2) are uninitialised until reload_weights")
        _restore_weights(runner.model, parts.weights, runner.device)
        if parts.draft_weights is not None:
            _restore_weights(runner.draft_model().model, parts.draft_weights, runner.device)
        for host_copy in (parts.host_copy, parts.draft_host_copy):
            if host_copy is not None:
                host_copy.free()
        parts.weights = parts.host_copy = parts.draft_weights = parts.draft_host_copy = None
    if "kv_cache" in tags:
        runner.allocate_kv_cache(parts.num_kv_blocks)
        parts.num_kv_blocks = None
    if parts.weights is None and parts.num_kv_blocks is None:
        runner.prepare_steps(start_up=False)


def _remap(runner: ModelRunner, parts: SleepingParts, tags: set[str]) -> None:
    if "weights" in tags and runner.pools.asleep("weights"):
        runner.pools.wake("weights")
        if parts.host_copy is not None:
            for tensor, host in zip(parts.kept, parts.host_copy.views()):
                tensor.copy_(host, non_blocking=parts.host_copy.locked)
            torch.cuda.synchronize(runner.device)  # the host copy is freed next
            parts.host_copy.free()
        parts.kept = parts.host_copy = None
    if "kv_cache" in tags and runner.pools.asleep("kv_cache"):
        runner.pools.wake("kv_cache")
        for cache in _kv_caches(runner):  # new physical memory holds anything; padding reads it
            cache.zero_()


def _tensors(model: torch.nn.Module) -> list[torch.Tensor]:
    return [p.data for p in model.parameters()] + list(model.buffers())


def _kv_caches(runner: ModelRunner) -> list[torch.Tensor]:
    """The target's KV tensors and the draft model's (KV cache groups' layers share tensors)."""
    draft = runner.draft_model()
    caches = runner.kv_caches + ([] if draft is None else draft.kv_caches)
    return list({id(cache): cache for cache in caches}.values())


def _release_weights(
    model: torch.nn.Module, keep_values: bool
) -> tuple[dict[str, _AsleepWeight], HostCopy | None]:
    params = dict(model.named_parameters())
    on_device = [p.data for p in params.values() if p.device.type != "cpu"]
    host_copy = HostCopy(on_device) if keep_values and on_device else None
    host_views = iter(host_copy.views() if host_copy is not None else ())
    asleep = {}
    for name, param in params.items():
        data = param.data
        host = None
        if keep_values:
            host = data if data.device.type == "cpu" else next(host_views)
        asleep[name] = _AsleepWeight(data.shape, data.dtype, host)
        param.data = torch.empty(0, dtype=data.dtype, device=data.device)
    return asleep, host_copy


def _restore_weights(
    model: torch.nn.Module, asleep: dict[str, _AsleepWeight], device: torch.device
) -> None:
    for name, param in model.named_parameters():
        weight = asleep[name]
        if weight.host is not None and weight.host.device == device:
            param.data = weight.host  # a CPU device kept the tensor itself
            continue
        param.data = torch.empty(weight.shape, dtype=weight.dtype, device=device)
        if weight.host is not None:
            param.data.copy_(weight.host, non_blocking=True)
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # the host copy is freed next


def _return_memory(device: torch.device) -> None:
    """Frees what the released tensors held, cycles through frozen objects included, and hands the
    cached device blocks back to the driver."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()


# Every runner alive: the last CUDA one to go also frees cuBLAS's workspaces.
_live_runners: weakref.WeakSet = weakref.WeakSet()


def register_runner(runner: ModelRunner) -> None:
    _live_runners.add(runner)


@functools.cache
def graph_stream(device: torch.device) -> torch.cuda.Stream:
    """One side stream per device for every runner's graph warm-up and capture: cuBLAS keeps a
    workspace (tens of MiB) per stream it ran on until the process ends, so a stream per engine
    grew the device memory by that much with each engine built."""
    return torch.cuda.Stream(device)


def free_engine_memory(device: torch.device) -> None:
    """After a runner was dropped (LLM.shutdown): its memory back to the driver; with no CUDA
    runner left, cuBLAS's workspaces too (of every device; no graph captured over them remains)."""
    _return_memory(device)
    if device.type == "cuda" and not any(r.use_cuda for r in _live_runners):
        torch._C._cuda_clearCublasWorkspaces()
        torch.cuda.empty_cache()


def _device_free_bytes(device: torch.device) -> int:
    return torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else 0


def memory_footprint(runner: ModelRunner) -> dict[str, Any]:
    """collective_rpc("memory_footprint"): bytes held by the weights and the KV cache now (a
    draft model's included), and on CUDA the device's allocated and free bytes."""
    draft = runner.draft_model()
    models = [runner.model] + ([] if draft is None else [draft.model])
    weights = sum(p.numel() * p.element_size() for m in models for p in m.parameters())
    kv_cache = sum(c.numel() * c.element_size() for c in _kv_caches(runner))
    if runner.pools.asleep("weights"):  # kept addresses: the tensors stay, unmapped
        weights = 0
    if runner.pools.asleep("kv_cache"):
        kv_cache = 0
    footprint: dict[str, Any] = {"weights_bytes": weights, "kv_cache_bytes": kv_cache}
    if runner.use_cuda:
        footprint["device_allocated_bytes"] = torch.cuda.memory_allocated(runner.device)
        footprint["device_free_bytes"] = _device_free_bytes(runner.device)
    return footprint
