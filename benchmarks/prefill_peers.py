"""GPU: fresh prompts' causal attention (no cached context) by our Triton varlen kernel, against the
attention kernels torch ships, on the workloads' prompt shapes. Which is fastest decides whether a
step's fresh prompts should leave the paged kernel.

    python benchmarks/prefill_peers.py [--json out.json]

Rows per case (bf16, head_dim 128, llama3-8b heads 32 / 8 KV):
  triton MxwxsxN   our paged kernel (triton_paged) with PREFILL_BLOCK_M x warps x stages x BLOCK_N
  sdpa-<backend>   F.scaled_dot_product_attention, one call per prompt on [T, H, D] views (the layout
                   the engine has), k/v contiguous [T, KV, D]; the backend forced
  sdpa-batched     one call on [B, H, L, D] contiguous (attention_kernels.py's peer)
  varlen           torch.nn.attention.varlen.varlen_attn on the ragged batch, if this torch has it
  gather           copying the batch's k and v out of the paged cache (what a contiguous peer would add)
Each row's max abs error against sdpa-batched is printed: a broken kernel shows.
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from attention_kernels import HEAD_DIM, kernel_settings, make_case, time_ms  # noqa: E402

from pagedlm.attention import triton_paged  # noqa: E402
from pagedlm.attention.backend import AttentionMetadata  # noqa: E402

CASES = {  # name: (prompts, prompt length)
    "t3-step": (7, 2176),  # T3-off: a 16k-token step of 2,048 + 128-token prompts
    "t0-step": (32, 512),  # T0: a 16k-token step of 512-token prompts
    "t2-step": (16, 1000),  # T2
}
NUM_HEADS, NUM_KV_HEADS = 32, 8
TRITON_CONFIGS = [
    (64, 4, 2, 64),
    (128, 8, 2, 64),
    (128, 8, 3, 64),
    (128, 8, 2, 128),
    (128, 4, 2, 64),
    (64, 4, 3, 64),
    (64, 4, 2, 128),
]
SETTINGS = ("PREFILL_BLOCK_M", "PREFILL_NUM_WARPS", "PREFILL_NUM_STAGES", "PREFILL_BLOCK_N")


def sdpa_per_prompt(q, k, v, starts, backend):
    """q [T, H, D], k/v [T, KV, D]: one causal SDPA call per prompt, on strided views."""
    from torch.nn.attention import sdpa_kernel

    out = torch.empty_like(q)
    with sdpa_kernel([backend]):
        for lo, hi in zip(starts[:-1], starts[1:]):
            o = F.scaled_dot_product_attention(
                q[lo:hi].transpose(0, 1).unsqueeze(0),
                k[lo:hi].transpose(0, 1).unsqueeze(0),
                v[lo:hi].transpose(0, 1).unsqueeze(0),
                is_causal=True,
                enable_gqa=True,
            )
            out[lo:hi] = o[0].transpose(0, 1)
    return out


def varlen_call():
    """varlen_attn(q, k, v, cu, max_len) for causal attention, or None where this torch lacks it."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    params = inspect.signature(varlen_attn).parameters
    print("varlen_attn", inspect.signature(varlen_attn), flush=True)
    causal = {"window_size": (-1, 0)} if "window_size" in params else {"is_causal": True}
    gqa = {"enable_gqa": True} if "enable_gqa" in params else {}
    return lambda q, k, v, cu, n: varlen_attn(q, k, v, cu, cu, n, n, **causal, **gqa)


@dataclass
class PromptCase:
    """One case's inputs (fresh prompts of equal length, no cached context) and its measured rows."""

    name: str
    q: torch.Tensor  # [T, H, D]
    kv_cache: torch.Tensor  # the prompts' keys and values, paged
    meta: AttentionMetadata
    sdpa: tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # q, k, v [B, H or KV, L, D] contiguous
    k: torch.Tensor  # [T, KV, D] contiguous
    v: torch.Tensor
    starts: list[int]  # each prompt's first token, then T
    flops: float
    want: torch.Tensor  # [T, H, D]: SDPA's output
    rows: list[dict] = field(default_factory=list)

    def emit(self, label: str, fn, out: torch.Tensor | None = None) -> None:
        """Times fn() after checking it against SDPA (out, where fn writes into it, poisoned with NaN
        first); a contender this torch, Triton or GPU refuses is printed with its error and left out."""
        if out is not None:
            out.fill_(float("nan"))
        try:
            got = fn()
            err = (got.float() - self.want.float()).abs().max().item()
            ms = time_ms(fn)
        except Exception as exc:  # a backend this torch or GPU refuses: say so, go on
            print(json.dumps(dict(case=self.name, config=label, error=str(exc)[:300])), flush=True)
            return
        row = dict(case=self.name, config=label, ms=ms, tflops=self.flops / ms / 1e9, err=err)
        print(json.dumps(row), flush=True)
        self.rows.append(row)


def prompt_case(name: str) -> PromptCase:
    num_prompts, length = CASES[name]
    q, kv_cache, meta, (sq, sk, sv), flops = make_case(
        num_prompts, 0, length, NUM_HEADS, NUM_KV_HEADS
    )
    want = (
        F.scaled_dot_product_attention(sq, sk, sv, is_causal=True, enable_gqa=True)
        .transpose(1, 2)
        .reshape(q.shape)
    )
    k = sk.transpose(1, 2).reshape(-1, NUM_KV_HEADS, HEAD_DIM).contiguous()
    v = sv.transpose(1, 2).reshape(-1, NUM_KV_HEADS, HEAD_DIM).contiguous()
    starts = [i * length for i in range(num_prompts + 1)]
    return PromptCase(name, q, kv_cache, meta, (sq, sk, sv), k, v, starts, flops, want)


def sdpa_batched(case: PromptCase) -> torch.Tensor:
    sq, sk, sv = case.sdpa
    return (
        F.scaled_dot_product_attention(sq, sk, sv, is_causal=True, enable_gqa=True)
        .transpose(1, 2)
        .reshape(case.q.shape)
    )


def run_case(name: str) -> list[dict]:
    case = prompt_case(name)
    q, kv_cache, meta, k, v, starts = case.q, case.kv_cache, case.meta, case.k, case.v, case.starts
    out = torch.empty_like(q)
    for config in TRITON_CONFIGS:

        def ours(config=config):
            with kernel_settings(SETTINGS, config):
                return triton_paged.varlen_attention(
                    q, kv_cache, meta, HEAD_DIM**-0.5, None, out=out
                )

        case.emit("triton {}x{}x{}x{}".format(*config), ours, out)
    from torch.nn.attention import SDPBackend

    for backend in (
        SDPBackend.FLASH_ATTENTION,
        SDPBackend.CUDNN_ATTENTION,
        SDPBackend.EFFICIENT_ATTENTION,
    ):
        case.emit(
            f"sdpa-{backend.name.lower()}", lambda b=backend: sdpa_per_prompt(q, k, v, starts, b)
        )
    case.emit("sdpa-batched", lambda: sdpa_batched(case))
    varlen = varlen_call()
    length = starts[1]
    if varlen is not None:
        case.emit("varlen", lambda: varlen(q, k, v, meta.query_start_loc, length))
    token = torch.arange(q.shape[0], device=q.device)  # every token's cache slot, through the table
    pos = token % length
    blocks = meta.block_table.long()[token // length, pos // 16] * 16 + pos % 16
    ms = time_ms(
        lambda: (
            kv_cache[0].view(-1, NUM_KV_HEADS, HEAD_DIM).index_select(0, blocks),
            kv_cache[1].view(-1, NUM_KV_HEADS, HEAD_DIM).index_select(0, blocks),
        )
    )
    print(json.dumps(dict(case=name, config="gather", ms=ms)), flush=True)
    case.rows.append(dict(case=name, config="gather", ms=ms, tflops=float("nan"), err=float("nan")))
    return case.rows


def print_table(rows: list[dict]) -> None:
    print(f"\n{'case':8} {'config':24} {'ms':>8} {'TFLOP/s':>8} {'max err':>8}")
    for row in rows:
        print(
            f"{row['case']:8} {row['config']:24} {row['ms']:8.3f} {row['tflops']:8.1f} {row['err']:8.4f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    print("torch", torch.__version__, torch.cuda.get_device_name(), flush=True)
    rows = [row for name in CASES for row in run_case(name)]
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    print_table(rows)


if __name__ == "__main__":
    main()
