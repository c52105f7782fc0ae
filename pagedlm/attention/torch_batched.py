"""The CPU attention backend: prefill chunks through torch's fused attention, decodes batched.

A prefill chunk attends in tiles of PREFILL_TILE query rows, each one scaled_dot_product_attention
call in float32 against its keys up to the tile's last row, with the causal (and window) mask:
the reference's result (torch_ref.attend_sequence, two batched matmuls and a masked softmax) in
~0.4x of its CPU time a call (512 rows, SmolLM2's heads, 2 threads: 8.0 against 19.1 ms; 256
rows after 256 cached: 5.3 against 13.4 ms), the default model's 512-token TTFT 0.97x (RESULTS).

A decode row (one query) costs the reference several torch calls and two copies of its keys
(the gather, then the permute inside einsum) for a few microseconds of arithmetic; with 64
sequences and 30 layers that dominated the CPU decode step. Here the decode rows of a step are
sorted by context length and cut into buckets whose contexts differ by at most BUCKET_GROWTH×;
each bucket gathers its blocks once into a reused scratch buffer (a fresh multi-megabyte
tensor per layer costs page faults) and attends with one call of torch's fused CPU attention
(scaled_dot_product_attention, grouped query heads, a mask for the keys past each context),
which reads the gathered keys and values in place, in the cache's dtype (no float32 copy of
them): bf16, 1 sequence x 160 keys, 54 us against 186 us for two batched float32 matmuls
(RESULTS). The plan is made once per step and reused by every layer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from pagedlm.attention.backend import AttentionMetadata
from pagedlm.attention.torch_ref import (
    check_heads,
    first_visible_key,
    query_tiles,
    visible_kv,
)

BUCKET_GROWTH = 1.25  # a bucket's longest context (in blocks) is at most this × its shortest
PREFILL_TILE = 512  # query rows a fused prefill call takes: bounds its [rows, keys] mask


@dataclass(slots=True)
class DecodeBucket:
    """Decode rows whose contexts are padded to the same number of blocks."""

    rows: torch.Tensor  # [b] int64: the query row of each sequence
    # [b * num_blocks] int64: their block tables from the first block of each one's window, flattened
    block_ids: torch.Tensor
    num_blocks: int
    stale_keys: torch.Tensor  # [n] int64: flat key rows (of b * kv_len) at or past seq_len
    visible: torch.Tensor  # [b, 1, 1, kv_len] bool: keys below seq_len and inside the window


@dataclass(slots=True)
class StepPlan:
    buckets: list[DecodeBucket]
    prefills: list[tuple[int, int, tuple[int, int]]]  # (seq, seq_len, query rows) if > 1 row


def bucket_bounds(num_blocks_sorted: list[int]) -> list[tuple[int, int]]:
    """[start, end) runs of an ascending list where the last is ≤ BUCKET_GROWTH × the first."""
    bounds, start = [], 0
    for i, count in enumerate(num_blocks_sorted):
        if count > BUCKET_GROWTH * num_blocks_sorted[start]:
            bounds.append((start, i))
            start = i
    if num_blocks_sorted:
        bounds.append((start, len(num_blocks_sorted)))
    return bounds


def plan_step(meta: AttentionMetadata, block_size: int, sliding_window: int | None) -> StepPlan:
    """A decode gathers its blocks from the first its window reaches (those below may be freed)."""
    starts = meta.query_start_loc_cpu.tolist()  # sync-ok: host tensors
    seq_lens = meta.seq_lens_cpu.tolist()  # sync-ok: host tensor
    decodes, prefills = [], []
    for seq, seq_len in enumerate(seq_lens):
        query_len = starts[seq + 1] - starts[seq]
        if query_len == 1:
            decodes.append(seq)
        elif query_len > 1:
            prefills.append((seq, seq_len, (starts[seq], starts[seq + 1])))
    first_blocks = {
        seq: first_visible_key(seq_lens[seq] - 1, sliding_window) // block_size for seq in decodes
    }
    blocks_needed = {seq: -(-seq_lens[seq] // block_size) - first_blocks[seq] for seq in decodes}
    decodes.sort(key=blocks_needed.__getitem__)
    buckets = [
        decode_bucket(
            meta, decodes[lo:hi], (starts, seq_lens, first_blocks), block_size, sliding_window
        )
        for lo, hi in bucket_bounds([blocks_needed[seq] for seq in decodes])
    ]
    return StepPlan(buckets=buckets, prefills=prefills)


def decode_bucket(
    meta: AttentionMetadata,
    seqs: list[int],
    host: tuple[list[int], list[int], dict[int, int]],
    block_size: int,
    sliding_window: int | None,
) -> DecodeBucket:
    """seqs: decodes by ascending blocks needed (the last needs the most); host: the step's query
    starts, seq_lens and first blocks (sequence s's keys are gathered from block first_blocks[s])."""
    starts, seq_lens, first_blocks = host
    device = meta.block_table.device
    lens = torch.tensor([seq_lens[s] for s in seqs], device=device)[:, None]  # [b, 1]
    firsts = torch.tensor([first_blocks[s] for s in seqs], device=device)[:, None]  # [b, 1]
    num_blocks = -(-seq_lens[seqs[-1]] // block_size) - first_blocks[seqs[-1]]
    cols = firsts + torch.arange(num_blocks, device=device)[None, :]  # [b, num_blocks]
    # columns past a sequence's end are stale (hidden, their values zeroed): any valid block will do
    cols = cols.clamp_(max=meta.block_table.shape[1] - 1)
    block_ids = meta.block_table[torch.tensor(seqs, device=device)[:, None], cols]
    key_pos = firsts * block_size + torch.arange(num_blocks * block_size, device=device)[None, :]
    stale = key_pos >= lens  # [b, kv_len]
    hidden = stale if sliding_window is None else stale | (lens - 1 - key_pos >= sliding_window)
    return DecodeBucket(
        rows=torch.tensor([starts[s] for s in seqs], device=device),
        block_ids=block_ids.reshape(-1).long(),
        num_blocks=num_blocks,
        stale_keys=stale.reshape(-1).nonzero().squeeze(1),  # sync-ok: host-built, once a step
        visible=~hidden[:, None, None, :],
    )


def attend_bucket(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    bucket: DecodeBucket,
    scale: float,
    scratch: torch.Tensor,
) -> torch.Tensor:
    """[b, num_heads, head_dim] in q's dtype: one bucket of one-query rows against their
    contexts. scratch: a flat buffer of kv_cache's dtype with room for the bucket's blocks."""
    _, _, block_size, num_kv_heads, head_dim = kv_cache.shape
    num_seqs, kv_len = bucket.rows.numel(), bucket.num_blocks * block_size
    gathered = scratch[: 2 * num_seqs * kv_len * num_kv_heads * head_dim]
    gathered = gathered.view(2, num_seqs * bucket.num_blocks, block_size, num_kv_heads, head_dim)
    torch.index_select(kv_cache, 1, bucket.block_ids, out=gathered)
    kv = gathered.view(2, num_seqs, kv_len, num_kv_heads, head_dim)
    # stale slots may hold NaN: the mask is added to the scores (NaN - inf = NaN), and a masked
    # key's value still meets its 0 weight (0 x NaN = NaN)
    kv.view(2, -1, num_kv_heads, head_dim).index_fill_(1, bucket.stale_keys, 0.0)
    keys, values = kv.transpose(2, 3)  # [b, num_kv_heads, kv_len, head_dim] views
    # [b, num_heads, 1, head_dim] in the cache's dtype: a step of float32 activations (a large
    # quantized prefill's, model/quant_linear.py) may carry decode rows too
    queries = q.index_select(0, bucket.rows).to(kv_cache.dtype)[:, :, None, :]
    out = F.scaled_dot_product_attention(
        queries, keys, values, attn_mask=bucket.visible, scale=scale, enable_gqa=True
    )  # [b, num_heads, 1, head_dim]
    return out[:, :, 0].to(q.dtype)


def attend_prefill(
    q: torch.Tensor,  # [T, num_heads, head_dim]
    kv_cache: torch.Tensor,
    block_row: torch.Tensor,
    seq_len: int,
    rows: tuple[int, int],
    sliding_window: int | None,
    scale: float,
    out: torch.Tensor,
) -> None:
    """out[start:end] = attention of one sequence's query rows [start, end) to its first seq_len
    cached tokens (torch_ref.attend_sequence's contract; the module notes). No block below the
    first query's window is read (it may be freed)."""
    start, end = rows
    first_pos = seq_len - (end - start)  # position of query row `start`
    keys, values, base = visible_kv(kv_cache, block_row, seq_len, first_pos, sliding_window)
    # [1, Hkv, S, D]: 4-d, or torch takes its unfused path (4x slower at 512 rows)
    keys, values = (t.float().transpose(0, 1)[None] for t in (keys, values))
    tiles = query_tiles(first_pos, end - start, PREFILL_TILE, sliding_window, q.device)
    for first, last, (key_lo, key_hi), mask in tiles:  # mask [rows, keys]
        lo, hi = key_lo - base, key_hi - base
        tile = F.scaled_dot_product_attention(
            q[start + first : start + last].float().transpose(0, 1)[None],  # [1, H, rows, D]
            keys[:, :, lo:hi],
            values[:, :, lo:hi],
            attn_mask=mask,
            scale=scale,
            enable_gqa=True,  # query head h reads kv head h // (H / Hkv), as the reference
        )  # [1, H, rows, D]
        out[start + first : start + last] = tile[0].transpose(0, 1).to(q.dtype)


class TorchBatchedAttentionBackend:
    """AttentionBackend for the CPU: fused prefill tiles, bucketed batched decodes."""

    def __init__(self) -> None:
        self._scratch: torch.Tensor | None = None  # flat, grows to the largest bucket's blocks

    def _scratch_for(self, kv_cache: torch.Tensor, plan: StepPlan) -> torch.Tensor:
        block_numel = kv_cache[:, 0].numel()  # keys and values of one block
        needed = max((b.block_ids.numel() * block_numel for b in plan.buckets), default=0)
        scratch = self._scratch
        if scratch is None or scratch.numel() < needed or scratch.dtype != kv_cache.dtype:
            scratch = self._scratch = kv_cache.new_empty(needed)
        return scratch

    def _step_plan(
        self, meta: AttentionMetadata, block_size: int, sliding_window: int | None
    ) -> StepPlan:
        """Every layer of a KV cache group sees the same meta object in a step; layers differ at
        most by their window (full and sliding layers mixed), so a meta keeps a plan per window."""
        plan = meta.plans.get(sliding_window)
        if plan is None:
            plan = meta.plans[sliding_window] = plan_step(meta, block_size, sliding_window)
        return plan

    def attend(
        self,
        q: torch.Tensor,  # [T, num_heads, head_dim]
        kv_cache: torch.Tensor,  # [2, num_blocks, block_size, num_kv_heads, head_dim]
        meta: AttentionMetadata,
        scale: float,
        sliding_window: int | None,
        out: torch.Tensor | None = None,  # [T, num_heads, head_dim], like q; allocated when None
    ) -> torch.Tensor:  # [T, num_heads, head_dim]
        check_heads(q.shape[1], kv_cache.shape[3])
        plan = self._step_plan(meta, kv_cache.shape[2], sliding_window)
        out = (
            torch.zeros_like(q) if out is None else out.zero_()
        )  # padding rows (outside every sequence) stay zero
        scratch = self._scratch_for(kv_cache, plan)
        for bucket in plan.buckets:
            out.index_copy_(0, bucket.rows, attend_bucket(q, kv_cache, bucket, scale, scratch))
        for seq, seq_len, rows in plan.prefills:
            attend_prefill(
                q, kv_cache, meta.block_table[seq], seq_len, rows, sliding_window, scale, out
            )
        return out
