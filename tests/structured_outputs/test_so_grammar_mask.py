"""The bitmask on the logits (sample/grammar_mask.py): the Triton kernel (in the interpreter on the
CPU) and the CPU path (xgrammar's kernel) against a per-bit reference, on fresh random inputs."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import xgrammar as xgr

from pagedlm.sample.grammar_mask import apply_grammar_bitmask, unpack_bitmask


def reference(logits: torch.Tensor, indices: list[int], bitmask: np.ndarray) -> torch.Tensor:
    """Bit j % 32 of word j // 32 of bitmask[m] is 0 (or the word is past the row):
    logits[indices[m], j] = -inf."""
    out = logits.clone()
    vocab_size, num_words = logits.shape[1], bitmask.shape[1]
    for m, row in enumerate(indices):
        for j in range(vocab_size):
            word = int(bitmask[m, j // 32]) if j // 32 < num_words else 0
            if not (word >> (j % 32)) & 1:
                out[row, j] = float("-inf")
    return out


@pytest.mark.parametrize("narrow", [False, True], ids=["full", "narrow"])
@pytest.mark.parametrize("triton", [False, True])
@pytest.mark.parametrize("vocab_size", [37, 4096 + 70])
def test_mask_matches_the_per_bit_reference(triton: bool, vocab_size: int, narrow: bool) -> None:
    """narrow: a bitmask a word short of the vocabulary (a tokenizer's vocabulary inside a padded
    model's) bans the tokens past it."""
    gen = torch.Generator().manual_seed(vocab_size + triton)
    num_rows, indices = 5, [3, 0, 4]
    num_words = (vocab_size + 31) // 32 - narrow
    bitmask = torch.randint(-(2**31), 2**31, (len(indices), num_words), generator=gen)
    bitmask = bitmask.to(torch.int32)
    bitmask[1] = -1  # a row that allows everything
    bitmask[2, :] = 0
    bitmask[2, 0] = 1 << 5  # a row that allows token 5 only
    logits = torch.randn(num_rows, vocab_size, generator=gen)
    expected = reference(logits, indices, bitmask.numpy())
    device_types = ("cpu",) if triton else ()
    apply_grammar_bitmask(logits, torch.tensor(indices), bitmask, triton_device_types=device_types)
    torch.testing.assert_close(logits, expected, rtol=0, atol=0)
    width = min(32 * num_words, vocab_size)  # the tokens a row can allow
    assert torch.isfinite(logits[0, :width]).all() and torch.isinf(logits[0, width:]).all()
    assert torch.isfinite(logits[[1, 2]]).all()  # untouched
    assert torch.isfinite(logits[4]).sum() == 1 and torch.isfinite(logits[4, 5])


def test_unpack_agrees_with_xgrammar_packing() -> None:
    """Our unpacking reads xgrammar's layout: its own CPU apply bans the same ids."""
    vocab_size = 100
    bitmask = xgr.allocate_token_bitmask(2, vocab_size)
    bitmask.copy_(torch.randint(-(2**31), 2**31, bitmask.shape).to(torch.int32))
    logits = torch.zeros(2, vocab_size)
    xgr.apply_token_bitmask_inplace(logits, bitmask, backend="torch_native")
    torch.testing.assert_close(unpack_bitmask(bitmask, vocab_size), torch.isfinite(logits))


def test_the_kernel_is_warmed_up_at_start_up(monkeypatch: pytest.MonkeyPatch) -> None:
    """Its one specialisation (the model's vocabulary size) runs among the start-up calls, so no
    constrained step compiles it while serving."""
    from pagedlm.ops.warm_up import WarmUpTarget
    from pagedlm.sample import grammar_mask
    from pagedlm.worker.kernel_warmup import WARM_UP_CALLS

    assert grammar_mask.warm_up in WARM_UP_CALLS
    shapes = []
    apply = grammar_mask.apply_grammar_bitmask

    def recorded(logits, indices, bitmask, triton_device_types=("cpu",)):
        shapes.append((tuple(logits.shape), tuple(bitmask.shape)))
        return apply(logits, indices, bitmask, triton_device_types)

    monkeypatch.setattr(grammar_mask, "apply_grammar_bitmask", recorded)
    target = WarmUpTarget(model=None, device=torch.device("cpu"), vocab_size=70, max_num_tokens=8)
    grammar_mask.warm_up(target)
    assert shapes == [((2, 70), (1, 3))]
