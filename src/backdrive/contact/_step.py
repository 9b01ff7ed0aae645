"""One time step with contact: semi-implicit Euler with a world-frame base update."""

from __future__ import annotations

import torch

from ..dynamics import integrate
from ..kinematics._paths import transforms_active
from ..model import RobotModel
from ..spatial import quat_apply, quat_conjugate, quat_multiply, rotvec_to_quat
from ..spatial._common import small_angle_threshold

__all__ = ["integrate_world", "contact_step"]


def integrate_world(
    robot: RobotModel, q: torch.Tensor, v: torch.Tensor, a: torch.Tensor, dt: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """A semi-implicit Euler step whose base moves in a straight line.

    Joints and base angular velocity: ``v' = v + dt a``, ``q' = q + dt v'``
    (orientation ``R' = R exp(dt omega')``). Base linear velocity: the
    classical acceleration of the base origin, ``a_lin + omega x v_lin``, is
    integrated in the frame at the start of the step, the origin moves in a
    straight line with that velocity, and the result is re-expressed in the
    turned frame with the exact rotation ``exp(-dt omega')``. MuJoCo moves a
    free body the same way (world linear velocity, then the rotation).

    Why not ``v + dt a`` with :func:`backdrive.dynamics.integrate` (the
    screw motion of a constant base-frame twist)? Both are first order, but
    for a body that spins while it translates they are biased: the Euler
    update of the base-frame velocity, whose ``-omega x v`` term turns it
    with the frame, grows its norm by ``(omega dt)^2 / 2`` per step, and the
    screw motion of a rolling body turns about the contact point, lowering
    its centre by ``r (omega dt)^2 / 2`` per step, which a stiff ground
    pushes back. Measured on a sphere rolling at 1.43 m/s at 1 ms steps: it
    gained 7 % of its speed per second that way, and keeps it to 1e-9 this
    way.

    Args:
        q: ``(..., nq)``. v: ``(..., nv)``. a: ``(..., nv)`` acceleration
            (the dynamics' convention: derivative of the base-frame
            components). dt: s.

    Returns:
        ``q1 (..., nq)`` and ``v1 (..., nv)``.
    """
    if not robot.floating_base:
        v1 = torch.add(v, a, alpha=dt)
        return integrate(robot, q, v1, dt), v1
    if torch.is_grad_enabled() and not transforms_active() and (q.requires_grad or v.requires_grad or a.requires_grad):
        return _IntegrateWorld.apply(q, v, a, float(dt))
    return _integrate_world_floating(q, v, a, dt)


def _integrate_world_floating(q, v, a, dt, keep: bool = False):
    """:func:`integrate_world` of a floating base, plain operations (the
    reference of :class:`_IntegrateWorld`, and its forward; ``keep`` also
    returns the turn, the start-frame velocity ``lin``, ``|quat0 turn|``
    and the rotation vector ``dt omega1`` for its backward)."""
    v1 = torch.add(v, a, alpha=dt)
    quat0 = q[..., 3:7]
    lin0, omega0, omega1 = v[..., :3], v[..., 3:6], v1[..., 3:6]
    # Origin velocity in the start frame after the step (classical acceleration).
    lin = lin0 + dt * (a[..., :3] + torch.linalg.cross(omega0, lin0))
    rot = dt * omega1
    turn = rotvec_to_quat(rot)
    quat1 = quat_multiply(quat0, turn)
    norm = torch.linalg.vector_norm(quat1, dim=-1, keepdim=True)
    quat1 = quat1 / norm
    p1 = q[..., :3] + dt * quat_apply(quat0, lin)
    lin1 = quat_apply(quat_conjugate(turn), lin)
    q1 = torch.cat([p1, quat1, q[..., 7:] + dt * v1[..., 6:]], -1)
    if keep:
        return q1, torch.cat([lin1, v1[..., 3:]], -1), turn, lin, norm, rot
    return q1, torch.cat([lin1, v1[..., 3:]], -1)


# ------------------------------------------------- the hand-written backward
#
# At batch 1 every tensor operation costs a few microseconds whatever its
# size, so the backward below is written for few operations: the two
# quaternion products' transposes are one gathered (8, 4) matrix, and the
# two rotations by the quaternion formula (of Q0 into the world, of conj(T)
# into the turned frame) share each step along a stacked axis of 2.

# Q0 T = R(T) Q0 = L(Q0) T (Hamilton products as 4 x 4 matrices); their
# gradients are R(T)^T g and L(Q0)^T g. Row i of R(T)^T, then of L(Q0)^T,
# gathered from cat([Q0, T]) (T at offset 4) with these signs.
_PROD_INDEX = (
    [4 + i for i in (0, 1, 2, 3, 1, 0, 3, 2, 2, 3, 0, 1, 3, 2, 1, 0)]
    + [0, 1, 2, 3, 1, 0, 3, 2, 2, 3, 0, 1, 3, 2, 1, 0]
)
_PROD_SIGN = (
    [1, 1, 1, 1, -1, 1, -1, 1, -1, 1, 1, -1, -1, -1, 1, 1]  # R(T)^T
    + [1, 1, 1, 1, -1, 1, 1, -1, -1, -1, 1, 1, -1, 1, -1, 1]  # L(Q0)^T
)
_CONJ_SECOND = [[1, 1, 1, 1], [1, -1, -1, -1]]  # stacked [Q0, T] -> [Q0, conj(T)]
# Taylor series in t2 = |r|^2 of k = sin(t/2) / t (from rotvec_to_quat's
# nested form) and of dk/dt2: coefficients of t2, t2^2, t2^3, t2^4, then the constants.
_SERIES = [[-1 / 48, 1 / 1920], [1 / 3840, -1 / 215040], [-1 / 645120, 1 / 46448640], [1 / 185794560, 0.0]]
_SERIES_CONST = [0.5, -1 / 48]
_constants: dict = {}


def _backward_constants(dtype: torch.dtype, device: torch.device):
    """The index and sign tables above as tensors, made once per dtype and device."""
    key = (dtype, device)
    c = _constants.get(key)
    if c is None:
        c = _constants[key] = (
            torch.tensor(_PROD_INDEX, device=device),
            torch.tensor(_PROD_SIGN, dtype=dtype, device=device),
            torch.tensor(_CONJ_SECOND, dtype=dtype, device=device),
            (
                torch.tensor(_SERIES, dtype=dtype, device=device),
                torch.tensor(_SERIES_CONST, dtype=dtype, device=device),
            ),
        )
    return c


def _turn_grad(r, gT, series):
    """Gradient with respect to ``r`` of ``gT . rotvec_to_quat(r)``.

    ``rotvec_to_quat(r) = [w(t2), k(t2) r]`` with ``t2 = |r|^2``,
    ``w = cos(t/2)``, ``k = sin(t/2) / t``: ``dw/dt2 = -k / 4`` and
    ``dk/dt2 = (w / 2 - k) / (2 t2)``, below the small-angle threshold the
    Taylor series of ``k`` and of ``dk/dt2`` (``series``: their coefficients
    of ``t2 .. t2^4`` as a ``(4, 2)`` matrix and their constant terms), so
    the gradient is ``k g_u + r (2 dk/dt2 (r . g_u) - k g_w / 2)``.
    """
    t2 = (r * r).sum(-1, keepdim=True)
    thr2 = small_angle_threshold(r.dtype) ** 2
    # The closed forms only where they are used; clamped so they stay finite elsewhere.
    safe = t2.clamp_min(thr2)
    theta = safe.sqrt()
    half = 0.5 * theta
    k = half.sin() / theta
    closed = torch.cat([k, (0.5 * half.cos() - k) / (2.0 * safe)], -1)
    coef, const = series
    taylor = torch.addmm(const, t2.expand(*t2.shape[:-1], 4).cumprod(-1).view(-1, 4), coef).view(closed.shape)
    k, dk = torch.where(t2 < thr2, taylor, closed).split_with_sizes([1, 1], -1)
    gw, gu = gT.split_with_sizes([1, 3], -1)
    c = torch.addcmul(2.0 * dk * (r * gu).sum(-1, keepdim=True), k, gw, value=-0.5)
    return torch.addcmul(k * gu, r, c)


def _expand(shape, *xs):
    return [x if x.shape[:-1] == shape else x.expand(*shape, x.shape[-1]) for x in xs]


class _IntegrateWorld(torch.autograd.Function):
    """:func:`integrate_world` of a floating base with the backward written
    out: one autograd node per step instead of about 110 (the quaternion
    product, exponential, normalisation and rotations of ``_integrate_world_floating``),
    each a handful of small operations at batch 1. Under ``create_graph``
    (double backward) the backward runs the plain operations under autograd,
    so it is differentiable again.

    The backward, for incoming ``g_p1, g_Q1, g_lin1, g_omega1`` (and the
    joints'): the normalisation ``Q1 = Qu / |Qu|`` gives ``g_Qu = (g_Q1 -
    Q1 (Q1 . g_Q1)) / |Qu|``; the product ``Qu = Q0 T`` gives ``R(T)^T g_Qu``
    to ``Q0`` and ``L(Q0)^T g_Qu`` to ``T``; each rotation by the formula
    ``P(Q) x = x + 2 w u x x + 2 u x (u x x)`` (``p1 = p0 + dt P(Q0) lin``,
    ``lin1 = P(conj T) lin``), exact for any ``Q``, gives ``g_x = P(Q)^T g
    = P(conj Q) g`` and ``g_w = 2 u . (x x g)``, ``g_u = 2 (w x x g + (u .
    x) g + (u . g) x - 2 (x . g) u)``; then ``lin = l0 + dt (a_lin + omega0
    x l0)`` and the exponential ``T = exp(dt omega1)`` (:func:`_turn_grad`)."""

    @staticmethod
    def forward(ctx, q, v, a, dt):
        shape = torch.broadcast_shapes(q.shape[:-1], v.shape[:-1], a.shape[:-1])
        ctx.shape = shape
        q1, v1, turn, lin, norm, rot = _integrate_world_floating(*_expand(shape, q, v, a), dt, keep=True)
        ctx.dt = dt
        ctx.save_for_backward(q, v, a, q1, turn, lin, norm, rot)
        return q1, v1

    @staticmethod
    def backward(ctx, gq1, gv1):
        q_in, v_in, a_in, q1, T, lin, nrm, r = ctx.saved_tensors
        dt = ctx.dt
        sq, sv, sa = q_in.shape, v_in.shape, a_in.shape
        if gq1 is None:
            gq1 = torch.zeros_like(q1)
        if gv1 is None:
            gv1 = torch.zeros_like(v_in.expand(*ctx.shape, v_in.shape[-1]))
        if torch.is_grad_enabled():  # create_graph: plain autograd, differentiable again
            with torch.enable_grad():
                ins = [x if x.requires_grad else x.detach().requires_grad_(True) for x in (q_in, v_in, a_in)]
                outs = _integrate_world_floating(*_expand(ctx.shape, *ins), dt)
                gq, gv, ga = torch.autograd.grad(outs, ins, (gq1, gv1), create_graph=True, allow_unused=True)
            return gq, gv, ga, None
        index, sign, conj2, series = _backward_constants(q1.dtype, q1.device)
        q, v = _expand(ctx.shape, q_in, v_in)
        nj = q.shape[-1] - 7
        Q0 = q[..., 3:7]
        l0, o0, _ = v.split_with_sizes([3, 3, nj], -1)
        Q1 = q1[..., 3:7]
        gp1, gQ1, gqj = gq1.split_with_sizes([3, 4, nj], -1)
        glin1, go1, gvj = gv1.split_with_sizes([3, 3, nj], -1)
        batch = Q0.shape[:-1]
        # Normalisation, then the product Qu = Q0 T: [R(T)^T g_Qu, L(Q0)^T g_Qu].
        gQu = (gQ1 - Q1 * (Q1 * gQ1).sum(-1, keepdim=True)) / nrm
        mats = (torch.cat([Q0, T], -1).index_select(-1, index) * sign).view(*batch, 8, 4)
        g_prod = (mats * gQu[..., None, :]).sum(-1).view(*batch, 2, 4)
        # The two rotations of lin, stacked: P(Q0) (g = dt g_p1), P(conj T) (g = g_lin1).
        Qs = torch.stack([Q0, T], -2) * conj2
        w, u = Qs.split_with_sizes([1, 3], -1)
        G = torch.stack([dt * gp1, glin1], -2)
        x = lin[..., None, :]
        c = torch.linalg.cross(x, G)
        g_rot = torch.cat([(u * c).sum(-1, keepdim=True),
                           torch.addcmul(torch.addcmul(torch.addcmul(w * c, (u * x).sum(-1, keepdim=True), G),
                                                       (u * G).sum(-1, keepdim=True), x),
                                         (x * G).sum(-1, keepdim=True), u, value=-2.0)], -1)
        gQ = torch.addcmul(g_prod, g_rot, conj2, value=2.0)  # [g_Q0, g_T]
        t = 2.0 * torch.linalg.cross(u, G)
        glin = (G - w * t + torch.linalg.cross(u, t)).sum(-2)  # P(conj Q) g of both, summed
        # lin = l0 + dt (a_lin + omega0 x l0).
        gl0 = torch.add(glin, torch.linalg.cross(glin, o0), alpha=dt)
        go0 = dt * torch.linalg.cross(l0, glin)
        # T = exp(r), r = dt omega1; v1 = v + dt a (only its angular and joint parts are used).
        gQ0, gT = gQ.unbind(-2)
        go1 = torch.add(go1, _turn_grad(r, gT, series), alpha=dt)
        gvj = torch.add(gvj, gqj, alpha=dt)  # through v1's joint rates
        gv = torch.cat([gl0, go0 + go1, gvj], -1)
        ga = dt * torch.cat([glin, go1, gvj], -1)
        gq = torch.cat([gp1, gQ0, gqj], -1)
        return gq.sum_to_size(sq), gv.sum_to_size(sv), ga.sum_to_size(sa), None


def contact_step(robot: RobotModel, contact, q, v, tau, dt: float, *, scheme: str = "implicit", gravity=None):
    """One step with contact: ``a = contact.acceleration(...)``, then :func:`integrate_world`.

    Args:
        robot: the model. contact: :class:`ContactModel`.
        q: ``(..., nq)``. v: ``(..., nv)``. tau: ``(..., nv)`` applied forces.
        dt: s. scheme: ``"implicit"`` or ``"explicit"``.

    Returns:
        ``q1``, ``v1`` and the :class:`ContactResult` at the start of the step.
    """
    a, res = contact.acceleration(robot, q, v, tau, dt=dt, scheme=scheme, gravity=gravity)
    q1, v1 = integrate_world(robot, q, v, a, dt)
    return q1, v1, res
