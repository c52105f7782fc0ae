"""Prompt logprobs: for the requests that ask, the logprob of each prompt token given the ones
before it, its rank, and the top-N, from the hidden states of the prompt positions a step runs.

The hidden state at position q predicts token q + 1. A step that computes positions
[start, start + num_scheduled) of a request with P prompt tokens yields the entries of prompt
tokens [start + 1, min(start + num_scheduled, P - 1) + 1), preceded by None (token 0 has no
logprob, as in vLLM) when start == 0; the chunks of a chunked prefill concatenate to the whole
list of P entries. Only the asking requests' rows go through the LM head.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from pagedlm.core.sched_output import Logprobs
from pagedlm.sample.sampler import gather_logprobs
from pagedlm.sample.tables import upload

MAX_ROWS_PER_CHUNK = 512  # bounds the [rows, vocab_size] logits of a long prompt


@dataclass(slots=True)
class PromptLogprobsPlan:
    """Host facts of one step's prompt-logprobs work."""

    req_ids: list[str]  # requests whose prompt this step touches, in batch order
    starts_with_none: list[bool]  # [R]: the chunk starts at token 0
    num_asked: list[int]  # [R]: the top-N each request asked for
    num_entries_np: np.ndarray  # [R] int64: tokens predicted this step per request
    hidden_idx_np: np.ndarray  # [M] int64: batch index of each predicting hidden state
    target_ids_np: np.ndarray  # [M] int64: the prompt token each predicts
    num_logprobs: int  # K: the largest asked in the step


def plan_prompt_logprobs(
    req_ids: list[str],
    rows_np: np.ndarray,
    num_asked_np: np.ndarray,
    num_prompt_np: np.ndarray,
    num_computed_np: np.ndarray,
    num_scheduled_np: np.ndarray,
    query_start_loc_np: np.ndarray,
    token_ids_np: np.ndarray,
) -> PromptLogprobsPlan | None:
    """Per batch entry [B]: its row, prompt_logprobs asked (-1: no), prompt length, tokens
    computed before the step, tokens scheduled, start in the batch; token_ids_np
    [num_rows, max_model_len] the rows' known tokens."""
    touched = np.flatnonzero((num_asked_np >= 0) & (num_computed_np < num_prompt_np))  # [R]
    if touched.size == 0:
        return None
    starts = num_computed_np[touched]
    ends = np.minimum(starts + num_scheduled_np[touched], num_prompt_np[touched] - 1)
    num_entries = np.maximum(ends - starts, 0).astype(np.int64)  # [R]
    entry_req = np.repeat(np.arange(touched.size), num_entries)  # [M]
    offsets = np.arange(entry_req.size) - np.repeat(
        np.cumsum(num_entries) - num_entries, num_entries
    )
    hidden_idx = query_start_loc_np[touched][entry_req] + offsets  # [M]
    target_ids = token_ids_np[rows_np[touched][entry_req], starts[entry_req] + offsets + 1]  # [M]
    return PromptLogprobsPlan(
        req_ids=[req_ids[b] for b in touched.tolist()],  # sync-ok: numpy, host only
        starts_with_none=(starts == 0).tolist(),
        num_asked=num_asked_np[touched].tolist(),  # sync-ok: numpy
        num_entries_np=num_entries,
        hidden_idx_np=hidden_idx.astype(np.int64),
        target_ids_np=target_ids.astype(np.int64),
        num_logprobs=int(num_asked_np[touched].max()),
    )


def compute_prompt_logprobs(
    plan: PromptLogprobsPlan,
    hidden: torch.Tensor,
    compute_logits: Callable[[torch.Tensor], torch.Tensor],
) -> tuple[torch.Tensor, ...] | None:
    """hidden [num_tokens, hidden_size] -> (token_ids [M, 1+K], logprobs [M, 1+K], ranks [M]) on
    the device, the prompt token first; None when no prompt token is predicted this step."""
    num_rows = plan.hidden_idx_np.size
    if num_rows == 0:
        return None
    hidden_idx, target_ids = upload(
        np.stack([plan.hidden_idx_np, plan.target_ids_np]), hidden.device
    )  # [M] each
    parts = []
    for start in range(0, num_rows, MAX_ROWS_PER_CHUNK):
        chunk = slice(start, start + MAX_ROWS_PER_CHUNK)
        logits = compute_logits(hidden.index_select(0, hidden_idx[chunk]))  # [m, V] float32
        parts.append(
            gather_logprobs(
                logits.float().log_softmax(dim=-1), target_ids[chunk], plan.num_logprobs
            )
        )
    return tuple(torch.cat(tensors) for tensors in zip(*parts))


def to_logprobs_lists(
    plan: PromptLogprobsPlan, host_tensors: tuple[torch.Tensor, ...] | None
) -> dict[str, list[Logprobs | None]]:
    """The host copies of compute_prompt_logprobs -> per request its entries of this step,
    each cut to the top-N the request asked for."""
    if host_tensors is not None:
        ids_np, logprobs_np, ranks_np = (
            t.numpy() for t in host_tensors
        )  # sync-ok: host copies, event waited
    result: dict[str, list[Logprobs | None]] = {}
    row = 0
    for req_id, with_none, num_asked, num in zip(
        plan.req_ids, plan.starts_with_none, plan.num_asked, plan.num_entries_np.tolist()
    ):  # sync-ok: numpy
        width = 1 + num_asked
        entries: list[Logprobs | None] = [None] if with_none else []
        entries += [
            logprobs_row(ids_np, logprobs_np, ranks_np, i, width) for i in range(row, row + num)
        ]
        row += num
        result[req_id] = entries
    return result


def logprobs_row(
    ids_np: np.ndarray, logprobs_np: np.ndarray, ranks_np: np.ndarray, i: int, width: int
) -> Logprobs:
    """Row i of host arrays [rows, 1 + K]: the sampled token first, then the top width - 1."""
    return Logprobs(
        token_ids=ids_np[i, :width].tolist(),
        logprobs=logprobs_np[i, :width].tolist(),  # sync-ok: numpy
        sampled_rank=int(ranks_np[i]),
    )
