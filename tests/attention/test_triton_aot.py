"""Ahead-of-time compile of every Triton kernel configuration the host code launches, for sm_90.

The interpreter accepts things the GPU compiler refuses (dot shapes, layouts, shared memory), so
this compiles for real with Triton's own ptxas. It must run without TRITON_INTERPRET, hence in a
subprocess: this file is also that subprocess's script. The host wrappers are called on empty CPU
tensors with JITFunction.run replaced by a recorder; each recorded launch is then bound, specialised
and compiled exactly as the runtime would do on an H100/H200 (the same binder and _pack_args).
Attention shapes: every pair of values of two parameters (dtype, head_dim, GQA group, block size,
sliding window, KV heads, q/k norm) in some scenario (the full product would be 1,440 scenarios), then the
benchmark models' own (FLAGSHIP_MODELS).
"""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import sys

import pytest

TARGET_ARCH = 90
MAX_SHARED_BYTES = 232448  # opt-in shared memory per block on sm_90
# launched without PDL: the sampler's draw and threshold, the graphs' stage-in, the fused gate_up GEMM (its cuBLAS
# neighbours lack it)
NO_PDL_KERNELS = (
    "block_logmass_kernel",
    "pick_kernel",
    "threshold_kernel",
    "stage_in_kernel",
    "gate_up_silu_kernel",
)
# The benchmark models' attention, compiled in any case: bf16, head_dim 128, 8 KV heads, the engine's
# block size (16), no sliding window. name -> (query heads, Qwen3's q/k norm in prepare_qkv)
FLAGSHIP_MODELS = {"llama3-8b": (32, False), "qwen3-0.6b": (16, True)}
FLAGSHIP_KV_HEADS = 8
# per scenario: prepare_qkv; the varlen kernel's prefill tile, short-chunk tile, decode tiles in batch order
# and in decode_order (a mixed batch's two launches are two of these); the split decode of a small
# batch and of a large one
SCENARIO_KERNELS = (
    ["decode_split_kernel"] * 2 + ["paged_attention_kernel"] * 4 + ["prepare_qkv_kernel"]
)


@pytest.mark.slow
def test_aot_compile_all_kernels_for_sm90() -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(
        [sys.executable, __file__], env=env, capture_output=True, text=True, timeout=1500
    )
    assert proc.returncode == 0, proc.stderr[-6000:]
    results = json.loads(proc.stdout.splitlines()[-1])
    names = [r["kernel"] for r in results]
    for scenario in attention_scenarios():
        kernels = sorted(r["kernel"] for r in results if scenario in r["scenarios"])
        assert kernels == SCENARIO_KERNELS, (scenario, kernels)
    check_flagship_compiles(results)
    assert set(names) == {
        "prepare_qkv_kernel",
        "paged_attention_kernel",
        "decode_split_kernel",
        "rms_norm_kernel",
        "silu_and_mul_kernel",
        "block_logmass_kernel",
        "pick_kernel",
        "gemv_kernel",
        "argmax_chunks_kernel",
        "argmax_pick_kernel",
        "stage_in_kernel",
        "gate_up_silu_kernel",
        "threshold_kernel",
    }
    for r in results:
        assert r["cubin_bytes"] > 0, r
        assert r["pdl"] == (
            "wait, then launch_dependents" if r["kernel"] not in NO_PDL_KERNELS else "none"
        ), r
        assert r["shared"] <= MAX_SHARED_BYTES, r


def pairwise_cover(values: dict[str, tuple]) -> list[dict]:
    """Combinations of the values such that every pair of values of two parameters is in one of them
    (greedy: each next combination covers the most pairs not yet covered; deterministic)."""
    names = list(values)
    pairs = lambda combo: {(a, combo[a], b, combo[b]) for a, b in itertools.combinations(names, 2)}  # noqa: E731
    candidates = [dict(zip(names, combo)) for combo in itertools.product(*values.values())]
    uncovered = set().union(*(pairs(c) for c in candidates))
    chosen = []
    while uncovered:
        best = max(candidates, key=lambda c: len(pairs(c) & uncovered))
        chosen.append(best)
        uncovered -= pairs(best)
    return chosen


ATTENTION_PARAMETERS = {  # what the host code turns into constexprs or specialisations
    "dtype": ("float16", "bfloat16", "float32"),
    "head_dim": (32, 64, 128, 256),
    "group": (1, 2, 3, 4, 8),
    "block_size": (16, 32),
    "sliding_window": (None, 128),
    "num_kv_heads": (1, 2, 8),
    "qk_norm": (False, True),
}


def attention_scenarios() -> dict[str, dict]:
    """name -> run_attention_wrappers' arguments: every pair of ATTENTION_PARAMETERS' values in some
    scenario (pairwise_cover), then FLAGSHIP_MODELS."""
    import torch

    scenarios = {}
    for case in pairwise_cover(ATTENTION_PARAMETERS):
        name = "-".join(f"{key}={value}" for key, value in case.items())
        scenarios[name] = dict(case, dtype=getattr(torch, case["dtype"]))
    for name, (num_heads, qk_norm) in FLAGSHIP_MODELS.items():
        scenarios[name] = dict(
            dtype=torch.bfloat16,
            head_dim=128,
            group=num_heads // FLAGSHIP_KV_HEADS,
            block_size=16,
            num_kv_heads=FLAGSHIP_KV_HEADS,
            sliding_window=None,
            qk_norm=qk_norm,
        )
    return scenarios


def check_flagship_compiles(results: list[dict]) -> None:
    """Each benchmark model's kernels were compiled with its own shapes: bf16, its GQA group, head_dim
    128, block size 16, no window; prepare_qkv with its q/k norm; the varlen kernel's two query tiles
    and its decode tiles in both orders."""
    for name, (num_heads, qk_norm) in FLAGSHIP_MODELS.items():
        compiled = [r for r in results if name in r["scenarios"]]
        for r in compiled:
            assert r["signature"]["k_cache_ptr"] == "*bf16", (name, r["kernel"])
            c = r["constexprs"]
            if r["kernel"] == "prepare_qkv_kernel":
                assert (c["HALF"], c["BLOCK_SIZE"], c["QK_NORM"]) == (64, 16, qk_norm), (name, c)
            else:
                want = (num_heads // FLAGSHIP_KV_HEADS, 128, 16, False)
                assert (c["GROUP"], c["HEAD_DIM"], c["BLOCK_SIZE"], c["USE_WINDOW"]) == want, (
                    name,
                    r["kernel"],
                    c,
                )
        paged = [r["constexprs"] for r in compiled if r["kernel"] == "paged_attention_kernel"]
        orders = sorted((c["DECODE"], c["ORDERED"]) for c in paged)  # two query tiles: two BLOCK_M
        assert orders == [(False, False), (False, False), (True, False), (True, True)], (
            name,
            paged,
        )


def run_attention_wrappers(
    dtype,
    head_dim: int,
    group: int,
    block_size: int,
    num_kv_heads: int,
    sliding_window: int | None,
    qk_norm: bool,
) -> None:
    import torch

    from pagedlm.attention.backend import AttentionMetadata
    from pagedlm.attention.prepare_qkv import prepare_qkv_triton
    from pagedlm.attention.triton_decode import split_decode_attention
    from pagedlm.attention.triton_paged import varlen_attention

    num_tokens, num_seqs = 40, 3
    q = torch.empty(num_tokens, num_kv_heads * group, head_dim, dtype=dtype)
    kv_cache = torch.empty(2, 64, block_size, num_kv_heads, head_dim, dtype=dtype)
    int32 = dict(dtype=torch.int32)
    qsl, seq_lens = torch.arange(num_seqs + 1, **int32), torch.zeros(num_seqs, **int32)
    slot_mapping, block_table = (
        torch.zeros(num_tokens, dtype=torch.int64),
        torch.zeros(num_seqs, 8, **int32),
    )

    def metadata(
        max_query_len: int, num_decodes: int = 0, ordered: bool = False
    ) -> AttentionMetadata:
        order = torch.zeros(num_decodes or num_seqs, **int32) if ordered else None
        return AttentionMetadata(
            num_tokens,
            num_seqs,
            max_query_len,
            500,
            qsl,
            seq_lens,
            slot_mapping,
            block_table,
            qsl,
            seq_lens,
            order,
            num_decodes,
        )

    qkv = torch.empty(num_tokens, (num_kv_heads * (group + 2)) * head_dim, dtype=dtype)
    weight = torch.empty(head_dim, dtype=dtype)
    prepare_qkv_triton(
        qkv,
        slot_mapping,
        torch.empty(100, head_dim),
        (weight, weight) if qk_norm else None,
        1e-6,
        kv_cache,
        slot_mapping,
        num_kv_heads * group,
    )
    # prefill tiles; short-chunk tiles (2 tokens x group <= 16 rows, as kernel_warmup's short prompt); decode
    # tiles in batch order and in decode_order; a mixed batch: its leading decode (in decode_order), then tiles
    for meta in (
        metadata(20),
        metadata(2),
        metadata(1),
        metadata(1, ordered=True),
        metadata(20, num_decodes=1, ordered=True),
    ):
        varlen_attention(q, kv_cache, meta, 0.1, sliding_window)
    # the split decode of a small batch (every sequence splits), then of a large one (the longest)
    split_decode_attention(q, kv_cache, metadata(1), 0.1, sliding_window, num_splits=5)
    split_decode_attention(
        q, kv_cache, metadata(1), 0.1, sliding_window, num_splits=4, split_seqs=1
    )


def run_op_wrappers() -> None:
    import torch

    from pagedlm.ops import activation, norm
    from pagedlm.ops.argmax import greedy_pick_triton
    from pagedlm.ops.gate_up_silu import gate_up_silu
    from pagedlm.ops.gemv import PendingNorm, gemv_triton
    from pagedlm.ops.stage_in import stage_in
    from pagedlm.sample.filters import TopKTopP
    from pagedlm.sample.triton_draw import fused_gumbel_draw
    from pagedlm.sample.triton_threshold import triton_top_k_top_p_threshold

    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        for hidden in (576, 4096):
            x = torch.empty(8, hidden, dtype=dtype)
            norm.rms_norm_triton(x, torch.empty(hidden, dtype=dtype), 1e-6)
            norm.fused_add_rms_norm_triton(x, x, torch.empty(hidden, dtype=dtype), 1e-6)
        for d in (1536, 14336):
            activation.silu_and_mul_triton(torch.empty(8, 2 * d, dtype=dtype))
        for num_rows in (1, 3, 8):  # FMA (M = 1, or fp32) and tl.dot (16-bit, M > 1) tiles
            for n, k, act in (
                (1024, 3072, "silu_and_mul"),
                (4096, 1024, None),
                (151936, 1024, None),
                (4096, 4096, None),  # 32 MiB in 16 bits: 8 x 1024 streamed tiles at one row
                (28672, 4096, None),
            ):  # > 128 MiB: whole K over 4 warps at one row
                x = torch.empty(num_rows, 2 * k if act else k, dtype=dtype)
                bias = torch.empty(n, dtype=dtype) if n == 4096 else None
                gemv_triton(
                    x, torch.empty(n, k, dtype=dtype), bias, act=act
                )  # N=1024: split K above one row
            # down_proj with its residual add (silu prologue, split K, residual epilogue)
            for n, k in ((1024, 3072), (4096, 14336)):  # qwen3-0.6b's and llama3-8b's
                gemv_triton(
                    torch.empty(num_rows, 2 * k, dtype=dtype),
                    torch.empty(n, k, dtype=dtype),
                    act="silu_and_mul",
                    residual=torch.empty(num_rows, n, dtype=dtype),
                )
            # a decoder layer's norm folded in: o_proj's residual epilogue, then gate_up's norm prologue
            summed = gemv_triton(
                torch.empty(num_rows, 2048, dtype=dtype),
                torch.empty(1024, 2048, dtype=dtype),
                residual=torch.empty(num_rows, 1024, dtype=dtype),
            )
            gemv_triton(
                PendingNorm(summed.h, summed.sumsq, torch.empty(1024, dtype=dtype), 1e-6),
                torch.empty(6144, 1024, dtype=dtype),
            )
        gemv_triton(
            torch.empty(1, 1024, dtype=dtype),
            torch.empty(151936, 1024, dtype=dtype),
            out_dtype=torch.float32,
        )  # the LM head's logits
    for vocab_size in (151936, 128256):  # the small decode graphs' greedy pick
        for num_rows in (1, 8):
            for host_ids in (None, torch.empty(num_rows, dtype=torch.int64)):  # a staged graph's
                greedy_pick_triton(
                    torch.empty(num_rows, vocab_size),
                    torch.empty(600, dtype=torch.int64),
                    torch.empty(num_rows, dtype=torch.int64),
                    host_ids,
                )
    for dtype in (
        torch.float16,
        torch.bfloat16,
    ):  # the fused gate_up + SiLU GEMM (prefill-sized batches)
        for inter, k in ((14336, 4096), (3072, 1024)):
            gate_up_silu(torch.empty(2048, k, dtype=dtype), torch.empty(2 * inter, k, dtype=dtype))
    for block in (64, 128):  # the staged graphs' stage-in (sizes 1-4, 8)
        stage_in(
            torch.empty(1, dtype=torch.int64),
            torch.empty(5000, dtype=torch.int32),
            torch.empty(5000, dtype=torch.int32),
            block,
        )
    for vocab_size in (151936, 49152, 32000):
        for temperature in (None, torch.empty(256, 6)[:, 1]):  # None and a strided column
            fused_gumbel_draw(
                torch.empty(256, vocab_size), temperature, torch.empty(256, dtype=torch.int64)
            )
        for floor in (None, torch.empty(256)):  # top-k / top-p, without and with a min-p floor
            top_k_top_p = TopKTopP(
                None, torch.empty(256, dtype=torch.int64), torch.empty(256), 1, False, True
            )
            triton_top_k_top_p_threshold(torch.empty(256, vocab_size), floor, top_k_top_p)


def record_launches(attention_cases: dict[str, dict], with_ops: bool = False) -> list[tuple]:
    """Call the host wrappers with kernel launches replaced by a recorder; nothing runs.
    -> (scenario name, or "ops", kernel, args, kwargs) per launch."""
    from triton.runtime.jit import JITFunction

    launches, scenario = [], "ops"

    def record(self, *args, grid, warmup, **kwargs):
        launches.append((scenario, self, args, kwargs))

    original = JITFunction.run
    JITFunction.run = record
    try:
        for scenario, case in attention_cases.items():  # noqa: B007 - record() reads it
            run_attention_wrappers(**case)
        scenario = "ops"
        if with_ops:
            run_op_wrappers()
    finally:
        JITFunction.run = original
    return launches


def specialise(fn, args: tuple, kwargs: dict, backend) -> tuple:
    """Bind and specialise like JITFunction.run: (signature, constexprs, attrs, options)."""
    from triton import knobs
    from triton.runtime.jit import create_function_from_signature

    kwargs = dict(
        kwargs,
        debug=kwargs.get("debug", fn.debug) or knobs.runtime.debug,
        instrumentation_mode=knobs.compilation.instrumentation_mode,
    )
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    bound_args, specialization, options = binder(*args, **kwargs)
    options, signature, constexprs, attrs = fn._pack_args(
        backend, kwargs, bound_args, specialization, options
    )
    return signature, constexprs, attrs, options


def pdl_order(ptx: str) -> str:
    """What a kernel's PTX does about PDL: "wait, then launch_dependents" when both are there, in that
    order, and nothing is written to global memory before the wait (pagedlm/ops/pdl.py's rules)."""
    wait, launch = ptx.find("griddepcontrol.wait"), ptx.find("griddepcontrol.launch_dependents")
    if wait < 0 and launch < 0:
        return "none"
    writes = re.finditer(
        r"(?<![\w.])(st\.global|atom\.|red\.)", ptx
    )  # not "ld.shared.": whole opcodes
    writes_before = [m.group(1) for m in writes if m.start() < wait]
    if wait < 0 or launch < wait or writes_before:
        return f"wait at {wait}, launch_dependents at {launch}, writes before the wait: {writes_before}"
    return "wait, then launch_dependents"


def main() -> None:
    """Subprocess entry: compile each distinct recorded launch; print one JSON line of results, each
    with the scenarios whose launches it serves."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend

    assert os.environ.get("TRITON_INTERPRET", "0") in ("", "0"), (
        "the AOT compile must not run in the interpreter"
    )
    from pagedlm.ops import pdl

    target = GPUTarget("cuda", TARGET_ARCH, 32)
    backend = make_backend(target)
    results: dict[str, dict] = {}  # specialisation key -> result
    pdl.pdl_enabled = lambda device: (
        True
    )  # as on an H200: every kernel with its PDL wait, launched with PDL
    launches = record_launches(attention_scenarios(), with_ops=True)
    assert all(
        kwargs.get("launch_pdl")
        for _, fn, _, kwargs in launches
        if fn.__name__ not in NO_PDL_KERNELS
    )
    for scenario, fn, args, kwargs in launches:
        signature, constexprs, attrs, options = specialise(fn, args, kwargs, backend)
        key = repr((fn.__name__, signature, constexprs, attrs, options))
        if key not in results:
            source = triton.compiler.ASTSource(
                fn=fn, signature=signature, constexprs=constexprs, attrs=attrs
            )
            compiled = triton.compile(source, target=target, options=options.__dict__)
            results[key] = dict(
                kernel=fn.__name__,
                cubin_bytes=len(compiled.asm.get("cubin", b"")),
                shared=compiled.metadata.shared,
                signature=signature,
                constexprs={fn.arg_names[path[0]]: value for path, value in constexprs.items()},
                pdl=pdl_order(compiled.asm["ptx"]),
                scenarios=[],
            )
        if scenario not in results[key]["scenarios"]:
            results[key]["scenarios"].append(scenario)
    print(json.dumps(list(results.values()), default=repr))


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    main()
