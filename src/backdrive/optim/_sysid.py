"""System identification: fit a robot's physical parameters to recorded motion.

Two routes, each with its settings object (:class:`InverseDynamicsFit`,
:class:`SimulationFit`), one parametrisation, one solver call
(:func:`~backdrive.optim.minimize` with :class:`~backdrive.optim.SolverOptions`),
and one report of what the data determine (confidence intervals from the
Cramer-Rao bound, the parameters they do not determine, implausible fits):

* ``method="inverse_dynamics"``: the joint forces are affine in the inertial
  parameters ``phi = (m, h = m c, I_origin)`` of each body and in the joint
  damping, friction and armature, ``r(phi) = Y (phi - phi0) + r0``. The
  regressor ``Y`` is built once, exactly, by forward-mode automatic
  differentiation through :func:`backdrive.dynamics.inverse_dynamics`, so the
  fit never runs the dynamics again: each Levenberg-Marquardt iteration works
  on ``p x p`` matrices.
* ``method="simulation"``: roll the simulator out from recorded states over
  short segments (multiple shooting, all segments as one batch) and fit the
  predicted motion to the recorded one by back-propagation through time.

Both optimise unconstrained coordinates ``xi`` that map to physically valid
parameters: ``m = exp(xi)`` (positive mass), rotational inertia about the
centre of mass ``I_c = tr(S) 1 - S`` with ``S = L L^T`` and ``L`` lower
triangular with a log-diagonal, which is exactly the condition that the
pseudo-inertia ``[[S_o, h], [h^T, m]]`` be positive definite (the inertia is
realisable by a positive mass density: positive principal moments obeying
the triangle inequalities); damping, friction and armature ``= exp(xi)``.
A log-coordinate that the solver drove more than a factor 1000 below the
starting guess has lost its gradient (``d exp(xi) / dxi = exp(xi)``): it is
set back to the guess and the fit rerun, kept when the loss is lower.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from .._errors import ConfigError, InputError
from ..dynamics import DEFAULT_FRICTION_WIDTH, difference, inverse_dynamics, joint_forces
from ..model import RobotModel
from ..sim import Simulator, State, TorqueActuator
from ._solvers import SolverOptions, minimize, options_from_keywords
from ._sysid_contact import (CONTACT_PARAMETERS, DEFAULT_NOISE, SENSOR_CHANNELS, ContactFit, _check_finite, _restart_note,
                             _restarted, identify_contact)

__all__ = [
    "identify",
    "IdentificationResult",
    "InverseDynamicsFit",
    "SimulationFit",
    "ContactFit",
    "IDENTIFIABLE_PARAMETERS",
    "CONTACT_PARAMETERS",
    "SENSOR_CHANNELS",
    "DEFAULT_NOISE",
    "inertia_from_cholesky",
    "cholesky_from_inertia",
    "physically_consistent",
]

IDENTIFIABLE_PARAMETERS = ("body_mass", "body_com", "body_inertia", "damping", "friction", "armature")
_BODY = ("body_mass", "body_com", "body_inertia")
_JOINT = ("damping", "friction", "armature")


# ---------------------------------------------------------------------- parametrisations


def inertia_from_cholesky(xi: torch.Tensor) -> torch.Tensor:
    """Rotational inertia about the centre of mass ``(..., 3, 3)`` from 6 free numbers.

    ``L`` is lower triangular with diagonal ``exp(xi[0], xi[2], xi[5])`` and
    off-diagonal ``xi[1], xi[3], xi[4]`` (row-major lower triangle);
    ``S = L L^T`` is the second moment of the mass distribution and
    ``I = tr(S) 1 - S``. Every ``xi`` gives a physically consistent inertia
    (positive principal moments satisfying the triangle inequalities).

    Args:
        xi: ``(..., 6)``.
    """
    x0, x1, x2, x3, x4, x5 = xi.unbind(-1)
    z = torch.zeros_like(x0)
    L = torch.stack(
        [
            torch.stack([torch.exp(x0), z, z], -1),
            torch.stack([x1, torch.exp(x2), z], -1),
            torch.stack([x3, x4, torch.exp(x5)], -1),
        ],
        -2,
    )
    S = L @ L.transpose(-1, -2)
    tr = torch.diagonal(S, dim1=-2, dim2=-1).sum(-1)
    eye = torch.eye(3, dtype=xi.dtype, device=xi.device)
    return tr[..., None, None] * eye - S


def cholesky_from_inertia(inertia: torch.Tensor, jitter: float = 1e-12) -> torch.Tensor:
    """Inverse of :func:`inertia_from_cholesky`: ``(..., 3, 3)`` -> ``(..., 6)``.

    ``S = tr(I) / 2 - I`` must be positive definite; a degenerate inertia
    (a point mass, a thin rod) gets ``jitter * (1 + tr I)`` added to ``S``.
    """
    eye = torch.eye(3, dtype=inertia.dtype, device=inertia.device)
    tr = torch.diagonal(inertia, dim1=-2, dim2=-1).sum(-1)
    S = 0.5 * tr[..., None, None] * eye - inertia
    S = 0.5 * (S + S.transpose(-1, -2))
    w, V = torch.linalg.eigh(S)
    floor = jitter * (1.0 + tr[..., None])
    S = V @ torch.diag_embed(w.clamp_min(floor)) @ V.transpose(-1, -2)
    L = torch.linalg.cholesky(S)
    xi = torch.stack(
        [torch.log(L[..., 0, 0]), L[..., 1, 0], torch.log(L[..., 1, 1]), L[..., 2, 0], L[..., 2, 1],
         torch.log(L[..., 2, 2])],
        -1,
    )
    return xi


def physically_consistent(robot: RobotModel, tol: float = 1e-12) -> torch.Tensor:
    """``(nb,)`` bool: a non-negative mass (a massless body is a frame) and a
    symmetric inertia about the centre of mass whose second-moment matrix
    ``tr(I)/2 - I`` is positive semi-definite (up to ``tol``), i.e. the
    pseudo-inertia is valid."""
    I = robot.body_inertia.detach()
    eye = torch.eye(3, dtype=I.dtype, device=I.device)
    tr = torch.diagonal(I, dim1=-2, dim2=-1).sum(-1)
    S = 0.5 * tr[..., None, None] * eye - I
    w = torch.linalg.eigvalsh(0.5 * (S + S.transpose(-1, -2)))
    sym = (I - I.transpose(-1, -2)).abs().amax((-1, -2)) <= tol * (1 + tr)
    return (robot.body_mass.detach() >= 0) & (w.amin(-1) >= -tol * (1 + tr)) & sym


class _Parametrisation:
    """Maps the free vector ``xi`` to model parameters and to the affine
    coordinates ``phi`` of the inverse dynamics."""

    def __init__(self, robot: RobotModel, params: Sequence[str], bodies: list[int], joints: list[int],
                 floor: float = 1e-6):
        self.robot = robot
        self.params = tuple(params)
        self.bodies = bodies
        self.joints = joints
        nbsel, njsel = len(bodies), len(joints)
        b = torch.tensor(bodies, dtype=torch.long, device=robot.device)
        j = torch.tensor(joints, dtype=torch.long, device=robot.device)
        self.b_idx, self.j_idx = b, j
        m0 = robot.body_mass.detach()[b]
        c0 = robot.body_com.detach()[b]
        I0 = robot.body_inertia.detach()[b]
        self.m0, self.c0, self.I0 = m0, c0, I0
        parts, sizes = [], []
        if "body_mass" in params:
            if bool((m0 <= 0).any()):
                bad = [robot.body_names[i] for i, m in zip(bodies, m0.tolist()) if m <= 0]
                raise InputError(f"bodies {bad} have no mass to start from; give them a positive mass")
            parts.append(torch.log(m0))
            sizes.append(("body_mass", nbsel))
        if "body_com" in params:
            parts.append(c0.reshape(-1))
            sizes.append(("body_com", 3 * nbsel))
        if "body_inertia" in params:
            parts.append(cholesky_from_inertia(I0).reshape(-1))
            sizes.append(("body_inertia", 6 * nbsel))
        for name in _JOINT:
            if name in params:
                x0 = getattr(robot, name).detach()[j]
                parts.append(torch.log(x0.clamp_min(floor)))
                sizes.append((name, njsel))
        self.sizes = sizes
        self.xi0 = torch.cat(parts) if parts else robot.body_mass.new_zeros(0)

    def split(self, xi: torch.Tensor) -> dict:
        out, k = {}, 0
        for name, n in self.sizes:
            out[name] = xi[k : k + n]
            k += n
        return out

    def values(self, xi: torch.Tensor) -> dict:
        """Selected-body ``m (nbs,)``, ``c (nbs, 3)``, ``I_c (nbs, 3, 3)`` and
        selected-joint parameters for ``xi``."""
        parts = self.split(xi)
        nbs = len(self.bodies)
        vals = {
            "m": torch.exp(parts["body_mass"]) if "body_mass" in parts else self.m0,
            "c": parts["body_com"].reshape(nbs, 3) if "body_com" in parts else self.c0,
            "I": inertia_from_cholesky(parts["body_inertia"].reshape(nbs, 6)) if "body_inertia" in parts else self.I0,
        }
        for name in _JOINT:
            vals[name] = torch.exp(parts[name]) if name in parts else getattr(self.robot, name).detach()[self.j_idx]
        return vals

    def model(self, xi: torch.Tensor) -> RobotModel:
        """The robot with the parameters ``xi`` (gradients flow to ``xi``)."""
        v = self.values(xi)
        return self._model_from(v["m"], v["c"], v["I"], v, every=False)

    def _model_from(self, m, c, I, joint_vals, *, every: bool) -> RobotModel:
        """Replace the selected bodies' and joints' parameters: those being
        fitted, or (``every``) all of them."""
        r = self.robot
        new = {}
        if every or any(p in self.params for p in _BODY):
            new["body_mass"] = r.body_mass.detach().index_put((self.b_idx,), m)
            new["body_com"] = r.body_com.detach().index_put((self.b_idx,), c)
            new["body_inertia"] = r.body_inertia.detach().index_put((self.b_idx,), I)
        for name in _JOINT:
            if every or name in self.params:
                new[name] = getattr(r, name).detach().index_put((self.j_idx,), joint_vals[name])
        return r.replace(**new)

    def physical(self, xi: torch.Tensor) -> torch.Tensor:
        """The fitted physical numbers as one vector, in the order of
        :meth:`labels`: masses, centres of mass (3 each), the 6 upper-triangle
        entries of each rotational inertia, then each fitted joint parameter."""
        v = self.values(xi)
        nbs = len(self.bodies)
        iu = torch.triu_indices(3, 3, device=xi.device)
        parts = []
        if "body_mass" in self.params:
            parts.append(v["m"])
        if "body_com" in self.params:
            parts.append(v["c"].reshape(nbs * 3))
        if "body_inertia" in self.params:
            parts.append(v["I"][:, iu[0], iu[1]].reshape(nbs * 6))
        parts += [v[name] for name in _JOINT if name in self.params]
        return torch.cat(parts)

    def log_coordinates(self) -> list[tuple[int, str]]:
        """``(index into xi, readable name)`` of each coordinate that is the
        logarithm of one positive physical entry (a mass, a joint's damping,
        friction or armature)."""
        r, out, k = self.robot, [], 0
        for name, n in self.sizes:
            if name == "body_mass":
                out += [(k + i, f"body_mass[{r.body_names[b]}]") for i, b in enumerate(self.bodies)]
            elif name in _JOINT:
                out += [(k + i, f"{name}[{r.joint_names[j]}]") for i, j in enumerate(self.joints)]
            k += n
        return out

    def labels(self) -> list[tuple[str, tuple[int, ...], str]]:
        """``(parameter, index into the full model tensor, readable name)`` of
        each entry of :meth:`physical`."""
        r = self.robot
        out = []
        if "body_mass" in self.params:
            out += [("body_mass", (b,), f"body_mass[{r.body_names[b]}]") for b in self.bodies]
        if "body_com" in self.params:
            out += [("body_com", (b, k), f"body_com[{r.body_names[b]}].{'xyz'[k]}")
                    for b in self.bodies for k in range(3)]
        if "body_inertia" in self.params:
            pairs = [(0, 0), (0, 1), (0, 2), (1, 1), (1, 2), (2, 2)]
            out += [("body_inertia", (b, i, k), f"body_inertia[{r.body_names[b]}].{'xyz'[i]}{'xyz'[k]}")
                    for b in self.bodies for i, k in pairs]
        for name in _JOINT:
            if name in self.params:
                out += [(name, (j,), f"{name}[{r.joint_names[j]}]") for j in self.joints]
        return out

    # Affine coordinates of the inverse dynamics.

    def phi(self, xi: torch.Tensor) -> torch.Tensor:
        """The coordinates in which the joint forces are affine, only as many
        as the fitted parameters span.

        Per selected body: ``[m, h = m c (3), I_origin (6 upper-triangle
        entries)]`` if the centre of mass is fitted; otherwise ``m`` (if the
        mass is fitted) and ``I_c`` (6, if the inertia is fitted), since with
        ``c`` fixed the spatial inertia is affine in ``m`` and ``I_c``. Then
        each fitted joint parameter.
        """
        v = self.values(xi)
        m, c, I = v["m"], v["c"], v["I"]
        iu = torch.triu_indices(3, 3, device=xi.device)
        parts = []
        if "body_com" in self.params:
            Io = I + m[:, None, None] * _parallel_axis(c)
            parts.append(torch.cat([m[:, None], m[:, None] * c, Io[:, iu[0], iu[1]]], -1).reshape(-1))
        else:
            if "body_mass" in self.params:
                parts.append(m)
            if "body_inertia" in self.params:
                parts.append(I[:, iu[0], iu[1]].reshape(-1))
        parts += [v[name] for name in _JOINT if name in self.params]
        return torch.cat(parts)

    def model_from_phi(self, phi: torch.Tensor) -> RobotModel:
        """Inverse of :meth:`phi` (unfitted parameters keep their values)."""
        nbs = len(self.bodies)
        k = 0
        m, c, I = self.m0, self.c0, self.I0
        if "body_com" in self.params:
            body = phi[: 10 * nbs].reshape(nbs, 10)
            k = 10 * nbs
            m, h = body[:, 0], body[:, 1:4]
            c = h / m[:, None]
            I = _sym_from_upper(body[:, 4:10]) - m[:, None, None] * _parallel_axis(c)
        else:
            if "body_mass" in self.params:
                m = phi[k : k + nbs]
                k += nbs
            if "body_inertia" in self.params:
                I = _sym_from_upper(phi[k : k + 6 * nbs].reshape(nbs, 6))
                k += 6 * nbs
        joint_vals = {}
        for name in _JOINT:
            if name in self.params:
                joint_vals[name] = phi[k : k + len(self.joints)]
                k += len(self.joints)
        return self._model_from(m, c, I, joint_vals, every=False)


def _parallel_axis(c: torch.Tensor) -> torch.Tensor:
    """``|c|^2 1 - c c^T`` ``(..., 3, 3)``: inertia of a unit point mass at ``c``."""
    eye = torch.eye(3, dtype=c.dtype, device=c.device)
    return (c * c).sum(-1)[..., None, None] * eye - c[..., :, None] * c[..., None, :]


def _sym_from_upper(u: torch.Tensor) -> torch.Tensor:
    """``(..., 6)`` upper triangle ``[xx, xy, xz, yy, yz, zz]`` -> ``(..., 3, 3)``."""
    xx, xy, xz, yy, yz, zz = u.unbind(-1)
    return torch.stack(
        [torch.stack([xx, xy, xz], -1), torch.stack([xy, yy, yz], -1), torch.stack([xz, yz, zz], -1)], -2
    )


# ---------------------------------------------------------------------- how to fit


@dataclass(frozen=True)
class InverseDynamicsFit:
    """Settings of the inverse-dynamics route of :func:`identify` (least
    squares on the joint forces, through the exact linear regressor).

    Attributes:
        differentiation: how accelerations are estimated from ``v``:
            ``"forward"``: ``a[t] = (v[t+1] - v[t]) / dt``, paired with the
            state at ``t`` and the torque of interval ``t`` (exact for data
            from the semi-implicit simulator); ``"central"``:
            ``a[t] = (v[t+1] - v[t-1]) / (2 dt)``, which spans intervals
            ``t - 1`` and ``t``, so it is paired with the state at ``t`` and
            the mean of those two intervals' torques (second order for smooth
            measured motion).
        smoothing: average the joint-force equations (regressor rows and
            measured forces) of this many consecutive samples. Exact (the
            forces are affine in the fitted coordinates), and the acceleration
            noise of a mean of ``w`` differences drops about ``w``-fold.
        a: ``(..., T, nv)`` measured accelerations, rad/s^2 or m/s^2, paired
            with the state at the start of each interval; ``None`` estimates
            them from ``v`` by ``differentiation``.
        friction_width: smoothing of the Coulomb friction, as in the
            dynamics, rad/s or m/s.

    Raises:
        ConfigError: a setting out of range or of the wrong type.
    """

    differentiation: str = "forward"
    smoothing: int = 1
    # Tensors: compared by identity and left out of the repr.
    a: torch.Tensor | None = field(default=None, compare=False, repr=False)
    friction_width: float = DEFAULT_FRICTION_WIDTH

    def __post_init__(self):
        if self.differentiation not in _DIFFERENTIATION:
            raise ConfigError(f"InverseDynamicsFit.differentiation must be one of "
                              f"{', '.join(map(repr, _DIFFERENTIATION))}; got {self.differentiation!r}")
        if not (isinstance(self.smoothing, int) and not isinstance(self.smoothing, bool) and self.smoothing >= 1):
            raise ConfigError(f"InverseDynamicsFit.smoothing must be a positive int, got {self.smoothing!r}")
        if self.a is not None and not isinstance(self.a, torch.Tensor):
            raise ConfigError(f"InverseDynamicsFit.a must be a tensor of accelerations or None, got "
                              f"{type(self.a).__name__}")
        if self.a is not None and self.differentiation != "forward":
            warnings.warn(f"InverseDynamicsFit: differentiation={self.differentiation!r} is ignored when the "
                          "accelerations a are given", UserWarning, stacklevel=3)
        w = self.friction_width
        if not (isinstance(w, (int, float)) and not isinstance(w, bool) and math.isfinite(w) and w > 0):
            raise ConfigError(f"InverseDynamicsFit.friction_width must be a finite number > 0, got {w!r}")

    @property
    def name(self) -> str:
        return "inverse_dynamics"


@dataclass(frozen=True)
class SimulationFit:
    """Settings of the simulation route of :func:`identify` (multiple
    shooting: fit simulated motion over short segments; needs no
    accelerations).

    Attributes:
        simulator: the :class:`~backdrive.sim.Simulator` to fit through
            (default: semi-implicit Euler at the data's ``dt`` with
            unsaturated torque control of every joint).
        controls: ``(..., T, nu)`` controls for ``simulator`` (default: the
            joint part of ``tau``); required with a ``simulator``.
        segment: steps per shooting segment.
        velocity_weight: weight of velocity errors relative to configuration
            errors (rad/s against rad).

    Raises:
        ConfigError: a setting out of range or of the wrong type.
    """

    simulator: Simulator | None = field(default=None, compare=False)
    controls: torch.Tensor | None = field(default=None, compare=False, repr=False)
    segment: int = 10
    velocity_weight: float = 0.1

    def __post_init__(self):
        if self.simulator is not None and not isinstance(self.simulator, Simulator):
            raise ConfigError(f"SimulationFit.simulator must be a Simulator or None, got "
                              f"{type(self.simulator).__name__}")
        if self.controls is not None and not isinstance(self.controls, torch.Tensor):
            raise ConfigError(f"SimulationFit.controls must be a tensor or None, got {type(self.controls).__name__}")
        if not (isinstance(self.segment, int) and not isinstance(self.segment, bool) and self.segment >= 1):
            raise ConfigError(f"SimulationFit.segment must be a positive int, got {self.segment!r}")
        w = self.velocity_weight
        if not (isinstance(w, (int, float)) and not isinstance(w, bool) and math.isfinite(w) and w >= 0):
            raise ConfigError(f"SimulationFit.velocity_weight must be a finite number >= 0, got {w!r}")

    @property
    def name(self) -> str:
        return "simulation"


_DIFFERENTIATION = ("forward", "central")
METHODS = {"inverse_dynamics": InverseDynamicsFit, "simulation": SimulationFit, "contact": ContactFit}
_METHOD_KEYWORDS = {
    "inverse_dynamics": ("differentiation", "smoothing", "a", "friction_width"),
    "simulation": ("simulator", "controls", "segment", "velocity_weight"),
    "contact": (),
}


# ---------------------------------------------------------------------- result


@dataclass
class IdentificationResult:
    """The outcome of :func:`identify`.

    Attributes:
        robot: the model with the fitted parameters (detached tensors).
        params: the fitted model tensors by name (full size, e.g. ``body_mass (nb,)``).
        initial: the same tensors before the fit.
        losses: mean squared residual after each iteration (``losses[0]`` at the start).
        rms_residual: root mean square residual at the end (N m for the
            inverse-dynamics route; a mix of rad and rad/s for the simulation route).
        iterations, evaluations, wall_time, message: solver statistics.
        method: ``"inverse_dynamics"`` or ``"simulation"``.
        std: standard error of each fitted entry (same shapes as ``params``;
            ``inf`` where the data do not determine it, ``nan`` where it was
            not fitted), from the Cramer-Rao bound of least squares at the fit:
            ``sigma^2 (J^T J)^+`` with the residual variance ``sigma^2`` (sum
            of squares over equations minus rank) and the Jacobian ``J`` of
            the residuals. It assumes independent, equal-variance residuals
            and noise in the forces only, so with noisy ``q``/``v``,
            ``smoothing`` or the simulation route it is a lower bound
            (docs/simulation.md gives measured ratios).
        lower, upper: ends of the ``confidence`` interval of each entry
            (``-inf``/``inf`` where not determined; the guess where not
            fitted). Masses, damping, friction and armature are fitted in
            log coordinates, so their intervals are ``value * exp(+-z s)``
            and stay positive.
        identified: bool per entry: fitted and determined by the data. A
            parameter whose change has a component the residuals cannot see
            (a zero or linearly dependent regressor column, e.g. the mass of
            a link whose centre of mass lies on its vertical joint axis) is
            not: its fitted value is one of many that fit equally well (the
            guess, where no residual depends on it).
        not_identified: readable names of the fitted entries that are not
            identified, e.g. ``"body_mass[shoulder_link]"``.
        implausible: readable descriptions of fitted values that moved from
            the guess by more than a factor of ``1e3``, the sign of a fit
            that shrank everything to explain data it cannot (e.g.
            ``tau=None`` on driven motion).
        confidence: the level of ``lower``/``upper`` (0.95).
        options: the :class:`~backdrive.optim.SolverOptions` used.
        simulator: (contact route) the calibrated
            :class:`~backdrive.sim.Simulator`: fitted robot, contact law and
            PD gains (times the motor strength). A
            :class:`~backdrive.sim.TorqueActuator`'s motor strength is not
            part of a simulator: multiply the controls by
            ``params["motor_strength"]``. The fitted ``delay`` is not part
            of it either: send each command ``delay`` steps late.
        delay: (contact route) the fitted control delay, steps.
        delay_losses: (contact route) mean squared residual at each
            candidate delay (after its short fit; the chosen one after the
            full fit).
    """

    robot: RobotModel
    params: dict
    initial: dict
    losses: list[float]
    rms_residual: float
    iterations: int
    evaluations: int
    wall_time: float
    message: str
    method: str
    std: dict = field(default_factory=dict)
    lower: dict = field(default_factory=dict)
    upper: dict = field(default_factory=dict)
    identified: dict = field(default_factory=dict)
    not_identified: list[str] = field(default_factory=list)
    implausible: list[str] = field(default_factory=list)
    confidence: float = 0.95
    options: SolverOptions | None = None
    simulator: Simulator | None = None
    delay: int | None = None
    delay_losses: dict = field(default_factory=dict)
    entry_labels: dict = field(default_factory=dict, repr=False)

    @property
    def reliable(self) -> bool:
        """Every fitted entry identified and none implausible."""
        return not self.not_identified and not self.implausible

    def summary(self) -> str:
        """One line per fitted entry: value, guess, interval, and a flag."""
        lines = [
            f"identify[{self.method}]: rms residual {self.rms_residual:.4g} after {self.iterations} iterations "
            f"({self.message}); {int(100 * self.confidence)} % intervals"
        ]
        names = {n for n in self.not_identified}
        for p, value in self.params.items():
            mask = ~torch.isnan(self.std[p])
            for idx in mask.nonzero().tolist():
                idx = tuple(idx)
                if p == "body_inertia" and idx[1] > idx[2]:  # symmetric: the upper triangle says it all
                    continue
                label = self._label(p, idx)
                lo, hi = float(self.lower[p][idx]), float(self.upper[p][idx])
                flag = " NOT IDENTIFIED (the data do not determine it)" if label in names else ""
                lines.append(f"  {label:<34} {float(value[idx]):>12.6g}  (guess {float(self.initial[p][idx]):.6g}, "
                             f"[{lo:.4g}, {hi:.4g}]){flag}")
        if self.delay is not None:
            flag = " NOT IDENTIFIED (the data do not determine it)" if "delay" in names else ""
            tried = ", ".join(f"{d}: {l:.4g}" for d, l in sorted(self.delay_losses.items()))
            lines.append(f"  {'delay (steps)':<34} {self.delay:>12d}  (loss by delay: {tried or 'not fitted'}){flag}")
        for text in self.implausible:
            lines.append(f"  IMPLAUSIBLE: {text}")
        return "\n".join(lines)

    def _label(self, p: str, idx: tuple) -> str:
        if (p, idx) in self.entry_labels:
            return self.entry_labels[(p, idx)]
        r = self.robot
        if p in _BODY:
            base = f"{p}[{r.body_names[idx[0]]}]"
            return base + ("." + "".join("xyz"[i] for i in idx[1:]) if len(idx) > 1 else "")
        return f"{p}[{r.joint_names[idx[0]]}]"

    def __repr__(self) -> str:
        flags = ""
        if self.not_identified:
            flags += f", not_identified={self.not_identified}"
        if self.implausible:
            flags += f", implausible={self.implausible}"
        return (f"IdentificationResult(method={self.method!r}, params={list(self.params)}, "
                f"rms_residual={self.rms_residual:.4g}, iterations={self.iterations}{flags})")


# ---------------------------------------------------------------------- identify


def _resolve(robot: RobotModel, names, kind: str, default: list[int]) -> list[int]:
    if names is None:
        return default
    out = []
    for n in names:
        if isinstance(n, str):
            out.append(robot.body_index(n) if kind == "body" else robot.joint_index(n))
        elif isinstance(n, int):
            size = robot.num_bodies if kind == "body" else robot.num_joints
            if not -size <= n < size:
                raise InputError(f"{kind} index {n} out of range for {size} {kind}s")
            out.append(n % size)
        else:
            raise InputError(f"{kind}s must be names or indices, got {n!r}")
    if len(set(out)) != len(out):
        raise InputError(f"{kind}s repeat an entry: {list(names)}")
    return out


def _method_from_keywords(method, deprecated: dict):
    """The fit object: ``method`` itself, or built from its name and the old
    per-method keywords (with a ``DeprecationWarning``; keywords of the other
    method are reported as ignored)."""
    if isinstance(method, (InverseDynamicsFit, SimulationFit, ContactFit)):
        name = method.name
    elif isinstance(method, str) and method in METHODS:
        name = method
    else:
        raise ConfigError(
            f"method must be 'inverse_dynamics', 'simulation', an InverseDynamicsFit, a SimulationFit or a "
            f"ContactFit; "
            f"got {method!r}"
        )
    old = {k: deprecated.pop(k) for k in list(deprecated) if any(k in v for v in _METHOD_KEYWORDS.values())}
    if not old:
        return method if not isinstance(method, str) else METHODS[name]()
    if not isinstance(method, str):
        raise ConfigError(f"identify: give {', '.join(old)} in the {type(method).__name__}, not as keywords")
    mine = {k: v for k, v in old.items() if k in _METHOD_KEYWORDS[name]}
    other = [k for k in old if k not in mine]
    cls = METHODS[name]
    if mine:
        warnings.warn(
            f"identify({', '.join(f'{k}=...' for k in mine)}) is deprecated and will be removed in the next "
            f"release; pass method={cls.__name__}({', '.join(f'{k}=...' for k in mine)})",
            DeprecationWarning,
            stacklevel=3,
        )
    if other:
        o = "simulation" if name == "inverse_dynamics" else "inverse_dynamics"
        warnings.warn(
            f"identify: {', '.join(other)} {'applies' if len(other) == 1 else 'apply'} only to method={o!r} "
            f"({METHODS[o].__name__}) and {'is' if len(other) == 1 else 'are'} ignored with method={name!r}",
            UserWarning,
            stacklevel=3,
        )
    return cls(**mine)


def _actuated_map(robot: RobotModel, tau: torch.Tensor, actuated, fit) -> torch.Tensor:
    """``tau`` as ``(..., nv)`` generalised forces: as given if it has ``nv``
    columns, else its columns scattered to the actuated joint coordinates
    (zero on the free base and on passive joints)."""
    nv, nj = robot.nv, robot.num_joints
    if not isinstance(tau, torch.Tensor) or tau.ndim < 2:
        raise InputError(f"tau must be a (..., T, nv) or (..., T, nu) tensor, got "
                         f"{tuple(tau.shape) if isinstance(tau, torch.Tensor) else type(tau).__name__}")
    n = tau.shape[-1]
    source = None
    if isinstance(actuated, Simulator):
        idx, source = list(actuated.actuated), "the simulator's actuated joints"
    elif actuated is not None:
        if isinstance(actuated, (str, int)) or not isinstance(actuated, Sequence):
            raise InputError(f"actuated must be a Simulator or a sequence of joint names or indices, got "
                             f"{actuated!r}")
        idx, source = _resolve(robot, actuated, "joint", []), f"actuated={list(actuated)}"
    elif n == nv:
        return tau
    elif isinstance(fit, SimulationFit) and fit.simulator is not None:
        idx, source = list(fit.simulator.actuated), "the simulator's actuated joints"
    elif n == nj:
        idx, source = list(range(nj)), "every joint"
    else:
        raise InputError(
            f"tau has {n} columns but robot {robot.name!r} has nv = {nv} generalised forces"
            + (f" ({nv - nj} of the free base, {nj} joints)" if robot.floating_base else "")
            + "; for actuator efforts (..., T, nu), e.g. a Trajectory's effort, say which joints they drive: "
            "actuated=simulator or actuated=[joint names or indices]"
        )
    if len(idx) != n:
        raise InputError(f"tau has {n} columns but {source} name {len(idx)} joints")
    full = tau.new_zeros(*tau.shape[:-1], nv)
    cols = torch.tensor(idx, dtype=torch.long, device=tau.device) + (nv - nj)
    return full.index_copy(-1, cols, tau)


def identify(
    robot: RobotModel,
    q: torch.Tensor,
    v: torch.Tensor,
    *,
    dt: float,
    tau: torch.Tensor | None = None,
    params: Sequence[str] = ("body_mass", "damping"),
    bodies: Sequence | None = None,
    joints: Sequence | None = None,
    method: str | InverseDynamicsFit | SimulationFit | ContactFit = "inverse_dynamics",
    options: SolverOptions | None = None,
    actuated: Simulator | Sequence | None = None,
    **deprecated,
) -> IdentificationResult:
    """Fit physical parameters of ``robot`` to recorded motion.

    Args:
        robot: the model whose current parameters are the starting point.
        q: ``(..., T + 1, nq)`` recorded configurations, one row per sample
            time, leading axes for several recordings.
        v: ``(..., T + 1, nv)`` recorded velocities.
        dt: sample period, s.
        tau: forces applied by the actuators, held over each sample interval
            (row ``t`` acts from sample ``t`` to ``t + 1``; ``T + 1`` rows are
            accepted and the last one dropped): ``(..., T, nv)`` generalised
            forces, or ``(..., T, nu)`` actuator efforts (a
            :class:`~backdrive.sim.Trajectory`'s ``effort``) placed on the
            joints that ``actuated`` names. ``None`` means no actuation
            (passive motion). Not needed with a :class:`SimulationFit` that
            has ``simulator`` and ``controls``.
        params: which parameters to fit, from ``"body_mass"``, ``"body_com"``,
            ``"body_inertia"`` (rotational inertia about the centre of mass),
            ``"damping"``, ``"friction"``, ``"armature"``; with a
            :class:`ContactFit` also :data:`CONTACT_PARAMETERS`:
            ``"contact_stiffness"``, ``"contact_damping"`` (penalty law) or
            ``"contact_timeconst"``, ``"contact_dampratio"`` (MuJoCo's soft
            contact, :class:`~backdrive.contact.SoftContactParameters`),
            ``"contact_friction"``, ``"motor_strength"``, ``"kp"``, ``"kd"``.
        bodies: bodies (names or indices) whose inertial parameters are
            fitted; all moving bodies by default (with a fixed base the root
            is welded to the world and has no effect).
        joints: joint coordinates whose damping, friction, armature are fitted
            (default: all).
        method: ``"inverse_dynamics"`` or an :class:`InverseDynamicsFit`
            (fast least squares on joint forces; needs accelerations), or
            ``"simulation"`` or a :class:`SimulationFit` (fit simulated motion
            over segments; needs no accelerations), or a :class:`ContactFit`
            (fit through a simulator with contact on sensor channels, with
            contact, actuator and delay parameters). The object carries that
            route's own settings.
        options: :class:`~backdrive.optim.SolverOptions` (default
            ``"gauss_newton"``, 50 iterations; Adam's ``lr`` defaults to 0.01
            here, in log-parameter units, so a step moves a mass by about 1 %).
        actuated: which joints the columns of a ``(..., T, nu)`` ``tau``
            drive: a :class:`~backdrive.sim.Simulator` (its actuated joints)
            or joint names or indices. Not needed when ``tau`` has ``nv``
            columns, when it has one per joint, or with a
            :class:`SimulationFit` that has a ``simulator``.
        **deprecated: the keywords of the previous release
            (``optimizer``, ``iterations``, ``lr``, ``progress``;
            ``differentiation``, ``smoothing``, ``a``, ``friction_width``;
            ``simulator``, ``controls``, ``segment``, ``velocity_weight``)
            still work, with a ``DeprecationWarning``; one that the chosen
            method does not read gives a ``UserWarning``.

    Returns:
        :class:`IdentificationResult` with the fitted model, a confidence
        interval for each fitted entry and the entries the data do not
        determine (also given as a ``UserWarning``).
    """
    if not isinstance(robot, RobotModel):
        raise InputError(f"robot must be a RobotModel, got {type(robot).__name__}")
    fit = _method_from_keywords(method, deprecated)
    opts = options_from_keywords("identify", options, deprecated, default_method="gauss_newton")
    if deprecated:
        raise ConfigError(f"identify() got unexpected keyword(s) {', '.join(map(repr, deprecated))}")
    opts = opts.with_defaults(lr=0.01)
    method = fit.name
    if isinstance(params, str):
        params = (params,)
    valid = IDENTIFIABLE_PARAMETERS + (CONTACT_PARAMETERS if method == "contact" else ())
    unknown = [p for p in params if p not in valid]
    if unknown or not params or len(set(params)) != len(params):
        extra = (f" ({', '.join(CONTACT_PARAMETERS)} need method=ContactFit(...))"
                 if any(p in CONTACT_PARAMETERS for p in unknown) else "")
        raise InputError(f"params must name some of {', '.join(valid)} once each; got {list(params)}{extra}")
    if not (isinstance(dt, (int, float)) and dt > 0):
        raise InputError(f"dt must be a positive number of seconds, got {dt!r}")
    if method == "contact":
        if tau is not None:
            raise InputError("with ContactFit the commands go in ContactFit(controls=...); tau is not used")
        if not (isinstance(q, torch.Tensor) and isinstance(v, torch.Tensor)):
            raise InputError(f"q and v must be tensors, got {type(q).__name__} and {type(v).__name__}")
        helpers = dict(resolve=_resolve, Parametrisation=_Parametrisation, minimize=minimize,
                       uncertainty=_uncertainty, Result=IdentificationResult,
                       IDENTIFIABLE_PARAMETERS=IDENTIFIABLE_PARAMETERS)
        return identify_contact(robot, q, v, float(dt), tuple(params), bodies, joints, fit, opts, helpers)
    robot.check_vector(q, robot.nq, "q")
    robot.check_vector(v, robot.nv, "v")
    if q.ndim < 2 or q.shape[:-1] != v.shape[:-1] or q.shape[-2] < 3:
        raise InputError(
            f"q and v must be (..., T + 1, nq) and (..., T + 1, nv) with the same leading shape and at "
            f"least 3 samples; got {tuple(q.shape)} and {tuple(v.shape)}"
        )
    _check_finite(q, "q")
    _check_finite(v, "v")
    steps = q.shape[-2] - 1
    if tau is not None:
        tau = _actuated_map(robot, tau, actuated, fit)
        _check_finite(tau, "tau")
        robot.check_vector(tau, robot.nv, "tau")
        if tau.shape[:-2] != q.shape[:-2] or tau.shape[-2] not in (steps, steps + 1):
            raise InputError(
                f"tau must be (..., T, nv) with T = {steps} (one per sample interval), got {tuple(tau.shape)}"
            )
        tau = tau[..., :steps, :]
    fixed_default = list(range(0 if robot.floating_base else 1, robot.num_bodies))
    body_idx = _resolve(robot, bodies, "body", fixed_default)
    joint_idx = _resolve(robot, joints, "joint", list(range(robot.num_joints)))
    if any(p in _BODY for p in params) and not body_idx:
        raise InputError("no bodies selected for the inertial parameters")
    par = _Parametrisation(robot, params, body_idx, joint_idx)
    q, v = q.detach(), v.detach()
    if method == "inverse_dynamics":
        fun, count, jac = _id_problem(robot, par, q, v, tau, fit, dt)
    else:
        fun, count, jac = _sim_problem(robot, par, q, v, tau, dt, fit)
    res = minimize(fun, par.xi0.clone(), opts, jacobian_fun=jac, label=f"identify[{method}]")
    res, restarts = _restarted(minimize, fun, jac, res, opts, f"identify[{method}]", par.log_coordinates(), par.xi0)
    fitted = par.model(res.x)
    names = [p for p in IDENTIFIABLE_PARAMETERS if p in params]
    out = {p: getattr(fitted, p).detach() for p in names}
    initial = {p: getattr(robot, p).detach() for p in names}
    fitted = robot.replace(**out)
    losses = [f / count for f in res.losses]
    J = res.jacobian if res.jacobian is not None else jac(res.x)[1]
    # Scalar equations behind the loss: the inverse-dynamics route hands the
    # solver a p x p reduction of its n_samples * nv rows.
    equations = count if method == "inverse_dynamics" else J.shape[0]
    stats = _uncertainty(par, res.x, J, res.losses[-1], equations, out, initial)
    result = IdentificationResult(
        robot=fitted,
        params=out,
        initial=initial,
        losses=losses,
        rms_residual=math.sqrt(losses[-1]),
        iterations=res.iterations,
        evaluations=res.evaluations,
        wall_time=res.wall_time,
        message=res.message + _restart_note(restarts),
        method=method,
        options=opts,
        **stats,
    )
    if result.not_identified:
        warnings.warn(
            f"identify: the data do not determine {', '.join(result.not_identified[:8])}"
            + (f" and {len(result.not_identified) - 8} more" if len(result.not_identified) > 8 else "")
            + ": other values fit the data equally well, so the fitted value is one of many (the guess, "
            "where no residual depends on it); see IdentificationResult.identified and .summary()",
            UserWarning,
            stacklevel=2,
        )
    if result.implausible:
        hint = (" With tau=None the motion is taken as passive; if the robot was driven, pass its tau."
                if tau is None and (method == "inverse_dynamics" or fit.controls is None) else "")
        warnings.warn(f"identify: implausible result: {'; '.join(result.implausible[:4])}.{hint}",
                      UserWarning, stacklevel=2)
    return result


# Relative singular value below which a direction of the (column-scaled)
# residual Jacobian counts as unseen by the data, and the share of a
# parameter's sensitivity in those directions above which it is not identified.
_RANK_RTOL = {torch.float64: 1e-7, torch.float32: 3e-3}
_NULL_SHARE = {torch.float64: 1e-6, torch.float32: 1e-2}
# A fitted positive parameter that moved by more than this factor.
_IMPLAUSIBLE_FACTOR = 1e3
_Z95 = 1.959963984540054


def _uncertainty(par: _Parametrisation, xi: torch.Tensor, J: torch.Tensor, sse: float, count: int,
                 out: dict, initial: dict) -> dict:
    """Standard errors, confidence intervals and identifiability of the fitted
    physical entries from the residual Jacobian ``J (m, p)`` at ``xi``.

    The covariance of ``xi`` is ``sigma^2 (J^T J)^+`` (the Cramer-Rao bound of
    least squares for Gaussian residuals, with ``sigma^2 = sse / (count -
    rank)``); physical entries ``theta(xi)`` get ``g Cov g^T`` with ``g = d
    theta / d xi`` (delta method). An entry whose ``g`` has a component in
    the null space of ``J`` is not identified: some change of it leaves every
    residual unchanged.
    """
    J = J.detach()
    dtype = J.dtype
    theta = par.physical(xi)
    G = torch.func.jacfwd(par.physical)(xi.detach())  # (P, p)
    # Scale the columns to unit norm (the coordinates mix log-masses, metres
    # and Cholesky factors). A column at rounding level is a zero column, not
    # a direction: normalised, its noise would mix with the real ones.
    scale = J.norm(dim=0)
    zero = scale <= 1e3 * torch.finfo(dtype).eps * scale.max().clamp_min(torch.finfo(dtype).tiny)
    scale = torch.where(zero, torch.ones_like(scale), scale)
    Js = torch.where(zero, torch.zeros_like(J), J) / scale
    _, S, Vh = torch.linalg.svd(Js, full_matrices=False)  # never the (m, m) factor
    p = xi.numel()
    tol = _RANK_RTOL.get(dtype, 1e-7) * float(S.max()) if S.numel() else 0.0
    s_full = torch.zeros(p, dtype=dtype, device=J.device)
    s_full[: S.numel()] = S
    keep = s_full > tol
    rank = int(keep.sum())
    V = Vh.T
    if V.shape[1] < p:  # fewer residuals than parameters: complete the basis of the null space
        V = torch.linalg.qr(V, mode="complete").Q if V.shape[1] else torch.eye(p, dtype=dtype, device=J.device)
    Gs = G / scale  # sensitivities in the scaled coordinates
    null_share = (Gs @ V[:, ~keep]).norm(dim=1) / Gs.norm(dim=1).clamp_min(torch.finfo(dtype).tiny)
    ok = null_share <= _NULL_SHARE.get(dtype, 1e-6)
    dof = count - rank
    sigma2 = sse / dof if dof > 0 else math.nan
    inv = torch.where(keep, 1.0 / s_full.clamp_min(torch.finfo(dtype).tiny) ** 2, torch.zeros_like(s_full))
    cov_s = (V * inv) @ V.T  # covariance of the scaled coordinates / sigma^2
    var = sigma2 * ((Gs @ cov_s) * Gs).sum(1)
    std_theta = torch.where(ok, var.clamp_min(0.0).sqrt(), torch.full_like(var, math.inf))
    labels = par.labels()
    std, lower, upper, ident = {}, {}, {}, {}
    for name in out:
        std[name] = torch.full_like(out[name], math.nan)
        lower[name] = out[name].clone()
        upper[name] = out[name].clone()
        ident[name] = torch.zeros_like(out[name], dtype=torch.bool)
    not_identified, implausible = [], []
    positive = ("body_mass",) + _JOINT + tuple(getattr(par, "positive", ()))
    for k, (name, idx, label) in enumerate(labels):
        val, s = float(theta[k]), float(std_theta[k])
        idxs = [idx] + ([(idx[0], idx[2], idx[1])] if name == "body_inertia" and idx[1] != idx[2] else [])
        for ix in idxs:
            std[name][ix] = s
            ident[name][ix] = bool(ok[k])
            if not bool(ok[k]):
                lower[name][ix], upper[name][ix] = (0.0 if name in positive else -math.inf), math.inf
            elif name in positive and val > 0:
                w = min(_Z95 * s / val, 700.0)  # s / val: the log-coordinate's standard error
                lower[name][ix], upper[name][ix] = val * math.exp(-w), val * math.exp(w)
            else:
                lower[name][ix], upper[name][ix] = val - _Z95 * s, val + _Z95 * s
        if not bool(ok[k]):
            not_identified.append(label)
        if name == "body_mass":  # a joint's damping or friction may well be ~0
            guess = float(initial[name][idx])
            if guess > 0 and val > 0 and abs(math.log(val / guess)) > math.log(_IMPLAUSIBLE_FACTOR):
                implausible.append(f"{label} = {val:.3g}, {val / guess:.3g} times the guess {guess:.3g}")
    return dict(std=std, lower=lower, upper=upper, identified=ident, not_identified=not_identified,
                implausible=implausible)


def _moving_average(x: torch.Tensor, window: int, dim: int) -> torch.Tensor:
    """Mean over ``window`` consecutive entries along ``dim`` (shortens it by ``window - 1``)."""
    if window <= 1:
        return x
    return x.movedim(dim, -1).unfold(-1, window, 1).mean(-1).movedim(-1, dim)


def _id_problem(robot, par: _Parametrisation, q, v, tau, fit: InverseDynamicsFit, dt):
    """Residual function ``xi -> r`` through the exact linear regressor."""
    a, differentiation, width, smoothing = fit.a, fit.differentiation, fit.friction_width, fit.smoothing
    if a is None:
        if differentiation == "forward":
            a = (v[..., 1:, :] - v[..., :-1, :]) / dt
            qs, vs = q[..., :-1, :], v[..., :-1, :]
            ts = tau
        elif differentiation == "central":
            # The central difference at sample t spans intervals t - 1 and t,
            # so it pairs with the mean of their torques (paired with interval
            # t alone it is biased wherever the torque changes: measured 60 %
            # on masses with noise-free MuJoCo data in issue 14).
            a = (v[..., 2:, :] - v[..., :-2, :]) / (2.0 * dt)
            qs, vs = q[..., 1:-1, :], v[..., 1:-1, :]
            ts = None if tau is None else 0.5 * (tau[..., :-1, :] + tau[..., 1:, :])
    else:
        robot.check_vector(a, robot.nv, "a")
        steps = q.shape[-2] - 1
        if a.shape[:-2] != q.shape[:-2] or a.shape[-2] not in (steps, steps + 1):
            raise InputError(f"a must be (..., T, nv) with T = {steps}, got {tuple(a.shape)}")
        a = a[..., :steps, :]
        qs, vs, ts = q[..., :-1, :], v[..., :-1, :], tau
    lead = qs.shape[:-1]  # (..., T') sample times per recording
    if lead[-1] < smoothing:
        raise ConfigError(f"smoothing={smoothing} needs at least {smoothing} samples with accelerations per recording")
    qs, vs, a_ = qs.reshape(-1, robot.nq), vs.reshape(-1, robot.nv), a.reshape(-1, robot.nv)
    ts = torch.zeros_like(vs) if ts is None else ts.reshape(-1, robot.nv)

    def predicted(phi):
        model = par.model_from_phi(phi)
        return inverse_dynamics(model, qs, vs, a_) - joint_forces(model, vs, friction_width=width)

    phi0 = par.phi(par.xi0).detach()
    with torch.no_grad():
        r0 = (predicted(phi0) - ts).reshape(-1)
    # The joint forces are affine in phi, so this Jacobian is the regressor
    # everywhere, not only at phi0.
    Y = torch.func.jacfwd(lambda p: predicted(p).reshape(-1))(phi0).detach()
    if smoothing > 1:
        # Average the equations of `smoothing` consecutive samples. The
        # residual is affine in phi, so averaging its rows is exact (no
        # nonlinear bias, unlike filtering q and v before the dynamics); the
        # acceleration noise (v noise / dt) of a mean of forward differences
        # nearly telescopes to (noise at the window's ends) / (window dt).
        p = Y.shape[-1]
        Y = _moving_average(Y.reshape(*lead, robot.nv, p), smoothing, -3).reshape(-1, p)
        r0 = _moving_average(r0.reshape(*lead, robot.nv), smoothing, -2).reshape(-1)
    n_samples = r0.numel() // robot.nv
    G = Y.T @ Y
    b = Y.T @ r0
    c = r0 @ r0

    # Everything below works on p x p matrices: r = Y (phi - phi0) + r0, and
    # |r|^2 = d^T G d + 2 d^T b + c with d = phi - phi0. The solver sees a
    # residual vector whose square sum is that loss: R^T (d) + R^{-T} b with
    # G = R^T R, plus the constant remainder.
    w, V = torch.linalg.eigh(0.5 * (G + G.T))
    keep = w > w.max().clamp_min(0.0) * (G.shape[0] * torch.finfo(G.dtype).eps)
    sw = torch.sqrt(torch.where(keep, w, torch.ones_like(w)))
    Rf = torch.where(keep, sw, torch.zeros_like(sw))[:, None] * V.T
    z = torch.where(keep, (V.T @ b) / sw, torch.zeros_like(sw))
    rest = torch.sqrt(torch.clamp(c - z @ z, min=0.0))

    def fun(xi):
        d = par.phi(xi) - phi0
        return torch.cat([Rf @ d + z, rest.reshape(1)])

    def jac(xi):
        xi = xi.detach()
        with torch.no_grad():
            r = fun(xi)
        J = torch.func.jacfwd(fun)(xi)
        return r, J

    return fun, n_samples * robot.nv, jac


def _sim_problem(robot, par: _Parametrisation, q, v, tau, dt, fit: SimulationFit):
    simulator, controls, segment, w_v = fit.simulator, fit.controls, fit.segment, fit.velocity_weight
    steps = q.shape[-2] - 1
    if simulator is None:
        # Explicit joint forces: the discretisation the inverse-dynamics route assumes.
        simulator = Simulator(robot, dt, actuator=TorqueActuator(effort_limit=math.inf), joint_forces="explicit")
        if controls is None:
            controls = (
                torch.zeros(*q.shape[:-2], steps, robot.num_joints, dtype=q.dtype, device=q.device)
                if tau is None
                else tau[..., robot.nv - robot.num_joints :]
            )
    elif controls is None:
        raise InputError("with SimulationFit(simulator=...), give its controls: SimulationFit(simulator, controls)")
    if simulator.dt != dt:
        raise InputError(f"the simulator's dt {simulator.dt} differs from the data's dt {dt}")
    if controls.shape[:-2] != q.shape[:-2] or controls.shape[-2] < steps or controls.shape[-1] != simulator.nu:
        raise InputError(
            f"controls must be (..., {steps}, {simulator.nu}) matching the recordings, got {tuple(controls.shape)}"
        )
    K = min(segment, steps)
    S = steps // K
    starts = torch.arange(S, device=q.device) * K
    idx = starts[:, None] + torch.arange(K + 1, device=q.device)  # (S, K + 1)
    qseg, vseg = q[..., idx, :], v[..., idx, :]  # (..., S, K + 1, n)
    useg = controls[..., idx[:, :-1], :]  # (..., S, K, nu)
    state0 = State(qseg[..., 0, :], vseg[..., 0, :])
    q_rec, v_rec = qseg[..., 1:, :], vseg[..., 1:, :]

    def fun(xi):
        sim = simulator.replace(robot=par.model(xi))
        traj = sim.rollout(state0, useg, check_finite=False)
        dq = difference(robot, q_rec, traj.q[..., 1:, :]) if robot.floating_base else traj.q[..., 1:, :] - q_rec
        dv = traj.v[..., 1:, :] - v_rec
        return torch.cat([dq.reshape(-1), w_v * dv.reshape(-1)])

    def jac(xi):
        xi = xi.detach()
        with torch.no_grad():
            r = fun(xi)
        return r, torch.func.jacfwd(fun)(xi)

    count = int(q_rec[..., 0].numel())
    return fun, count, jac

