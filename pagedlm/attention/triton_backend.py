"""The Triton attention backend: one varlen paged kernel or, for small decode-only batches with
long contexts, the flash-decoding split path. Every choice is made from host ints.

prepare_and_attend fuses prepare_qkv into the split path (one launch instead of two, the qkv row
read where q is needed); elsewhere it is prepare_qkv, then attend."""
from __future__ import annotations

import functools

import torch

from pagedlm.attention.backend import AttentionMetadata, PrepareThenAttend
from pagedlm.attention.triton_decode import (
    DEFAULT_NUM_SMS, choose_num_splits, prepare_and_split_decode, split_decode_attention,
)
from pagedlm.attention.triton_paged import varlen_attention

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@functools.cache
def _num_sms(device: torch.device) -> int:
    if device.type != "cuda":
        return DEFAULT_NUM_SMS
    return torch.cuda.get_device_properties(device).multi_processor_count


class TritonAttentionBackend(PrepareThenAttend):
    def attend(
        self,
        q: torch.Tensor,  # [T, num_heads, head_dim]
        kv_cache: torch.Tensor,  # [2, num_blocks, block_size, num_kv_heads, head_dim]
        meta: AttentionMetadata,
        scale: float,
        sliding_window: int | None,
    ) -> torch.Tensor:  # [T, num_heads, head_dim]; padding rows (past query_start_loc[B]) unwritten
        """Attend over the keys and values in the cache (this step's included)."""
        _check_attention(q, kv_cache, meta, sliding_window)
        if meta.num_seqs == 0:
            return torch.empty_like(q)
        num_splits = _num_splits(kv_cache, meta, q.device)
        if num_splits > 1:
            return split_decode_attention(q, kv_cache, meta, scale, sliding_window, num_splits)
        return varlen_attention(q, kv_cache, meta, scale, sliding_window)

    def prepare_and_attend(
        self,
        qkv: torch.Tensor,  # [T, (num_heads + 2 * num_kv_heads) * head_dim]
        positions: torch.Tensor,  # [T]
        cos_sin_cache: torch.Tensor,  # [max_position, head_dim]
        qk_norm: tuple[torch.Tensor, torch.Tensor] | None,
        eps: float,
        kv_cache: torch.Tensor,  # [2, num_blocks, block_size, num_kv_heads, head_dim]
        meta: AttentionMetadata,
        num_heads: int,
        scale: float,
        sliding_window: int | None,
    ) -> torch.Tensor:  # [T, num_heads, head_dim]; padding rows unwritten
        """One launch where attend would take the split path (prepare_qkv fused into it), else
        prepare_qkv, then attend."""
        num_splits = _num_splits(kv_cache, meta, qkv.device)
        if num_splits == 1:
            return super().prepare_and_attend(qkv, positions, cos_sin_cache, qk_norm, eps, kv_cache, meta,
                                              num_heads, scale, sliding_window)
        _check_batch(num_heads, qkv.dtype, kv_cache, meta, sliding_window)
        return prepare_and_split_decode(qkv, positions, cos_sin_cache, qk_norm, eps, kv_cache, meta, num_heads,
                                        scale, sliding_window, num_splits)


def _num_splits(kv_cache: torch.Tensor, meta: AttentionMetadata, device: torch.device) -> int:
    """Splits per sequence of the flash-decoding path; 1: the varlen kernel (a batch with a prefill
    chunk, no sequence, or enough sequences to fill the GPU)."""
    if meta.num_seqs == 0 or meta.max_query_len != 1:
        return 1
    return choose_num_splits(meta.num_seqs, kv_cache.shape[3], meta.max_seq_len, _num_sms(device))


def _check_attention(
    q: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata, sliding_window: int | None
) -> None:
    if q.dim() != 3 or q.stride(2) != 1:
        raise ValueError(f"q must be [T, num_heads, head_dim] with stride 1 in head_dim; got {tuple(q.shape)}")
    _check_batch(q.shape[1], q.dtype, kv_cache, meta, sliding_window)


def _check_batch(num_heads: int, dtype: torch.dtype, kv_cache: torch.Tensor, meta: AttentionMetadata,
                 sliding_window: int | None) -> None:
    """What attention needs of q (or qkv: num_heads, dtype), the cache and the metadata."""
    num_kv_heads = kv_cache.shape[3]
    if num_heads % num_kv_heads:
        raise ValueError(f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads})")
    if dtype != kv_cache.dtype or dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"q and kv_cache must share one dtype of {SUPPORTED_DTYPES}; got {dtype}, {kv_cache.dtype}")
    if sliding_window is not None and sliding_window < 1:
        raise ValueError(f"sliding_window must be None or >= 1; got {sliding_window}")
    if meta.query_start_loc.shape != (meta.num_seqs + 1,) or meta.seq_lens.shape != (meta.num_seqs,):
        raise ValueError(f"query_start_loc must be [{meta.num_seqs + 1}] and seq_lens [{meta.num_seqs}]; "
                         f"got {tuple(meta.query_start_loc.shape)}, {tuple(meta.seq_lens.shape)}")
    if meta.block_table.dim() != 2 or meta.block_table.shape[0] < meta.num_seqs:
        raise ValueError(f"block_table must be [>= {meta.num_seqs}, max_blocks_per_seq]; "
                         f"got {tuple(meta.block_table.shape)}")
