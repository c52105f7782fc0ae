"""Zero host-device syncs in steady-state engine steps, through the real engine core loop (async
scheduling, input preparation, CUDA-graph replay of decode batches, eager mixed prefill+decode
batches, sampling with top-k/top-p and logprobs, the async device->host copy of sampled ids).

torch.cuda.set_sync_debug_mode("error") raises on stream and device synchronisation, synchronous
copies and the ops built on them (.item(), .tolist(), .cpu(), nonzero(), boolean-mask indexing).
It misses two things, checked here another way:
- event waits (c10's CUDAEvent::synchronize has no check). The step loop waits on events by
  design: get_output() for a step's event (after its work and the copy of its sampled ids), which
  _reclaim() also calls before a staging set is reused, two steps later (the engine has taken
  that step's output by then). Such a wait is free while the device has later work queued, so
  every wait is classified: a later step's forward must have been launched after the awaited
  event was recorded (the device has that forward queued).
- non_blocking copies between the device and pageable host memory (issued as cudaMemcpyAsync,
  which the driver runs synchronously with the host): the profiler names each copy's memory kinds.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from spec_decode.test_draft_graphs import count_draft_replays
from test_spec_decode_gpu import count_spec_replays
from tiny_hf_models import random_prompts, save_tiny_model, save_tiny_model_with_tokenizer
from torch.profiler import ProfilerActivity, profile

from pagedlm.config import EngineArgs
from pagedlm.engine.engine_core import EngineCore
from pagedlm.engine.tokenizer import load_tokenizer
from pagedlm.request import Request
from pagedlm.sampling_params import SamplingParams, StructuredOutputsParams

pytestmark = pytest.mark.gpu

WARMUP_STEPS = 12  # compiles the kernels of the first shapes; syncs allowed
STEADY_STEPS = 60
ARRIVAL_EVERY = 6  # a new prompt every 6 steps: its prefill shares a step with the decodes
MAX_DRAIN_STEPS = 2000
GREEDY = SamplingParams(temperature=0.0)
RANDOM = SamplingParams(temperature=0.8, top_k=20, top_p=0.9, seed=7, logprobs=2)
# penalties and bad words read each verify position's drafts (sample/state.py make_batch)
PENALISED = SamplingParams(
    temperature=0.0,
    repetition_penalty=1.2,
    frequency_penalty=0.3,
    bad_words_token_ids=[[5], [7, 9]],
)
# a JSON string that never ends within max_tokens: a random model's tokens stay inside it
NEVER_ENDS = StructuredOutputsParams(json={"type": "string", "minLength": 10_000})


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny_qwen3")
    save_tiny_model(path, "qwen3")
    return path


@pytest.fixture(scope="module")
def folder_with_tokenizer(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny_qwen3_tokenizer")
    save_tiny_model_with_tokenizer(path, "qwen3")
    return path


def _engine(folder, with_tokenizer: bool = False, **overrides) -> EngineCore:
    """bf16, max_num_seqs 16 (graph sizes 1, 2, 4, 8, 16), a 64-token budget, async scheduling;
    with_tokenizer: the folder's (structured outputs compile grammars for it)."""
    config = EngineArgs(
        **overrides,
        model=str(folder),
        dtype="bfloat16",
        device="cuda",
        skip_tokenizer_init=not with_tokenizer,
        max_model_len=512,
        max_num_seqs=16,
        max_num_batched_tokens=64,
        num_gpu_blocks_override=512,
        async_scheduling=True,
    ).create_engine_config()
    core = EngineCore(config, load_tokenizer(config.model))
    assert core.model_runner.graphs is not None
    return core


class Workload:
    """Six requests at first (two outlive the test, one samples at random with logprobs), then a
    short greedy one every ARRIVAL_EVERY steps; records the tokens each request receives."""

    def __init__(self, core: EngineCore, constrain: bool = False, penalise: bool = False) -> None:
        """constrain: every other request (the random one among them) under NEVER_ENDS;
        penalise: requests 2 and 3 PENALISED."""
        self.core = core
        self.constrain = constrain
        self.max_tokens: dict[str, int] = {}
        self.received: dict[str, int] = {}
        self.num_steps = 0
        for i in range(6):
            params = RANDOM if i == 1 else PENALISED if penalise and i in (2, 3) else GREEDY
            self._add(8 + 5 * i, 200 if i < 2 else 40 + 7 * i, params)

    def _add(self, prompt_len: int, max_tokens: int, params: SamplingParams) -> None:
        index = len(self.max_tokens)
        prompt = random_prompts(1, prompt_len, prompt_len, seed=index)[0]
        self.max_tokens[f"r{index}"] = max_tokens
        if self.constrain and index % 2 == 1:
            params = dataclasses.replace(params, structured_outputs=NEVER_ENDS)
        self.core.add_request(
            Request(
                request_id=f"r{index}",
                prompt_token_ids=prompt,
                sampling_params=params,
                max_tokens=max_tokens,
            )
        )

    def step(self, arrivals: bool = True) -> int:
        """One engine step (a new arrival first, every ARRIVAL_EVERY); the tokens it returned."""
        if arrivals and self.num_steps % ARRIVAL_EVERY == ARRIVAL_EVERY - 1:
            self._add(20 + self.num_steps % 17, 12 + self.num_steps % 9, GREEDY)
        self.num_steps += 1
        num_tokens = 0
        for output in self.core.step():
            self.received[output.req_id] = self.received.get(output.req_id, 0) + len(
                output.new_token_ids
            )
            num_tokens += len(output.new_token_ids)
        return num_tokens

    def drain(self) -> None:
        for _ in range(MAX_DRAIN_STEPS):
            if not self.core.has_unfinished_requests():
                return
            self.step(arrivals=False)
        raise AssertionError(f"requests left after {MAX_DRAIN_STEPS} steps")


class StepMonitor:
    """Counts the runner's launched steps (mixed prefill+decode ones and masked ones apart) and
    graph replays, and classifies each host wait on a CUDA event: hidden when a later step's
    forward was launched after the event was recorded (the device has that forward queued), else
    exposed."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, core: EngineCore) -> None:
        runner = core.model_runner
        self.num_steps = 0  # launched forwards of steps with work, since the start
        self._recorded_at: dict[int, int] = {}  # id(event) -> num_steps at its last record
        self.reset()
        execute, sample, replay = runner.execute_forward, runner.sample_tokens, runner.graphs.replay
        record, synchronize = torch.cuda.Event.record, torch.cuda.Event.synchronize

        def counted_execute(sched):
            output = execute(sched)  # the forward; sample_tokens records the step's event
            if not sched.is_empty:
                self.num_steps += 1
                self.num_window_steps += 1
                num_tokens = sched.num_scheduled_tokens.values()
                self.num_mixed += max(num_tokens) > 1 and min(num_tokens) == 1
            return output

        def counted_sample(grammar):
            self.num_masked += grammar is not None
            return sample(grammar)

        def counted_replay(size: int, slot: int | None = None) -> torch.Tensor:
            self.num_replays += 1
            return replay(size, slot)

        def stamped_record(event: torch.cuda.Event, stream=None) -> None:
            self._recorded_at[id(event)] = self.num_steps
            record(event, stream)

        def classified_synchronize(event: torch.cuda.Event) -> None:
            recorded_at = self._recorded_at.get(id(event))  # None: never recorded, a no-op
            if recorded_at is not None and self.num_steps >= recorded_at + 1:
                self.num_hidden += 1
            elif recorded_at is not None:
                self.num_exposed += 1
            synchronize(event)

        monkeypatch.setattr(runner, "execute_forward", counted_execute)
        monkeypatch.setattr(runner, "sample_tokens", counted_sample)
        monkeypatch.setattr(runner.graphs, "replay", counted_replay)
        monkeypatch.setattr(torch.cuda.Event, "record", stamped_record)
        monkeypatch.setattr(torch.cuda.Event, "synchronize", classified_synchronize)

    def reset(self) -> None:
        self.num_window_steps = self.num_mixed = self.num_replays = 0
        self.num_hidden = self.num_exposed = self.num_masked = 0


@pytest.mark.parametrize("constrain", [False, True], ids=["free", "constrained"])
def test_steady_state_steps_make_no_sync(folder, folder_with_tokenizer, monkeypatch, constrain):
    """constrained: half the requests under a grammar, its bitmask filled between a step's
    forward and its sampling, each step waiting on the step before it only once its own forward
    is queued."""
    core = _engine(folder_with_tokenizer if constrain else folder, with_tokenizer=constrain)
    monitor = StepMonitor(monkeypatch, core)
    work = Workload(core, constrain)
    for _ in range(WARMUP_STEPS):
        work.step()
    monitor.reset()
    num_tokens = 0
    torch.cuda.set_sync_debug_mode("error")
    try:
        with pytest.raises(RuntimeError):  # the mode is on and does catch a sync
            torch.ones(1, device="cuda").item()
        for _ in range(STEADY_STEPS):
            num_tokens += work.step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert monitor.num_window_steps >= 50, monitor.num_window_steps
    assert monitor.num_replays >= 20 and monitor.num_mixed >= 5, vars(monitor)
    assert num_tokens >= STEADY_STEPS, num_tokens  # several sequences sample every step
    # one wait per step taken: its event
    assert monitor.num_exposed == 0 and monitor.num_hidden >= STEADY_STEPS - 2, vars(monitor)
    work.drain()
    assert work.received == work.max_tokens
    assert monitor.num_exposed >= 1  # the classifier sees one: the last step waits alone
    if constrain:
        assert core.structured_outputs.stats.num_compiles == 1
        assert monitor.num_masked >= STEADY_STEPS // 2, vars(monitor)


@pytest.mark.parametrize("proposer", ["ngram", "synthetic", "draft_model"])
def test_speculative_steps_make_no_sync(folder, proposer: str):
    """The same workload with speculation (k = 3): n-gram drafts (matches of one token: the
    random model's tokens recur), steps that verify drafts, mixed with prefills and plain
    decodes, make no sync, penalised requests among them; every request gets exactly its
    max_tokens. synthetic: drafts every step, so the uniform steps replay their full graphs
    (worker/spec_graphs.py). draft_model: the target as its own draft (every draft accepted),
    its uniform first forwards and its single steps replays of its graphs (draft_graphs.py). (A
    speculating request waits for its step's output, so event waits may be exposed: not
    counted here.)"""
    spec = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1,
            "prompt_lookup_max": 2}  # fmt: skip
    if proposer == "synthetic":
        spec |= {"rejection_sample_method": "synthetic", "synthetic_acceptance_rates": 0.6}
    if proposer == "draft_model":
        spec = {"method": "draft_model", "model": str(folder), "num_speculative_tokens": 3}
    core = _engine(folder, speculative_config=spec)
    replays = count_spec_replays(core.model_runner)
    draft_graphs = core.model_runner.graphs.draft
    draft_replays = [] if draft_graphs is None else count_draft_replays(draft_graphs)
    work = Workload(core, penalise=True)
    for _ in range(WARMUP_STEPS):
        work.step()
    counters = core.scheduler.spec.counters
    drafts_before, replays_before = counters.num_drafts, len(replays)
    draft_replays_before = len(draft_replays)
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(STEADY_STEPS):
            work.step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert counters.num_drafts - drafts_before >= 10, counters
    if proposer == "synthetic":
        assert len(replays) - replays_before >= 3, replays
    if proposer == "draft_model":
        assert len(draft_replays) - draft_replays_before >= 20, draft_replays
        assert any(r > 1 for _, r in draft_replays), draft_replays  # a first forward too
    work.drain()
    assert work.received == work.max_tokens
    assert counters.num_accepted_tokens > 0, counters


def _memcpy_names(prof: profile) -> list[str]:
    return [event.name for event in prof.events() if event.name.startswith("Memcpy")]


def test_steady_state_copies_use_pinned_memory(folder):
    control = torch.empty(4)  # pageable: the profiler must name this copy's host side so
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        control.copy_(torch.ones(4, device="cuda"), non_blocking=True)
        torch.cuda.synchronize()
    control_names = _memcpy_names(prof)
    if not control_names:
        pytest.skip("the profiler records no CUDA memcpy activity here (CUPTI unavailable)")
    assert any("Pageable" in name for name in control_names), control_names
    core = _engine(folder)
    work = Workload(core)
    for _ in range(WARMUP_STEPS):
        work.step()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(STEADY_STEPS // 2):
            work.step()
        torch.cuda.synchronize()
    names = _memcpy_names(prof)
    assert any("HtoD" in name for name in names) and any("DtoH" in name for name in names), names
    assert not [name for name in names if "Pageable" in name], sorted(set(names))
