"""CUDA graphs of the model forward for pure-decode batches (one query token per sequence).

One graph per capture size (the runner's SizePolicy, sizes.py), all in one memory pool, captured
largest first after a warm-up run each. A batch of n sequences replays the smallest size >= n that is
kept (keep_fastest): after the capture, each graph above MAX_LOGITS_ROWS rows is timed over an
all-padding batch together with the LM head the runner then runs on its rows (replay_times), and a
size gives way to the next kept larger one when that one replays markedly faster
(sizes.fastest_sizes) and its capture chose the same attention kernel (triton_backend.decode_kind:
the number of decode splits and whether only the longest sequences split; the all-padding batch
attends to nothing, so the timing cannot see that difference; each kind holds one range of sizes).
cuBLAS's heuristic picks a poor kernel at some row counts (llama3-8b's gate_up GEMM at 448 rows is
much slower than at 512: benchmarks/probes/gemm_rows_scan.py), and a workload's decode batches may
sit just below such a size. Padding rows cost their GEMM and LM-head rows and elementwise work; the
attention skips them (below). The times differ from one capture to the next, so a restart may keep
other sizes and, as bf16 GEMMs differ by row count, give other tokens; --no-graph-size-timing keeps
every size. Measured: benchmarks/RESULTS.md, "Measured choices".

Every graph input is a static device buffer: the sections of the runner's device StepBuffers in
the layout of that size (a decode step of n sequences is laid out at exactly these addresses:
step_buffers.py), which the host fills and pads before the replay with one copy, and a block table
of this module with a fixed width (max blocks per sequence) per KV cache group, into which
load_block_table copies the step's compact tables when they changed (replays of the same tables
skip that copy). A model with several groups (sliding and full layers) reads each group's slots
and table in its layers (worker/group_tables.py), its slots at the layout's group offsets.

Each graph first gathers its input ids itself: input_ids[i] = ids_table[input_src[i]], the token
the row sampled last (still on the device: async scheduling) or the one the host copied.

Padding rows [n, size): token 0 at position 0, slot -1 (the KV write skips it), seq_len 0 and no
query (query_start_loc stays flat at n), which the varlen and split-decode kernels both skip;
their output rows are garbage and never read (every op is row-independent outside attention).
They come last in decode_order (the varlen kernel's launch order, longest sequence first), which
must be a permutation of range(size).

Graphs of at most MAX_LOGITS_ROWS rows also compute the logits (compute_logits of every row,
float32) and their argmax (int64), and write that argmax into last_sampled at sample_rows (the
padding rows, and rows past the step's samples, at scratch entries past the real rows), so that
a small greedy decode step launches no LM head, no argmax and no scatter of its own: the runner
takes the graph's ids when the batch samples greedily and nothing else; otherwise its sampler's
ids overwrite last_sampled after the replay. The host's launch of those ops was most of a batch-1
step's host time. The argmax is ops/argmax.py's two kernels (faster than torch.argmax on a
vocabulary-sized row). Hidden states, logits and ids live in the graph's pool,
valid only until the next replay (of any size: sizes share the pool); the runner reads them right
after the replay, in stream order. Each size's hidden states stay allocated in the pool (~86 MB
for llama3-8b's 51 sizes up to 512, ~190 MB for its 67 up to 1,024, which the trial capture counts
before the KV cache is sized):
a copy into one shared static buffer cost a kernel a step and broke the PDL chain into the LM head.

Graphs of at most sizes.STAGED_MAX_SIZE rows come twice more, one per host staging set: such a graph first
copies the step's inputs from that pinned set itself (ops/stage_in.py: a kernel, no copy-engine
operation) and its argmax also writes the ids into that set's pinned output (the runner's sampled ids),
so a steady small decode step is one graph launch and an event (replay(size, slot)). The runner takes
them for every decode step of such a size that copies no block table; the plain graph (replay(size))
takes the others, whose inputs, table included, one copy brings before it.

The host ints of the captured AttentionMetadata are fixed per size: num_tokens = num_seqs = size,
max_query_len 1, max_seq_len = max_model_len. So the backend's choice of kernel (varlen or split
decode) and the number of splits are made once, at capture, for the longest possible context;
the kernels read the real per-sequence lengths from seq_lens on the device at each replay.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import torch
import triton

from pagedlm.attention.backend import AttentionMetadata
from pagedlm.attention.triton_backend import decode_kind
from pagedlm.config import EngineConfig
from pagedlm.model.llama import LlamaForCausalLM, model_kv_groups
from pagedlm.ops.argmax import greedy_pick
from pagedlm.ops.stage_in import stage_in
from pagedlm.spec_decode.draft_graphs import DraftGraphs
from pagedlm.worker.graph_capture import warmed_up_graph
from pagedlm.worker.group_tables import group_metadata
from pagedlm.worker.sizes import MAX_LOGITS_ROWS, Moves, SizePolicy
from pagedlm.worker.spec_graphs import Shape, SpecDecodeGraphs
from pagedlm.worker.step_buffers import StepBuffers

TIMED_ROUNDS = 3  # replays per size; its time is the least of them


def graphs_enabled(config: EngineConfig) -> bool:
    """Graphs run on CUDA with the Triton backend (auto picks it there), unless enforce_eager:
    the torch reference reads host tensors, which a replay would not refresh."""
    return (
        config.device.type == "cuda"
        and not config.enforce_eager
        and config.attention_backend in ("auto", "triton")
    )


@torch.inference_mode()
def least_times_ms(
    sizes: list[int], run: Callable[[int], None], device: torch.device
) -> dict[int, float]:
    """Size -> ms of run(size) on the device's current stream, the least of TIMED_ROUNDS: one call a
    round over the sizes, after an untimed round (a drift of the clocks touches every size alike).
    Start-up only: it waits for the GPU."""
    stream = torch.cuda.current_stream(device)
    marks: dict[int, list[tuple[torch.cuda.Event, torch.cuda.Event]]] = {size: [] for size in sizes}
    for round_index in range(TIMED_ROUNDS + 1):
        for size in sizes:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record(stream)
            run(size)
            end.record(stream)
            if round_index:
                marks[size].append((start, end))
    torch.cuda.synchronize(device)  # sync-ok: start-up, the events' times
    return {
        size: min(start.elapsed_time(end) for start, end in pairs) for size, pairs in marks.items()
    }


class DecodeGraphs:
    """The graphs of one model over one KV cache (they bind its address) and the runner's
    static step buffers. capture() once; then per decode step load_block_table() (when the
    table changed) and replay(size)."""

    def __init__(
        self,
        config: EngineConfig,
        model: LlamaForCausalLM,
        kv_caches: list[torch.Tensor],
        inputs: StepBuffers,
        max_num_blocks_per_req: int,
        staging: Sequence[StepBuffers] = (),
        host_ids: Sequence[torch.Tensor] = (),
        *,
        sizes: SizePolicy,
        spec_shapes: Sequence[Shape] = (),
        draft: DraftGraphs | None = None,
    ) -> None:
        """staging, host_ids: per host staging set, the set and its pinned int64 output of sampled ids
        ([>= largest staged size]), for the staged graphs (none when empty); sizes: the runner's,
        whose decode sizes these graphs are (captured, then kept by keep_fastest); spec_shapes:
        the uniform speculative steps' graphs (spec_graphs.py), captured in the same pool over
        the same block table; draft: the draft model's graphs (draft_graphs.py),
        captured last in the same pool."""
        self._sizes = sizes
        self.max_size = sizes.max_decode_size
        self._max_model_len = config.model.max_model_len
        self._model = model
        self._kv_caches = kv_caches
        self._inputs = inputs
        self._staging, self._host_ids = list(staging), list(host_ids)
        device = config.device
        self._num_kv_groups = len(model_kv_groups(config.model))
        # [G, max_size, max_blocks_per_req]: each KV cache group's (worker/group_tables.py)
        self.block_tables = torch.zeros(
            self._num_kv_groups,
            self.max_size,
            max_num_blocks_per_req,
            dtype=torch.int32,
            device=device,
        )
        self.block_table = self.block_tables[0]  # [max_size, max_blocks_per_req]: group 0's
        self.block_table_version: int | None = None  # the runner's table version it holds
        self.input_ids = torch.zeros(self.max_size, dtype=torch.int64, device=device)  # gathered
        # The host copies in the metadata describe the capture-time batch (all padding); the
        # Triton backend never reads them, and a replay could not refresh them.
        self._query_start_loc_cpu = torch.zeros(self.max_size + 1, dtype=torch.int32)
        self._seq_lens_cpu = torch.zeros(self.max_size, dtype=torch.int32)
        self._graphs: dict[
            tuple[int, int | None], torch.cuda.CUDAGraph
        ] = {}  # (size, slot or None)
        # per graph, (size, slot or None) ->: [size, hidden_size]; [size, vocab_size] float32; [size] int64
        self._outputs: dict[tuple[int, int | None], torch.Tensor] = {}  # in the pool, all three
        self._logits: dict[tuple[int, int | None], torch.Tensor] = {}
        self._argmax: dict[tuple[int, int | None], torch.Tensor] = {}
        self.spec = (
            SpecDecodeGraphs(
                model, kv_caches, inputs, self.block_tables, sizes, self._max_model_len, spec_shapes
            )
            if spec_shapes
            else None
        )
        self.draft = draft

    @property
    def sizes(self) -> list[int]:
        """The sizes captured and replayed (the policy's decode sizes), ascending."""
        return self._sizes.decode_sizes

    @property
    def stages_inputs(self) -> bool:
        """Whether the graphs up to SizePolicy.is_staged stage their inputs in (staging sets given)."""
        return bool(self._staging)

    def is_staged(self, size: int) -> bool:
        """Whether graphs of this size stage their inputs in (one per staging set)."""
        return self.stages_inputs and self._sizes.is_staged(size)

    @torch.inference_mode()
    def capture(self, stream: torch.cuda.Stream) -> None:
        """Largest size first (the smaller graphs reuse its pool blocks), each after a warm-up
        run on the capture stream: it compiles the Triton kernels of that shape and gives cuBLAS
        its workspace for the stream outside the capture. Inputs: an all-padding batch, so no
        KV is read or written and no real row of last_sampled."""
        device = self.block_table.device
        pool = torch.cuda.graph_pool_handle()
        stream.wait_stream(torch.cuda.current_stream(device))
        for staging in self._staging:  # the header of a staged graph's warm-up: nothing to copy
            staging.write_stage_header(staging.num_head_ids * 8)
        with torch.cuda.stream(stream):
            for size in reversed(self.sizes):
                self._fill_padding(size)
                slots = range(len(self._staging)) if self.is_staged(size) else ()
                for slot in (None, *slots):
                    run = functools.partial(self._run, size, slot)
                    self._graphs[size, slot] = warmed_up_graph(run, pool)
            if self.spec is not None:
                self.spec.capture(pool)
            if self.draft is not None:  # last: its replays write none of the above's outputs
                self.draft.capture(pool)
        torch.cuda.current_stream(device).wait_stream(stream)

    def keep_fastest(self) -> Moves:
        """Times the graphs above MAX_LOGITS_ROWS rows (replay_times); the size policy keeps the
        fastest sizes (SizePolicy.keep_fastest_decode) and the others' graphs go. Start-up only: it
        waits for the GPU. -> each size dropped: (the size its batches now replay, its ms, that
        size's ms)."""
        timed = [size for size in self.sizes if size > MAX_LOGITS_ROWS]
        times = self.replay_times(timed)
        kinds = {size: decode_kind(size, self._kv_caches[0], self._max_model_len) for size in timed}
        moves = self._sizes.keep_fastest_decode(times, kinds)
        for key in [key for key in self._graphs if key[0] in moves]:
            for held in (self._graphs, self._outputs, self._logits, self._argmax):
                held.pop(key, None)
        return moves

    def replay_times(self, sizes: list[int]) -> dict[int, float]:
        """Size -> ms of its plain graph over an all-padding batch (GEMMs and elementwise work at that
        size; no attention) and then the LM head on its rows (as the runner runs it after such a
        replay), least_times_ms of them. Sizes up to MAX_LOGITS_ROWS: their graphs also hold the LM
        head and its argmax."""
        return least_times_ms(sizes, self._padding_replay, self.block_table.device)

    def _padding_replay(self, size: int) -> None:
        self._fill_padding(size)  # the layouts of two sizes overlap
        self._graphs[size, None].replay()
        if size > MAX_LOGITS_ROWS:
            self._model.compute_logits(self._outputs[size, None])

    def load_block_table(self, block_tables: torch.Tensor, version: int) -> None:
        """block_tables: [G, num_seqs, num_cols] device, a step's compact table of each KV cache
        group, copied into the graphs' fixed-width ones (columns past num_cols are stale and
        unread: a sequence's blocks all lie below num_cols); version: the runner's name for
        their content."""
        _, num_seqs, num_cols = block_tables.shape
        self.block_tables[:, :num_seqs, :num_cols].copy_(block_tables)
        self.block_table_version = version

    def replay(self, size: int, slot: int | None = None) -> torch.Tensor:
        """[size, hidden_size] hidden states of the padded batch, the graph's own tensor in the
        pool (valid until the next replay). slot: replay the graph that stages its inputs in from
        that staging set (is_staged(size)), whose header the host wrote."""
        self._graphs[size, slot].replay()
        return self._outputs[size, slot]

    def stage_in(self, size: int, slot: int) -> None:
        """What a staged graph of this size does first: the copy from staging set `slot` that its
        header describes."""
        staging = self._staging[slot]
        steady_words = staging.num_words(staging.sections(size, size).copy_end(True, 0))  # A, B
        stage_in(
            staging.head,
            staging.words,
            self._inputs.words,
            block=triton.next_power_of_2(steady_words),
        )

    def logits(self, size: int, slot: int | None = None) -> torch.Tensor | None:
        """[size, vocab_size] float32: the logits of the last replay, which must be of this graph;
        None where the graph does not compute them (size > MAX_LOGITS_ROWS)."""
        return self._logits.get((size, slot))

    def argmax(self, size: int, slot: int | None = None) -> torch.Tensor | None:
        """[size] int64: the argmax of logits(size, slot) (also written into last_sampled), or None."""
        return self._argmax.get((size, slot))

    def _run(self, size: int, slot: int | None) -> None:
        """What a graph holds: the stage-in from staging set `slot` (if any), the gather of the
        input ids, the model over the first `size` rows of the static buffers, and up to
        MAX_LOGITS_ROWS rows their logits and argmax, written into last_sampled (and the slot's
        host ids) (the capture run's tensors are the graph's)."""
        if slot is not None:
            self.stage_in(size, slot)
        inputs = self._inputs.sections(size, size).tensors
        input_ids = self.input_ids[:size]
        torch.index_select(inputs["ids_table"], 0, inputs["input_src"], out=input_ids)
        hidden = self._model(
            input_ids, inputs["positions"], self._kv_caches, self._metadata(size, inputs)
        )  # [size, hidden_size]
        self._outputs[size, slot] = hidden
        if size <= MAX_LOGITS_ROWS:
            logits = self._model.compute_logits(hidden)  # [size, vocab_size]
            host_ids = None if slot is None else self._host_ids[slot]
            # the sampler's greedy pick
            argmax = greedy_pick(logits, self._inputs.head, inputs["sample_rows"], host_ids)
            self._logits[size, slot], self._argmax[size, slot] = logits, argmax

    def _metadata(self, size: int, inputs: dict[str, torch.Tensor]) -> AttentionMetadata:
        meta = AttentionMetadata(
            num_tokens=size,
            num_seqs=size,
            max_query_len=1,
            max_seq_len=self._max_model_len,
            query_start_loc=inputs["query_start_loc"],
            seq_lens=inputs["seq_lens"],
            slot_mapping=inputs["slot_mapping"][:size],
            block_table=self.block_table[:size],
            query_start_loc_cpu=self._query_start_loc_cpu[: size + 1],
            seq_lens_cpu=self._seq_lens_cpu[:size],
            decode_order=inputs["decode_order"],
        )
        meta.groups = group_metadata(meta, inputs, self._num_kv_groups, self.block_tables[:, :size])
        return meta

    def _fill_padding(self, size: int) -> None:
        """Every row of the layout of this size a padding row (see the module notes and
        StepBuffers.pad_decode): input_src names the input_ids entries (token 0), sample_rows
        the scratch entries of last_sampled."""
        self._inputs.pad_decode(
            self._inputs.sections(size, size), num_seqs=0, num_samples=0, seq_sections=True
        )
