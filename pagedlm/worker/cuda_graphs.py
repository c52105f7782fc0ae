"""CUDA graphs of the model forward for pure-decode batches (one query token per sequence).

One graph per capture size, all in one memory pool, captured largest first after a warm-up run
each. A batch of n sequences replays the smallest size >= n. Every graph input is a static
device buffer: the runner's step buffers (input_ids, positions, slot_mapping, query_start_loc,
seq_lens, decode_order), which the host fills and pads before the replay, and a block table of
this module with a fixed width (max blocks per sequence), into which replay copies the step's
compact table.

Padding rows [n, size): token 0 at position 0, slot -1 (the KV write skips it), seq_len 0 and no
query (query_start_loc stays flat at n), which the varlen and split-decode kernels both skip;
their output rows are garbage and never read (every op is row-independent outside attention).
They come last in decode_order (the varlen kernel's launch order, longest sequence first), which
must be a permutation of range(size).

Graphs of at most MAX_LOGITS_ROWS rows also compute the logits (compute_logits of every row,
float32), so that a small decode step launches no LM head of its own: at batch 1 the Triton GEMV's
Python launcher was a visible part of the host's step (session 7's profile). Those logits live in
the graph's pool, valid only until the next replay (of any size: sizes share the pool); the runner
samples from them right after the replay, in stream order.

The host ints of the captured AttentionMetadata are fixed per size: num_tokens = num_seqs = size,
max_query_len 1, max_seq_len = max_model_len. So the backend's choice of kernel (varlen or split
decode) and the number of splits are made once, at capture, for the longest possible context;
the kernels read the real per-sequence lengths from seq_lens on the device at each replay.
"""
from __future__ import annotations

import bisect

import torch

from pagedlm.attention.backend import AttentionMetadata
from pagedlm.config import EngineConfig
from pagedlm.model.llama import LlamaForCausalLM
from pagedlm.worker.input_batch import StepBuffers

MAX_CAPTURE_SIZE = 512
MAX_LOGITS_ROWS = 8  # graphs up to this size compute the logits too (<= 8 x vocab x 4 bytes each)


def graphs_enabled(config: EngineConfig) -> bool:
    """Graphs run on CUDA with the Triton backend (auto picks it there), unless enforce_eager:
    the torch reference reads host tensors, which a replay would not refresh."""
    return (config.device.type == "cuda" and not config.enforce_eager
            and config.attention_backend in ("auto", "triton"))


def capture_sizes(max_num_seqs: int, max_num_tokens: int) -> list[int]:
    """Ascending: 1, 2, 4, every 8 up to 256, every 16 up to 512; those below the cap
    min(max_num_seqs, max_num_tokens, 512), then the cap itself (51 sizes for a cap of 512)."""
    cap = min(max_num_seqs, max_num_tokens, MAX_CAPTURE_SIZE)
    steps = [1, 2, 4, *range(8, 257, 8), *range(272, MAX_CAPTURE_SIZE + 1, 16)]
    return [size for size in steps if size < cap] + [cap]


class DecodeGraphs:
    """The graphs of one model over one KV cache (they bind its address) and the runner's
    static step buffers. capture() once; then replay(size, block_table) per decode step."""

    def __init__(self, config: EngineConfig, model: LlamaForCausalLM,
                 kv_caches: list[torch.Tensor], inputs: StepBuffers,
                 max_num_blocks_per_req: int) -> None:
        self.sizes = capture_sizes(config.scheduler.max_num_seqs,
                                   config.scheduler.max_num_batched_tokens)
        self.max_size = self.sizes[-1]
        self._max_model_len = config.model.max_model_len
        self._model = model
        self._kv_caches = kv_caches
        self._inputs = inputs
        device, model_config = config.device, config.model
        self.block_table = torch.zeros(self.max_size, max_num_blocks_per_req, dtype=torch.int32,
                                       device=device)  # [max_size, max_blocks_per_req]
        self._output = torch.empty(self.max_size, model_config.hidden_size,
                                   dtype=model_config.dtype, device=device)  # [max_size, hidden]
        # The host copies in the metadata describe the capture-time batch (all padding); the
        # Triton backend never reads them, and a replay could not refresh them.
        self._query_start_loc_cpu = torch.zeros(self.max_size + 1, dtype=torch.int32)
        self._seq_lens_cpu = torch.zeros(self.max_size, dtype=torch.int32)
        self._graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self._logits: dict[int, torch.Tensor] = {}  # size -> [size, vocab_size] float32, in the pool

    def padded_size(self, num_seqs: int) -> int | None:
        """The smallest capture size >= num_seqs; None when every size is smaller."""
        index = bisect.bisect_left(self.sizes, num_seqs)
        return self.sizes[index] if index < len(self.sizes) else None

    @torch.inference_mode()
    def capture(self, stream: torch.cuda.Stream) -> None:
        """Largest size first (the smaller graphs reuse its pool blocks), each after a warm-up
        run on the capture stream: it compiles the Triton kernels of that shape and gives cuBLAS
        its workspace for the stream outside the capture. Inputs: an all-padding batch, so no
        KV is read or written."""
        device = self._output.device
        self._fill_padding()
        pool = torch.cuda.graph_pool_handle()
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream):
            for size in reversed(self.sizes):
                self._run(size)  # warm-up
                graph = torch.cuda.CUDAGraph()
                graph.capture_begin(pool=pool)
                try:
                    self._run(size)
                finally:
                    graph.capture_end()
                self._graphs[size] = graph
        torch.cuda.current_stream(device).wait_stream(stream)

    def replay(self, size: int, block_table: torch.Tensor) -> torch.Tensor:
        """[size, hidden_size] hidden states of the padded batch in the static buffers (valid
        until the next replay). block_table: [num_seqs, num_cols] device, the step's compact
        table, copied into the graph's fixed-width one first (columns past num_cols are stale
        and unread: a sequence's blocks all lie below num_cols)."""
        num_seqs, num_cols = block_table.shape
        self.block_table[:num_seqs, :num_cols].copy_(block_table)
        self._graphs[size].replay()
        return self._output[:size]

    def logits(self, size: int) -> torch.Tensor | None:
        """[size, vocab_size] float32: the logits of the last replay, which must be of this size;
        None where the graph does not compute them (size > MAX_LOGITS_ROWS)."""
        return self._logits.get(size)

    def _run(self, size: int) -> None:
        """What a graph holds: the model over the first `size` rows of the static buffers (and
        their logits, up to MAX_LOGITS_ROWS rows; the capture run's tensor is the graph's)."""
        inputs = self._inputs
        hidden = self._model(inputs.input_ids[:size], inputs.positions[:size], self._kv_caches,
                             self._metadata(size))  # [size, hidden_size]
        self._output[:size].copy_(hidden)
        if size <= MAX_LOGITS_ROWS:
            self._logits[size] = self._model.compute_logits(hidden)

    def _metadata(self, size: int) -> AttentionMetadata:
        inputs = self._inputs
        return AttentionMetadata(
            num_tokens=size, num_seqs=size, max_query_len=1, max_seq_len=self._max_model_len,
            query_start_loc=inputs.query_start_loc[:size + 1], seq_lens=inputs.seq_lens[:size],
            slot_mapping=inputs.slot_mapping[:size], block_table=self.block_table[:size],
            query_start_loc_cpu=self._query_start_loc_cpu[:size + 1],
            seq_lens_cpu=self._seq_lens_cpu[:size], decode_order=inputs.decode_order[:size])

    def _fill_padding(self) -> None:
        """Every row of the static buffers a padding row (see the module notes)."""
        inputs, size = self._inputs, self.max_size
        inputs.input_ids[:size].zero_()
        inputs.positions[:size].zero_()
        inputs.slot_mapping[:size].fill_(-1)
        inputs.query_start_loc[:size + 1].zero_()
        inputs.seq_lens[:size].zero_()
        torch.arange(size, out=inputs.decode_order[:size])
