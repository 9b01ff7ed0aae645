"""The ``backdrive`` command: ``demo``, ``info``, ``view``, ``bench``."""

from ._main import build_parser, main

__all__ = ["main", "build_parser"]
