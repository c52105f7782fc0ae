import sys, time, json, random
from pagedlm import LLM, SamplingParams
import pagedlm

llm = LLM(skip_tokenizer_init=True)
rng = random.Random(3)
many = [{"prompt_token_ids": [rng.randrange(100, 49152) for _ in range(128)]} for _ in range(16)]
p = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True)
p1 = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
llm.generate(many[:2], p, use_tqdm=False)
out = {}
for name, params, batch in (("prefill16", p1, many), ("b16", p, many)):
    llm.reset_prefix_cache() if hasattr(llm, "reset_prefix_cache") else None
    t, c = time.perf_counter(), time.process_time()
    llm.generate(batch, params, use_tqdm=False)
    out[name + "_wall"] = round(time.perf_counter() - t, 3)
    out[name + "_cpu"] = round(time.process_time() - c, 3)
print("RESULT", pagedlm.__file__.split("/")[2], json.dumps(out))
