import sys, time, json, os
from pagedlm import LLM, SamplingParams
import pagedlm

llm = LLM(skip_tokenizer_init=True, dtype=sys.argv[1] if len(sys.argv) > 1 else "auto")
ids = [{"prompt_token_ids": list(range(100, 132))}]


def gen(n):
    llm.generate(
        ids, SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True), use_tqdm=False
    )


gen(8)


def timed(n):
    t, c = time.perf_counter(), time.process_time()
    gen(n)
    return time.perf_counter() - t, time.process_time() - c


w1, c1 = min(timed(1) for _ in range(2))
w, c = timed(128)
print(
    "RESULT",
    pagedlm.__file__.split("/")[2],
    json.dumps({"tok_s": round(127 / (w - w1), 1), "cpu_ms_tok": round((c - c1) / 127 * 1e3, 2)}),
)
