"""external_launcher: two ranks started as torchrun starts them, each running the same script with
its own engine; both give tp = 1's tokens (greedy and seeded)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import launched_rank
import pytest

from pagedlm import LLM

SCRIPT = Path(__file__).with_name("launched_rank.py")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_two_launched_ranks_give_tp1_tokens(tiny_llama_dir: Path) -> None:
    port = _free_port()
    procs = []
    for rank in range(2):
        env = dict(
            os.environ,
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE="2",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, str(SCRIPT), str(tiny_llama_dir)],
                env=env,
                stdout=subprocess.PIPE,
                text=True,
            )
        )
    try:
        outputs = [proc.communicate(timeout=300)[0] for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert [proc.returncode for proc in procs] == [0, 0]
    ranks = [json.loads(out.strip().splitlines()[-1]) for out in outputs]
    assert (
        ranks[0]
        == ranks[1]
        == launched_rank.tokens(LLM(str(tiny_llama_dir), **launched_rank.ENGINE))
    )


def test_external_launcher_needs_the_launchers_environment(
    tiny_llama_dir: Path, monkeypatch
) -> None:
    from pagedlm.config import EngineArgs

    monkeypatch.delenv("RANK", raising=False)
    args = EngineArgs(
        model=str(tiny_llama_dir),
        device="cpu",
        tensor_parallel_size=2,
        distributed_executor_backend="external_launcher",
    )
    with pytest.raises(ValueError, match="RANK and WORLD_SIZE"):
        args.create_engine_config()
