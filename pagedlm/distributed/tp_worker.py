"""What a model runner needs to know of its TP rank (none of it at tp = 1): its shapes, the part of
each checkpoint tensor it loads, the sampler across ranks, the KV cache size agreed by all ranks."""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

from pagedlm.config import EngineConfig, ModelConfig
from pagedlm.distributed import collectives
from pagedlm.distributed.parallel_state import TPGroup, get_tp_group
from pagedlm.distributed.sampling import TPSampler
from pagedlm.distributed.sharding import checkpoint_slice, local_model_config, vocab_shard_rows
from pagedlm.model.loader import DUMMY_SEED, Shard
from pagedlm.sample.state import SamplingState


@dataclass(frozen=True)
class TPWorkerState:
    group: TPGroup
    config: EngineConfig  # this rank's shapes (local_model_config)
    shard: Shard  # the checkpoint's part this rank loads
    full_model: ModelConfig  # the model's shapes (every rank's slices follow from them)

    @staticmethod
    def create(config: EngineConfig) -> TPWorkerState | None:
        """None unless this process is a rank of a TP group of more than one (parallel_state)."""
        group = get_tp_group()
        if group.size == 1:
            return None
        size = config.parallel.tensor_parallel_size
        assert group.size == size, f"TP group of {group.size} ranks for tensor_parallel_size {size}"
        shard = functools.partial(
            checkpoint_slice, config=config.model, rank=group.rank, tp=group.size
        )
        local = replace(config, model=local_model_config(config.model, group.size))
        return TPWorkerState(group, local, shard, config.model)

    def sampler(self, sampler: SamplingState, num_slots: int) -> TPSampler:
        config = self.config
        return TPSampler(
            sampler,
            self.group,
            config.model.vocab_size,
            vocab_shard_rows(config.model.vocab_size, self.group.size),
            config.parallel.enable_batch_sharded_sampling,
            config.scheduler.max_num_seqs,
            config.device,
            num_slots,
        )


def load_args(tp: TPWorkerState | None) -> tuple:
    """load_model's extra arguments: the rank's shard and a dummy seed of its own."""
    return () if tp is None else (tp.shard, DUMMY_SEED + tp.group.rank)


def min_over_ranks(num_blocks: int) -> int:
    """The KV cache's block count every rank can hold (the least measured)."""
    return collectives.min_over_ranks(num_blocks, get_tp_group())
