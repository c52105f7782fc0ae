"""The `pagedlm` logger: INFO to stderr unless the application configured it already
(PAGEDLM_LOGGING_LEVEL overrides the level)."""
from __future__ import annotations

import logging
import os


def configure_logging() -> None:
    logger = logging.getLogger("pagedlm")
    if logger.handlers:
        return
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(levelname)s %(asctime)s %(name)s: %(message)s", "%H:%M:%S"))
    logger.addHandler(handler)
    logger.setLevel(os.environ.get("PAGEDLM_LOGGING_LEVEL", "INFO").upper())
    logger.propagate = False
