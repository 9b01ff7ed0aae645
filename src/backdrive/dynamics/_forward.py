"""Forward dynamics (accelerations from forces) and the joints' own forces."""

from __future__ import annotations

import torch

from .._errors import InputError
from ..kinematics._paths import choose, transforms_active
from ..model import RobotModel
from ._aba import aba_core
from ._crba import crba_core
from ._fast import aba_fast, forward_fast, inverse_dynamics_fast, rnea_vjp_fast
from ._rnea import fast_eligible, rnea_core
from ._tree import broadcast_batch, check_f_ext, f_ext_to_world, gravity_vector, kinematics, topology

__all__ = ["forward_dynamics", "joint_forces", "DEFAULT_FRICTION_WIDTH", "FORWARD_METHODS"]

#: Velocity scale (rad/s or m/s) of the smoothed Coulomb friction ``tanh(v / width)``.
DEFAULT_FRICTION_WIDTH = 1e-2

#: Accepted values of ``forward_dynamics(..., method=)``.
FORWARD_METHODS = ("auto", "crba", "aba")


def joint_forces(robot: RobotModel, v: torch.Tensor, *, friction_width: float = DEFAULT_FRICTION_WIDTH) -> torch.Tensor:
    """Forces the joints apply on themselves: viscous damping and smoothed Coulomb friction.

    ``tau_j = -damping * v_j - friction * tanh(v_j / friction_width)`` per
    joint coordinate, from ``robot.damping`` and ``robot.friction`` (URDF
    ``<dynamics damping friction>``). The ``tanh`` replaces ``sign(v)`` so that
    the force is smooth and its gradient finite at rest; it reaches 76% of the
    Coulomb level at ``|v| = width`` and 99.5% at ``3 width``. The floating
    base's six entries are zero.

    Args:
        robot: the robot model.
        v: ``(..., nv)`` generalised velocity.
        friction_width: velocity scale of the friction smoothing, ``> 0``
            (rad/s for revolute, m/s for prismatic joints).

    Returns:
        ``(..., nv)`` generalised forces.
    """
    robot.check_vector(v, robot.nv, "v")
    if not friction_width > 0:
        raise InputError(f"friction_width must be positive, got {friction_width!r}")
    return _joint_forces(robot, v, friction_width)


def _joint_forces(robot: RobotModel, v: torch.Tensor, width: float) -> torch.Tensor:
    fb = robot.floating_base
    vj = v[..., 6:] if fb else v
    tj = -robot.damping * vj - robot.friction * torch.tanh(vj / width)
    if fb:
        tj = torch.cat([torch.zeros_like(v[..., :6]), tj], -1)
    return tj


def _has_joint_forces(robot: RobotModel) -> bool:
    """Whether :func:`_joint_forces` can be non-zero (or needs a gradient).
    Only read on the CPU, where the check costs no synchronisation (it saves
    a few passes over the batch: 2 % of forward dynamics for the G1 at
    10,000 samples), outside ``torch.compile`` and ``torch.func`` transforms
    (where a tensor's value cannot steer Python); elsewhere the forces are
    always added."""
    d, f = robot.damping, robot.friction
    if d.device.type != "cpu" or d.requires_grad or f.requires_grad or torch.compiler.is_compiling() or transforms_active():
        return True
    return bool(d.any()) or bool(f.any())


def forward_dynamics(
    robot: RobotModel,
    q: torch.Tensor,
    v: torch.Tensor,
    tau: torch.Tensor,
    *,
    f_ext: torch.Tensor | None = None,
    gravity: torch.Tensor | None = None,
    method: str = "auto",
    friction_width: float = DEFAULT_FRICTION_WIDTH,
) -> torch.Tensor:
    """Generalised accelerations under applied forces ``tau``.

    Solves ``M(q) a = tau + tau_joint(v) - C(q, v) v - g(q) + sum_b J_b^T f_ext_b``,
    where ``M`` includes the rotor armature and ``tau_joint`` is the joints'
    damping and smoothed Coulomb friction (:func:`joint_forces`). With zero
    damping and friction this is Pinocchio's ``aba``.

    Args:
        robot: the robot model.
        q: ``(..., nq)`` configuration.
        v: ``(..., nv)`` generalised velocity.
        tau: ``(..., nv)`` applied generalised forces (actuator torques; a
            floating base's entries are a wrench on the base, base frame).
        f_ext: optional ``(..., nb, 6)`` external wrenches, body frame at the
            body origin (as in :func:`inverse_dynamics`).
        gravity: optional ``(..., 3)``; ``robot.gravity`` by default.
        method: ``"auto"`` (the default: the reference path, CRBA and a
            Cholesky solve by plain autograd, below ``FAST_MIN_BATCH``
            samples, 96 with a gradient and 192 without; from there the
            fast path: the batch-last layout,
            a tree-sparse ``L^T D L`` factorisation (dense Cholesky with
            mimic joints) and an analytic backward, ``M^-1`` times the
            incoming gradient and one reverse pass of inverse dynamics),
            ``"crba"`` (the reference path at every batch size) or
            ``"aba"`` (articulated-body algorithm: without a gradient on
            the fast path from ``FAST_MIN_BATCH`` samples, otherwise the
            reference path; not for mimic joints). All three give the same
            values and gradients; see ``docs/dynamics.md``.
        friction_width: velocity scale of the friction smoothing.

    Returns:
        ``(..., nv)`` accelerations (floating base: the derivative of the
        base-frame twist, as Pinocchio). A mass matrix that is not positive
        definite (massless chains without armature) gives NaN, not an error,
        so that no host synchronisation is needed.

    Raises:
        InputError: bad shapes, dtypes or devices, an unknown ``method``, or
            ``"aba"`` on a model with mimic joints.
    """
    return _forward_dynamics(robot, q, v, tau, f_ext, gravity, method, friction_width)


def _forward_dynamics(robot, q, v, tau, f_ext, gravity, method, friction_width, traced: bool = False):
    """:func:`forward_dynamics`; ``traced``: inside ``torch.compile``
    (:func:`compile_forward_dynamics`), where the custom backward cannot be
    traced: the reference path when a gradient is needed.
    """
    if method not in FORWARD_METHODS:
        raise InputError(f"unknown forward dynamics method {method!r}; valid: {', '.join(FORWARD_METHODS)}")
    if not friction_width > 0:
        raise InputError(f"friction_width must be positive, got {friction_width!r}")
    nv = robot.nv
    g = gravity_vector(robot, gravity)
    batch, (q, v, tau, g) = broadcast_batch(robot, q, (v, nv, "v"), (tau, nv, "tau"), (g, 3, "gravity"))
    check_f_ext(robot, f_ext)
    topo = topology(robot)
    if method == "aba" and topo.coupled:
        raise InputError(
            f"method='aba' needs independent joints but robot {robot.name!r} has mimic joints; "
            "use method='crba'"
        )
    if _has_joint_forces(robot):
        tau = tau + _joint_forces(robot, v, friction_width)
    params = tuple(getattr(robot, k) for k in _MASS_PARAMETERS)
    inputs = (q, v, tau, g, f_ext) + params
    needs_grad = torch.is_grad_enabled() and any(x is not None and x.requires_grad for x in inputs)
    if method == "aba":
        if not needs_grad and choose("forward_dynamics_no_grad", batch.numel(), fast_eligible(topo, batch, f_ext)):
            return aba_fast(robot, q, v, tau, g, f_ext)
        kin = kinematics(robot, topo, q)
        fw = None if f_ext is None else f_ext_to_world(topo, kin, f_ext)
        return aba_core(robot, topo, kin, v, tau, g, fw)
    # The one branch point: the reference path (CRBA, RNEA and a Cholesky
    # solve, batch-first, plain autograd) or the fast path (batch-last,
    # tree-sparse factorisation, analytic backward).
    fast = (
        method == "auto"
        and not (traced and needs_grad)
        and choose(
            "forward_dynamics" if needs_grad else "forward_dynamics_no_grad",
            batch.numel(),
            fast_eligible(topo, batch, f_ext),
        )
    )
    if not fast:
        return _plain_crba(robot, topo, q, v, tau, g, f_ext)
    if needs_grad:
        return _ForwardDynamics.apply(robot, *inputs)
    return forward_fast(robot, q, v, tau, g, f_ext, base_frame=True)[0]


#: Physical parameters the equations of motion ``M a + b = tau`` depend on
#: (besides gravity; damping and friction enter through ``tau``).
_MASS_PARAMETERS = ("body_mass", "body_com", "body_inertia", "armature")


def _plain_crba(robot, topo, q, v, tau, g, f_ext) -> torch.Tensor:
    """The reference path: CRBA, RNEA and a Cholesky solve, all by plain autograd."""
    kin = kinematics(robot, topo, q)
    fw = None if f_ext is None else f_ext_to_world(topo, kin, f_ext)
    M = crba_core(robot, topo, kin)
    rhs = tau - rnea_core(robot, topo, kin, v, None, g, fw)
    # cholesky_ex: no error check, so no host synchronisation in the hot path.
    L, _ = torch.linalg.cholesky_ex(M)
    return torch.cholesky_solve(rhs[..., None], L)[..., 0]


class _ForwardDynamics(torch.autograd.Function):
    """Forward dynamics with the analytic backward of ``M(q) a + b(q, v) = tau``.

    Differentiating the equations of motion at the solution gives
    ``M da = dtau - d(RNEA)(q, v, a)`` with ``a`` held fixed, so for an
    incoming gradient ``g``: ``grad tau = lam = M^-1 g`` (the factor of the
    forward pass reused) and the gradient with respect to everything else
    (``q``, ``v``, gravity, external wrenches, masses, inertias, armature) is
    ``-lam^T d(RNEA)/d(.)``, one vector-Jacobian product of inverse dynamics
    at ``(q, v, a)`` (Carpentier and Mansard 2018). Forward plus backward then
    costs the forward pass, one solve and one RNEA with its backward, instead
    of the backward of CRBA, RNEA and the Cholesky factorisation.

    A double backward (``create_graph=True``) recomputes the forward pass by
    plain autograd and differentiates that, so it is differentiable again.
    """

    @staticmethod
    def forward(ctx, robot, q, v, tau, g, f_ext, *params):
        topo = topology(robot)
        a, factor = forward_fast(robot, q, v, tau, g, f_ext)
        ctx.robot, ctx.topo, ctx.factor = robot, topo, factor
        ctx.save_for_backward(q, v, tau, g, f_ext, a, *params)
        return a

    @staticmethod
    def backward(ctx, grad_a):
        q, v, tau, g, f_ext, a, *params = ctx.saved_tensors
        robot, topo = ctx.robot, ctx.topo
        need = ctx.needs_input_grad[1:]
        inputs = (q, v, tau, g, f_ext, *params)
        wanted = [i for i, (x, n) in enumerate(zip(inputs, need)) if n and x is not None]
        out = [None] * len(inputs)
        if torch.is_grad_enabled():
            # create_graph: differentiate the plain-autograd forward pass, so
            # that the gradient is itself differentiable.
            acc = _plain_crba(robot, topo, q, v, tau, g, f_ext)
            grads = torch.autograd.grad(acc, [inputs[i] for i in wanted], grad_a, create_graph=True, allow_unused=True)
            for i, gr in zip(wanted, grads):
                out[i] = gr
            return (None, *out)
        lam = ctx.factor.solve(grad_a)
        if need[2]:
            out[2] = lam
        rest = [i for i in wanted if i != 2]
        if rest and f_ext is None and set(rest) <= {0, 1}:
            # The reverse pass of RNEA and forward kinematics, written out.
            gq, gv = rnea_vjp_fast(robot, q, v, a.detach(), g, -lam, ctx.factor.kin)
            out[0] = gq if 0 in rest else None
            out[1] = gv if 1 in rest else None
        elif rest:
            with torch.enable_grad():
                leaves = [x.detach().requires_grad_(i in rest) if x is not None else None for i, x in enumerate(inputs)]
                model = robot
                replaced = {k: leaves[5 + j] for j, k in enumerate(_MASS_PARAMETERS) if 5 + j in rest}
                if replaced:
                    model = robot.replace(**replaced)
                tau_id = inverse_dynamics_fast(model, leaves[0], leaves[1], a.detach(), leaves[3], leaves[4])
                grads = torch.autograd.grad(tau_id, [leaves[i] for i in rest], -lam, allow_unused=True)
            for i, gr in zip(rest, grads):
                out[i] = gr
        return (None, *out)
