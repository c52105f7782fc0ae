"""The fused flash-decoding kernel (split + last-program merge in one launch) against the float64
reference of test_triton_paged, under TRITON_INTERPRET=1 on CPU.

Every run NaN-poisons the output and the kernel's workspace (torch.empty is patched to return NaN),
so a missing write, a stray read of another head's rows or an unwritten partial of an empty split
read by the merge shows up as NaN. Each multi-split case holds a sequence shorter than one key tile
(at least 32 keys per split), so it has empty splits. The interpreter runs programs one after
another: it checks the arithmetic and the counter protocol, not the memory ordering.
"""

from __future__ import annotations

import math

import pytest
import torch
from test_triton_paged import DEVICE, check_output, make_batch, write_cache

from pagedlm.attention.triton_decode import MAX_SPLITS, split_decode_attention
from pagedlm.ops import counters
from pagedlm.ops.counters import zeroed_counters

# (ctx_lens, query_lens, num_heads, num_kv_heads, head_dim, block_size, sliding_window, dtype, num_splits);
# a query_len of 0 is a padding sequence (seq_len 0 as in a CUDA graph's padding rows, or cached keys).
CASES = {
    "split1_mha": ([70, 5], [1, 1], 2, 2, 32, 16, None, torch.float32, 1),
    "split2_gqa2_pad": ([150, 0, 9, 40], [1, 0, 1, 0], 4, 2, 64, 32, None, torch.float16, 2),
    "split5_gqa4_window": ([200, 3, 0], [1, 1, 0], 8, 2, 32, 16, 90, torch.float32, 5),
    "split32_gqa8": ([130, 2], [1, 1], 8, 1, 64, 16, None, torch.float16, 32),
    "split32_gqa1_window_bs32": ([300, 0, 20], [1, 0, 1], 2, 2, 32, 32, 170, torch.float32, 32),
    "split5_gqa2_d256": ([100, 10], [1, 1], 2, 1, 256, 16, None, torch.float16, 5),
    "split2_gqa4_window_bs32": ([45, 80], [1, 1], 4, 1, 64, 32, 33, torch.float16, 2),
    "split5_gqa8_bs32": ([0, 260], [1, 1], 16, 2, 32, 32, None, torch.float32, 5),
    # splits of several tiles: the first read before the PDL wait, the rest in the loop (window-masked here)
    "split1_gqa2_window_long": ([300, 64], [1, 1], 4, 2, 32, 16, 200, torch.float16, 1),
}


@pytest.fixture(autouse=True)
def nan_workspace(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch.empty / empty_like give NaN-filled floating tensors, so unwritten partials read as NaN."""
    empty, empty_like = torch.empty, torch.empty_like

    def poison(t: torch.Tensor) -> torch.Tensor:
        return t.fill_(math.nan) if t.is_floating_point() else t

    monkeypatch.setattr(torch, "empty", lambda *args, **kwargs: poison(empty(*args, **kwargs)))
    monkeypatch.setattr(
        torch, "empty_like", lambda *args, **kwargs: poison(empty_like(*args, **kwargs))
    )


@pytest.fixture
def fresh_counters(monkeypatch: pytest.MonkeyPatch) -> None:
    """Start with no counter buffer, as a new process would."""
    monkeypatch.setattr(counters, "_buffers", {})


def run_case(batch, window: int | None, num_splits: int, scale: float = 0.3) -> torch.Tensor:
    """One call on a NaN-poisoned output, checked against the reference; the counters end at zero."""
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
    assert not zeroed_counters(batch.q.device, 0).any(), "every counter must be reset to 0"
    return out


def case_batch(name: str, num_pad_tokens: int = 2):
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
    ) = CASES[name]
    batch = make_batch(
        ctx_lens,
        query_lens,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        block_size=block_size,
        dtype=dtype,
        num_pad_tokens=num_pad_tokens,
    )
    write_cache(batch)
    return batch, window, num_splits


@pytest.mark.parametrize("case", list(CASES))
def test_fused_split_decode(case: str) -> None:
    batch, window, num_splits = case_batch(case)
    run_case(batch, window, num_splits)


def test_bad_split_counts_are_refused() -> None:
    """The merge reads at most MAX_SPLITS partials: more splits would silently drop keys."""
    batch = make_batch(
        [70], [1], num_heads=2, num_kv_heads=2, head_dim=32, block_size=16, dtype=torch.float32
    )
    for num_splits in (0, MAX_SPLITS + 1):
        with pytest.raises(ValueError, match=f"1 <= num_splits <= {MAX_SPLITS}"):
            split_decode_attention(batch.q, batch.kv_cache, batch.meta, 0.3, None, num_splits)


def test_window_cases_really_cut_keys() -> None:
    for ctx_lens, query_lens, *_, window, _dtype, _splits in CASES.values():
        if window is not None:
            assert max(c + n for c, n in zip(ctx_lens, query_lens)) > window


def test_same_call_twice_reuses_reset_counters() -> None:
    """Without the merging program's reset, the second call's counters would never reach the
    last value and its output would stay NaN."""
    batch, window, num_splits = case_batch("split5_gqa4_window")
    first = run_case(batch, window, num_splits)
    second = run_case(batch, window, num_splits)
    num_real = batch.meta.query_start_loc_cpu[-1].item()
    assert torch.equal(first[:num_real], second[:num_real])


def test_batches_3_2_3_share_one_buffer(fresh_counters: None) -> None:
    buffers = []
    for ctx_lens, query_lens in (
        ([90, 7, 150], [1, 1, 1]),
        ([66, 0], [1, 1]),
        ([5, 120, 200], [1, 0, 1]),
    ):
        batch = make_batch(
            ctx_lens,
            query_lens,
            num_heads=4,
            num_kv_heads=2,
            head_dim=32,
            block_size=16,
            dtype=torch.float32,
            num_pad_tokens=1,
        )
        write_cache(batch)
        run_case(batch, None, 5)
        buffers.append(zeroed_counters(batch.q.device, 0))
    assert buffers[0] is buffers[1] is buffers[2] and buffers[0].numel() == counters.MIN_COUNTERS
    assert len(counters._buffers[batch.q.device]) == 1


def test_counters_grow_for_a_larger_need(fresh_counters: None) -> None:
    device = torch.device(DEVICE)
    small = zeroed_counters(device, 4)
    assert (
        small.numel() == counters.MIN_COUNTERS
        and zeroed_counters(device, counters.MIN_COUNTERS) is small
    )
    small[:] = 7  # a grown buffer is new and zero; the old one stays alive for graphs that hold it
    grown = zeroed_counters(device, counters.MIN_COUNTERS + 1)
    assert (
        grown.numel() == 2 * counters.MIN_COUNTERS
        and not grown.any()
        and grown.dtype == torch.int32
    )
    assert [t.data_ptr() for t in counters._buffers[device]] == [small.data_ptr(), grown.data_ptr()]
    small.zero_()
    batch, window, num_splits = case_batch("split2_gqa2_pad")
    run_case(batch, window, num_splits)
