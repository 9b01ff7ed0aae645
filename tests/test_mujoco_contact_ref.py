"""The MuJoCo reference for contact (``benchmarks/_mujoco_contact.py``) checked
against physics before anything is compared with it: its contact force is the
penalty law it claims to be, a settled robot's ground reaction equals its
weight, and MuJoCo's own contact settings move the standing height by a few
millimetres only.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

mujoco = pytest.importorskip("mujoco")
pytest.importorskip("backdrive.data")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import _mujoco_contact as mc  # noqa: E402

ROBOTS = ("go1", "quadruped")


def _probe(model, robot, speed, depth=1e-3, seed=0):
    """A state with every foot ``depth`` into the floor, the base moving down
    at ``speed`` and the joints at random rates of a fifth of that; returns
    data after ``mj_forward`` and the foot geom ids."""
    data = mujoco.MjData(model)
    qpos, ctrl = mc.standing_state(model, robot)
    data.qpos[:] = qpos
    data.ctrl[:] = ctrl
    mujoco.mj_forward(model, data)
    feet = mc._foot_geoms(model, mc.ROBOTS[robot])
    data.qpos[2] -= (data.geom_xpos[feet, 2] - model.geom_size[feet, 0]).min() + depth
    data.qvel[:] = 0.2 * speed * np.random.default_rng(seed).standard_normal(model.nv)
    data.qvel[2] = -speed  # world-frame vertical velocity of the free joint
    mujoco.mj_forward(model, data)
    assert data.ncon == 4
    return data, feet


@pytest.mark.parametrize("robot", ROBOTS)
@pytest.mark.parametrize("scheme,dt,k,b", [("implicit", 4e-3, 4e4, 1e4), ("implicit", 1e-3, 2e4, 300.0),
                                          ("explicit", 1e-3, 2e4, 50.0)])
def test_contact_force_is_the_penalty_law(robot, scheme, dt, k, b):
    """Per foot, MuJoCo's normal force is ``k p - b v_n`` (explicit) or
    ``k p - (b + k dt) v_n'`` with ``v_n' = v_n + dt a_n`` the end-of-step
    normal velocity (implicit), to 1e-3 of the force."""
    model = mc.build_model(robot, dt=dt, stiffness=k, damping=b, scheme=scheme)
    # Damping about as large as the spring force (k * 1 mm).
    data, feet = _probe(model, robot, speed=k * 1e-3 / (b + k * dt))
    f6 = np.zeros(6)
    nv = model.nv
    J = data.efc_J.reshape(data.nefc, nv)
    checked = 0
    for i in range(data.ncon):
        c = data.contact[i]
        mujoco.mj_contactForce(model, data, i, f6)
        row = c.efc_address  # the normal row; contact frame x is the normal
        p = -c.dist
        v_n = J[row] @ data.qvel
        v_n1 = J[row] @ (data.qvel + dt * data.qacc)
        expect = k * p - b * v_n if scheme == "explicit" else k * p - (b + k * dt) * v_n1
        assert expect > 1.0  # the probe is in compression
        assert f6[0] == pytest.approx(expect, rel=1e-3)
        checked += 1
    assert checked == 4
    # The probe's velocities matter: the spring alone is off by more than the tolerance.
    assert any(abs(k * (-data.contact[i].dist) - f) > 0.05 * f
               for i, f in enumerate(_normal_forces(model, data)))


def _normal_forces(model, data):
    f6 = np.zeros(6)
    out = []
    for i in range(data.ncon):
        mujoco.mj_contactForce(model, data, i, f6)
        out.append(f6[0])
    return out


@pytest.fixture(scope="module")
def settled():
    """Both robots dropped 5 cm and settled for 3 s at 2 ms (backdrive's
    default contact parameters k 4e4 N/m, b 1e4 N s/m, mu 0.75)."""
    out = {}
    for robot in ROBOTS:
        model = mc.build_model(robot, dt=2e-3)
        out[robot] = (model, mc.settle(model, robot, duration=3.0, every=50))
    return out


@pytest.mark.parametrize("robot", ROBOTS)
def test_settled_ground_reaction_is_the_weight(settled, robot):
    model, r = settled[robot]
    # Weight from the URDF masses (MuJoCo fuses fixed links; the sum stays).
    masses = {"go1": 13.100529, "quadruped": 12.44}
    assert r.weight == pytest.approx(masses[robot] * 9.81, rel=1e-6)
    assert r.normal_force[0] == 0.0  # dropped from above the floor
    assert r.normal_force[-1] == pytest.approx(r.weight, rel=1e-2)
    # Every foot carries load; each penetration is its force over k.
    f = r.foot_normal_force[-1]
    assert (f > 0.1 * r.weight / 4).all()
    np.testing.assert_allclose(4e4 * r.penetration[-1], f, rtol=2e-2)
    # It has stopped (up to the slow creep of soft friction, ~0.1 mm/s):
    # base within 0.3 mm over the last 0.5 s, feet on the floor.
    tail = r.t > r.t[-1] - 0.5
    assert np.ptp(r.base_height[tail]) < 3e-4
    np.testing.assert_allclose(r.feet[-1, :, 2], 0.02 - r.penetration[-1], atol=1e-12)
    # Standing, not lying: the base is near the URDF's standing height.
    assert r.base_height[-1] == pytest.approx(mc.ROBOTS[robot].stand_height, abs=0.04)


def test_native_contact_height_sensitivity():
    """MuJoCo's own contact (positive solref, default solimp) stands Go1 at a
    height that moves by under 2.5 mm across moderate settings, and within
    3 mm of the matched penalty law."""
    hs = mc.height_sensitivity("go1", dt=2e-3, duration=2.0)
    moderate = [hs[k] for k in ("default", "solref (0.005, 1)", "solref (0.01, 1)", "solref (0.02, 0.5)",
                                "solimp (0.8, 0.9, 0.001)", "solimp (0.95, 0.99, 0.001)",
                                "solimp (0.99, 0.999, 0.001)", "solimp (0.9, 0.95, 0.01)")]
    dev = np.abs(np.array(moderate) - hs["default"])
    assert dev.max() < 2.5e-3
    assert dev.max() > 0.5e-3  # the settings do matter
    # A slow constraint (timeconst 0.04 s, or overdamped) sinks by several mm.
    assert hs["default"] - hs["solref (0.04, 1)"] > 3e-3
    matched = mc.settle(mc.build_model("go1", dt=2e-3), "go1", duration=2.0, every=1000)
    assert abs(matched.base_height[-1] - hs["default"]) < 3e-3


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="elliptic"):
        mc.build_model("quadruped", cone="pyramidal")
    with pytest.raises(ValueError, match="scheme"):
        mc.build_model("quadruped", scheme="semi")
    with pytest.raises(ValueError, match="stiffness"):
        mc.build_model("quadruped", stiffness=-1.0)
    # The native model accepts the pyramidal cone.
    assert mc.build_model("quadruped", native=True, cone="pyramidal").opt.cone == mujoco.mjtCone.mjCONE_PYRAMIDAL


@pytest.mark.parametrize("robot", ROBOTS)
def test_joint_permutation_and_drop_state(robot):
    """The helpers a backdrive comparison uses: joint order by name, and the
    drop state (lowest foot 5 cm up, standing pose)."""
    from backdrive.data import load

    model = mc.build_model(robot, dt=2e-3)
    bd = load(mc.ROBOTS[robot].name, floating_base=True)
    perm = mc.joint_permutation(model, bd.joint_names)
    names = [mujoco.mj_id2name(model, mujoco.mjtObj.mjOBJ_JOINT, model.actuator_trnid[a, 0]) for a in range(model.nu)]
    assert [names[i] for i in perm] == list(bd.joint_names)
    with pytest.raises(ValueError, match="nope"):
        mc.joint_permutation(model, ["nope"] + list(bd.joint_names[1:]))
    qpos, ctrl = mc.drop_state(model, robot)
    data = mujoco.MjData(model)
    data.qpos[:] = qpos
    mujoco.mj_forward(model, data)
    feet = mc._foot_geoms(model, mc.ROBOTS[robot])
    assert (data.geom_xpos[feet, 2] - model.geom_size[feet, 0]).min() == pytest.approx(0.05, abs=1e-12)
    np.testing.assert_array_equal(qpos[model.jnt_qposadr[model.actuator_trnid[:, 0]]], ctrl)
