"""Host cost a step of the n-gram proposer (pagedlm/spec_decode/ngram.py) at batch 1/64/256 and
context 1k/8k: rows of random ids of SmolLM2's vocabulary with a repeated passage (so matches
exist), k = 4, n in [2, 5]. Least of 5 runs; beside it the fixed-shape torch version
(ngram_device.py) on this CPU, for reference (on a GPU it is a few elementwise passes).
Usage: python benchmarks/probes/ngram_proposer_cost.py"""

from __future__ import annotations

import time

import numpy as np
import torch

from pagedlm.spec_decode.ngram import propose_ngram
from pagedlm.spec_decode.ngram_device import propose_ngram_device

VOCAB = 49152


def rows_with_repeats(batch: int, context: int, rng: np.random.Generator) -> np.ndarray:
    table = rng.integers(0, VOCAB, (batch, context), dtype=np.int32)
    passage = context // 8
    table[:, context - passage :] = table[:, passage : 2 * passage]  # the tail copies a passage
    return table


def least_of(runs: int, fn) -> float:
    best = float("inf")
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    rng = np.random.default_rng(0)
    print("| batch | context | host numpy ms a step | us a request | torch on CPU ms |")
    print("|---:|---:|---:|---:|---:|")
    for context in (1024, 8192):
        for batch in (1, 64, 256):
            table = rows_with_repeats(batch, context, rng)
            lengths = np.full(batch, context, dtype=np.int64)
            rows = np.arange(batch)
            host = least_of(5, lambda: propose_ngram(table, lengths, rows, 4, 2, 5))
            table_t, lengths_t = torch.from_numpy(table), torch.from_numpy(lengths)
            device = least_of(3, lambda: propose_ngram_device(table_t, lengths_t, 4, 2, 5))
            print(
                f"| {batch} | {context} | {host * 1e3:.2f} | {host * 1e6 / batch:.1f} "
                f"| {device * 1e3:.1f} |"
            )


if __name__ == "__main__":
    main()
