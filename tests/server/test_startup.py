"""`pagedlm serve` start-up failures: the core process starts before the front end has checked the
engine arguments, so a bad argument must still end in the usual one-line error (exit 2) with no
process left behind, and a core that fails while starting must still be reported (exit 1)."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from server_helpers import free_port, tiny_server_args

pytestmark = pytest.mark.slow

EXIT_TIMEOUT_S = 300


def run_serve(*args: str) -> tuple[subprocess.CompletedProcess, int]:
    """`pagedlm serve ARGS` (the command's main, which turns a ValueError into a one-line error)
    in its own session, to its end; (the result, its session id)."""
    cmd = [sys.executable, "-m", "pagedlm.cli", "serve", *args, "--port", str(free_port())]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    output, _ = proc.communicate(timeout=EXIT_TIMEOUT_S)
    return subprocess.CompletedProcess(cmd, proc.returncode, output), proc.pid


def assert_session_gone(session: int, timeout_s: float = 10.0) -> None:
    """No process of the session is left (multiprocessing's resource tracker may take a moment)."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = []
        for process in psutil.process_iter(["cmdline"]):
            try:
                if os.getsid(process.pid) == session:
                    left.append(process.info["cmdline"])
            except OSError:  # gone meanwhile
                pass
        if not left:
            return
        assert time.monotonic() < deadline, f"left behind: {left}"
        time.sleep(0.2)


def test_a_bad_engine_argument_is_a_clear_error_and_leaves_no_process() -> None:
    """The default model: the front end finds the bad argument after parsing the GGUF config, while
    the core process is busy with its own."""
    result, session = run_serve("--attention-backend", "bogus")
    assert result.returncode == 2, result.stdout
    assert "pagedlm: error: attention_backend must be auto, torch, torch_ref or triton; got " \
           "'bogus'" in result.stdout
    assert "Traceback" not in result.stdout and "engine core" not in result.stdout, result.stdout
    assert_session_gone(session)


def test_a_core_failing_at_start_is_reported(tiny_model_dir: Path) -> None:
    """Less than one KV-cache block: the core process fails after loading the model."""
    result, session = run_serve(*tiny_server_args(tiny_model_dir, "--kv-cache-memory-gib", "1e-9"))
    assert result.returncode == 1, result.stdout
    assert "RuntimeError: the engine core failed to start:" in result.stdout
    assert "does not fit in the KV cache: 0 blocks" in result.stdout
    assert_session_gone(session)
