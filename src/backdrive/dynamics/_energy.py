"""Kinetic and potential energy, centre of mass."""

from __future__ import annotations

import torch

from ..kinematics._kernels import apply_inertia
from ..kinematics._paths import choose
from ..kinematics._schedule import down
from ..model import RobotModel
from ._fast import first_moment_fast, kinetic_energy_fast
from ._tree import (
    base_motion_to_world,
    broadcast_batch,
    gravity_vector,
    joint_rates,
    kinematics,
    topology,
)

__all__ = ["kinetic_energy", "potential_energy", "center_of_mass"]


def kinetic_energy(robot: RobotModel, q: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Kinetic energy ``0.5 v^T M(q) v`` in joules, ``(...)``.

    The sum of every moving body's ``0.5 V^T I V`` plus the rotors'
    ``0.5 armature v_j^2``, so that it is consistent with :func:`mass_matrix`
    (Pinocchio's ``computeKineticEnergy`` leaves the armature out; the two
    agree when it is zero).

    Args:
        q: ``(..., nq)``. v: ``(..., nv)``.
    """
    batch, (q, v) = broadcast_batch(robot, q, (v, robot.nv, "v"))
    topo = topology(robot)
    # The one branch point: the fast path (batch-last) or the reference below.
    if choose("energy", batch.numel(), topo.nm > 0):
        return kinetic_energy_fast(robot, q, v)
    kin = kinematics(robot, topo, q)
    fb = robot.floating_base
    vj = v[..., 6:] if fb else v
    J = kin.S * joint_rates(topo, vj)[..., None]
    if fb:
        V0 = base_motion_to_world(kin.R[..., 0, :, :], kin.p[..., 0, :], v[..., :6])
        J = torch.cat([V0[..., None, :], J], -2)
    V = down(topo.sums, J)
    ke = 0.5 * (V * apply_inertia(kin.m, kin.h, kin.I, V)).sum((-1, -2))
    if robot.num_joints:
        ke = ke + 0.5 * (robot.armature * vj * vj).sum(-1)
    return ke


def potential_energy(robot: RobotModel, q: torch.Tensor, *, gravity: torch.Tensor | None = None) -> torch.Tensor:
    """Gravitational potential energy ``-sum_b m_b g . c_b`` in joules, ``(...)``.

    Zero when every centre of mass is at the world origin's height; with a
    fixed base the root link, welded to the world, is left out (as in
    Pinocchio's ``computePotentialEnergy``).

    Args:
        q: ``(..., nq)``. gravity: optional ``(..., 3)``; ``robot.gravity`` by default.
    """
    g = gravity_vector(robot, gravity)
    batch, (q, g) = broadcast_batch(robot, q, (g, 3, "gravity"))
    topo = topology(robot)
    if choose("energy", batch.numel(), topo.nm > 0):
        h = first_moment_fast(robot, q)  # (3, N)
        return -(h.T.reshape(*batch, 3) * g).sum(-1)
    kin = kinematics(robot, topo, q, inertia=False)
    return -(kin.h.sum(-2) * g).sum(-1)


def center_of_mass(robot: RobotModel, q: torch.Tensor) -> torch.Tensor:
    """Centre of mass of the moving bodies in the world frame, ``(..., 3)`` m.

    With a fixed base the root link (welded to the world) is left out, as in
    Pinocchio's ``centerOfMass``; with a floating base every body counts.

    Args:
        q: ``(..., nq)``.
    """
    robot.check_q(q)
    topo = topology(robot)
    batch = q.shape[:-1]
    if choose("energy", batch.numel(), topo.nm > 0):
        return first_moment_fast(robot, q).T.reshape(*batch, 3) / robot.body_mass[topo.o :].sum()
    kin = kinematics(robot, topo, q, inertia=False)
    return kin.h.sum(-2) / kin.m.sum()

