"""The hardware-limit arithmetic against numbers worked out by hand."""

from __future__ import annotations

import json
import math

import torch

from pagedlm.bench.roofline import BANDWIDTH_BYTES_S, PEAK_FLOPS, ModelCost, generation_floor
from pagedlm.config import build_model_config


def test_llama3_8b_weight_bytes_match_benchmarks_md(tmp_path) -> None:
    # shared/BENCHMARKS.md: llama3-8b has 16.06 GB of weights; a decode step reads them all but the
    # untied embedding table (128256 x 4096 x 2 bytes), of which it reads only the tokens' rows.
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 4096,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "intermediate_size": 14336,
        "vocab_size": 128256,
        "rope_theta": 500000.0,
        "rms_norm_eps": 1e-5,
        "max_position_embeddings": 8192,
        "tie_word_embeddings": False,
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    model = build_model_config(str(tmp_path), "dummy", "bfloat16", torch.device("cpu"), None, True)
    cost = ModelCost.of(model)
    assert math.isclose((cost.weight_bytes + 128256 * 4096 * 2) / 1e9, 16.06, rel_tol=1e-3)
    assert cost.kv_bytes_per_token == 2 * 32 * 1024 * 2  # K and V, 32 layers, 8 heads x 128, bf16
    assert cost.head_flops_per_row == 2 * 128256 * 4096
    assert math.isclose(
        cost.layer_flops_per_token / 2e9, 6.98, rel_tol=1e-3
    )  # 6.98 G decoder-layer weights


def test_flops_count_the_lm_head_once_per_output_token() -> None:
    """The layers run on the prompt and every output but the last; the LM head only where a token is
    sampled; token i of a sequence attends to i + 1 keys."""
    head_only = ModelCost(
        weight_bytes=0,
        layer_flops_per_token=0,
        head_flops_per_row=7,
        kv_bytes_per_token=0,
        attn_flops_per_pair=0,
    )
    floor = generation_floor(head_only, [1000, 5], [3, 4], max_batch=2)
    assert math.isclose(floor.compute_seconds, 7 * (3 + 4) / PEAK_FLOPS)
    attention_only = ModelCost(
        weight_bytes=0,
        layer_flops_per_token=0,
        head_flops_per_row=0,
        kv_bytes_per_token=0,
        attn_flops_per_pair=1,
    )
    floor = generation_floor(attention_only, [2], [2], max_batch=1)  # 3 tokens run: 1 + 2 + 3 pairs
    assert math.isclose(floor.compute_seconds, 6 / PEAK_FLOPS)


def test_decode_floor_is_weights_over_bandwidth_for_one_sequence() -> None:
    cost = ModelCost(
        weight_bytes=10**9,
        layer_flops_per_token=1,
        head_flops_per_row=0,
        kv_bytes_per_token=0,
        attn_flops_per_pair=0,
    )
    floor = generation_floor(cost, [16], [100], max_batch=1)
    assert math.isclose(floor.seconds, 100 * 10**9 / BANDWIDTH_BYTES_S)
    assert math.isclose(floor.memory_seconds, floor.seconds) and math.isclose(
        floor.compute_seconds, 115 / PEAK_FLOPS
    )


def test_batching_shares_weight_reads() -> None:
    cost = ModelCost(
        weight_bytes=10**9,
        layer_flops_per_token=1,
        head_flops_per_row=0,
        kv_bytes_per_token=0,
        attn_flops_per_pair=0,
    )
    alone = generation_floor(cost, [16] * 4, [100] * 4, max_batch=1)
    together = generation_floor(cost, [16] * 4, [100] * 4, max_batch=4)
    assert math.isclose(alone.seconds, 4 * together.seconds)


def test_the_floor_reports_both_limits() -> None:
    """A prefill-heavy workload is bound by FLOPs, a long decode by bytes; the JSON fields and the
    printed line carry both terms and the fraction of the larger."""
    cost = ModelCost(
        weight_bytes=10**9,
        layer_flops_per_token=10**10,
        head_flops_per_row=0,
        kv_bytes_per_token=0,
        attn_flops_per_pair=0,
    )
    prefill = generation_floor(cost, [10**5], [1], max_batch=1)
    assert prefill.seconds == prefill.compute_seconds > prefill.memory_seconds
    decode = generation_floor(cost, [1], [1000], max_batch=1)
    assert decode.seconds == decode.memory_seconds > decode.compute_seconds
    results = decode.results(2 * decode.seconds)
    assert results["fraction_of_hardware_limit"] == 0.5
    assert results["compute_floor_seconds"] == decode.compute_seconds
    assert results["memory_floor_seconds"] == results["hardware_floor_seconds"] == decode.seconds
    line = decode.describe(2 * decode.seconds)
    assert line.startswith("50.0% of the hardware limit (FLOPs at 797 TFLOP/s: ")
    assert f"bytes at 4.23 TB/s: {decode.memory_seconds * 1e3:.1f} ms)" in line
