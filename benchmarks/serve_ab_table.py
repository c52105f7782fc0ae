"""The table of benchmarks/serve_ab.sh's runs: python benchmarks/serve_ab_table.py OUT_DIR."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(out: Path) -> None:
    offline_path = out / "offline.json"
    offline = json.loads(offline_path.read_text()) if offline_path.exists() else None
    offline_rate = offline["output_tokens_per_second"] if offline else None
    print(
        "| run | out tok/s | of offline | TTFT med / P99 ms | TPOT med / P99 ms | ITL med / P99 ms |"
    )
    print("|---|---|---|---|---|---|")
    for path in sorted(out.glob("*.json")):
        if path == offline_path:
            continue
        s = json.loads(path.read_text())
        share = f"{s['output_throughput'] / offline_rate:.1%}" if offline_rate else "-"
        print(
            f"| {path.stem} | {s['output_throughput']:,.0f} | {share} | "
            f"{_pair(s, 'ttft')} | {_pair(s, 'tpot')} | {_pair(s, 'itl')} |"
            + (f" failed {s['failed_requests']}" if s["failed_requests"] else "")
        )
    if offline:
        print(f"| offline (bench throughput) | {offline_rate:,.0f} | 100% | | | |")


def _pair(summary: dict, name: str) -> str:
    median, p99 = summary[f"median_{name}_ms"], summary[f"p99_{name}_ms"]
    return "n/a" if median is None else f"{median:,.1f} / {p99:,.1f}"


if __name__ == "__main__":
    main(Path(sys.argv[1]))
