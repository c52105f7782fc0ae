"""Model loading and the offline API on bad or unusual input. Config
variants not covered by test_hf_parity (linear RoPE, Qwen2 layers mixing sliding and full attention)
match transformers; bad input (an unknown device, an extra checkpoint tensor, a GGUF tensor type the
dequantiser lacks, chat_template_kwargs overriding a template argument) gets a ValueError naming the
parameter, or is honoured as vLLM does."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file
from test_hf_parity import SHAPE, hf_logits, load_ours, prompts, ragged_logits, save_tiny_model
from transformers import LlamaConfig, Qwen2Config

from pagedlm.attention.torch_ref import TorchAttentionBackend
from pagedlm.cli import main
from pagedlm.config import EngineArgs, build_model_config
from pagedlm.model import load_model

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: tiny_hf_models
from tiny_hf_models import save_tiny_model_with_tokenizer  # noqa: E402

CPU = torch.device("cpu")
TOL = 1e-4
VARIANTS = {
    "llama_linear_rope": lambda: LlamaConfig(
        **SHAPE, rope_scaling={"rope_type": "linear", "factor": 4.0}
    ),
    # layer_types [full, sliding]: only layer 1 has the window of 4 (shorter than the prompts)
    "qwen2_mixed_layer_types": lambda: Qwen2Config(
        **SHAPE, use_sliding_window=True, sliding_window=4, max_window_layers=1
    ),
    # a sliding_window key in a Llama config.json: transformers' Llama attends to every key anyway
    "llama_ignores_sliding_window": lambda: LlamaConfig(**SHAPE, sliding_window=4),
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_config_variant_matches_transformers(variant: str, tmp_path: Path) -> None:
    hf_model = save_tiny_model(VARIANTS[variant](), tmp_path)
    model = load_ours(tmp_path)
    batch = prompts(model.config.vocab_size)
    for ids, got in zip(batch, ragged_logits(model, batch), strict=True):
        assert (got - hf_logits(hf_model, ids)).abs().max() <= TOL, f"prompt of {len(ids)} tokens"


def test_extra_checkpoint_tensor_is_named(tmp_path: Path) -> None:
    """A q_proj bias the config does not describe (attention_bias False) must not vanish silently."""
    save_tiny_model(LlamaConfig(**SHAPE), tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    tensors["model.layers.0.self_attn.q_proj.bias"] = torch.randn(SHAPE["hidden_size"])
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"model\.layers\.0\.self_attn\.q_proj\.bias"):
        load_ours(tmp_path)


def test_unknown_device_is_a_value_error_naming_device() -> None:
    with pytest.raises(ValueError, match="device"):
        EngineArgs(device="foo").create_engine_config()


def test_cli_unknown_device_exits_with_an_error_not_a_traceback(
    capsys: pytest.CaptureFixture,
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["generate", "--device", "foo", "hi"])
    assert exited.value.code == 2
    assert "pagedlm: error:" in capsys.readouterr().err


def _write_tiny_llama_gguf(path: Path, float64_tensor: str | None) -> None:
    """A one-layer llama GGUF of float32 tensors, `float64_tensor` stored as F64."""
    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(1)
    writer.add_context_length(64)
    writer.add_embedding_length(16)
    writer.add_feed_forward_length(32)
    writer.add_head_count(2)
    writer.add_head_count_kv(1)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(10000.0)
    writer.add_vocab_size(32)
    shapes = {
        "token_embd.weight": (32, 16),
        "output_norm.weight": (16,),
        "output.weight": (32, 16),
        "blk.0.attn_norm.weight": (16,),
        "blk.0.ffn_norm.weight": (16,),
        "blk.0.attn_q.weight": (16, 16),
        "blk.0.attn_k.weight": (8, 16),
        "blk.0.attn_v.weight": (8, 16),
        "blk.0.attn_output.weight": (16, 16),
        "blk.0.ffn_gate.weight": (32, 16),
        "blk.0.ffn_up.weight": (32, 16),
        "blk.0.ffn_down.weight": (16, 32),
    }
    rng = np.random.default_rng(0)
    for name, shape in shapes.items():
        dtype = np.float64 if name == float64_tensor else np.float32
        writer.add_tensor(name, rng.standard_normal(shape).astype(dtype))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_gguf_tensor_type_without_dequantiser_is_named(tmp_path: Path) -> None:
    path = tmp_path / "tiny.gguf"
    _write_tiny_llama_gguf(path, float64_tensor="blk.0.ffn_up.weight")
    config = build_model_config(str(path), "auto", "float32", CPU, 32, True)
    with pytest.raises(ValueError, match=r"blk\.0\.ffn_up\.weight.*F64"):
        load_model(config, TorchAttentionBackend(), CPU)


def test_chat_template_kwargs_override_add_generation_prompt(tmp_path: Path) -> None:
    """vLLM merges chat_template_kwargs over its defaults (add_generation_prompt among them)."""
    from pagedlm import LLM, SamplingParams

    save_tiny_model_with_tokenizer(tmp_path)
    llm = LLM(
        str(tmp_path), dtype="float32", device="cpu", num_gpu_blocks_override=16, max_model_len=64
    )
    conversation = [{"role": "user", "content": "hello"}]
    (output,) = llm.chat(
        conversation,
        SamplingParams(temperature=0.0, max_tokens=1),
        use_tqdm=False,
        chat_template_kwargs={"add_generation_prompt": False},
    )
    assert output.prompt == "user: hello\n"


@pytest.mark.parametrize("variant, limit", [("plain", 64), ("llama_linear_rope", 256)])
def test_max_model_len_above_the_models_maximum_is_refused(
    variant: str, limit: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM refuses a max_model_len past max_position_embeddings (times a linear RoPE factor) unless
    its environment variable allows it; None takes max_position_embeddings."""
    config = LlamaConfig(**SHAPE) if variant == "plain" else VARIANTS[variant]()
    save_tiny_model(config, tmp_path)
    assert config.max_position_embeddings == 64
    monkeypatch.delenv("PAGEDLM_ALLOW_LONG_MAX_MODEL_LEN", raising=False)
    assert build_model_config(str(tmp_path), "auto", "float32", CPU, None, True).max_model_len == 64
    assert (
        build_model_config(str(tmp_path), "auto", "float32", CPU, limit, True).max_model_len
        == limit
    )
    with pytest.raises(
        ValueError,
        match=rf"max_model_len \({limit + 1}\) is greater than the model's maximum, "
        rf"{limit} \(max_position_embeddings 64.*PAGEDLM_ALLOW_LONG_MAX_MODEL_LEN=1",
    ):
        build_model_config(str(tmp_path), "auto", "float32", CPU, limit + 1, True)
    monkeypatch.setenv("PAGEDLM_ALLOW_LONG_MAX_MODEL_LEN", "1")
    assert (
        build_model_config(str(tmp_path), "auto", "float32", CPU, limit + 1, True).max_model_len
        == limit + 1
    )
