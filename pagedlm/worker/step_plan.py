"""StepPlan: how one launched step runs, decided once per step (plan_step) and passed whole to what
launches it (ModelRunner's forward, sampling, LM head and output copies).

The mode, by precedence:
- a decode-shaped step (one token per sequence) of at most the largest decode graph, without
  prompt_embeds, replays the decode graph of SizePolicy.decode_graph_size(num_seqs): STAGED_GRAPH
  where that graph stages its inputs in and the step copies no block table (a table is larger than a
  stage-in reads in one round trip, ops/stage_in.py), else DECODE_GRAPH after the step's one copy;
- a uniform speculative step (every request 1 + n tokens, n drafts, sampling: uniform_query_len)
  whose (bucket_seqs, 1 + n) graph the runner holds replays it (SPEC_GRAPH, spec_graphs.py);
- any other step of at most the largest piecewise size without prompt_embeds replays the piecewise
  graphs of SizePolicy.piecewise_size(num_tokens) (PIECEWISE);
- the rest runs eagerly (EAGER), as every step does without graphs.
A decode-shaped step within the decode graphs is padded to its graph size even when it runs eagerly
(pads_decode): a later step over the same rows may replay a graph over its sequence sections.
"""

from __future__ import annotations

import enum
from collections.abc import Container
from typing import NamedTuple

from pagedlm.worker.batch_layout import BatchLayout
from pagedlm.worker.sizes import SizePolicy
from pagedlm.worker.step_buffers import Sections


class StepMode(enum.Enum):
    DECODE_GRAPH = "decode graph"  # the step's one copy brings the inputs, then the graph replays
    STAGED_GRAPH = "staged decode graph"  # the graph copies its inputs from the staging set itself
    SPEC_GRAPH = "uniform speculative graph"  # S sequences x (1 + n) tokens, after the one copy
    PIECEWISE = "piecewise graphs"  # the graphs between the attention calls; attention eagerly
    EAGER = "eager"


class StepPlan(NamedTuple):
    """Immutable (a NamedTuple: made every step, it costs the host half of a frozen dataclass)."""

    step_id: int
    slot: int  # the staging set, pinned output of sampled ids and event the step uses
    layout: BatchLayout
    mode: StepMode
    # the replayed graphs' size (decode, speculative: sequences; piecewise: tokens); None: eager
    graph_size: int | None
    # rows [num_seqs, bucket_seqs) (their uniform_query_len tokens each) are written as a graph's
    # padding rows
    pads_decode: bool
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
    spec_graphs: Container[tuple[int, int]] = (),
) -> StepPlan:
    """The plan of a laid-out step (module notes); decode_graphs, staged_graphs, piecewise_graphs: which
    graphs the runner holds (staged ones: decode graphs that stage their inputs in up to
    SizePolicy.is_staged); spec_graphs: the (sequences, query length) of its uniform speculative
    graphs."""
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
    spec_shape = (layout.bucket_seqs, layout.uniform_query_len)
    if layout.embeds_spans:
        pass  # prompt_embeds rows replace the embedding lookup, which the graphs hold
    elif layout.uniform_query_len and spec_shape in spec_graphs:
        # one source of truth: the step was laid out at the graph's layout
        assert layout.bucket_tokens == sizes.uniform_tokens_bucket(*spec_shape), layout
        mode, graph_size = StepMode.SPEC_GRAPH, layout.bucket_seqs
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
        pads_decode=decode_size is not None or mode is StepMode.SPEC_GRAPH,
        copy_end=copy_end,
        staged=staged,
        inputs=inputs,
    )
