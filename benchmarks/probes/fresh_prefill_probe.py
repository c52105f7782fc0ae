"""GPU probe: how fast can a Triton 3.6 kernel run fresh prompts' causal attention on the H200 when
its keys and values are contiguous ([T, KV, D], this step's k/v) and loaded through TMA descriptors,
against our paged kernel (keys gathered through the block table) and cuDNN (SDPA, batched)?

    python benchmarks/probes/fresh_prefill_probe.py [--json out.json]

prefill_peers.py (session 15) found our paged kernel at 323 / 191 / 256 TFLOP/s on T3 / T0 / T2 steps
against cuDNN's 556 / 380 / 447 on contiguous equal-length batches. If a contiguous-K/V Triton kernel
gets near cuDNN, a step's in-chunk keys could come from the step's own k/v instead of the cache
(the cached context alone through the table): the step cost model gives T3-off +3.0% at 556 TFLOP/s.

The probe kernel (`fresh_attention_kernel`): one program per (query head, BLOCK_M query tokens of one
prompt), tiles in decreasing causal length; q, k, v through host-side TMA descriptors (rows past a
prompt's end are other prompts' rows or zeros, masked); keys below the tile's first query in full
BLOCK_N tiles with no mask, then the diagonal tiles masked; online softmax in the log2 domain.
WS adds Triton's automatic warp specialization to the unmasked loop. Every contender's output goes into
a NaN-poisoned buffer and is checked against SDPA before timing.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

sys.path[:0] = [
    str(p) for p in Path(__file__).resolve().parents[:3]
]  # probes/, benchmarks/, the repo

from attention_kernels import HEAD_DIM  # noqa: E402
from prefill_peers import CASES, print_table, prompt_case, sdpa_batched  # noqa: E402

from pagedlm.attention import triton_paged  # noqa: E402

CONFIGS = [  # BLOCK_M, BLOCK_N, warps, stages, warp-specialized
    (128, 64, 8, 2, False),
    (128, 64, 8, 3, False),
    (128, 128, 8, 2, False),
    (64, 64, 4, 3, False),
    (128, 64, 4, 3, False),
    (128, 128, 8, 3, False),
    (128, 64, 8, 3, True),
    (128, 128, 8, 2, True),
]


@triton.jit
def _tile(
    acc,
    m_i,
    l_i,
    q,
    k_desc,
    v_desc,
    start,
    kv_col,
    rows,
    seq_end,
    qk_scale,
    BLOCK_N: tl.constexpr,
    MASKED: tl.constexpr,
):
    k = k_desc.load([start, kv_col])  # [BLOCK_N, D]
    s = tl.dot(q, k.T) * qk_scale  # [BLOCK_M, BLOCK_N]
    if MASKED:
        keys = start + tl.arange(0, BLOCK_N)
        s = tl.where((keys[None, :] <= rows[:, None]) & (keys[None, :] < seq_end), s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_ref = tl.where(m_new > float("-inf"), m_new, 0.0)
    p = tl.exp2(s - m_ref[:, None])
    alpha = tl.exp2(m_i - m_ref)
    v = v_desc.load([start, kv_col])
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return acc, m_new, l_i * alpha + tl.sum(p, 1)


@triton.jit
def fresh_attention_kernel(
    out_ptr,
    q_desc,
    k_desc,
    v_desc,
    tile_seq_ptr,
    tile_first_ptr,
    qsl_ptr,
    qk_scale,
    stride_o_t,
    stride_o_h,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    WS: tl.constexpr,
):
    head = tl.program_id(0)
    tile = tl.program_id(1)
    seq = tl.load(tile_seq_ptr + tile)
    q_first = tl.load(tile_first_ptr + tile)  # token index of the tile's first query
    seq_start = tl.load(qsl_ptr + seq)
    seq_end = tl.load(qsl_ptr + seq + 1)
    kv_col = (head // GROUP) * HEAD_DIM
    q = q_desc.load([q_first, head * HEAD_DIM])  # [BLOCK_M, D]
    rows = q_first + tl.arange(0, BLOCK_M)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    for start in tl.range(
        seq_start, q_first, BLOCK_N, warp_specialize=WS
    ):  # below every row: no mask
        acc, m_i, l_i = _tile(
            acc, m_i, l_i, q, k_desc, v_desc, start, kv_col, rows, seq_end, qk_scale, BLOCK_N, False
        )
    for start in range(q_first, tl.minimum(q_first + BLOCK_M, seq_end), BLOCK_N):
        acc, m_i, l_i = _tile(
            acc, m_i, l_i, q, k_desc, v_desc, start, kv_col, rows, seq_end, qk_scale, BLOCK_N, True
        )
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    offs_d = tl.arange(0, HEAD_DIM)
    o_offs = rows.to(tl.int64)[:, None] * stride_o_t + head * stride_o_h + offs_d[None, :]
    tl.store(out_ptr + o_offs, out.to(out_ptr.dtype.element_ty), mask=(rows < seq_end)[:, None])


def tile_map(starts: list[int], block_m: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(sequence, first query token) of every BLOCK_M tile, longest causal reach first."""
    tiles = [
        (first - lo, b, first)
        for b, (lo, hi) in enumerate(zip(starts[:-1], starts[1:]))
        for first in range(lo, hi, block_m)
    ]
    tiles.sort(reverse=True)
    seqs = torch.tensor([b for _, b, _ in tiles], dtype=torch.int32, device=device)
    firsts = torch.tensor([f for _, _, f in tiles], dtype=torch.int32, device=device)
    return seqs, firsts


def fresh_attention(q, k, v, qsl, starts, config, out):
    """-> a call that launches the kernel: q [T, H, D], k/v [T, KV, D] contiguous, qsl [B + 1] int32 on
    the device. The tile map and the descriptors are built here, once, so that the timed calls launch
    only (a first version rebuilt them in every call: two pageable host-to-device copies, each waiting
    for the GPU, left it idle between the timed launches; session 18 run 4's numbers carry that)."""
    block_m, block_n, warps, stages, ws = config
    total, heads, dim = q.shape
    seqs, firsts = tile_map(starts, block_m, q.device)
    q_desc = TensorDescriptor.from_tensor(q.view(total, heads * dim), [block_m, dim])
    k_desc = TensorDescriptor.from_tensor(k.view(total, -1), [block_n, dim])
    v_desc = TensorDescriptor.from_tensor(v.view(total, -1), [block_n, dim])
    grid = (heads, seqs.numel())

    def launch() -> torch.Tensor:
        fresh_attention_kernel[grid](
            out,
            q_desc,
            k_desc,
            v_desc,
            seqs,
            firsts,
            qsl,
            dim**-0.5 * triton_paged.LOG2_E,
            out.stride(0),
            out.stride(1),
            GROUP=heads // k.shape[1],
            HEAD_DIM=dim,
            BLOCK_M=block_m,
            BLOCK_N=block_n,
            WS=ws,
            num_warps=warps,
            num_stages=stages,
        )
        return out

    return launch


def run_case(name: str) -> list[dict]:
    case = prompt_case(name)
    out = torch.empty_like(case.q)
    case.emit(
        "ours (paged)",
        lambda: triton_paged.varlen_attention(
            case.q, case.kv_cache, case.meta, HEAD_DIM**-0.5, None, out=out
        ),
        out,
    )
    for config in CONFIGS:
        case.emit(
            "fresh {}x{}x{}x{}{}".format(*config[:4], " ws" if config[4] else ""),
            fresh_attention(
                case.q, case.k, case.v, case.meta.query_start_loc, case.starts, config, out
            ),
            out,
        )
    case.emit("sdpa-batched", lambda: sdpa_batched(case))
    return case.rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", default=None)
    parser.add_argument("--cases", default=",".join(CASES))
    args = parser.parse_args()
    print(
        "torch",
        torch.__version__,
        "triton",
        triton.__version__,
        torch.cuda.get_device_name(),
        flush=True,
    )
    rows = [row for name in args.cases.split(",") for row in run_case(name)]
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    print_table(rows)


if __name__ == "__main__":
    main()
