"""Which KV blocks a sliding-window request still needs (every layer windowed, window W).

A query at position p sees the keys p - W + 1 .. p. A step computes a request's tokens from
position p = num_computed_tokens on, so none of its queries sees a key below p - W + 1: the
blocks wholly below it are skipped, and they stay skipped as p only grows. Counts are in blocks
of block_size tokens from the request's first token; window None means full attention (nothing
is ever skipped).
"""

from __future__ import annotations

from collections.abc import Iterable


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def num_skipped_blocks(first_query_pos: int, window: int | None, block_size: int) -> int:
    """Leading blocks no query at or after first_query_pos reads."""
    if window is None:
        return 0
    return max(first_query_pos - window + 1, 0) // block_size


def num_held_blocks(num_tokens: int, window: int | None, block_size: int) -> int:
    """Blocks a decoding request with num_tokens tokens in the cache holds: at most
    cdiv(W - 1, block_size) + 1 with a window (its last query is at num_tokens - 1)."""
    num_blocks = cdiv(num_tokens, block_size)
    return num_blocks - num_skipped_blocks(max(num_tokens - 1, 0), window, block_size)


def num_window_blocks(window: int, block_size: int) -> int:
    """The blocks before a query's own that its window may reach: a prefix hit of k blocks is
    usable iff its last min(k, this) blocks are cached (vLLM's rule)."""
    return cdiv(window - 1, block_size)


def uniform_window(layer_windows: Iterable[int | None]) -> int | None:
    """The window by which blocks are freed: every layer's, if all have the same one. A model
    mixing full and sliding layers keeps every block (each full layer reads them all)."""
    windows = set(layer_windows)
    return windows.pop() if len(windows) == 1 else None
