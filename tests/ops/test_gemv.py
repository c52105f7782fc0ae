"""The small-batch GEMV (pagedlm/ops/gemv.py): the Triton kernel (interpreter on CPU) and the torch
fallback against a float64 torch reference on fresh random inputs, fresh tensors poisoned with NaN."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
import triton

from pagedlm.ops import gemv as gemv_mod
from pagedlm.ops.gemv import GemvConfig, PendingNorm, ResidualSum, gemv, gemv_torch, gemv_triton
from pagedlm.ops.norm import rms_norm_torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOL = {
    torch.float32: dict(atol=1e-4, rtol=1e-4),
    torch.float16: dict(atol=2e-2, rtol=2e-2),
    torch.bfloat16: dict(atol=6e-2, rtol=3e-2),
}
# N=45 and K=100 are multiples of neither block size. K=100 in chunks of 16 is 7 chunks, the last partial:
# split_k=3 launches slices of 3, 3 and 1 chunks; split_k=8 launches 7 slices of one chunk.
CONFIGS = {
    "fma": GemvConfig(block_n=16, block_k=32, num_warps=1),
    "fma-split": GemvConfig(block_n=16, block_k=16, split_k=3, num_warps=2),
    "dot": GemvConfig(block_n=16, block_k=32, use_dot=True),
    "dot-split": GemvConfig(block_n=32, block_k=16, split_k=8, use_dot=True),
}


def make_inputs(
    num_rows: int, n: int, k: int, dtype: torch.dtype, act: str | None, with_bias: bool
):
    x = torch.randn(num_rows, 2 * k if act else k, device=DEVICE).to(dtype)
    weight = (torch.randn(n, k, device=DEVICE) / math.sqrt(k)).to(dtype)
    bias = torch.randn(n, device=DEVICE).to(dtype) if with_bias else None
    return x, weight, bias


def reference(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, act: str | None
) -> torch.Tensor:
    """float64 product; the silu_and_mul input is rounded to x's dtype first, as the fused prologue does."""
    if act:
        gate, up = x.double().chunk(2, dim=-1)
        x = (F.silu(gate) * up).to(x.dtype)
    out = x.double() @ weight.double().T
    return out if bias is None else out + bias.double()


def check(
    out: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    act: str | None,
) -> None:
    assert out.dtype == x.dtype and out.shape == (x.shape[0], weight.shape[0])
    assert not out.isnan().any()
    torch.testing.assert_close(out.double(), reference(x, weight, bias, act), **TOL[x.dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("num_rows", [1, 3, 8])
@pytest.mark.parametrize("config_name", list(CONFIGS))
def test_gemv_triton(dtype: torch.dtype, num_rows: int, config_name: str) -> None:
    x, weight, bias = make_inputs(num_rows, 45, 100, dtype, act=None, with_bias=num_rows != 3)
    check(gemv_triton(x, weight, bias, config=CONFIGS[config_name]), x, weight, bias, None)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("config_name", ["fma", "dot-split"])
def test_gemv_triton_silu_and_mul(dtype: torch.dtype, config_name: str) -> None:
    x, weight, bias = make_inputs(3, 45, 100, dtype, act="silu_and_mul", with_bias=True)
    x = 3 * x  # gates well into silu's curved part
    check(
        gemv_triton(x, weight, bias, act="silu_and_mul", config=CONFIGS[config_name]),
        x,
        weight,
        bias,
        "silu_and_mul",
    )


@pytest.mark.parametrize("config_name", ["fma", "dot"])
def test_gemv_silu_and_mul_rounds_before_the_product(config_name: str) -> None:
    """K=1 makes every step exact but the roundings: y = fp16(fp16(silu(gate) * up) * w) bit for bit,
    which an fp32 product of the unrounded activation misses on some elements."""
    x = 4 * torch.randn(8, 2, device=DEVICE).half()
    weight = torch.randint(-2048, 2048, (64, 1), device=DEVICE).half() / 64
    out = gemv_triton(x, weight, act="silu_and_mul", config=CONFIGS[config_name])
    expected = reference(x, weight, None, "silu_and_mul").half()
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("num_rows", [1, 3])
@pytest.mark.parametrize("config_name", list(CONFIGS))
def test_gemv_residual_epilogue(dtype: torch.dtype, num_rows: int, config_name: str) -> None:
    """h = round(round(x @ W.T + b) + residual), and sumsq [M, row blocks] adds up to each row's sum of
    h**2 (rows of the last, partial block past N contribute nothing)."""
    x, weight, bias = make_inputs(num_rows, 45, 100, dtype, act=None, with_bias=True)
    residual = torch.randn(num_rows, 45, device=DEVICE).to(dtype)
    config = CONFIGS[config_name]
    result = gemv_triton(x, weight, bias, residual=residual, config=config)
    assert isinstance(result, ResidualSum) and result.h.dtype == dtype
    assert result.sumsq.shape == (num_rows, triton.cdiv(45, config.block_n))
    y = gemv_triton(x, weight, bias, config=config)  # the same product, rounded once
    torch.testing.assert_close(result.h, y + residual, rtol=0, atol=0)
    torch.testing.assert_close(
        result.sumsq.sum(1), result.h.float().square().sum(1), rtol=1e-5, atol=1e-5
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("num_rows", [1, 3])
@pytest.mark.parametrize("config_name", list(CONFIGS))
def test_gemv_norm_prologue(dtype: torch.dtype, num_rows: int, config_name: str) -> None:
    """x = PendingNorm(h, sumsq from a residual epilogue): the product of rms_norm_torch(h) * weight,
    to the rounding of an rstd summed in another order."""
    h_in, first_weight, _ = make_inputs(num_rows, 100, 60, dtype, act=None, with_bias=False)
    residual = torch.randn(num_rows, 100, device=DEVICE).to(dtype)
    summed = gemv_triton(
        h_in, first_weight, residual=residual, config=CONFIGS["fma-split"]
    )  # 7 parts
    norm_weight = (1 + torch.randn(100, device=DEVICE) / 4).to(dtype)
    pending = PendingNorm(summed.h, summed.sumsq, norm_weight, 1e-5)
    _, weight, bias = make_inputs(num_rows, 45, 100, dtype, act=None, with_bias=True)
    out = gemv_triton(pending, weight, bias, config=CONFIGS[config_name])
    check(out, rms_norm_torch(summed.h, norm_weight, 1e-5), weight, bias, None)
    torch.testing.assert_close(out, gemv_torch(pending, weight, bias), **TOL[dtype])


def test_gemv_norm_prologue_rounds_like_rms_norm() -> None:
    """K-wide rows of exact fp16 values and one part: the normalised x is fp16(fp16(h * rstd) * w) bit for
    bit (a product with unit weights reads it back), as rms_norm_torch rounds it."""
    h = torch.randint(-64, 64, (2, 64), device=DEVICE).half() / 8
    sumsq = h.float().square().sum(1, keepdim=True)  # exact: small integers / 64
    norm_weight = 1 + torch.randint(-16, 16, (64,), device=DEVICE).half() / 32
    eye = torch.eye(64, device=DEVICE).half()
    for config in (CONFIGS["fma"], CONFIGS["dot"]):
        out = gemv_triton(PendingNorm(h, sumsq, norm_weight, 1e-6), eye, config=config)
        torch.testing.assert_close(out, rms_norm_torch(h, norm_weight, 1e-6), rtol=0, atol=0)


def test_gemv_residual_and_norm_torch_fallback() -> None:
    x, weight, bias = make_inputs(2, 24, 40, torch.float32, act=None, with_bias=True)
    residual = torch.randn(2, 24, device=DEVICE)
    result = gemv_torch(x, weight, bias, residual=residual)
    want = reference(x, weight, bias, None) + residual.double()
    torch.testing.assert_close(result.h.double(), want, **TOL[torch.float32])
    torch.testing.assert_close(result.sumsq[:, 0], result.h.square().sum(1))
    pending = PendingNorm(result.h, result.sumsq, torch.ones(24, device=DEVICE), 1e-6)
    torch.testing.assert_close(
        pending.materialize(), rms_norm_torch(result.h, pending.weight, 1e-6)
    )


@pytest.mark.parametrize("impl", [gemv_triton, gemv_torch])
def test_gemv_rejects_bad_residual_and_norm(impl) -> None:
    x, weight = torch.randn(2, 16, device=DEVICE), torch.randn(8, 16, device=DEVICE)
    sumsq = torch.ones(2, 3, device=DEVICE)
    with pytest.raises(ValueError, match="residual must be \\[2, 8\\]"):
        impl(x, weight, residual=torch.randn(2, 16, device=DEVICE))
    with pytest.raises(ValueError, match="with out_dtype None"):
        impl(x, weight, residual=torch.randn(2, 8, device=DEVICE), out_dtype=torch.float16)
    with pytest.raises(ValueError, match="PendingNorm.sumsq must be"):
        impl(PendingNorm(x, sumsq.double(), torch.ones(16, device=DEVICE), 1e-6), weight)
    with pytest.raises(ValueError, match="PendingNorm.weight must be \\[16\\]"):
        impl(PendingNorm(x, sumsq, torch.ones(8, device=DEVICE), 1e-6), weight)
    with pytest.raises(ValueError, match="act must be None"):
        impl(
            PendingNorm(x, sumsq, torch.ones(16, device=DEVICE), 1e-6),
            torch.randn(8, 8, device=DEVICE),
            act="silu_and_mul",
        )


def test_gemv_triton_strided_views() -> None:
    """x and weight as row-strided views (x with a column stride too) are read where they lie."""
    x_big = torch.randn(8, 3, 70, device=DEVICE)
    x = x_big[::2, 1, 3:67]  # [4, 64]: row stride 420
    weight = torch.randn(30, 80, device=DEVICE)[:, 8:72]  # [30, 64]: row stride 80
    for config in (CONFIGS["fma"], CONFIGS["dot-split"]):
        check(gemv_triton(x, weight, config=config), x, weight, None, None)
    check(gemv_triton(x.T.contiguous().T, weight), x, weight, None, None)  # column-major x


@pytest.mark.parametrize(
    "num_rows, n, k",
    [
        (1, 20, 1000),
        (1, 20, 1500),
        (1, 20, 5000),  # one warp, all of K; 4 warps, all of K; long K (split)
        (2, 20, 1500),
        (5, 20, 1500),
        (8, 20, 1500),  # tl.dot, split K (few N tiles)
    ],
)
def test_gemv_default_config(num_rows: int, n: int, k: int) -> None:
    """The default launch rule (FMA for small M, tl.dot above) is correct on each of its branches."""
    x, weight, bias = make_inputs(num_rows, n, k, torch.float16, act=None, with_bias=True)
    config = gemv_mod.default_config(num_rows, n, k, torch.float16)
    num_slices = gemv_mod.launch_split_k(k, config)[0]
    assert num_slices == 1 if num_rows == 1 and k <= gemv_mod.WHOLE_K_MAX else num_slices > 1
    check(gemv_triton(x, weight, bias), x, weight, bias, None)


def test_launch_split_k_covers_k_without_empty_slices() -> None:
    for k in (1, 15, 16, 100, 1000):
        for split_k in (1, 3, 8, 64):
            config = GemvConfig(block_n=8, block_k=16, split_k=split_k)
            num_splits, k_per_split = gemv_mod.launch_split_k(k, config)
            assert k_per_split % 16 == 0 and 1 <= num_splits <= split_k
            assert (num_splits - 1) * k_per_split < k <= num_splits * k_per_split


@pytest.mark.parametrize("impl", [gemv_triton, gemv_torch])
def test_gemv_float32_output(impl) -> None:
    """out_dtype=float32 (the LM head's logits): the product is not rounded to x's dtype on the way."""
    x, weight, _ = make_inputs(2, 45, 100, torch.float16, act=None, with_bias=False)
    kwargs = {"config": CONFIGS["fma-split"]} if impl is gemv_triton else {}
    y = impl(x, weight, out_dtype=torch.float32, **kwargs)
    assert y.dtype == torch.float32
    torch.testing.assert_close(y.double(), reference(x, weight, None, None), atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError, match="out_dtype must be a float dtype"):
        impl(x, weight, out_dtype=torch.int32, **kwargs)


@pytest.mark.parametrize(
    "num_rows, n, k, takes_gemv",
    [
        (1, 6144, 4096, True),
        (1, 28672, 4096, True),
        (1, 128256, 4096, True),  # llama3-8b qkv, gate_up, LM head
        (1, 4096, 14336, True),
        (1, 8192, 28672, False),  # down_proj: llama3-8b's (K <= MAX_FMA_K), 70b's
        (4, 4096, 1024, False),
        (4, 1024, 3072, True),  # M > 1: narrow outputs only
        (9, 1024, 2048, False),  # more rows than MAX_M
    ],
)
def test_prefer_gemv_follows_the_measured_rule(
    num_rows: int, n: int, k: int, takes_gemv: bool
) -> None:
    assert gemv_mod.prefer_gemv(num_rows, n, k) == takes_gemv


@pytest.mark.parametrize(
    "n, k, split_k, block_n, num_warps",
    [
        # llama3-8b (streamed): qkv, o_proj, gate_up, LM head, down_proj (K = 14,336): 8 x 1024 over 4 warps
        (6144, 4096, 1, 8, 4),
        (4096, 4096, 1, 8, 4),
        (28672, 4096, 1, 8, 4),
        (128256, 4096, 1, 8, 4),
        (4096, 14336, 1, 8, 4),
        (256, 14336, 7, 8, 4),  # ... K split only for a narrow output
        # qwen3-0.6b (every weight <= PRELOAD_MAX_BYTES): all of K in one program
        (4096, 1024, 1, 4, 1),
        (6144, 1024, 1, 4, 1),  # qkv, gate_up: one warp, 4 x 1024
        (1024, 2048, 1, 8, 4),
        (1024, 3072, 1, 4, 4),  # o_proj 8 x 2048, down_proj 4 x 4096 over 4 warps
    ],
)
def test_default_config_at_one_row(
    n: int, k: int, split_k: int, block_n: int, num_warps: int
) -> None:
    config = gemv_mod.default_config(1, n, k, torch.bfloat16)
    assert gemv_mod.launch_split_k(k, config)[0] == split_k
    assert (config.block_n, config.num_warps) == (block_n, num_warps)
    assert (
        config.block_k % (config.num_warps * 32 * 8) == 0
    )  # the warps side by side along K, 16-byte vectors


@pytest.mark.parametrize(
    "n, k, dtype",
    [
        (4096, 1024, torch.bfloat16),
        (1024, 2048, torch.bfloat16),
        (6144, 1024, torch.bfloat16),  # qwen3-0.6b
        (1024, 3072, torch.bfloat16),
        (64, 100, torch.float32),
        (64, 3000, torch.float32),
    ],
)
def test_small_weights_are_read_whole_before_the_wait_at_one_row(
    n: int, k: int, dtype: torch.dtype
) -> None:
    """Each program's slice of K is one tile, all of K, which the kernel reads before its PDL wait."""
    config = gemv_mod.default_config(1, n, k, dtype)
    assert gemv_mod.launch_split_k(k, config) == (1, config.block_k) and config.block_k >= k


@pytest.mark.parametrize("config_name", ["fma-split", "dot-split"])
def test_split_k_sum_resets_its_counters(config_name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The last slice of a row block sums the partials and zeroes the block's counter: a second
    call (which sums only when its counters reach split_k - 1) gives the same bits, and every
    counter ends at zero."""
    from pagedlm.ops import counters
    from pagedlm.ops.counters import zeroed_counters

    monkeypatch.setattr(counters, "_buffers", {})  # a fresh buffer, whatever ran before
    x, weight, bias = make_inputs(2, 45, 100, torch.float16, act=None, with_bias=True)
    first = gemv_triton(x, weight, bias, config=CONFIGS[config_name])
    second = gemv_triton(x, weight, bias, config=CONFIGS[config_name])
    check(first, x, weight, bias, None)
    assert torch.equal(first, second)
    assert not zeroed_counters(x.device, 0).any()


@pytest.mark.parametrize("act", [None, "silu_and_mul"])
def test_gemv_dispatch_and_torch_fallback(act: str | None) -> None:
    """On CPU gemv is the torch fallback (silu_and_mul_torch then F.linear); on CUDA, the kernel."""
    x, weight, bias = make_inputs(2, 24, 40, torch.float32, act, with_bias=True)
    out = gemv(x, weight, bias, act=act)
    check(out, x, weight, bias, act)
    expected = (gemv_triton if x.is_cuda else gemv_torch)(x, weight, bias, act=act)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


@pytest.mark.parametrize("impl", [gemv_triton, gemv_torch])
def test_gemv_rejects_bad_input(impl) -> None:
    x, weight = torch.randn(2, 16, device=DEVICE), torch.randn(8, 16, device=DEVICE)
    bad_calls = {
        "M": (torch.randn(gemv_mod.MAX_M + 1, 16, device=DEVICE), weight, None, None),
        "x must be": (torch.randn(16, device=DEVICE), weight, None, None),
        "last dim must be 16": (torch.randn(2, 12, device=DEVICE), weight, None, None),
        "last dim must be 32": (x, weight, None, "silu_and_mul"),
        "act must be": (x, weight, None, "gelu"),
        "bias must be": (x, weight, torch.randn(7, device=DEVICE), None),
        "weight's dtype": (x, weight.half(), None, None),
        "unit stride": (x, torch.randn(16, 8, device=DEVICE).T, None, None),
        "N, K >= 1": (x, torch.randn(0, 16, device=DEVICE), None, None),
    }
    for message, (x_bad, weight_bad, bias_bad, act) in bad_calls.items():
        with pytest.raises(ValueError, match=message):
            impl(x_bad, weight_bad, bias_bad, act=act)


def test_gemv_config_rejects_bad_values() -> None:
    with pytest.raises(ValueError, match="block_n"):
        GemvConfig(block_n=12, block_k=32)
    with pytest.raises(ValueError, match="split_k"):
        GemvConfig(block_n=8, block_k=32, split_k=0)
    with pytest.raises(ValueError, match=">= 16 with use_dot"):
        GemvConfig(block_n=8, block_k=32, use_dot=True)


@pytest.mark.gpu
@pytest.mark.parametrize("num_rows", [1, 3, 8])
@pytest.mark.parametrize("act", [None, "silu_and_mul"])
def test_gemv_bf16_cuda(num_rows: int, act: str | None) -> None:
    """The real kernel in bf16 on every config kind and the default one, against fp32 torch."""
    n, k = 1000, 3000
    x, weight, bias = make_inputs(num_rows, n, k, torch.bfloat16, act, with_bias=True)
    for config in [
        None,
        *CONFIGS.values(),
        GemvConfig(block_n=64, block_k=128, split_k=8, use_dot=True),
    ]:
        out = gemv_triton(x, weight, bias, act=act, config=config)
        x_in = gemv_mod.silu_and_mul_torch(x) if act else x
        expected = F.linear(x_in.float(), weight.float(), bias.float())
        assert out.dtype == torch.bfloat16 and not out.isnan().any()
        torch.testing.assert_close(out.float(), expected, **TOL[torch.bfloat16])


@pytest.mark.gpu
@pytest.mark.parametrize("num_rows", [1, 3, 8])
def test_gemv_residual_then_norm_bf16_cuda(num_rows: int) -> None:
    """A decoder layer's o_proj -> norm -> gate_up at qwen3-0.6b's shape with the default configs (split
    K, FMA at one row, tl.dot above), in bf16: the residual epilogue and the norm prologue against the
    fp32 torch of the unfused ops, rounded where they round."""
    attn, o_weight, _ = make_inputs(num_rows, 1024, 2048, torch.bfloat16, act=None, with_bias=False)
    residual = torch.randn(num_rows, 1024, device=DEVICE).to(torch.bfloat16)
    norm_weight = (1 + torch.randn(1024, device=DEVICE) / 4).to(torch.bfloat16)
    _, up_weight, _ = make_inputs(num_rows, 6144, 1024, torch.bfloat16, act=None, with_bias=False)
    summed = gemv_triton(attn, o_weight, residual=residual)
    h = F.linear(attn.float(), o_weight.float()).to(torch.bfloat16) + residual
    torch.testing.assert_close(summed.h.float(), h.float(), **TOL[torch.bfloat16])
    torch.testing.assert_close(
        summed.sumsq.sum(1), summed.h.float().square().sum(1), rtol=1e-4, atol=1e-3
    )
    out = gemv_triton(PendingNorm(summed.h, summed.sumsq, norm_weight, 1e-6), up_weight)
    expected = F.linear(rms_norm_torch(summed.h, norm_weight, 1e-6).float(), up_weight.float())
    assert out.dtype == torch.bfloat16 and not out.isnan().any()
    torch.testing.assert_close(out.float(), expected, **TOL[torch.bfloat16])


@pytest.mark.gpu
def test_gemv_cuda_graph_replay_without_syncs() -> None:
    """Captured once (split K: partials summed by the last slice; fused silu), replayed on new inputs: equals eager."""
    x, weight, bias = make_inputs(4, 1000, 3000, torch.bfloat16, "silu_and_mul", with_bias=True)
    config = GemvConfig(block_n=64, block_k=128, split_k=8, use_dot=True)
    gemv_triton(x, weight, bias, act="silu_and_mul", config=config)  # compile outside the capture
    torch.cuda.set_sync_debug_mode("error")
    try:
        gemv_triton(x, weight, bias, act="silu_and_mul", config=config)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = gemv_triton(x, weight, bias, act="silu_and_mul", config=config)
    x.copy_(torch.randn_like(x))
    graph.replay()
    torch.testing.assert_close(
        out, gemv_triton(x, weight, bias, act="silu_and_mul", config=config), rtol=0, atol=0
    )
