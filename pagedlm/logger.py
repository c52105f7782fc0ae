"""The `pagedlm` logger: INFO to stderr unless the application configured it already
(PAGEDLM_LOGGING_LEVEL overrides the level). The entry points call configure_logging() (LLM(),
the `pagedlm` command, the engine-core process); importing pagedlm configures nothing."""

from __future__ import annotations

import logging

from pagedlm import envs


def configure_logging() -> None:
    logger = logging.getLogger("pagedlm")
    if logger.handlers:
        return
    level = envs.PAGEDLM_LOGGING_LEVEL  # first: a bad value leaves the logger as it was
    handler = logging.StreamHandler()
    handler.setFormatter(
        logging.Formatter("%(levelname)s %(asctime)s %(name)s: %(message)s", "%H:%M:%S")
    )
    logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False
