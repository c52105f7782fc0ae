"""Decode speed of a model of sliding and full layers (KV cache groups) with CUDA graphs and eagerly.

    python3 benchmarks/hybrid_decode.py [--batches 1,64] [--input-len 1024] [--output-len 256]
        [--json out.json]

A Qwen2.5-7B shape (dummy bf16 weights) whose layers are three sliding (window 512) to one full,
as Gemma-style hybrids: four KV cache groups. Each engine runs in a process of its own: CUDA
graphs (the default) and enforce_eager; per batch size the least seconds of two greedy generates
after a warm-up, as output tokens per second. Prompts are longer than the window, so the sliding
layers attend within it through tables whose first blocks were freed.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from tp_executor_cost import least_generate_seconds  # noqa: E402

NUM_LAYERS = 28
SHAPE = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_size": 3584,
    "num_hidden_layers": NUM_LAYERS,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "intermediate_size": 18944,
    "vocab_size": 152064,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
    "max_position_embeddings": 32768,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "use_sliding_window": True,
    "sliding_window": 512,
    "max_window_layers": 0,
    "layer_types": [
        "full_attention" if i % 4 == 3 else "sliding_attention" for i in range(NUM_LAYERS)
    ],
}


def measure(args: argparse.Namespace, eager: bool) -> list[dict]:
    from pagedlm import LLM

    folder = Path(tempfile.mkdtemp())
    (folder / "config.json").write_text(json.dumps(SHAPE))
    llm = LLM(
        str(folder),
        load_format="dummy",
        dtype="bfloat16",
        skip_tokenizer_init=True,
        enforce_eager=eager,
        max_model_len=args.input_len + args.output_len + 16,
    )
    groups = len(llm.llm_engine.engine_core.model_runner.kv_groups)
    rng = random.Random(0)
    rows = []
    for batch in args.batches:
        best = least_generate_seconds(llm, rng, batch, args.input_len, args.output_len, 2)
        tok_s = batch * args.output_len / best
        rows.append({"eager": eager, "kv_groups": groups, "batch": batch, "tok_s": round(tok_s, 1)})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="1,64", type=lambda s: [int(b) for b in s.split(",")])
    parser.add_argument("--input-len", type=int, default=1024)
    parser.add_argument("--output-len", type=int, default=256)
    parser.add_argument("--eager", help=argparse.SUPPRESS)  # the child's mode: "0" or "1"
    parser.add_argument("--json")
    args = parser.parse_args()
    if args.eager is not None:
        print(json.dumps(measure(args, args.eager == "1")), flush=True)
        return
    rows = []
    for eager in ("0", "1"):
        child = [sys.executable, __file__, *sys.argv[1:], "--eager", eager]
        out = subprocess.run(child, check=True, stdout=subprocess.PIPE, text=True).stdout
        rows += json.loads(out.strip().splitlines()[-1])
    print(f"{'batch':>5} {'graphs tok/s':>12} {'eager tok/s':>11} {'ratio':>6}")
    for batch in args.batches:
        graphed, eager = (
            next(r["tok_s"] for r in rows if r["batch"] == batch and r["eager"] == e)
            for e in (False, True)
        )
        print(f"{batch:5d} {graphed:12.1f} {eager:11.1f} {graphed / eager:6.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
