"""Large batches take a different code path (batch as the last, contiguous
axis). These tests force that path at small batch sizes and check it against
the default path, values and gradients, and against Pinocchio at a batch
above the switch-over."""

from __future__ import annotations

import numpy as np
import pinocchio as pin
import pytest
import torch

import backdrive.dynamics._crba as crba_mod
import backdrive.dynamics._rnea as rnea_mod
import backdrive.dynamics._tree as tree_mod
import backdrive.kinematics._fk as fk_mod
from backdrive.data import get_data_path, load
from backdrive.dynamics import forward_dynamics, inverse_dynamics, mass_matrix
from backdrive.kinematics import forward_kinematics, frame_jacobian

F64 = torch.float64


@pytest.fixture
def wide(monkeypatch):
    """Force the large-batch layout for every batch size."""
    for mod in (tree_mod, rnea_mod, crba_mod):
        monkeypatch.setattr(mod, "TREE_MATMUL_MAX_BATCH", 0)
    monkeypatch.setattr(fk_mod, "_WIDE_MIN_BATCH", 0)


def _functions(robot, q, v, a):
    return {
        "fk": forward_kinematics(robot, q),
        "jacobian": frame_jacobian(robot, q, robot.link_names[-1]),
        "rnea": inverse_dynamics(robot, q, v, a),
        "crba": mass_matrix(robot, q),
        "fd": forward_dynamics(robot, q, v, a),
    }


@pytest.mark.parametrize("name,floating", [("panda", False), ("quadruped", True), ("cartpole", False)])
def test_wide_path_equals_default_path(name, floating, monkeypatch):
    robot = load(name, floating_base=floating)
    g = torch.Generator().manual_seed(3)
    q = robot.random_q(5, generator=g)
    v = torch.randn(5, robot.nv, generator=g, dtype=F64)
    a = torch.randn(5, robot.nv, generator=g, dtype=F64)
    narrow = _functions(robot, q, v, a)
    for mod in (tree_mod, rnea_mod, crba_mod):
        monkeypatch.setattr(mod, "TREE_MATMUL_MAX_BATCH", 0)
    monkeypatch.setattr(fk_mod, "_WIDE_MIN_BATCH", 0)
    wide = _functions(robot, q, v, a)
    for key in narrow:
        torch.testing.assert_close(wide[key], narrow[key], atol=1e-11, rtol=1e-11, msg=key)


def test_wide_path_gradcheck(wide):
    robot = load("double_pendulum")
    g = torch.Generator().manual_seed(4)
    q = robot.random_q(3, generator=g).requires_grad_(True)
    v = torch.randn(3, robot.nv, generator=g, dtype=F64, requires_grad=True)
    tau = torch.randn(3, robot.nv, generator=g, dtype=F64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda q, v, t: forward_dynamics(robot, q, v, t), (q, v, tau))
    assert torch.autograd.gradcheck(lambda q, v, t: inverse_dynamics(robot, q, v, t), (q, v, tau))
    assert torch.autograd.gradcheck(lambda q: forward_kinematics(robot, q), (q,))


def test_batch_above_switch_matches_pinocchio():
    robot = load("panda")
    pm = pin.buildModelFromUrdf(str(get_data_path("panda")), mimic=True)
    pd = pm.createData()
    n = 100  # above the switch-over batch size
    g = torch.Generator().manual_seed(5)
    q = robot.random_q(n, generator=g)
    v = torch.randn(n, robot.nv, generator=g, dtype=F64)
    a = torch.randn(n, robot.nv, generator=g, dtype=F64)
    tau = inverse_dynamics(robot, q, v, a).numpy()
    M = mass_matrix(robot, q).numpy()
    T = forward_kinematics(robot, q).numpy()
    tcp = robot.frame_index("panda_hand_tcp")
    fid = pm.getFrameId("panda_hand_tcp")
    for i in range(n):
        qi, vi, ai = q[i].numpy(), v[i].numpy(), a[i].numpy()
        ref = pin.rnea(pm, pd, qi, vi, ai)
        np.testing.assert_allclose(tau[i], ref, rtol=1e-10, atol=1e-10 * np.abs(ref).max())
        Mr = pin.crba(pm, pd, qi)
        Mr = np.triu(Mr) + np.triu(Mr, 1).T
        np.testing.assert_allclose(M[i], Mr, atol=1e-10 * np.abs(Mr).max())
        pin.framesForwardKinematics(pm, pd, qi)
        np.testing.assert_allclose(T[i, tcp], pd.oMf[fid].homogeneous, atol=1e-12)
