"""ModelRunner: a SchedulerOutput becomes one ragged batch, runs through the model and the
sampler, and comes back as sampled token ids, without a host-device sync inside the step.

Per step: the host lays the batch out with numpy in one of two pinned staging sets (alternating,
so the CPU never writes memory an in-flight copy reads), copies it non-blocking into persistent
device buffers with one copy (step_buffers.py), and the model reads slices of those. Each step's
sampled ids are scattered into `last_sampled` (by row) on the device, where the next step's
placeholder inputs read them, and copied to pinned host memory; then the step records its one
event (one per staging set, reused). AsyncRunnerOutput.get_output() waits for that event only; a
staging set is written again two steps later, once the step that used it gave its output (which
waited for the event). All of a step's work, its device->host copies included, goes to the
current stream: a side copy stream cost the host three more CUDA calls per step (an event, a
wait, the stream switch) for a copy of a few bytes. On a CPU device the same code runs,
synchronously, without pinning or events.

Which graphs a step replays, at which size, and how its inputs get to the device is decided once per
step, in its StepPlan (step_plan.py); every row count comes from one SizePolicy (sizes.py). On CUDA
(Triton backend, not enforce_eager) a pure-decode step of at most the largest capture size replays a
CUDA graph (cuda_graphs.py), and any other step of at most sizes.MAX_PIECEWISE_SIZE tokens without
prompt_embeds the piecewise graphs (piecewise_graphs.py: the forward between attention calls; the
attention runs eagerly). For a decode graph the host pads the batch in the staging set,
the same copy fills the static buffers, and the graph gathers its own input ids; up to
sizes.STAGED_MAX_SIZE rows, when the step copies no block table, the graph copies them itself
from the staging set instead (a kernel reading pinned memory, ops/stage_in.py) and its argmax writes
the ids into the set's pinned output, so such a step issues no copy-engine operation. Up to
sizes.MAX_LOGITS_ROWS rows the graph also computes the logits and their argmax and writes
that into last_sampled: a batch that samples greedily and needs nothing else (the sampler's
is_greedy) takes the graph's ids as they are; any other batch is sampled eagerly from the graph's
logits, above MAX_LOGITS_ROWS rows from the LM head run eagerly on the graph's hidden states.

A step is launched in two calls, execute_forward (inputs, forward) and sample_tokens (the grammar
bitmask's copy and application, sampling, output copies), so the engine core can fill a step's
structured-outputs bitmask into grammar_bitmask()'s pinned rows while the device runs its forward;
execute_model makes both calls at once. The forward keeps its graphs; the mask and the sampler
run after it, eagerly.

Outputs write no state: AsyncRunnerOutput.get_output() only reads the step's results. The runner
records the sampled tokens into their rows (InputBatch.record_sampled) itself, in step order: at each
execute_model, every output read by then, and before a staging set is reused, its step's output.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch

from pagedlm import envs
from pagedlm.attention.backend import AttentionMetadata, get_attention_backend
from pagedlm.config import EngineConfig
from pagedlm.core.block_pool import NULL_BLOCK_ID
from pagedlm.core.sched_output import GrammarBitmask, NewRequestData, SchedulerOutput
from pagedlm.distributed import tp_worker
from pagedlm.model.llama import LlamaForCausalLM, model_kv_groups
from pagedlm.model.loader import load_model
from pagedlm.ops.jit_watch import compile_watch
from pagedlm.sample.grammar_mask import apply_grammar_bitmask
from pagedlm.sample.sampler import SamplerOutput
from pagedlm.sample.state import SamplingState
from pagedlm.spec_decode.draft_graphs import DraftGraphs, draft_graph_shapes
from pagedlm.spec_decode.draft_model import DraftModelProposer, draft_proposer
from pagedlm.worker import memory, sleep
from pagedlm.worker.batch_layout import BatchLayout
from pagedlm.worker.cuda_graphs import DecodeGraphs, graphs_enabled
from pagedlm.worker.dummy_steps import DummySteps
from pagedlm.worker.grammar_inputs import GrammarInputs, GrammarRows, max_grammar_rows
from pagedlm.worker.group_tables import group_metadata
from pagedlm.worker.input_batch import InputBatch
from pagedlm.worker.kernel_warmup import warm_up_kernels
from pagedlm.worker.lm_head import LMHead, PaddedLMHead, leading
from pagedlm.worker.piecewise_graphs import PiecewiseGraphs
from pagedlm.worker.profile_run import profile_run
from pagedlm.worker.prompt_logprobs import MAX_ROWS_PER_CHUNK, compute_prompt_logprobs
from pagedlm.worker.runner_output import AsyncRunnerOutput
from pagedlm.worker.sizes import SizePolicy
from pagedlm.worker.spec_graphs import spec_graph_shapes
from pagedlm.worker.spec_step import SpecOutput, SpecWorker
from pagedlm.worker.start_up_log import (
    log_every_size_kept,
    log_graph_sizes_kept,
    log_graphs_captured,
    log_start_up_compiles,
)
from pagedlm.worker.step_buffers import PrefixViews, Sections, StepBuffers
from pagedlm.worker.step_plan import StepMode, StepPlan, plan_step

NUM_STAGING_SETS = 2


@dataclass(slots=True, frozen=True)
class LaunchedForward:
    """A step whose forward is launched and whose sampling is not (plan None: an empty step)."""

    step_id: int
    plan: StepPlan | None = None
    hidden: torch.Tensor | None = None  # [num_tokens (a decode graph's size), hidden_size]


class ModelRunner:
    """Persistent rows (InputBatch), static step buffers, the model, the KV cache, the sampler."""

    def __init__(self, config: EngineConfig) -> None:
        self.tp = tp_worker.TPWorkerState.create(config)  # this rank's part (None at tp = 1)
        config = self.tp.config if self.tp is not None else config  # this rank's shapes
        self.config = config
        self.device = config.device
        self.use_cuda = self.device.type == "cuda"
        self.max_num_reqs = config.scheduler.max_num_seqs
        self.max_num_tokens = config.scheduler.max_num_batched_tokens
        self.block_size = config.cache.block_size
        self.model: LlamaForCausalLM | None = None
        self.lm_head: PaddedLMHead | None = None  # made by load_model
        self.kv_caches: list[torch.Tensor] = []  # per layer [2, num_blocks, block_size, Hkv, D]
        self.weights_bytes = 0
        self.use_cuda_graphs = graphs_enabled(config)
        self.sizes = SizePolicy(self.max_num_reqs, self.max_num_tokens)  # every padded row count
        self.graphs: DecodeGraphs | None = None  # captured by init_kv_cache
        self.piecewise: PiecewiseGraphs | None = (
            None  # likewise, unless cudagraph_mode excludes them
        )
        self.graph_bytes_reserved: int | None = None  # trial capture, before sizing the KV cache
        self.graph_bytes = 0  # what the captured graphs take
        spec = config.speculative
        self.spec = None if spec is None else SpecWorker(config, NUM_STAGING_SETS)
        self.kv_groups = model_kv_groups(config.model)  # (window, layers) per KV cache group
        self.input_batch = InputBatch(
            self.max_num_reqs,
            config.model.max_model_len,
            self.block_size,
            0 if spec is None else spec.num_speculative_tokens,
            None if spec is None else self.sizes.uniform_tokens_bucket,
            len(self.kv_groups),
        )
        self._init_buffers()
        self._init_streams()
        self._inference_mode = torch.inference_mode()
        self.sampler = SamplingState(
            self.max_num_reqs, config.model.vocab_size, self.device, config.seed
        )
        self.grammar_inputs = GrammarInputs(
            max_grammar_rows(config), config.model.vocab_size, self.device, NUM_STAGING_SETS
        )
        # tp > 1: sampling from the ranks' vocabulary shards (distributed/sampling.py), but with
        # speculative decoding, where every rank samples and verifies the all-gathered logits of
        # every row itself, so that all hold the same tokens, drafts and sampling state
        self.tp_sampler = (
            None
            if self.tp is None or config.speculative is not None
            else self.tp.sampler(self.sampler, NUM_STAGING_SETS)
        )
        self._num_steps = 0
        self._launched: LaunchedForward | None = None  # between execute_forward and sample_tokens
        self._first_compile = compile_watch().start_up() if self.use_cuda else 0
        self._sleeping = sleep.SleepingParts()
        # where sleep keeps addresses: the weights' and KV cache's cuMem pools (sleep.py)
        self.pools = sleep.MemoryPools.create(config.enable_sleep_mode, self.device)
        sleep.register_runner(self)

    def _init_buffers(self) -> None:
        sizes = (self.max_num_tokens, self.max_num_reqs, self.input_batch.max_num_blocks_per_req)
        # the device set's head: last_sampled by row, then one scratch entry per graph row
        # (on host sets: the stage-in header)
        set_layout = dict(
            bucket=self.sizes.step_bucket,
            num_head_ids=self.max_num_reqs + self.sizes.max_decode_size,
            num_kv_groups=len(self.kv_groups),
        )
        cpu = torch.device("cpu")
        self._staging = [
            StepBuffers(*sizes, cpu, pin=self.use_cuda, **set_layout)
            for _ in range(NUM_STAGING_SETS)
        ]
        self._inputs = StepBuffers(*sizes, self.device, pin=False, **set_layout)
        self._last_sampled = self._inputs.head  # [max_num_reqs + largest graph size], by row
        self._table_version = 0  # bumped by each copy of a block table to the device
        # [max_num_tokens]: an eager step's input ids when some are gathered from last_sampled
        self._gathered_ids = PrefixViews(
            {"ids": torch.zeros(self.max_num_tokens, dtype=torch.int64, device=self.device)}
        )
        self._sampled_cpu = [
            torch.zeros(self.max_num_reqs, dtype=torch.int64, pin_memory=self.use_cuda)
            for _ in range(NUM_STAGING_SETS)
        ]  # [max_num_reqs]
        self._sampled_cpu_views = PrefixViews(dict(enumerate(self._sampled_cpu)))  # by slot
        self._sampled_np = [t.numpy() for t in self._sampled_cpu]  # sync-ok: host, at start-up
        self._in_flight: list[AsyncRunnerOutput | None] = [
            None
        ] * NUM_STAGING_SETS  # by staging set
        self._unrecorded: deque[AsyncRunnerOutput] = (
            deque()
        )  # launched, in step order, not recorded yet

    def _init_streams(self) -> None:
        if not self.use_cuda:
            self._graph_stream = None
            self._step_events = [None] * NUM_STAGING_SETS
            return
        # events record on a stream named explicitly: Event.record() asks torch.cuda.current_stream(),
        # a chain of device-index lookups that cost the host ~10 µs each time (a host profile)
        self._device_index = (
            self.device.index if self.device.index is not None else torch.cuda.current_device()
        )
        self._graph_stream = sleep.graph_stream(self.device)  # warm-up and capture, trial and real
        # per staging set: recorded after all of a step's work, its output copies last
        self._step_events = [torch.cuda.Event() for _ in range(NUM_STAGING_SETS)]

    def load_model(self) -> None:
        backend = self._attn_backend = get_attention_backend(
            self.config.attention_backend, self.device
        )
        before = torch.cuda.memory_allocated(self.device) if self.use_cuda else 0
        with self.pools.use("weights"):
            self.model = load_model(
                self.config.model, backend, self.device, *tp_worker.load_args(self.tp)
            )
        if self.use_cuda:
            self.weights_bytes = torch.cuda.memory_allocated(self.device) - before
        if (draft := self.draft_model()) is not None:  # after the target's weights_bytes
            with self.pools.use("weights"):
                draft.load_model()
        # the most rows the LM head takes at once: a step's sampling rows (but a replay's where every
        # row samples, which runs at its graph size) or a chunk of prompt-logprob rows
        spec = self.config.speculative  # 1 + k logits rows a speculating request
        max_sampled = self.max_num_reqs if spec is None else spec.max_logits_rows(self.max_num_reqs)
        max_rows = max(
            min(max_sampled, self.max_num_tokens),
            min(MAX_ROWS_PER_CHUNK, self.max_num_tokens),
        )
        model = self.config.model
        self.lm_head = PaddedLMHead(
            self.sizes.lm_head_rows, max_rows, model.hidden_size, model.dtype, self.device
        )

    def determine_num_blocks(self) -> int:
        profile_graphs = self._profile_graphs if self.use_cuda_graphs else None
        num_blocks = memory.determine_num_blocks(
            self.config, functools.partial(profile_run, self), self.weights_bytes, profile_graphs
        )
        return tp_worker.min_over_ranks(num_blocks)

    def init_kv_cache(self, num_blocks: int) -> None:
        """Allocates the KV cache, then captures the CUDA graphs, which bind its address."""
        self.allocate_kv_cache(num_blocks)
        self.prepare_steps()

    def allocate_kv_cache(self, num_blocks: int) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be positive, got {num_blocks}")
        self.graphs = self.piecewise = None  # graphs of a previous cache go first
        with self.pools.use("kv_cache"):
            # layer i of every KV cache group shares tensor i (core/kv_groups.py)
            tensors = [self._new_kv_cache(num_blocks) for _ in self.kv_groups[0][1]]
            tensor_of_layer = {
                layer: i for _, layers in self.kv_groups for i, layer in enumerate(layers)
            }
            self.kv_caches = [tensors[tensor_of_layer[layer]] for layer in sorted(tensor_of_layer)]
            if (draft := self.draft_model()) is not None:  # the same block ids
                draft.allocate_kv_cache(num_blocks)
        self.input_batch.num_kv_blocks = num_blocks

    def prepare_steps(self, start_up: bool = True) -> None:
        """Over the weights and KV cache now held: the graphs' capture, the kernels' warm-up. Not
        at start-up (a wake-up): the graphs only, at the sizes the start-up timing kept (so the
        same batches replay the same graphs and give the same tokens); the kernels are warm."""
        if self.use_cuda_graphs:
            self._capture_graphs(time_sizes=start_up)
        if self.use_cuda and start_up:
            warm_up_kernels(self)
            self.lm_head.warm_up(self.model.compute_logits)
            log_start_up_compiles(self._first_compile)
        self.input_batch.forget_previous_step()  # the capture and warm-up wrote the device buffers

    def sleep(self, level: int, tags: set[str]) -> None:
        """Sleep mode (sleep.py): frees the tagged memory; no step may be in flight."""
        sleep.release(self, self._sleeping, level, tags)

    def wake_up(self, tags: set[str]) -> None:
        sleep.restore(self, self._sleeping, tags)

    def remove_all_requests(self) -> None:
        """Every row freed (the scheduler preempted or aborted them all; it says so again, a no-op)."""
        self._record_read_outputs()
        for req_id in list(self.input_batch.req_id_to_row):
            self._remove_request(req_id)
        self.input_batch.forget_previous_step()

    @contextlib.contextmanager
    def dummy_steps(self, kv_cache_blocks: int | None = None) -> Iterator[DummySteps]:
        """Steps of made-up requests (dummy_steps.py) for start-up work. kv_cache_blocks: they run on a
        KV cache of their own of that many blocks (every block theirs; one for all layers), eagerly
        (the graphs bind the real cache); else on the real KV cache, in the blocks past the null block
        (no request may exist yet). On exit, even after an error, every request they added leaves, the
        runner's KV cache and graphs come back and the next step reuses no section of theirs."""
        saved = self.kv_caches, self.input_batch.num_kv_blocks, self.graphs, self.piecewise
        first_block, cache_bytes = NULL_BLOCK_ID + 1, 0
        if kv_cache_blocks is not None:  # one cache for every layer: their values matter to no one
            cache = self._new_kv_cache(kv_cache_blocks)
            self.kv_caches = [cache] * self.config.model.num_layers
            self.input_batch.num_kv_blocks, self.graphs, self.piecewise = (
                kv_cache_blocks,
                None,
                None,
            )
            first_block, cache_bytes = 0, cache.numel() * cache.element_size()
        draft = self.draft_model()
        draft_cache = (
            contextlib.nullcontext(0)
            if draft is None or kv_cache_blocks is None
            else draft.dummy_kv_cache(kv_cache_blocks)
        )
        with draft_cache as draft_bytes:
            steps = DummySteps(
                self, first_block, self.input_batch.num_kv_blocks, cache_bytes + draft_bytes
            )
            try:
                yield steps
            finally:
                try:
                    steps.finish_all()
                finally:
                    self.kv_caches, self.input_batch.num_kv_blocks = saved[:2]
                    self.graphs, self.piecewise = saved[2:]
                    self.input_batch.forget_previous_step()

    def draft_model(self) -> DraftModelProposer | None:
        """The draft model of speculative decoding (spec_decode/draft_model.py), if any."""
        return None if self.spec is None else draft_proposer(self.spec.proposer)

    def _capture_graphs(self, time_sizes: bool) -> None:
        start = time.perf_counter()
        (self.graphs, self.piecewise), self.graph_bytes = memory.device_bytes_taken(
            self.device, lambda: self._new_graphs(self.kv_caches)
        )
        log_graphs_captured(
            self.graphs,
            self.piecewise,
            time.perf_counter() - start,
            self.graph_bytes,
            self.graph_bytes_reserved,
        )
        if time_sizes:
            self._keep_fastest_graph_sizes()

    def _keep_fastest_graph_sizes(self) -> None:
        """Batches of a size that replays markedly slower than a larger one take that one from now on
        (DecodeGraphs.keep_fastest), laid out for it in the step buffers (both follow the size
        policy); likewise the piecewise graphs' token counts (PiecewiseGraphs.keep_fastest). With the
        engine argument graph_size_timing off, nothing is timed and every size stays."""
        if not self.config.graph_size_timing:
            log_every_size_kept()
            return
        start = time.perf_counter()
        moved = self.graphs.keep_fastest()
        moved_piecewise = None if self.piecewise is None else self.piecewise.keep_fastest()
        log_graph_sizes_kept(moved, moved_piecewise, time.perf_counter() - start)

    def _new_graphs(
        self, kv_caches: list[torch.Tensor], trial: bool = False
    ) -> tuple[DecodeGraphs, PiecewiseGraphs | None]:
        """The piecewise graphs first: captured after the decode graphs, they made every batch-1 decode
        step slower though the decode graphs are the same, likely from where their memory lands
        (benchmarks/RESULTS.md, "Measured choices"). trial: the draft's graphs over a trial
        cache of its own."""
        piecewise = self._new_piecewise_graphs(kv_caches)
        return self._new_decode_graphs(kv_caches, trial), piecewise

    def _new_decode_graphs(self, kv_caches: list[torch.Tensor], trial: bool) -> DecodeGraphs:
        graphs = DecodeGraphs(
            self.config,
            self.model,
            kv_caches,
            self._inputs,
            self.input_batch.max_num_blocks_per_req,
            self._staging,
            self._sampled_cpu,
            sizes=self.sizes,
            spec_shapes=spec_graph_shapes(self.config.speculative, self.sizes),
            draft=self._new_draft_graphs(trial),
        )
        graphs.capture(self._graph_stream)
        return graphs

    def _new_draft_graphs(self, trial: bool) -> DraftGraphs | None:
        """The draft model's graphs (draft_graphs.py) over its KV cache (trial: a one-block
        one); None without a draft model, where no batch size drafts, or under
        PAGEDLM_DRAFT_GRAPHS=0."""
        draft = self.draft_model()
        if draft is None or not envs.PAGEDLM_DRAFT_GRAPHS:
            return None
        shapes = draft_graph_shapes(self.config.speculative, self.max_num_reqs, self.sizes)
        return draft.new_graphs(None if trial else draft.kv_caches, shapes) if shapes else None

    def _new_piecewise_graphs(self, kv_caches: list[torch.Tensor]) -> PiecewiseGraphs | None:
        if self.config.cudagraph_mode != "FULL_AND_PIECEWISE":
            return None
        piecewise = PiecewiseGraphs(
            self.model, self._attn_backend, kv_caches, self.sizes, self.device
        )
        piecewise.capture(self._graph_stream)
        return piecewise

    def _profile_graphs(self) -> int:
        """Device bytes the CUDA graphs take, from a trial capture over a one-block KV cache
        (no graph reads or writes it), released afterwards: the real graphs bind the real cache,
        so they are captured once it exists."""
        trial_kv_caches = [self._new_kv_cache(1) for _ in range(self.config.model.num_layers)]
        graphs, num_bytes = memory.device_bytes_taken(
            self.device, lambda: self._new_graphs(trial_kv_caches, trial=True)
        )
        del graphs
        torch.cuda.empty_cache()
        self.graph_bytes_reserved = num_bytes
        return num_bytes

    def _new_kv_cache(self, num_blocks: int) -> torch.Tensor:
        model = self.config.model
        shape = (2, num_blocks, self.block_size, model.num_kv_heads, model.head_dim)
        return torch.zeros(shape, dtype=model.dtype, device=self.device)

    def execute_model(self, sched: SchedulerOutput) -> AsyncRunnerOutput:
        """Launch one whole step, without a grammar bitmask; never waits for the device (beyond
        a staging set two steps old)."""
        self.execute_forward(sched)
        return self.sample_tokens(None)

    def execute_forward(self, sched: SchedulerOutput) -> None:
        """Launch the step's input copy and forward; its sampling waits for sample_tokens, so the
        host may fill the step's bitmask (grammar_bitmask) while the device runs the forward
        (vLLM's execute_model / sample_tokens)."""
        assert self._launched is None, "sample_tokens() of the step launched before first"
        with self._inference_mode:  # one context object, entered once per call
            self._launched = self._execute_forward(sched)

    def grammar_bitmask(self, num_words: int) -> GrammarBitmask:
        """The launched step's pinned bitmask rows [max_grammar_rows, num_words] (grammar_inputs.py):
        fill the first M, pass them to sample_tokens."""
        return self.grammar_inputs.host_rows(self._launched.plan.slot, num_words)

    def sample_tokens(self, grammar: GrammarBitmask | None) -> AsyncRunnerOutput:
        """The launched step's sampling, its constrained rows masked by `grammar` (the first M rows
        of grammar_bitmask(), filled), and its output copies; never waits for the device."""
        launched, self._launched = self._launched, None
        if launched.plan is None:  # an empty step
            return AsyncRunnerOutput(launched.step_id)
        with self._inference_mode:
            plan = launched.plan
            rows = self.grammar_inputs.stage(grammar, plan.slot)
            with self._failed_step_guard():
                output = self._launch_sampling(plan, launched.hidden, rows)
        self._in_flight[plan.slot] = output
        self._unrecorded.append(output)
        return output

    def _execute_forward(self, sched: SchedulerOutput) -> LaunchedForward:
        self._record_read_outputs()
        self._update_states(sched)
        if sched.is_empty:
            return LaunchedForward(sched.step_id)
        slot = self._num_steps % NUM_STAGING_SETS
        self._num_steps += 1
        self._reclaim(slot)
        plan = self._plan(sched.step_id, slot, self.input_batch.prepare(sched, self._staging[slot]))
        self._send_inputs(plan)
        if self.spec is not None:
            self.spec.begin_step(plan)
        with self._failed_step_guard():
            hidden = self._forward(plan)
        return LaunchedForward(sched.step_id, plan, hidden)

    @contextlib.contextmanager
    def _failed_step_guard(self) -> Iterator[None]:
        try:
            yield
        except BaseException:
            if self.use_cuda:  # no event will guard this staging set's copy: wait for it here
                torch.cuda.current_stream(
                    self._device_index
                ).synchronize()  # sync-ok: a failed step
            self.input_batch.forget_previous_step()  # a staged graph may not have brought the inputs
            raise

    def _plan(self, step_id: int, slot: int, layout: BatchLayout) -> StepPlan:
        """The step's one plan (step_plan.py) over the graphs this runner holds."""
        graphs = self.graphs
        return plan_step(
            step_id,
            slot,
            layout,
            self._staging[slot].sections(layout.bucket_tokens, layout.bucket_seqs),
            self._inputs.sections(layout.bucket_tokens, layout.bucket_seqs),
            self.sizes,
            decode_graphs=graphs is not None,
            staged_graphs=graphs is not None and graphs.stages_inputs,
            piecewise_graphs=self.piecewise is not None,
            spec_graphs=() if graphs is None or graphs.spec is None else graphs.spec,
        )

    def _send_inputs(self, plan: StepPlan) -> None:
        """The staging set's padding rows, then its one copy to the device buffers, or for a staged
        graph the header of the copy that graph makes itself."""
        layout, staging = plan.layout, self._staging[plan.slot]
        if plan.pads_decode:
            staging.pad_decode(
                plan.staged,
                layout.num_seqs,
                layout.num_samples,
                seq_sections=not layout.reuse_seq_sections,
                query_len=layout.uniform_query_len or 1,
            )
        if plan.mode is StepMode.STAGED_GRAPH:
            staging.write_stage_header(plan.copy_end)
        else:
            self._inputs.copy_from(staging, plan.copy_end)
        self._table_version += layout.num_table_elems_to_copy > 0

    def _launch_sampling(
        self, plan: StepPlan, hidden: torch.Tensor, grammar: GrammarRows | None
    ) -> AsyncRunnerOutput:
        """The step's sampling (or, speculating, verification and the next drafts) and output
        copies, queued after its forward."""
        spec = None
        if self.spec is None:
            sample, ids_on_host = self._sample(hidden, plan, grammar)
        else:
            sample, ids_on_host = None, False
            spec = self.spec.sample_and_propose(self, hidden, plan, grammar, plan.slot)
        layout = plan.layout
        prompt_logprobs = (
            None
            if layout.prompt_logprobs is None
            else compute_prompt_logprobs(
                layout.prompt_logprobs,
                hidden,
                functools.partial(self.lm_head.run, self.model.compute_logits),
            )
        )
        return self._launch_output(plan, sample, prompt_logprobs, ids_on_host, spec)

    def _update_states(self, sched: SchedulerOutput) -> None:
        for req_id in sched.finished_req_ids:
            self._remove_request(req_id)
        for new in sched.new_reqs:
            self._add_request(new)
        for cached in sched.cached_reqs:
            self.input_batch.update_request(cached)

    def _add_request(self, new: NewRequestData) -> None:
        self._remove_request(new.req_id)  # resumed after preemption
        row = self.input_batch.add_request(new, self._prompt_embeds_to_device(new))
        try:
            prompt_ids = (
                [] if new.prompt_embeds is not None else new.prompt_token_ids
            )  # placeholders
            self.sampler.add_request(
                row,
                new.sampling_params,
                prompt_ids,
                new.output_token_ids,
                eos_token_ids=self.config.model.eos_token_ids,
            )
        except ValueError:
            self.input_batch.remove_request(new.req_id)
            raise
        if self.spec is not None:
            self.spec.add_request(row, new.prompt_token_ids + new.output_token_ids)

    def _remove_request(self, req_id: str) -> None:
        row = self.input_batch.remove_request(req_id)
        if row is not None:
            self.sampler.remove_request(row)
            if self.spec is not None:
                self.spec.remove_request(row)

    def _prompt_embeds_to_device(self, new: NewRequestData) -> torch.Tensor | None:
        embeds = new.prompt_embeds
        if embeds is None:
            return None
        expected = (len(new.prompt_token_ids), self.config.model.hidden_size)
        assert tuple(embeds.shape) == expected, (
            f"prompt_embeds of request {new.req_id}: shape {list(embeds.shape)}, not [num_prompt_tokens, "
            f"hidden_size] = {list(expected)} (checked at the engine boundary: LLMEngine._check_embeds)"
        )
        return embeds.to(device=self.device, dtype=self.config.model.dtype, non_blocking=True)

    def _reclaim(self, slot: int) -> None:
        """Before reusing a staging set and its output buffer: the step that used them is done
        (normally long since; get_output() waits for its event), its output read and recorded."""
        previous = self._in_flight[slot]
        if previous is not None:
            previous.get_output()
            self._in_flight[slot] = None
        self._record_read_outputs()

    def _record_read_outputs(self) -> None:
        """The sampled tokens of the launched steps whose output was read, oldest first up to the first
        one not read yet, into their rows (InputBatch.record_sampled): a step's tokens must be recorded
        before a later step's (each lands at the next position its row does not know yet)."""
        unrecorded = self._unrecorded
        while unrecorded and unrecorded[0].is_read:
            sampled = unrecorded.popleft().sampled()
            if sampled is not None:
                self.input_batch.record_sampled(*sampled)
                if len(sampled) == 3:  # speculative: the drafting rows' tokens count now
                    self._count_verified(*sampled)

    def _count_verified(
        self, layout: BatchLayout, token_ids_np: np.ndarray, num_emitted_np: np.ndarray
    ) -> None:
        """The sampler counts what rows with drafts emitted (spec_step.py), where their owner
        is still the one that sampled."""
        if layout.spec is None:
            return
        rows_np = layout.sample_rows_np
        counted = layout.spec.num_drafts_np > 0
        counted &= self.input_batch.epochs_np.take(rows_np) == layout.sample_epochs_np
        self.sampler.count_emitted(rows_np[counted], num_emitted_np[counted])

    @staticmethod
    def _attention_metadata(plan: StepPlan, block_table: torch.Tensor) -> AttentionMetadata:
        layout, inputs, staged = plan.layout, plan.inputs, plan.staged
        num_tokens, num_seqs = layout.num_tokens, layout.num_seqs
        meta = AttentionMetadata(
            num_tokens=num_tokens,
            num_seqs=num_seqs,
            max_query_len=layout.max_query_len,
            max_seq_len=layout.max_seq_len,
            query_start_loc=inputs.prefix("query_start_loc", num_seqs + 1),
            seq_lens=inputs.prefix("seq_lens", num_seqs),
            slot_mapping=inputs.prefix("slot_mapping", num_tokens),
            block_table=block_table,
            query_start_loc_cpu=staged.prefix("query_start_loc", num_seqs + 1),
            seq_lens_cpu=staged.prefix("seq_lens", num_seqs),
            decode_order=inputs.prefix("decode_order", layout.num_decodes)
            if layout.num_decodes
            else None,
            num_decodes=layout.num_decodes,
        )
        meta.groups = group_metadata(meta, inputs.tensors, layout.num_kv_groups)
        return meta

    def _forward(self, plan: StepPlan) -> torch.Tensor:
        """[num_tokens (graph_size when a decode graph replays), hidden_size]: the model over the batch."""
        layout, inputs = plan.layout, plan.inputs
        num_tokens, num_seqs, num_cols = layout.num_tokens, layout.num_seqs, layout.num_block_cols
        graphs = self.graphs
        if plan.replays_decode_graph or plan.mode is StepMode.SPEC_GRAPH:
            if graphs.block_table_version != self._table_version:
                tables = inputs.prefix("block_table", layout.num_kv_groups, num_seqs, num_cols)
                graphs.load_block_table(tables, self._table_version)
        if plan.replays_decode_graph:
            return graphs.replay(plan.graph_size, plan.stage_slot)
        if plan.mode is StepMode.SPEC_GRAPH:
            return graphs.spec.replay_step(plan, self.spec.write_draft_inputs)
        input_ids = self._input_ids(inputs, layout)  # [T]
        if layout.spec is not None:
            self.spec.write_draft_inputs(input_ids)
        block_table = inputs.prefix("block_table", num_seqs, num_cols)
        meta = self._attention_metadata(plan, block_table)
        positions = inputs.prefix("positions", num_tokens)  # [T]
        if plan.mode is StepMode.PIECEWISE:
            return self.piecewise.replay(plan.graph_size, input_ids, positions, meta)
        return self.model(
            input_ids,
            positions,
            self.kv_caches,
            meta,
            inputs_embeds=self._inputs_embeds(input_ids, layout),
        )

    def _input_ids(self, inputs: Sections, layout: BatchLayout) -> torch.Tensor:
        """[num_tokens]: the copied input ids or, when some are tokens the previous step sampled
        (still on the device), all of them gathered from the ids table by input_src."""
        num_tokens = layout.num_tokens
        if not layout.num_placeholders:
            return inputs.prefix("input_ids", num_tokens)
        input_ids = self._gathered_ids.get("ids", num_tokens)
        torch.index_select(
            inputs.tensors["ids_table"], 0, inputs.prefix("input_src", num_tokens), out=input_ids
        )
        return input_ids

    def _inputs_embeds(self, input_ids: torch.Tensor, layout: BatchLayout) -> torch.Tensor | None:
        """[num_tokens, hidden_size] token embeddings with prompt_embeds rows written over, or
        None when no request in the batch brought prompt_embeds for its scheduled positions."""
        if not layout.embeds_spans:
            return None
        embeds = self.model.embed_tokens(input_ids)  # [T, hidden_size]
        for span in layout.embeds_spans:
            source = self.input_batch.prompt_embeds[span.row]  # [num_prompt_tokens, hidden_size]
            embeds[span.batch_start : span.batch_start + span.length] = source[
                span.prompt_start : span.prompt_start + span.length
            ]
        return embeds

    def _sample(
        self, hidden: torch.Tensor, plan: StepPlan, grammar: GrammarRows | None
    ) -> tuple[SamplerOutput | None, bool]:
        """Each sampling request's token, its id scattered by row into last_sampled (None when no
        request samples this step), and whether the ids are in the slot's pinned output already. A
        greedy batch of a graph that computes the argmax takes the graph's ids ([graph_size]: the rows
        past num_samples are padding), which the graph wrote into last_sampled itself (and, a staged
        graph, into the pinned output), unless constrained rows (`grammar`) need their bitmask on
        the logits first: such a step samples eagerly from the graph's logits."""
        layout = plan.layout
        num_samples = layout.num_samples
        if num_samples == 0:
            return None, False
        rows_np = layout.sample_rows_np
        if (
            plan.replays_decode_graph and layout.samples_every_token
        ):  # the graph's rows 0..N-1 sample
            argmax = self.graphs.argmax(plan.graph_size, plan.stage_slot)
            if argmax is not None and grammar is None and self.sampler.is_greedy(rows_np):
                self.sampler.count_sampled(rows_np)
                return SamplerOutput(argmax), plan.stage_slot is not None
        if self.tp_sampler is not None:  # tp > 1: from each rank's vocabulary shard (sampling.py)
            local = self._logits(hidden, plan, self.model.compute_local_logits)
            sample = self.tp_sampler.sample(
                local, rows_np, layout.sample_num_logprobs_np, grammar, plan.slot
            )
        else:
            logits = self._logits(hidden, plan, self.model.compute_logits)
            if grammar is not None:  # before the sampler: logprobs are of the masked distribution
                apply_grammar_bitmask(logits, *grammar)
            sample = self.sampler.sample(logits, rows_np)
        self._last_sampled.index_copy_(
            0, plan.inputs.prefix("sample_rows", num_samples), sample.sampled_token_ids
        )
        return sample, False

    def _logits(self, hidden: torch.Tensor, plan: StepPlan, head: LMHead) -> torch.Tensor:
        """[num_samples, head's columns] float32: the logits of each sampling request's last token. A
        replay where every row samples takes the graph's own logits where it computes them, else runs
        head on its graph_size hidden rows (a graph size is one of the LM head's row counts); any other
        step goes through the padded LM head (lm_head.py)."""
        layout = plan.layout
        num_samples = layout.num_samples
        if plan.replays_decode_graph and layout.samples_every_token:  # rows 0..N-1
            graph_logits = self.graphs.logits(plan.graph_size, plan.stage_slot)
            logits = head(hidden) if graph_logits is None else graph_logits
            return leading(logits, num_samples)
        if layout.samples_every_token:  # rows 0..N-1: no gather
            return self.lm_head.run(head, hidden[:num_samples])
        return self.lm_head.gathered(
            head, hidden, plan.inputs.prefix("logits_indices", num_samples)
        )

    def _launch_output(
        self,
        plan: StepPlan,
        sample: SamplerOutput | None,
        prompt_logprobs: tuple[torch.Tensor, ...] | None,
        ids_on_host: bool,
        spec: SpecOutput | None = None,
    ) -> AsyncRunnerOutput:
        """The device->host copies of the step's results (the sampled ids' unless a staged graph
        wrote them there), then the step's event (stream order: after all of the step's work)."""
        slot = plan.slot
        sampled_np = logprobs_cpu = None
        if sample is not None:
            sampled_ids = sample.sampled_token_ids  # [num_samples] ([graph_size]: a graph's)
            if not ids_on_host:
                self._sampled_cpu_views.get(slot, sampled_ids.shape[0]).copy_(
                    sampled_ids, non_blocking=True
                )
            sampled_np = self._sampled_np[slot]
            logprobs_cpu = _to_host(sample.logprobs)
        elif spec is not None:
            logprobs_cpu = _to_host(spec.logprobs)
        prompt_logprobs_cpu = _to_host(prompt_logprobs)
        event = self._step_events[slot]
        if event is not None:
            event.record(self._compute_stream())
        return AsyncRunnerOutput(
            plan.step_id, plan.layout, sampled_np, logprobs_cpu, event, prompt_logprobs_cpu, spec
        )

    def _compute_stream(self) -> torch.cuda.Stream:
        """The stream the step's work goes to (CUDA only)."""
        return torch.cuda.current_stream(self._device_index)


def _to_host(tensors: tuple[torch.Tensor, ...] | None) -> tuple[torch.Tensor, ...] | None:
    """Non-blocking device->host copies (the caller records an event after them)."""
    return None if tensors is None else tuple(t.to("cpu", non_blocking=True) for t in tensors)
