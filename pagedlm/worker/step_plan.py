"""StepPlan: how one launched step runs, decided once per step (plan_step) and passed whole to what
launches it (ModelRunner's forward, sampling, LM head and output copies).

The mode, by precedence:
- a decode-shaped step (one token per sequence) of at most the largest decode graph, without
  prompt_embeds, replays the decode graph of SizePolicy.decode_graph_size(num_seqs): STAGED_GRAPH
  where that graph stages its inputs in and the step copies no block table (a table is larger than a
  stage-in reads in one round trip, ops/stage_in.py), else DECODE_GRAPH after the step's one copy;
- any other step of at most the largest piecewise size without prompt_embeds replays the piecewise
  graphs of SizePolicy.piecewise_size(num_tokens) (PIECEWISE);
- the rest runs eagerly (EAGER), as every step does without graphs.
A decode-shaped step within the decode graphs is padded to its graph size even when it runs eagerly
(pads_decode): a later step over the same rows may replay a graph over its sequence sections.
"""

from __future__ import annotations

import enum
from typing import NamedTuple

from pagedlm.worker.batch_layout import BatchLayout
from pagedlm.worker.sizes import SizePolicy
from pagedlm.worker.step_buffers import Sections


class StepMode(enum.Enum):
    DECODE_GRAPH = "decode graph"  # the step's one copy brings the inputs, then the graph replays
    STAGED_GRAPH = "staged decode graph"  # the graph copies its inputs from the staging set itself
    PIECEWISE = "piecewise graphs"  # the graphs between the attention calls; attention eagerly
    EAGER = "eager"


class StepPlan(NamedTuple):
    """Immutable (a NamedTuple: made every step, it costs the host half of a frozen dataclass)."""

    step_id: int
    slot: int  # the staging set, pinned output of sampled ids and event the step uses
    layout: BatchLayout
    mode: StepMode
    # the replayed graphs' size (decode: sequences; piecewise: tokens); None: eager
    graph_size: int | None
    pads_decode: bool  # rows [num_seqs, bucket_seqs) are written as a decode graph's padding rows
    copy_end: int  # the byte the step's input copy (or a staged graph's stage-in) ends at
    staged: Sections  # the staging set's sections of the layout (host)
    inputs: Sections  # the device set's

    @property
    def replays_decode_graph(self) -> bool:
        return self.mode is StepMode.DECODE_GRAPH or self.mode is StepMode.STAGED_GRAPH

    @property
    def stage_slot(self) -> int | None:
        """The staging set a staged graph copies its inputs from; None for any other mode."""
        return self.slot if self.mode is StepMode.STAGED_GRAPH else None


def plan_step(
    step_id: int,
    slot: int,
    layout: BatchLayout,
    staged: Sections,
    inputs: Sections,
    sizes: SizePolicy,
    decode_graphs: bool,
    staged_graphs: bool,
    piecewise_graphs: bool,
) -> StepPlan:
    """The plan of a laid-out step (module notes); decode_graphs, staged_graphs, piecewise_graphs: which
    graphs the runner holds (staged ones: decode graphs that stage their inputs in up to
    SizePolicy.is_staged)."""
    decode_size = None
    if decode_graphs and layout.num_tokens == layout.num_seqs:
        decode_size = sizes.decode_graph_size(layout.num_seqs)
        # one source of truth: the step buffers laid the step out at the graph's size
        assert decode_size is None or decode_size == layout.bucket_seqs, (
            decode_size,
            layout.bucket_seqs,
        )
    num_table_elems = layout.num_table_elems_to_copy
    copy_end = staged.copy_end(not layout.reuse_seq_sections, num_table_elems)
    mode, graph_size = StepMode.EAGER, None
    if layout.embeds_spans:
        pass  # prompt_embeds rows replace the embedding lookup, which the graphs hold
    elif decode_size is not None:
        staged_in = staged_graphs and sizes.is_staged(decode_size) and not num_table_elems
        mode, graph_size = (
            (StepMode.STAGED_GRAPH if staged_in else StepMode.DECODE_GRAPH),
            decode_size,
        )
    elif piecewise_graphs:
        graph_size = sizes.piecewise_size(layout.num_tokens)
        mode = StepMode.EAGER if graph_size is None else StepMode.PIECEWISE
    return StepPlan(
        step_id=step_id,
        slot=slot,
        layout=layout,
        mode=mode,
        graph_size=graph_size,
        pads_decode=decode_size is not None,
        copy_end=copy_end,
        staged=staged,
        inputs=inputs,
    )
