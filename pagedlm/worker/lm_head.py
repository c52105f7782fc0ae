"""The LM head at a fixed set of row counts.

cuBLAS blocks the host until the GPU idles the first time a row count makes it pick a kernel it has
not run yet in the process (tens of ms behind a busy GPU, in almost every prefill step of a workload
whose sampling-row counts are new each time: benchmarks/RESULTS.md, "Measured choices"). So the LM
head only runs at the row counts of `bucket` (SizePolicy.lm_head_rows: every CUDA-graph capture size,
then multiples of sizes.LARGE_BUCKET), all run once at start-up (`warm_up`): a step's sampling rows,
or a chunk of its prompt-logprob rows, are copied into the first rows of a padded buffer and the LM
head runs on bucket(num_rows) of them. Rows past the copied ones are stale; their logits are
computed and dropped.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

LMHead = Callable[
    [torch.Tensor], torch.Tensor
]  # hidden [n, hidden_size] -> logits [n, vocab_size] float32


class PaddedLMHead:
    """The padded buffer and the row counts; the LM head itself (the model's compute_logits) is
    passed to each call, so that this holds no reference to the model or its owner."""

    def __init__(
        self,
        bucket: Callable[[int], int],
        max_rows: int,
        hidden_size: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        """max_rows: the most rows the LM head takes at once."""
        self.bucket = bucket
        self.hidden = torch.zeros(
            bucket(max_rows), hidden_size, dtype=dtype, device=device
        )  # [rows, hidden]

    def run(self, compute_logits: LMHead, rows: torch.Tensor) -> torch.Tensor:
        """rows [m, hidden_size] -> logits [m, vocab_size] float32."""
        num_rows = rows.shape[0]
        padded = self.hidden[: self.bucket(num_rows)]
        padded[:num_rows].copy_(rows)
        return leading(compute_logits(padded), num_rows)

    def gathered(
        self, compute_logits: LMHead, hidden: torch.Tensor, indices: torch.Tensor
    ) -> torch.Tensor:
        """hidden [T, hidden_size], indices [m] -> the logits [m, vocab_size] float32 of hidden[indices]."""
        num_rows = indices.shape[0]
        padded = self.hidden[: self.bucket(num_rows)]
        torch.index_select(hidden, 0, indices, out=padded[:num_rows])
        return leading(compute_logits(padded), num_rows)

    def warm_up(self, compute_logits: LMHead) -> None:
        """Runs the LM head at every row count `bucket` gives up to the buffer's; start-up only."""
        for num_rows in sorted({self.bucket(n) for n in range(1, self.hidden.shape[0] + 1)}):
            compute_logits(self.hidden[:num_rows])


def leading(tensor: torch.Tensor, num_rows: int) -> torch.Tensor:
    """The first num_rows rows (the tensor itself when it has no more: no view to make)."""
    return tensor if tensor.shape[0] == num_rows else tensor[:num_rows]
