"""GPU: a large decode batch's attention, the varlen kernel (one program per sequence and KV head,
longest first) against the split decode with its longest sequences split (issue 31), on uniform
and skewed contexts; llama3-8b heads (32 / 8, head_dim 128), bf16, block size 16, KV blocks
shuffled in the pool.

    python benchmarks/split_decode.py [--json out.json]

Cases: t0 (256 x 576 keys: T0's decode steps), t2 (400 x 1,500: T2's), t4-N (N sequences with
T4-like contexts: log-normal prompts, median 250, sigma 1.1, clipped to 16-7,000, plus 0-511 decoded
tokens, the first one 7,800 keys). Variants: varlen; the engine's choice (choose_num_splits /
choose_split_seqs with max_seq_len 8,192, llama3-8b's max_model_len); a sweep of split counts x the
share of sequences that split. Each output's max abs difference from varlen's is printed.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.attention_kernels import time_ms  # noqa: E402
from pagedlm.attention import triton_decode, triton_paged  # noqa: E402
from pagedlm.attention.backend import AttentionMetadata  # noqa: E402

NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE = 32, 8, 128, 16
MAX_MODEL_LEN = 8192
DEVICE = (
    "cuda" if torch.cuda.is_available() else "cpu"
)  # cpu: a smoke test under TRITON_INTERPRET=1
SWEEP = [(splits, share) for splits in (4, 8, 16) for share in (8, 4, 2, 1)]


def skewed_contexts(num_seqs: int, seed: int = 0) -> list[int]:
    rng = np.random.default_rng(seed)
    prompts = np.clip(rng.lognormal(np.log(250), 1.1, num_seqs), 16, 7000).astype(int)
    contexts = prompts + rng.integers(0, 512, num_seqs)
    contexts[0] = 7800
    return contexts.tolist()


CASES = {
    "t0": [576] * 256,
    "t2": [1500] * 400,
    "t4-24": skewed_contexts(24),
    "t4-64": skewed_contexts(64),
    "t4-256": skewed_contexts(256),
    "t4-448": skewed_contexts(448),
}


def make_batch(contexts: list[int]):
    """-> (q [B, H, D], kv_cache, meta with decode_order longest first); one query token each."""
    dev = DEVICE
    blocks = [-(-c // BLOCK_SIZE) for c in contexts]
    num_blocks = sum(blocks) + 1
    kv_cache = torch.randn(
        2, num_blocks, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM, device=dev, dtype=torch.bfloat16
    )
    pool = (torch.randperm(num_blocks - 1) + 1).to(torch.int32)
    table = torch.zeros(len(contexts), max(blocks), dtype=torch.int32)
    first = 0
    for b, n in enumerate(blocks):
        table[b, :n] = pool[first : first + n]
        first += n
    num_seqs = len(contexts)
    seq_lens = torch.tensor(contexts, dtype=torch.int32)
    starts = torch.arange(num_seqs + 1, dtype=torch.int32)
    order = torch.argsort(-seq_lens.long(), stable=True).to(torch.int32)
    meta = AttentionMetadata(
        num_tokens=num_seqs,
        num_seqs=num_seqs,
        max_query_len=1,
        max_seq_len=MAX_MODEL_LEN,  # as a CUDA graph captures it
        query_start_loc=starts.to(dev),
        seq_lens=seq_lens.to(dev),
        slot_mapping=torch.empty(0, device=dev),
        block_table=table.to(dev),
        query_start_loc_cpu=starts,
        seq_lens_cpu=seq_lens,
        decode_order=order.to(dev),
    )
    q = torch.randn(num_seqs, NUM_HEADS, HEAD_DIM, device=dev, dtype=torch.bfloat16)
    return q, kv_cache, meta


def run_case(name: str) -> list[dict]:
    contexts = CASES[name]
    q, kv_cache, meta = make_batch(contexts)
    scale = HEAD_DIM**-0.5
    kv_bytes = 2 * sum(contexts) * NUM_KV_HEADS * HEAD_DIM * 2
    want = torch.full_like(q, float("nan"))
    varlen = lambda: triton_paged.varlen_attention(q, kv_cache, meta, scale, None, out=want)  # noqa: E731
    varlen()
    num_seqs = len(contexts)
    chosen = (
        triton_decode.choose_num_splits(num_seqs, NUM_KV_HEADS, MAX_MODEL_LEN),
        triton_decode.choose_split_seqs(num_seqs, NUM_KV_HEADS),
    )
    variants = [("varlen", None)] + [(f"engine S{chosen[0]} top{chosen[1]}", chosen)]
    variants += [(f"S{s} top1/{share}", (s, -(-num_seqs // share))) for s, share in SWEEP]
    rows = []
    base_ms = None
    for label, split in variants:
        if split is None:
            call, out = varlen, want
        else:
            out = torch.full_like(q, float("nan"))
            call = lambda split=split, out=out: triton_decode.split_decode_attention(  # noqa: E731
                q, kv_cache, meta, scale, None, split[0], out=out, split_seqs=split[1]
            )
            call()
        err = (out.float() - want.float()).abs().max().item()
        ms = time_ms(call, iters=50)
        base_ms = base_ms or ms
        row = dict(
            case=name,
            variant=label,
            ms=round(ms, 4),
            vs_varlen=round(base_ms / ms, 3),
            gbs=round(kv_bytes / ms / 1e6, 1),
            err=err,
            max_ctx=max(contexts),
            mean_ctx=round(sum(contexts) / num_seqs),
        )
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    rows = [row for name in args.cases.split(",") for row in run_case(name)]
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    print(f"\n{'case':8} {'variant':20} {'ms':>8} {'x varlen':>8} {'GB/s':>7} {'err':>8}")
    for row in rows:
        print(
            f"{row['case']:8} {row['variant']:20} {row['ms']:8.4f} {row['vs_varlen']:8.3f} "
            f"{row['gbs']:7.0f} {row['err']:8.4f}"
        )


if __name__ == "__main__":
    main()
