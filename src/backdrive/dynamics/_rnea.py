"""Inverse dynamics by the recursive Newton-Euler algorithm (RNEA).

Featherstone's RNEA written in the world frame: with every spatial vector at
the world origin, the outward pass (velocities, accelerations) is a sum over
ancestors and the inward pass (transmitted forces) a sum over subtrees, each
one product with the constant ancestor matrix.
"""

from __future__ import annotations

import torch

from .._shapes import broadcast_shapes
from ..model import RobotModel
from . import _tree
from ._wide import inverse_dynamics_t
from ._tree import (
    Kinematics,
    Topology,
    apply_inertia,
    apply_inertia_columns,
    base_force_from_world,
    base_motion_to_world,
    broadcast_batch,
    check_f_ext,
    couple_forces,
    cross_force,
    cross_motion,
    f_ext_to_world,
    gravity_vector,
    joint_rates,
    kinematics,
    topology,
    tree_down,
    tree_up,
    TREE_MATMUL_MAX_BATCH,
)

__all__ = ["inverse_dynamics", "bias_forces", "gravity_forces", "rnea_core"]


def _gravity_motion(g: torch.Tensor) -> torch.Tensor:
    # Gravity enters as a fictitious upward acceleration of the world, [-g; 0].
    return torch.cat([-g, torch.zeros_like(g)], -1)[..., None, :]


def rnea_core(
    model: RobotModel,
    topo: Topology,
    kin: Kinematics,
    v: torch.Tensor | None,
    a: torch.Tensor | None,
    g: torch.Tensor,
    fext_w: torch.Tensor | None = None,
) -> torch.Tensor:
    """RNEA on precomputed kinematics; ``v`` or ``a`` ``None`` means zero.

    Returns ``tau (..., nv)``, with ``armature * a`` on the joint coordinates.
    """
    fb = model.floating_base
    nj = model.num_joints
    S = kin.S
    if (
        topo.nm
        and S.shape[:-2].numel() > TREE_MATMUL_MAX_BATCH
        # f_ext is not part of the broadcast batch; it may only broadcast into it here.
        and (fext_w is None or broadcast_shapes(fext_w.shape[:-2], S.shape[:-2]) == S.shape[:-2])
    ):
        return _rnea_wide(model, topo, kin, v, a, g, fext_w)
    R0, p0 = kin.R[..., 0, :, :], kin.p[..., 0, :]
    A = _gravity_motion(g)
    if v is not None:
        qd = joint_rates(topo, v[..., 6:] if fb else v)
        J = S * qd[..., None]
        Jall = torch.cat([base_motion_to_world(R0, p0, v[..., :6])[..., None, :], J], -2) if fb else J
        V = tree_down(topo, Jall)
        # The joint axis moves with its body: d/dt (S qd) = S qdd + V x (S qd).
        Jd = cross_motion(V[..., 1:, :] if fb else V, J)
        if a is not None:
            Jd = Jd + S * joint_rates(topo, a[..., 6:] if fb else a)[..., None]
        if fb:
            A0 = base_motion_to_world(R0, p0, a[..., :6]) if a is not None else torch.zeros_like(Jall[..., 0, :])
            Jd = torch.cat([A0[..., None, :], Jd], -2)
        A = tree_down(topo, Jd) + A
        # One inertia product for both A and V: f = I A + V x* (I V).
        IAV = apply_inertia_columns(kin.m, kin.h, kin.I, torch.stack([A.expand_as(V), V], -2))
        f = IAV[..., 0, :] + cross_force(V, IAV[..., 1, :])
    else:
        if a is not None:
            Jd = S * joint_rates(topo, a[..., 6:] if fb else a)[..., None]
            if fb:
                Jd = torch.cat([base_motion_to_world(R0, p0, a[..., :6])[..., None, :], Jd], -2)
            A = tree_down(topo, Jd) + A
            f = apply_inertia(kin.m, kin.h, kin.I, A)
        else:
            # Statics under gravity alone: f = I [-g; 0] = [-m g; h x (-g)].
            mg = kin.m[..., None] * -g[..., None, :]
            f = torch.cat([mg.expand_as(kin.h), torch.linalg.cross(kin.h, -g[..., None, :].expand_as(kin.h))], -1)
    if fext_w is not None:
        f = f - fext_w
    F = tree_up(topo, f)
    Fm = F[..., 1:, :] if fb else F
    tau = couple_forces(topo, (S * Fm).sum(-1), nj)
    if a is not None and nj:
        tau = tau + model.armature * (a[..., 6:] if fb else a)
    if fb:
        tau = torch.cat([base_force_from_world(R0, p0, F[..., 0, :]), tau], -1)
    return tau


def _t(x: torch.Tensor) -> torch.Tensor:
    """``(..., k, c)`` -> ``(c, k, N)`` contiguous, batch flattened and innermost."""
    return x.reshape(-1, *x.shape[-2:]).permute(2, 1, 0).contiguous()


def _cross_t(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Cross product of ``(3, ...)`` component-first arrays."""
    return a.roll(-1, 0) * b.roll(1, 0) - a.roll(1, 0) * b.roll(-1, 0)


def _rnea_wide(model, topo, kin, v, a, g, fext_w) -> torch.Tensor:
    """:func:`rnea_core` for a large batch.

    Every spatial quantity is a ``(6, k, N)`` array with the batch innermost:
    cross products and inertia products are a few elementwise operations over
    the whole batch, and each tree sum is one matrix product of the ancestor
    matrix with a ``(k, 6 N)`` block.
    """
    fb = model.floating_base
    batch = kin.S.shape[:-2]
    nm, na = topo.nm, topo.na
    S = _t(kin.S)  # (6, nm, N)
    N = S.shape[-1]
    m = kin.m[:, None]
    h = _t(kin.h)  # (3, na, N)
    I = kin.I.reshape(N, na, 3, 3).permute(2, 3, 1, 0).contiguous()  # (3, 3, na, N)
    gt = g[:, None, None] if g.ndim == 1 else g.reshape(-1, 3).T[:, None, :]
    grav = torch.cat([-gt, torch.zeros_like(gt)], 0)  # (6, 1, N or 1)
    if fb:
        R0, p0 = kin.R[..., 0, :, :], kin.p[..., 0, :]
        vj = None if v is None else v[..., 6:]
        aj = None if a is None else a[..., 6:]
    else:
        vj, aj = v, a

    def base(x):  # base-frame twist (..., 6) -> world (6, 1, N)
        return _t(base_motion_to_world(R0, p0, x)[..., None, :])

    def inertia(x):
        xl, xa = x[:3], x[3:]
        fl = torch.addcmul(_cross_t(xa, h), m, xl)
        fa = I[:, 0] * xa[0]
        fa.addcmul_(I[:, 1], xa[1]).addcmul_(I[:, 2], xa[2]).add_(_cross_t(h, xl))
        return torch.cat([fl, fa], 0)

    if v is not None:
        qd = joint_rates(topo, vj).reshape(N, nm).T
        J = S * qd
        V = torch.matmul(topo.anc, torch.cat([base(v[..., :6]), J], 1) if fb else J)
        Vm = V[:, 1:] if fb else V
        Jl, Ja = J[:3], J[3:]
        Jd = torch.cat([_cross_t(Vm[3:], Jl) + _cross_t(Vm[:3], Ja), _cross_t(Vm[3:], Ja)], 0)
        if a is not None:
            Jd = torch.addcmul(Jd, S, joint_rates(topo, aj).reshape(N, nm).T)
        if fb:
            A0 = base(a[..., :6]) if a is not None else Jd.new_zeros(6, 1, N)
            Jd = torch.cat([A0, Jd], 1)
        A = torch.matmul(topo.anc, Jd) + grav
        IV = inertia(V)
        Vl, Va = V[:3], V[3:]
        f = inertia(A) + torch.cat([_cross_t(Va, IV[:3]), _cross_t(Va, IV[3:]) + _cross_t(Vl, IV[:3])], 0)
    elif a is not None:
        Jd = S * joint_rates(topo, aj).reshape(N, nm).T
        if fb:
            Jd = torch.cat([base(a[..., :6]), Jd], 1)
        f = inertia(torch.matmul(topo.anc, Jd) + grav)
    else:
        f = inertia(grav.expand(6, na, N))
    if fext_w is not None:
        f = f - _t(fext_w.expand(*batch, na, 6))
    F = torch.matmul(topo.anc.T, f)
    tau_b = (S * (F[:, 1:] if fb else F)).sum(0).T.reshape(*batch, nm)
    tau = couple_forces(topo, tau_b, model.num_joints)
    if a is not None and model.num_joints:
        tau = tau + model.armature * aj
    if fb:
        F0 = F[:, 0].T.reshape(*batch, 6)
        tau = torch.cat([base_force_from_world(R0, p0, F0), tau], -1)
    return tau


def inverse_dynamics(
    robot: RobotModel,
    q: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    *,
    f_ext: torch.Tensor | None = None,
    gravity: torch.Tensor | None = None,
) -> torch.Tensor:
    """Joint forces that produce accelerations ``a`` at state ``(q, v)`` (RNEA).

    ``tau = M(q) a + C(q, v) v + g(q) - sum_b J_b(q)^T f_ext_b``, where ``M``
    includes the rotor armature (``robot.armature`` on the diagonal), as in
    Pinocchio's ``rnea``. Joint damping and friction are *not* included
    (Pinocchio's ``rnea`` leaves them out too): they are forces the joint
    applies, see :func:`joint_forces`, and :func:`forward_dynamics` adds them.

    Args:
        robot: the robot model.
        q: ``(..., nq)`` configuration.
        v: ``(..., nv)`` generalised velocity (floating base: base twist in
            the base frame, then joint rates).
        a: ``(..., nv)`` generalised acceleration (floating base: time
            derivative of the base-frame twist).
        f_ext: optional ``(..., nb, 6)`` external wrench ``[force; torque]``
            on each body (``body_names`` order), expressed in the body frame
            at the body origin, as Pinocchio's ``fext`` in the joints' local
            frames. With a fixed base the root's entry is ignored (the root
            is welded to the world).
        gravity: optional ``(..., 3)`` gravity in m/s^2; ``robot.gravity`` by
            default.

    Returns:
        ``(..., nv)`` generalised forces (N m for revolute, N for prismatic
        joints; a floating base gets the base wrench in the base frame at the
        base origin). Batch axes of all inputs broadcast.

    Raises:
        InputError: a shape, dtype or device that does not match the model.
    """
    nv = robot.nv
    g = gravity_vector(robot, gravity)
    batch, (q, v, a, g) = broadcast_batch(robot, q, (v, nv, "v"), (a, nv, "a"), (g, 3, "gravity"))
    check_f_ext(robot, f_ext)
    topo = topology(robot)
    if _wide(topo, batch, f_ext):
        return inverse_dynamics_t(robot, q, v, a, g, f_ext)
    kin = kinematics(robot, topo, q)
    fw = None if f_ext is None else f_ext_to_world(topo, kin, f_ext)
    return rnea_core(robot, topo, kin, v, a, g, fw)


def _wide(topo: Topology, batch: torch.Size, f_ext=None) -> bool:
    """Whether the batch-last path (``_wide.inverse_dynamics_t``) takes this batch."""
    return (
        batch.numel() > _tree.TREE_MATMUL_MAX_BATCH
        and topo.nm > 0
        and (f_ext is None or broadcast_shapes(f_ext.shape[:-2], batch) == batch)
    )


def bias_forces(
    robot: RobotModel,
    q: torch.Tensor,
    v: torch.Tensor,
    *,
    gravity: torch.Tensor | None = None,
) -> torch.Tensor:
    """Coriolis, centrifugal and gravity forces ``C(q, v) v + g(q)``, ``(..., nv)``.

    Equal to ``inverse_dynamics(robot, q, v, 0)`` (Pinocchio's
    ``nonLinearEffects``).

    Args:
        q: ``(..., nq)``. v: ``(..., nv)``. gravity: optional ``(..., 3)``.
    """
    g = gravity_vector(robot, gravity)
    batch, (q, v, g) = broadcast_batch(robot, q, (v, robot.nv, "v"), (g, 3, "gravity"))
    topo = topology(robot)
    if _wide(topo, batch):
        return inverse_dynamics_t(robot, q, v, None, g)
    return rnea_core(robot, topo, kinematics(robot, topo, q), v, None, g)


def gravity_forces(robot: RobotModel, q: torch.Tensor, *, gravity: torch.Tensor | None = None) -> torch.Tensor:
    """Generalised gravity forces ``g(q)``, ``(..., nv)``: the torques that hold ``q`` still.

    Pinocchio's ``computeGeneralizedGravity``.

    Args:
        q: ``(..., nq)``. gravity: optional ``(..., 3)``, ``robot.gravity`` by default.
    """
    g = gravity_vector(robot, gravity)
    batch, (q, g) = broadcast_batch(robot, q, (g, 3, "gravity"))
    topo = topology(robot)
    if _wide(topo, batch):
        return inverse_dynamics_t(robot, q, None, None, g)
    return rnea_core(robot, topo, kinematics(robot, topo, q), None, None, g)
