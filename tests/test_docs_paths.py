"""The maps stay true: every file the design document and the results pages name exists.

A path is a backticked span that starts with one of the repository's top folders, e.g.
`pagedlm/worker/cuda_graphs.py` or `benchmarks/results/2026-11-30-h200-s18/`; it must exist. A bare
file name (`cuda_graphs.py`, `gpu_run.sh`) must name a file somewhere in those folders. Spans with a
placeholder (`<date>`) or a wildcard (`serving*.py`) name no one file and are left out. The session
notes under benchmarks/results/ are diaries kept verbatim (they name files where they were then), so
they are not checked.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
MAPS = ["docs/DESIGN.md", "benchmarks/RESULTS.md", "benchmarks/probes/README.md"]
TOP_FOLDERS = ("pagedlm/", "benchmarks/", "tests/", "docs/")
MAX_RESULTS_LINES = 400  # the results page holds current figures; history goes to the notes

_SPAN = re.compile(r"`([^`\n]+)`")
_FILE_NAME = re.compile(r"[\w.]+\.(py|sh)")  # not .md: BENCHMARKS.md is shared, not here


def _spans(text: str) -> list[str]:
    return [span.strip() for span in _SPAN.findall(text) if not any(c in span for c in "<>*$ ")]


def cited_paths(text: str) -> list[str]:
    """The repository paths named in backticks in `text`, in order."""
    return [span for span in _spans(text) if span.startswith(TOP_FOLDERS)]


def cited_file_names(text: str) -> list[str]:
    """The bare file names (no folder) named in backticks in `text`, in order."""
    return [span for span in _spans(text) if _FILE_NAME.fullmatch(span)]


def files_named(name: str) -> list[Path]:
    return [path for folder in TOP_FOLDERS for path in (REPO / folder).rglob(name)]


def test_cited_paths_finds_paths_and_skips_placeholders() -> None:
    text = (
        "see `pagedlm/worker/cuda_graphs.py` and `benchmarks/results/<date>/NOTES.md`, "
        "`serving*.py`, `tests/gpu/`, `lm_head.py`, `gpu_run.sh` and `torch.cuda`"
    )
    assert cited_paths(text) == ["pagedlm/worker/cuda_graphs.py", "tests/gpu/"]
    assert cited_file_names(text) == ["lm_head.py", "gpu_run.sh"]


@pytest.mark.parametrize("page", MAPS)
def test_every_cited_path_exists(page: str) -> None:
    paths = cited_paths((REPO / page).read_text())
    assert paths, f"{page} cites no repository path: is the pattern still right?"
    missing = [path for path in paths if not (REPO / path).exists()]
    assert not missing, f"{page} names paths that do not exist: {missing}"


@pytest.mark.parametrize("page", MAPS)
def test_every_cited_file_name_exists(page: str) -> None:
    names = cited_file_names((REPO / page).read_text())
    missing = [name for name in names if not files_named(name)]
    assert not missing, f"{page} names files that exist nowhere in {TOP_FOLDERS}: {missing}"


def test_results_page_is_a_current_page() -> None:
    num_lines = len((REPO / "benchmarks/RESULTS.md").read_text().splitlines())
    assert num_lines <= MAX_RESULTS_LINES, (
        f"benchmarks/RESULTS.md has {num_lines} lines, more than {MAX_RESULTS_LINES}: move the "
        "history into benchmarks/results/<date>/NOTES.md"
    )
