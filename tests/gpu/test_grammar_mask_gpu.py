"""Structured outputs' bitmask kernel on the GPU (sample/grammar_mask.py): the Triton kernel against
the torch path on fresh random inputs at real vocabulary sizes, no host sync."""

from __future__ import annotations

import pytest
import torch

from pagedlm.sample.grammar_mask import apply_grammar_bitmask

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("narrow", [False, True], ids=["full", "narrow"])
@pytest.mark.parametrize("vocab_size", [49152, 128256, 151936 + 13])
def test_kernel_matches_the_torch_path_without_a_sync(vocab_size: int, narrow: bool) -> None:
    """narrow: a bitmask 3 words short of the vocabulary (a tokenizer's inside a padded model's)."""
    gen = torch.Generator(device="cuda").manual_seed(vocab_size)
    num_rows, num_words = 64, (vocab_size + 31) // 32 - 3 * narrow
    indices = torch.randperm(num_rows, device="cuda", generator=gen)[:40]  # [40] distinct rows
    bitmask = torch.randint(
        -(2**31), 2**31, (40, num_words), device="cuda", generator=gen, dtype=torch.int64
    ).to(torch.int32)
    bitmask[0] = -1  # allows everything
    bitmask[1] = 0  # allows nothing
    logits = torch.randn(num_rows, vocab_size, device="cuda", generator=gen)
    expected = logits.clone()
    apply_grammar_bitmask(expected, indices, bitmask, triton_device_types=())
    torch.cuda.set_sync_debug_mode("error")
    try:
        apply_grammar_bitmask(logits, indices, bitmask)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.testing.assert_close(logits, expected, rtol=0, atol=0)
    untouched = torch.ones(num_rows, dtype=torch.bool, device="cuda")
    untouched[indices] = False
    assert torch.isfinite(logits[untouched]).all()
    assert torch.isinf(logits[indices[1]]).all()
