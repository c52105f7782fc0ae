"""GPU: the prefill spread and the split decode of large batches, A/B in one process (issue 31):
per split mode one llama3-8b engine (split_ab.run_mode), with its own list of runs.

    python benchmarks/spread_ab.py --out DIR [--plan "on:t4,t4-plain,T0-llama3-8b,T2;off:T2"]

A plan item is `mode:runs`: mode on/off sets the split decode of large batches
(triton_backend.SPLIT_LARGE_BATCHES) before the engine captures its graphs; runs named t4... are
skewed_timeline.py's (t4-plain: the spread off for that run), the others gpu_workloads.py's, in the
order given, T4 runs first. DIR gets steps_<mode>-<run>.json and summary.json (row by row);
a table last.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import split_ab  # noqa: E402

DEFAULT_PLAN = "on:t4,t4-plain,T0-llama3-8b,T2;off:T2"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--plan", default=DEFAULT_PLAN)
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for item in args.plan.split(";"):
            mode, runs = item.split(":")
            names = [name for name in runs.split(",") if name]
            t4_runs = [name for name in names if name.startswith("t4")]
            workloads = [name for name in names if not name.startswith("t4")]
            for row in split_ab.run_mode(mode, t4_runs, workloads, [], out, Path(tmp)):
                rows.append(row)
                (out / "summary.json").write_text(json.dumps(rows, indent=1))
    print(f"\n{'split':6} {'run':14} {'seconds':>8} {'out tok/s':>10}")
    for r in rows:
        print(f"{r['mode']:6} {r['run']:14} {r['seconds']:8.2f} {r['out_tok_s']:10,.1f}")


if __name__ == "__main__":
    main()
