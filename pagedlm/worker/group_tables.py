"""The block tables of KV cache groups 1.. (core/kv_groups.py) on the worker, one row per request
as InputBatch's (which holds group 0's). A step writes each group's slot mapping and compact
block table after group 0's in the same step-buffer sections: group g's slots at
[g * P, g * P + T) of slot_mapping, its table at [g * S * C, (g + 1) * S * C) of block_table
(T tokens, S sequences, C columns of the step; P the layout's token capacity, so that a CUDA
graph of P rows finds each group's slots where it was captured to read them)."""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from pagedlm.attention.backend import AttentionMetadata
from pagedlm.core.sched_output import GroupBlockUpdate


def group_metadata(
    meta: AttentionMetadata,
    sections: dict[str, torch.Tensor],
    num_kv_groups: int,
    tables: torch.Tensor | None = None,
) -> tuple[AttentionMetadata, ...]:
    """Groups 1..'s metadata of a step whose group 0 is `meta`: their slots (the layout's
    `sections`, Sections.tensors) and tables ([G, S, C]; None: the step's compact ones there),
    on the device."""
    if num_kv_groups == 1:
        return ()
    num_tokens, (num_seqs, num_cols) = meta.num_tokens, meta.block_table.shape
    slot_mapping = sections["slot_mapping"]
    capacity = slot_mapping.shape[0] // num_kv_groups  # P
    slots = slot_mapping.view(num_kv_groups, capacity)[:, :num_tokens]  # [G, T]
    if tables is None:
        tables = sections["block_table"][: num_kv_groups * num_seqs * num_cols]
        tables = tables.view(num_kv_groups, num_seqs, num_cols)  # [G, S, C]
    return tuple(
        dataclasses.replace(meta, slot_mapping=slots[g], block_table=tables[g], plans={})
        for g in range(1, num_kv_groups)
    )


class GroupBlockTables:
    def __init__(self, num_groups: int, num_rows: int, num_cols: int) -> None:
        """num_groups: the groups besides group 0."""
        self.num_groups = num_groups
        self.tables_np = np.zeros((num_groups, num_rows, num_cols), np.int32)
        self.num_blocks_np = np.zeros((num_groups, num_rows), np.int32)

    def add(self, row: int, group_block_ids: tuple[list[int], ...]) -> None:
        self._check_count(len(group_block_ids))
        self.tables_np[:, row] = 0
        for g, block_ids in enumerate(group_block_ids):
            self.tables_np[g, row, : len(block_ids)] = block_ids
            self.num_blocks_np[g, row] = len(block_ids)

    def update(self, row: int, updates: tuple[GroupBlockUpdate, ...]) -> bool:
        """Applies the diffs; whether any entry changed."""
        self._check_count(len(updates))
        changed = False
        for g, update in enumerate(updates):
            start = update.num_blocks - len(update.new_block_ids)
            if update.new_block_ids or update.num_blocks != self.num_blocks_np[g, row]:
                self.tables_np[g, row, start : update.num_blocks] = update.new_block_ids
                self.num_blocks_np[g, row] = update.num_blocks
                changed = True
            nulls = self.tables_np[g, row, : update.num_null_blocks]
            if nulls.any():
                nulls[:] = 0
                changed = True
        return changed

    def fill_slots(
        self,
        slot_mapping: np.ndarray,  # [(1 + G) * P] int64, the layout's section: group 0's first
        token_rows: np.ndarray,  # [T]
        positions: np.ndarray,  # [T]
        block_size: int,
    ) -> None:
        num_tokens, capacity = positions.size, slot_mapping.size // (1 + self.num_groups)
        slots = slot_mapping[capacity:].reshape(self.num_groups, capacity)[:, :num_tokens]
        slots[:] = self.tables_np[:, token_rows, positions // block_size] * block_size
        slots += positions % block_size

    def fill_tables(
        self,
        block_table: np.ndarray,  # [(1 + G) * S * C] int32: group 0's table first
        rows: np.ndarray,  # [S]
        num_cols: int,
    ) -> None:
        table_size = rows.size * num_cols
        tables = block_table[table_size : (1 + self.num_groups) * table_size]
        tables.reshape(self.num_groups, rows.size, num_cols)[:] = self.tables_np[:, rows, :num_cols]

    def _check_count(self, num_groups: int) -> None:
        if num_groups != self.num_groups:
            raise ValueError(
                f"group block tables: {num_groups} given, the model has {self.num_groups} groups "
                "besides group 0"
            )
