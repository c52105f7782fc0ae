"""The model's TP layers (tp > 1 only; at tp = 1 the model builds its plain layers). Column-parallel
layers need no class of their own: a rank's QKV and gate/up are plain Linears over its rows."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from pagedlm.distributed import collectives
from pagedlm.distributed.parallel_state import TPGroup
from pagedlm.model.layers import Embedding, Linear
from pagedlm.ops.gemv import PendingNorm


class RowParallelLinear(Linear):
    """y = all_reduce(x_r W_r^T) + b: rank r holds the input columns of its heads (o_proj) or its
    share of the intermediate size (down_proj); the bias (replicated) is added once, after the sum.
    Never returns a ResidualSum: the residual is added by the next norm, after the reduce."""

    def __init__(
        self, in_features: int, out_features: int, bias: bool, dtype: torch.dtype, group: TPGroup
    ) -> None:
        super().__init__(in_features, out_features, bias, dtype)
        self.group = group

    def forward(
        self,
        x: torch.Tensor | PendingNorm,
        act: str | None = None,
        residual: torch.Tensor | None = None,
    ) -> torch.Tensor:
        y = collectives.all_reduce(super().forward(x, act, bias=False), self.group)
        return y if self.bias is None else y + self.bias


class VocabParallelEmbedding(Embedding):
    """Rank r holds rows [r * R, (r + 1) * R) of the vocabulary (R = sharding.vocab_shard_rows,
    rows past the vocabulary zero): each rank looks up the ids in its shard, zeros the others,
    and an all-reduce sums the ranks' rows. Also the tied LM head's shard."""

    def __init__(self, shard_rows: int, embedding_dim: int, dtype: torch.dtype, group: TPGroup):
        super().__init__(shard_rows, embedding_dim, dtype)
        torch.nn.init.zeros_(self.weight)  # the last shard's rows past the vocabulary stay zero
        self.group = group
        self.first_id = group.rank * shard_rows

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        local = input_ids - self.first_id  # [T]
        mine = (local >= 0) & (local < self.weight.shape[0])
        rows = F.embedding(torch.where(mine, local, 0), self.weight)  # [T, embedding_dim]
        rows = torch.where(mine[:, None], rows, 0)
        return collectives.all_reduce(rows, self.group)
