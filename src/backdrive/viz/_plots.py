"""PNG plots of what was optimised, drawn with matplotlib's Agg backend.

Every function writes one PNG of exactly ``size`` pixels (width, height) and
returns its path; parent folders are created. Inputs may be tensors, arrays or
sequences.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import torch

from .._errors import InputError
from ._deps import require

__all__ = [
    "plot_losses",
    "plot_joint_trajectories",
    "plot_ik_errors",
    "plot_parameters",
    "plot_contact_forces",
    "contact_groups",
    "DEFAULT_SIZE",
]

#: Default PNG size in pixels, (width, height).
DEFAULT_SIZE = (960, 600)
_DPI = 100


def _np(x, what: str) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        x = x.detach().to(device="cpu", dtype=torch.float64).numpy()
    try:
        return np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise InputError(f"{what} must be numeric, got {type(x).__name__}") from exc


def _figure(size, nrows: int = 1, ncols: int = 1):
    """A figure of exactly ``size`` pixels on the Agg canvas (no pyplot state)."""
    require("matplotlib", "backdrive.viz plots")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    w, h = (int(v) for v in size)
    if w < 50 or h < 50:
        raise ValueError(f"size must be at least 50 x 50 pixels, got {size}")
    fig = Figure(figsize=(w / _DPI, h / _DPI), dpi=_DPI, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(nrows, ncols, squeeze=False)
    return fig, axes


def _save(fig, path) -> Path:
    out = Path(path)
    if out.suffix.lower() != ".png":
        out = out.with_name(out.name + ".png")
    out.parent.mkdir(parents=True, exist_ok=True)
    # No bbox_inches="tight": it would change the pixel size.
    fig.savefig(out, dpi=_DPI, format="png")
    return out


def plot_losses(
    histories: Mapping[str, Sequence[float]],
    path,
    log: bool = True,
    *,
    title: str = "Loss",
    xlabel: str = "iteration",
    size=DEFAULT_SIZE,
) -> Path:
    """Loss curves, one line per run, e.g. ``{"Adam": [...], "backdrive": [...]}``.

    Args:
        histories: label -> loss per iteration (any length, may differ).
        path: PNG file to write (``.png`` appended when missing).
        log: logarithmic y axis (non-positive values are left out of it).
        size: ``(width, height)`` in pixels.

    Returns:
        The path written.
    """
    if not isinstance(histories, Mapping) or not histories:
        raise InputError("histories must be a non-empty dict of label -> sequence of losses")
    fig, ax = _figure(size)
    ax = ax[0, 0]
    for label, values in histories.items():
        y = _np(values, f"histories[{label!r}]").reshape(-1)
        ax.plot(np.arange(len(y)), y, label=str(label), linewidth=1.6)
        if len(y):
            ax.annotate(f"{y[-1]:.3g}", (len(y) - 1, y[-1]), textcoords="offset points", xytext=(4, 0), fontsize=8)
    if log and any((_np(v, "loss") > 0).any() for v in histories.values()):
        ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("loss")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    return _save(fig, path)


def plot_joint_trajectories(
    t,
    q,
    names: Sequence[str] | None,
    path,
    *,
    title: str = "Joint trajectories",
    ylabel: str = "position [rad or m]",
    lower=None,
    upper=None,
    size=DEFAULT_SIZE,
) -> Path:
    """Each joint coordinate over time, optionally with its limits dashed.

    Args:
        t: ``(T,)`` times in seconds.
        q: ``(T, n)`` joint values.
        names: ``n`` labels (``None`` for ``q0, q1, ...``).
        lower, upper: optional ``(n,)`` limits (infinite values are skipped).
        size: ``(width, height)`` in pixels.
    """
    t = _np(t, "t").reshape(-1)
    q = _np(q, "q")
    if q.ndim == 1:
        q = q[:, None]
    if q.ndim != 2 or q.shape[0] != t.shape[0]:
        raise InputError(f"q must be (T, n) with T = len(t) = {t.shape[0]}, got {q.shape}")
    n = q.shape[1]
    names = [f"q{i}" for i in range(n)] if names is None else [str(x) for x in names]
    if len(names) != n:
        raise InputError(f"{len(names)} names for {n} joint columns")
    fig, ax = _figure(size)
    ax = ax[0, 0]
    lo = None if lower is None else _np(lower, "lower").reshape(-1)
    hi = None if upper is None else _np(upper, "upper").reshape(-1)
    for i in range(n):
        (line,) = ax.plot(t, q[:, i], label=names[i], linewidth=1.5)
        for lim in (lo, hi):
            if lim is not None and i < len(lim) and np.isfinite(lim[i]):
                ax.axhline(lim[i], color=line.get_color(), linestyle=":", linewidth=0.8, alpha=0.6)
    ax.set_xlabel("time [s]")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(ncols=max(1, (n + 7) // 8), fontsize=8, loc="best")
    return _save(fig, path)


def plot_ik_errors(
    pos_err,
    rot_err,
    path,
    *,
    bins: int = 40,
    title: str = "IK errors",
    size=DEFAULT_SIZE,
) -> Path:
    """Histograms of position errors (millimetres) and rotation errors (degrees).

    Args:
        pos_err: ``(N,)`` position errors in metres.
        rot_err: ``(N,)`` rotation errors in radians.
        bins: histogram bins.
        size: ``(width, height)`` in pixels.
    """
    p = _np(pos_err, "pos_err").reshape(-1) * 1e3
    r = np.degrees(_np(rot_err, "rot_err").reshape(-1))
    fig, axes = _figure(size, 1, 2)
    for ax, values, label, unit, colour in (
        (axes[0, 0], p, "position error [mm]", "mm", "tab:blue"),
        (axes[0, 1], r, "rotation error [deg]", "deg", "tab:orange"),
    ):
        finite = values[np.isfinite(values)]
        if len(finite):
            ax.hist(finite, bins=bins, color=colour, alpha=0.85)
            med, worst = np.median(finite), finite.max()
            ax.axvline(med, color="k", linewidth=1)
            ax.set_title(f"median {med:.3g} {unit}, max {worst:.3g} {unit} (n={len(finite)})", fontsize=10)
        else:
            ax.text(0.5, 0.5, "no finite values", ha="center", va="center", transform=ax.transAxes)
        ax.set_xlabel(label)
        ax.set_ylabel("count")
        ax.grid(True, alpha=0.3)
    fig.suptitle(title)
    return _save(fig, path)


def plot_parameters(
    true,
    identified,
    names: Sequence[str] | None,
    path,
    *,
    initial=None,
    title: str = "Identified parameters",
    size=DEFAULT_SIZE,
) -> Path:
    """True versus identified parameters as grouped bars, with relative errors.

    Args:
        true, identified: ``(n,)`` values.
        names: ``n`` labels (``None`` for ``p0, p1, ...``).
        initial: optional ``(n,)`` starting guess, drawn as a third bar.
        size: ``(width, height)`` in pixels.
    """
    a = _np(true, "true").reshape(-1)
    b = _np(identified, "identified").reshape(-1)
    if a.shape != b.shape:
        raise InputError(f"true {a.shape} and identified {b.shape} differ in shape")
    n = a.shape[0]
    names = [f"p{i}" for i in range(n)] if names is None else [str(x) for x in names]
    if len(names) != n:
        raise InputError(f"{len(names)} names for {n} parameters")
    series = [("true", a, "tab:gray"), ("identified", b, "tab:green")]
    if initial is not None:
        c = _np(initial, "initial").reshape(-1)
        if c.shape != a.shape:
            raise InputError(f"initial {c.shape} and true {a.shape} differ in shape")
        series.insert(0, ("initial", c, "tab:red"))
    fig, ax = _figure(size)
    ax = ax[0, 0]
    x = np.arange(n)
    width = 0.8 / len(series)
    for k, (label, values, colour) in enumerate(series):
        ax.bar(x + (k - (len(series) - 1) / 2) * width, values, width, label=label, color=colour)
    rel = np.abs(b - a) / np.maximum(np.abs(a), 1e-12)
    top = np.maximum.reduce([np.maximum(v, 0) for _, v, _ in series])
    for i in range(n):
        ax.annotate(f"{100 * rel[i]:.2g}%", (x[i], top[i]), textcoords="offset points", xytext=(0, 3),
                    ha="center", fontsize=7)
    ax.set_xticks(x, names, rotation=45 if n > 6 else 0, ha="right" if n > 6 else "center", fontsize=8)
    ax.set_ylabel("value")
    ax.set_title(f"{title} (labels: relative error)")
    ax.axhline(0, color="k", linewidth=0.6)
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend()
    return _save(fig, path)


#: Label of a self-collision pair's row in :func:`contact_groups` (left out of the ground reaction sum).
PAIR_LABEL = "self-collision pair"


def contact_groups(groups, num_points: int) -> tuple[list[str], np.ndarray]:
    """Labels and ``(num_points,)`` group index of each contact row.

    Args:
        groups: ``None`` (one group per contact, ``"contact i"``), a
            :class:`~backdrive.contact.ContactGeometry` or
            :class:`~backdrive.contact.ContactModel` (its ground contacts
            grouped by link, then one group per self-collision pair), or a
            sequence of ``num_points`` labels (rows with the same label are
            summed).

    Raises:
        InputError: a geometry or label list that does not match the rows.
    """
    from ..contact import ContactGeometry, ContactModel

    pairs = 0
    if isinstance(groups, ContactModel):
        sc = groups.self_collision
        pairs = 0 if sc is None else sc.num_pairs
        groups = groups.geometry
    if groups is None:
        labels = [f"contact {i}" for i in range(num_points)]
    elif isinstance(groups, ContactGeometry):
        labels = [groups.shapes[int(s)].link for s in groups.point_shape.tolist()]
        labels += [f"{PAIR_LABEL} {k}" for k in range(pairs)]
    elif isinstance(groups, (list, tuple)) and all(isinstance(x, str) for x in groups):
        labels = list(groups)
    else:
        raise InputError(
            "groups must be None, a ContactGeometry, a ContactModel or a list of labels (one per contact), "
            f"got {type(groups).__name__}"
        )
    if len(labels) != num_points:
        raise InputError(f"groups name {len(labels)} contacts, the contact result has {num_points}")
    names = list(dict.fromkeys(labels))
    return names, np.array([names.index(x) for x in labels], dtype=np.int64)


def plot_contact_forces(
    trajectory,
    path,
    *,
    groups=None,
    weight: float | None = None,
    dt: float | None = None,
    batch_index=None,
    events: Mapping[str, float] | None = None,
    title: str = "Ground reaction forces",
    size=DEFAULT_SIZE,
) -> Path:
    """Normal force per foot and their sum against the weight, and slip speed, over time.

    Top panel: the normal force of each group of contacts (a foot, a link),
    the sum of the ground contacts (black; self-collision pairs of a
    ContactModel are drawn but not summed) and the weight (dashed), N. Bottom panel: each group's
    slip speed, the tangential speed of its contact points averaged with
    their normal forces as weights, m/s, drawn only while the group carries at
    least 1 % of the largest normal force in the plot (a foot in the air has
    no slip). Step ``t`` is drawn at time ``t * dt``, the start of the step it
    acts over.

    Args:
        trajectory: a :class:`~backdrive.sim.Trajectory` made with contact
            (its ``contact`` and ``dt``) or a
            :class:`~backdrive.contact.ContactResult` with a time axis (then
            ``dt`` is needed).
        path: PNG file to write (``.png`` appended when missing).
        groups: how contact rows become lines (:func:`contact_groups`):
            ``None`` (each contact), a ``ContactGeometry`` or ``ContactModel``
            (by link) or a list of labels.
        weight: N, drawn as a dashed line (``float(robot.total_mass) * 9.81``),
            or ``None``.
        dt: step length, s (for a ContactResult; a Trajectory has its own).
        batch_index: which rollout of a batched result (an int or one index
            per batch axis).
        events: label -> time (s) of moments to mark with a vertical line
            (``{"push": 0.4}``).
        size: ``(width, height)`` in pixels.

    Returns:
        The path written.

    Raises:
        InputError: no contact in the trajectory, a missing or bad ``dt``,
            mismatched groups, a bad weight or batch index.
    """
    import math

    from ..contact import ContactResult
    from ..sim import Trajectory
    from ._contact import contact_arrays, group_series

    if isinstance(trajectory, Trajectory):
        if trajectory.contact is None:
            raise InputError("the trajectory holds no contact: simulate it with Simulator(..., contact=ContactModel(...))")
        contact, dt = trajectory.contact, trajectory.dt if dt is None else dt
    elif isinstance(trajectory, ContactResult):
        contact = trajectory
    else:
        raise InputError(
            f"trajectory must be a backdrive.sim.Trajectory or a ContactResult, got {type(trajectory).__name__}"
        )
    if not (isinstance(dt, (int, float)) and math.isfinite(dt) and dt > 0):
        raise InputError(f"dt must be a positive number of seconds, got {dt!r}")
    if weight is not None and not (isinstance(weight, (int, float)) and math.isfinite(weight) and weight > 0):
        raise InputError(f"weight must be a positive number of newtons or None, got {weight!r}")
    events = dict(events or {})
    for label, when in events.items():
        if not (isinstance(when, (int, float)) and math.isfinite(when)):
            raise InputError(f"events must map labels to times in seconds; {label!r} has {when!r}")
    c = contact_arrays(contact, batch_index=batch_index)
    names, index = contact_groups(groups, c.num_points)
    t = np.arange(c.steps) * float(dt)
    k = len(names)
    fn, slip = group_series(c, index, k)
    fig, axes = _figure(size, 2, 1)
    top, bottom = axes[0, 0], axes[1, 0]
    bottom.sharex(top)
    for g in range(k):
        (line,) = top.plot(t, fn[:, g], label=names[g], linewidth=1.3)
        bottom.plot(t, slip[:, g], color=line.get_color(), linewidth=1.3)
    # Self-collision rows are forces between links, not ground reaction.
    ground = [g for g in range(k) if not names[g].startswith(PAIR_LABEL)]
    total = fn[:, ground].sum(1)
    top.plot(t, total, color="k", linewidth=1.8, label="sum")
    if weight is not None:
        top.axhline(weight, color="k", linestyle="--", linewidth=1.0, label=f"weight {weight:.1f} N")
    for label, when in events.items():
        for ax in (top, bottom):
            ax.axvline(float(when), color="tab:red", linestyle=":", linewidth=1.0)
        top.annotate(str(label), (float(when), 1.0), xycoords=("data", "axes fraction"), xytext=(3, -12),
                     textcoords="offset points", color="tab:red", fontsize=8)
    top.set_ylabel("normal force [N]")
    top.set_title(title)
    top.grid(True, alpha=0.3)
    top.legend(ncols=max(1, (k + 2 + 5) // 6), fontsize=8, loc="best")
    bottom.set_ylabel("slip speed [m/s]")
    bottom.set_xlabel("time [s]")
    bottom.grid(True, alpha=0.3)
    if not np.isfinite(slip).any():
        bottom.text(0.5, 0.5, "no contact carries load", ha="center", va="center", transform=bottom.transAxes)
    return _save(fig, path)
