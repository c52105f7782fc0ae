"""Offline n-gram acceptance on the default model (SmolLM2-135M, CPU, greedy): greedy speculative
decoding emits exactly plain greedy's tokens, so replaying the proposer (spec_decode/ngram.py)
over a plain greedy run gives the acceptance a wired engine would see, step by step: at each
step the drafts from the tokens known, accepted while they equal the next tokens, then one
token more. Workloads: a code passage then the start of a copy, the same with a rename, a story. The
135M model (Q4_1) copies poorly: greedy, its outputs fall into loops, which the n-gram drafts.
Usage: python benchmarks/probes/ngram_acceptance_offline.py [max_tokens]"""

from __future__ import annotations

import sys

import numpy as np

from pagedlm import LLM, SamplingParams
from pagedlm.spec_decode.ngram import propose_ngram

CODE = """def merge(left, right):
    out = []
    i = j = 0
    while i < len(left) and j < len(right):
        if left[i] <= right[j]:
            out.append(left[i])
            i += 1
        else:
            out.append(right[j])
            j += 1
    return out + left[i:] + right[j:]
"""
HEAD = "def merge(left, right):\n    out = []\n"
WORKLOADS = {  # raw prompts: the 135M model copies when primed, not when asked to in a chat
    "code, copy primed": f"{CODE}\n\n# The same function, copied into utils.py:\n{HEAD}",
    "code, rename primed": f"{CODE}\n\n# The same function with `left` renamed to `first`:\n"
    "def merge(first, right):\n",
    "story": "Once upon a time, a lighthouse keeper",
}


def replay(tokens: list[int], start: int, k: int, min_n: int, max_n: int) -> tuple[int, int, int]:
    """(steps, spec steps, accepted drafts) to produce tokens[start:] one verified step at a time."""
    table = np.array([tokens], dtype=np.int64)
    position, steps, spec_steps, accepted = start, 0, 0, 0
    while position < len(tokens):
        drafts = propose_ngram(table, np.array([position]), np.array([0]), k, min_n, max_n)
        num = int(drafts.num_drafts[0])
        target = tokens[position : position + num]
        run = 0
        while run < min(num, len(target)) and drafts.token_ids[0, run] == target[run]:
            run += 1
        steps += 1
        spec_steps += num > 0
        accepted += run
        position += run + 1
    return steps, spec_steps, accepted


def main() -> None:
    max_tokens = int(sys.argv[1]) if len(sys.argv) > 1 else 160
    llm = LLM(dtype="float32")
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    outputs = llm.generate(list(WORKLOADS.values()), params)
    print("| workload | k | n | tokens | steps | mean acceptance length | tokens a step |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, output in zip(WORKLOADS, outputs, strict=True):
        tokens = list(output.prompt_token_ids) + list(output.outputs[0].token_ids)
        start = len(output.prompt_token_ids) + 1  # the first output comes from the prefill
        for k in (2, 4, 6):
            for min_n, max_n in ((2, 5),):
                steps, spec_steps, accepted = replay(tokens, start, k, min_n, max_n)
                produced = len(tokens) - start
                mean_length = 1 + accepted / spec_steps if spec_steps else 1.0
                print(
                    f"| {name} | {k} | {min_n}-{max_n} | {produced} | {steps} | "
                    f"{mean_length:.2f} | {produced / steps:.2f} |"
                )


if __name__ == "__main__":
    main()
