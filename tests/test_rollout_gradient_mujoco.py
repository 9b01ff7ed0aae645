"""A short Panda rollout against MuJoCo: the same motion, and autograd's
gradient of the final state against MuJoCo finite differences (float64).

The models and the comparison come from ``benchmarks/rollout_gradient.py``
(imported, not copied), which runs the 100-step version with timings. Both
damping schemes are compared: backdrive's ``joint_forces="explicit"`` against
MuJoCo's Euler with ``mjDSBL_EULERDAMP`` (the benchmark's pair), and the
default implicit damping against MuJoCo's Euler with its implicit damping on
(MuJoCo's default).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("mujoco")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import rollout_gradient as rg  # noqa: E402

STEPS, DT = 10, 0.01


@pytest.fixture(scope="module", params=["explicit", "implicit"])
def pair(request):
    import mujoco

    robot, sim, model = rg.build_pair(DT)
    assert sim.joint_forces == "explicit"
    if request.param == "implicit":
        sim = sim.replace(joint_forces="auto")
        assert sim.joint_forces == "implicit"
        # MuJoCo's own default: (M + dt D) qacc = f.
        model.opt.disableflags &= ~int(mujoco.mjtDisableBit.mjDSBL_EULERDAMP)
    q0, v0, u = rg.scenario(robot, STEPS, DT, seed=3)
    return robot, sim, model, q0, v0, u


def test_the_two_damping_schemes_differ():
    """The comparison can tell the schemes apart: 0.5 N m s/rad on a 0.05 kg m^2
    armature at 10 ms changes the rollout far beyond the tolerances below."""
    robot, sim, model = rg.build_pair(DT)
    q0, v0, u = rg.scenario(robot, STEPS, DT, seed=3)
    qe, ve = rg.backdrive_rollout(sim, q0, v0, u)
    qi, vi = rg.backdrive_rollout(sim.replace(joint_forces="implicit"), q0, v0, u)
    assert float((vi - ve).abs().max()) > 1e-4
    assert float((qi - qe).abs().max()) > 1e-6


def test_same_model_in_both(pair):
    robot, sim, model, *_ = pair
    assert sim.nv == model.nv == model.nu == 7
    # Same total moving mass (the hand and fingers are fused into link 7 by MuJoCo).
    np.testing.assert_allclose(model.body_mass[1:].sum(), robot.body_mass[1:].sum().item(), rtol=1e-12)
    np.testing.assert_allclose(model.dof_damping, rg.DAMPING)
    np.testing.assert_allclose(model.dof_armature, rg.ARMATURE)


def test_rollouts_agree(pair):
    robot, sim, model, q0, v0, u = pair
    qb, vb = rg.backdrive_rollout(sim, q0, v0, u)
    qm, vm = rg.mujoco_rollout(model, q0.numpy(), v0.numpy(), u.numpy())
    assert float((qb[-1] - qb[0]).abs().max()) > 1e-3  # the arm does move
    np.testing.assert_allclose(qb.numpy(), qm, rtol=0, atol=1e-12)
    np.testing.assert_allclose(vb.numpy(), vm, rtol=0, atol=1e-10)
    # A physical mismatch shows: MuJoCo without the damping drifts away.
    undamped = rg.build_mujoco(rg.rigid_finger_urdf(), DT, robot.joint_names, damping=0.0)
    qu, _ = rg.mujoco_rollout(undamped, q0.numpy(), v0.numpy(), u.numpy())
    assert np.abs(qu[-1] - qb[-1].numpy()).max() > 1e-5


def test_final_state_gradient_matches_mujoco_finite_differences(pair):
    robot, sim, model, q0, v0, u = pair
    J = rg.backdrive_jacobian(sim, q0, v0, u).numpy()  # (14, STEPS * 7)
    J_fd, rollouts = rg.mujoco_fd_jacobian(model, q0.numpy(), v0.numpy(), u.numpy())
    assert J.shape == J_fd.shape == (14, STEPS * 7) and rollouts == 2 * STEPS * 7
    ag = rg.agreement(J, J_fd)
    # Central differences with eps 1e-4 N m are accurate to ~1e-9 here.
    assert ag["normwise"] < 1e-7
    assert ag["median_rel"] < 1e-7
    assert ag["cosine"] > 1 - 1e-12
    # Entries above 1e-3 of the largest: each within 1e-5.
    big = np.abs(J_fd) > 1e-3 * np.abs(J_fd).max()
    np.testing.assert_allclose(J[big], J_fd[big], rtol=1e-5)
    # The projected gradient (one backward pass) is the same row combination.
    w = torch.linspace(-1, 1, 14, dtype=torch.float64)
    g = rg.backdrive_projected_gradient(sim, q0, v0, u, w).numpy()
    np.testing.assert_allclose(g, w.numpy() @ J, rtol=1e-10, atol=1e-14)
