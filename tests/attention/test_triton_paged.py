"""Triton KV write + paged attention (varlen and split-decode) against a dense float64 reference.

Runs under TRITON_INTERPRET=1 on CPU (tests/conftest.py sets it before this module imports).
Every case builds a fresh random ragged batch whose KV cache is NaN everywhere except the slots
that hold the sequences' earlier tokens; unused block-table entries point at NaN blocks, and
outputs are NaN-poisoned, so any stray read or missing write shows up as NaN.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import pytest
import torch

from pagedlm.attention import triton_paged
from pagedlm.attention.backend import AttentionMetadata
from pagedlm.attention.torch_ref import write_kv_cache
from pagedlm.attention.triton_backend import TritonAttentionBackend
from pagedlm.attention.triton_decode import MAX_SPLITS, choose_num_splits, split_decode_attention
from pagedlm.attention.triton_paged import varlen_attention

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
ATOL = {torch.float32: 1e-4, torch.float16: 4e-3, torch.bfloat16: 3e-2}


@dataclass
class PagedBatch:
    q: torch.Tensor  # [T, num_heads, head_dim]
    k: torch.Tensor  # [T, num_kv_heads, head_dim]; this step's keys (padding rows have slot -1)
    v: torch.Tensor  # [T, num_kv_heads, head_dim]
    # [2, num_blocks, block_size, num_kv_heads, head_dim], NaN but earlier tokens
    kv_cache: torch.Tensor
    meta: AttentionMetadata
    keys: list[torch.Tensor]  # per sequence [seq_len, num_kv_heads, head_dim]: every key it may see
    values: list[torch.Tensor]  # per sequence [seq_len, num_kv_heads, head_dim]


def make_batch(
    ctx_lens: list[int],
    query_lens: list[int],
    *,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype,
    num_pad_tokens: int = 0,
    device: str = DEVICE,
) -> PagedBatch:
    """Sequence b holds ctx_lens[b] cached tokens and brings query_lens[b] new ones this step."""
    seq_lens = [c + n for c, n in zip(ctx_lens, query_lens)]
    num_blocks_per_seq = [math.ceil(s / block_size) for s in seq_lens]
    num_spare_blocks = 3  # never part of a sequence: stay NaN, fill the block table's tail
    num_blocks = sum(num_blocks_per_seq) + num_spare_blocks
    perm = torch.randperm(num_blocks)
    spare = perm[-num_spare_blocks:]
    block_table = spare[
        torch.randint(num_spare_blocks, (len(seq_lens), max(num_blocks_per_seq) + 1))
    ]
    kv_cache = torch.full(
        (2, num_blocks, block_size, num_kv_heads, head_dim), float("nan"), dtype=dtype
    )
    flat_cache = kv_cache.view(2, num_blocks * block_size, num_kv_heads, head_dim)
    keys, values, slots = [], [], []
    first_block = 0
    for b, seq_len in enumerate(seq_lens):
        block_table[b, : num_blocks_per_seq[b]] = perm[
            first_block : first_block + num_blocks_per_seq[b]
        ]
        first_block += num_blocks_per_seq[b]
        pos = torch.arange(seq_len)
        seq_slots = block_table[b, pos // block_size] * block_size + pos % block_size
        keys.append(torch.randn(seq_len, num_kv_heads, head_dim).to(dtype))
        values.append(torch.randn(seq_len, num_kv_heads, head_dim).to(dtype))
        flat_cache[0, seq_slots[: ctx_lens[b]]] = keys[b][: ctx_lens[b]]
        flat_cache[1, seq_slots[: ctx_lens[b]]] = values[b][: ctx_lens[b]]
        slots.append(seq_slots[ctx_lens[b] :])
    pad = torch.randn(num_pad_tokens, num_kv_heads, head_dim).to(dtype)
    k = torch.cat([key[c:] for key, c in zip(keys, ctx_lens)] + [pad])
    v = torch.cat([val[c:] for val, c in zip(values, ctx_lens)] + [pad])
    slot_mapping = torch.cat(slots + [torch.full((num_pad_tokens,), -1)])
    query_start_loc = torch.tensor([0] + query_lens).cumsum(0).to(torch.int32)
    seq_lens_t = torch.tensor(seq_lens, dtype=torch.int32)
    meta = AttentionMetadata(
        num_tokens=k.shape[0],
        num_seqs=len(seq_lens),
        max_query_len=max(query_lens),
        max_seq_len=max(seq_lens),
        query_start_loc=query_start_loc.to(device),
        seq_lens=seq_lens_t.to(device),
        slot_mapping=slot_mapping.to(device),
        block_table=block_table.to(torch.int32).to(device),
        query_start_loc_cpu=query_start_loc,
        seq_lens_cpu=seq_lens_t,
    )
    q = torch.randn(k.shape[0], num_heads, head_dim).to(dtype)
    return PagedBatch(
        q.to(device), k.to(device), v.to(device), kv_cache.to(device), meta, keys, values
    )


def reference_attention(
    batch: PagedBatch, scale: float, sliding_window: int | None, dtype: torch.dtype = torch.float64
) -> torch.Tensor:
    """Dense causal attention per sequence in `dtype` on q's device: [T, num_heads, head_dim],
    NaN on padding rows."""
    q = batch.q.to(dtype)
    out = torch.full_like(q, float("nan"))
    qsl = batch.meta.query_start_loc_cpu.tolist()
    group = q.shape[1] // batch.keys[0].shape[1]
    for b, (keys, values) in enumerate(zip(batch.keys, batch.values)):
        seq_len, query_len = keys.shape[0], qsl[b + 1] - qsl[b]
        k = keys.to(q.device, dtype).repeat_interleave(
            group, dim=1
        )  # [seq_len, num_heads, head_dim]
        v = values.to(q.device, dtype).repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q[qsl[b] : qsl[b + 1]], k) * scale
        pos = torch.arange(seq_len - query_len, seq_len, device=q.device)[:, None]  # [query_len, 1]
        key_pos = torch.arange(seq_len, device=q.device)[None, :]
        visible = key_pos <= pos
        if sliding_window is not None:
            visible &= pos - key_pos < sliding_window
        probs = scores.masked_fill(~visible, float("-inf")).softmax(-1)
        out[qsl[b] : qsl[b + 1]] = torch.einsum("hqk,khd->qhd", probs, v)
    return out


def check_output(
    out: torch.Tensor, batch: PagedBatch, scale: float, sliding_window: int | None
) -> None:
    ref = reference_attention(batch, scale, sliding_window)
    num_real = batch.meta.query_start_loc_cpu[-1].item()
    torch.testing.assert_close(
        out[:num_real].double(), ref[:num_real], atol=ATOL[out.dtype], rtol=1e-2
    )
    assert out[num_real:].isnan().all(), "padding rows must stay unwritten"


def write_cache(batch: PagedBatch) -> None:
    """This step's k/v into the cache, as prepare_qkv does before attention."""
    write_kv_cache(batch.k, batch.v, batch.kv_cache, batch.meta.slot_mapping)


# (ctx_lens, query_lens, num_heads, num_kv_heads, head_dim, block_size, sliding_window, dtype, num_pad_tokens)
VARLEN_CASES = {
    "decode": ([5, 33, 0], [1, 1, 1], 4, 4, 64, 16, None, torch.float32, 0),
    # a decode batch as a CUDA graph pads it: sequences with no query, padding rows after
    "decode_padded_gqa2_window": (
        [40, 7, 0, 19, 0],
        [1, 1, 0, 1, 0],
        4,
        2,
        64,
        16,
        9,
        torch.float16,
        2,
    ),
    "prefill": ([0, 0], [20, 7], 4, 2, 128, 32, None, torch.float16, 0),
    "mixed_chunks_in_block": (
        [0, 10, 40, 3, 7],
        [17, 1, 1, 6, 0],
        8,
        2,
        64,
        16,
        None,
        torch.float32,
        3,
    ),
    "window_gqa8": ([0, 21, 30], [19, 1, 5], 8, 1, 64, 16, 8, torch.float16, 2),
    "group3_window": ([4, 0], [9, 13], 6, 2, 32, 32, 5, torch.float32, 0),
    "gqa4_d128_bs32": ([35, 2], [4, 30], 8, 2, 128, 32, None, torch.float16, 1),
}


@pytest.mark.parametrize("case", list(VARLEN_CASES))
def test_varlen_attention(case: str) -> None:
    ctx_lens, query_lens, num_heads, num_kv_heads, head_dim, block_size, window, dtype, num_pad = (
        VARLEN_CASES[case]
    )
    batch = make_batch(
        ctx_lens,
        query_lens,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        block_size=block_size,
        dtype=dtype,
        num_pad_tokens=num_pad,
    )
    write_cache(batch)
    scale = head_dim**-0.5
    out = varlen_attention(
        batch.q, batch.kv_cache, batch.meta, scale, window, out=torch.full_like(batch.q, math.nan)
    )
    check_output(out, batch, scale, window)


# (ctx_lens, query_lens, num_heads, num_kv_heads, head_dim, block_size, sliding_window, dtype, num_splits)
SPLIT_CASES = {
    "split3_gqa2": ([40, 70, 5, 9], [1, 1, 1, 0], 4, 2, 128, 16, None, torch.float16, 3),
    "split4_window": ([50, 12], [1, 1], 8, 2, 64, 32, 20, torch.float32, 4),
    "split2_gqa8": ([0, 90], [1, 1], 8, 1, 64, 16, None, torch.float32, 2),
}


@pytest.mark.parametrize("case", list(SPLIT_CASES))
def test_split_decode_attention(case: str) -> None:
    (
        ctx_lens,
        query_lens,
        num_heads,
        num_kv_heads,
        head_dim,
        block_size,
        window,
        dtype,
        num_splits,
    ) = SPLIT_CASES[case]
    batch = make_batch(
        ctx_lens,
        query_lens,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        block_size=block_size,
        dtype=dtype,
        num_pad_tokens=1,
    )
    write_cache(batch)
    scale = 0.3
    out = split_decode_attention(
        batch.q,
        batch.kv_cache,
        batch.meta,
        scale,
        window,
        num_splits,
        out=torch.full_like(batch.q, math.nan),
    )
    check_output(out, batch, scale, window)


def test_window_cases_really_cut_keys() -> None:
    """A window case whose window covers every key would test nothing."""
    for cases in (VARLEN_CASES, SPLIT_CASES):
        for ctx_lens, query_lens, *_, window, _dtype, _ in cases.values():
            if window is not None:
                assert max(c + n for c, n in zip(ctx_lens, query_lens)) > window


def test_reference_sees_window_and_causality() -> None:
    """The reference itself must depend on the mask, or the kernel checks above would be vacuous."""
    batch = make_batch(
        [6], [4], num_heads=2, num_kv_heads=1, head_dim=32, block_size=16, dtype=torch.float32
    )
    full = reference_attention(batch, 0.5, None)
    windowed = reference_attention(batch, 0.5, 3)
    assert not torch.allclose(full, windowed)
    batch.keys[0][-1] += 5.0  # the last key is visible only to the last query
    changed = reference_attention(batch, 0.5, None)
    torch.testing.assert_close(changed[:3], full[:3])
    assert not torch.allclose(changed[3], full[3])


def test_choose_num_splits() -> None:
    # a large batch: 1,024-key splits of the longest context, at most 4 (its longest eighth only)
    assert choose_num_splits(num_seqs=256, num_kv_heads=8, max_seq_len=4096, num_sms=132) == 4
    assert choose_num_splits(num_seqs=17, num_kv_heads=8, max_seq_len=1024, num_sms=132) == 1
    assert choose_num_splits(num_seqs=17, num_kv_heads=8, max_seq_len=10**6, num_sms=132) == 4
    assert choose_num_splits(num_seqs=1, num_kv_heads=8, max_seq_len=100, num_sms=132) == 1
    assert choose_num_splits(num_seqs=2, num_kv_heads=2, max_seq_len=600, num_sms=132) == 3
    assert (
        choose_num_splits(num_seqs=1, num_kv_heads=1, max_seq_len=10**6, num_sms=132) == MAX_SPLITS
    )
    assert choose_num_splits(num_seqs=4, num_kv_heads=8, max_seq_len=10**6, num_sms=132) == 9


@pytest.mark.parametrize("max_query_len", [1, 3])
@pytest.mark.usefixtures("nan_poisoned_empty")  # outputs and split partials start as NaN
def test_backend_attend(monkeypatch: pytest.MonkeyPatch, max_query_len: int) -> None:
    """attend picks the split path exactly for small decode-only batches."""
    import pagedlm.attention.triton_backend as triton_backend

    calls = []
    monkeypatch.setattr(
        triton_backend,
        "split_decode_attention",
        lambda *args, **kwargs: calls.append(args[-1]) or split_decode_attention(*args, **kwargs),
    )
    query_lens = [1, max_query_len]
    batch = make_batch(
        [300, 20],
        query_lens,
        num_heads=4,
        num_kv_heads=2,
        head_dim=32,
        block_size=16,
        dtype=torch.float32,
    )
    write_cache(batch)
    out = TritonAttentionBackend().attend(batch.q, batch.kv_cache, batch.meta, 0.2, None)
    check_output(out, batch, 0.2, None)
    assert calls == ([2] if max_query_len == 1 else [])


@pytest.mark.usefixtures("nan_poisoned_empty")
def test_backend_matches_torch_reference_backend() -> None:
    """Same batch, same caches, through TorchAttentionBackend and TritonAttentionBackend."""
    from pagedlm.attention.torch_ref import TorchAttentionBackend

    batch = make_batch(
        [0, 13, 29, 4],
        [11, 1, 3, 1],
        num_heads=8,
        num_kv_heads=2,
        head_dim=64,
        block_size=16,
        dtype=torch.float16,
        num_pad_tokens=2,
    )
    write_cache(batch)
    expected = TorchAttentionBackend().attend(batch.q, batch.kv_cache, batch.meta, 0.125, 9)
    out = TritonAttentionBackend().attend(batch.q, batch.kv_cache, batch.meta, 0.125, 9)
    num_real = batch.meta.query_start_loc_cpu[-1].item()
    torch.testing.assert_close(
        out[:num_real], expected[:num_real], atol=ATOL[torch.float16], rtol=1e-2
    )


def test_backend_rejects_bad_input() -> None:
    batch = make_batch(
        [3], [2], num_heads=4, num_kv_heads=2, head_dim=32, block_size=16, dtype=torch.float32
    )
    backend = TritonAttentionBackend()
    with pytest.raises(ValueError, match="num_kv_heads"):
        backend.attend(batch.q[:, :3], batch.kv_cache, batch.meta, 1.0, None)
    with pytest.raises(ValueError, match="sliding_window"):
        backend.attend(batch.q, batch.kv_cache, batch.meta, 1.0, 0)
    with pytest.raises(ValueError, match="dtype"):
        backend.attend(batch.q.half(), batch.kv_cache, batch.meta, 1.0, None)
    with pytest.raises(ValueError, match="max_query_len"):
        split_decode_attention(batch.q, batch.kv_cache, batch.meta, 1.0, None, 2)


def lpt_order(seq_lens: torch.Tensor) -> torch.Tensor:
    """[B] int32: sequences by decreasing length, ties in batch order (what the runner builds)."""
    return torch.argsort(-seq_lens.long(), stable=True).to(torch.int32)


def random_order(num_seqs: int) -> torch.Tensor:
    """[num_seqs] int32: a fresh random permutation other than the identity."""
    while True:
        order = torch.randperm(num_seqs).to(torch.int32)
        if order.tolist() != list(range(num_seqs)):
            return order


# (ctx_lens, query_lens, num_heads, num_kv_heads, head_dim, block_size, sliding_window, dtype, num_pad_tokens)
ORDERED_CASES = {
    "ragged_gqa2": (
        [3, 70, 0, 41, 12, 70],
        [1, 1, 1, 1, 1, 1],
        4,
        2,
        32,
        16,
        None,
        torch.float32,
        0,
    ),
    # a CUDA graph's padded batch: the padding sequences (seq_len 0, no query) sort last
    "graph_padded_window": ([9, 50, 22, 0, 0], [1, 1, 1, 0, 0], 8, 2, 64, 16, 17, torch.float16, 2),
}


@pytest.mark.parametrize("order_kind", ["lpt", "random"])
@pytest.mark.parametrize("case", list(ORDERED_CASES))
def test_decode_order_keeps_the_output(case: str, order_kind: str) -> None:
    """The DECODE kernel launched in a given order (any permutation) writes what batch order
    writes, and matches the reference."""
    ctx_lens, query_lens, num_heads, num_kv_heads, head_dim, block_size, window, dtype, num_pad = (
        ORDERED_CASES[case]
    )
    batch = make_batch(
        ctx_lens,
        query_lens,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        block_size=block_size,
        dtype=dtype,
        num_pad_tokens=num_pad,
    )
    write_cache(batch)
    meta, scale = batch.meta, head_dim**-0.5
    order = lpt_order(meta.seq_lens_cpu) if order_kind == "lpt" else random_order(meta.num_seqs)
    assert order.tolist() != list(range(meta.num_seqs))  # else the case tests nothing
    ordered = dataclasses.replace(meta, decode_order=order.to(DEVICE))
    out = varlen_attention(
        batch.q, batch.kv_cache, ordered, scale, window, out=torch.full_like(batch.q, math.nan)
    )
    check_output(out, batch, scale, window)
    unordered = varlen_attention(
        batch.q, batch.kv_cache, meta, scale, window, out=torch.full_like(batch.q, math.nan)
    )
    torch.testing.assert_close(out, unordered, rtol=0, atol=0, equal_nan=True)


# (ctx_lens, query_lens, num_heads, num_kv_heads, head_dim, block_size, sliding_window, dtype, num_pad_tokens)
# with decodes first, as the scheduler lays a mixed step out
MIXED_CASES = {
    "decodes_then_prefill": (
        [30, 5, 0, 70, 12, 0],
        [1, 1, 1, 1, 17, 40],
        4,
        2,
        32,
        16,
        None,
        torch.float32,
        2,
    ),
    "gqa4_window_bs32": ([9, 50, 22, 3], [1, 1, 33, 6], 8, 2, 64, 32, 17, torch.float16, 0),
    "one_decode_one_chunk": ([64, 0], [1, 21], 2, 1, 32, 16, None, torch.float32, 0),
    # more leading decodes than a query tile holds tokens (BLOCK_Q 16 here, 2 below): tile_base's
    # first_seq // BLOCK_Q term is not 0
    "twenty_decodes": (
        [3, 17, 0, 40, 9, 1, 22, 5, 30, 11, 2, 8, 14, 0, 27, 6, 19, 4, 33, 12, 10, 0],
        [1] * 20 + [30, 17],
        8,
        2,
        32,
        16,
        None,
        torch.float32,
        1,
    ),
    "group8_short_chunks": (
        [3, 9, 1, 4, 7, 5, 2],
        [1, 1, 1, 1, 1, 2, 2],
        8,
        1,
        32,
        16,
        None,
        torch.float32,
        0,
    ),
}


@pytest.mark.parametrize("marked", ["all", "fewer"])
@pytest.mark.parametrize("case", list(MIXED_CASES))
def test_mixed_batch_attends_its_decodes_apart(case: str, marked: str) -> None:
    """A mixed batch whose leading decodes are marked (num_decodes, in LPT decode_order) takes a
    decode launch for them and a tiled one for the rest: both match the reference, whether all
    leading decodes are marked or only some (the rest then take query tiles)."""
    ctx_lens, query_lens, num_heads, num_kv_heads, head_dim, block_size, window, dtype, num_pad = (
        MIXED_CASES[case]
    )
    batch = make_batch(
        ctx_lens,
        query_lens,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        block_size=block_size,
        dtype=dtype,
        num_pad_tokens=num_pad,
    )
    write_cache(batch)
    num_decodes = next(i for i, n in enumerate(query_lens) if n != 1) if marked == "all" else 1
    meta, scale = batch.meta, head_dim**-0.5
    order = lpt_order(meta.seq_lens_cpu[:num_decodes])
    mixed = dataclasses.replace(meta, num_decodes=num_decodes, decode_order=order.to(DEVICE))
    out = varlen_attention(
        batch.q, batch.kv_cache, mixed, scale, window, out=torch.full_like(batch.q, math.nan)
    )
    check_output(out, batch, scale, window)


def test_mixed_batch_takes_two_launches(monkeypatch: pytest.MonkeyPatch) -> None:
    """num_decodes decides the launches: the decode one covers exactly the marked sequences, the
    tiled one starts after them (so a test above that passed could not have ignored it)."""
    batch = make_batch(
        [8, 3, 0],
        [1, 1, 9],
        num_heads=2,
        num_kv_heads=1,
        head_dim=32,
        block_size=16,
        dtype=torch.float32,
    )
    launches = []
    real_launch = triton_paged._launch
    monkeypatch.setattr(
        triton_paged,
        "_launch",
        lambda *args, **kwargs: (
            launches.append((args[6], kwargs.get("first_seq"))) or real_launch(*args, **kwargs)
        ),
    )
    write_cache(batch)
    varlen_attention(
        batch.q, batch.kv_cache, dataclasses.replace(batch.meta, num_decodes=2), 0.2, None
    )
    assert launches == [(2, None), (3, 2)]
    launches.clear()
    varlen_attention(batch.q, batch.kv_cache, batch.meta, 0.2, None)
    assert launches == [(3, 0)]
    with pytest.raises(ValueError, match="num_decodes must be in"):
        varlen_attention(
            batch.q, batch.kv_cache, dataclasses.replace(batch.meta, num_decodes=4), 0.2, None
        )
    with pytest.raises(
        ValueError, match="num_decodes=3: the first num_decodes sequences must have one"
    ):
        varlen_attention(
            batch.q, batch.kv_cache, dataclasses.replace(batch.meta, num_decodes=3), 0.2, None
        )


def test_decode_order_is_what_the_kernel_follows() -> None:
    """An order naming sequence 1 for every program writes only sequence 1's row: the kernel
    reads the order (it is not ignored); the check above could not tell."""
    batch = make_batch(
        [5, 20, 9],
        [1, 1, 1],
        num_heads=2,
        num_kv_heads=1,
        head_dim=32,
        block_size=16,
        dtype=torch.float32,
    )
    write_cache(batch)
    meta = dataclasses.replace(
        batch.meta, decode_order=torch.ones(3, dtype=torch.int32, device=DEVICE)
    )
    out = varlen_attention(
        batch.q, batch.kv_cache, meta, 0.2, None, out=torch.full_like(batch.q, math.nan)
    )
    ref = reference_attention(batch, 0.2, None)
    torch.testing.assert_close(out[1].double(), ref[1], atol=ATOL[torch.float32], rtol=1e-2)
    assert out[[0, 2]].isnan().all()


def test_lpt_order_puts_long_sequences_first() -> None:
    seq_lens = torch.tensor([3, 70, 0, 41, 12, 70, 0], dtype=torch.int32)
    assert lpt_order(seq_lens).tolist() == [1, 5, 3, 4, 0, 2, 6]


def test_decode_order_bad_shape_raises() -> None:
    batch = make_batch(
        [5, 20],
        [1, 1],
        num_heads=2,
        num_kv_heads=1,
        head_dim=32,
        block_size=16,
        dtype=torch.float32,
    )
    meta = dataclasses.replace(
        batch.meta, decode_order=torch.zeros(3, dtype=torch.int32, device=DEVICE)
    )
    with pytest.raises(ValueError, match="decode_order must be"):
        varlen_attention(batch.q, batch.kv_cache, meta, 0.2, None)
