"""MuJoCo's soft-constraint contact, solved exactly and differentiably.

``ContactModel(robot, geometry, terrain, params=SoftContactParameters(...))``
replaces the penalty law (:mod:`._law`) by the contact model of MuJoCo
(https://mujoco.readthedocs.io/en/stable/computation/index.html, *Soft
constraints*): every point in contact is a three-row constraint (normal
and two tangents, an elliptic friction cone), and the step's acceleration
``a`` minimises the convex cost

    0.5 (a - a0)^T M (a - a0) + sum_c s_c(J_c a - a_ref,c)

where ``a0 = M^-1 (tau - h)`` is the unconstrained acceleration, ``J_c``
the contact frame's rows of the point Jacobian and ``s_c`` the soft cone
cost: zero when the row acceleration ``jar = J_c a - a_ref`` lies in the
dual cone (separating), ``0.5 sum_i D_i jar_i^2`` when it lies in the
negative of the friction cone (sticking), and ``0.5 D_m (N - mu_r T)^2``
in between (sliding on the cone), with ``N = mu_r jar_0``, ``T = mu
|jar_t|``. The force is ``f = -ds/djar``.

Per contact:

* impedance ``d(r)`` from ``impedance = (d0, dwidth, width, midpoint,
  power)`` (MuJoCo's ``solimp``) at the signed distance ``r`` (negative in
  penetration);
* reference acceleration ``a_ref = -b v - k d r`` on the normal row and
  ``-b v_t`` on the tangent rows, with ``b = 2 / (dwidth tc)``, ``k = 1 /
  (dwidth^2 tc^2 zeta^2)`` (``solref = (tc, zeta)``: time constant and
  damping ratio; ``tc`` at least two steps);
* regulariser ``R = (1 - d) / d * A~`` on the normal row and ``R /
  impratio`` on the tangent rows, ``D = 1 / R``, where ``A~`` is MuJoCo's
  constant estimate of the row's inverse inertia: the translational
  ``body_invweight0`` of the point's link (the trace of ``J M^-1 J^T / 3``
  at the link's centre of mass in the zero configuration), computed from
  the robot the model is built with;
* the regularised cone's ``mu_r = mu / sqrt(impratio)``.

The cost is minimised by Newton's method with a line search over step
sizes (converged to rounding at the default tolerance). Its gradient is
that of the converged solution (implicit function theorem): the last
Newton step is taken again under autograd from the detached solution, so
``d a / d theta = -H^-1 d g / d theta``. With ``extra_damping`` (PD
velocity gains, joint damping: MuJoCo's ``implicitfast``) the velocity
update uses ``M + dt diag(D)`` with the constraint forces of the solve:
``a = (M + dt D)^-1 (tau - h + J^T f)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import torch

from .._errors import InputError, InvalidValueError, UnknownNameError
from ..dynamics import bias_forces, joint_forces, mass_matrix
from ..dynamics._forward import _has_joint_forces
from ..kinematics import body_transforms
from ..kinematics._fk import point_jacobians, point_support
from ..kinematics._paths import transforms_active

__all__ = ["SoftContactParameters", "soft_acceleration", "invweight"]

# MuJoCo's clamps: impedance in [1e-4, 0.9999]; friction at least 1e-5; R at least 1e-15.
_MIN_IMP, _MAX_IMP = 1e-4, 0.9999
_MIN_MU = 1e-5
_MIN_VAL = 1e-15
# Newton: most iterations (the solve stops earlier once the step is below
# the tolerance; under torch.func transforms every iteration runs) and the
# line search's step sizes 2^0 .. 2^-(n-1).
MAX_ITERATIONS = 40
TRANSFORM_ITERATIONS = 16
_LINE_STEPS = 20


@dataclass(frozen=True)
class SoftContactParameters:
    """MuJoCo's soft contact: ``solref``, ``solimp``, friction and ``impratio``.

    Each of ``timeconst``, ``dampratio`` and ``friction`` is a float or a
    tensor (which may require grad) of shape ``()`` or ``(ns,)`` (one per
    shape of the geometry) or ``(..., 1)`` / ``(..., ns)`` with leading
    batch axes. The defaults are MuJoCo's (``solref = (0.02, 1)``,
    ``solimp = (0.9, 0.95, 0.001, 0.5, 2)``, friction 1, ``impratio`` 1).

    Attributes:
        timeconst: ``solref[0]``, s, ``> 0``: time constant of the contact's
            reference spring-damper (at least two steps are used, as MuJoCo's
            ``refsafe``).
        dampratio: ``solref[1]``, ``> 0``: its damping ratio.
        friction: sliding friction coefficient ``mu``, ``> 0`` (clamped at
            1e-5 as MuJoCo does; a terrain's own ``friction`` replaces it).
        impedance: ``solimp``, five floats ``(d0, dwidth, width, midpoint,
            power)``: the impedance rises from ``d0`` at the surface to
            ``dwidth`` at a penetration of ``width`` metres.
        impratio: ratio of the friction rows' to the normal row's
            impedance (MuJoCo's ``opt.impratio``), ``> 0``.
    """

    timeconst: object = 0.02
    dampratio: object = 1.0
    friction: object = 1.0
    impedance: tuple = (0.9, 0.95, 0.001, 0.5, 2.0)
    impratio: float = 1.0

    def replace(self, **changes) -> SoftContactParameters:
        """A copy with some values changed."""
        valid = [f.name for f in fields(self)]
        for k in changes:
            if k not in valid:
                raise UnknownNameError("soft contact parameter", k, valid)
        return SoftContactParameters(**{**{f.name: getattr(self, f.name) for f in fields(self)}, **changes})


def resolve_soft(params: SoftContactParameters, shape_links, dtype, device) -> dict:
    """Check every value once; tensors of the model's dtype (``timeconst``,
    ``dampratio``, ``friction``) and floats (``impedance``, ``impratio``)."""
    from ._law import resolve_value

    if not isinstance(params, SoftContactParameters):
        raise InputError(f"params must be SoftContactParameters, got {type(params).__name__}")
    out = {name: resolve_value("soft contact parameter", name, getattr(params, name), True, shape_links, dtype, device)
           for name in ("timeconst", "dampratio", "friction")}
    imp = params.impedance
    try:
        imp = tuple(float(x) for x in imp)
    except (TypeError, ValueError):
        raise InvalidValueError(f"impedance must be five numbers (d0, dwidth, width, midpoint, power), got {imp!r}") from None
    if len(imp) != 5 or not all(math.isfinite(x) for x in imp):
        raise InvalidValueError(f"impedance must be five finite numbers (d0, dwidth, width, midpoint, power), got {imp!r}")
    d0, dw, width, mid, power = imp
    if not (0 < d0 < 1 and 0 < dw < 1):
        raise InvalidValueError(f"impedance d0 and dwidth must lie in (0, 1), got {d0}, {dw}")
    if not (width >= 0 and 0 < mid < 1 and power >= 1):
        raise InvalidValueError(
            f"impedance needs width >= 0, 0 < midpoint < 1 and power >= 1, got width {width}, midpoint {mid}, power {power}")
    clamp = lambda x: min(_MAX_IMP, max(_MIN_IMP, x))  # noqa: E731
    out["impedance"] = (clamp(d0), clamp(dw), width, clamp(mid), power)
    ratio = params.impratio
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not (math.isfinite(ratio) and ratio > 0):
        raise InvalidValueError(f"impratio must be a finite number > 0, got {ratio!r}")
    out["impratio"] = float(ratio)
    return out


def invweight(robot, geometry) -> torch.Tensor:
    """``(np,)`` MuJoCo's ``body_invweight0`` (translation) of each point's link.

    The average diagonal of ``J M^-1 J^T`` for the translational Jacobian
    ``J`` at the link's centre of mass, in the zero configuration (base at
    the origin, joints at 0): a constant of the model, differentiable in the
    masses and inertias. Points on the same link share the value.
    """
    q0 = robot.neutral()
    Rb, pb = body_transforms(robot, q0)
    body = geometry.point_body
    com = (Rb.index_select(-3, body) * robot.body_com.index_select(0, body)[:, None, :]).sum(-1) + pb.index_select(-2, body)
    J = point_jacobians(robot, Rb, pb, com, point_support(robot, body))  # (np, 3, nv)
    M = mass_matrix(robot, q0)
    L = torch.linalg.cholesky(M)
    Jf = J.reshape(-1, J.shape[-1])
    X = torch.cholesky_solve(Jf.transpose(-1, -2), L)  # (nv, 3 np)
    A = (Jf * X.transpose(-1, -2)).sum(-1).reshape(J.shape[:-1])  # diagonal entries, (np, 3)
    return A.mean(-1)


def _impedance(pos: torch.Tensor, imp: tuple) -> torch.Tensor:
    """MuJoCo's ``d(r)`` at signed distance ``pos`` (margin 0)."""
    d0, dw, width, mid, power = imp
    if d0 == dw or width <= 1e-15:
        return torch.full_like(pos, 0.5 * (d0 + dw))
    x = (pos.abs() / width).clamp(max=1.0)
    if power == 1:
        y = x
    else:
        a = 1.0 / mid ** (power - 1)
        b = 1.0 / (1.0 - mid) ** (power - 1)
        low = a * x.clamp(max=mid) ** power
        high = 1.0 - b * (1.0 - x.clamp(min=mid)) ** power
        y = torch.where(x <= mid, low, high)
    return d0 + y * (dw - d0)


def _tangents(n: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Two unit tangents ``t1, t2`` with ``(n, t1, t2)`` right-handed."""
    ex = torch.zeros_like(n)
    ex[..., 0] = 1.0
    ey = torch.zeros_like(n)
    ey[..., 1] = 1.0
    a = torch.where((n[..., :1].abs() < 0.9), ex, ey)
    t1 = a - (a * n).sum(-1, keepdim=True) * n
    t1 = t1 / t1.norm(dim=-1, keepdim=True)
    return t1, torch.linalg.cross(n, t1)


def _cone(jar, D, mu_r, mu, active, hessian: bool):
    """Force ``f = -ds/djar`` ``(..., P, 3)``, cost ``s`` ``(..., P)`` and,
    if asked, the Hessian ``(..., P, 3, 3)`` of the elliptic soft cone."""
    U0 = jar[..., 0] * mu_r
    Ut = jar[..., 1:] * mu[..., None]
    # |Ut| with a finite derivative at 0 (norm's is 0/0 there, NaN under autograd
    # even where the result is masked out).
    T2 = (Ut * Ut).sum(-1)
    T = torch.where(T2 > 0, T2.clamp_min(torch.finfo(jar.dtype).tiny).sqrt(), torch.zeros_like(T2))
    N = U0
    top = (N >= mu_r * T) | ~active
    bottom = ~top & (mu_r * N + T <= 0)
    middle = ~top & ~bottom
    Ts = torch.where(T > 0, T, torch.ones_like(T))
    Dm = D[..., 0] / (mu_r * mu_r * (1 + mu_r * mu_r))
    NmT = N - mu_r * T
    f_bot = -D * jar
    f0 = -Dm * NmT * mu_r
    f_mid = torch.cat([f0[..., None], (-f0 / Ts)[..., None] * Ut * mu[..., None]], -1)
    zero = torch.zeros_like(jar)
    f = torch.where(bottom[..., None], f_bot, torch.where(middle[..., None], f_mid, zero))
    s_bot = 0.5 * (D * jar * jar).sum(-1)
    s = torch.where(bottom, s_bot, torch.where(middle, 0.5 * Dm * NmT * NmT, torch.zeros_like(s_bot)))
    if not hessian:
        return f, s, None
    H_bot = torch.diag_embed(D)
    u = Ut / Ts[..., None]  # unit tangent direction in U space
    # In U space: [[1, -mu_r u^T], [-mu_r u, mu_r N / T u u^T + (mu_r^2 - mu_r N / T) I]], times Dm.
    first = torch.cat([torch.ones_like(T)[..., None], -mu_r[..., None] * u], -1)  # (..., P, 3)
    c = (mu_r * N / Ts)[..., None, None]
    block = c * u[..., :, None] * u[..., None, :] + (mu_r * mu_r - mu_r * N / Ts)[..., None, None] * torch.eye(
        2, dtype=jar.dtype, device=jar.device)
    lower = torch.cat([first[..., 1:, None], block], -1)  # (..., P, 2, 3)
    Hu = torch.cat([first[..., None, :], lower], -2) * Dm[..., None, None]
    S = torch.stack([mu_r, mu, mu], -1)
    H_mid = Hu * S[..., :, None] * S[..., None, :]
    H = torch.where(bottom[..., None, None], H_bot, torch.where(middle[..., None, None], H_mid, torch.zeros_like(H_bot)))
    return f, s, H


def _newton(M, a0, Jc, aref, D, mu_r, mu, active):
    """The minimiser ``a`` of the soft-constraint cost (no gradient): Newton
    steps with the exact cost evaluated along each step at every step size
    ``2^0 .. 2^-19`` and 0, the best kept, until the step is at rounding
    level (every iteration under torch.func transforms or compile)."""
    a = a0
    dtype = a.dtype
    tol = 1e3 * torch.finfo(dtype).eps
    steps = 0.5 ** torch.arange(_LINE_STEPS, dtype=dtype, device=a.device)
    steps = torch.cat([steps, steps.new_zeros(1)])  # alpha = 0: never worse
    fixed = transforms_active() or torch.compiler.is_compiling()
    iterations = TRANSFORM_ITERATIONS if fixed else MAX_ITERATIONS
    for _ in range(iterations):
        Ja = (Jc * a[..., None, None, :]).sum(-1)
        jar = Ja - aref
        f, _, Hc = _cone(jar, D, mu_r, mu, active, True)
        e = a - a0
        Me = (M @ e[..., None])[..., 0]
        g = Me - (Jc * f[..., None]).sum((-3, -2))
        JH = torch.einsum("...pij,...pjn->...pin", Hc, Jc)
        H = M + torch.einsum("...pim,...pin->...mn", Jc, JH)
        d = -torch.cholesky_solve(g[..., None], torch.linalg.cholesky(H))[..., 0]
        # Exact cost along a + alpha d at every candidate alpha.
        Md = (M @ d[..., None])[..., 0]
        eMe, eMd, dMd = (e * Me).sum(-1), (e * Md).sum(-1), (d * Md).sum(-1)
        Jd = (Jc * d[..., None, None, :]).sum(-1)
        al = steps.view(-1, *([1] * jar.dim()))
        _, s, _ = _cone(jar + al * Jd, D, mu_r, mu, active, False)
        al1 = steps.view(-1, *([1] * (jar.dim() - 2)))
        cost = 0.5 * eMe + al1 * eMd + 0.5 * al1 * al1 * dMd + s.sum(-1)
        best = steps[cost.argmin(0)]
        step = best[..., None] * d
        a = a + step
        if not fixed and bool((step.abs().amax(-1) <= tol * (1 + a.abs().amax(-1))).all()):
            break
    return a


def soft_acceleration(model, robot, q, v, tau, dt, gravity=None, extra_damping=None):
    """``(a, ContactResult)`` of one step with MuJoCo's soft contact (module docstring)."""
    from ._model import ContactResult

    sp = model._soft
    g = model.geometry
    robot.check_q(q)
    robot.check_vector(v, robot.nv, "v")
    Rb, pb = body_transforms(robot, q)
    centre = model._centres(Rb, pb)
    dist, n = model.terrain.query(centre)
    radius = g.point_radius
    phi = radius - dist  # penetration, positive inside
    point = centre - (radius - 0.5 * phi)[..., None] * n  # MuJoCo: midway between surface and terrain
    J = point_jacobians(robot, Rb, pb, point, model._support)  # (..., P, 3, nv)
    t1, t2 = _tangents(n)
    frame = torch.stack([n, t1, t2], -2)  # (..., P, 3, 3) rows
    Jc = frame @ J
    vel = (Jc * v[..., None, None, :]).sum(-1)  # (..., P, 3)

    from ._law import per_point

    ps = g.point_shape
    tc = per_point(sp["timeconst"], ps).clamp_min(2.0 * dt)
    zeta = per_point(sp["dampratio"], ps)
    mu = per_point(model._p["friction"], ps).clamp_min(_MIN_MU)  # a terrain's own friction is in _p
    imp_p = sp["impedance"]
    dmax = imp_p[1]
    imp = _impedance(-phi, imp_p)
    K = 1.0 / (dmax * dmax * tc * tc * zeta * zeta)
    B = 2.0 / (dmax * tc)
    B = torch.broadcast_to(B, phi.shape)
    aref = torch.cat([(-B * vel[..., 0] + K * imp * phi)[..., None], -B[..., None] * vel[..., 1:]], -1)
    if robot.floating_base:
        # MuJoCo's free joint moves with the world-frame velocity of the base
        # origin, so its row acceleration J a_mj has the base's classical
        # acceleration a_lin + w x v_lin (what integrate_world integrates):
        # J a_mj = J (a + c), c = (w x v_lin, 0).
        v_lin, w = v[..., :3], v[..., 3:6]
        c = torch.linalg.cross(w, v_lin)
        aref = aref - (Jc[..., :3] * c[..., None, None, :]).sum(-1)
    diag = model._invweight0  # MuJoCo's A~ of each point, from the model's robot
    R0 = ((1 - imp) * diag / imp).clamp_min(_MIN_VAL)
    ratio = sp["impratio"]
    R1 = R0 / ratio
    D = torch.stack([1 / R0, 1 / R1, 1 / R1], -1)
    mu = torch.broadcast_to(mu, torch.broadcast_shapes(mu.shape, phi.shape))
    mu_r = mu * math.sqrt(1.0 / ratio)

    h = bias_forces(robot, q, v, gravity=gravity)
    qfrc = tau - h
    if _has_joint_forces(robot):
        qfrc = qfrc + joint_forces(robot, v)
    # Every per-step quantity over one batch shape.
    P, nv = phi.shape[-1], robot.nv
    batch = torch.broadcast_shapes(Jc.shape[:-3], qfrc.shape[:-1], aref.shape[:-2], D.shape[:-2], mu.shape[:-1])
    M = mass_matrix(robot, q).expand(*batch, nv, nv)
    Jc, qfrc = Jc.expand(*batch, P, 3, nv), qfrc.expand(*batch, nv)
    aref, D = aref.expand(*batch, P, 3), D.expand(*batch, P, 3)
    mu_r, mu, active = mu_r.expand(*batch, P), mu.expand(*batch, P), (phi > 0).expand(*batch, P)
    with torch.no_grad():
        Md, Jd, auxd = M.detach(), Jc.detach(), [x.detach() for x in (aref, D, mu_r, mu)]
        a0 = torch.cholesky_solve(qfrc.detach()[..., None], torch.linalg.cholesky(Md))[..., 0]
        a_star = _newton(Md, a0, Jd, *auxd, active)
        jar = (Jd * a_star[..., None, None, :]).sum(-1) - auxd[0]
        _, _, Hc = _cone(jar, auxd[1], auxd[2], auxd[3], active, True)
        H = Md + torch.einsum("...pim,...pij,...pjn->...mn", Jd, Hc, Jd)
        LH = torch.linalg.cholesky(H)
    # One more Newton step under autograd from the detached solution: exact
    # value (the gradient there is ~0) and the implicit-function gradient.
    jar = (Jc * a_star[..., None, None, :]).sum(-1) - aref
    f, _, _ = _cone(jar, D, mu_r, mu, active, False)
    JTf = (Jc * f[..., None]).sum((-3, -2))
    grad = (M @ a_star[..., None])[..., 0] - qfrc - JTf
    a = a_star - torch.cholesky_solve(grad[..., None], LH)[..., 0]
    # The forces that act, at that solution: their gradient includes the
    # solution's own (through a).
    force_c, _, _ = _cone((Jc * a[..., None, None, :]).sum(-1) - aref, D, mu_r, mu, active, False)
    if extra_damping is not None:
        Mh = M + dt * torch.diag_embed(extra_damping.expand(*batch, robot.nv))
        rhs = (M @ a[..., None])[..., 0]
        a = torch.linalg.solve(Mh, rhs)
    fw = (force_c[..., :, None] * frame).sum(-2)  # world force per point
    f_ext = model._wrenches(robot, Rb, pb, point, fw)
    zero = torch.zeros_like(phi)
    v_n = vel[..., 0]  # the contact frame's rows of the point velocity: normal, then the two tangents
    res = ContactResult(
        point=point,
        normal=n,
        penetration=phi,
        normal_velocity=v_n,
        slip_velocity=(vel[..., 1:, None] * frame[..., 1:, :]).sum(-2),
        normal_force=force_c[..., 0],
        friction_force=fw - force_c[..., :1] * n,
        force=fw,
        f_ext=f_ext,
        jacobian=J,
        _c_n=zero,
        _k_n=zero,
        _mu_fn_over_s=zero,
        _s=zero,
        _mu=mu,
        _bodies=(Rb, pb),
    )
    return a, res
