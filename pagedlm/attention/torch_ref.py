"""The portable attention reference: plain torch, runs anywhere, one host loop over sequences
(a batched decode path that pads every sequence to the longest measured slower on the CPU:
the padded gather and masking copy more than the loop's per-call overhead costs).

Clarity beats speed here; the Triton kernels are tested against this file.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from pagedlm.attention.backend import AttentionMetadata


def write_kv_cache(k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor,
                   slot_mapping: torch.Tensor) -> None:
    """Store k/v rows at their cache slots; rows whose slot is negative are skipped."""
    num_kv_heads, head_dim = kv_cache.shape[-2:]
    kv_flat = kv_cache.view(2, -1, num_kv_heads, head_dim)  # [2, num_slots, num_kv_heads, head_dim]
    valid = slot_mapping >= 0
    slots = slot_mapping[valid]  # sync-ok: reference backend, eager only; -1 marks padding rows
    kv_flat[0, slots] = k[valid].to(kv_cache.dtype)
    kv_flat[1, slots] = v[valid].to(kv_cache.dtype)


def gather_kv(kv_cache: torch.Tensor, block_ids: torch.Tensor, seq_len: int
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys and values of one sequence's first seq_len tokens, in token order."""
    num_kv_heads, head_dim = kv_cache.shape[-2:]
    blocks = kv_cache[:, block_ids]  # [2, num_seq_blocks, block_size, num_kv_heads, head_dim]
    kv = blocks.reshape(2, -1, num_kv_heads, head_dim)[:, :seq_len]  # [2, seq_len, Hkv, D]
    return kv[0], kv[1]


def attention_mask(seq_len: int, query_len: int, sliding_window: int | None,
                   device: torch.device) -> torch.Tensor | None:
    """[query_len, seq_len] bool: query i (at position seq_len - query_len + i) sees key j.
    None when every query sees every key (a decode inside the window): no mask to build."""
    if query_len == 1 and (sliding_window is None or seq_len <= sliding_window):
        return None
    query_pos = torch.arange(seq_len - query_len, seq_len, device=device)[:, None]
    key_pos = torch.arange(seq_len, device=device)[None, :]
    visible = key_pos <= query_pos
    if sliding_window is not None:
        visible &= query_pos - key_pos < sliding_window
    return visible


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
           scale: float) -> torch.Tensor:
    """Float32 softmax attention of one sequence (GQA: query heads share kv heads in order).
    q: [query_len, num_heads, D]; k, v: [seq_len, num_kv_heads, D]; mask: [query_len, seq_len]
    or None (all visible)."""
    if mask is None:  # a decode: grouped einsums, cheaper than SDPA's math path for one query
        return _attend_one_query(q, k, v, scale)
    out = F.scaled_dot_product_attention(q.float().transpose(0, 1), k.float().transpose(0, 1),
                                         v.float().transpose(0, 1), attn_mask=mask, scale=scale,
                                         enable_gqa=True)  # [num_heads, query_len, D]
    return out.transpose(0, 1)  # [query_len, num_heads, head_dim]


def _attend_one_query(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    num_kv_heads, head_dim = k.shape[1:]
    q_grouped = q.float().view(num_kv_heads, -1, head_dim)  # [Hkv, group, D]
    scores = torch.einsum("hgd,shd->hgs", q_grouped, k.float()) * scale  # [Hkv, group, seq_len]
    probs = torch.softmax(scores, dim=-1)
    return torch.einsum("hgs,shd->hgd", probs, v.float()).reshape(1, -1, head_dim)  # [1, H, D]


class TorchAttentionBackend:
    """AttentionBackend in plain torch: write the cache, then attend per sequence."""

    def forward(
        self,
        q: torch.Tensor,  # [T, num_heads, head_dim]
        k: torch.Tensor,  # [T, num_kv_heads, head_dim]
        v: torch.Tensor,  # [T, num_kv_heads, head_dim]
        kv_cache: torch.Tensor,  # [2, num_blocks, block_size, num_kv_heads, head_dim]
        meta: AttentionMetadata,
        scale: float,
        sliding_window: int | None,
    ) -> torch.Tensor:  # [T, num_heads, head_dim]
        num_heads, num_kv_heads = q.shape[1], k.shape[1]
        if num_heads % num_kv_heads != 0:
            raise ValueError(f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads})")
        write_kv_cache(k, v, kv_cache, meta.slot_mapping)
        block_size = kv_cache.shape[2]
        out = torch.zeros_like(q)  # padding rows (outside every sequence) stay zero
        starts = meta.query_start_loc_cpu.tolist()  # sync-ok: host tensors
        seq_lens = meta.seq_lens_cpu.tolist()  # sync-ok: host tensor
        for seq, seq_len in enumerate(seq_lens):
            start, end = starts[seq], starts[seq + 1]
            if end == start:
                continue
            num_seq_blocks = -(-seq_len // block_size)
            keys, values = gather_kv(kv_cache, meta.block_table[seq, :num_seq_blocks], seq_len)
            mask = attention_mask(seq_len, end - start, sliding_window, q.device)
            out[start:end] = attend(q[start:end], keys, values, mask, scale).to(q.dtype)
        return out
