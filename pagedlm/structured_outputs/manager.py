"""The engine core's structured outputs: grammars compiled off the step loop, one matcher per
request, the step's token bitmask.

Compiles run on a small thread pool (xgrammar's compiler releases the GIL), one future per
constraint in an LRU cache, so equal constraints compile once. A request waits in the scheduler
(GrammarState.is_ready) until its grammar is compiled while the others run; a compile that fails
or passes `timeout_s` fails the request alone (`take_failed`). The step loop blocks on a compile
only when nothing else can run, and counts each such wait.

A step's bitmask is filled after its forward is launched (engine_core.py): `constrained_rows` when
it is scheduled, `fill` once the steps before it are collected (their tokens advance the matchers),
straight into the worker's pinned staging rows, while the device runs the forward.

Speculative decoding: a constrained request verifies only the drafts its grammar accepts
(GrammarState.schedule_drafts, from the scheduler), and has a bitmask row at each of its 1 + n
logits rows: row j masks the target's distribution after drafts 1..j, so the rejection sampler
verifies and resamples within the grammar (exactly: the target's masked distribution is what it
samples from). The fill advances the matchers over the drafts and rolls them back; the emitted
tokens advance them when the step is collected, as any token."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from pagedlm.core.sched_output import GrammarBitmask, SchedulerOutput
from pagedlm.sampling_params import StructuredOutputsParams
from pagedlm.structured_outputs.grammars import GrammarKey, build_grammar, grammar_key

if TYPE_CHECKING:
    import xgrammar as xgr

    from pagedlm.config import ModelConfig
    from pagedlm.request import Request

logger = logging.getLogger(__name__)

DEFAULT_COMPILE_TIMEOUT_S = 30.0
_NUM_COMPILE_THREADS = 2
_CACHE_SIZE = 256  # compiled grammars kept (LRU)
_NUM_FILL_THREADS = max(1, min(8, (os.cpu_count() or 2) // 2))  # half the cores, at most 8
_IDLE_WAIT_S = 0.05  # longest block on a compile when nothing else runs (the loop stays live)


@dataclass(slots=True)
class StructuredOutputStats:
    num_compiles: int = 0  # grammars compiled (cache misses)
    compile_seconds: float = 0.0  # their total compile time
    num_compile_waits: int = 0  # times the step loop blocked on a compile (nothing else to run)
    num_failed: int = 0  # requests failed by a compile error or timeout


@dataclass(slots=True)
class ConstrainedRows:
    """A step's constrained logits rows (one per sampling request, or 1 + n for one that
    verifies n drafts; the step's logits rows are its sampling requests' in batch order), and
    their requests' grammars and drafts."""

    logits_rows: np.ndarray  # [M] int64, increasing
    states: list[GrammarState]  # [C] the constrained requests'
    drafts: list[list[int]]  # [C] each one's drafts verified this step
    first_rows: list[int]  # [C] each one's first row among the M


@dataclass(slots=True, eq=False)
class GrammarState:
    """One request's constraint: its compile, then its matcher (made on the first is_ready)."""

    future: Future
    deadline: float  # time.monotonic() past which a compile still running fails the request
    matcher: xgr.GrammarMatcher | None = None
    error: str | None = None
    drafts: list[int] = field(default_factory=list)  # verified by its next step (speculation)

    def is_ready(self) -> bool:
        if self.matcher is None and self.error is None and self.future.done():
            if self.future.exception() is not None:
                self.error = (
                    f"structured_outputs: the grammar failed to compile: {self.future.exception()}"
                )
            else:
                import xgrammar as xgr

                self.matcher = xgr.GrammarMatcher(self.future.result())
        return self.matcher is not None

    def accept_token(self, token_id: int) -> bool:
        """Advances the matcher; True when the grammar ended (terminated, or refused the token:
        possible only where another rule, e.g. min_tokens, banned every token it allowed)."""
        if not self.matcher.accept_token(token_id):
            logger.warning("structured outputs: token %d is outside the grammar", token_id)
            return True
        return self.matcher.is_terminated()

    def schedule_drafts(self, drafts: list[int]) -> int:
        """How many of `drafts` the next step verifies: the longest prefix the grammar accepts
        (a draft past one that ends it, or that it refuses, would be rejected anyway: the
        target's masked distribution gives it no mass); kept for the step's bitmask (fill)."""
        num = 0
        for token_id in drafts:
            if self.matcher.is_terminated() or not self.matcher.accept_token(token_id):
                break
            num += 1
        if num:
            self.matcher.rollback(num)
        self.drafts = drafts[:num]
        return num


class StructuredOutputManager:
    def __init__(
        self,
        model_config: ModelConfig,
        tokenizer: Any,
        timeout_s: float | None = None,
    ) -> None:
        """tokenizer: a Hugging Face tokenizer of the model (None: every compile fails)."""
        self.model_config = model_config
        self.tokenizer = tokenizer
        self.timeout_s = DEFAULT_COMPILE_TIMEOUT_S if timeout_s is None else timeout_s
        self.stats = StructuredOutputStats()
        self._pool = ThreadPoolExecutor(_NUM_COMPILE_THREADS, thread_name_prefix="pagedlm-grammar")
        self._compiler: xgr.GrammarCompiler | None = None
        self.num_words = (
            0  # the bitmask's width, ceil(grammar vocabulary / 32): set with the compiler
        )
        self._compiler_lock = threading.Lock()
        self._cache: OrderedDict[GrammarKey, Future] = OrderedDict()
        self._pending: dict[str, Request] = {}  # compiles not ready yet, by request id
        self._filler: xgr.BatchGrammarMatcher | None = None

    # ---- requests ----

    def add_request(self, request: Request) -> None:
        params = request.sampling_params.structured_outputs
        assert params is not None
        request.structured_output = GrammarState(
            self._compile(params), time.monotonic() + self.timeout_s
        )
        self._pending[request.request_id] = request

    def take_failed(self) -> dict[str, str]:
        """Requests whose compile failed or timed out since the last call: id -> the reason."""
        failed = {}
        now = time.monotonic()
        for req_id, request in list(self._pending.items()):
            state = request.structured_output
            if request.is_finished or state.is_ready():
                del self._pending[req_id]
            elif state.error is not None or now > state.deadline:
                failed[req_id] = state.error or (
                    f"structured_outputs: the grammar did not compile within {self.timeout_s:g} s"
                )
                del self._pending[req_id]
        self.stats.num_failed += len(failed)
        return failed

    def has_pending(self) -> bool:
        return bool(self._pending)

    def wait_for_compile(self) -> None:
        """Blocks (briefly) until some pending compile ends: the step loop has nothing else to do."""
        self.stats.num_compile_waits += 1
        logger.debug("the step loop waits on a grammar compile")
        futures = [request.structured_output.future for request in self._pending.values()]
        wait_futures(futures, timeout=_IDLE_WAIT_S, return_when="FIRST_COMPLETED")

    # ---- the step's bitmask ----

    def constrained_rows(
        self, sched: SchedulerOutput, requests: dict[str, Request]
    ) -> ConstrainedRows | None:
        """The step's constrained sampling rows, taken when it is scheduled (a request may finish
        before its bitmask is filled); None when it has none."""
        logits_rows, states, drafts, first_rows = [], [], [], []
        drafted, next_row = sched.num_draft_tokens, 0
        for req_id in _sampling_order(sched.num_scheduled_tokens, sched):
            num_rows = 1 + drafted.get(req_id, 0)
            state = requests[req_id].structured_output
            if state is not None:
                step_drafts = state.drafts if num_rows > 1 else []  # else stale, or none
                assert len(step_drafts) == num_rows - 1, "drafts not scheduled by the grammar"
                first_rows.append(len(logits_rows))
                logits_rows.extend(range(next_row, next_row + num_rows))
                states.append(state)
                drafts.append(step_drafts)
            next_row += num_rows
        if not states:
            return None
        return ConstrainedRows(np.array(logits_rows, dtype=np.int64), states, drafts, first_rows)

    def fill(self, rows: ConstrainedRows, out: GrammarBitmask) -> GrammarBitmask:
        """The rows' logits rows and bitmask, written into the first M rows of `out` (the
        worker's staging rows, `num_words` wide: no copy on the host). Every matcher must have
        seen all its request's tokens but this step's (the engine core collects the steps before
        first). Draft j + 1's row is filled after the matcher took drafts 1..j (round j; every
        request's row of a round in one batch fill), then the drafts are rolled back. A matcher
        that ended (its request finished: this step's tokens are dropped; or at a draft that
        ends the grammar: what follows is dropped) allows every token."""
        num_rows = len(rows.logits_rows)
        filled = GrammarBitmask(out.logits_rows[:num_rows], out.bitmask[:num_rows])
        filled.logits_rows[:] = rows.logits_rows
        matchers = [state.matcher for state in rows.states]
        active = [c for c, matcher in enumerate(matchers) if not matcher.is_terminated()]
        unfilled = np.ones(num_rows, dtype=bool)
        num_taken = [0] * len(matchers)  # drafts each matcher took here, to roll back
        filler, j = self._batch_matcher(), 0
        while active:
            row_indices = [rows.first_rows[c] + j for c in active]
            filler.batch_fill_next_token_bitmask(
                [matchers[c] for c in active], filled.bitmask, row_indices
            )
            unfilled[row_indices] = False
            active = [c for c in active if j < len(rows.drafts[c])]
            for c in active:  # schedule_drafts took none past one that ends the grammar
                matchers[c].accept_token(rows.drafts[c][j])
                num_taken[c] += 1
            active = [c for c in active if not matchers[c].is_terminated()]
            j += 1
        for matcher, num in zip(matchers, num_taken):
            if num:
                matcher.rollback(num)
        if unfilled.any():
            filled.bitmask[unfilled] = -1
        return filled

    def _batch_matcher(self) -> xgr.BatchGrammarMatcher:
        """Fills the rows on xgrammar's own threads (the GIL released)."""
        if self._filler is None:
            import xgrammar as xgr

            self._filler = xgr.BatchGrammarMatcher(max_threads=_NUM_FILL_THREADS)
        return self._filler

    # ---- compiling ----

    def _compile(self, params: StructuredOutputsParams) -> Future:
        key = grammar_key(params)
        future = self._cache.get(key)
        if future is not None and not (future.done() and future.exception() is not None):
            self._cache.move_to_end(key)
            return future
        future = self._pool.submit(self._compile_now, params)
        self._cache[key] = future
        if len(self._cache) > _CACHE_SIZE:
            self._cache.popitem(last=False)
        return future

    def _compile_now(self, params: StructuredOutputsParams) -> xgr.CompiledGrammar:
        start = time.perf_counter()
        compiled = self._get_compiler().compile_grammar(build_grammar(params))
        seconds = time.perf_counter() - start
        self.stats.num_compiles += 1
        self.stats.compile_seconds += seconds
        logger.debug("compiled a %s grammar in %.3f s", params.kind, seconds)
        return compiled

    def _get_compiler(self) -> xgr.GrammarCompiler:
        """Made on the first compile (a pool thread): the tokenizer's vocabulary, padded to the
        model's, with the model's EOS ids as the grammar's stop tokens."""
        with self._compiler_lock:
            if self._compiler is None:
                self._compiler, vocab_size = _new_compiler(self.model_config, self.tokenizer)
                self.num_words = (vocab_size + 31) // 32
            return self._compiler

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def _sampling_order(num_scheduled: Iterable[str], sched: SchedulerOutput) -> Iterable[str]:
    """The step's sampling requests in batch order: the sampler's rows (worker/input_batch.py)."""
    sampling = sched.sampling_req_ids
    return (req_id for req_id in num_scheduled if req_id in sampling)


def _new_compiler(model_config: ModelConfig, tokenizer: Any) -> tuple[Any, int]:
    """The compiler and its vocabulary size: the tokenizer's ids, at most the model's. The ids past
    them (a model's padding) are banned by the bitmask's width (sample/grammar_mask.py), not
    named to xgrammar as special tokens: a matcher's accept_token scans those (llama3-8b's shape
    with SmolLM2's tokenizer: 79k of them, ~40 us a token)."""
    import xgrammar as xgr

    if tokenizer is None:
        raise ValueError("structured outputs need a tokenizer, but skip_tokenizer_init=True")
    vocab_size = min(model_config.vocab_size, max(tokenizer.get_vocab().values()) + 1)
    info = xgr.TokenizerInfo.from_huggingface(
        tokenizer,
        vocab_size=vocab_size,
        # None: xgrammar takes the tokenizer's EOS (a config may name none, e.g. a dummy shape)
        stop_token_ids=sorted(i for i in model_config.eos_token_ids if i < vocab_size) or None,
    )
    return xgr.GrammarCompiler(info, max_threads=_NUM_COMPILE_THREADS), vocab_size
