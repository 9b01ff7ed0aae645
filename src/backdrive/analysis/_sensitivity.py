"""Sensitivity of a rollout's outcome to every command, the initial state and physical parameters."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from .._errors import InputError, UnknownNameError
from ._metrics import METRICS, make_metric

__all__ = ["sensitivity", "Sensitivity", "PARAMETER_NAMES", "contact_point_names"]

_ROBOT_PARAMETERS = ("body_mass", "body_com", "body_inertia", "damping", "friction", "armature", "gravity")
_CONTACT_PARAMETERS = ("stiffness", "damping", "friction", "normal_width", "stiction_width")

#: Physical parameters :func:`sensitivity` differentiates with respect to:
#: the robot's (``robot.replace``), the contact law's (``contact.NAME``) and
#: a PD actuator's gains.
PARAMETER_NAMES = _ROBOT_PARAMETERS + tuple(f"contact.{n}" for n in _CONTACT_PARAMETERS) + ("kp", "kd")


def contact_point_names(sim) -> list[str]:
    """A name per contact row of ``sim``'s contact results: the link of each ground point, then ``pair k``."""
    if sim.contact is None:
        return []
    g = sim.contact.geometry
    links = g.shape_links
    names = [links[i] for i in g.point_shape.tolist()]
    # several points on one shape (box corners): number them
    counts = {n: names.count(n) for n in names}
    seen: dict[str, int] = {}
    out = []
    for n in names:
        if counts[n] > 1:
            seen[n] = seen.get(n, 0) + 1
            out.append(f"{n}#{seen[n]}")
        else:
            out.append(n)
    sc = sim.contact.self_collision
    if sc is not None:
        out += [f"pair {k}" for k in range(len(sc.body_a))]
    return out


@dataclass(frozen=True, eq=False)
class Sensitivity:
    """The gradient of a metric of one rollout (:func:`sensitivity`).

    Attributes:
        value: the metric of the nominal rollout (its unit is the metric's).
        metric_name: the named metric, or the callable's name.
        controls: ``(T, nu)`` d metric / d control, per unit of control
            (rad for a PD actuator's targets, N m or N for torques).
        initial_q: ``(nq,)`` d metric / d initial configuration coordinate
            (the quaternion's four entries as plain coordinates).
        initial_v: ``(nv,)`` d metric / d initial velocity.
        parameters: name -> gradient, of the parameter's shape (``body_mass``
            ``(nb,)``, ``kp`` ``(nu,)``, ``contact.friction`` its given shape).
        parameter_values: name -> the nominal value of each parameter.
        trajectory: the nominal :class:`~backdrive.sim.Trajectory`, detached.
        sim: the simulator; ``initial_q``/``initial_v`` of the rollout in ``q0``, ``v0``;
            ``nominal_controls`` ``(T, nu)``.
        joint_names: the ``nu`` driven joints, in control order.
        control_unit: ``"rad"`` (PD targets) or ``"N m"`` (torques).
        contact_names: a name per contact row (``[]`` without contact).
    """

    value: float
    metric_name: str
    controls: torch.Tensor
    initial_q: torch.Tensor
    initial_v: torch.Tensor
    parameters: dict
    parameter_values: dict
    trajectory: object
    sim: object
    q0: torch.Tensor
    v0: torch.Tensor
    nominal_controls: torch.Tensor
    joint_names: tuple
    control_unit: str
    contact_names: list
    metric: Callable = field(repr=False)

    @property
    def dt(self) -> float:
        return self.sim.dt

    def contact_active(self, threshold: float = 1.0) -> torch.Tensor:
        """``(T, np)`` bool: contact row carries more than ``threshold`` N in step ``t``."""
        c = self.trajectory.contact
        if c is None:
            return torch.zeros(self.trajectory.horizon, 0, dtype=torch.bool)
        return c.normal_force > threshold

    def report(self, top: int = 10, **kwargs):
        """The ranked, re-simulated report: see :func:`backdrive.analysis.build_report`."""
        from ._report import build_report

        return build_report(self, top=top, **kwargs)

    def check_linearity(self, cases: int = 20, **kwargs):
        """Predicted vs re-simulated change along random directions: see :func:`backdrive.analysis.check_linearity`."""
        from ._report import check_linearity

        return check_linearity(self, cases=cases, **kwargs)


def _as_param(value, sim, name) -> torch.Tensor:
    t = torch.as_tensor(value, dtype=sim.dtype, device=sim.device) if not isinstance(value, torch.Tensor) else value
    if t.dtype != sim.dtype or t.device != sim.device:
        raise InputError(f"parameter {name!r} is {t.dtype} on {t.device}; the simulator is {sim.dtype} on {sim.device}")
    return t.detach().clone().requires_grad_(True)


def _with_parameters(sim, names: Sequence[str], values: dict | None = None):
    """``(simulator rebuilt with leaf tensors for names, {name: leaf})``; ``values`` replaces the current ones."""
    from ..sim import PDActuator

    leaves: dict[str, torch.Tensor] = {}
    robot_changes, contact_changes, act_changes = {}, {}, {}
    robot = sim.robot
    for name in names:
        if name not in PARAMETER_NAMES:
            raise UnknownNameError("parameter", name, PARAMETER_NAMES, context=f"(valid: {', '.join(PARAMETER_NAMES)})")
        if name in leaves:
            raise InputError(f"parameter {name!r} is listed twice")
        if name in _ROBOT_PARAMETERS:
            if robot is None:
                raise InputError(f"parameter {name!r} needs a robot simulator")
            cur = getattr(robot, name) if values is None else values[name]
            leaves[name] = robot_changes[name] = _as_param(cur, sim, name)
        elif name.startswith("contact."):
            if sim.contact is None:
                raise InputError(f"parameter {name!r} needs a simulator with contact")
            key = name.split(".", 1)[1]
            if key == "friction" and sim.contact.terrain.friction is not None:
                raise InputError(
                    "parameter 'contact.friction' has no effect: the terrain's own friction replaces it; "
                    "build the terrain without friction= to differentiate with respect to it"
                )
            cur = getattr(sim.contact.params, key) if values is None else values[name]
            leaves[name] = contact_changes[key] = _as_param(cur, sim, name)
        else:
            if not isinstance(sim.actuator, PDActuator):
                raise InputError(f"parameter {name!r} needs a PDActuator; the simulator has a {type(sim.actuator).__name__}")
            cur = getattr(sim.actuator, name) if values is None else values[name]
            val = torch.as_tensor(cur, dtype=sim.dtype, device=sim.device).expand(sim.nu)
            leaves[name] = act_changes[name] = _as_param(val, sim, name)
    changes = {}
    if robot_changes:
        robot = robot.replace(**robot_changes)
        changes["robot"] = robot
    if contact_changes or robot_changes and sim.contact is not None:
        from ..contact import ContactModel

        cm = sim.contact
        changes["contact"] = ContactModel(
            robot, cm.geometry, cm.terrain, cm.params.replace(**contact_changes) if contact_changes else cm.params,
            self_collision=cm.self_collision, unilateral=cm.unilateral,
        )
    if act_changes:
        changes["actuator"] = dataclasses.replace(sim.actuator, **act_changes)
    return (sim.replace(**changes) if changes else sim), leaves


def resolve_metric(metric, sim, options: dict | None):
    """``(callable, name)`` for a metric name or a callable."""
    options = options or {}
    if isinstance(metric, str):
        return make_metric(metric, sim, **options), metric
    if callable(metric):
        if options:
            raise InputError("metric_options apply to named metrics only; a callable metric takes none")
        return metric, getattr(metric, "__name__", "metric")
    raise InputError(
        f"metric must be a name ({', '.join(METRICS)}) or a callable trajectory -> scalar, got {type(metric).__name__}"
    )


def sensitivity(
    sim,
    initial_state,
    controls: torch.Tensor,
    metric: str | Callable,
    *,
    parameters: Sequence[str] = (),
    metric_options: dict | None = None,
) -> Sensitivity:
    """Gradient of a scalar outcome of one rollout w.r.t. everything that shaped it.

    One rollout and one backward pass give ``d metric / d u[t, j]`` for every
    step ``t`` and driven joint ``j``, ``d metric / d (q0, v0)`` and, for each
    name in ``parameters``, ``d metric / d parameter``.

    Args:
        sim: :class:`~backdrive.sim.Simulator` (with contact for the contact metrics).
        initial_state: :class:`~backdrive.sim.State` with ``q (nq,)``, ``v (nv,)`` (no batch axes).
        controls: ``(T, nu)`` the commands of the rollout (PD targets, rad, or torques, N m).
        metric: a name in :data:`~backdrive.analysis.METRICS` or a callable
            ``f(trajectory) -> ()`` tensor; a callable that keeps batch axes
            (``(...)`` for a batched trajectory) lets reports re-simulate in one batch.
        parameters: names in :data:`PARAMETER_NAMES`: ``body_mass`` ... (the
            robot's, via ``robot.replace``), ``contact.stiffness``,
            ``contact.damping``, ``contact.friction``, ``contact.normal_width``,
            ``contact.stiction_width``, ``kp``, ``kd`` (a PD actuator's, per joint).
        metric_options: options of a named metric (:func:`make_metric`).

    Returns:
        :class:`Sensitivity`; ``.report(top)`` ranks and checks the entries.

    Raises:
        UnknownNameError: an unknown metric or parameter name (listing the valid ones).
        InputError: controls or state of the wrong shape, dtype or batch axes; a
            metric that does not give one finite number.
    """
    from ..sim import PDActuator, State

    if not isinstance(initial_state, State):
        raise InputError(f"initial_state must be a backdrive.sim.State, got {type(initial_state).__name__}")
    if not isinstance(controls, torch.Tensor):
        raise InputError(f"controls must be a torch.Tensor (T, nu), got {type(controls).__name__}")
    if controls.ndim != 2 or controls.shape[-1] != sim.nu or controls.shape[0] < 1:
        raise InputError(f"controls must have shape (T, nu) with T >= 1 and nu={sim.nu}, got {tuple(controls.shape)}")
    if initial_state.q.shape != (sim.nq,) or initial_state.v.shape != (sim.nv,):
        raise InputError(
            f"initial_state must be one state, q ({sim.nq},) and v ({sim.nv},); got q {tuple(initial_state.q.shape)}, "
            f"v {tuple(initial_state.v.shape)} (batch axes are not supported here)"
        )
    if not bool(torch.isfinite(controls).all()):
        t, j = (int(i) for i in torch.nonzero(~torch.isfinite(controls))[0])
        raise InputError(f"controls hold NaN or inf (first at step {t}, joint {j})")
    if isinstance(parameters, str):
        parameters = (parameters,)
    metric_fn, metric_name = resolve_metric(metric, sim, metric_options)
    psim, leaves = _with_parameters(sim, list(parameters))
    q0 = initial_state.q.detach().clone().requires_grad_(True)
    v0 = initial_state.v.detach().clone().requires_grad_(True)
    u = controls.detach().clone().requires_grad_(True)
    traj = psim.rollout(State(q0, v0), u)
    value = metric_fn(traj)
    if not isinstance(value, torch.Tensor) or value.numel() != 1:
        raise InputError(
            f"metric {metric_name!r} must return one number (a tensor of shape ()), got "
            f"{tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__}"
        )
    value = value.reshape(())
    if not bool(torch.isfinite(value)):
        raise InputError(f"metric {metric_name!r} is not finite on this rollout ({float(value)})")
    inputs = [u, q0, v0, *leaves.values()]
    grads = torch.autograd.grad(value, inputs, allow_unused=True)
    grads = [torch.zeros_like(x) if g is None else g for x, g in zip(inputs, grads)]
    gu, gq, gv, *gp = grads
    names = psim.system.joint_names
    return Sensitivity(
        value=float(value.detach()),
        metric_name=metric_name,
        controls=gu.detach(),
        initial_q=gq.detach(),
        initial_v=gv.detach(),
        parameters={k: g.detach() for k, g in zip(leaves, gp)},
        parameter_values={k: x.detach() for k, x in leaves.items()},
        trajectory=_detach_trajectory(traj),
        sim=sim,
        q0=initial_state.q.detach(),
        v0=initial_state.v.detach(),
        nominal_controls=controls.detach(),
        joint_names=tuple(names[i] for i in sim.actuated),
        control_unit="rad" if isinstance(sim.actuator, PDActuator) else "N m",
        contact_names=contact_point_names(sim),
        metric=metric_fn,
    )


def _detach_trajectory(traj):
    c = traj.contact
    if c is not None:
        c = dataclasses.replace(
            c, **{f.name: getattr(c, f.name).detach() for f in dataclasses.fields(c)
                  if isinstance(getattr(c, f.name), torch.Tensor)}
        )
    return dataclasses.replace(
        traj, q=traj.q.detach(), v=traj.v.detach(), effort=traj.effort.detach(),
        controls=traj.controls.detach(), contact=c, _grad_norms=None,
    )

