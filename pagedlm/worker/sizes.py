"""SizePolicy: every row count a step is padded to, in one object, so that they agree.

- The decode CUDA graphs' capture sizes (capture_sizes) and, after the replay timing, the sizes kept
  (keep_fastest_decode; cuda_graphs.py's module notes): a decode step of n sequences replays
  decode_graph_size(n).
- The step buffers' section capacities (step_bucket, step_buffers.py): the kept decode sizes, then
  multiples of LARGE_BUCKET. So a decode step of n sequences is laid out exactly where the graph of
  decode_graph_size(n) reads its inputs.
- The LM head's row counts (lm_head_rows, lm_head.py): every capture size, kept or not (a replay
  where every row samples runs the LM head at its graph size), then multiples of LARGE_BUCKET.
- The piecewise graphs' token counts (piecewise_sizes) and those kept after their timing
  (keep_fastest_piecewise): a step of n tokens replays piecewise_size(n).

Timing only ever drops sizes below the largest, so a buffer sized for step_bucket(max) at start-up
holds every later layout.
"""

from __future__ import annotations

import bisect
from collections.abc import Hashable, Sequence

MAX_CAPTURE_SIZE = 1024  # the default max_num_seqs
MAX_LOGITS_ROWS = (
    8  # decode graphs up to this size compute the logits too (<= 8 x vocab x 4 bytes each)
)
STAGED_MAX_SIZE = MAX_LOGITS_ROWS  # decode graphs up to this size also stage their inputs in
LARGE_BUCKET = 256  # counts above the largest decode graph round up to a multiple of this
MIN_PIECEWISE_SIZE = 16
MAX_PIECEWISE_SIZE = (
    2048  # tokens; a larger step's GPU time hides its eager launches (piecewise_graphs.py)
)
FINE_SIZES_FROM = 128  # tokens; above, SIZES_PER_DOUBLING sizes between two powers of two
SIZES_PER_DOUBLING = 8
# a size gives way to the next kept larger one when that replays in less than (1 - SPEED_MARGIN) of its
# time and at least MIN_SAVING_MS sooner: well above the timing noise (~1%)
SPEED_MARGIN = 0.1
MIN_SAVING_MS = 0.05

Moves = dict[
    int, tuple[int, float, float]
]  # size -> (the size it takes from now on, its ms, that one's ms)


def smallest_at_least(sizes: Sequence[int], n: int) -> int | None:
    """The smallest of the ascending sizes >= n; None when every size is smaller."""
    index = bisect.bisect_left(sizes, n)
    return sizes[index] if index < len(sizes) else None


def bucket_size(sizes: Sequence[int], n: int) -> int:
    """The smallest of the ascending sizes >= n; above the largest, n rounded up to a multiple of
    LARGE_BUCKET."""
    size = smallest_at_least(sizes, n)
    return -(-n // LARGE_BUCKET) * LARGE_BUCKET if size is None else size


def capture_sizes(max_num_seqs: int, max_num_tokens: int) -> list[int]:
    """Ascending: 1, 2, 4, every 8 up to 256, every 16 up to 512, every 32 up to 1,024; those below
    the cap min(max_num_seqs, max_num_tokens, MAX_CAPTURE_SIZE), then the cap itself (51 sizes for a
    cap of 512, 67 for 1,024)."""
    cap = min(max_num_seqs, max_num_tokens, MAX_CAPTURE_SIZE)
    steps = [
        1,
        2,
        4,
        *range(8, 257, 8),
        *range(272, 513, 16),
        *range(544, MAX_CAPTURE_SIZE + 1, 32),
    ]
    return [size for size in steps if size < cap] + [cap]


def piecewise_sizes(max_num_tokens: int) -> list[int]:
    """Powers of two from MIN_PIECEWISE_SIZE to FINE_SIZES_FROM, then SIZES_PER_DOUBLING evenly spaced
    sizes a doubling (a step is padded by at most 1/8), below the cap min(max_num_tokens,
    MAX_PIECEWISE_SIZE); then the cap. Padding costs GPU time in proportion above ~128 rows, where
    a step's GEMMs stop being bound by their weight reads; below, a graph's replay is worth more than
    its padding (benchmarks/prefill_sizes.py; benchmarks/RESULTS.md, "Measured choices")."""
    cap = min(max_num_tokens, MAX_PIECEWISE_SIZE)
    sizes, size = [], MIN_PIECEWISE_SIZE
    while size < cap:
        sizes.append(size)
        size += (
            size if size < FINE_SIZES_FROM else (1 << (size.bit_length() - 1)) // SIZES_PER_DOUBLING
        )
    return sizes + [cap]


def fastest_sizes(times: dict[int, float], kinds: dict[int, Hashable]) -> list[int]:
    """times: size -> ms of a replay; kinds: size -> its attention kernel (triton_backend.decode_kind;
    sizes of one kind lie in one range). The sizes to keep, ascending: a size goes when the next kept
    larger size of its kind beats it by SPEED_MARGIN and MIN_SAVING_MS (the largest of each kind is
    kept)."""
    kept, next_kept = [], {}  # kind -> ms of the smallest size of that kind kept so far
    for size in sorted(times, reverse=True):
        time_ms, above = times[size], next_kept.get(kinds[size])
        if above is None or above >= min((1 - SPEED_MARGIN) * time_ms, time_ms - MIN_SAVING_MS):
            kept.append(size)
            next_kept[kinds[size]] = time_ms
    return kept[::-1]


def moved_sizes(times: dict[int, float], kept: list[int]) -> Moves:
    """times: size -> ms; kept: fastest_sizes(times, ...). Each size not kept -> (the next kept size,
    which its batches take from now on, its ms, that size's ms)."""
    return {
        size: (to, times[size], times[to])
        for size in times
        if size not in kept
        for to in (smallest_at_least(kept, size),)
    }


class SizePolicy:
    """The sizes of one runner (module notes). decode_sizes and piecewise_sizes narrow once, after the
    capture, by the replay timing (the fastest sizes kept); everything else is fixed."""

    def __init__(self, max_num_seqs: int, max_num_tokens: int) -> None:
        self.max_num_tokens = max_num_tokens
        self.capture_sizes = capture_sizes(max_num_seqs, max_num_tokens)  # ascending
        self.max_decode_size = self.capture_sizes[-1]
        self.decode_sizes = list(self.capture_sizes)  # those a decode step replays, ascending
        self.piecewise_sizes = piecewise_sizes(max_num_tokens)  # those a step replays, ascending
        self.max_piecewise_size = self.piecewise_sizes[-1]

    def decode_graph_size(self, num_seqs: int) -> int | None:
        """The decode graph a step of num_seqs sequences (one token each) replays; None above the largest."""
        return smallest_at_least(self.decode_sizes, num_seqs)

    def piecewise_size(self, num_tokens: int) -> int | None:
        """The piecewise graphs' token count a step of num_tokens replays; None above the largest."""
        return smallest_at_least(self.piecewise_sizes, num_tokens)

    def step_bucket(self, n: int) -> int:
        """The section capacity for n tokens or sequences: decode_graph_size(n), above the largest
        graph n rounded up to a multiple of LARGE_BUCKET."""
        return bucket_size(self.decode_sizes, n)

    def lm_head_rows(self, n: int) -> int:
        """The rows the LM head runs for n rows: the smallest capture size >= n (graphs the timing
        dropped included), above the largest a multiple of LARGE_BUCKET."""
        return bucket_size(self.capture_sizes, n)

    def uniform_tokens_bucket(self, graph_seqs: int, query_len: int) -> int:
        """The token capacity of a uniform speculative step (every sequence query_len tokens)
        laid out for graph_seqs = step_bucket(its sequences): graph_seqs x query_len rounded up to
        a capture size (never narrowed by the timing), so the step lies where its graph
        (spec_graphs.py) read at capture; 0 when that exceeds max_num_tokens (no graph takes it)."""
        padded = graph_seqs * query_len
        return 0 if padded > self.max_num_tokens else bucket_size(self.capture_sizes, padded)

    @staticmethod
    def is_staged(size: int) -> bool:
        """Whether decode graphs of this size stage their inputs in (cuda_graphs.py)."""
        return size <= STAGED_MAX_SIZE

    def keep_fastest_decode(self, times: dict[int, float], kinds: dict[int, Hashable]) -> Moves:
        """times: ms of each timed decode size's replay; kinds: its attention kernel. Drops the
        sizes a larger one of their kind beats (fastest_sizes) -> each size dropped: (the size its
        steps take from now on, its ms, that one's ms)."""
        kept = fastest_sizes(times, kinds)
        moves = moved_sizes(times, kept)
        assert all(kinds[to] == kinds[size] for size, (to, _, _) in moves.items()), (
            kinds
        )  # one range a kind
        self.decode_sizes = [size for size in self.decode_sizes if size not in moves]
        return moves

    def keep_fastest_piecewise(self, times: dict[int, float]) -> Moves:
        """times: ms of each token count's pieces (one kind: the attention between them is not timed)
        -> each size dropped, as keep_fastest_decode."""
        moves = moved_sizes(times, fastest_sizes(times, dict.fromkeys(times, 0)))
        self.piecewise_sizes = [size for size in self.piecewise_sizes if size not in moves]
        return moves
