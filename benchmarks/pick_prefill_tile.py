"""Pick the prefill tile settings from a sweep of benchmarks/attention_kernels.py and write them
into pagedlm/attention/triton_paged.py (the module constants PREFILL_*).

    python benchmarks/pick_prefill_tile.py SWEEP.json [--write]

The winner has the least total time over all cases among configs that ran every case with a
max error under 0.05 against SDPA. Prints the ranking; --write edits the constants.
"""

from __future__ import annotations

import argparse
import json
import re
from collections import defaultdict
from pathlib import Path

MODULE = Path(__file__).resolve().parents[1] / "pagedlm" / "attention" / "triton_paged.py"
NAMES = ("PREFILL_BLOCK_M", "PREFILL_NUM_WARPS", "PREFILL_NUM_STAGES", "PREFILL_BLOCK_N")


def rank(rows: list[dict]) -> list[tuple[float, str]]:
    cases = {r["case"] for r in rows}
    totals, seen = defaultdict(float), defaultdict(set)
    for r in rows:
        if r["config"] != "sdpa" and r["err"] == r["err"] and r["err"] < 0.05:
            totals[r["config"]] += r["ms"]
            seen[r["config"]].add(r["case"])
    return sorted((t, c) for c, t in totals.items() if seen[c] == cases)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("sweep")
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    ranking = rank(json.loads(Path(args.sweep).read_text()))
    for total, config in ranking[:5]:
        print(f"{config:22} {total:8.3f} ms over all cases")
    values = [int(v) for v in re.findall(r"\d+", ranking[0][1])]  # "M128 w8 s3 N64"
    if args.write:
        text = MODULE.read_text()
        for name, value in zip(NAMES, values):
            text = re.sub(rf"^{name} = \d+", f"{name} = {value}", text, flags=re.M)
        MODULE.write_text(text)
        print("wrote", dict(zip(NAMES, values)))


if __name__ == "__main__":
    main()
