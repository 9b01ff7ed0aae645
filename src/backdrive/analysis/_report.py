"""Ranked sensitivity reports, each entry checked by re-simulation."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from .._errors import InputError

__all__ = ["SensitivityReport", "ReportEntry", "ParameterCheck", "LinearityCheck", "build_report", "check_linearity", "resimulate"]

#: Relative tolerance below which a linear prediction counts as confirmed.
DEFAULT_TOLERANCE = 0.10


def _default_size(sens) -> float:
    """Default command change of a report entry.

    PD targets: 3 mrad per 20 ms window, where most of the quadruped's top
    entries still re-simulate within 10 % (docs/analysis.md gives the
    measured agreement against the size). Torques: 1 % of the largest
    command magnitude in the rollout (effort limits are often far above the
    torques used), else 0.1 N m.
    """
    if sens.control_unit == "rad":
        return 3e-3
    peak = float(sens.nominal_controls.abs().max())
    return 0.01 * peak if peak > 0 else 0.1


def resimulate(sens, deltas: torch.Tensor, contact_threshold: float = 1.0):
    """Re-run the nominal rollout with ``controls + deltas`` in one batched rollout.

    Args:
        sens: a :class:`~backdrive.analysis.Sensitivity`.
        deltas: ``(N, T, nu)`` control perturbations.
        contact_threshold: N; a contact row is active in a step where its normal force exceeds it.

    Returns:
        ``(nominal value, values (N,), switched (N,) bool)``: the metric of
        the nominal and perturbed rollouts (simulated together, so that both
        carry the same rounding) and whether any contact row changed between
        active and inactive in any step.
    """
    from ..sim import State

    u0 = sens.nominal_controls
    if deltas.ndim != 3 or deltas.shape[1:] != u0.shape:
        raise InputError(f"deltas must have shape (N, {u0.shape[0]}, {u0.shape[1]}), got {tuple(deltas.shape)}")
    u = torch.cat([u0.unsqueeze(0), u0 + deltas.to(u0)], dim=0)
    sim = sens.sim
    with torch.no_grad():
        traj = sim.rollout(State(sens.q0, sens.v0), u)
        vals = sens.metric(traj)
        if not isinstance(vals, torch.Tensor) or vals.shape != (u.shape[0],):
            # a callable metric written for one rollout: score them one by one
            vals = torch.stack([sens.metric(sim.rollout(State(sens.q0, sens.v0), ui)).reshape(()) for ui in u])
    if traj.contact is not None:
        active = traj.contact.normal_force > contact_threshold  # (N + 1, T, np)
        switched = (active[1:] != active[:1]).flatten(1).any(-1)
    else:
        switched = torch.zeros(u.shape[0] - 1, dtype=torch.bool)
    vals = vals.to(torch.float64).cpu()
    return float(vals[0]), (vals[1:] - 0.0), switched.cpu()


def _agrees(predicted: float, actual: float, tol: float) -> bool:
    # relative to the larger of the two, so that neither a tiny prediction
    # nor a tiny actual change passes by accident
    scale = max(abs(predicted), abs(actual))
    return scale > 0 and abs(actual - predicted) <= tol * scale


@dataclass(frozen=True)
class ReportEntry:
    """One ranked entry: change one joint's command over a time window.

    Attributes:
        rank: 1 for the most sensitive.
        joint: driven joint name.
        start_step, stop_step: the window ``[start, stop)`` of steps.
        t_start, t_stop: the window in seconds.
        gradient: d metric / d command summed over the window (metric unit per control unit).
        change: the signed command change applied over the window (control unit).
        predicted: linear prediction of the metric change (metric unit).
        actual: re-simulated metric change (``nan`` when not verified).
        contact_switch: a contact became active or inactive in the perturbed rollout.
        agrees: ``|actual - predicted| <= tol * max(|actual|, |predicted|)``.
    """

    rank: int
    joint: str
    start_step: int
    stop_step: int
    t_start: float
    t_stop: float
    gradient: float
    change: float
    predicted: float
    actual: float
    contact_switch: bool
    agrees: bool

    @property
    def status(self) -> str:
        """``ok``, ``ok (contact switch)``, ``contact switch``, ``nonlinear`` or ``not checked``."""
        if math.isnan(self.actual):
            return "not checked"
        return _status(self.agrees, self.contact_switch)


@dataclass(frozen=True)
class ParameterCheck:
    """One physical-parameter element changed by ``relative`` of its value and re-simulated.

    Attributes:
        name, element: parameter name and element label (body, joint, shape or ``all``).
        index: flat index of the element in the parameter tensor.
        value: nominal value; change: the applied change (same unit).
        predicted, actual: metric change, linear and re-simulated.
        contact_switch, agrees: as for :class:`ReportEntry`.
    """

    name: str
    element: str
    index: int
    value: float
    change: float
    predicted: float
    actual: float
    contact_switch: bool
    agrees: bool

    @property
    def status(self) -> str:
        """``ok``, ``ok (contact switch)``, ``contact switch`` or ``nonlinear``."""
        return _status(self.agrees, self.contact_switch)


def _status(agrees: bool, contact_switch: bool) -> str:
    """How a re-simulated change compares with its linear prediction, in words."""
    if agrees:
        return "ok (contact switch)" if contact_switch else "ok"
    return "contact switch" if contact_switch else "nonlinear"


@dataclass(frozen=True, eq=False)
class SensitivityReport:
    """A ranked list of the most effective command changes, checked by re-simulation.

    Attributes:
        sensitivity: the :class:`~backdrive.analysis.Sensitivity` it ranks.
        entries: :class:`ReportEntry` list, most sensitive first.
        window: steps per entry; size: command change per entry (control unit);
        goal: ``"decrease"`` or ``"increase"`` the metric; tolerance: relative.
    """

    sensitivity: object
    entries: list
    window: int
    size: float
    goal: str
    tolerance: float
    contact_threshold: float
    metric_unit: str = ""
    notes: list = field(default_factory=list)
    parameter_checks: list = field(default_factory=list)

    @property
    def best(self) -> ReportEntry:
        """The entry whose re-simulated change moves the metric furthest towards ``goal``
        (the top entry when nothing was re-simulated)."""
        checked = [e for e in self.entries if not math.isnan(e.actual)]
        if not checked:
            return self.entries[0]
        sign = 1.0 if self.goal == "increase" else -1.0
        return max(checked, key=lambda e: sign * e.actual)

    def sentence(self, e: ReportEntry) -> str:
        """The entry in plain words."""
        s = self.sensitivity
        what = "target" if s.control_unit == "rad" else "torque"
        verb = "raise" if e.change > 0 else "lower"
        base = abs(s.value) if s.value != 0 else 1.0
        text = (
            f"{verb} the {e.joint} {what} by {abs(e.change):.3g} {s.control_unit} from "
            f"{1e3 * e.t_start:.0f} to {1e3 * e.t_stop:.0f} ms: {s.metric_name} changes by "
            f"{e.predicted:+.3g}{self.metric_unit} ({100 * e.predicted / base:+.2f} %) predicted"
        )
        if not math.isnan(e.actual):
            text += f", {e.actual:+.3g}{self.metric_unit} ({100 * e.actual / base:+.2f} %) re-simulated [{e.status}]"
        return text

    def lines(self) -> list[str]:
        """One plain-words line per entry."""
        return [f"{e.rank}. {self.sentence(e)}" for e in self.entries]

    def to_markdown(self) -> str:
        """The report as markdown: header, table, parameter and initial-state sensitivities."""
        s = self.sensitivity
        checked = [e for e in self.entries if not math.isnan(e.actual)]
        out = [
            f"# Sensitivity of {s.metric_name}",
            "",
            f"- metric value: {s.value:.6g}{self.metric_unit}",
            f"- rollout: {s.trajectory.horizon} steps of {1e3 * s.dt:g} ms; controls: {s.control_unit} "
            f"({'PD targets' if s.control_unit == 'rad' else 'torques'})",
            f"- each entry changes one joint's command by {self.size:g} {s.control_unit} over "
            f"{self.window} step(s) ({1e3 * self.window * s.dt:g} ms), in the direction that should "
            f"{self.goal} the metric",
            f"- checked by re-simulation: {sum(e.agrees for e in checked)} of {len(checked)} agree within "
            f"{100 * self.tolerance:g} %; {sum(e.contact_switch for e in checked)} change a contact "
            f"(normal force crossing {self.contact_threshold:g} N)",
            "",
            "| rank | joint | time (ms) | change | d metric / d command | predicted | re-simulated | error | check |",
            "| ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | --- |",
        ]
        for e in self.entries:
            err = (
                f"{100 * abs(e.actual - e.predicted) / max(abs(e.predicted), abs(e.actual), 1e-300):.1f} %"
                if not math.isnan(e.actual) else "-"
            )
            act = f"{e.actual:+.4g}" if not math.isnan(e.actual) else "-"
            out.append(
                f"| {e.rank} | {e.joint} | {1e3 * e.t_start:.0f}-{1e3 * e.t_stop:.0f} | "
                f"{e.change:+.3g} {s.control_unit} | {e.gradient:+.4g} | {e.predicted:+.4g} | {act} | {err} | {e.status} |"
            )
        out += ["", "In words:", ""] + [f"{ln}" for ln in self.lines()]
        if checked:
            out += ["", f"Best re-simulated change: {self.sentence(self.best)}."]
        if s.parameters:
            out += [
                "",
                "## Physical parameters",
                "",
                "| parameter | element | value | d metric / d parameter | predicted change for +1 % |",
                "| --- | --- | ---: | ---: | ---: |",
            ]
            for name, g in s.parameters.items():
                val = s.parameter_values[name].expand_as(g).reshape(-1)
                labels = _parameter_labels(s, name, g.numel())
                for lab, x, gi in zip(labels, val.tolist(), g.reshape(-1).tolist()):
                    out.append(f"| {name} | {lab} | {x:.4g} | {gi:+.4g} | {0.01 * x * gi:+.4g} |")
            if self.parameter_checks:
                out += [
                    "",
                    "Re-simulated (the largest predicted effects):",
                    "",
                    "| parameter | element | change | predicted | re-simulated | check |",
                    "| --- | --- | ---: | ---: | ---: | --- |",
                ]
                for c in self.parameter_checks:
                    out.append(
                        f"| {c.name} | {c.element} | {c.change:+.4g} | {c.predicted:+.4g} | {c.actual:+.4g} | {c.status} |"
                    )
        out += [
            "",
            "## Initial state",
            "",
            f"- |d metric / d q0| = {float(s.initial_q.norm()):.4g}, |d metric / d v0| = {float(s.initial_v.norm()):.4g}",
        ]
        if s.initial_v.numel():
            k = int(s.initial_v.abs().argmax())
            out.append(f"- most sensitive initial velocity coordinate: {k} ({float(s.initial_v[k]):+.4g} per m/s or rad/s)")
        out += self.notes
        return "\n".join(out) + "\n"

    def save(self, out_dir, *, heatmap: bool = True, preview: bool = False) -> dict:
        """Write ``report.md``, ``sensitivity.npz``, ``heatmap.png`` (matplotlib) and, with
        ``preview``, ``preview.html`` (viser: the rollout with the 3 most sensitive joints traced).

        Returns:
            ``{"report": path, "gradients": path, "heatmap": path or None, "preview": path or None}``.
        """
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        paths = {"report": out / "report.md", "gradients": out / "sensitivity.npz", "heatmap": None, "preview": None}
        paths["report"].write_text(self.to_markdown())
        s = self.sensitivity
        np.savez(
            paths["gradients"],
            controls=s.controls.cpu().numpy(),
            initial_q=s.initial_q.cpu().numpy(),
            initial_v=s.initial_v.cpu().numpy(),
            value=np.float64(s.value),
            joint_names=np.array(s.joint_names),
            contact_active=s.contact_active(self.contact_threshold).cpu().numpy(),
            **{f"parameter.{k}": g.cpu().numpy() for k, g in s.parameters.items()},
        )
        if heatmap:
            from ._plot import plot_sensitivity

            paths["heatmap"] = plot_sensitivity(s, out / "heatmap.png", contact_threshold=self.contact_threshold,
                                                highlight=self.entries)
        if preview:
            from ._preview import preview_sensitivity

            paths["preview"] = preview_sensitivity(s, out / "preview.html")
        return paths


def _parameter_labels(s, name: str, n: int) -> list[str]:
    robot = s.sim.robot
    if name in ("kp", "kd") and n == len(s.joint_names):
        return list(s.joint_names)
    if robot is not None and name in ("body_mass",) and n == robot.num_bodies:
        return list(robot.body_names) if hasattr(robot, "body_names") else [str(i) for i in range(n)]
    if robot is not None and name in ("damping", "friction", "armature") and n == robot.num_joints:
        return list(robot.joint_names)
    if name.startswith("contact.") and s.sim.contact is not None and n == s.sim.contact.geometry.num_shapes:
        return list(s.sim.contact.geometry.shape_links)
    return ["all"] if n == 1 else [str(i) for i in range(n)]


_UNITS = {
    "foot_slip": " m", "final_base_height": " m", "tracking_error": " rad^2 s", "peak_contact_force": " N",
    "energy": " J", "end_effector_error": " m",
}


def window_gradients(sens, window: int) -> torch.Tensor:
    """``(K, nu)`` gradient summed over windows of ``window`` steps (the last may be shorter)."""
    g = sens.controls
    T = g.shape[0]
    K = -(-T // window)
    pad = torch.zeros(K * window - T, g.shape[1], dtype=g.dtype, device=g.device)
    return torch.cat([g, pad]).reshape(K, window, -1).sum(1)


def build_report(
    sens,
    top: int = 10,
    *,
    window: int | None = None,
    size: float | None = None,
    goal: str = "decrease",
    verify: bool = True,
    tolerance: float = DEFAULT_TOLERANCE,
    contact_threshold: float = 1.0,
    parameter_checks: int = 3,
    parameter_change: float = 0.01,
) -> SensitivityReport:
    """Rank (joint, time window) command changes by their effect and check the top ones.

    Each candidate changes one driven joint's command by ``size`` over one
    window of ``window`` steps, in the direction that moves the metric
    towards ``goal``. The linear prediction is ``gradient * change``; with
    ``verify`` every listed entry is re-simulated (all in one batched
    rollout) and the actual change is put beside it. An entry whose
    perturbed rollout makes or breaks a contact (normal force crossing
    ``contact_threshold``) in any step is marked: linear prediction is not to
    be trusted across such a switch.

    Args:
        sens: :class:`~backdrive.analysis.Sensitivity`.
        top: number of entries (>= 1).
        window: steps per entry; default ``round(0.02 s / dt)`` (20 ms), within ``[1, T]``.
        size: command change (rad for PD targets, N m for torques); default
            3e-3 rad, or 1 % of the largest torque command of the rollout.
        goal: ``"decrease"`` or ``"increase"``.
        verify: re-simulate the entries.
        tolerance: relative agreement threshold for ``agrees``.
        contact_threshold: N.
        parameter_checks: with ``verify``, re-simulate this many physical-parameter
            elements (those with the largest predicted effect of a relative change
            ``parameter_change``; one rollout each).
        parameter_change: relative change of a checked parameter (0.01: +1 %).

    Raises:
        InputError: ``top``, ``window``, ``size`` or ``goal`` out of range.
    """
    T, nu = sens.controls.shape
    if not isinstance(top, int) or top < 1:
        raise InputError(f"top must be a positive integer, got {top!r}")
    if window is None:
        window = min(T, max(1, round(0.02 / sens.dt)))
    if not isinstance(window, int) or not 1 <= window <= T:
        raise InputError(f"window must be an integer number of steps in [1, {T}], got {window!r}")
    size = _default_size(sens) if size is None else size
    if not (isinstance(size, (int, float)) and math.isfinite(size) and size > 0):
        raise InputError(f"size must be a positive finite command change, got {size!r}")
    if goal not in ("decrease", "increase"):
        raise InputError(f"goal must be 'decrease' or 'increase', got {goal!r}")
    gw = window_gradients(sens, window)  # (K, nu)
    order = torch.argsort(gw.abs().flatten(), descending=True)[: min(top, gw.numel())]
    sign = -1.0 if goal == "decrease" else 1.0
    rows = []
    for flat in order.tolist():
        k, j = divmod(flat, nu)
        g = float(gw[k, j])
        change = sign * math.copysign(size, g) if g != 0 else size
        start, stop = k * window, min((k + 1) * window, T)
        rows.append((k, j, start, stop, g, change, g * change))
    actual = [math.nan] * len(rows)
    switched = [False] * len(rows)
    if verify and rows:
        deltas = torch.zeros(len(rows), T, nu, dtype=sens.controls.dtype, device=sens.controls.device)
        for i, (_, j, start, stop, _, change, _) in enumerate(rows):
            deltas[i, start:stop, j] = change
        nominal, vals, sw = resimulate(sens, deltas, contact_threshold)
        actual = (vals - nominal).tolist()
        switched = sw.tolist()
    entries = [
        ReportEntry(
            rank=i + 1, joint=sens.joint_names[j], start_step=start, stop_step=stop,
            t_start=start * sens.dt, t_stop=stop * sens.dt, gradient=g, change=change, predicted=pred,
            actual=actual[i], contact_switch=bool(switched[i]),
            agrees=not math.isnan(actual[i]) and _agrees(pred, actual[i], tolerance),
        )
        for i, (k, j, start, stop, g, change, pred) in enumerate(rows)
    ]
    pchecks = (
        _check_parameters(sens, parameter_checks, parameter_change, tolerance, contact_threshold)
        if verify and sens.parameters and parameter_checks > 0 else []
    )
    return SensitivityReport(
        sensitivity=sens, entries=entries, window=window, size=float(size), goal=goal, tolerance=tolerance,
        contact_threshold=contact_threshold, metric_unit=_UNITS.get(sens.metric_name, ""),
        parameter_checks=pchecks,
    )


def _check_parameters(sens, count: int, rel: float, tol: float, threshold: float) -> list:
    """Re-simulate the ``count`` parameter elements with the largest predicted effect of a ``rel`` change."""
    from ..sim import State
    from ._sensitivity import _with_parameters

    cands = []
    for name, g in sens.parameters.items():
        val = sens.parameter_values[name].expand_as(g).reshape(-1)
        labels = _parameter_labels(sens, name, g.numel())
        for i, (x, gi) in enumerate(zip(val.tolist(), g.reshape(-1).tolist())):
            if x != 0.0:
                cands.append((abs(rel * x * gi), name, labels[i], i, x, gi))
    cands.sort(key=lambda c: -c[0])
    out = []
    sim = sens.sim
    with torch.no_grad():
        nominal = sim.rollout(State(sens.q0, sens.v0), sens.nominal_controls)
        f0 = float(sens.metric(nominal))
        act0 = nominal.contact.normal_force > threshold if nominal.contact is not None else None
        for _, name, label, i, x, gi in cands[:count]:
            values = {k: v.clone() for k, v in sens.parameter_values.items()}
            flat = values[name].expand_as(sens.parameters[name]).clone()
            flat.view(-1)[i] = x * (1.0 + rel)
            values[name] = flat
            psim, _ = _with_parameters(sim, list(values), values)
            traj = psim.rollout(State(sens.q0, sens.v0), sens.nominal_controls)
            actual = float(sens.metric(traj)) - f0
            switched = act0 is not None and bool(((traj.contact.normal_force > threshold) != act0).any())
            pred = gi * x * rel
            out.append(ParameterCheck(name, label, i, x, x * rel, pred, actual, switched, _agrees(pred, actual, tol)))
    return out


@dataclass(frozen=True, eq=False)
class LinearityCheck:
    """Predicted vs re-simulated metric change along random command perturbations.

    Attributes:
        predicted, actual: ``(N,)`` metric changes.
        relative_error: ``(N,)`` ``|actual - predicted| / max(|actual|, |predicted|)``.
        contact_switch: ``(N,)`` bool, a contact switched in the perturbed rollout.
        agrees: ``(N,)`` bool, relative error within ``tolerance``.
    """

    predicted: np.ndarray
    actual: np.ndarray
    relative_error: np.ndarray
    contact_switch: np.ndarray
    agrees: np.ndarray
    size: float
    tolerance: float

    @property
    def num_agree(self) -> int:
        return int(self.agrees.sum())

    def to_markdown(self) -> str:
        rows = ["| case | predicted | re-simulated | relative error | contact switch |", "| ---: | ---: | ---: | ---: | --- |"]
        for i, (p, a, r, s) in enumerate(zip(self.predicted, self.actual, self.relative_error, self.contact_switch)):
            rows.append(f"| {i + 1} | {p:+.4g} | {a:+.4g} | {100 * r:.2f} % | {'yes' if s else 'no'} |")
        rows.append(f"\n{self.num_agree} of {len(self.agrees)} within {100 * self.tolerance:g} %.")
        return "\n".join(rows) + "\n"


def check_linearity(
    sens,
    cases: int = 20,
    *,
    size: float | None = None,
    seed: int = 0,
    tolerance: float = DEFAULT_TOLERANCE,
    contact_threshold: float = 1.0,
) -> LinearityCheck:
    """Compare the linear prediction with re-simulation on random perturbations.

    Each case perturbs every command by independent normal noise of standard
    deviation ``size`` (rad or N m; default 1e-5 rad, or 3e-5 of the largest
    torque command); the prediction is the inner product with the gradient.
    The ``cases`` rollouts run as one batch, together with the nominal one.
    """
    if not isinstance(cases, int) or cases < 1:
        raise InputError(f"cases must be a positive integer, got {cases!r}")
    # 1e-5 rad per command: the quadruped's slip is linear to 10 % only below
    # about 3e-5 rad per command (docs/analysis.md), stiction being stiff.
    if size is None:
        size = 1e-5 if sens.control_unit == "rad" else _default_size(sens) * 3e-3
    if not (isinstance(size, (int, float)) and math.isfinite(size) and size > 0):
        raise InputError(f"size must be a positive finite command change, got {size!r}")
    gen = torch.Generator().manual_seed(seed)
    g = sens.controls
    deltas = (torch.randn(cases, *g.shape, generator=gen, dtype=torch.float64) * size).to(g)
    predicted = (deltas * g).sum((-1, -2)).to(torch.float64).cpu().numpy()
    nominal, vals, sw = resimulate(sens, deltas, contact_threshold)
    actual = (vals - nominal).numpy()
    scale = np.maximum(np.abs(actual), np.abs(predicted))
    rel = np.where(scale > 0, np.abs(actual - predicted) / np.where(scale > 0, scale, 1.0), np.inf)
    return LinearityCheck(
        predicted=predicted, actual=actual, relative_error=rel, contact_switch=sw.numpy(),
        agrees=rel <= tolerance, size=float(size), tolerance=tolerance,
    )
