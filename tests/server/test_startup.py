"""`pagedlm serve` start-up failures: the core process starts before the front end has checked the
engine arguments, so a bad argument must still end in the usual one-line error (exit 2) with no
process left behind, and a core that fails while starting must still be reported (exit 1). A port
in use fails at once, before the model loads. `make run` takes HOST and PORT."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from server_helpers import free_port, tiny_server_args

pytestmark = pytest.mark.slow

EXIT_TIMEOUT_S = 300


def run_serve(*args: str, port: int | None = None) -> tuple[subprocess.CompletedProcess, int]:
    """`pagedlm serve ARGS` (the command's main, which turns a ValueError into a one-line error)
    in its own session, to its end; (the result, its session id)."""
    cmd = [sys.executable, "-m", "pagedlm.cli", "serve", *args, "--port", str(port or free_port())]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
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
    assert (
        "pagedlm: error: attention_backend must be auto, torch, torch_ref or triton; got "
        "'bogus'" in result.stdout
    )
    assert "Traceback" not in result.stdout and "engine core" not in result.stdout, result.stdout
    assert_session_gone(session)


def test_a_core_failing_at_start_is_reported(tiny_model_dir: Path) -> None:
    """Less than one KV-cache block: the core process fails after loading the model."""
    result, session = run_serve(*tiny_server_args(tiny_model_dir, "--kv-cache-memory-gib", "1e-9"))
    assert result.returncode == 1, result.stdout
    assert "RuntimeError: the engine core failed to start:" in result.stdout
    assert "does not fit in the KV cache: 0 blocks" in result.stdout
    assert_session_gone(session)


def test_a_port_in_use_fails_before_the_model_loads(tiny_model_dir: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        started = time.monotonic()
        result, session = run_serve(*tiny_server_args(tiny_model_dir), port=port)
        elapsed = time.monotonic() - started
    assert result.returncode == 2, result.stdout
    assert result.stdout.splitlines() == [
        f"pagedlm: error: cannot listen on 127.0.0.1:{port} (--host, --port): Address already in use"
    ]
    assert elapsed < 60, f"{elapsed:.0f} s: did it load the model first?"
    assert_session_gone(session)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (("--heartbeat-timeout", "0.5"), "--heartbeat-timeout must be at least 1 s"),
        (
            ("--heartbeat-timeout", "8", "--stall-timeout", "4"),
            "--stall-timeout must be at least --heartbeat-timeout (8 s), got 4",
        ),
        (
            ("--shutdown-timeout", "-1"),
            "argument --shutdown-timeout: must be a number of seconds >= 0",
        ),
    ],
)
def test_bad_timeouts_are_one_line_errors(flags: tuple[str, ...], message: str) -> None:
    result, session = run_serve(*flags)
    assert result.returncode == 2, result.stdout
    assert message in result.stdout and "Traceback" not in result.stdout, result.stdout
    assert_session_gone(session)


def test_make_run_takes_host_and_port() -> None:
    def serve_line(*variables: str) -> str:
        dry_run = subprocess.run(
            ["make", "-n", "run", *variables],
            capture_output=True,
            text=True,
            check=True,
            cwd=Path(__file__).parents[2],
        )
        return [line for line in dry_run.stdout.splitlines() if "pagedlm serve" in line][-1]

    assert serve_line().endswith("pagedlm serve --host 127.0.0.1 --port 8000")
    assert serve_line("HOST=0.0.0.0", "PORT=8011").endswith(
        "pagedlm serve --host 0.0.0.0 --port 8011"
    )
