"""The threads that take a request's CPU work off the event loop: JSON parsing and validation,
chat templates, tokenisation. The event loop then only moves bytes and outputs, so one large
request never stalls the streams in flight or /health."""

from __future__ import annotations

import asyncio
import copy
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from pagedlm.engine.tokenizer import Tokenizer

T = TypeVar("T")

# Enough that a few large requests (a chat template over 100k messages renders for seconds)
# leave threads for the small ones. Tokenisation releases the GIL (the tokenizers library
# encodes in Rust) and runs in parallel; the Python work interleaves. Each thread's tokenizer
# copy costs memory (13 MB for the default model's 49k vocabulary).
NUM_THREADS = 8
STARTUP_TIMEOUT_S = 60.0  # a barrier left broken only means some copies come later


class TokenizerPool:
    def __init__(self, tokenizer: Tokenizer | None, num_threads: int = NUM_THREADS) -> None:
        self._tokenizer = tokenizer
        self._local = threading.local()
        self._executor = ThreadPoolExecutor(
            num_threads, thread_name_prefix="pagedlm-tokenize", initializer=self._init_thread
        )
        self._start_every_thread(num_threads)

    def _start_every_thread(self, num_threads: int) -> None:
        """Starts all threads now, so that their tokenizer copies (0.2 s each for the default
        model, holding the GIL) are made while the server starts, not in the first burst of
        requests. Each submit finds no idle thread (the others wait at the barrier), so it
        starts a new one; the barrier releases them all once the last has its copy."""
        barrier = threading.Barrier(num_threads, timeout=STARTUP_TIMEOUT_S)
        for _ in range(num_threads):
            self._executor.submit(barrier.wait)

    def _init_thread(self) -> None:
        # A copy per thread: a Hugging Face fast tokenizer is not safe to share between threads
        # (its Rust object is borrowed mutably when truncation or padding is set: "Already
        # borrowed").
        self._local.tokenizer = copy.deepcopy(self._tokenizer)

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """fn(*args) on a pool thread, awaited."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    async def run_with_tokenizer(self, fn: Callable[..., T], *args: Any) -> T:
        """fn(tokenizer, *args) on a pool thread with that thread's copy of the tokenizer."""
        return await self.run(self._call_with_tokenizer, fn, args)

    def _call_with_tokenizer(self, fn: Callable[..., T], args: tuple[Any, ...]) -> T:
        return fn(self._local.tokenizer, *args)
