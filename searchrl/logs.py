"""Logging set-up, called once by entry points (CLI, server); library modules only call getLogger."""

from __future__ import annotations

import logging
import os
import sys
from typing import TextIO


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever sys.stderr is at emit time (pytest and tools swap it after set-up)."""

    @property
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, value: object) -> None:
        pass


def setup_logging(level: str | None = None) -> None:
    """Send log records to stderr (stdout carries results only), at SEARCHRL_LOG_LEVEL or INFO."""
    level_name = (level or os.environ.get("SEARCHRL_LOG_LEVEL") or "INFO").upper()
    root = logging.getLogger()
    if any(getattr(h, "_searchrl", False) for h in root.handlers):
        root.setLevel(level_name)
        return
    handler = _StderrHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S"))
    handler._searchrl = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    root.setLevel(level_name)


__all__ = ["setup_logging"]
