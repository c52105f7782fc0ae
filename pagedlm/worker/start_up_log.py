"""The runner's start-up log lines: what the CUDA graphs took and kept, and the Triton compiles."""

from __future__ import annotations

import logging

from pagedlm.ops.jit_watch import compile_watch
from pagedlm.worker.cuda_graphs import DecodeGraphs
from pagedlm.worker.memory import GiB
from pagedlm.worker.piecewise_graphs import PiecewiseGraphs
from pagedlm.worker.sizes import Moves

logger = logging.getLogger("pagedlm")


def log_graphs_captured(
    graphs: DecodeGraphs,
    piecewise: PiecewiseGraphs | None,
    seconds: float,
    graph_bytes: int,
    reserved_bytes: int | None,
) -> None:
    """reserved_bytes: what the trial capture reserved before the KV cache was sized (None: its size
    was given)."""
    pieces = (
        "none"
        if piecewise is None
        else f"{len(piecewise.sizes)} token counts ({piecewise.sizes[0]}..{piecewise.max_size})"
    )
    spec = "" if graphs.spec is None else f", {len(graphs.spec.shapes)} uniform speculative"
    if graphs.draft is not None:
        spec += f", {len(graphs.draft.shapes)} draft"
    logger.info(
        "CUDA graphs: %d pure-decode batch sizes (%d..%d)%s, piecewise %s, captured in %.2f s; "
        "they take %.3f GiB (reserved before sizing the KV cache: %s)",
        len(graphs.sizes),
        graphs.sizes[0],
        graphs.max_size,
        spec,
        pieces,
        seconds,
        graph_bytes / GiB,
        "none, its size was given" if reserved_bytes is None else f"{reserved_bytes / GiB:.3f} GiB",
    )


def log_every_size_kept() -> None:
    logger.info("CUDA graphs: every size kept (--no-graph-size-timing)")


def log_graph_sizes_kept(moved: Moves, moved_piecewise: Moves | None, seconds: float) -> None:
    """moved: the decode sizes the timing dropped; moved_piecewise: the piecewise graphs' (None: none
    captured)."""
    logger.info(
        "CUDA graphs: replays timed in %.2f s; batch sizes that take a larger graph, measured "
        "faster: %s; piecewise token counts: %s",
        seconds,
        _moves(moved),
        "none captured" if moved_piecewise is None else _moves(moved_piecewise),
    )


def log_start_up_compiles(first_event: int) -> None:
    """The Triton compiles since compile_watch event first_event; from now on a compile is logged as
    one while serving."""
    watch = compile_watch()
    events = watch.since(first_event)
    logger.info(
        "Triton: %d kernel specialisations compiled (or loaded from the disk cache) in %.1f s "
        "at start-up",
        len(events),
        sum(e.seconds for e in events),
    )
    watch.serving()


def _moves(moved: Moves) -> str:
    return (
        ", ".join(
            f"{size} -> {to} ({ms:.2f} -> {to_ms:.2f} ms)"
            for size, (to, ms, to_ms) in moved.items()
        )
        or "none"
    )
