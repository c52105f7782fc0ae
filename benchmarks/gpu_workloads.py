"""The fixed GPU workloads of shared/BENCHMARKS.md, run in one process on the H200.

    python benchmarks/gpu_workloads.py --workloads L2,T0q,T1 [--peer] [--json out.json]
    python benchmarks/gpu_workloads.py --write-model qwen3-0.6b   (a dummy model folder for scripts)

Models are dummy-weight configs of real shapes (written to a temp folder), bf16, prompts as
token ids, ignore_eos, one warm-up before each timed generate call. Prints a table last.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import skewed_mix  # noqa: E402

MODELS = {
    "qwen3-0.6b": {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "hidden_size": 1024,
        "num_hidden_layers": 28,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "intermediate_size": 3072,
        "vocab_size": 151936,
        "tie_word_embeddings": True,
        "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 40960,
        "hidden_act": "silu",
        "torch_dtype": "bfloat16",
    },
    "llama3-8b": {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 4096,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "intermediate_size": 14336,
        "vocab_size": 128256,
        "rope_theta": 500000.0,
        "rms_norm_eps": 1e-5,
        "max_position_embeddings": 8192,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    },
    "llama3-draft-0.3b": {  # a draft for llama3-8b (spec_decode.py draft): its vocabulary, tied
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 1024,
        "num_hidden_layers": 16,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "intermediate_size": 2816,
        "vocab_size": 128256,
        "rope_theta": 500000.0,
        "rms_norm_eps": 1e-5,
        "max_position_embeddings": 8192,
        "hidden_act": "silu",
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
    },
    "mistral-7b": {  # Mistral-7B-v0.1: every layer windowed
        "architectures": ["MistralForCausalLM"],
        "model_type": "mistral",
        "hidden_size": 4096,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "intermediate_size": 14336,
        "vocab_size": 32000,
        "rope_theta": 10000.0,
        "rms_norm_eps": 1e-5,
        "max_position_embeddings": 32768,
        "sliding_window": 4096,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    },
}
VLLM = {
    "L1": 201.4,
    "L2": 528,
    "T0-llama3-8b": 6707,
    "T0-qwen3-0.6b": 21114,
    "T1": 21406,
    "T2": 8518,
    "T3-on": 7684,
    "T3-off": 1914,
}
TOP_P = {"T4": skewed_mix.TOP_P}  # workloads sampled with a top_p below 1
BANDWIDTH = 4.23e12  # bytes/s, measured device copy bandwidth
PEAK_FLOPS = 797e12  # bf16 GEMM


def model_dir(name: str, root: Path) -> str:
    folder = root / name
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps(MODELS[name]))
    return str(folder)


def random_prompts(rng: random.Random, num: int, length: int) -> list[list[int]]:
    return [[rng.randrange(100, 30000) for _ in range(length)] for _ in range(num)]


def workload(wid: str) -> tuple[str, list[list[int]], list[int], float, dict]:
    """-> (model, prompts, max_tokens per prompt, temperature, engine overrides)"""
    rng = random.Random(0)
    if wid in ("L1", "L2"):
        model = "llama3-8b" if wid == "L1" else "qwen3-0.6b"
        return model, random_prompts(rng, 1, 128), [512], 0.0, {}
    if wid.startswith("T0"):
        model = "llama3-8b" if wid == "T0-llama3-8b" else "qwen3-0.6b"
        return model, random_prompts(rng, 256, 512), [128] * 256, 0.0, {}
    if wid == "T1":  # nano-vllm's bench.py
        random.seed(0)
        prompts = [
            [random.randint(0, 10000) for _ in range(random.randint(100, 1024))] for _ in range(256)
        ]
        max_tokens = [random.randint(100, 1024) for _ in range(256)]
        return "qwen3-0.6b", prompts, max_tokens, 0.6, {}
    if wid == "T2":
        return "llama3-8b", random_prompts(rng, 1000, 1000), [1000] * 1000, 0.0, {}
    if wid.startswith("T3"):
        prefixes = random_prompts(rng, 16, 2048)
        prompts = [p + s for p in prefixes for s in random_prompts(rng, 32, 128)]
        rng.shuffle(prompts)
        return (
            "llama3-8b",
            prompts,
            [128] * len(prompts),
            0.0,
            {"enable_prefix_caching": wid == "T3-on"},
        )
    if wid == "T4":  # a skewed mix: see benchmarks/skewed_mix.py
        prompts, max_tokens = skewed_mix.skewed_mix()
        return "llama3-8b", prompts, max_tokens, skewed_mix.TEMPERATURE, {}
    if wid == "S1":  # long prompts on a sliding-window model: up to two windows each
        prompts = [random_prompts(rng, 1, rng.randint(1000, 8000))[0] for _ in range(256)]
        max_tokens = [rng.randint(128, 512) for _ in range(256)]
        return "mistral-7b", prompts, max_tokens, 0.0, {"max_model_len": 8704}
    raise ValueError(f"unknown workload {wid}")


def run_pagedlm(
    llm, prompts, max_tokens, temperature, repeats: int, top_p: float = 1.0
) -> tuple[list[float], list[dict]]:
    """-> (seconds of each timed call, what each call paid besides the work: Triton compiles and
    cudaMalloc calls of the caching allocator)."""
    import torch

    from pagedlm import SamplingParams
    from pagedlm.ops.jit_watch import compile_watch

    params = [
        SamplingParams(temperature=temperature, top_p=top_p, max_tokens=m, ignore_eos=True, seed=i)
        for i, m in enumerate(max_tokens)
    ]
    inputs = [{"prompt_token_ids": p} for p in prompts]
    llm.generate(inputs[:8], params[:8], use_tqdm=False)  # warm-up
    times, costs = [], []
    for _ in range(repeats):
        first_compile = len(compile_watch().events)
        stats = torch.cuda.memory_stats()
        start = time.perf_counter()
        outs = llm.generate(inputs, params, use_tqdm=False)
        times.append(time.perf_counter() - start)
        after = torch.cuda.memory_stats()
        compiles = compile_watch().since(first_compile)
        costs.append(
            {
                "compiles": len(compiles),
                "compile_s": round(sum(e.seconds for e in compiles), 3),
                "compiled": sorted({e.kernel for e in compiles}),
                "cuda_mallocs": after["num_device_alloc"] - stats["num_device_alloc"],
                "alloc_retries": after["num_alloc_retries"] - stats["num_alloc_retries"],
            }
        )
        assert sum(len(o.outputs[0].token_ids) for o in outs) == sum(max_tokens)
    return times, costs


def run_transformers_t0(
    path: str, prompts: list[list[int]], output_len: int, batch: int = 64
) -> float:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(path)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).eval()
    ids = torch.tensor(prompts, device="cuda")
    kwargs = dict(max_new_tokens=output_len, min_new_tokens=output_len, do_sample=False)
    model.generate(ids[:batch], attention_mask=torch.ones_like(ids[:batch]), **kwargs)  # warm-up
    torch.cuda.synchronize()
    start = time.perf_counter()
    for i in range(0, len(prompts), batch):
        chunk = ids[i : i + batch]
        model.generate(chunk, attention_mask=torch.ones_like(chunk), **kwargs)
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    del model
    torch.cuda.empty_cache()
    return len(prompts) * output_len / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--workloads", default="L2,T0-qwen3-0.6b,T1,L1,T0-llama3-8b,T3-on,T3-off,T2"
    )
    parser.add_argument(
        "--peer", action="store_true", help="also time transformers' generate on T0"
    )
    parser.add_argument("--json", default=None)
    parser.add_argument("--engine-args", default="{}", help="JSON dict of extra LLM(...) arguments")
    parser.add_argument(
        "--write-model",
        choices=sorted(MODELS),
        default=None,
        help="only write that shape's config.json to a new temp folder, print it",
    )
    args = parser.parse_args()
    if args.write_model:
        print(model_dir(args.write_model, Path(tempfile.mkdtemp())))
        return
    import torch

    from pagedlm import LLM

    extra = json.loads(args.engine_args)
    root = Path(tempfile.mkdtemp())
    rows, llms = [], {}
    for wid in args.workloads.split(","):
        model, prompts, max_tokens, temperature, overrides = workload(wid)
        key = (model, json.dumps(overrides, sort_keys=True))
        if key not in llms:
            llms.clear()
            torch.cuda.empty_cache()
            llms[key] = LLM(
                model_dir(model, root),
                load_format="dummy",
                dtype="bfloat16",
                skip_tokenizer_init=True,
                **overrides,
                **extra,
            )
        repeats = 3 if wid in ("L1", "L2") else 1
        times, costs = run_pagedlm(
            llms[key], prompts, max_tokens, temperature, repeats, TOP_P.get(wid, 1.0)
        )
        elapsed = statistics.median(times)
        out_tps = sum(max_tokens) / elapsed
        total_tps = (sum(map(len, prompts)) + sum(max_tokens)) / elapsed
        row = {
            "id": wid,
            "model": model,
            "seconds": elapsed,
            "output_tok_s": out_tps,
            "total_tok_s": total_tps,
            "vllm": VLLM.get(wid),
            "all_times": times,
            "costs": costs,
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    llms.clear()
    torch.cuda.empty_cache()
    if args.peer:
        for model in ("qwen3-0.6b", "llama3-8b"):
            _, prompts, _, _, _ = workload("T0-" + model)
            tps = run_transformers_t0(model_dir(model, root), prompts, 128)
            rows.append({"id": f"T0-{model} transformers", "model": model, "output_tok_s": tps})
            print(json.dumps(rows[-1]), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    print(f"\n{'workload':28} {'out tok/s':>10} {'vLLM':>8} {'ratio':>6}")
    for row in rows:
        vllm = row.get("vllm")
        ratio = f"{row['output_tok_s'] / vllm:.2f}" if vllm else ""
        print(f"{row['id']:28} {row['output_tok_s']:10.1f} {vllm or '':>8} {ratio:>6}")


if __name__ == "__main__":
    main()
