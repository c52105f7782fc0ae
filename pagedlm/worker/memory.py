"""How many KV-cache blocks fit: an override, an explicit budget, or a measured GPU profile."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

import torch

from pagedlm.config import EngineConfig, ModelConfig
from pagedlm.model.llama import model_kv_groups
from pagedlm.worker.input_batch import cdiv

logger = logging.getLogger("pagedlm")

GiB = 1 << 30
# The CPU's default KV cache: room for one sequence of max_model_len and one step of
# max_num_batched_tokens besides, at most CPU_KV_MAX_RAM_SHARE of the machine's memory.
CPU_KV_MAX_RAM_SHARE = 0.25
T = TypeVar("T")


def kv_cache_bytes_per_block(
    model: ModelConfig, block_size: int, num_layers: int | None = None
) -> int:
    """Keys and values of block_size tokens in num_layers layers (default: every layer)."""
    num_layers = model.num_layers if num_layers is None else num_layers
    dtype_size = torch.empty((), dtype=model.dtype).element_size()
    return 2 * num_layers * block_size * model.num_kv_heads * model.head_dim * dtype_size


def pool_bytes_per_block(config: EngineConfig) -> int:
    """What one block of the pool costs: the target's KV in one KV cache group's layers (all of
    them when there is one group; layer i of every group shares a KV tensor: core/kv_groups.py)
    and, with a draft model (speculative decoding, spec_decode/draft_model.py), the draft's KV at
    the same block id."""
    block_size = config.cache.block_size
    draft = config.draft_model
    draft_bytes = 0 if draft is None else kv_cache_bytes_per_block(draft, block_size)
    num_tensors = len(model_kv_groups(config.model)[0][1])  # the first group is never short
    return kv_cache_bytes_per_block(config.model, block_size, num_tensors) + draft_bytes


def draft_scratch_bytes(config: EngineConfig) -> int:
    """The draft cache's scratch blocks past the pool's (spec_decode/draft_inputs.Scratch): a
    fixed cost besides the pool's blocks."""
    draft = config.draft_model
    if draft is None:
        return 0
    from pagedlm.spec_decode.draft_config import draft_scratch_blocks

    return draft_scratch_blocks(config) * kv_cache_bytes_per_block(draft, config.cache.block_size)


def determine_num_blocks(
    config: EngineConfig,
    profile: Callable[[], int],
    weights_bytes: int,
    profile_graphs: Callable[[], int] | None = None,
) -> int:
    """num_gpu_blocks_override wins; then kv_cache_memory_gib; on the CPU without either,
    default_cpu_num_blocks; on CUDA, what the profile leaves of total x gpu_memory_utilization. `profile` runs
    one step of the largest batch and returns the bytes of the KV cache it used itself;
    `profile_graphs` (when CUDA graphs are on) returns the device bytes the graphs take. Logs the
    KV cache's size once."""
    cache = config.cache
    bytes_per_block = pool_bytes_per_block(config)
    if cache.num_gpu_blocks_override is not None:
        num_blocks, source = cache.num_gpu_blocks_override, "num_gpu_blocks_override"
    elif cache.kv_cache_memory_gib is not None:
        gib = cache.kv_cache_memory_gib
        num_blocks = (int(gib * GiB) - draft_scratch_bytes(config)) // bytes_per_block
        source = f"a budget of {gib:.2f} GiB"
    elif config.device.type != "cuda":
        num_blocks = default_cpu_num_blocks(config, bytes_per_block, physical_memory_bytes())
        source = (
            "max_model_len + max_num_batched_tokens tokens, "
            f"at most {CPU_KV_MAX_RAM_SHARE:.0%} of RAM"
        )
    else:
        num_blocks = _profiled_num_blocks(
            config, profile, weights_bytes, bytes_per_block, profile_graphs
        )
        source = "what the memory profile leaves"
    logger.info(
        "KV cache: %d blocks of %d tokens, %.2f GiB (%d bytes a block): %s",
        num_blocks,
        cache.block_size,
        num_blocks * bytes_per_block / GiB,
        bytes_per_block,
        source,
    )
    check_max_model_len_fits(config, num_blocks)
    return num_blocks


def default_cpu_num_blocks(config: EngineConfig, bytes_per_block: int, ram_bytes: int) -> int:
    """Blocks for the longest sequence and a full step of others besides, within
    CPU_KV_MAX_RAM_SHARE of ram_bytes (then check_max_model_len_fits says if one sequence fits).
    The default model: 8,192 + 2,048 tokens, 225 MiB in bfloat16 (a fixed 2 GiB before)."""
    block_size = config.cache.block_size
    wanted = cdiv(config.model.max_model_len, block_size) + cdiv(
        config.scheduler.max_num_batched_tokens, block_size
    )
    wanted *= len(model_kv_groups(config.model))  # a token takes a block in every group
    return max(1, min(wanted, int(ram_bytes * CPU_KV_MAX_RAM_SHARE) // bytes_per_block))


def physical_memory_bytes() -> int:
    import os

    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _profiled_num_blocks(
    config: EngineConfig,
    profile: Callable[[], int],
    weights_bytes: int,
    bytes_per_block: int,
    profile_graphs: Callable[[], int] | None,
) -> int:
    device = config.device
    torch.cuda.synchronize(device)  # sync-ok: start-up profiling, not a step
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    baseline = torch.cuda.memory_allocated(device)  # weights + persistent runner/sampler buffers
    profile_kv_bytes = profile()
    torch.cuda.synchronize(device)  # sync-ok: start-up profiling, not a step
    peak = torch.cuda.max_memory_allocated(device)
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info(device)
    non_torch = max(0, total - free - torch.cuda.memory_reserved(device))
    activation = max(0, peak - baseline - profile_kv_bytes)
    graph_bytes = 0 if profile_graphs is None else profile_graphs()
    budget = total * config.cache.gpu_memory_utilization
    kv_bytes = budget - baseline - activation - non_torch - graph_bytes
    kv_bytes -= draft_scratch_bytes(config)
    logger.info(
        "GPU memory: total %.2f GiB x gpu_memory_utilization %.2f = %.2f GiB; weights %.2f GiB; "
        "other persistent buffers %.2f GiB; peak activation (profile of %d tokens) %.2f GiB; "
        "non-torch %.2f GiB; CUDA graphs (trial capture) %.3f GiB; left for the KV cache %.2f GiB",
        total / GiB,
        config.cache.gpu_memory_utilization,
        budget / GiB,
        weights_bytes / GiB,
        (baseline - weights_bytes) / GiB,
        config.scheduler.max_num_batched_tokens,
        activation / GiB,
        non_torch / GiB,
        graph_bytes / GiB,
        kv_bytes / GiB,
    )
    if kv_bytes < bytes_per_block:
        raise ValueError(
            f"no GPU memory is left for the KV cache ({kv_bytes / GiB:.2f} GiB after "
            "weights, activations and CUDA graphs); raise gpu_memory_utilization, "
            "lower max_num_batched_tokens / max_num_seqs or set enforce_eager"
        )
    return int(kv_bytes) // bytes_per_block


def device_bytes_taken(device: torch.device, build: Callable[[], T]) -> tuple[T, int]:
    """build()'s result and the device memory it holds on to (torch pools and driver memory
    alike): the drop in free device memory, with the allocator's unused blocks released."""
    torch.cuda.synchronize(device)  # sync-ok: start-up measurement, not a step
    torch.cuda.empty_cache()
    free_before = torch.cuda.mem_get_info(device)[0]
    result = build()
    torch.cuda.synchronize(device)  # sync-ok: start-up measurement, not a step
    torch.cuda.empty_cache()
    return result, free_before - torch.cuda.mem_get_info(device)[0]


def check_max_model_len_fits(config: EngineConfig, num_blocks: int) -> None:
    block_size = config.cache.block_size
    max_model_len = config.model.max_model_len
    num_groups = len(model_kv_groups(config.model))  # a token takes a block in every group
    num_tokens = num_blocks // num_groups * block_size
    if num_blocks < cdiv(max_model_len, block_size) * num_groups:
        raise ValueError(
            f"max_model_len={max_model_len} does not fit in the KV cache: {num_blocks} blocks of "
            f"{block_size} tokens hold {num_tokens} tokens; lower max_model_len to at "
            f"most {num_tokens} or give the cache more memory "
            "(gpu_memory_utilization, kv_cache_memory_gib or num_gpu_blocks_override)"
        )
