"""GPU: the first token's time against the prompt's length, across the piecewise graphs' sizes.

    python benchmarks/prefill_sizes.py [--model llama3-8b] [--lengths 256,512,513,1024,1025,1100,1536,2048,2049]
        [--repeats 5] [--engine-args '{"cudagraph_mode": "FULL_DECODE_ONLY"}'] [--json out.json]
        [--profile-lengths 256,2049 --profile-dir $OUT/prefill_profiles]

A step that replays no decode graph and holds at most 2,048 tokens replays the piecewise graphs of
the next size (piecewise_graphs.py): with sizes at powers of two (until session 17) a 1,100-token
prompt ran its GEMMs at 2,048 rows (llama3-8b: 45.4 ms against 24.9 eagerly; now ~1/8 padding at
most, 26.8 ms, results/2026-11-30/NOTES.md, session 17). The benchmarks' mixed steps are 16,384 tokens and run eagerly, so none of them measures this; a server
taking one prompt at a time meets it in every prompt's time to first token. This times
generate(max_tokens=1) of one prompt of each length (median of --repeats, after a warm-up; prefix
caching off, as the prompt repeats), with the engine as configured: run it once as is and once with
cudagraph_mode FULL_DECODE_ONLY (every such step eager) to see what the padding costs against the
launches it saves. Printed: ms, and µs a prompt token. With --profile-lengths, one more
generate(max_tokens=1) of each of those lengths under torch.profiler (wall, GPU busy, and the
kernels that took the most GPU time) and one under cProfile, written to --profile-dir: which of the
host and the GPU a length's time waits on.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from first_token import gpu_busy_ms, host_profile, timed  # noqa: E402
from gpu_workloads import MODELS, model_dir  # noqa: E402
from step_timeline import gpu_activities  # noqa: E402

from pagedlm import LLM  # noqa: E402


def prompt_of(n: int, vocab: int) -> list[int]:
    return [(31 * i + 7) % vocab for i in range(n)]


def profile(
    llm: LLM, prompt: list[int], stem: Path
) -> tuple[float, float, float, list[tuple[str, float]]]:
    """(wall ms, GPU busy ms, GPU span ms, the 6 kernels by GPU ms) of generate(prompt, max_tokens=1);
    its chrome trace and a cProfile of another such call are written next to stem."""
    trace = stem.parent / f"{stem.name}.trace.json"  # not with_suffix: "qwen3-0.6b_256" has a dot
    wall, busy, span = gpu_busy_ms(llm, prompt, trace)
    host_profile(llm, prompt, stem.parent / f"{stem.name}.host.txt")
    by_name: dict[str, float] = {}
    for start, end, name in gpu_activities(trace):
        by_name[name[:40]] = by_name.get(name[:40], 0.0) + (end - start) / 1e3
    return wall, busy, span, sorted(by_name.items(), key=lambda item: -item[1])[:6]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="llama3-8b", choices=sorted(MODELS))
    parser.add_argument("--lengths", default="256,512,513,1024,1025,1100,1536,2048,2049")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--engine-args", default="{}", help="JSON dict of extra LLM(...) arguments")
    parser.add_argument("--json", default=None)
    parser.add_argument(
        "--profile-lengths", default="", help="comma-separated prompt lengths to profile"
    )
    parser.add_argument("--profile-dir", default=None, help="where the traces and host profiles go")
    args = parser.parse_args()
    lengths = [int(v) for v in args.lengths.split(",")]
    profile_lengths = [int(v) for v in args.profile_lengths.split(",") if v]
    if profile_lengths and not torch.cuda.is_available():
        parser.error("--profile-lengths profiles the GPU: CUDA is not available")
    engine_args = json.loads(args.engine_args)
    vocab = MODELS[args.model]["vocab_size"]
    with tempfile.TemporaryDirectory() as tmp:
        llm = LLM(
            model_dir(args.model, Path(tmp)),
            load_format="dummy",
            dtype="bfloat16",
            skip_tokenizer_init=True,
            max_model_len=max(lengths) + 16,
            **{"enable_prefix_caching": False, **engine_args},
        )
        timed(llm, [7] * max(lengths), 1, 2)  # warm-up
        seconds = {n: timed(llm, prompt_of(n, vocab), 1, args.repeats) for n in lengths}
        out_dir = Path(args.profile_dir or tmp)
        out_dir.mkdir(parents=True, exist_ok=True)
        profiles = {
            n: profile(llm, prompt_of(n, vocab), out_dir / f"{args.model}_{n}")
            for n in profile_lengths
        }
    print(f"{args.model} {args.engine_args}: generate(max_tokens=1), median of {args.repeats}")
    print(f"{'prompt':>7} {'ms':>9} {'µs/token':>9}")
    for n, s in seconds.items():
        print(f"{n:>7} {s * 1e3:9.3f} {s * 1e6 / n:9.2f}")
    for n, (wall, busy, span, kernels) in profiles.items():
        print(
            f"{n}-token prompt under torch.profiler: wall {wall:.3f} ms, GPU busy {busy:.3f} ms over {span:.3f} ms; "
            f"GPU ms by kernel: " + ", ".join(f"{name} {ms:.3f}" for name, ms in kernels)
        )
    if args.json:
        Path(args.json).write_text(
            json.dumps({"model": args.model, "engine_args": engine_args, "seconds": seconds})
        )


if __name__ == "__main__":
    main()
