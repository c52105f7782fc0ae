"""Import costs and side effects: the planner (core/) is pure Python, and importing pagedlm
configures nothing. Each check runs in a fresh interpreter, since this one has torch loaded."""

from __future__ import annotations

import subprocess
import sys

import pytest

PLANNER_MODULES = (
    "pagedlm.core.block_pool",
    "pagedlm.core.kv_cache_manager",
    "pagedlm.core.sched_output",
    "pagedlm.core.scheduler",
    "pagedlm.config",
    "pagedlm.envs",
)


def _run(code: str) -> str:
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


@pytest.mark.parametrize("module", PLANNER_MODULES)
def test_planner_imports_neither_torch_nor_triton(module: str) -> None:
    loaded = _run(
        f"import sys, {module}; "
        "print(sorted(m for m in ('torch', 'triton', 'transformers') if m in sys.modules))"
    )
    assert loaded == "[]", f"importing {module} loads {loaded}"


def test_the_scheduler_runs_without_torch() -> None:
    """Not only the import: a planning step too (a request admitted and scheduled)."""
    code = """
import sys
from pagedlm.config import CacheConfig, SchedulerConfig
from pagedlm.core.scheduler import Scheduler
from pagedlm.request import Request
from pagedlm.sampling_params import SamplingParams
scheduler = Scheduler(SchedulerConfig(), CacheConfig(block_size=16), 8, 64)
scheduler.add_request(Request("r", [1, 2, 3], SamplingParams(max_tokens=2), max_tokens=2))
out = scheduler.schedule()
print(out.num_scheduled_tokens, 'torch' in sys.modules)
"""
    assert _run(code) == "{'r': 3} False"


def test_importing_pagedlm_configures_no_logging_and_loads_no_torch() -> None:
    code = (
        "import logging, sys, pagedlm; log = logging.getLogger('pagedlm'); "
        "print(log.handlers, log.propagate, 'torch' in sys.modules)"
    )
    assert _run(code) == "[] True False"


def test_package_exports_load_on_first_use() -> None:
    code = (
        "import sys, pagedlm; from pagedlm import SamplingParams; "
        "print(SamplingParams.__module__, 'pagedlm.llm' in sys.modules, "
        "pagedlm.LLM.__name__, 'pagedlm.llm' in sys.modules, sorted(pagedlm.__all__) == "
        "sorted(n for n in dir(pagedlm) if n in pagedlm.__all__))"
    )
    assert _run(code) == "pagedlm.sampling_params False LLM True True"


def test_an_unknown_package_attribute_is_an_attribute_error() -> None:
    import pagedlm

    with pytest.raises(AttributeError, match="no attribute 'NoSuchThing'"):
        pagedlm.NoSuchThing  # noqa: B018


def test_the_serve_parser_does_not_import_the_cli() -> None:
    """Engine-argument parsing lives beside EngineArgs: no pagedlm.cli <-> server import cycle."""
    loaded = _run(
        "import argparse, sys\n"
        "import pagedlm.server.cli, pagedlm.server.launch\n"
        "pagedlm.server.cli.add_serve_parser(argparse.ArgumentParser().add_subparsers())\n"
        "print('pagedlm.cli' in sys.modules)"
    )
    assert loaded == "False", "building the serve parser loads pagedlm.cli"
