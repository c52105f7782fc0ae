"""Host cost of structured outputs' two per-token parts on the CPU, without a model: a matcher's
accept_token and the batch bitmask fill, in the JSON string of structured_outputs_cost.py, with
SmolLM2's tokenizer inside a model vocabulary of 49,152 (its own) or 151,936 (qwen3-0.6b's shape),
the grammar's vocabulary either the model's (the padding named to xgrammar as special tokens, as
before s21) or the tokenizer's (manager._new_compiler now).

    PYTHONPATH=$PWD .venv/bin/python benchmarks/probes/so_fill_probe.py [--rows 256] [--threads 2]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np  # noqa: E402
import xgrammar as xgr  # noqa: E402

from pagedlm.config import EngineArgs  # noqa: E402
from pagedlm.engine.tokenizer import load_tokenizer  # noqa: E402
from pagedlm.sampling_params import StructuredOutputsParams  # noqa: E402
from pagedlm.structured_outputs.grammars import build_grammar  # noqa: E402

CONSTRAINT = StructuredOutputsParams(
    json={"type": "string", "minLength": 100_000}, disable_any_whitespace=True
)


def compiled(tokenizer, vocab_size: int, eos: list[int]) -> xgr.CompiledGrammar:  # noqa: ANN001
    info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size, stop_token_ids=eos)
    return xgr.GrammarCompiler(info).compile_grammar(build_grammar(CONSTRAINT))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    config = EngineArgs(device="cpu").create_engine_config().model
    tokenizer = load_tokenizer(config)
    num_ids = max(tokenizer.get_vocab().values()) + 1
    eos = sorted(config.eos_token_ids)
    text_ids = tokenizer.encode('"hello world, this is a test', add_special_tokens=False)
    print(f"{'model vocab':>11} {'grammar vocab':>13} {'accept us/token':>15} {'fill ms':>8}")
    for model_vocab in (num_ids, 151_936):
        for grammar_vocab in sorted({model_vocab, num_ids}, reverse=True):
            grammar = compiled(tokenizer, grammar_vocab, eos)
            matchers = [xgr.GrammarMatcher(grammar) for _ in range(args.rows)]
            start = time.perf_counter()
            for matcher in matchers:
                for token_id in text_ids:
                    assert matcher.accept_token(token_id)
            accept_us = 1e6 * (time.perf_counter() - start) / (args.rows * len(text_ids))
            bitmask = np.zeros((args.rows, (grammar_vocab + 31) // 32), dtype=np.int32)
            filler = xgr.BatchGrammarMatcher(max_threads=args.threads)
            times = []
            for _ in range(6):
                start = time.perf_counter()
                filler.batch_fill_next_token_bitmask(matchers, bitmask)
                times.append(time.perf_counter() - start)
            print(
                f"{model_vocab:11d} {grammar_vocab:13d} {accept_us:15.1f} {1e3 * min(times):8.2f}"
            )


if __name__ == "__main__":
    main()
