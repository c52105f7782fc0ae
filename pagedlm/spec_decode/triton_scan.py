"""The accept scan of the rejection sampler in one Triton kernel (CUDA): one program a request
reads its rows' verdicts and tokens and writes its output row, where the torch path
(rejection_sampler._scan) launches a dozen small kernels."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _accept_scan_kernel(
    accept_ptr,  # [T] int8: row's draft accepted
    token_ptr,  # [T] int64: the row's token if reached
    draft_ptr,  # [T] int64: the row's draft id, -1 on bonus rows and for no draft
    cu_ptr,  # [R] int64: cumulative draft counts
    out_ptr,  # [R, K + 1] int64
    num_accepted_ptr,  # [R] int64
    num_valid_ptr,  # [R] int64
    K: tl.constexpr,
    BLOCK: tl.constexpr,  # a power of two > K
):
    request = tl.program_id(0)
    end = tl.load(cu_ptr + request)
    start = tl.load(cu_ptr + request - 1, mask=request > 0, other=0)
    num_drafts = end - start
    first_row = start + request
    position = tl.arange(0, BLOCK)
    is_draft = position < num_drafts
    accepted = tl.load(accept_ptr + first_row + position, mask=is_draft, other=0)
    refused_at = tl.where(is_draft & (accepted == 0), position, num_drafts)
    num_accepted = tl.min(refused_at, axis=0)
    draft = tl.load(draft_ptr + first_row + position, mask=is_draft, other=-1)
    num_valid = tl.sum((draft >= 0).to(tl.int64), axis=0)
    reached = position <= num_accepted
    token = tl.load(token_ptr + first_row + position, mask=reached, other=0)
    in_row = position < K + 1
    tl.store(out_ptr + request * (K + 1) + position, tl.where(reached, token, -1), mask=in_row)
    tl.store(num_accepted_ptr + request, num_accepted.to(tl.int64))
    tl.store(num_valid_ptr + request, num_valid)


def triton_accept_scan(
    accept: torch.Tensor, token: torch.Tensor, draft: torch.Tensor, cu: torch.Tensor, k: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """accept [T] bool, token [T], draft [T] (per target row), cu [R] -> token_ids [R, K + 1],
    num_accepted [R], num_valid_drafts [R]."""
    num_reqs = cu.shape[0]
    out = torch.empty(num_reqs, k + 1, dtype=torch.int64, device=token.device)
    num_accepted = torch.empty(num_reqs, dtype=torch.int64, device=token.device)
    num_valid = torch.empty_like(num_accepted)
    _accept_scan_kernel[(num_reqs,)](
        accept.to(torch.int8),
        token,
        draft,
        cu,
        out,
        num_accepted,
        num_valid,
        K=k,
        BLOCK=triton.next_power_of_2(k + 1),
    )
    return out, num_accepted, num_valid
