"""The Triton attention backend: one varlen paged kernel or, for small decode-only batches with
long contexts, the flash-decoding split path. Every choice is made from host ints."""

from __future__ import annotations

import torch

from pagedlm.attention.backend import AttentionMetadata
from pagedlm.attention.triton_decode import (
    DEFAULT_NUM_SMS,
    choose_num_splits,
    split_decode_attention,
)
from pagedlm.attention.triton_paged import varlen_attention
from pagedlm.ops.device_info import num_sms

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MIN_HEAD_DIM, MAX_HEAD_DIM = 16, 256


def decode_num_splits(num_seqs: int, kv_cache: torch.Tensor, max_seq_len: int) -> int:
    """The splits per sequence of a decode-only batch of these host ints (1: the varlen kernel)."""
    return choose_num_splits(
        num_seqs, kv_cache.shape[3], max_seq_len, num_sms(kv_cache.device, DEFAULT_NUM_SMS)
    )


class TritonAttentionBackend:
    def attend(
        self,
        q: torch.Tensor,  # [T, num_heads, head_dim]
        kv_cache: torch.Tensor,  # [2, num_blocks, block_size, num_kv_heads, head_dim]
        meta: AttentionMetadata,
        scale: float,
        sliding_window: int | None,
        out: torch.Tensor | None = None,  # [T, num_heads, head_dim], like q; allocated when None
    ) -> torch.Tensor:  # [T, num_heads, head_dim]; padding rows (past query_start_loc[B]) unwritten
        """Attend over the keys and values in the cache (this step's included)."""
        _check_attention(q, kv_cache, meta, sliding_window)
        if meta.num_seqs == 0:
            return torch.empty_like(q) if out is None else out
        num_splits = (
            decode_num_splits(meta.num_seqs, kv_cache, meta.max_seq_len)
            if meta.max_query_len == 1
            else 1
        )
        if num_splits > 1:
            return split_decode_attention(
                q, kv_cache, meta, scale, sliding_window, num_splits, out=out
            )
        return varlen_attention(q, kv_cache, meta, scale, sliding_window, out=out)


def _check_attention(
    q: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata, sliding_window: int | None
) -> None:
    if q.dim() != 3 or q.stride(2) != 1:
        raise ValueError(
            f"q must be [T, num_heads, head_dim] with stride 1 in head_dim; got {tuple(q.shape)}"
        )
    num_heads, num_kv_heads, head_dim = q.shape[1], kv_cache.shape[3], q.shape[2]
    if (
        head_dim & (head_dim - 1) or not MIN_HEAD_DIM <= head_dim <= MAX_HEAD_DIM
    ):  # tl.arange, tl.dot
        raise ValueError(
            f"head_dim must be a power of two in [{MIN_HEAD_DIM}, {MAX_HEAD_DIM}] for the "
            f"Triton backend; got {head_dim} (attention_backend='torch' takes any)"
        )
    if num_heads % num_kv_heads:
        raise ValueError(
            f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads})"
        )
    if q.dtype != kv_cache.dtype or q.dtype not in SUPPORTED_DTYPES:
        raise ValueError(
            f"q and kv_cache must share one dtype of {SUPPORTED_DTYPES}; got {q.dtype}, {kv_cache.dtype}"
        )
    if sliding_window is not None and sliding_window < 1:
        raise ValueError(f"sliding_window must be None or >= 1; got {sliding_window}")
    if meta.query_start_loc.shape != (meta.num_seqs + 1,) or meta.seq_lens.shape != (
        meta.num_seqs,
    ):
        raise ValueError(
            f"query_start_loc must be [{meta.num_seqs + 1}] and seq_lens [{meta.num_seqs}]; "
            f"got {tuple(meta.query_start_loc.shape)}, {tuple(meta.seq_lens.shape)}"
        )
    if meta.block_table.dim() != 2 or meta.block_table.shape[0] < meta.num_seqs:
        raise ValueError(
            f"block_table must be [>= {meta.num_seqs}, max_blocks_per_seq]; "
            f"got {tuple(meta.block_table.shape)}"
        )
