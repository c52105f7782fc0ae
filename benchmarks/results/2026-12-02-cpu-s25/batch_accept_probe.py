import time, random, xgrammar as xgr
from pagedlm import LLM
llm = LLM(device="cpu", seed=0)
tok = llm.get_tokenizer() if hasattr(llm, "get_tokenizer") else llm.llm_engine.tokenizer
tok = getattr(tok, "tokenizer", tok)
info = xgr.TokenizerInfo.from_huggingface(tok)
comp = xgr.GrammarCompiler(info)
g = comp.compile_json_schema('{"type":"object","properties":{"a":{"type":"string","minLength":100000}},"required":["a"]}', any_whitespace=False)
B = 256
prefix = tok.encode('{"a": "', add_special_tokens=False)
prefix = [t for t in tok.encode('{"a":"', add_special_tokens=False)]
word_ids = [tok.encode(w, add_special_tokens=False)[0] for w in ["hello", " world", "abc", " the", "x"]]
def fresh():
    ms = [xgr.GrammarMatcher(g) for _ in range(B)]
    for m in ms:
        m.accept_string('{"a":"')
    return ms
rng = random.Random(0)
for rep in range(3):
    ms = fresh(); toks=[rng.choice(word_ids) for _ in range(B)]
    s=time.perf_counter()
    for _ in range(20):
        for m,t in zip(ms,toks): m.accept_token(t); m.is_terminated()
    a=(time.perf_counter()-s)/20
    ms = fresh()
    s=time.perf_counter()
    for _ in range(20):
        r = xgr.BatchGrammarMatcher.batch_accept_token(ms, toks); [m.is_terminated() for m in ms]
    b=(time.perf_counter()-s)/20
    print(f"per-token {a*1e3:.3f} ms  batch {b*1e3:.3f} ms  (B={B})", all(r))
