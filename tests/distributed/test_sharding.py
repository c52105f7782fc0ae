"""Which part of each checkpoint tensor a TP rank holds (pure functions: no process group), the
batch-sharded sampler's plan, and the argument checks."""

from __future__ import annotations

import importlib.util
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest

from pagedlm.config import EngineArgs
from pagedlm.distributed.sampling import ShardPlan
from pagedlm.distributed.sharding import (
    check_tp,
    checkpoint_slice,
    local_model_config,
    vocab_shard_rows,
)

# only the fields sharding reads
_MODEL = SimpleNamespace(
    num_heads=8, num_kv_heads=2, head_dim=4, intermediate_size=12, vocab_size=100
)


def _rows(name: str, model=_MODEL, tp: int = 4) -> list[tuple[int, int, int]]:
    slices = [checkpoint_slice(name, model, rank, tp) for rank in range(tp)]
    return [(s.dim, s.start, s.length) for s in slices]


def test_heads_split_and_kv_heads_replicate_past_their_count() -> None:
    assert _rows("model.layers.0.self_attn.q_proj.weight") == [(0, 8 * r, 8) for r in range(4)]
    # 4 ranks, 2 KV heads: ranks 0-1 hold KV head 0, ranks 2-3 KV head 1 (their q heads' group)
    assert _rows("model.layers.1.self_attn.k_proj.bias") == [
        (0, 0, 4),
        (0, 0, 4),
        (0, 4, 4),
        (0, 4, 4),
    ]
    assert _rows("model.layers.0.self_attn.v_proj.weight", tp=2) == [(0, 0, 4), (0, 4, 4)]
    assert _rows("model.layers.0.self_attn.o_proj.weight") == [(1, 8 * r, 8) for r in range(4)]
    assert _rows("model.layers.0.mlp.up_proj.weight") == [(0, 3 * r, 3) for r in range(4)]
    assert _rows("model.layers.0.mlp.down_proj.weight") == [(1, 3 * r, 3) for r in range(4)]
    for replicated in (
        "model.layers.0.self_attn.o_proj.bias",
        "model.layers.0.mlp.down_proj.bias",
        "model.layers.0.self_attn.q_norm.weight",
        "model.layers.0.input_layernorm.weight",
        "model.norm.weight",
    ):
        assert checkpoint_slice(replicated, _MODEL, 1, 4) is None
    assert checkpoint_slice("model.layers.0.self_attn.q_proj.weight", _MODEL, 0, 1) is None


def test_vocabulary_shards_are_word_aligned_and_cover_the_vocabulary_once() -> None:
    assert vocab_shard_rows(100, 4) == 32 and vocab_shard_rows(100, 2) == 64
    slices = _rows("lm_head.weight", tp=4)
    assert slices == [(0, 0, 32), (0, 32, 32), (0, 64, 32), (0, 96, 4)]
    assert _rows("model.embed_tokens.weight", tp=2) == [(0, 0, 64), (0, 64, 36)]


def test_local_config_and_the_checks() -> None:
    model = SimpleNamespace(**vars(_MODEL))
    check_tp(model, 4)
    for tp, match in ((3, "attention heads"), (16, "attention heads")):
        with pytest.raises(ValueError, match=match):
            check_tp(model, tp)
    with pytest.raises(ValueError, match="KV heads"):
        check_tp(SimpleNamespace(**{**vars(_MODEL), "num_kv_heads": 3, "num_heads": 6}), 2)
    with pytest.raises(ValueError, match="intermediate_size"):
        check_tp(SimpleNamespace(**{**vars(_MODEL), "intermediate_size": 10}), 4)


def test_local_model_config_keeps_the_vocabulary(tiny_llama_dir) -> None:
    config = EngineArgs(model=str(tiny_llama_dir), device="cpu", skip_tokenizer_init=True)
    model = config.create_engine_config().model
    local = local_model_config(model, 2)
    assert (local.num_heads, local.num_kv_heads, local.intermediate_size) == (2, 1, 64)
    assert local.vocab_size == model.vocab_size and local_model_config(model, 1) is model
    assert replace(local, num_heads=4, num_kv_heads=2, intermediate_size=128) == model


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (dict(tensor_parallel_size=3), "attention heads"),
        (dict(tensor_parallel_size=2, distributed_executor_backend="uni"), '"uni" runs one'),
        (dict(tensor_parallel_size=2, distributed_executor_backend="slurm"), "one of uni, mp, ray"),
        (dict(enable_batch_sharded_sampling=True), "tensor_parallel_size > 1"),
    ],
)
def test_engine_args_refuse_what_cannot_run(tiny_llama_dir, args: dict, match: str) -> None:
    engine_args = EngineArgs(
        model=str(tiny_llama_dir), device="cpu", skip_tokenizer_init=True, **args
    )
    with pytest.raises(ValueError, match=match):
        engine_args.create_engine_config()


def test_the_ray_backend_without_ray_names_the_extra(
    tiny_llama_dir, monkeypatch: pytest.MonkeyPatch
) -> None:
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a: None if n == "ray" else find_spec(n, *a)
    )
    engine_args = EngineArgs(
        model=str(tiny_llama_dir),
        device="cpu",
        skip_tokenizer_init=True,
        tensor_parallel_size=2,
        distributed_executor_backend="ray",
    )
    with pytest.raises(ValueError, match=r'"ray" needs Ray: pip install "pagedlm\[ray\]"'):
        engine_args.create_engine_config()


def test_shard_plan_gives_each_row_to_one_rank_and_maps_back() -> None:
    rows = np.array([5, 2, 7, 4, 1, 0, 3])  # persistent rows in batch order
    plan = ShardPlan(rows, 3)
    assert plan.counts.tolist() == [2, 3, 2]  # owners 2, 2, 1, 1, 1, 0, 0
    mine = [plan.rows_of(r) for r in range(3)]
    assert [m.tolist() for m in mine] == [[0, 3], [7, 4, 1], [5, 2]]
    # rank r's ids padded to n_max = 3, concatenated: back picks each batch row's id
    gathered = np.full(9, -1)
    for rank in range(3):
        gathered[rank * 3 : rank * 3 + len(mine[rank])] = mine[rank] * 10
    assert gathered[plan.back].tolist() == (rows * 10).tolist()


def test_more_ranks_than_gpus_is_refused(tiny_llama_dir, monkeypatch) -> None:
    import torch

    from pagedlm.config import build_parallel_config

    args = EngineArgs(model=str(tiny_llama_dir), device="cpu", tensor_parallel_size=2)
    model = args.create_engine_config().model  # the CPU allows tp ranks as processes
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ValueError, match=r"greater than the GPUs present \(1\)"):
        build_parallel_config(args, model, torch.device("cuda"), max_num_seqs=8)
    assert (
        build_parallel_config(args, model, torch.device("cpu"), 8).distributed_executor_backend
        == "mp"
    )


def test_tp1_builds_the_plain_layers(tiny_llama_dir) -> None:
    """Today's path is untouched at tp = 1: no collective layer, the full vocabulary."""
    import torch

    from pagedlm.attention.backend import get_attention_backend
    from pagedlm.model.llama import LlamaForCausalLM
    from pagedlm.model.parallel_layers import RowParallelLinear, VocabParallelEmbedding

    config = EngineArgs(model=str(tiny_llama_dir), device="cpu", skip_tokenizer_init=True)
    model_config = config.create_engine_config().model
    with torch.device("meta"):
        model = LlamaForCausalLM(model_config, get_attention_backend("torch", torch.device("cpu")))
    kinds = {type(module) for module in model.modules()}
    assert not kinds & {RowParallelLinear, VocabParallelEmbedding}
    assert model.vocab_rows == model_config.vocab_size == model.lm_head.weight.shape[0]
