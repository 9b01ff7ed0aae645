"""System identification: fit a robot's physical parameters to recorded motion.

Two routes, one parametrisation:

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
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .._errors import InputError
from ..dynamics import DEFAULT_FRICTION_WIDTH, difference, inverse_dynamics, joint_forces
from ..model import RobotModel
from ..sim import Simulator, State, TorqueActuator
from ._progress import ProgressBar
from ._solvers import adam, lbfgs, levenberg_marquardt

__all__ = [
    "identify",
    "IdentificationResult",
    "IDENTIFIABLE_PARAMETERS",
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
    method: str = "inverse_dynamics",
    a: torch.Tensor | None = None,
    differentiation: str = "forward",
    smoothing: int = 1,
    simulator: Simulator | None = None,
    controls: torch.Tensor | None = None,
    segment: int = 10,
    velocity_weight: float = 0.1,
    optimizer: str | None = None,
    iterations: int | None = None,
    lr: float = 0.01,
    friction_width: float = DEFAULT_FRICTION_WIDTH,
    progress: bool | None = False,
) -> IdentificationResult:
    """Fit physical parameters of ``robot`` to recorded motion.

    Args:
        robot: the model whose current parameters are the starting point.
        q: ``(..., T + 1, nq)`` recorded configurations, one row per sample
            time, leading axes for several recordings.
        v: ``(..., T + 1, nv)`` recorded velocities.
        dt: sample period, s.
        tau: ``(..., T, nv)`` (or ``T + 1``) generalised forces applied by the
            actuators during each sample interval; ``None`` means no actuation
            (passive motion). Not needed with ``simulator`` and ``controls``.
        params: which parameters to fit, from ``"body_mass"``, ``"body_com"``,
            ``"body_inertia"`` (rotational inertia about the centre of mass),
            ``"damping"``, ``"friction"``, ``"armature"``.
        bodies: bodies (names or indices) whose inertial parameters are
            fitted; all moving bodies by default (with a fixed base the root
            is welded to the world and has no effect).
        joints: joint coordinates whose damping, friction, armature are fitted
            (default: all).
        method: ``"inverse_dynamics"`` (fast least squares on joint forces;
            needs accelerations) or ``"simulation"`` (fit simulated motion
            over segments; needs no accelerations).
        a: ``(..., T, nv)`` accelerations for the inverse-dynamics route;
            estimated from ``v`` if ``None``.
        differentiation: how to estimate ``a``: ``"forward"``
            (``(v[t+1] - v[t]) / dt``, exact for data from the semi-implicit
            simulator) or ``"central"`` (``(v[t+1] - v[t-1]) / (2 dt)``,
            second order for smooth measured motion).
        smoothing: inverse-dynamics route: average the joint-force equations
            (regressor rows and measured forces) of this many consecutive
            samples. Differentiating ``v`` amplifies its noise by ``1 / dt``
            and noise in the regressor biases least squares; the mean of
            ``w`` forward differences is, up to the slow change of the mass
            matrix, the velocity change over the window divided by
            ``w dt``, so the acceleration noise drops about ``w``-fold.
            Exact for any robot (floating base included): the forces are
            affine in the fitted coordinates, so no nonlinear bias enters.
            A window much shorter than the motion's period (e.g. 10 samples
            for motion below ~2 Hz at 200 Hz) loses no signal.
        simulator: for the simulation route (default: semi-implicit Euler at
            ``dt`` with unsaturated torque control of every joint).
        controls: ``(..., T, nu)`` controls for ``simulator`` (default: the
            joint part of ``tau``).
        segment: steps per shooting segment of the simulation route.
        velocity_weight: weight of velocity errors relative to configuration
            errors (rad/s against rad) in the simulation route.
        optimizer: ``"gauss_newton"`` (default), ``"lbfgs"`` or ``"adam"``
            (plain gradient descent on the back-propagated loss; ``lr`` is in
            log-parameter units, so 0.01 moves a mass by about 1 %).
        iterations: solver iterations (default 50 for Gauss-Newton, 200 otherwise).
        friction_width: smoothing of the Coulomb friction, as in the dynamics.
        progress: show a progress bar.

    Returns:
        :class:`IdentificationResult` with the fitted model.
    """
    if not isinstance(robot, RobotModel):
        raise InputError(f"robot must be a RobotModel, got {type(robot).__name__}")
    unknown = [p for p in params if p not in IDENTIFIABLE_PARAMETERS]
    if unknown or not params:
        raise InputError(
            f"params must name some of {', '.join(IDENTIFIABLE_PARAMETERS)}; got {list(params)}"
        )
    if method not in ("inverse_dynamics", "simulation"):
        raise InputError(f"method must be 'inverse_dynamics' or 'simulation', got {method!r}")
    if not (isinstance(dt, (int, float)) and dt > 0):
        raise InputError(f"dt must be a positive number of seconds, got {dt!r}")
    robot.check_vector(q, robot.nq, "q")
    robot.check_vector(v, robot.nv, "v")
    if q.ndim < 2 or q.shape[:-1] != v.shape[:-1] or q.shape[-2] < 3:
        raise InputError(
            f"q and v must be (..., T + 1, nq) and (..., T + 1, nv) with the same leading shape and at "
            f"least 3 samples; got {tuple(q.shape)} and {tuple(v.shape)}"
        )
    steps = q.shape[-2] - 1
    if tau is not None:
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
    if optimizer is None:
        optimizer = "gauss_newton"
    if optimizer not in ("gauss_newton", "lbfgs", "adam"):
        raise InputError(f"optimizer must be 'gauss_newton', 'lbfgs' or 'adam', got {optimizer!r}")
    if iterations is None:
        iterations = 50 if optimizer == "gauss_newton" else 200
    bar = ProgressBar(iterations, f"identify[{method}]", enabled=progress)
    q, v = q.detach(), v.detach()
    if method == "inverse_dynamics":
        fun, count, jac = _id_problem(robot, par, q, v, tau, a, dt, differentiation, friction_width, smoothing)
    else:
        fun, count, jac = _sim_problem(robot, par, q, v, tau, dt, simulator, controls, segment, velocity_weight)
    xi0 = par.xi0.clone()
    if optimizer == "gauss_newton":
        res = levenberg_marquardt(fun, xi0, iterations=iterations, jacobian_fun=jac, progress=bar)
    elif optimizer == "lbfgs":
        res = lbfgs(fun, xi0, iterations=iterations, progress=bar)
    else:
        res = adam(fun, xi0, iterations=iterations, lr=lr, progress=bar)
    bar.close(res.iterations, res.losses[-1])
    fitted = par.model(res.x)
    names = [p for p in IDENTIFIABLE_PARAMETERS if p in params]
    out = {p: getattr(fitted, p).detach() for p in names}
    initial = {p: getattr(robot, p).detach() for p in names}
    fitted = robot.replace(**out)
    losses = [f / count for f in res.losses]
    return IdentificationResult(
        robot=fitted,
        params=out,
        initial=initial,
        losses=losses,
        rms_residual=math.sqrt(losses[-1]),
        iterations=res.iterations,
        evaluations=res.evaluations,
        wall_time=res.wall_time,
        message=res.message,
        method=method,
    )


def _moving_average(x: torch.Tensor, window: int, dim: int) -> torch.Tensor:
    """Mean over ``window`` consecutive entries along ``dim`` (shortens it by ``window - 1``)."""
    if window <= 1:
        return x
    return x.movedim(dim, -1).unfold(-1, window, 1).mean(-1).movedim(-1, dim)


def _id_problem(robot, par: _Parametrisation, q, v, tau, a, dt, differentiation, width, smoothing=1):
    """Residual function ``xi -> r`` through the exact linear regressor."""
    if not isinstance(smoothing, int) or smoothing < 1:
        raise InputError(f"smoothing must be a positive int, got {smoothing!r}")
    if a is None:
        if differentiation == "forward":
            a = (v[..., 1:, :] - v[..., :-1, :]) / dt
            qs, vs = q[..., :-1, :], v[..., :-1, :]
            ts = tau
        elif differentiation == "central":
            a = (v[..., 2:, :] - v[..., :-2, :]) / (2.0 * dt)
            qs, vs = q[..., 1:-1, :], v[..., 1:-1, :]
            ts = None if tau is None else tau[..., 1:, :]
        else:
            raise InputError(f"differentiation must be 'forward' or 'central', got {differentiation!r}")
    else:
        robot.check_vector(a, robot.nv, "a")
        steps = q.shape[-2] - 1
        if a.shape[:-2] != q.shape[:-2] or a.shape[-2] not in (steps, steps + 1):
            raise InputError(f"a must be (..., T, nv) with T = {steps}, got {tuple(a.shape)}")
        a = a[..., :steps, :]
        qs, vs, ts = q[..., :-1, :], v[..., :-1, :], tau
    lead = qs.shape[:-1]  # (..., T') sample times per recording
    if lead[-1] < smoothing:
        raise InputError(f"smoothing={smoothing} needs at least {smoothing} samples with accelerations per recording")
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


def _sim_problem(robot, par: _Parametrisation, q, v, tau, dt, simulator, controls, segment, w_v):
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
        raise InputError("with a simulator, give its controls (..., T, nu)")
    if simulator.dt != dt:
        raise InputError(f"the simulator's dt {simulator.dt} differs from the data's dt {dt}")
    if controls.shape[:-2] != q.shape[:-2] or controls.shape[-2] < steps or controls.shape[-1] != simulator.nu:
        raise InputError(
            f"controls must be (..., {steps}, {simulator.nu}) matching the recordings, got {tuple(controls.shape)}"
        )
    if not isinstance(segment, int) or segment < 1:
        raise InputError(f"segment must be a positive int, got {segment!r}")
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

