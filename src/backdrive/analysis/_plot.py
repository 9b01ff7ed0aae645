"""Heatmap of a sensitivity: joints by time, contact phases shaded (matplotlib, imported lazily)."""

from __future__ import annotations

import importlib
from pathlib import Path

import numpy as np

from .._errors import InputError, MissingExtraError

__all__ = ["plot_sensitivity"]

_DPI = 100


def _require(module: str, feature: str):
    # The same pattern as backdrive.viz: optional packages are imported on use
    # and their absence names the extra to install.
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingExtraError(
            f"{feature} needs the optional package {module.split('.')[0]!r}, which is not installed. "
            "Install the visualisation extra: pip install 'backdrive[viz]'"
        ) from exc


def plot_sensitivity(sens, path, *, size=(1100, 640), contact_threshold: float = 1.0, highlight=()) -> Path:
    """Write a PNG heatmap of ``d metric / d command`` (joints by time) with contact phases.

    The top panel shows the signed gradient per driven joint and step on a
    symmetric diverging scale (red: raising the command raises the metric).
    The bottom strip shows, per contact row, the steps in which it carries
    more than ``contact_threshold`` N; the same phases shade the heatmap's
    time axis where every contact is off (flight). ``highlight`` report
    entries are outlined.

    Args:
        sens: :class:`~backdrive.analysis.Sensitivity`.
        path: output file (``.png`` appended if missing).
        size: ``(width, height)`` in pixels.

    Returns:
        The written path.
    """
    _require("matplotlib", "backdrive.analysis.plot_sensitivity")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import Rectangle

    w, h = (int(v) for v in size)
    if w < 200 or h < 200:
        raise InputError(f"size must be at least 200 x 200 pixels, got {size}")
    g = sens.controls.detach().cpu().numpy().T  # (nu, T)
    active = sens.contact_active(contact_threshold).cpu().numpy().T  # (np, T)
    T = g.shape[1]
    dt_ms = 1e3 * sens.dt
    extent_t = (0.0, T * dt_ms)
    fig = Figure(figsize=(w / _DPI, h / _DPI), dpi=_DPI, layout="constrained")
    FigureCanvasAgg(fig)
    n_c = active.shape[0]
    if n_c:
        ax, axc = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [max(len(g), 1), max(n_c, 1) * 0.6]})
    else:
        ax, axc = fig.subplots(1, 1), None
    vmax = float(np.abs(g).max()) or 1.0
    im = ax.imshow(g, aspect="auto", cmap="RdBu_r", vmin=-vmax, vmax=vmax, interpolation="nearest",
                   extent=(*extent_t, len(g) - 0.5, -0.5))
    ax.set_yticks(range(len(g)), labels=list(sens.joint_names))
    ax.set_title(f"d {sens.metric_name} / d command ({sens.control_unit}), per step")
    fig.colorbar(im, ax=ax, label=f"{sens.metric_name} per {sens.control_unit}")
    if n_c:
        # flight phases (no contact loaded) hatched over the heatmap, one span per run of steps
        flight = np.concatenate([[False], ~active.any(0), [False]])
        edges = np.nonzero(np.diff(flight.astype(int)))[0]
        for a, b in zip(edges[0::2], edges[1::2]):
            ax.axvspan(a * dt_ms, b * dt_ms, facecolor="none", edgecolor="0.4", hatch="//", lw=0, zorder=3)
        axc.imshow(active.astype(float), aspect="auto", cmap="Greys", vmin=0, vmax=1.5, interpolation="nearest",
                   extent=(*extent_t, n_c - 0.5, -0.5))
        axc.set_yticks(range(n_c), labels=list(sens.contact_names))
        axc.set_xlabel("time (ms); grey: contact carries load; hatched above: no contact loaded")
        axc.set_title("contact phases", fontsize="small")
    else:
        ax.set_xlabel("time (ms)")
    for e in highlight:
        j = list(sens.joint_names).index(e.joint)
        ax.add_patch(Rectangle((1e3 * e.t_start, j - 0.5), 1e3 * (e.t_stop - e.t_start), 1.0, fill=False,
                               edgecolor="k", lw=1.2))
        ax.annotate(str(e.rank), (1e3 * e.t_start, j - 0.5), fontsize="x-small", va="bottom")
    out = Path(path)
    if out.suffix.lower() != ".png":
        out = out.with_name(out.name + ".png")
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=_DPI, format="png")
    return out
