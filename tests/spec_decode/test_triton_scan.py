"""The Triton accept scan (triton_scan.py) against the torch path, in the interpreter on the CPU:
ragged drafts, NO_DRAFT entries, mixed greedy and random rows."""

from __future__ import annotations

import numpy as np
import torch

from pagedlm.sample.noise import row_keys_np
from pagedlm.sample.sampler import RandomParams, SamplingBatch
from pagedlm.spec_decode.rejection_sampler import rejection_sample


def test_the_kernel_scans_as_the_torch_path() -> None:
    generator = torch.Generator().manual_seed(0)
    k, vocab = 3, 6
    for trial in range(6):
        num_drafts = torch.randint(0, k + 1, (5,), generator=generator)
        cu = num_drafts.cumsum(0)
        num_rows = int(num_drafts.sum()) + 5
        logits = torch.randn(num_rows, vocab, generator=generator)
        drafts = torch.randint(-1, vocab, (int(num_drafts.sum()),), generator=generator)
        keys = row_keys_np(np.full(num_rows, trial, np.uint64), np.arange(num_rows))
        random = RandomParams(
            noise_keys=torch.from_numpy(keys),
            is_greedy=torch.rand(num_rows, generator=generator) < 0.5,
        )
        batch = SamplingBatch(random=random) if trial % 2 else SamplingBatch()
        torch_out = rejection_sample(logits.clone(), drafts, cu, k, batch, triton_device_types=())
        kernel_out = rejection_sample(
            logits.clone(), drafts, cu, k, batch, triton_device_types=("cpu",)
        )
        assert torch.equal(kernel_out.token_ids, torch_out.token_ids)
        assert torch.equal(kernel_out.num_accepted, torch_out.num_accepted)
        assert torch.equal(kernel_out.num_valid_drafts, torch_out.num_valid_drafts)
