"""`pagedlm serve`, the offline `pagedlm bench throughput` and LLM(...) turn the same engine
flags into the same EngineConfig (the server's core process gets that config as it is), so a
serving run and an offline run on the same flags compare the same engine (issue 4)."""

from __future__ import annotations

from pathlib import Path

from pagedlm.cli import build_parser
from pagedlm.config import EngineArgs, default_model_path


def test_serve_and_offline_build_the_same_engine_config(tiny_model_dir: Path) -> None:
    flags = ["--model", str(tiny_model_dir), "--tokenizer", default_model_path()]
    parser = build_parser()
    serve = EngineArgs.from_cli_args(parser.parse_args(["serve", *flags])).create_engine_config()
    offline = EngineArgs.from_cli_args(parser.parse_args(["bench", "throughput", *flags]))
    llm_args = EngineArgs(model=str(tiny_model_dir), tokenizer=default_model_path())
    assert serve == offline.create_engine_config()
    assert serve == llm_args.create_engine_config()  # what LLM(model, tokenizer=...) builds
    assert serve.scheduler.async_scheduling is False  # CPU: sync in both processes
