"""Host cost a step of the n-gram proposer (pagedlm/spec_decode/ngram.py) at batch 1/64/256 and
context 1k/8k: rows of random ids of SmolLM2's vocabulary with a repeated passage (so matches
exist), k = 4, n in [2, 5]. Least of 5 runs. Usage: python benchmarks/probes/ngram_proposer_cost.py"""

from __future__ import annotations

import time

import numpy as np

from pagedlm.spec_decode.ngram import propose_ngram

VOCAB = 49152


def rows_with_repeats(batch: int, context: int, rng: np.random.Generator) -> np.ndarray:
    table = rng.integers(0, VOCAB, (batch, context), dtype=np.int32)
    passage = context // 8
    table[:, context - passage :] = table[:, passage : 2 * passage]  # the tail copies a passage
    return table


def main() -> None:
    rng = np.random.default_rng(0)
    print("| batch | context | ms a step | us a request |")
    print("|---:|---:|---:|---:|")
    for context in (1024, 8192):
        for batch in (1, 64, 256):
            table = rows_with_repeats(batch, context, rng)
            lengths = np.full(batch, context, dtype=np.int64)
            rows = np.arange(batch)
            best = float("inf")
            for _ in range(5):
                start = time.perf_counter()
                propose_ngram(table, lengths, rows, k=4, min_n=2, max_n=5)
                best = min(best, time.perf_counter() - start)
            print(f"| {batch} | {context} | {best * 1e3:.2f} | {best * 1e6 / batch:.1f} |")


if __name__ == "__main__":
    main()
