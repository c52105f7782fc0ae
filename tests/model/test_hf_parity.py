"""pagedlm's Llama-family model against Hugging Face transformers on tiny random-weight
checkpoints, float32 on CPU with the torch attention backend."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from paged_batch import make_cache, make_step
from transformers import (
    AutoModelForCausalLM,
    LlamaConfig,
    MistralConfig,
    PretrainedConfig,
    Qwen2Config,
    Qwen3Config,
)

from pagedlm.attention.torch_ref import TorchAttentionBackend
from pagedlm.config import build_model_config
from pagedlm.model import LlamaForCausalLM, load_model

TOL = 1e-4
BLOCK_SIZE = 8
PROMPT_LENS = (13, 5, 20, 1)  # ragged; longer than the Mistral window of 8
SHAPE = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
)
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 32,
}

FAMILIES = {
    "llama": lambda: LlamaConfig(**SHAPE),
    # llama3 frequencies (all three regimes at head_dim 16), biases on q/k/v/o and the MLP
    "llama3_rope_bias": lambda: LlamaConfig(
        **SHAPE, rope_scaling=LLAMA3_ROPE, attention_bias=True, mlp_bias=True
    ),
    "mistral": lambda: MistralConfig(**SHAPE, sliding_window=8),
    "qwen2_tied": lambda: Qwen2Config(**SHAPE, tie_word_embeddings=True),
    "qwen3": lambda: Qwen3Config(**SHAPE, head_dim=32),  # head_dim != hidden / heads
}


def save_tiny_model(
    hf_config: PretrainedConfig, folder: Path, **save_kwargs: object
) -> torch.nn.Module:
    """A random transformers model, perturbed so that norms and biases are not 1s and 0s."""
    torch.manual_seed(0)
    hf_config._attn_implementation = "eager"
    hf_model = AutoModelForCausalLM.from_config(hf_config, dtype=torch.float32).eval()
    with torch.no_grad():
        for param in hf_model.parameters():
            param.add_(torch.randn_like(param) * 0.1)
    hf_model.save_pretrained(folder, safe_serialization=True, **save_kwargs)
    return hf_model


def load_ours(folder: Path) -> LlamaForCausalLM:
    config = build_model_config(str(folder), "auto", "float32", torch.device("cpu"), None, True)
    return load_model(config, TorchAttentionBackend(), torch.device("cpu"))


def prompts(vocab_size: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(1)
    return [torch.randint(vocab_size, (n,), generator=gen).tolist() for n in PROMPT_LENS]


def hf_logits(hf_model: torch.nn.Module, token_ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf_model(torch.tensor([token_ids])).logits[0].float()  # [len, vocab]


def ragged_logits(model: LlamaForCausalLM, batch: list[list[int]]) -> list[torch.Tensor]:
    """One forward over all prompts at once; logits of every token, split per prompt."""
    cache = make_cache(model.config, len(batch), max(map(len, batch)), BLOCK_SIZE)
    input_ids, positions, meta = make_step(cache, [(ids, 0) for ids in batch])
    with torch.no_grad():
        logits = model.compute_logits(model(input_ids, positions, cache.kv_caches, meta))
    return list(logits.split([len(ids) for ids in batch]))


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[torch.nn.Module, LlamaForCausalLM]:
    folder = tmp_path_factory.mktemp(request.param)
    hf_model = save_tiny_model(FAMILIES[request.param](), folder)
    return hf_model, load_ours(folder)


def test_ragged_batch_matches_transformers(
    family: tuple[torch.nn.Module, LlamaForCausalLM],
) -> None:
    hf_model, model = family
    batch = prompts(model.config.vocab_size)
    for ids, got in zip(batch, ragged_logits(model, batch), strict=True):
        want = hf_logits(hf_model, ids)
        assert got.dtype == torch.float32
        assert (got - want).abs().max() <= TOL, f"prompt of {len(ids)} tokens"


def test_chunked_prefill_matches_one_pass(family: tuple[torch.nn.Module, LlamaForCausalLM]) -> None:
    """The longest prompt in two steps (the split falls mid-block), beside a decoding sequence."""
    hf_model, model = family
    long_ids, short_ids = prompts(model.config.vocab_size)[2], prompts(model.config.vocab_size)[0]
    split = 11
    cache = make_cache(model.config, 2, len(long_ids), BLOCK_SIZE)
    with torch.no_grad():
        for chunks in (
            [(long_ids[:split], 0), (short_ids[:-1], 0)],
            [(long_ids[split:], split), (short_ids[-1:], len(short_ids) - 1)],
        ):
            input_ids, positions, meta = make_step(cache, chunks)
            logits = model.compute_logits(model(input_ids, positions, cache.kv_caches, meta))
    want_long, want_short = hf_logits(hf_model, long_ids), hf_logits(hf_model, short_ids)
    assert (logits[:-1] - want_long[split:]).abs().max() <= TOL
    assert (logits[-1] - want_short[-1]).abs().max() <= TOL


# which Linears take the GEMV in a decode step (as CUDA routes them by shape), how many sequences, and
# the norm calls left for 2 layers: "all" as qwen3-0.6b at one row (residual adds in o_proj's and
# down_proj's epilogues, norms in the next GEMV's prologue); "narrow" (o_proj, down_proj only) as
# qwen3-0.6b at 2..8 rows (each PendingNorm materialised for cuBLAS); "wide" (qkv, gate_up, LM head) as
# llama3-8b's down_proj on cuBLAS at one row (the norm kernels add the residual)
ROUTINGS = {
    "all": (lambda x, weight: True, 4, ["rms_norm", "materialize"]),
    "all_one_row": (lambda x, weight: True, 1, ["rms_norm", "materialize"]),
    "narrow": (
        lambda x, weight: weight.shape[0] <= x.shape[1],
        4,
        ["rms_norm"] + ["materialize"] * 4,
    ),
    "wide": (
        lambda x, weight: weight.shape[0] > x.shape[1],
        4,
        ["rms_norm"] + ["fused_add_rms_norm"] * 4,
    ),
}


@pytest.mark.parametrize("routing", list(ROUTINGS))
def test_decode_through_fused_gemvs_matches_transformers(
    family: tuple[torch.nn.Module, LlamaForCausalLM], routing: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A decode step with the Linears that `routing` picks on the Triton GEMV (the interpreter on CPU),
    the rest on torch: the residual is added once and each norm applied once, where the routing puts
    them (ROUTINGS: the norm calls left, including the final norm before the logits rows are picked)."""
    from pagedlm.model import layers
    from pagedlm.ops import gemv as gemv_module
    from pagedlm.ops.gemv import gemv_triton

    hf_model, model = family
    takes_gemv, num_seqs, expected_norm_calls = ROUTINGS[routing]
    batch = prompts(model.config.vocab_size)[:num_seqs]
    cache = make_cache(model.config, len(batch), max(map(len, batch)), BLOCK_SIZE)
    with torch.no_grad():
        input_ids, positions, meta = make_step(cache, [(ids[:-1], 0) for ids in batch])
        model(input_ids, positions, cache.kv_caches, meta)  # the prompts but their last tokens
        monkeypatch.setattr(layers, "takes_gemv", takes_gemv)
        monkeypatch.setattr(gemv_module, "gemv", gemv_triton)
        norm_calls = []
        for module, name in (
            (layers.ops, "rms_norm"),
            (layers.ops, "fused_add_rms_norm"),
            (gemv_module, "rms_norm"),
        ):
            norm = getattr(module, name)
            label = "materialize" if module is gemv_module else name
            monkeypatch.setattr(
                module,
                name,
                lambda *args, norm=norm, label=label: norm_calls.append(label) or norm(*args),
            )
        input_ids, positions, meta = make_step(cache, [(ids[-1:], len(ids) - 1) for ids in batch])
        logits = model.compute_logits(model(input_ids, positions, cache.kv_caches, meta))
    assert norm_calls == expected_norm_calls
    for ids, got in zip(batch, logits, strict=True):
        assert (got - hf_logits(hf_model, ids)[-1]).abs().max() <= TOL, (
            f"prompt of {len(ids)} tokens"
        )


def test_inputs_embeds_replace_input_ids(family: tuple[torch.nn.Module, LlamaForCausalLM]) -> None:
    _, model = family
    ids = prompts(model.config.vocab_size)[0]
    cache = make_cache(model.config, 1, len(ids), BLOCK_SIZE)
    input_ids, positions, meta = make_step(cache, [(ids, 0)])
    with torch.no_grad():
        hidden = model(
            torch.zeros_like(input_ids),
            positions,
            cache.kv_caches,
            meta,
            inputs_embeds=model.embed_tokens(input_ids),
        )
    torch.testing.assert_close(model.compute_logits(hidden), ragged_logits(model, [ids])[0])


def test_sharded_checkpoint_loads(tmp_path: Path) -> None:
    hf_model = save_tiny_model(FAMILIES["llama"](), tmp_path, max_shard_size="40KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    assert len(list(tmp_path.glob("model-*.safetensors"))) > 1
    model = load_ours(tmp_path)
    ids = prompts(model.config.vocab_size)[0]
    assert (ragged_logits(model, [ids])[0] - hf_logits(hf_model, ids)).abs().max() <= TOL


def save_without(folder: Path, name: str) -> dict[str, torch.Tensor]:
    """A tiny Llama checkpoint in folder, minus tensor `name`; returns the tensors kept."""
    from safetensors.torch import load_file, save_file

    save_tiny_model(FAMILIES["llama"](), folder)
    tensors = load_file(folder / "model.safetensors")
    del tensors[name]
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    return tensors


def test_missing_tensor_is_named(tmp_path: Path) -> None:
    save_without(tmp_path, "model.layers.1.mlp.up_proj.weight")
    with pytest.raises(ValueError, match=r"model\.layers\.1\.mlp\.up_proj\.weight"):
        load_ours(tmp_path)


def test_missing_weight_file_is_named(tmp_path: Path) -> None:
    FAMILIES["llama"]().save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="model.safetensors"):
        load_ours(tmp_path)


def test_absent_lm_head_ties_to_embeddings(tmp_path: Path) -> None:
    tensors = save_without(tmp_path, "lm_head.weight")
    model = load_ours(tmp_path)
    assert torch.equal(model.lm_head.weight, tensors["model.embed_tokens.weight"])
