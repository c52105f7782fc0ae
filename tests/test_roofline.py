"""The hardware-limit arithmetic against numbers worked out by hand."""
from __future__ import annotations

import json
import math

import torch

from pagedlm.bench.roofline import BANDWIDTH_BYTES_S, ModelCost, generation_floor_seconds
from pagedlm.config import build_model_config


def test_llama3_8b_weight_bytes_match_benchmarks_md(tmp_path) -> None:
    # shared/BENCHMARKS.md: batch-1 decode of llama3-8b reads 16.06 GB of weights per token.
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
              "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
              "intermediate_size": 14336, "vocab_size": 128256, "rope_theta": 500000.0,
              "rms_norm_eps": 1e-5, "max_position_embeddings": 8192, "tie_word_embeddings": False}
    (tmp_path / "config.json").write_text(json.dumps(config))
    model = build_model_config(str(tmp_path), "dummy", "bfloat16", torch.device("cpu"), None, True)
    cost = ModelCost.of(model)
    assert math.isclose(cost.weight_bytes / 1e9, 16.06, rel_tol=1e-3)
    assert cost.kv_bytes_per_token == 2 * 32 * 1024 * 2  # K and V, 32 layers, 8 heads x 128, bf16


def test_decode_floor_is_weights_over_bandwidth_for_one_sequence() -> None:
    cost = ModelCost(weight_bytes=10**9, matmul_flops_per_token=1, kv_bytes_per_token=0, attn_flops_per_pair=0)
    floor = generation_floor_seconds(cost, [16], [100], max_batch=1)
    assert math.isclose(floor, 100 * 10**9 / BANDWIDTH_BYTES_S)


def test_batching_shares_weight_reads() -> None:
    cost = ModelCost(weight_bytes=10**9, matmul_flops_per_token=1, kv_bytes_per_token=0, attn_flops_per_pair=0)
    alone = generation_floor_seconds(cost, [16] * 4, [100] * 4, max_batch=1)
    together = generation_floor_seconds(cost, [16] * 4, [100] * 4, max_batch=4)
    assert math.isclose(alone, 4 * together)
