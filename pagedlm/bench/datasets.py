"""Synthetic benchmark datasets: prompts as token ids, each with the output length to ask for."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import numpy as np

DATASETS = ("random", "prefix-repetition")
WARMUP_INPUT_LEN = 16
WARMUP_OUTPUT_LEN = 8
_WARMUP_SEED = 12345


@dataclass(frozen=True)
class BenchRequest:
    prompt_token_ids: list[int]
    output_len: int


def add_dataset_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("dataset")
    group.add_argument("--dataset", choices=DATASETS, default="random", help="(default: random)")
    group.add_argument("--num-prompts", type=int, default=100, help="(default: 100)")
    group.add_argument(
        "--input-len", type=int, default=512, help="random: prompt tokens (default: 512)"
    )
    group.add_argument("--output-len", type=int, default=128, help="output tokens (default: 128)")
    group.add_argument(
        "--range-ratio",
        type=float,
        default=0.0,
        help="random: lengths uniform in [len*(1-r), len*(1+r)] (default: 0)",
    )
    group.add_argument(
        "--prefix-len",
        type=int,
        default=256,
        help="prefix-repetition: shared prefix tokens (default: 256)",
    )
    group.add_argument(
        "--suffix-len",
        type=int,
        default=256,
        help="prefix-repetition: distinct suffix tokens (default: 256)",
    )
    group.add_argument(
        "--num-prefixes",
        type=int,
        default=10,
        help="prefix-repetition: distinct prefixes (default: 10)",
    )
    group.add_argument("--dataset-seed", type=int, default=0, help="(default: 0)")


def sample_requests(args: argparse.Namespace, vocab_size: int) -> list[BenchRequest]:
    rng = np.random.default_rng(args.dataset_seed)
    if args.dataset == "random":
        return random_requests(
            rng, vocab_size, args.num_prompts, args.input_len, args.output_len, args.range_ratio
        )
    return prefix_repetition_requests(
        rng,
        vocab_size,
        args.num_prompts,
        args.prefix_len,
        args.suffix_len,
        args.num_prefixes,
        args.output_len,
    )


def warmup_request(vocab_size: int) -> BenchRequest:
    """The one short request both benchmarks send before timing. It is not drawn from the
    dataset: a dataset prompt sent first would sit in the prefix cache when the timed run
    sends it again, and skip its prefill."""
    rng = np.random.default_rng(_WARMUP_SEED)
    (request,) = random_requests(rng, vocab_size, 1, WARMUP_INPUT_LEN, WARMUP_OUTPUT_LEN, 0.0)
    return request


def random_requests(
    rng: np.random.Generator,
    vocab_size: int,
    num_prompts: int,
    input_len: int,
    output_len: int,
    range_ratio: float,
) -> list[BenchRequest]:
    """Token ids uniform in [0, vocab_size); lengths uniform in [len·(1−r), len·(1+r)]."""
    _check_positive(num_prompts=num_prompts, input_len=input_len, output_len=output_len)
    if not 0.0 <= range_ratio < 1.0:
        raise ValueError(f"range_ratio must be in [0, 1), got {range_ratio}")
    input_lens = _uniform_lengths(rng, input_len, range_ratio, num_prompts)
    output_lens = _uniform_lengths(rng, output_len, range_ratio, num_prompts)
    return [
        BenchRequest(_random_ids(rng, vocab_size, int(n_in)), int(n_out))
        for n_in, n_out in zip(input_lens, output_lens)
    ]


def prefix_repetition_requests(
    rng: np.random.Generator,
    vocab_size: int,
    num_prompts: int,
    prefix_len: int,
    suffix_len: int,
    num_prefixes: int,
    output_len: int,
) -> list[BenchRequest]:
    """num_prefixes shared prefixes, each followed by distinct random suffixes; shuffled."""
    _check_positive(
        num_prompts=num_prompts,
        prefix_len=prefix_len,
        num_prefixes=num_prefixes,
        output_len=output_len,
    )
    if suffix_len < 0:
        raise ValueError(f"suffix_len must be non-negative, got {suffix_len}")
    prefixes = [_random_ids(rng, vocab_size, prefix_len) for _ in range(num_prefixes)]
    requests = [
        BenchRequest(
            prefixes[i % num_prefixes] + _random_ids(rng, vocab_size, suffix_len), output_len
        )
        for i in range(num_prompts)
    ]
    order = rng.permutation(num_prompts)
    return [requests[i] for i in order]


def _uniform_lengths(
    rng: np.random.Generator, length: int, range_ratio: float, num: int
) -> np.ndarray:
    low = max(1, int(length * (1 - range_ratio)))
    high = max(low, int(length * (1 + range_ratio)))
    return rng.integers(low, high + 1, size=num)


def _random_ids(rng: np.random.Generator, vocab_size: int, num_tokens: int) -> list[int]:
    return rng.integers(0, vocab_size, size=num_tokens).tolist()


def _check_positive(**values: int) -> None:
    for name, value in values.items():
        if value < 1:
            raise ValueError(f"{name} must be positive, got {value}")
