"""KV-cache sizing on the CPU: override, explicit budget, default budget, and the error when
max_model_len does not fit."""

from __future__ import annotations

import dataclasses
import logging

import pytest
import torch

from pagedlm.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from pagedlm.worker.memory import (
    CPU_KV_MAX_RAM_SHARE,
    GiB,
    default_cpu_num_blocks,
    determine_num_blocks,
    kv_cache_bytes_per_block,
)


def _config(cache: CacheConfig, max_model_len: int = 4096, dtype=torch.float32) -> EngineConfig:
    model = ModelConfig(
        model="none",
        load_format="dummy",
        hf_config=None,
        architecture="LlamaForCausalLM",
        dtype=dtype,
        max_model_len=max_model_len,
        vocab_size=100,
        hidden_size=64,
        num_layers=3,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        intermediate_size=128,
        rms_norm_eps=1e-5,
        rope_theta=1e4,
        rope_scaling=None,
        tie_word_embeddings=True,
        attention_bias=False,
        qk_norm=False,
        sliding_window=None,
        eos_token_ids=(),
        tokenizer=None,
    )
    return EngineConfig(
        model=model, cache=cache, scheduler=SchedulerConfig(), device=torch.device("cpu")
    )


def _never(*_args) -> int:
    raise AssertionError("the CPU path must not profile")


def test_bytes_per_block():
    config = _config(CacheConfig(block_size=16), dtype=torch.bfloat16)
    assert kv_cache_bytes_per_block(config.model, 16) == 2 * 3 * 16 * 2 * 16 * 2


def test_override_wins():
    config = _config(CacheConfig(num_gpu_blocks_override=300, kv_cache_memory_gib=0.001))
    assert determine_num_blocks(config, _never, 0) == 300


def test_cpu_budget_explicit_and_default():
    per_block = 2 * 3 * 16 * 2 * 16 * 4  # fp32
    config = _config(CacheConfig(kv_cache_memory_gib=0.01))
    assert determine_num_blocks(config, _never, 0) == int(0.01 * GiB) // per_block


def test_cpu_default_holds_the_longest_sequence_and_a_step():
    default = _config(CacheConfig(), max_model_len=4096)  # max_num_batched_tokens 8192
    assert determine_num_blocks(default, _never, 0) == (4096 + 8192) // 16
    long = _config(CacheConfig(), max_model_len=20000)
    assert determine_num_blocks(long, _never, 0) == 1250 + 512


def test_cpu_default_is_capped_by_a_share_of_ram():
    per_block = 2 * 3 * 16 * 2 * 16 * 4  # fp32
    config = _config(CacheConfig(), max_model_len=20000)
    ram = 1000 * per_block
    assert (
        default_cpu_num_blocks(config, per_block, ram)
        == int(ram * CPU_KV_MAX_RAM_SHARE) // per_block
    )
    assert default_cpu_num_blocks(config, per_block, 10**6 * per_block) == 1250 + 512


def test_max_model_len_must_fit():
    config = _config(CacheConfig(block_size=16, num_gpu_blocks_override=10), max_model_len=161)
    with pytest.raises(ValueError, match=r"max_model_len=161 .* 160 tokens"):
        determine_num_blocks(config, _never, 0)
    fits = dataclasses.replace(config, model=dataclasses.replace(config.model, max_model_len=160))
    assert determine_num_blocks(fits, _never, 0) == 10


@pytest.mark.parametrize(
    "cache, source",
    [
        (CacheConfig(num_gpu_blocks_override=300), "num_gpu_blocks_override"),
        (CacheConfig(kv_cache_memory_gib=0.01), "a budget of 0.01 GiB"),
        (
            CacheConfig(),
            "max_model_len + max_num_batched_tokens tokens, at most 25% of RAM",
        ),
    ],
)
def test_the_kv_cache_size_is_logged_once_with_its_source(caplog, cache, source):
    config = _config(cache)
    with caplog.at_level(logging.INFO, logger="pagedlm"):
        num_blocks = determine_num_blocks(config, _never, 0)
    lines = [record.getMessage() for record in caplog.records if "KV cache" in record.getMessage()]
    per_block = 2 * 3 * 16 * 2 * 16 * 4  # fp32
    assert lines == [
        f"KV cache: {num_blocks} blocks of 16 tokens, {num_blocks * per_block / GiB:.2f} GiB "
        f"({per_block} bytes a block): {source}"
    ]
