"""pagedlm/envs.py: the one registry of environment variables, read on access."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from pagedlm import envs
from pagedlm.logger import configure_logging

PACKAGE = Path(envs.__file__).parent
# Files that read the environment themselves, and why.
OWN_READS = {
    "bench/serve.py": "OPENAI_API_KEY, the OpenAI clients' convention, as the --api-key default",
    "distributed/launcher_env.py": "RANK, WORLD_SIZE, LOCAL_RANK: torchrun's convention, for "
    "distributed_executor_backend='external_launcher'",
}


def test_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in envs.ENVIRONMENT_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    assert (
        envs.PAGEDLM_LOGGING_LEVEL,
        envs.PAGEDLM_ALLOW_LONG_MAX_MODEL_LEN,
        envs.PAGEDLM_FUSE_NORMS,
        envs.PAGEDLM_PDL,
        envs.PAGEDLM_FREE_SLIDING_WINDOW,
        envs.PAGEDLM_SPLIT_LARGE_DECODE,
        envs.PAGEDLM_PREFILL_SPREAD,
        envs.TRITON_INTERPRET,
    ) == ("INFO", False, True, True, True, True, False, False)


def test_read_on_access(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PAGEDLM_PDL", "0")
    assert envs.PAGEDLM_PDL is False
    monkeypatch.setenv("PAGEDLM_PDL", "ON")
    assert envs.PAGEDLM_PDL is True
    monkeypatch.setenv("PAGEDLM_PDL", "")  # empty: the default
    assert envs.PAGEDLM_PDL is True
    monkeypatch.setenv("PAGEDLM_LOGGING_LEVEL", "debug")
    assert envs.PAGEDLM_LOGGING_LEVEL == "DEBUG"


@pytest.mark.parametrize(
    "name, value",
    [
        ("PAGEDLM_FUSE_NORMS", "2"),
        ("PAGEDLM_ALLOW_LONG_MAX_MODEL_LEN", "maybe"),
        ("PAGEDLM_LOGGING_LEVEL", "LOUD"),
    ],
)
def test_a_bad_value_names_the_variable(
    name: str, value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=rf"environment variable {name}='{value}': must be one of"):
        getattr(envs, name)


@pytest.mark.parametrize("value", ["1", "0", "", "true", "Y", "on", "2", "off"])
def test_triton_interpret_is_read_as_triton_reads_it(
    value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from triton._C.libtriton import getenv_bool

    monkeypatch.setenv("TRITON_INTERPRET", value)
    assert envs.TRITON_INTERPRET == getenv_bool("TRITON_INTERPRET", False)


def test_every_variable_is_documented() -> None:
    assert set(envs.ENVIRONMENT_VARIABLES) <= set(dir(envs))
    for name, var in envs.ENVIRONMENT_VARIABLES.items():
        assert var.name == name and len(var.doc) > 20
        assert f"{name} (default {var.default}): " in envs.__doc__
    with pytest.raises(AttributeError, match="no attribute 'PAGEDLM_NOPE'"):
        envs.PAGEDLM_NOPE  # noqa: B018


@pytest.fixture
def bare_logger() -> Iterator[logging.Logger]:
    """The `pagedlm` logger unconfigured, restored afterwards (setLevel clears logging's caches)."""
    logger = logging.getLogger("pagedlm")
    saved = logger.handlers[:], logger.level, logger.propagate
    logger.handlers, logger.propagate = [], True
    logger.setLevel(logging.NOTSET)
    yield logger
    logger.handlers, logger.propagate = saved[0], saved[2]
    logger.setLevel(saved[1])


def test_configure_logging_takes_the_level_from_the_registry(
    bare_logger: logging.Logger, monkeypatch: pytest.MonkeyPatch
) -> None:
    logger = bare_logger
    monkeypatch.setenv("PAGEDLM_LOGGING_LEVEL", "LOUD")
    with pytest.raises(ValueError, match="PAGEDLM_LOGGING_LEVEL"):
        configure_logging()
    assert logger.handlers == []  # a bad level configures nothing
    monkeypatch.setenv("PAGEDLM_LOGGING_LEVEL", "warning")
    configure_logging()
    assert logger.level == logging.WARNING and len(logger.handlers) == 1 and not logger.propagate


def test_only_the_registry_reads_the_environment() -> None:
    reads = re.compile(r"os\.environ\b|os\.getenv\b|getenv\(")
    readers = {
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        if reads.search(path.read_text()) and path.name != "envs.py"
    }
    assert readers <= set(OWN_READS), sorted(readers - set(OWN_READS))
