"""GPU: large decode batches split their longest sequences, on against off (issue 31), end to end
in one process: per mode a llama3-8b engine (dummy weights, bf16), the T4 runs with their step
timelines (skewed_timeline.timed_run), then fixed workloads (gpu_workloads.run_pagedlm).

    python benchmarks/split_ab.py --out DIR [--modes on,off] [--t4-runs t4] \
        [--workloads T0-llama3-8b,L1] [--extra-t4-runs t4-b8k]

`off` sets triton_backend.SPLIT_LARGE_BATCHES to False before the engine captures its CUDA graphs
(PAGEDLM_SPLIT_LARGE_DECODE=0 does the same for a whole process). --extra-t4-runs are T4 variants
timed in the last mode's engine only, after its workloads (skewed_timeline.py's run names: t4-b8k is
T4 with a max_num_batched_tokens of 8,192). DIR gets steps_<mode>-<run>.json and summary.json (each
row as it comes); a table last.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import gpu_workloads  # noqa: E402
import skewed_timeline  # noqa: E402

from pagedlm import LLM  # noqa: E402
from pagedlm.attention import triton_backend  # noqa: E402

MODEL = "llama3-8b"


def run_mode(
    mode: str, t4_runs: list[str], workloads: list[str], extra: list[str], out: Path, root: Path
) -> Iterator[dict]:
    """One engine with the split decode of large batches on or off -> a row per timed run: T4's
    runs, the workloads, then the extra T4 runs."""
    triton_backend.SPLIT_LARGE_BATCHES = mode == "on"
    llm = LLM(
        gpu_workloads.model_dir(MODEL, root),
        load_format="dummy",
        dtype="bfloat16",
        skip_tokenizer_init=True,
    )
    skewed_timeline.warm_up(llm)
    for run in t4_runs:
        yield timed_t4(llm, mode, run, out)
    for wid in workloads:
        model, prompts, max_tokens, temperature, overrides = gpu_workloads.workload(wid)
        assert model == MODEL and not overrides, (wid, model, overrides)
        repeats = 3 if wid in ("L1", "L2") else 1
        top_p = gpu_workloads.TOP_P.get(wid, 1.0)
        times, costs = gpu_workloads.run_pagedlm(
            llm, prompts, max_tokens, temperature, repeats, top_p
        )
        seconds = statistics.median(times)
        row = dict(mode=mode, run=wid, seconds=seconds, out_tok_s=sum(max_tokens) / seconds)
        print(json.dumps(dict(row, all_times=times, costs=costs)), flush=True)
        yield row
    for run in extra:
        yield timed_t4(llm, mode, run, out)
    del llm
    gc.collect()
    torch.cuda.empty_cache()


def timed_t4(llm: LLM, mode: str, run: str, out: Path) -> dict:
    print(f"\n##### split {mode}", flush=True)
    figures = skewed_timeline.timed_run(llm, run, skewed_timeline.skewed_mix.NUM_REQUESTS, out)
    (out / f"steps_{run}.json").rename(out / f"steps_{mode}-{run}.json")
    return dict(mode=mode, run=run, seconds=figures["elapsed_s"], out_tok_s=figures["output_tok_s"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--modes", default="on,off")
    parser.add_argument("--t4-runs", default="t4")
    parser.add_argument("--workloads", default="T0-llama3-8b,L1")
    parser.add_argument("--extra-t4-runs", default="")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    split = lambda text: [item for item in text.split(",") if item]  # noqa: E731
    modes, rows = split(args.modes), []
    with tempfile.TemporaryDirectory() as tmp:
        for mode in modes:
            extra = split(args.extra_t4_runs) if mode == modes[-1] else []
            runs = run_mode(mode, split(args.t4_runs), split(args.workloads), extra, out, Path(tmp))
            for row in runs:
                rows.append(row)
                (out / "summary.json").write_text(json.dumps(rows, indent=1))
    off = {r["run"]: r for r in rows if r["mode"] == "off"}
    print(f"\n{'split':6} {'run':14} {'seconds':>8} {'out tok/s':>10} {'vs off':>7}")
    for r in rows:
        base = off.get(r["run"])
        ratio = f"{r['out_tok_s'] / base['out_tok_s']:.3f}" if base else ""
        print(f"{r['mode']:6} {r['run']:14} {r['seconds']:8.2f} {r['out_tok_s']:10,.1f} {ratio:>7}")


if __name__ == "__main__":
    main()
