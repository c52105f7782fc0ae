"""CPU: a logged run's steps (step_log.py) against the per-step cost model (step_cost_model.py):
which steps took longer than their contents should on the H200 (llama3-8b only).

    python benchmarks/timeline_vs_model.py DIR/steps_t4.json [...]       (skewed_timeline.py)
    python benchmarks/timeline_vs_model.py --core-csv DIR/core_steps.PID.csv  (the server's core)

For a skewed_timeline.py run: measured and modelled seconds by step kind and by bucket of
tokens a step; then the decode steps' excess (measured - modelled) by batch size, beside the
step's longest context (each running request's prompt plus the steps since its first schedule),
and a least-squares fit of the excess on rows and that longest context. For the server's core: its runs (split at idle gaps of over IDLE_GAP_S), each
with its steps, steps/s, rows and tokens a step, and the core's seconds sending outputs; the
steady part (rows at least STEADY_ROWS_FRACTION of the run's largest) gives ms a step to hold
against the offline engine's on the same prompts (serve-offline's steady decode).
"""

from __future__ import annotations

import argparse
import bisect
import csv
import json
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from step_cost_model import Rates, Step, step_seconds  # noqa: E402

TOKEN_BUCKETS = (1, 64, 256, 1024, 2048, 4096, 8192, 16384)
DECODE_ROW_BANDS = ((1, 17), (17, 64), (64, 128), (128, 256), (256, 1025))
IDLE_GAP_S = 1.0
STEADY_ROWS_FRACTION = 0.9


def modelled(step: dict) -> float:
    cost = Step(step["tokens"], step["sampled"], step["decode_kv_tokens"], step["prefill_visible"])
    return sum(step_seconds(cost, Rates()).values())


def kind(step: dict) -> str:
    if step["decode_rows"] == step["rows"]:
        return "decode"
    return "prefill" if step["decode_rows"] == 0 else "mixed"


def bucket(tokens: int) -> str:
    upper = next((b for b in TOKEN_BUCKETS if tokens <= b), None)
    return f"<= {upper}" if upper else f"> {TOKEN_BUCKETS[-1]}"


def compare_run(path: Path) -> None:
    data = json.loads(path.read_text())
    steps = data["steps"]
    measured = [
        s["done"] - (steps[i - 1]["done"] if i else s["launched"]) for i, s in enumerate(steps)
    ]
    print(
        f"\n{path.name}: {len(steps)} steps, measured {sum(measured):.2f} s, "
        f"modelled {sum(map(modelled, steps)):.2f} s"
    )
    groups: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for step, seconds in zip(steps, measured):
        groups.setdefault((kind(step), bucket(step["tokens"])), []).append(
            (seconds, modelled(step))
        )
    print(
        f"{'kind':8} {'tokens':>9} {'steps':>6} {'measured s':>11} {'modelled s':>11} {'ratio':>6}"
    )
    for (k, b), pairs in sorted(groups.items(), key=lambda kv: -sum(p[0] for p in kv[1])):
        m, c = sum(p[0] for p in pairs), sum(p[1] for p in pairs)
        print(f"{k:8} {b:>9} {len(pairs):6d} {m:11.2f} {c:11.2f} {m / c:6.2f}")
    decode_excess(steps, data["requests"], np.array(measured))


def longest_contexts(steps: list[dict], requests: dict) -> np.ndarray:
    """Per step, the longest context among the requests running then (approximate: the prompt
    plus one token a step since the request's first schedule)."""
    launched = [s["launched"] for s in steps]
    longest = np.zeros(len(steps))
    for r in requests.values():
        a = bisect.bisect_left(launched, r["first_scheduled"])
        b = bisect.bisect_right(launched, r["finished"])
        longest[a:b] = np.maximum(longest[a:b], r["prompt_len"] + np.arange(b - a))
    return longest


def decode_excess(steps: list[dict], requests: dict, measured: np.ndarray) -> None:
    decode = np.array([kind(s) == "decode" for s in steps])
    if not decode.any():
        return
    excess_ms = 1e3 * (measured - np.array([modelled(s) for s in steps]))
    rows = np.array([s["rows"] for s in steps])
    longest = longest_contexts(steps, requests)
    print(f"{'decode rows':>12} {'steps':>6} {'excess ms':>10} {'longest ctx':>12}")
    for lo, hi in DECODE_ROW_BANDS:
        band = decode & (rows >= lo) & (rows < hi)
        if band.any():
            print(
                f"{f'{lo}-{hi - 1}':>12} {band.sum():6d} {excess_ms[band].mean():10.2f} "
                f"{longest[band].mean():12.0f}"
            )
    x = np.column_stack([np.ones(decode.sum()), rows[decode], longest[decode] / 1e3])
    y = excess_ms[decode]
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    r2 = 1 - ((y - x @ coef) ** 2).sum() / ((y - y.mean()) ** 2).sum()
    print(
        f"decode excess {y.sum() / 1e3:.2f} s over {decode.sum()} steps; fit: excess ms = "
        f"{coef[0]:.2f} + {coef[1]:.4f} x rows + {coef[2]:.2f} x longest context / 1,000 "
        f"(R^2 {r2:.2f})"
    )


def core_runs(path: Path) -> None:
    with path.open() as f:
        rows = [{k: float(v) for k, v in r.items()} for r in csv.DictReader(f)]
    runs, current = [], []
    for r in rows:
        if current and r["launched"] - current[-1]["done"] > IDLE_GAP_S:
            runs.append(current)
            current = []
        current.append(r)
    if current:
        runs.append(current)
    print(f"\n{path.name}: {len(rows)} steps in {len(runs)} runs")
    print(
        f"{'run':>3} {'steps':>6} {'seconds':>8} {'steps/s':>8} {'rows':>6} {'tok/step':>9} "
        f"{'send ms/step':>12} {'steady ms/step':>14} {'steady rows':>11}"
    )
    for i, run in enumerate(runs):
        seconds = run[-1]["done"] - run[0]["launched"]
        gaps = [b["done"] - a["done"] for a, b in zip(run, run[1:])]
        largest = max(r["rows"] for r in run)
        steady = [g for g, r in zip(gaps, run[1:]) if r["rows"] >= STEADY_ROWS_FRACTION * largest]
        send = (run[-1]["send_s"] - run[0]["send_s"]) / len(run)
        print(
            f"{i:3d} {len(run):6d} {seconds:8.2f} {len(run) / seconds:8.1f} "
            f"{statistics.mean(r['rows'] for r in run):6.1f} "
            f"{statistics.mean(r['tokens'] for r in run):9.0f} {1e3 * send:12.3f} "
            f"{1e3 * statistics.median(steady) if steady else 0.0:14.2f} "
            f"{statistics.mean(r['rows'] for r in run[1:] if r['rows'] >= STEADY_ROWS_FRACTION * largest) if steady else 0.0:11.1f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="*", help="steps_<run>.json files of skewed_timeline.py")
    parser.add_argument("--core-csv", nargs="*", default=[], help="the server core's step logs")
    args = parser.parse_args()
    for run in args.runs:
        compare_run(Path(run))
    for log in args.core_csv:
        core_runs(Path(log))


if __name__ == "__main__":
    main()
