"""Speculative decoding (n-gram, draft model) against plain decoding: decode tok/s and mean
acceptance length.

    python benchmarks/spec_decode.py cpu [--batches 1,16] [--max-tokens 64] [--penalties R,F,P]
        the default model (SmolLM2-135M, the CPU default dtype) on a copy/edit workload: each
        prompt holds a passage and asks for it back with an edit, so drafts come from the prompt;
        real acceptance. --penalties: every request's repetition, frequency and presence
        penalties (verified per draft position).
    python benchmarks/spec_decode.py device [--batches 1,32] [--rates 0.5,0.7,0.9] [--ks 1,2,3,4,5]
            [--ab]
        dummy llama3-8b on CUDA, rejection_sample_method synthetic (every position accepted at
        the rate, drafts every step): the speed at a given acceptance. One engine at k = max(ks)
        serves every k (the per-batch-size k override) and rate (set between runs), one plain
        engine the baseline; --ab: no plain engine, the uniform steps' full graphs against the
        piecewise ones in the same engine (run_graphs_ab).
    python benchmarks/spec_decode.py draft [--batches 1,32] [--rates 0.7] [--ks 3,5]
        dummy llama3-8b on CUDA with a dummy llama-shaped draft of its vocabulary
        (gpu_workloads' llama3-draft-0.3b, method draft_model), synthetic acceptance at the
        rate (so the acceptance is set while the draft's cost is real): plain decoding, then
        one speculating engine, each configuration run with the draft replaying its CUDA graphs
        ("graphs", spec_decode/draft_graphs.py) and eager ("eager": the runner's draft graphs
        set aside), alternating, twice; the faster of each pair counts (run_draft).

Prints one table row per configuration and a JSON line per row (--json FILE writes them all).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

PASSAGE = (
    "The lighthouse keeper climbed the spiral stairs every evening at dusk. He trimmed the wick, "
    "polished the great lens, and wrote the weather in a leather book: wind from the west, sea "
    "calm, two ships passing north. In winter the storms came and the glass rattled in its frame, "
    "but the light never went out. "
)
EDITS = ["lighthouse keeper", "old sailor", "young girl", "tired doctor", "quiet monk", "baker"]


def cpu_prompts(num: int) -> list[str]:
    return [
        f"Rewrite this passage, replacing 'lighthouse keeper' with '{EDITS[i % len(EDITS)]}' and "
        f"changing nothing else:\n\n{PASSAGE}\n\nRewritten passage:\n\n"
        for i in range(num)
    ]


@dataclasses.dataclass
class Row:
    mode: str
    batch: int
    k: int
    rate: float | None
    tok_s: float
    speedup: float | None
    mean_acceptance_length: float | None

    def line(self) -> str:
        rate = "-" if self.rate is None else f"{self.rate:.1f}"
        mal = "-" if self.mean_acceptance_length is None else f"{self.mean_acceptance_length:.2f}"
        speedup = "-" if self.speedup is None else f"{self.speedup:.2f}x"
        return (
            f"{self.mode:6} batch {self.batch:3}  k {self.k}  rate {rate:>3}  "
            f"{self.tok_s:9.1f} tok/s  {speedup:>6}  acc.len {mal}"
        )


def timed_generate(llm, prompts, params) -> tuple[float, int]:
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    seconds = time.perf_counter() - start
    return seconds, sum(len(o.outputs[0].token_ids) for o in outputs)


def counters_of(llm):
    return llm.llm_engine.engine_core.scheduler.spec.counters


def acceptance_since(llm, before: tuple[int, int]) -> float | None:
    counters = counters_of(llm)
    steps = counters.num_drafts - before[0]
    return 1.0 + (counters.num_accepted_tokens - before[1]) / steps if steps else None


def snapshot(llm) -> tuple[int, int]:
    counters = counters_of(llm)
    return counters.num_drafts, counters.num_accepted_tokens


def run_cpu(args) -> list[Row]:
    """Plain and speculative runs alternate, twice; the faster of each pair counts (the shared
    CPU's load varies)."""
    import torch

    from pagedlm import LLM, SamplingParams

    if args.threads:
        torch.set_num_threads(args.threads)
    spec = {"method": "ngram", "num_speculative_tokens": args.k, "prompt_lookup_min": 2,
            "prompt_lookup_max": 5}  # fmt: skip
    repetition, frequency, presence = (float(x) for x in args.penalties.split(","))
    params = SamplingParams(
        temperature=0,
        max_tokens=args.max_tokens,
        repetition_penalty=repetition,
        frequency_penalty=frequency,
        presence_penalty=presence,
    )
    rows = []
    engines = {"plain": LLM(), "ngram": LLM(speculative_config=spec)}
    for batch in args.batches:
        prompts = cpu_prompts(batch)
        best = {mode: float("inf") for mode in engines}
        tokens = dict.fromkeys(engines, 0)
        acceptance = None
        for llm in engines.values():
            llm.generate(prompts[:1], SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)
        for _ in range(2):
            for mode, llm in engines.items():
                before = snapshot(llm) if mode == "ngram" else None
                seconds, tokens[mode] = timed_generate(llm, prompts, params)
                best[mode] = min(best[mode], seconds)
                if before is not None:
                    acceptance = acceptance_since(llm, before)
        plain_tok_s = tokens["plain"] / best["plain"]
        spec_tok_s = tokens["ngram"] / best["ngram"]
        rows.append(Row("plain", batch, 0, None, plain_tok_s, 1.0, None))
        rows.append(
            Row("ngram", batch, args.k, None, spec_tok_s, spec_tok_s / plain_tok_s, acceptance)
        )
        print(rows[-2].line() + "\n" + rows[-1].line(), flush=True)
    return rows


@dataclasses.dataclass
class DeviceRuns:
    """What every device mode shares: the dummy target, the engine arguments, the prompts."""

    model: str
    root: Path
    common: dict
    prompts_of: dict[int, list[dict]]
    max_tokens: int

    @classmethod
    def of(cls, args) -> DeviceRuns:
        from gpu_workloads import model_dir, random_prompts

        root = Path(tempfile.mkdtemp())
        rng = random.Random(0)
        common = dict(
            load_format="dummy",
            skip_tokenizer_init=True,
            max_num_seqs=max(args.batches),
            max_num_batched_tokens=2048,
            graph_size_timing=False,
        )
        prompts_of = {
            b: [{"prompt_token_ids": p} for p in random_prompts(rng, b, 128)] for b in args.batches
        }
        return cls(model_dir("llama3-8b", root), root, common, prompts_of, args.max_tokens)

    @staticmethod
    def warm_up():
        """The whole batch, a few tokens: s22's first run at each batch of 32 or more (k 1, rate
        0.5) was ~0.7x of the k 1 runs after it, likely the allocator's first blocks of that
        size."""
        from pagedlm import SamplingParams

        return SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)

    def params(self, batch: int):
        from pagedlm import SamplingParams

        tokens = self.max_tokens if batch == 1 else self.max_tokens // 2
        return SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)

    def plain(self, batches: list[int], rows: list[Row]) -> dict[int, float]:
        """Batch -> plain decoding's tok/s (rows appended, printed)."""
        from pagedlm import LLM

        plain = LLM(self.model, **self.common)
        tok_s = {}
        for batch in batches:
            plain.generate(self.prompts_of[batch], self.warm_up(), use_tqdm=False)
            seconds, tokens = timed_generate(plain, self.prompts_of[batch], self.params(batch))
            tok_s[batch] = tokens / seconds
            rows.append(Row("plain", batch, 0, None, tok_s[batch], 1.0, None))
            print(rows[-1].line(), flush=True)
        plain.shutdown()
        return tok_s


def run_device(args) -> list[Row]:
    from pagedlm import LLM
    from pagedlm.spec_decode.config import SpeculativeConfig

    runs = DeviceRuns.of(args)
    model, common, prompts_of, params = runs.model, runs.common, runs.prompts_of, runs.params
    warm_up = runs.warm_up()
    k_max = max(args.ks)
    if args.ab:
        return run_graphs_ab(args, model, common, prompts_of, params, warm_up)
    rows: list[Row] = []
    plain_tok_s = runs.plain(args.batches, rows)
    # every batch size speculates (the crossover's question), so the runner captures the
    # uniform graphs of every size (worker/spec_graphs.py); each run then sets its k
    spec = {"method": "ngram", "num_speculative_tokens": k_max,
            "rejection_sample_method": "synthetic", "synthetic_acceptance_rates": 0.5,
            "num_speculative_tokens_per_batch_size": [[1, 4096, k_max]]}  # fmt: skip
    llm = LLM(model, speculative_config=spec, **common)
    scheduler = llm.llm_engine.engine_core.scheduler
    worker = llm.llm_engine.engine_core.model_runner.spec
    for batch in args.batches:
        llm.generate(prompts_of[batch], warm_up, use_tqdm=False)  # the batch's allocations
        for rate in args.rates:
            worker._rates.fill_(rate)
            for k in args.ks:
                scheduler.spec.config = SpeculativeConfig.from_user(
                    {**spec, "num_speculative_tokens_per_batch_size": [[1, 4096, k]]}
                )
                before = snapshot(llm)
                seconds, tokens = timed_generate(llm, prompts_of[batch], params(batch))
                tok_s = tokens / seconds
                rows.append(
                    Row(
                        "spec",
                        batch,
                        k,
                        rate,
                        tok_s,
                        tok_s / plain_tok_s[batch],
                        acceptance_since(llm, before),
                    )  # fmt: skip
                )
                print(rows[-1].line(), flush=True)
    return rows


def run_graphs_ab(args, model, common, prompts_of, params, warm_up) -> list[Row]:
    """One speculating engine, each configuration run with its uniform steps on the full graphs
    ("graphs") and on the piecewise ones ("pieces": the runner's spec graphs set aside),
    alternating, twice; the faster of each pair counts. speedup: graphs over pieces."""
    from pagedlm import LLM
    from pagedlm.spec_decode.config import SpeculativeConfig

    spec = {"method": "ngram", "num_speculative_tokens": max(args.ks),
            "rejection_sample_method": "synthetic", "synthetic_acceptance_rates": 0.5,
            "num_speculative_tokens_per_batch_size": [[1, 4096, max(args.ks)]]}  # fmt: skip
    llm = LLM(model, speculative_config=spec, **common)
    scheduler = llm.llm_engine.engine_core.scheduler
    runner = llm.llm_engine.engine_core.model_runner
    spec_graphs = {"graphs": runner.graphs.spec, "pieces": None}
    rows = []
    for batch in args.batches:
        llm.generate(prompts_of[batch], warm_up, use_tqdm=False)  # the batch's allocations
        for rate in args.rates:
            runner.spec._rates.fill_(rate)
            for k in args.ks:
                scheduler.spec.config = SpeculativeConfig.from_user(
                    {**spec, "num_speculative_tokens_per_batch_size": [[1, 4096, k]]}
                )
                best = dict.fromkeys(spec_graphs, 0.0)
                for _ in range(2):
                    for mode, graphs in spec_graphs.items():
                        runner.graphs.spec = graphs
                        seconds, tokens = timed_generate(llm, prompts_of[batch], params(batch))
                        best[mode] = max(best[mode], tokens / seconds)
                runner.graphs.spec = spec_graphs["graphs"]
                for mode in spec_graphs:
                    ratio = best[mode] / best["pieces"]
                    rows.append(Row(mode, batch, k, rate, best[mode], ratio, None))
                    print(rows[-1].line(), flush=True)
    return rows


def run_draft(args) -> list[Row]:
    """Plain decoding, then one draft-model engine at k = max(ks) whose runs set their k (the
    scheduler's and the worker's per-batch-size k) and rate; each configuration with the
    draft's graphs and without, alternating, twice; the faster of each pair counts. speedup:
    over plain."""
    from gpu_workloads import model_dir

    from pagedlm import LLM
    from pagedlm.spec_decode.config import SpeculativeConfig

    runs = DeviceRuns.of(args)
    rows: list[Row] = []
    plain_tok_s = runs.plain(args.batches, rows)
    k_max = max(args.ks)
    spec = {"method": "draft_model", "model": model_dir("llama3-draft-0.3b", runs.root),
            "num_speculative_tokens": k_max, "rejection_sample_method": "synthetic",
            "synthetic_acceptance_rates": args.rates[0],
            "num_speculative_tokens_per_batch_size": [[1, 4096, k_max]]}  # fmt: skip
    llm = LLM(runs.model, speculative_config=spec, **runs.common)
    scheduler = llm.llm_engine.engine_core.scheduler
    runner = llm.llm_engine.engine_core.model_runner
    draft_graphs = {"graphs": runner.graphs.draft, "eager": None}
    assert draft_graphs["graphs"] is not None, "no draft graphs (PAGEDLM_DRAFT_GRAPHS=0?)"
    for batch in args.batches:
        prompts = runs.prompts_of[batch]
        llm.generate(prompts, runs.warm_up(), use_tqdm=False)  # the batch's allocations
        for rate in args.rates:
            runner.spec._rates.fill_(rate)
            for k in args.ks:
                config = SpeculativeConfig.from_user(
                    {**spec, "num_speculative_tokens_per_batch_size": [[1, 4096, k]]}
                )
                scheduler.spec.config = config
                runner.spec._k_for_batch = config.num_spec_tokens_for_batch  # the draft's k
                best = dict.fromkeys(draft_graphs, 0.0)
                acceptance = None
                for _ in range(2):
                    for mode, graphs in draft_graphs.items():
                        runner.graphs.draft = graphs
                        before = snapshot(llm)
                        seconds, tokens = timed_generate(llm, prompts, runs.params(batch))
                        best[mode] = max(best[mode], tokens / seconds)
                        acceptance = acceptance_since(llm, before)
                runner.graphs.draft = draft_graphs["graphs"]
                for mode, tok_s in best.items():
                    speedup = tok_s / plain_tok_s[batch]
                    rows.append(Row(mode, batch, k, rate, tok_s, speedup, acceptance))
                    print(rows[-1].line(), flush=True)
    llm.shutdown()
    return rows


def draft_ratio_lines(rows: list[Row]) -> list[str]:
    """Per batch, k and rate: the draft's graphs over its eager single steps."""
    tok_s = {(r.mode, r.batch, r.k, r.rate): r.tok_s for r in rows}
    return [
        f"graphs/eager  batch {batch:3}  k {k}  rate {rate:.1f}  "
        f"{tok_s['graphs', batch, k, rate] / tok_s['eager', batch, k, rate]:.2f}x"
        for mode, batch, k, rate in tok_s
        if mode == "graphs"
    ]


def best_k_lines(rows: list[Row]) -> list[str]:
    """Per batch and rate: the fastest k and its speedup (below 1: plain decoding is faster)."""
    lines = []
    for batch in sorted({r.batch for r in rows}):
        cells = []
        for rate in sorted({r.rate for r in rows if r.rate is not None}):
            runs = [r for r in rows if r.batch == batch and r.rate == rate]
            best = max(runs, key=lambda r: r.tok_s)
            cells.append(f"rate {rate:.1f}: k {best.k} {best.speedup:.2f}x")
        lines.append(f"best  batch {batch:3}  " + "  ".join(cells))
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("where", choices=("cpu", "device", "draft"))
    parser.add_argument("--batches", default=None, help="comma-separated batch sizes")
    parser.add_argument("--max-tokens", type=int, default=None)
    parser.add_argument("--k", type=int, default=4, help="cpu: num_speculative_tokens")
    parser.add_argument("--ks", default=None, help="device: the k values (1..5; draft: 3,5)")
    parser.add_argument("--rates", default=None, help="synthetic rates (0.5,0.7,0.9; draft: 0.7)")
    parser.add_argument("--threads", type=int, default=0, help="cpu: torch threads (0: torch's)")
    parser.add_argument("--json", default=None, help="write the rows here")
    parser.add_argument("--penalties", default="1,0,0", help="cpu: repetition,frequency,presence")
    parser.add_argument("--ab", action="store_true", help="device: full graphs vs piecewise")
    args = parser.parse_args()
    on_cpu = args.where == "cpu"
    args.batches = [int(b) for b in (args.batches or ("1,16" if on_cpu else "1,32")).split(",")]
    args.max_tokens = args.max_tokens or (64 if on_cpu else 256)
    draft = args.where == "draft"
    args.ks = [int(k) for k in (args.ks or ("3,5" if draft else "1,2,3,4,5")).split(",")]
    args.rates = [float(r) for r in (args.rates or ("0.7" if draft else "0.5,0.7,0.9")).split(",")]
    run = {"cpu": run_cpu, "device": run_device, "draft": run_draft}[args.where]
    rows = run(args)
    print("\n" + "\n".join(row.line() for row in rows))
    if draft:
        print("\n" + "\n".join(draft_ratio_lines(rows)))
    elif not on_cpu and not args.ab:
        print("\n" + "\n".join(best_k_lines(rows)))
    if args.json:
        Path(args.json).write_text(json.dumps([dataclasses.asdict(r) for r in rows], indent=1))


if __name__ == "__main__":
    main()
