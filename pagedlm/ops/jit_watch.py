"""Triton compiles, watched. A Triton kernel compiles (or loads from the disk cache) at the first
launch of each specialisation: its constexprs, and its int/pointer arguments' "equals 1" and
"divisible by 16" properties. A compile takes from ~50 ms (disk cache) to seconds, and the step that
meets it waits that long. The engine runs the specialisations it knows of at start-up; this module
records every compile with its duration, and after `serving` logs each one as a warning, so a
missed specialisation shows in the log instead of as an unexplained latency spike."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from triton import knobs

logger = logging.getLogger("pagedlm")


@dataclass(frozen=True, slots=True)
class CompileEvent:
    kernel: str  # the @triton.jit function's name
    signature: str  # Triton's repr: launch options and each argument's specialised type
    seconds: float
    while_serving: bool  # after `serving`: a step waited for it


class CompileWatch:
    """Installs Triton's jit_cache_hook (called before a compile) and jit_post_compile_hook (after)
    for the process (replacing any hooks set before); `events` lists the compiles since `install`.
    The serving flag is the process's: engines built one after another each call `start_up`."""

    def __init__(self) -> None:
        self.events: list[CompileEvent] = []
        self._serving = False
        self._started: dict[str, float] = {}  # specialisation key -> perf_counter at the start
        self._lock = threading.Lock()

    def install(self) -> None:
        knobs.runtime.jit_cache_hook = self._before
        knobs.runtime.jit_post_compile_hook = self._after

    def start_up(self) -> int:
        """An engine starts: compiles are expected until `serving`. -> the index of its first event."""
        self._serving = False
        return len(self.events)

    def serving(self) -> None:
        """Start-up is over: compiles from now on are logged as warnings."""
        self._serving = True

    def since(self, index: int) -> list[CompileEvent]:
        """The events after the first `index` (take len(events) before a call, then this)."""
        return self.events[index:]

    def _before(self, *, key, fn, **_) -> bool:
        with self._lock:
            self._started[f"{fn.name}:{key}"] = time.perf_counter()
        return False  # False: go on and compile

    def _after(self, *, key, fn, compile: dict, **_) -> None:  # noqa: A002 (Triton's keyword)
        now = time.perf_counter()
        with self._lock:
            started = self._started.pop(f"{fn.name}:{key}", now)
        event = CompileEvent(
            kernel=fn.name,
            signature=describe(compile),
            seconds=now - started,
            while_serving=self._serving,
        )
        self.events.append(event)
        if event.while_serving:
            logger.warning(
                "Triton compiled %s while serving (%.2f s; a step waited): %s",
                event.kernel,
                event.seconds,
                event.signature,
            )


def describe(compile: dict) -> str:
    """One specialisation, from Triton's hook data: each argument as name: type, '/16' if it was
    specialised as divisible by 16 (ints, and pointers as 16-byte aligned), '=value' if constant
    (constexprs, and ints equal to 1); then the launch options."""
    constants, attrs = compile["constants"], compile["configs"][0]
    args = []
    for i, (name, ty) in enumerate(compile["signature"].items()):
        arg = f"{name}: {ty}" + ("/16" if (i,) in attrs else "")
        if (i,) in constants:
            arg = f"{name}={constants[(i,)]!r}"
        args.append(arg)
    return (
        f"({', '.join(args)}) num_warps={compile['num_warps']} num_stages={compile['num_stages']}"
    )


_watch: CompileWatch | None = None
_watch_lock = threading.Lock()


def num_compiles_while_serving() -> int:
    """Compiles a step waited for, since the process started (0 where no engine watches)."""
    return 0 if _watch is None else sum(event.while_serving for event in _watch.events)


def compile_watch() -> CompileWatch:
    """The process's watch, installed at the first call (Triton's hooks are process-wide)."""
    global _watch
    with _watch_lock:
        if _watch is None:
            _watch = CompileWatch()
            _watch.install()
    return _watch
