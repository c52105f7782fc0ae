"""Test set-up for the model runner: a tiny random Llama saved as a Hugging Face folder, a runner
over it (NaN-poisoned KV cache), a small scheduler that drives the runner in sync or async mode,
and the transformers greedy reference."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import torch

from pagedlm.config import EngineArgs, EngineConfig
from pagedlm.core.sched_output import (
    CachedRequestData,
    ModelRunnerOutput,
    NewRequestData,
    SchedulerOutput,
)
from pagedlm.sampling_params import SamplingParams
from pagedlm.worker.model_runner import ModelRunner

VOCAB = 96
HIDDEN = 64
NUM_LAYERS = 2
NUM_KV_HEADS = 2
HEAD_DIM = 16  # the Triton kernels need a power of two >= 16


def save_tiny_llama(folder: Path, seed: int = 0) -> torch.nn.Module:
    """A 2-layer GQA Llama with peaked random weights (greedy picks are far from ties)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    hf_config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=96,
        num_hidden_layers=NUM_LAYERS,
        num_attention_heads=HIDDEN // HEAD_DIM,
        num_key_value_heads=NUM_KV_HEADS,
        max_position_embeddings=1024,
        initializer_range=0.3,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(hf_config).eval()
    model.save_pretrained(folder)
    return model


def make_config(
    folder: Path,
    *,
    max_num_seqs: int = 4,
    max_num_batched_tokens: int = 16,
    block_size: int = 8,
    num_blocks: int | None = 64,
    max_model_len: int = 64,
    device: str = "cpu",
    attention_backend: str = "torch",
    gpu_memory_utilization: float = 0.9,
    graph_size_timing: bool = True,
) -> EngineConfig:
    return EngineArgs(
        model=str(folder),
        load_format="safetensors",
        dtype="float32",
        device=device,
        max_model_len=max_model_len,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        block_size=block_size,
        num_gpu_blocks_override=num_blocks,
        skip_tokenizer_init=True,
        attention_backend=attention_backend,
        gpu_memory_utilization=gpu_memory_utilization,
        graph_size_timing=graph_size_timing,
    ).create_engine_config()


def make_runner(config: EngineConfig) -> ModelRunner:
    """Loaded, with a NaN-poisoned KV cache: attending to a slot nobody wrote gives NaN logits."""
    runner = ModelRunner(config)
    runner.load_model()
    runner.init_kv_cache(runner.determine_num_blocks())
    for kv_cache in runner.kv_caches:
        kv_cache.fill_(float("nan"))
    return runner


@dataclass
class Req:
    req_id: str
    prompt: list[int]
    max_tokens: int
    params: SamplingParams = field(default_factory=lambda: SamplingParams(temperature=0.0))
    prompt_embeds: torch.Tensor | None = None
    outputs: list[int] = field(default_factory=list)
    num_computed: int = 0
    num_placeholders: int = 0
    blocks: list[int] = field(default_factory=list)
    on_worker: bool = False

    @property
    def num_tokens(self) -> int:  # known and in flight
        return len(self.prompt) + len(self.outputs) + self.num_placeholders

    @property
    def done_scheduling(self) -> bool:
        return len(self.outputs) + self.num_placeholders >= self.max_tokens


class MiniScheduler:
    """Just enough of a scheduler: FCFS admission up to max_num_seqs, a token budget (chunked
    prefill), fresh blocks from a counter, placeholders for tokens in flight, preemption."""

    def __init__(self, block_size: int, max_num_seqs: int, token_budget: int) -> None:
        self.block_size = block_size
        self.max_num_seqs = max_num_seqs
        self.token_budget = token_budget
        self.waiting: deque[Req] = deque()
        self.running: list[Req] = []
        self.done: dict[str, list[int]] = {}
        self.rows_seen: dict[str, int] = {}
        self._to_free: set[str] = set()
        self._next_block = 0
        self._step = 0

    def add(self, req: Req) -> None:
        self.waiting.append(req)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def preempt(self, req_id: str) -> None:
        req = next(r for r in self.running if r.req_id == req_id)
        assert req.num_placeholders == 0, "preempt only between steps in sync mode"
        self.running.remove(req)
        req.num_computed, req.blocks, req.on_worker = 0, [], False
        self.waiting.appendleft(req)
        self._to_free.add(req_id)

    def schedule(self) -> SchedulerOutput:
        while self.waiting and len(self.running) < self.max_num_seqs:
            self.running.append(self.waiting.popleft())
        out = SchedulerOutput(
            new_reqs=[],
            cached_reqs=[],
            num_scheduled_tokens={},
            total_num_scheduled_tokens=0,
            finished_req_ids=self._to_free,
            step_id=self._step,
        )
        self._to_free, self._step = set(), self._step + 1
        for req in self.running:
            budget_left = self.token_budget - out.total_num_scheduled_tokens
            num_new = min(req.num_tokens - req.num_computed, budget_left)
            if req.done_scheduling or num_new <= 0:
                continue
            self._schedule(req, num_new, out)
        return out

    def _schedule(self, req: Req, num_new: int, out: SchedulerOutput) -> None:
        num_needed = -(-(req.num_computed + num_new) // self.block_size) - len(req.blocks)
        new_blocks = list(range(self._next_block, self._next_block + max(0, num_needed)))
        self._next_block += len(new_blocks)
        req.blocks += new_blocks
        if req.on_worker:
            out.cached_reqs.append(CachedRequestData(req.req_id, new_blocks, req.num_computed))
        else:
            out.new_reqs.append(
                NewRequestData(
                    req.req_id,
                    list(req.prompt),
                    list(req.outputs),
                    req.params,
                    list(req.blocks),
                    req.num_computed,
                    req.prompt_embeds,
                )
            )
            req.on_worker = True
        out.num_scheduled_tokens[req.req_id] = num_new
        out.total_num_scheduled_tokens += num_new
        req.num_computed += num_new
        if req.num_computed == req.num_tokens:
            out.sampling_req_ids.add(req.req_id)
            req.num_placeholders += 1

    def update(self, output: ModelRunnerOutput) -> None:
        by_id = {r.req_id: r for r in self.running}
        for req_id, token_ids in zip(output.req_ids, output.sampled_token_ids):
            req = by_id[req_id]
            req.outputs += token_ids
            req.num_placeholders -= 1
            if len(req.outputs) >= req.max_tokens:
                self.running.remove(req)
                self.done[req_id] = req.outputs
                self._to_free.add(req_id)


def run_requests(
    runner: ModelRunner,
    sched: MiniScheduler,
    async_mode: bool,
    preempt_at: dict[int, str] | None = None,
) -> dict[str, list[int]]:
    """The engine loop. Async: step N+1 is launched before step N's output is read."""
    pending = None
    step = 0
    while sched.has_work():
        if preempt_at and step in preempt_at:
            sched.preempt(preempt_at[step])
        output = runner.execute_model(sched.schedule())
        for req_id, row in runner.input_batch.req_id_to_row.items():
            sched.rows_seen.setdefault(req_id, row)
        if async_mode:
            output, pending = pending, output
        if output is not None:
            sched.update(output.get_output())
        step += 1
    if pending is not None:
        sched.update(pending.get_output())
    return sched.done


@torch.no_grad()
def hf_greedy(
    hf_model: torch.nn.Module,
    max_tokens: int,
    prompt: list[int] | None = None,
    prompt_embeds: torch.Tensor | None = None,
) -> list[int]:
    """transformers greedy generate: the reference tokens."""
    kwargs = dict(
        max_new_tokens=max_tokens, min_new_tokens=max_tokens, do_sample=False, pad_token_id=0
    )
    if prompt_embeds is not None:
        mask = torch.ones(1, prompt_embeds.shape[0], dtype=torch.int64)
        out = hf_model.generate(inputs_embeds=prompt_embeds[None], attention_mask=mask, **kwargs)
        return out[0].tolist()  # only the new tokens when generating from embeddings
    # an explicit mask: otherwise generate masks every prompt token equal to pad_token_id
    out = hf_model.generate(
        torch.tensor([prompt]),
        attention_mask=torch.ones(1, len(prompt), dtype=torch.int64),
        **kwargs,
    )
    return out[0, len(prompt) :].tolist()


def random_prompt(length: int, seed: int) -> list[int]:
    return torch.randint(
        0, VOCAB, (length,), generator=torch.Generator().manual_seed(seed)
    ).tolist()
