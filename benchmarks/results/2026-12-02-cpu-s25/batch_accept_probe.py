"""Does xgrammar's BatchGrammarMatcher.batch_accept_token beat one accept_token call a request?

256 matchers of structured_outputs_cost.py's constraint (a JSON string of at least 100,000
characters), built through pagedlm's own compiler; each step every matcher takes one token (all
checked accepted), then is_terminated(), as the scheduler's _append_tokens does.

    .venv/bin/python benchmarks/results/2026-12-02-cpu-s25/batch_accept_probe.py
"""

import random
import time

import xgrammar as xgr

from pagedlm import LLM
from pagedlm.sampling_params import StructuredOutputsParams
from pagedlm.structured_outputs.grammars import build_grammar
from pagedlm.structured_outputs.manager import _new_compiler

BATCH, STEPS, REPEATS = 256, 20, 3
WORDS = ["hello", " world", "abc", " the", "x"]


def main() -> None:
    llm = LLM(device="cpu", seed=0)
    tokenizer = llm.get_tokenizer()
    compiler, _ = _new_compiler(llm.llm_engine.model_config, tokenizer)
    params = StructuredOutputsParams(
        json={"type": "string", "minLength": 100_000}, disable_any_whitespace=True
    )
    grammar = compiler.compile_grammar(build_grammar(params))
    opening = tokenizer.encode('"', add_special_tokens=False)
    words = [tokenizer.encode(w, add_special_tokens=False)[0] for w in WORDS]

    def opened() -> list[xgr.GrammarMatcher]:
        matchers = [xgr.GrammarMatcher(grammar) for _ in range(BATCH)]
        for matcher in matchers:
            assert all(matcher.accept_token(t) for t in opening), "the opening quote refused"
        return matchers

    rng = random.Random(0)
    for _ in range(REPEATS):
        tokens = [rng.choice(words) for _ in range(BATCH)]
        matchers = opened()
        start = time.perf_counter()
        for _ in range(STEPS):
            accepted = [m.accept_token(t) for m, t in zip(matchers, tokens)]
            assert all(accepted) and not any(m.is_terminated() for m in matchers)
        per_token = (time.perf_counter() - start) / STEPS
        matchers = opened()
        start = time.perf_counter()
        for _ in range(STEPS):
            accepted = xgr.BatchGrammarMatcher.batch_accept_token(matchers, tokens)
            assert all(accepted) and not any(m.is_terminated() for m in matchers)
        batched = (time.perf_counter() - start) / STEPS
        print(f"per-token {per_token * 1e3:.3f} ms  batched {batched * 1e3:.3f} ms a step")


if __name__ == "__main__":
    main()
