"""The one-kernel threshold (triton_threshold.py) against a sort and the torch radix select; in the
sampler in place of the torch path. On the CPU the kernel runs in the Triton interpreter; outputs
start as NaN (tests/conftest.py's nan_poisoned_empty)."""

from __future__ import annotations

import pytest
import torch
from test_sample_filters import random_probs, reference_threshold
from test_triton_draw import sampled_ids

from pagedlm.sample import sampler
from pagedlm.sample.filters import TopKTopP, top_k_top_p_threshold
from pagedlm.sample.triton_threshold import triton_top_k_top_p_threshold
from pagedlm.sampling_params import SamplingParams

pytestmark = pytest.mark.usefixtures("nan_poisoned_empty")


def mixed_params(num_rows: int, vocab_size: int, seed: int) -> tuple[torch.Tensor, TopKTopP]:
    """(floor [M], params): rows with and without min-p, top-k (1, the vocabulary, random) and top-p
    (1e-30, which keeps the top id; 1: off)."""
    gen = torch.Generator().manual_seed(seed)
    top_k = torch.randint(1, min(vocab_size, 300), (num_rows,), generator=gen)
    top_k[1::3] = 0
    top_k[2], top_k[4] = 1, vocab_size
    top_p = torch.rand(num_rows, generator=gen) * 0.9 + 0.05
    top_p[::4] = 1.0
    top_p[3] = 1e-30
    floor = torch.where(torch.arange(num_rows) % 5 == 0, 0.05, 0.0)
    params = TopKTopP(
        index=None,
        top_k=top_k,
        top_p=top_p,
        max_top_k=int(top_k.max()),
        every_row_top_k=False,
        any_top_p=True,
    )
    return floor, params


@pytest.mark.parametrize("num_rows, vocab_size", [(40, 1500), (6, 20001)])
def test_threshold_equals_the_sort_and_the_radix_select(num_rows: int, vocab_size: int) -> None:
    probs = random_probs(num_rows, vocab_size, seed=num_rows)
    floor, params = mixed_params(num_rows, vocab_size, seed=vocab_size)
    got = triton_top_k_top_p_threshold(probs, floor, params)
    want = reference_threshold(probs, floor, params.top_k, params.top_p)
    assert torch.equal(got, want), (got - want).abs().max()
    assert torch.equal(got, top_k_top_p_threshold(probs, floor, params))
    assert got[3] == 1.0  # top_p 1e-30: the top id only
    num_kept = (probs >= got[:, None]).sum(dim=-1)
    assert num_kept[2] == (probs[2] == probs[2].max()).sum()  # top_k 1 keeps the top value's ties
    cut = (params.top_p < 1) & (params.top_k == 0) & (floor == 0)
    assert cut.any() and (num_kept[cut] < vocab_size).all()  # top-p cuts where it alone applies


@pytest.mark.parametrize("top_p", [0.9999999, 0.99999994])
def test_a_top_p_within_rounding_of_one_never_cuts_under_min_p_or_top_k(top_p: float) -> None:
    """top_p ~ 1 - 1e-7: the target is within rounding of the whole weight, where a pass's sums in
    another order can fall short of it; the cut must still keep nothing under the floor or the k-th
    value (it once fell 30x under the k-th value on such rows), in the kernel and the torch path."""
    num_rows, vocab_size = 48, 8000
    probs = random_probs(num_rows, vocab_size, seed=11)
    floor, params = mixed_params(num_rows, vocab_size, seed=12)
    params.top_p.fill_(top_p)
    ranked = probs.sort(dim=-1, descending=True).values
    kth = torch.where(
        params.top_k > 0, ranked.gather(1, (params.top_k - 1).clamp(min=0)[:, None])[:, 0], 0.0
    )
    for got in (
        triton_top_k_top_p_threshold(probs, floor, params),
        top_k_top_p_threshold(probs, floor, params),
    ):
        assert (got >= torch.maximum(floor, kth)).all(), (got - torch.maximum(floor, kth)).min()


def test_threshold_without_a_floor_and_on_a_strided_batch() -> None:
    """No min-p (the floor argument unread); rows taken from a wider buffer (a row stride > V)."""
    wide = random_probs(9, 1200, seed=5)
    probs = wide[:, :1000]
    probs = probs / probs.amax(dim=-1, keepdim=True)  # the top value 1 again
    wide[:, :1000] = probs
    _, params = mixed_params(9, 1000, seed=6)
    got = triton_top_k_top_p_threshold(wide[:, :1000], None, params)
    want = reference_threshold(probs, torch.zeros(9), params.top_k, params.top_p)
    want[(params.top_k == 0) & (params.top_p == 1.0)] = 0.0
    assert torch.equal(got, want), (got - want).abs().max()


MIXED_ROWS = [
    SamplingParams(temperature=0.8, seed=1, top_p=0.9),
    SamplingParams(temperature=1.0, seed=2),
    SamplingParams(temperature=0.7, seed=3, top_k=20, min_p=0.05),
    SamplingParams(temperature=0.0),
    SamplingParams(temperature=1.2, seed=4, top_k=5, top_p=0.5),
    SamplingParams(temperature=0.9, seed=5, min_p=0.1),
]
EVERY_ROW_TOP_K = [
    SamplingParams(temperature=0.8, seed=i, top_k=3 + i, top_p=(1.0, 0.6)[i % 2]) for i in range(4)
]


@pytest.mark.parametrize("params, kernel_rows", [(MIXED_ROWS, [3]), (EVERY_ROW_TOP_K, [])])
def test_sampler_takes_the_triton_threshold(
    monkeypatch: pytest.MonkeyPatch, params: list[SamplingParams], kernel_rows: list[int]
) -> None:
    """Rows with top-p, top-k and min-p among plain ones: the kernel is called on the rows that have
    top-k or top-p; where every row has a top-k (<= TOP_K_LIMIT), torch.topk's path instead. The ids
    equal the torch path's."""
    num_rows, vocab_size = len(params), 700
    logits = torch.randn(num_rows, vocab_size, generator=torch.Generator().manual_seed(7)) * 3
    calls: list[int] = []

    def counted(probs: torch.Tensor, floor: torch.Tensor | None, tktp: TopKTopP) -> torch.Tensor:
        calls.append(probs.shape[0])
        return triton_top_k_top_p_threshold(probs, floor, tktp)

    monkeypatch.setattr(sampler, "triton_top_k_top_p_threshold", counted)
    sampled = []
    for device_types in (("cuda",), ("cuda", "cpu")):
        sampled.append(sampled_ids(params, logits, device_types))
    assert calls == kernel_rows  # mixed: rows 0, 2 and 4
    assert torch.equal(sampled[0], sampled[1])


@pytest.mark.gpu
def test_threshold_cuts_where_the_mass_says_on_cuda() -> None:
    """A decode batch's shape, [256, 151936]: top-k rows equal the sort's k-th value; every top-p
    cut t meets its definition in float64 within float32 rounding: the mass above t is short of the
    target, the mass at or above t reaches it."""
    num_rows, vocab_size = 256, 151936
    probs = random_probs(num_rows, vocab_size, seed=8)
    floor, params = mixed_params(num_rows, vocab_size, seed=9)
    got = triton_top_k_top_p_threshold(
        probs.cuda(),
        floor.cuda(),
        TopKTopP(None, params.top_k.cuda(), params.top_p.cuda(), params.max_top_k, False, True),
    ).cpu()
    assert torch.isfinite(got).all()
    want = reference_threshold(probs, floor, params.top_k, params.top_p)
    only_k = params.top_p == 1.0
    assert torch.equal(got[only_k], want[only_k])
    ranked = probs.double().sort(dim=-1, descending=True).values
    for row in torch.nonzero(~only_k).flatten().tolist():
        k = int(params.top_k[row])
        base = max(float(floor[row]), float(ranked[row, k - 1]) if k > 0 else 0.0)
        kept = torch.where(ranked[row] >= base, ranked[row], 0.0)
        target = max(float(params.top_p[row]) * float(kept.sum()), torch.finfo(torch.float32).tiny)
        t = float(got[row])
        slack = 1e-5 * float(kept.sum())
        assert float(kept[ranked[row] > t].sum()) < target + slack, row
        assert float(kept[ranked[row] >= t].sum()) >= target - slack, row
        assert t in probs[row], row


def test_the_kernel_takes_unaligned_parameters_without_another_compile(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A one-row batch's min-p, top-k and top-p can be column views 4 or 8 bytes into the sampler's
    parameter tables. Triton specialises pointers on 16-byte alignment, and the warm-up compiled the
    aligned kernel: it must not specialise on these (else a compile while serving), and the views reach
    it as they are."""
    from pagedlm.sample import triton_threshold

    kernel = (
        triton_threshold.threshold_kernel
    )  # the interpreter keeps the decorator's arguments in kwargs
    options = kernel.kwargs if hasattr(kernel, "kwargs") else vars(kernel)
    assert set(options["do_not_specialize_on_alignment"]) == {"floor_ptr", "top_k_ptr", "top_p_ptr"}
    launched: list[tuple] = []

    class Recorder:
        def __getitem__(self, grid):
            return lambda *args, **kwargs: launched.append(args)

    monkeypatch.setattr(triton_threshold, "threshold_kernel", Recorder())
    floats = torch.rand(1, 4)
    ints = torch.ones(1, 3, dtype=torch.int64)
    params = TopKTopP(
        index=None,
        top_k=ints[:, 1],
        top_p=floats[:, 3],
        max_top_k=1,
        every_row_top_k=True,
        any_top_p=True,
    )
    floor = floats[:, 1]
    assert floor.data_ptr() % 16 and ints[:, 1].data_ptr() % 16  # the views are not aligned
    triton_top_k_top_p_threshold(torch.rand(1, 50), floor, params)
    passed = {arg.data_ptr() for arg in launched[0] if isinstance(arg, torch.Tensor)}
    assert {floor.data_ptr(), ints[:, 1].data_ptr(), floats[:, 3].data_ptr()} <= passed
