"""The portable attention reference: plain torch, runs anywhere, one host loop over sequences.

Clarity beats speed here; the Triton kernels and the CPU backend (torch_batched.py) are tested
against this file (attention_backend="torch_ref" selects it in the engine).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from pagedlm.attention.backend import AttentionMetadata

QUERY_TILE = 128  # query rows attended at once: 2.3x faster than whole 512-token prompts on CPU


def write_kv_cache(
    k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """Store k/v rows at their cache slots; rows whose slot is negative are skipped."""
    num_kv_heads, head_dim = kv_cache.shape[-2:]
    kv_flat = kv_cache.view(2, -1, num_kv_heads, head_dim)  # [2, num_slots, num_kv_heads, head_dim]
    valid = slot_mapping >= 0
    slots = slot_mapping[valid]  # sync-ok: reference backend, eager only; -1 marks padding rows
    kv_flat[0, slots] = k[valid].to(kv_cache.dtype)
    kv_flat[1, slots] = v[valid].to(kv_cache.dtype)


def write_kv_cache_cpu(
    k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """write_kv_cache on the CPU in 3-4 torch calls instead of ~12: one index_copy_ each for k
    and v when no row is padding (a CPU step has none below its real rows), else the mask."""
    if slot_mapping.numel() == 0 or int(slot_mapping.min()) < 0:  # sync-ok: CPU tensors
        write_kv_cache(k, v, kv_cache, slot_mapping)
        return
    num_kv_heads, head_dim = kv_cache.shape[-2:]
    kv_flat = kv_cache.view(2, -1, num_kv_heads, head_dim)  # [2, num_slots, num_kv_heads, head_dim]
    kv_flat[0].index_copy_(0, slot_mapping, k.to(kv_cache.dtype))
    kv_flat[1].index_copy_(0, slot_mapping, v.to(kv_cache.dtype))


def gather_kv(
    kv_cache: torch.Tensor, block_ids: torch.Tensor, num_keys: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys and values of the first num_keys token slots of the blocks block_ids, in order."""
    num_kv_heads, head_dim = kv_cache.shape[-2:]
    blocks = kv_cache[:, block_ids]  # [2, num_seq_blocks, block_size, num_kv_heads, head_dim]
    kv = blocks.reshape(2, -1, num_kv_heads, head_dim)[:, :num_keys]  # [2, num_keys, Hkv, D]
    return kv[0], kv[1]


def first_visible_key(first_query_pos: int, sliding_window: int | None) -> int:
    """The lowest key position a query at first_query_pos or later may see."""
    return 0 if sliding_window is None else max(first_query_pos - sliding_window + 1, 0)


def attention_mask(
    query_pos: tuple[int, int],
    key_pos: tuple[int, int],
    sliding_window: int | None,
    device: torch.device,
) -> torch.Tensor | None:
    """[num_queries, num_keys] bool: query i (at position query_pos[0] + i) sees key j (at
    key_pos[0] + j), for positions in [start, end). None when every query sees every key (a
    decode whose keys are all in its window): no mask to build."""
    (q_lo, q_hi), (k_lo, k_hi) = query_pos, key_pos
    if q_hi - q_lo == 1 and first_visible_key(q_lo, sliding_window) <= k_lo:
        return None
    queries = torch.arange(q_lo, q_hi, device=device)[:, None]
    keys = torch.arange(k_lo, k_hi, device=device)[None, :]
    visible = keys <= queries
    if sliding_window is not None:
        visible &= queries - keys < sliding_window
    return visible


def attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float
) -> torch.Tensor:
    """Float32 softmax attention of one sequence (GQA: query heads share kv heads in order).
    q: [query_len, num_heads, D]; k, v: [seq_len, num_kv_heads, D]; mask: [query_len, seq_len]
    or None (all visible). Two batched matmuls over the kv heads (faster on the CPU than SDPA)."""
    query_len, num_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    group = num_heads // num_kv_heads
    q_grouped = q.float().view(query_len, num_kv_heads, group, head_dim).permute(1, 2, 0, 3)
    q_grouped = q_grouped.reshape(num_kv_heads, group * query_len, head_dim) * scale
    scores = torch.bmm(q_grouped, k.float().permute(1, 2, 0))  # [Hkv, group * query_len, seq_len]
    if mask is not None:
        scores.view(num_kv_heads, group, query_len, -1).masked_fill_(~mask, float("-inf"))
    out = torch.bmm(torch.softmax(scores, dim=-1), v.float().transpose(0, 1))  # [Hkv, g * q_len, D]
    return (
        out.view(num_kv_heads, group, query_len, head_dim)
        .permute(2, 0, 1, 3)
        .reshape(query_len, num_heads, head_dim)
    )


def check_heads(num_heads: int, num_kv_heads: int) -> None:
    if num_heads % num_kv_heads != 0:
        raise ValueError(
            f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads})"
        )


def visible_kv(
    kv_cache: torch.Tensor,
    block_row: torch.Tensor,
    seq_len: int,
    first_pos: int,
    sliding_window: int | None,
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Keys and values [seq_len - base, num_kv_heads, D] of one sequence (block_row: its
    block-table row) from position `base`, the start of the block holding the first key a query
    at first_pos or later may see: no block below the window is read (it may be freed)."""
    block_size = kv_cache.shape[2]
    first_block = first_visible_key(first_pos, sliding_window) // block_size
    base = first_block * block_size
    num_blocks = -(-seq_len // block_size)
    keys, values = gather_kv(kv_cache, block_row[first_block:num_blocks], seq_len - base)
    return keys, values, base


def query_tiles(
    first_pos: int,
    num_rows: int,
    tile_rows: int,
    sliding_window: int | None,
    device: torch.device,
) -> Iterator[tuple[int, int, tuple[int, int], torch.Tensor | None]]:
    """Per tile of at most tile_rows of a chunk's num_rows query rows (the first at first_pos):
    its rows [first, last) within the chunk, the key positions it sees (up to its last row:
    causality skips the rest) and its mask."""
    for first in range(0, num_rows, tile_rows):
        last = min(first + tile_rows, num_rows)
        query_pos = (first_pos + first, first_pos + last)
        key_pos = (first_visible_key(query_pos[0], sliding_window), query_pos[1])
        yield first, last, key_pos, attention_mask(query_pos, key_pos, sliding_window, device)


def attend_sequence(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    block_row: torch.Tensor,
    seq_len: int,
    rows: tuple[int, int],
    sliding_window: int | None,
    scale: float,
    out: torch.Tensor,
) -> None:
    """out[start:end] = attention of one sequence's query rows [start, end) to its first
    seq_len cached tokens; block_row is its block-table row. Long chunks go in tiles of
    QUERY_TILE rows (query_tiles). With a window, no block below the first query's window is
    read (visible_kv)."""
    start, end = rows
    first_pos = seq_len - (end - start)  # position of query row `start`
    keys, values, base = visible_kv(kv_cache, block_row, seq_len, first_pos, sliding_window)
    tiles = query_tiles(first_pos, end - start, QUERY_TILE, sliding_window, q.device)
    for first, last, (key_lo, key_hi), mask in tiles:
        out[start + first : start + last] = attend(
            q[start + first : start + last],
            keys[key_lo - base : key_hi - base],
            values[key_lo - base : key_hi - base],
            mask,
            scale,
        ).to(q.dtype)


class TorchAttentionBackend:
    """AttentionBackend in plain torch: attend per sequence."""

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
        out = (
            torch.zeros_like(q) if out is None else out.zero_()
        )  # padding rows (outside every sequence) stay zero
        starts = meta.query_start_loc_cpu.tolist()  # sync-ok: host tensors
        seq_lens = meta.seq_lens_cpu.tolist()  # sync-ok: host tensor
        for seq, seq_len in enumerate(seq_lens):
            if starts[seq + 1] > starts[seq]:
                attend_sequence(
                    q,
                    kv_cache,
                    meta.block_table[seq],
                    seq_len,
                    (starts[seq], starts[seq + 1]),
                    sliding_window,
                    scale,
                    out,
                )
        return out
