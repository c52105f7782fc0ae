"""The `pagedlm` command: help texts, generate on a tiny model folder (a real subprocess), the
chat REPL and bench throughput (in process)."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pagedlm import LLM, SamplingParams
from pagedlm.bench.datasets import prefix_repetition_requests, random_requests
from pagedlm.chat_repl import run_chat_repl
from pagedlm.cli import build_parser, main
from pagedlm.config import EngineArgs

ENGINE_FLAGS = [
    "--dtype",
    "float32",
    "--device",
    "cpu",
    "--num-gpu-blocks-override",
    "64",
    "--max-model-len",
    "128",
]
GREEDY = SamplingParams(temperature=0.0, max_tokens=4)


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pagedlm.cli", *args],
        capture_output=True,
        check=False,
        text=True,
        timeout=300,
    )


@pytest.fixture(scope="module")
def model_dir(tiny_llama_with_tokenizer_dir: Path) -> Path:
    return tiny_llama_with_tokenizer_dir


@pytest.fixture(scope="module")
def llm(model_dir: Path) -> LLM:
    return LLM(
        str(model_dir), dtype="float32", device="cpu", num_gpu_blocks_override=64, max_model_len=128
    )


def test_generate_help_lists_engine_and_sampling_flags() -> None:
    result = _cli("generate", "--help")
    assert result.returncode == 0, result.stderr
    for flag in (
        "--model",
        "--max-num-seqs",
        "--enable-prefix-caching",
        "--no-enable-prefix-caching",
        "--async-scheduling",
        "--temperature",
        "--top-p",
        "--top-k",
        "--min-p",
        "--max-tokens",
        "--seed",
        "--ignore-eos",
        "--graph-size-timing",
        "--no-graph-size-timing",
        "PROMPT",
    ):
        assert flag in result.stdout, flag


def test_bench_throughput_help() -> None:
    result = _cli("bench", "throughput", "--help")
    assert result.returncode == 0, result.stderr
    for flag in (
        "--dataset",
        "--input-len",
        "--output-len",
        "--range-ratio",
        "--prefix-len",
        "--suffix-len",
        "--num-prefixes",
        "--output-json",
        "--max-num-seqs",
    ):
        assert flag in result.stdout, flag


def test_engine_flags_round_trip_to_engine_args() -> None:
    args = build_parser().parse_args(
        [
            "generate",
            "--max-num-seqs",
            "3",
            "--no-enable-prefix-caching",
            "--gpu-memory-utilization",
            "0.5",
            "--async-scheduling",
            "x",
        ]
    )
    engine_args = EngineArgs.from_cli_args(args)
    assert engine_args == EngineArgs(
        max_num_seqs=3,
        enable_prefix_caching=False,
        gpu_memory_utilization=0.5,
        async_scheduling=True,
    )
    assert EngineArgs.from_cli_args(build_parser().parse_args(["chat"])) == EngineArgs()


def test_graph_size_timing_is_an_engine_argument(model_dir: Path) -> None:
    """On by default; --no-graph-size-timing reaches the engine config (restarts replay the same
    graph sizes)."""
    assert EngineArgs().graph_size_timing
    args = build_parser().parse_args(
        ["generate", "--model", str(model_dir), "--device", "cpu", "--no-graph-size-timing", "x"]
    )
    engine_args = EngineArgs.from_cli_args(args)
    assert engine_args.graph_size_timing is False
    assert engine_args.create_engine_config().graph_size_timing is False
    assert EngineArgs(model=str(model_dir), device="cpu").create_engine_config().graph_size_timing


def test_engine_args_parse_without_the_cli_module() -> None:
    """EngineArgs carries its own flags, so the server's parser needs nothing of pagedlm.cli."""
    code = (
        "import argparse, sys; from pagedlm.config import EngineArgs; "
        "p = EngineArgs.add_cli_args(argparse.ArgumentParser()); "
        "a = EngineArgs.from_cli_args(p.parse_args(['--max-num-seqs', '3', '--no-graph-size-timing'])); "
        "print(a.max_num_seqs, a.graph_size_timing, 'pagedlm.cli' in sys.modules)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["3", "False", "False"]


def test_generate_prints_each_completion(model_dir: Path, llm: LLM) -> None:
    prompts = ["hello world", "the cat sat"]
    expected = [o.outputs[0].text for o in llm.generate(prompts, GREEDY, use_tqdm=False)]
    result = _cli(
        "generate", "--model", str(model_dir), *ENGINE_FLAGS, "--max-tokens", "4", *prompts
    )
    assert result.returncode == 0, result.stderr
    for prompt, text in zip(prompts, expected):
        assert f"Prompt: {prompt!r}\nOutput: {text}\n" in result.stdout


def test_generate_reports_bad_input_without_a_traceback(tmp_path: Path) -> None:
    result = _cli("generate", "--model", str(tmp_path / "missing"), "hi")
    assert result.returncode == 2
    assert "pagedlm: error: model: path" in result.stderr and "Traceback" not in result.stderr


def test_chat_repl_streams_replies_and_keeps_the_conversation(llm: LLM) -> None:
    stdout = io.StringIO()
    run_chat_repl(llm, GREEDY, io.StringIO("hello world\n\nthe cat\n/exit\nnot read\n"), stdout)
    first = llm.chat([{"role": "user", "content": "hello world"}], GREEDY, use_tqdm=False)
    first_reply = first[0].outputs[0].text
    second = llm.chat(
        [
            {"role": "user", "content": "hello world"},
            {"role": "assistant", "content": first_reply},
            {"role": "user", "content": "the cat"},
        ],
        GREEDY,
        use_tqdm=False,
    )
    assert stdout.getvalue() == f"{first_reply}\n{second[0].outputs[0].text}\n"
    assert "assistant: " + first_reply in second[0].prompt


def test_bench_throughput_runs_and_writes_json(
    model_dir: Path, tmp_path: Path, capsys: Any
) -> None:
    out_json = tmp_path / "result.json"
    main(
        [
            "bench",
            "throughput",
            "--model",
            str(model_dir),
            *ENGINE_FLAGS,
            "--num-prompts",
            "4",
            "--input-len",
            "8",
            "--output-len",
            "4",
            "--output-json",
            str(out_json),
        ]
    )
    results = json.loads(out_json.read_text())
    assert results["num_requests"] == 4 and results["num_output_tokens"] == 16
    assert (
        0 < results["fraction_of_hardware_limit"] < 1
    )  # a tiny model on a CPU: far from an H200's limits
    assert results["compute_floor_seconds"] > 0 and results["memory_floor_seconds"] > 0
    out = capsys.readouterr().out
    assert "requests/s" in out and "of the hardware limit (FLOPs at 797 TFLOP/s" in out


def test_bench_latency_runs_and_writes_json(model_dir: Path, tmp_path: Path, capsys: Any) -> None:
    out_json = tmp_path / "latency.json"
    main(
        [
            "bench",
            "latency",
            "--model",
            str(model_dir),
            *ENGINE_FLAGS,
            "--batch-size",
            "2",
            "--input-len",
            "8",
            "--output-len",
            "4",
            "--num-iters-warmup",
            "1",
            "--num-iters",
            "3",
            "--output-json",
            str(out_json),
        ]
    )
    results = json.loads(out_json.read_text())
    assert len(results["latencies"]) == 3 and all(t > 0 for t in results["latencies"])
    assert results["p10_latency"] <= results["p50_latency"] <= results["p99_latency"]
    assert (
        0 < results["fraction_of_hardware_limit"] < 1
    )  # a tiny model on a CPU: far from an H200's limits
    assert results["compute_floor_seconds"] > 0 and results["memory_floor_seconds"] > 0
    out = capsys.readouterr().out
    assert "Latency: mean" in out and "of the hardware limit (FLOPs at 797 TFLOP/s" in out


def test_random_dataset_lengths_and_seed() -> None:
    requests = random_requests(np.random.default_rng(0), 50, 64, 20, 10, 0.5)
    assert all(10 <= len(r.prompt_token_ids) <= 30 and 5 <= r.output_len <= 15 for r in requests)
    assert len({len(r.prompt_token_ids) for r in requests}) > 1
    assert all(0 <= t < 50 for r in requests for t in r.prompt_token_ids)
    again = random_requests(np.random.default_rng(0), 50, 64, 20, 10, 0.5)
    assert again == requests
    with pytest.raises(ValueError, match="range_ratio must be in"):
        random_requests(np.random.default_rng(0), 50, 4, 20, 10, 1.0)


def test_prefix_repetition_dataset_shares_prefixes() -> None:
    requests = prefix_repetition_requests(
        np.random.default_rng(0),
        1000,
        12,
        prefix_len=16,
        suffix_len=4,
        num_prefixes=3,
        output_len=5,
    )
    assert len(requests) == 12
    assert all(len(r.prompt_token_ids) == 20 and r.output_len == 5 for r in requests)
    prefixes = [tuple(r.prompt_token_ids[:16]) for r in requests]
    assert len(set(prefixes)) == 3 and all(prefixes.count(p) == 4 for p in set(prefixes))
    assert len({tuple(r.prompt_token_ids) for r in requests}) == 12
