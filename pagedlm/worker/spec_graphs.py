"""Full CUDA graphs of uniform speculative decode steps: S sequences of q = 1 + n tokens each (a
request's last known token, then its n drafts), every request sampling (issue 26). Without them
such a step replays the piecewise graphs with each layer's attention launched eagerly between
them, and a speculating request waits for its step (core/spec_plan.py), so those host launches
add to every step.

Shapes (spec_graph_shapes): each decode capture size S at which a batch may speculate, times each q
in 2..1 + k (k: the most drafts a batch of that size takes), while S x q <= max_num_tokens.

Inputs: the runner's device StepBuffers at the layout (SizePolicy.uniform_tokens_bucket(S, q), S),
where InputBatch lays a uniform step out, with sequences [B, S) and tokens [B x q, S x q) as
padding (StepBuffers.pad_decode with query_len q: slot -1, seq_len 0, no query); the decode graphs'
fixed-width block tables, one per KV cache group (DecodeGraphs.load_block_table); and this
module's input ids [S x q],
which the runner fills before the replay: the ids table gathered by input_src, then the drafts
from the DraftStore (SpecWorker.write_draft_inputs). Padding tokens keep stale ids (valid tokens).

Attention: the varlen kernel's query-tile path (max_query_len q, num_decodes 0), whose grid and
tile come from host ints fixed per shape (S x q tokens, S sequences, q); it reads the real
query_start_loc and seq_lens on the device and skips tiles past a sequence's query. It is the
kernel an eager or piecewise step of the same batch runs, so a replay gives the eager values.

Outputs: the hidden states [S x q, hidden_size], in the decode graphs' memory pool (valid until
the next replay of any of them); the rejection sampler reads rows [0, B x q) right after.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch

from pagedlm.attention.backend import AttentionMetadata
from pagedlm.model.llama import LlamaForCausalLM
from pagedlm.spec_decode.config import SpeculativeConfig
from pagedlm.worker.graph_capture import warmed_up_graph
from pagedlm.worker.group_tables import group_metadata
from pagedlm.worker.sizes import SizePolicy
from pagedlm.worker.step_buffers import StepBuffers

if TYPE_CHECKING:
    from pagedlm.worker.step_plan import StepPlan

Shape = tuple[int, int]  # (sequences S, query tokens a sequence q)


def spec_graph_shapes(
    spec: SpeculativeConfig | None, sizes: SizePolicy, min_query_len: int = 2
) -> list[Shape]:
    """(S, q) of each graph, ascending (module notes): for each capture size S where a batch
    of (previous capture size, S] requests drafts, q in min_query_len..1 + the most drafts it
    takes, within max_num_tokens (min_query_len 1: its steps without drafts too)."""
    if spec is None:
        return []
    shapes, previous = [], 0
    for size in sizes.capture_sizes:
        k = max(spec.num_spec_tokens_for_batch(b) for b in range(previous + 1, size + 1))
        queries = range(min_query_len, k + 2) if k else ()
        shapes += [(size, q) for q in queries if size * q <= sizes.max_num_tokens]
        previous = size
    return shapes


class SpecDecodeGraphs:
    """One graph per shape over the runner's static buffers; capture() once (inside the decode
    graphs' capture), then replay_step() per uniform step."""

    def __init__(
        self,
        model: LlamaForCausalLM,
        kv_caches: list[torch.Tensor],
        inputs: StepBuffers,
        block_tables: torch.Tensor,  # [G, max_size, max_blocks_per_req] int32, the decode graphs'
        sizes: SizePolicy,
        max_model_len: int,
        shapes: Sequence[Shape],
    ) -> None:
        self.shapes = shapes
        self._shape_set = set(shapes)
        self._model, self._kv_caches, self._inputs = model, kv_caches, inputs
        self._block_tables, self._sizes, self._max_model_len = block_tables, sizes, max_model_len
        max_tokens = max(s * q for s, q in shapes)
        self._input_ids = torch.zeros(max_tokens, dtype=torch.int64, device=block_tables.device)
        self._cpu_zeros = torch.zeros(max(s for s, _ in shapes) + 1, dtype=torch.int32)
        self._graphs: dict[Shape, torch.cuda.CUDAGraph] = {}
        self._outputs: dict[Shape, torch.Tensor] = {}  # [S x q, hidden_size], in the pool

    def __contains__(self, shape: Shape) -> bool:
        return shape in self._shape_set

    def layout_tokens(self, shape: Shape) -> int:
        """The token capacity of the layout a graph of this shape reads."""
        num_seqs, query_len = shape
        return self._sizes.uniform_tokens_bucket(num_seqs, query_len)

    def input_ids(self, num_tokens: int) -> torch.Tensor:
        """[num_tokens] int64: the graphs' input ids (the first num_tokens)."""
        return self._input_ids[:num_tokens]

    def replay_step(
        self, plan: StepPlan, write_drafts: Callable[[torch.Tensor], None]
    ) -> torch.Tensor:
        """A uniform step's forward: its input ids gathered from the ids table by input_src, the
        drafts written over theirs (write_drafts, SpecWorker.write_draft_inputs), then the graph
        of (graph_size, uniform_query_len) -> its hidden states [S x q, hidden_size]."""
        num_tokens, inputs = plan.layout.num_tokens, plan.inputs
        input_ids = self.input_ids(num_tokens)  # [T]
        src = inputs.prefix("input_src", num_tokens)
        torch.index_select(inputs.tensors["ids_table"], 0, src, out=input_ids)
        write_drafts(input_ids)
        return self.replay((plan.graph_size, plan.layout.uniform_query_len))

    def capture(self, pool: tuple[int, int]) -> None:
        """On the current (capture) stream, most tokens first (the smaller reuse their pool
        blocks), each after a warm-up run (Triton's compile, cuBLAS's workspace) over an
        all-padding batch: no KV is read or written."""
        for shape in sorted(self.shapes, key=lambda sq: (sq[0] * sq[1], sq), reverse=True):
            self._fill_padding(shape)
            self._graphs[shape] = warmed_up_graph(functools.partial(self._run, shape), pool)

    def replay(self, shape: Shape) -> torch.Tensor:
        """[S x q, hidden_size]: the hidden states of the padded batch (the graph's tensor)."""
        self._graphs[shape].replay()
        return self._outputs[shape]

    def _run(self, shape: Shape) -> None:
        num_seqs, query_len = shape
        num_tokens = num_seqs * query_len
        inputs = self._inputs.sections(self.layout_tokens(shape), num_seqs).tensors
        meta = AttentionMetadata(
            num_tokens=num_tokens,
            num_seqs=num_seqs,
            max_query_len=query_len,
            max_seq_len=self._max_model_len,
            query_start_loc=inputs["query_start_loc"],
            seq_lens=inputs["seq_lens"],
            slot_mapping=inputs["slot_mapping"][:num_tokens],
            block_table=self._block_tables[0, :num_seqs],
            # host copies of the capture's batch: the Triton backend reads none of them here
            query_start_loc_cpu=self._cpu_zeros[: num_seqs + 1],
            seq_lens_cpu=self._cpu_zeros[:num_seqs],
            decode_order=None,
            num_decodes=0,
        )
        num_groups = self._block_tables.shape[0]
        meta.groups = group_metadata(meta, inputs, num_groups, self._block_tables[:, :num_seqs])
        self._outputs[shape] = self._model(
            self.input_ids(num_tokens), inputs["positions"][:num_tokens], self._kv_caches, meta
        )  # [S x q, hidden_size]

    def _fill_padding(self, shape: Shape) -> None:
        num_seqs, query_len = shape
        self._inputs.pad_decode(
            self._inputs.sections(self.layout_tokens(shape), num_seqs),
            num_seqs=0,
            num_samples=0,
            seq_sections=True,
            query_len=query_len,
        )
