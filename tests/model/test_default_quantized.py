"""The default model on the CPU by default (bfloat16, its Q4_1 / Q8_0 blocks in the int4 / int8
kernels) against its exact float32 path (dtype="float32", equal to transformers)."""

from __future__ import annotations

import pytest
import torch
from paged_batch import make_cache, make_step

from pagedlm.attention.torch_ref import TorchAttentionBackend
from pagedlm.config import build_model_config
from pagedlm.model import LlamaForCausalLM, load_model
from pagedlm.model.quant_linear import DENSE_MIN_ROWS, Int4Matmul, Int8Matmul

pytest.importorskip("gguf")
pytestmark = pytest.mark.slow
CPU = torch.device("cpu")
PROMPT_IDS = [504, 3575, 282, 4649, 314]  # "The capital of France is"


def logits(model: LlamaForCausalLM, ids: list[int]) -> torch.Tensor:
    cache = make_cache(model.config, 1, len(ids), 16)
    input_ids, positions, meta = make_step(cache, [(ids, 0)])
    with torch.no_grad():
        return model.compute_logits(model(input_ids, positions, cache.kv_caches, meta))


@pytest.fixture(scope="module")
def models() -> tuple[LlamaForCausalLM, LlamaForCausalLM]:
    def build(dtype: str) -> LlamaForCausalLM:
        config = build_model_config(None, "auto", dtype, CPU, 512, True)
        return load_model(config, TorchAttentionBackend(), CPU)

    return build("float32"), build("auto")


def test_auto_loads_the_blocks_quantized(models) -> None:
    exact, quantized = models
    assert exact.config.dtype == torch.float32 and quantized.config.dtype == torch.bfloat16
    assert isinstance(quantized.model.layers[0].self_attn.qkv_proj.quant, Int4Matmul)
    assert isinstance(quantized.model.embed_tokens.quant, Int8Matmul)  # Q8_0, the tied LM head
    assert exact.model.layers[0].mlp.gate_up_proj.quant is None

    def resident_bytes(model: torch.nn.Module) -> int:
        tensors = [*model.parameters(), *model.buffers()]
        return sum(t.numel() * t.element_size() for t in tensors)

    # measured 538 MB in float32, 174 MB quantized: each int4 layer packed for its kernel and
    # two to a byte for the dense path (float32 scales and mins), the int8 table, bf16 norms
    assert resident_bytes(quantized) < resident_bytes(exact) / 3


def test_quantized_logits_are_close_to_float32(models) -> None:
    """Measured: the natural prompt max |diff| 0.68 (logits up to 27), every position's argmax
    equal; random-id prompts mean |diff| 0.17-0.44, cosine >= 0.99 (bfloat16 dense weights alone:
    0.14-0.20)."""
    exact, quantized = models
    want, got = logits(exact, PROMPT_IDS), logits(quantized, PROMPT_IDS)
    assert torch.equal(want.argmax(-1), got.argmax(-1))
    assert (want - got).abs().max() <= 1.5
    generator = torch.Generator().manual_seed(0)
    for _ in range(2):
        ids = torch.randint(100, 49152, (40,), generator=generator).tolist()
        want, got = logits(exact, ids), logits(quantized, ids)
        assert (want - got).abs().mean() <= 0.6
        assert torch.nn.functional.cosine_similarity(want, got, dim=-1).min() >= 0.98


def test_weight_updates_need_the_dense_path(models) -> None:
    from pagedlm.model.loader import update_weights

    _, quantized = models
    norm = quantized.model.norm.weight
    with pytest.raises(ValueError, match='dtype="float32"'):
        update_weights(quantized, [("model.norm.weight", torch.ones_like(norm))], "test")


def test_a_prefill_runs_in_float32_activations_and_stays_close(models) -> None:
    """From DENSE_MIN_ROWS rows on every matmul is a float32 GEMM of the dequantised weight, so
    the whole step carries float32 activations (no bfloat16 round trip a layer) up to the
    final norm. Measured: mean
    |diff| 0.12, cosine >= 0.998 a position against the float32 path."""
    exact, quantized = models
    ids = torch.randint(
        100, 49152, (DENSE_MIN_ROWS + 4,), generator=torch.Generator().manual_seed(1)
    )
    cache = make_cache(quantized.config, 1, len(ids), 16)
    input_ids, positions, meta = make_step(cache, [(ids.tolist(), 0)])
    with torch.no_grad():
        hidden = quantized(input_ids, positions, cache.kv_caches, meta)
    assert hidden.dtype == torch.bfloat16  # the model's, whatever the step ran in
    want, got = logits(exact, ids.tolist()), quantized.compute_logits(hidden)
    assert (want - got).abs().mean() <= 0.6
    assert torch.nn.functional.cosine_similarity(want, got, dim=-1).min() >= 0.98


def test_a_long_prompt_through_the_engine_matches_float32_greedy() -> None:
    """A prefill of DENSE_MIN_ROWS rows and more (float32 activations inside the model) through
    the worker's LM-head buffers (the model's dtype) and on into packed-kernel decode steps."""
    from pagedlm import LLM, SamplingParams

    ids = torch.randint(100, 49152, (300,), generator=torch.Generator().manual_seed(2)).tolist()
    params = SamplingParams(max_tokens=4, temperature=0)
    tokens = []
    for dtype in ("auto", "float32"):
        llm = LLM(dtype=dtype, max_model_len=512)
        tokens.append(llm.generate([{"prompt_token_ids": ids}], params)[0].outputs[0].token_ids)
        del llm
    assert len(tokens[0]) == 4 and tokens[0] == tokens[1]


def test_a_mixed_step_of_float32_activations_carries_decode_rows() -> None:
    """A step of DENSE_MIN_ROWS rows and more runs in float32 activations; when it also holds a
    decode row, that row's query meets the cache in its dtype (the CPU decode attention casts
    it): chunked prefill of an 800-token prompt beside a decoding short one."""
    from pagedlm import LLM, SamplingParams

    long_ids = torch.randint(100, 49152, (800,), generator=torch.Generator().manual_seed(3))
    prompts = [{"prompt_token_ids": PROMPT_IDS}, {"prompt_token_ids": long_ids.tolist()}]
    params = SamplingParams(max_tokens=8, temperature=0)
    llm = LLM(max_model_len=1024, max_num_batched_tokens=512)  # step 2: 1 decode + 296 rows
    together = llm.generate(prompts, params, use_tqdm=False)
    alone = llm.generate(prompts[:1], params, use_tqdm=False)
    assert [len(out.outputs[0].token_ids) for out in together] == [8, 8]
    assert together[0].outputs[0].token_ids == alone[0].outputs[0].token_ids
