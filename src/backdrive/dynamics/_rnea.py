"""Inverse dynamics by the recursive Newton-Euler algorithm (RNEA).

Featherstone's RNEA written in the world frame: with every spatial vector at
the world origin, the outward pass (velocities, accelerations) is a sum over
ancestors and the inward pass (transmitted forces) a sum over subtrees, each
one product with the constant ancestor matrix.
"""

from __future__ import annotations

import torch

from .._shapes import broadcast_shapes
from ..kinematics._paths import choose
from ..kinematics._kernels import apply_inertia, apply_inertia_columns, cross_force, cross_motion
from ..kinematics._schedule import down, up
from ..model import RobotModel
from ._fast import inverse_dynamics_fast
from ._tree import (
    Kinematics,
    Topology,
    base_force_from_world,
    base_motion_to_world,
    broadcast_batch,
    check_f_ext,
    couple_forces,
    f_ext_to_world,
    gravity_vector,
    joint_rates,
    kinematics,
    topology,
)

__all__ = ["inverse_dynamics", "bias_forces", "gravity_forces", "rnea_core", "fast_eligible"]


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
    keep: dict | None = None,
) -> torch.Tensor:
    """RNEA on precomputed kinematics; ``v`` or ``a`` ``None`` means zero.

    Returns ``tau (..., nv)``, with ``armature * a`` on the joint coordinates.
    ``keep``: a dict that receives the passes' arrays ``V``, ``A``, ``J``,
    ``IV`` (``I V``) and ``F`` (with ``v`` given; for a written-out backward).
    """
    fb = model.floating_base
    nj = model.num_joints
    S = kin.S
    R0, p0 = kin.R[..., 0, :, :], kin.p[..., 0, :]
    A = _gravity_motion(g)
    if v is not None:
        qd = joint_rates(topo, v[..., 6:] if fb else v)
        J = S * qd[..., None]
        Jall = torch.cat([base_motion_to_world(R0, p0, v[..., :6])[..., None, :], J], -2) if fb else J
        V = down(topo.sums, Jall)
        # The joint axis moves with its body: d/dt (S qd) = S qdd + V x (S qd).
        Jd = cross_motion(V[..., 1:, :] if fb else V, J)
        if a is not None:
            Jd = Jd + S * joint_rates(topo, a[..., 6:] if fb else a)[..., None]
        if fb:
            A0 = base_motion_to_world(R0, p0, a[..., :6]) if a is not None else torch.zeros_like(Jall[..., 0, :])
            Jd = torch.cat([A0[..., None, :], Jd], -2)
        A = down(topo.sums, Jd) + A
        # One inertia product for both A and V: f = I A + V x* (I V).
        IAV = apply_inertia_columns(kin.m, kin.h, kin.I, torch.stack([A.expand_as(V), V], -2))
        f = IAV[..., 0, :] + cross_force(V, IAV[..., 1, :])
        if keep is not None:
            keep.update(V=V, A=A, J=J, IV=IAV[..., 1, :])
    else:
        if a is not None:
            Jd = S * joint_rates(topo, a[..., 6:] if fb else a)[..., None]
            if fb:
                Jd = torch.cat([base_motion_to_world(R0, p0, a[..., :6])[..., None, :], Jd], -2)
            A = down(topo.sums, Jd) + A
            f = apply_inertia(kin.m, kin.h, kin.I, A)
        else:
            # Statics under gravity alone: f = I [-g; 0] = [-m g; h x (-g)].
            mg = kin.m[..., None] * -g[..., None, :]
            f = torch.cat([mg.expand_as(kin.h), torch.linalg.cross(kin.h, -g[..., None, :].expand_as(kin.h))], -1)
    if fext_w is not None:
        f = f - fext_w
    F = up(topo.sums, f)
    if keep is not None:
        keep["F"] = F
    Fm = F[..., 1:, :] if fb else F
    tau = couple_forces(topo, (S * Fm).sum(-1), nj)
    if a is not None and nj:
        tau = tau + model.armature * (a[..., 6:] if fb else a)
    if fb:
        tau = torch.cat([base_force_from_world(R0, p0, F[..., 0, :]), tau], -1)
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
    if choose("inverse_dynamics", batch.numel(), fast_eligible(topo, batch, f_ext)):
        return inverse_dynamics_fast(robot, q, v, a, g, f_ext)
    kin = kinematics(robot, topo, q)
    fw = None if f_ext is None else f_ext_to_world(topo, kin, f_ext)
    return rnea_core(robot, topo, kin, v, a, g, fw)


def fast_eligible(topo: Topology, batch: torch.Size, f_ext=None) -> bool:
    """Whether the fast path can take these inputs: at least one moving joint,
    and external wrenches (not part of the broadcast batch) that broadcast
    into the batch of the other inputs."""
    return topo.nm > 0 and (f_ext is None or broadcast_shapes(f_ext.shape[:-2], batch) == batch)


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
    if choose("inverse_dynamics", batch.numel(), topo.nm > 0):
        return inverse_dynamics_fast(robot, q, v, None, g)
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
    if choose("inverse_dynamics", batch.numel(), topo.nm > 0):
        return inverse_dynamics_fast(robot, q, None, None, g)
    return rnea_core(robot, topo, kinematics(robot, topo, q), None, None, g)
