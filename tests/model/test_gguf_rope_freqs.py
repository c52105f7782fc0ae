"""A Llama 3.1-style GGUF (llama3 RoPE scaling stored, as llama.cpp's convert_hf_to_gguf stores it, only as
the frequency factors `rope_freqs.weight`) against transformers on the equivalent HF checkpoint."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from test_hf_parity import LLAMA3_ROPE, SHAPE, TOL, hf_logits, ragged_logits, save_tiny_model
from transformers import LlamaConfig

from pagedlm.attention.torch_ref import TorchAttentionBackend
from pagedlm.config import build_model_config
from pagedlm.model import LlamaForCausalLM, load_model
from pagedlm.model.layers import rope_inv_freq

CPU = torch.device("cpu")
# ragged, with positions well past original_max_position_embeddings (32), below max_position_embeddings (64)
PROMPT_LENS = (45, 7, 60, 33)
# llama.cpp's names for the HF tensors (written out here, not taken from the loader under test)
GLOBAL_NAMES = {
    "model.embed_tokens": "token_embd",
    "model.norm": "output_norm",
    "lm_head": "output",
}
BLOCK_NAMES = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def gguf_name(hf_name: str) -> str:
    module, _, leaf = hf_name.rpartition(".")
    if module in GLOBAL_NAMES:
        return f"{GLOBAL_NAMES[module]}.{leaf}"
    _, _, layer, block_module = module.split(".", 3)  # model.layers.<i>.<block_module>
    return f"blk.{layer}.{BLOCK_NAMES[block_module]}.{leaf}"


def llama_cpp_permute(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """convert_hf_to_gguf's q/k row order (the two rotary halves of each head interleaved)."""
    rows = weight.shape[0]
    return (
        weight.reshape(num_heads, 2, rows // num_heads // 2, *weight.shape[1:])
        .swapaxes(1, 2)
        .reshape(weight.shape)
    )


def llama3_factors(hf_model: torch.nn.Module) -> torch.Tensor:
    """[head_dim // 2] factors by which transformers' llama3 rule divides each plain frequency."""
    config = hf_model.config
    head_dim = config.hidden_size // config.num_attention_heads
    theta = config.rope_parameters["rope_theta"]
    plain = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    return plain / hf_model.model.rotary_emb.inv_freq.float()


def write_gguf(hf_model: torch.nn.Module, path: Path, rope_freqs: torch.Tensor | None) -> None:
    """The HF model as convert_hf_to_gguf writes a Llama 3.1: float32 tensors, no RoPE scaling metadata,
    the scaling only in `rope_freqs.weight` (omitted if rope_freqs is None)."""
    import gguf

    config = hf_model.config
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_rope_dimension_count(config.hidden_size // config.num_attention_heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_freq_base(config.rope_parameters["rope_theta"])
    writer.add_vocab_size(config.vocab_size)
    if rope_freqs is not None:
        writer.add_tensor("rope_freqs.weight", rope_freqs.numpy().astype(np.float32))
    for name, tensor in hf_model.state_dict().items():
        data = tensor.detach().float().numpy()
        if ".q_proj." in name:
            data = llama_cpp_permute(data, config.num_attention_heads)
        elif ".k_proj." in name:
            data = llama_cpp_permute(data, config.num_key_value_heads)
        writer.add_tensor(gguf_name(name), np.ascontiguousarray(data))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def load_gguf(path: Path) -> LlamaForCausalLM:
    config = build_model_config(str(path), "auto", "float32", CPU, None, True)
    assert config.load_format == "gguf"
    # transformers' GGUF config reader gives llama no rope_scaling: the factors alone carry it
    assert config.rope_scaling is None
    return load_model(config, TorchAttentionBackend(), CPU)


@pytest.fixture(scope="module")
def hf_llama3(tmp_path_factory: pytest.TempPathFactory) -> torch.nn.Module:
    return save_tiny_model(
        LlamaConfig(**SHAPE, rope_scaling=LLAMA3_ROPE), tmp_path_factory.mktemp("hf")
    )


def max_logit_diff(model: LlamaForCausalLM, hf_model: torch.nn.Module) -> float:
    gen = torch.Generator().manual_seed(2)
    batch = [
        torch.randint(model.config.vocab_size, (n,), generator=gen).tolist() for n in PROMPT_LENS
    ]
    assert max(PROMPT_LENS) > LLAMA3_ROPE["original_max_position_embeddings"]
    diffs = [
        (got - hf_logits(hf_model, ids)).abs().max()
        for ids, got in zip(batch, ragged_logits(model, batch), strict=True)
    ]
    return float(max(diffs))


def test_factors_cover_all_three_llama3_regimes(hf_llama3: torch.nn.Module) -> None:
    factors = llama3_factors(hf_llama3)
    assert factors.shape == (8,)
    torch.testing.assert_close(factors[0], torch.tensor(1.0))  # short wavelength: kept
    torch.testing.assert_close(
        factors[2:], torch.full((6,), LLAMA3_ROPE["factor"])
    )  # long: divided
    assert 1.0 < factors[1] < LLAMA3_ROPE["factor"]  # blended


def test_gguf_with_rope_freqs_matches_transformers_llama3(
    hf_llama3: torch.nn.Module, tmp_path: Path
) -> None:
    path = tmp_path / "llama31.gguf"
    write_gguf(hf_llama3, path, llama3_factors(hf_llama3))
    assert max_logit_diff(load_gguf(path), hf_llama3) <= TOL


@pytest.mark.parametrize("rope_freqs", ["ones", "absent"])
def test_plain_rope_differs_materially(
    hf_llama3: torch.nn.Module, tmp_path: Path, rope_freqs: str
) -> None:
    """What the loader did before reading rope_freqs: the parity test above cannot pass by accident."""
    path = tmp_path / "plain.gguf"
    write_gguf(hf_llama3, path, torch.ones(8) if rope_freqs == "ones" else None)
    assert max_logit_diff(load_gguf(path), hf_llama3) > 1000 * TOL


@pytest.mark.parametrize(
    "factors, message",
    [
        (torch.ones(4), r"rope_freqs\.weight.*4 factors.*head_dim 16 needs 8"),
        (
            torch.tensor([1.0, 2.0, 0.0, 8.0, 8.0, 8.0, 8.0, 8.0]),
            r"rope_freqs\.weight.*finite positive",
        ),
    ],
)
def test_bad_rope_freqs_are_named(
    hf_llama3: torch.nn.Module, tmp_path: Path, factors: torch.Tensor, message: str
) -> None:
    path = tmp_path / "bad.gguf"
    write_gguf(hf_llama3, path, factors)
    with pytest.raises(ValueError, match=message):
        load_gguf(path)


def test_claimed_rope_scaling_must_agree_with_factors(hf_llama3: torch.nn.Module) -> None:
    factors = llama3_factors(hf_llama3)
    theta = hf_llama3.config.rope_parameters["rope_theta"]
    # the same llama3 scaling claimed twice is applied once
    torch.testing.assert_close(
        rope_inv_freq(16, theta, LLAMA3_ROPE, factors),
        hf_llama3.model.rotary_emb.inv_freq.float(),
        rtol=1e-6,
        atol=0,
    )
    with pytest.raises(ValueError, match="rope_scaling.*linear.*rope_freqs"):
        rope_inv_freq(16, theta, {"rope_type": "linear", "factor": 8.0}, factors)


def test_a_safetensors_model_loads_without_the_gguf_package(
    hf_llama3: torch.nn.Module, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The GPU machine has no gguf package: a safetensors model must never import it (the GPU suite
    caught gguf_rope_freqs importing it for every model)."""
    import sys

    hf_llama3.save_pretrained(tmp_path, safe_serialization=True)
    monkeypatch.setitem(sys.modules, "gguf", None)  # `import gguf` raises ImportError
    config = build_model_config(str(tmp_path), "auto", "float32", torch.device("cpu"), 64, True)
    model = load_model(config, TorchAttentionBackend(), torch.device("cpu"))
    assert model.config.gguf_file is None


def test_one_parse_of_the_file_per_load(
    hf_llama3: torch.nn.Module, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The model's build (rope_freqs) and its weights read one parse of the GGUF file (~2 s for the
    default model's), released once loaded, also when the load fails. (transformers parses it again for
    the config, before.)"""
    import gguf

    from pagedlm.model import gguf_loader

    parses = []
    parse = gguf.GGUFReader
    path = tmp_path / "llama31.gguf"
    write_gguf(hf_llama3, path, llama3_factors(hf_llama3))
    config = build_model_config(str(path), "auto", "float32", CPU, None, True)
    monkeypatch.setattr(gguf, "GGUFReader", lambda name: parses.append(name) or parse(name))
    load_model(config, TorchAttentionBackend(), CPU)
    assert parses == [str(path.resolve())] and gguf_loader._parse.cache_info().currsize == 0
    write_gguf(
        hf_llama3, path, torch.ones(4)
    )  # the same path, now a bad file: parsed again, and released
    with pytest.raises(ValueError, match="4 factors"):
        load_model(config, TorchAttentionBackend(), CPU)
    assert parses == [str(path.resolve())] * 2 and gguf_loader._parse.cache_info().currsize == 0


def test_one_parse_spans_nest_and_restore(
    hf_llama3: torch.nn.Module, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A span opened inside another shares its parse (no second patch, no recursion); at the outer
    exit gguf.GGUFReader is the constructor it was and the parse is released."""
    import gguf

    from pagedlm.model import gguf_loader

    path = tmp_path / "llama31.gguf"
    write_gguf(hf_llama3, path, llama3_factors(hf_llama3))
    parses = []
    parse = gguf.GGUFReader
    counting = lambda name: parses.append(name) or parse(name)  # noqa: E731
    monkeypatch.setattr(gguf, "GGUFReader", counting)
    with gguf_loader.one_parse(None):
        with gguf_loader.one_parse(str(path)):
            first = gguf.GGUFReader(path)
        assert gguf.GGUFReader(str(path)) is first and gguf_loader.reader(str(path)) is first
    assert parses == [str(path.resolve())] and gguf.GGUFReader is counting
    assert gguf_loader._parse.cache_info().currsize == 0
