"""Starting `pagedlm serve` in a subprocess on a free loopback port, waiting until it is healthy,
reading its metrics, stopping it."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil
import pytest

from pagedlm.config import default_model_path

API_KEY = "test-key"
START_TIMEOUT_S = 900  # loading the default model on a busy 2-core CPU is slow
# `pagedlm serve ...`: the serve subcommand as pagedlm's CLI adds it (add_serve_parser).
_LAUNCHER = (
    "import argparse, sys\n"
    "from pagedlm.server.cli import add_serve_parser\n"
    "parser = argparse.ArgumentParser(prog='pagedlm')\n"
    "add_serve_parser(parser.add_subparsers(dest='command', required=True))\n"
    "args = parser.parse_args(sys.argv[1:])\n"
    "args.func(args)\n"
)


@dataclass
class ServerProcess:
    proc: subprocess.Popen
    base_url: str
    log_path: Path
    api_key: str | None = None

    @property
    def auth(self) -> dict[str, str]:
        """The header every route but /health needs when the server has an API key."""
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def url(self, path: str) -> str:
        return self.base_url + path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def metric(self, name: str, **labels: str) -> float:
        """The sum of a metric's samples (whose labels include `labels`) in /metrics."""
        text = httpx.get(self.url("/metrics"), headers=self.auth, timeout=10).text
        total, found = 0.0, False
        for line in text.splitlines():
            if line.startswith("#") or not (
                line.startswith(name + "{") or line.startswith(name + " ")
            ):
                continue
            if all(f'{k}="{v}"' in line for k, v in labels.items()):
                total += float(line.rsplit(" ", 1)[1])
                found = True
        assert found, f"metric {name} {labels} not in /metrics:\n{text}"
        return total

    def core_process(self) -> psutil.Process:
        """The engine-core process (data_parallel_size 1)."""
        (core,) = self.core_processes()
        return core

    def core_processes(self) -> list[psutil.Process]:
        """The engine-core processes (one per dp rank): the front end's children that
        multiprocessing spawned (the other child is multiprocessing's resource tracker)."""
        return [
            child
            for child in psutil.Process(self.proc.pid).children()
            if "spawn_main" in " ".join(child.cmdline())
        ]

    def family(self) -> list[psutil.Process]:
        """The front end and every process below it."""
        front_end = psutil.Process(self.proc.pid)
        return [front_end, *front_end.children(recursive=True)]

    def wait_for_idle(self, timeout_s: float = 5.0) -> None:
        """No running or waiting request and no KV block in use, within `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while True:
            state = [
                self.metric("pagedlm:num_requests_running"),
                self.metric("pagedlm:num_requests_waiting"),
                self.metric("pagedlm:kv_cache_usage_perc"),
            ]
            if state == [0.0, 0.0, 0.0]:
                return
            assert time.monotonic() < deadline, f"not idle after {timeout_s} s: {state}"
            time.sleep(0.2)

    def wait_for_health(self, status: int, timeout_s: float = 10.0) -> float:
        """Polls /health until it answers `status`; the seconds that took."""
        start = time.monotonic()
        while (answer := httpx.get(self.url("/health"), timeout=5).status_code) != status:
            assert time.monotonic() - start < timeout_s, (
                f"/health still {answer} after {timeout_s} s"
            )
            time.sleep(0.05)
        return time.monotonic() - start

    def stop(self, timeout_s: float = 60) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            raise


def assert_gone(processes: list[psutil.Process], timeout_s: float = 10.0) -> None:
    _, alive = psutil.wait_procs(processes, timeout=timeout_s)
    assert not alive, f"left behind: {alive}"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(args: list[str], log_path: Path) -> ServerProcess:
    port = free_port()
    api_key = args[args.index("--api-key") + 1] if "--api-key" in args else None
    cmd = [
        sys.executable,
        "-c",
        _LAUNCHER,
        "serve",
        *args,
        "--port",
        str(port),
        "--log-stats-interval",
        "2",
    ]
    log = log_path.open("w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    server = ServerProcess(proc, f"http://127.0.0.1:{port}", log_path, api_key)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(
                f"server exited with {proc.returncode} while starting:\n{server.log()[-4000:]}"
            )
        try:
            if httpx.get(server.url("/health"), timeout=2).status_code == 200:
                return server
        except httpx.TransportError:
            pass
        time.sleep(1)
    server.stop()
    pytest.fail(f"server did not become healthy in {START_TIMEOUT_S} s:\n{server.log()[-4000:]}")


def tiny_server_args(model_dir: Path, *extra: str) -> list[str]:
    return [
        str(model_dir),
        "--tokenizer",
        default_model_path(),
        "--kv-cache-memory-gib",
        "0.05",
        *extra,
    ]


class StreamInBackground(threading.Thread):
    """A streamed POST read on a thread: the payloads of its `data:` lines, in order."""

    def __init__(
        self, server: ServerProcess, path: str, body: dict, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(daemon=True)
        self._args = (server.url(path), {**body, "stream": True}, headers or {})
        self.status: int | None = None
        self.payloads: list[str] = []
        self.failure: Exception | None = None  # the connection broke
        self.start()

    def run(self) -> None:
        url, body, headers = self._args
        try:
            with httpx.stream("POST", url, json=body, headers=headers, timeout=120) as response:
                self.status = response.status_code
                for line in response.iter_lines():
                    if line.startswith("data: "):
                        self.payloads.append(line[len("data: ") :])
        except httpx.HTTPError as exc:
            self.failure = exc

    def wait_for_events(self, num_events: int, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while len(self.payloads) < num_events:
            assert self.is_alive(), f"the stream ended after {self.payloads}"
            assert time.monotonic() < deadline, f"{num_events} events not there in {timeout_s} s"
            time.sleep(0.01)

    def result(self, timeout_s: float = 120) -> list[dict]:
        """The JSON events, once the stream has ended with [DONE]."""
        self.join(timeout_s)
        assert not self.is_alive(), f"the stream did not end in {timeout_s} s"
        assert self.failure is None and self.status == 200, (self.status, self.failure)
        assert self.payloads and self.payloads[-1] == "[DONE]", self.payloads[-3:]
        return [json.loads(p) for p in self.payloads[:-1]]
