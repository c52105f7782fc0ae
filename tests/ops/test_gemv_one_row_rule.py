"""The batch-1 GEMV rule: `default_config` at one row gives each program all of
K for its rows (several warps side by side along K), streams weights above PRELOAD_MAX_BYTES in 8 x 1024
tiles over 4 warps (K split only for narrow outputs), and MAX_FMA_K = 16384 sends llama3-8b's down_proj
to the GEMV. Each branch of the rule runs in the Triton interpreter (tests/ops/conftest.py poisons every
torch.empty with NaN) against a float64 reference; its invariants are checked over many shapes.

The interpreter runs a program as whole-tile numpy ops and ignores num_warps: these tests check the tiling,
masks, split-K slices and fusions of each branch's config, not the multi-warp layouts on the GPU
(tests/gpu/test_kernels_gpu.py)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
import triton
from test_gemv import reference  # the float64 product (silu_and_mul rounded to x's dtype first)

from pagedlm.model import layers
from pagedlm.ops import gemv as gemv_mod
from pagedlm.ops.activation import silu_and_mul_torch
from pagedlm.ops.gemv import (
    GemvConfig,
    PendingNorm,
    ResidualSum,
    default_config,
    gemv_torch,
    gemv_triton,
    launch_split_k,
)
from pagedlm.ops.norm import rms_norm_torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = (torch.float16, torch.bfloat16, torch.float32)
TOL = {
    torch.float32: dict(atol=1e-4, rtol=1e-4),
    torch.float16: dict(atol=2e-2, rtol=2e-2),
    torch.bfloat16: dict(atol=6e-2, rtol=3e-2),
}
BIG_N = 1 << 22  # a weight of this many rows is above PRELOAD_MAX_BYTES for every K and dtype here

# name -> (the shape default_config sees (n, k), the shape run (n, k), the branch it must pick).
# Streamed configs come from a shape too large to allocate and run on a small one: the config is the
# big shape's, the masks and loop bounds the small one's. N = 45 and 20 are multiples of no block_n.
CASES = {
    "preload, K < block_k": ((45, 100), (45, 100), "preload"),
    "preload, K = 1000 of 1024": ((45, 1000), (45, 1000), "preload"),
    "whole K, 1500 of 2048": ((45, 1500), (45, 1500), "whole_k"),
    "whole K, 4000 of 4096": ((20, 4000), (20, 4000), "whole_k"),
    "streamed, K < block_k": ((BIG_N, 100), (45, 100), "stream"),
    "streamed, 3 chunks, last partial": ((BIG_N, 3000), (45, 3000), "stream"),
    "streamed, split (small weight, K > WHOLE_K_MAX)": ((20, 5000), (20, 5000), "stream_split"),
    "streamed, split (narrow output of 32 MiB)": ((1024, 16384), (45, 1500), "stream_split"),
}


def branch(config: GemvConfig, n: int, k: int, dtype: torch.dtype) -> str:
    """Which of default_config's one-row branches config is, from its fields alone."""
    assert not config.use_dot and config.num_stages == 1
    num_slices = launch_split_k(k, config)[0]
    if config.block_n == gemv_mod.PRELOAD_BLOCK_N and config.num_warps == 1 and config.block_k >= k:
        return "preload"
    if (
        config.num_warps == gemv_mod.WHOLE_K_WARPS
        and config.block_k * config.block_n * dtype.itemsize == gemv_mod.WHOLE_K_TILE_BYTES
        and config.block_k >= k
    ):
        return "whole_k"
    assert (
        config.block_n == gemv_mod.STREAM_BLOCK_N and config.block_k <= gemv_mod.STREAM_BLOCK_K
    ), config
    return "stream" if num_slices == 1 else "stream_split"


def case_config(name: str, dtype: torch.dtype) -> tuple[GemvConfig, int, int]:
    """(the case's default config, after checking its branch on the run shape, run n, run k)."""
    (config_n, config_k), (n, k), expected = CASES[name]
    config = default_config(1, config_n, config_k, dtype)
    assert branch(config, config_n, config_k, dtype) == expected, config
    assert branch(config, n, k, dtype) == expected, (
        config,
        n,
        k,
    )  # the run keeps the branch's slicing
    return config, n, k


def make_inputs(
    n: int, k: int, dtype: torch.dtype, act: str | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [1, K] ([1, 2K] with act), weight [N, K] scaled to unit-size outputs, bias [N]."""
    x = torch.randn(1, 2 * k if act else k, device=DEVICE)
    x = (3 * x if act else x).to(dtype)  # gates well into silu's curved part
    weight = (torch.randn(n, k, device=DEVICE) / math.sqrt(k)).to(dtype)
    return x, weight, torch.randn(n, device=DEVICE).to(dtype)


def round_like_the_kernel(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """float32 t rounded to dtype as the kernel's .to() does: Triton 3.6's interpreter casts float32 to
    bfloat16 toward zero (interpreter.py cast_impl: _convert_float with no rounding mode), the GPU to
    nearest even."""
    if dtype == torch.bfloat16 and not t.is_cuda:
        return (
            (t.float().view(torch.int32) & ~0xFFFF).view(torch.float32).to(dtype)
        )  # exact: low bits zero
    return t.to(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", list(CASES))
def test_each_branch_with_bias(name: str, dtype: torch.dtype) -> None:
    config, n, k = case_config(name, dtype)
    x, weight, bias = make_inputs(n, k, dtype, act=None)
    out = gemv_triton(x, weight, bias, config=config)
    assert out.dtype == dtype and out.shape == (1, n) and not out.isnan().any()
    torch.testing.assert_close(out.double(), reference(x, weight, bias, None), **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", list(CASES))
def test_each_branch_silu_prologue_and_residual_epilogue(name: str, dtype: torch.dtype) -> None:
    """down_proj's launch: h = round(round(silu(gate) * up @ W.T) + residual), sumsq [1, row blocks]
    summing to the row's sum of h**2 (rows past N add nothing)."""
    config, n, k = case_config(name, dtype)
    x, weight, _ = make_inputs(n, k, dtype, act="silu_and_mul")
    residual = torch.randn(1, n, device=DEVICE).to(dtype)
    result = gemv_triton(x, weight, act="silu_and_mul", residual=residual, config=config)
    assert isinstance(result, ResidualSum) and result.h.dtype == dtype
    assert (
        result.sumsq.shape == (1, triton.cdiv(n, config.block_n)) and not result.sumsq.isnan().any()
    )
    y = gemv_triton(x, weight, act="silu_and_mul", config=config)  # the same product, rounded once
    want_h = round_like_the_kernel(y.float() + residual.float(), dtype)
    torch.testing.assert_close(result.h, want_h, rtol=0, atol=0)
    torch.testing.assert_close(y.double(), reference(x, weight, None, "silu_and_mul"), **TOL[dtype])
    want_sumsq = result.h.double().square().sum(1)
    torch.testing.assert_close(result.sumsq.double().sum(1), want_sumsq, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(
        result.h, gemv_torch(x, weight, act="silu_and_mul", residual=residual).h, **TOL[dtype]
    )


def stream_parts(h: torch.Tensor) -> torch.Tensor:
    """[1, cdiv(K, 8)] float32 partial sums of h**2 over 8 columns each, as a streamed residual epilogue
    (STREAM_BLOCK_N rows a program) leaves them: llama3-8b's next GEMV reads 512 such parts."""
    squares = F.pad(h.float().square(), (0, -h.shape[1] % gemv_mod.STREAM_BLOCK_N))
    return squares.view(h.shape[0], -1, gemv_mod.STREAM_BLOCK_N).sum(-1)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", list(CASES))
def test_each_branch_norm_prologue(name: str, dtype: torch.dtype) -> None:
    """x = PendingNorm(h, sumsq in cdiv(K, 8) parts): rms_norm_torch(h) * norm weight, then the product."""
    config, n, k = case_config(name, dtype)
    h = (2 * torch.randn(1, k, device=DEVICE)).to(dtype)
    norm_weight = (1 + torch.randn(k, device=DEVICE) / 4).to(dtype)
    pending = PendingNorm(h, stream_parts(h), norm_weight, 1e-5)
    _, weight, bias = make_inputs(n, k, dtype, act=None)
    out = gemv_triton(pending, weight, bias, config=config)
    assert not out.isnan().any()
    torch.testing.assert_close(
        out.double(),
        reference(rms_norm_torch(h, norm_weight, 1e-5), weight, bias, None),
        **TOL[dtype],
    )
    torch.testing.assert_close(out, gemv_torch(pending, weight, bias), **TOL[dtype])


def test_streamed_residual_epilogue_feeds_the_norm_prologue() -> None:
    """A streamed producer's sumsq (one part per 8 of its rows, the last partial) read by a NORM prologue."""
    dtype, hidden = torch.float16, 204
    x, producer, _ = make_inputs(hidden, 64, dtype, act=None)
    residual = torch.randn(1, hidden, device=DEVICE).to(dtype)
    summed = gemv_triton(x, producer, residual=residual, config=default_config(1, BIG_N, 64, dtype))
    torch.testing.assert_close(summed.sumsq, stream_parts(summed.h), rtol=1e-5, atol=1e-5)
    norm_weight = (1 + torch.randn(hidden, device=DEVICE) / 4).to(dtype)
    _, weight, bias = make_inputs(20, hidden, dtype, act=None)
    out = gemv_triton(PendingNorm(summed.h, summed.sumsq, norm_weight, 1e-5), weight, bias)
    torch.testing.assert_close(
        out.double(),
        reference(rms_norm_torch(summed.h, norm_weight, 1e-5), weight, bias, None),
        **TOL[dtype],
    )


@pytest.mark.parametrize("name", list(CASES))
def test_each_branch_float32_logits_from_bf16(name: str) -> None:
    """The LM head's launch: bf16 in, float32 out, rounded once (no bf16 rounding of the product)."""
    config, n, k = case_config(name, torch.bfloat16)
    x, weight, _ = make_inputs(n, k, torch.bfloat16, act=None)
    out = gemv_triton(x, weight, out_dtype=torch.float32, config=config)
    assert out.dtype == torch.float32 and not out.isnan().any()
    torch.testing.assert_close(out.double(), reference(x, weight, None, None), rtol=1e-4, atol=1e-4)


def test_default_config_at_one_row_runs_every_branch_without_a_config() -> None:
    """gemv_triton's own default_config choice on the natural (allocatable) shapes of three branches."""
    for n, k in ((45, 100), (45, 1500), (20, 5000)):
        x, weight, bias = make_inputs(n, k, torch.float16, act=None)
        out = gemv_triton(x, weight, bias)
        torch.testing.assert_close(
            out.double(), reference(x, weight, bias, None), **TOL[torch.float16]
        )


# ---- the rule's invariants over many shapes ----------------------------------------------------------------

NS = (
    1,
    3,
    8,
    20,
    45,
    64,
    256,
    1000,
    1024,
    2048,
    2049,
    4096,
    6144,
    8192,
    14336,
    28672,
    128256,
    151936,
)
KS = (
    1,
    7,
    64,
    100,
    128,
    255,
    256,
    257,
    512,
    1000,
    1024,
    1025,
    2048,
    2049,
    3000,
    3072,
    4095,
    4096,
    4097,
    8192,
    14336,
    16384,
    16385,
    28672,
    65536,
)
# Weight elements per thread of a program's tile. The rule's preloaded and whole-K tiles hold 256 bytes a
# thread (16-bit: 4 x 1024 over 1 warp, 8 x 2048 or 4 x 4096 over 4 warps: 128 elements, 128 fp32 registers
# once converted for the FMA), twice the streamed tiles' 8 x 1024 over 4 warps (64): a measured choice
# (benchmarks/RESULTS.md, "Measured choices"), not a bound of 64.
MAX_TILE_ELEMENTS_PER_THREAD = 128


def fma_shapes():
    for dtype in DTYPES:
        for num_rows in (1, 2, 8) if dtype == torch.float32 else (1,):
            for n in NS:
                for k in KS:
                    yield num_rows, n, k, dtype


def test_one_row_rule_invariants() -> None:
    for num_rows, n, k, dtype in fma_shapes():
        config = default_config(num_rows, n, k, dtype)
        where = (num_rows, n, k, dtype, config)
        lane_elements = 16 // dtype.itemsize  # one 16-byte vector per lane
        assert not config.use_dot and config.num_stages == 1, where
        assert config.block_k & (config.block_k - 1) == 0, where
        assert config.block_k % (config.num_warps * 32 * lane_elements) == 0, (
            where
        )  # warps side by side on K
        num_slices, k_per_split = launch_split_k(k, config)
        assert k_per_split % config.block_k == 0 and 1 <= num_slices <= config.split_k, where
        assert (num_slices - 1) * k_per_split < k <= num_slices * k_per_split, (
            where
        )  # no empty slice
        assert num_slices <= 65535, where  # grid dimension y
        preloaded = n * k * dtype.itemsize <= gemv_mod.PRELOAD_MAX_BYTES
        if preloaded and k <= gemv_mod.WHOLE_K_MAX:  # the whole weight read before the PDL wait
            assert config.split_k == 1 and num_slices == 1 and config.block_k >= k, where
        else:
            assert (
                config.block_n == gemv_mod.STREAM_BLOCK_N
                and config.block_k <= gemv_mod.STREAM_BLOCK_K
            ), where
        row_blocks = triton.cdiv(n, config.block_n)
        if num_slices > 1:  # split only for a narrow output, and only up to about TARGET_WARPS
            assert num_slices * row_blocks * config.num_warps <= gemv_mod.TARGET_WARPS, where
        per_thread = config.block_n * config.block_k // (config.num_warps * 32)
        assert per_thread <= MAX_TILE_ELEMENTS_PER_THREAD, where


def test_tiles_above_64_elements_a_thread_are_exactly_the_preloaded_and_whole_k_ones() -> None:
    """Pins the finding: which 16-bit launches exceed 64 weight elements per thread (the brief's bound)."""
    over = set()
    for num_rows, n, k, dtype in fma_shapes():
        config = default_config(num_rows, n, k, dtype)
        if dtype.itemsize == 2 and config.block_n * config.block_k // (config.num_warps * 32) > 64:
            over.add((config.block_n, config.block_k, config.num_warps))
    assert over == {(4, 1024, 1), (8, 2048, 4), (4, 4096, 4)}


@pytest.mark.parametrize(
    "n, k, num_slices",
    [
        (4096, 14336, 1),
        (6144, 4096, 1),
        (4096, 4096, 1),
        (28672, 4096, 1),
        (128256, 4096, 1),  # llama3-8b
        (151936, 1024, 1),  # qwen3-0.6b's LM head (311 MB): streamed, one 1024-column chunk
        (256, 14336, 7),
        (8, 16384, 16),
        (20, 5000, 5),  # narrow outputs: K split, <= TARGET_WARPS warps
    ],
)
def test_streamed_llama_shapes(n: int, k: int, num_slices: int) -> None:
    config = default_config(1, n, k, torch.bfloat16)
    assert (config.block_n, config.block_k, config.num_warps) == (8, 1024, 4)
    assert launch_split_k(k, config)[0] == num_slices


@pytest.mark.gpu
@pytest.mark.parametrize("n, k, num_slices", [(896, 4864, 2), (256, 14336, 7), (4096, 14336, 1)])
def test_streamed_down_proj_at_one_row_bf16_cuda(n: int, k: int, num_slices: int) -> None:
    """The 4-warp streamed tiles on the GPU with the default config: Qwen2-0.5B's down_proj (K = 4,864:
    2 K slices, the last chunk 768 of 1024 columns), a narrow output at llama3-8b's K (7 slices) and
    llama3-8b's down_proj (one slice of 14 chunks), SiLU prologue and residual epilogue, against fp32 torch
    of the unfused ops. tests/gpu's layer chain runs no split K at one row any more."""
    x, weight, _ = make_inputs(n, k, torch.bfloat16, act="silu_and_mul")
    residual = torch.randn(1, n, device=DEVICE).to(torch.bfloat16)
    assert launch_split_k(k, default_config(1, n, k, torch.bfloat16))[0] == num_slices
    summed = gemv_triton(x, weight, act="silu_and_mul", residual=residual)
    y = F.linear(silu_and_mul_torch(x).float(), weight.float()).to(torch.bfloat16)
    torch.testing.assert_close(summed.h.float(), (y + residual).float(), **TOL[torch.bfloat16])
    torch.testing.assert_close(
        summed.sumsq.sum(1), summed.h.float().square().sum(1), rtol=1e-4, atol=1e-3
    )


# ---- which path a one-row Linear takes ---------------------------------------------------------------------


@pytest.mark.parametrize("k", [4096, 14336, 16384, 16385, 28672])
def test_prefer_gemv_at_one_row(k: int) -> None:
    wide = k <= gemv_mod.MAX_FMA_K
    assert (
        gemv_mod.prefer_gemv(1, 4096, k) == wide
    )  # llama3-8b's down_proj (K = 14,336) takes the GEMV
    assert gemv_mod.prefer_gemv(1, 128256, k) == wide
    assert gemv_mod.prefer_gemv(1, 2048, k) and gemv_mod.prefer_gemv(1, 8, k)  # narrow: always
    assert not gemv_mod.prefer_gemv(2, 4096, k)  # wide outputs at M > 1: cuBLAS
    assert gemv_mod.prefer_gemv(8, 2048, k) and not gemv_mod.prefer_gemv(9, 8, k)


def test_linear_on_cpu_goes_to_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    """down_proj at one row with K = 14,336 (prefer_gemv: yes) on a CPU tensor: F.linear on the SiLU
    product, a plain tensor even with the residual given (the add is left to the next norm)."""

    def no_triton(*args, **kwargs):
        raise AssertionError("the Triton GEMV is CUDA-only in Linear")

    monkeypatch.setattr(gemv_mod, "gemv_triton", no_triton)
    num_out, k = 8, 14336
    assert gemv_mod.prefer_gemv(1, num_out, k) and gemv_mod.prefer_gemv(1, 4096, k)
    linear = layers.Linear(k, num_out, bias=False, dtype=torch.float32)
    linear.weight.copy_(torch.randn(num_out, k) / math.sqrt(k))
    x = torch.randn(1, 2 * k)
    assert not layers.takes_gemv(x, linear.weight)
    out = linear(x, act="silu_and_mul", residual=torch.randn(1, num_out))
    assert type(out) is torch.Tensor
    torch.testing.assert_close(out, F.linear(silu_and_mul_torch(x), linear.weight))
    h = torch.randn(1, k)
    norm_weight = torch.randn(k)
    pending = PendingNorm(h, h.square().sum(1, keepdim=True), norm_weight, 1e-6)
    torch.testing.assert_close(
        linear(pending), F.linear(rms_norm_torch(h, norm_weight, 1e-6), linear.weight)
    )
