"""Optional dependencies of :mod:`backdrive.viz`, imported only when used."""

from __future__ import annotations

import importlib
from types import ModuleType

from .._errors import MissingExtraError

__all__ = ["MissingExtraError", "require"]


def require(module: str, feature: str) -> ModuleType:
    """Import ``module`` or raise :class:`MissingExtraError` naming the extra.

    Args:
        module: importable name, e.g. ``"viser"`` or ``"matplotlib"``.
        feature: what needs it, for the message (``"backdrive.viz.preview"``).
    """
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        top = module.split(".")[0]
        raise MissingExtraError(
            f"{feature} needs the optional package {top!r}, which is not installed. "
            f"Install the visualisation extra: pip install 'backdrive[viz]'"
        ) from exc
