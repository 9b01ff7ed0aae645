"""The MuJoCo transfer harness (``benchmarks/locomotion_transfer.py``) feeds the
policy what ``QuadrupedWalk`` would: the same physical state, converted to
MuJoCo, gives the same observation, and MuJoCo's own kinematics of that state
(foot positions and velocities, base orientation and twist) agree with
backdrive's.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

mujoco = pytest.importorskip("mujoco")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import locomotion_transfer as lt  # noqa: E402

from backdrive.envs import QuadrupedWalk  # noqa: E402
from backdrive.kinematics import frame_jacobian, frame_transforms  # noqa: E402


def _random_state(env: QuadrupedWalk, seed: int = 0) -> torch.Tensor:
    """Reset states with a tilted, turning, moving base and moving joints (float64)."""
    g = torch.Generator().manual_seed(seed)
    env.reset(seed=seed)
    state = env.state.clone()
    p = env.split(state)
    n = state.shape[0]
    quat = torch.randn(n, 4, generator=g, dtype=state.dtype)
    quat[:, 0] += 3.0  # within ~40 degrees of upright
    p["q"][:, 3:7] = quat / quat.norm(dim=-1, keepdim=True)
    p["q"][:, :3] += 0.05 * torch.randn(n, 3, generator=g, dtype=state.dtype)
    p["v"].copy_(torch.randn(n, 18, generator=g, dtype=state.dtype))
    p["last_action"].copy_(torch.rand(n, 12, generator=g, dtype=state.dtype) * 2 - 1)
    return state


@pytest.mark.parametrize("robot,contact", [("quadruped", "matched"), ("quadruped", "native"), ("go1", "matched")])
def test_observation_from_mujoco_state_equals_env_observation(robot, contact):
    # Go1's URDF lists its legs FR, FL, RR, RL: the observation must follow the env's FL, FR, RL, RR.
    env = QuadrupedWalk(4, robot=robot, privileged=True, gait_frequency=3.0, gait_amplitude=0.15, dtype=torch.float64)
    model, perm = lt.build(env, contact)
    state = _random_state(env)
    p = {k: t.numpy() for k, t in env.split(state).items()}
    qpos, qvel = lt.to_mujoco(p["q"], p["v"], perm)
    expected = env.observe(state).numpy()
    feet = [mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_GEOM, f"{f}_sphere") for f in env.feet]
    trunk = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_BODY, lt.mc.ROBOTS[robot].root_link)
    _, foot_p = frame_transforms(env.robot, state[:, :19], env.feet)
    vel6 = np.zeros(6)
    for i in range(len(state)):
        d = mujoco.MjData(model)
        d.qpos[:], d.qvel[:] = qpos[i], qvel[i]
        mujoco.mj_forward(model, d)
        obs = lt.mujoco_observation(d.qpos, d.qvel, lt.env_order(env, perm), env.q_stand.numpy(), p["last_action"][i],
                                    p["command"][i], p["phase"][i], privileged=True)
        assert obs.shape == (51,)
        np.testing.assert_allclose(obs, expected[i], atol=1e-5, rtol=0)
        # The same physical state: MuJoCo's foot positions and velocities are
        # backdrive's kinematics (this catches a wrong joint order or frame).
        np.testing.assert_allclose(d.geom_xpos[feet], foot_p[i].numpy(), atol=1e-9)
        for k, f in enumerate(env.feet):
            mujoco.mj_objectVelocity(model, d, mujoco.mjtObj.mjOBJ_GEOM, feet[k], vel6, 0)
            v_bd = (frame_jacobian(env.robot, state[i, :19], f) @ state[i, 19:37])[:3]
            np.testing.assert_allclose(vel6[3:], v_bd.numpy(), atol=1e-9)
        # Base-frame quantities from MuJoCo's own body frame and twist.
        mujoco.mj_objectVelocity(model, d, mujoco.mjtObj.mjOBJ_XBODY, trunk, vel6, 1)
        np.testing.assert_allclose(obs[24:27], vel6[:3], atol=1e-9)  # angular velocity
        np.testing.assert_allclose(obs[47:50], vel6[3:], atol=1e-9)  # linear velocity
        np.testing.assert_allclose(obs[27:30], d.xmat[trunk].reshape(3, 3).T @ [0.0, 0.0, -1.0], atol=1e-9)


def test_model_matches_env_servos_and_limits():
    env = QuadrupedWalk(1, dtype=torch.float64)
    model, perm = lt.build(env, "matched")
    assert model.nu == 12 and model.opt.timestep == pytest.approx(0.005)
    np.testing.assert_allclose(model.actuator_gainprm[:, 0], env.kp)
    np.testing.assert_allclose(model.actuator_biasprm[:, 2], -env.kd)
    np.testing.assert_allclose(model.actuator_forcerange[perm, 1], env.robot.effort_limit.numpy())
    with pytest.raises(ValueError, match="contact"):
        lt.build(env, "soft")


def test_short_walk_in_mujoco_is_upright_and_close_to_backdrive():
    torch.set_num_threads(1)
    env, policy = QuadrupedWalk.pretrained(2)
    mj = lt.run_mujoco(env, policy, "matched", seconds=2.0, settle=1.0)
    bd = env.evaluate(policy, lt.COMMAND, seconds=2.0, seed=lt.SEED, settle=1.0)
    assert mj["upright"] == 1.0 and bd["upright"] == 1.0
    assert abs(mj["forward_speed"] - bd["forward_speed"]) < 0.25 * bd["forward_speed"]


def test_hidden_model_and_control_delay():
    """``build_hidden`` puts the hidden parameters where MuJoCo reads them, a
    given model runs as the built one, and the delay changes the walk."""
    torch.set_num_threads(1)
    env, policy = QuadrupedWalk.pretrained(1)
    r = env.robot
    truth = {"mass": (r.body_mass * 1.1).tolist(), "damping": [0.05 + 0.01 * j for j in range(12)],
             "strength": 0.9, "friction": 0.6}
    model, perm = lt.build_hidden(env, truth, 0.005)
    for name, m in zip(r.body_names, truth["mass"]):
        assert model.body_mass[model.body(name).id] == pytest.approx(m)
    for name, d in zip(r.joint_names, truth["damping"]):
        adr = model.jnt_dofadr[model.joint(name).id]
        assert model.dof_damping[adr] == pytest.approx(d) and model.dof_armature[adr] == pytest.approx(0.01)
    np.testing.assert_allclose(model.actuator_gainprm[:, 0], 0.9 * env.kp)
    np.testing.assert_allclose(model.actuator_biasprm[:, 1:3], [[-0.9 * env.kp, -0.9 * env.kd]] * 12)
    assert model.opt.cone == mujoco.mjtCone.mjCONE_ELLIPTIC
    assert np.allclose(model.geom_friction[model.geom_contype > 0, 0], 0.6)
    kw = {"seconds": 0.4, "settle": 0.0}
    built = lt.run_mujoco(env, policy, "native", **kw)
    given = lt.run_mujoco(env, policy, "native", model=lt.build(env, "native"), **kw)
    assert given == built
    delayed = lt.run_mujoco(env, policy, "native", model=lt.build(env, "native"), delay=3, **kw)
    assert delayed["forward_speed"] != built["forward_speed"]
    with pytest.raises(ValueError, match="delay"):
        lt.run_mujoco(env, policy, "native", delay=5, **kw)
    with pytest.raises(ValueError, match="time step"):
        lt.run_mujoco(env, policy, "native", dt=0.0025, model=(model, perm), **kw)


def test_delayed_walk_holds_the_previous_target():
    """``calibration_loop.DelayedWalk`` with a delay of a whole control period
    steps the robot as ``QuadrupedWalk`` does under the previous period's
    target (last action, clock one period back); delay 0 is ``QuadrupedWalk``."""
    import calibration_loop as cl

    torch.set_num_threads(1)
    env = cl.DelayedWalk(2, privileged=True, gait_frequency=3.0, gait_amplitude=0.15, dtype=torch.float64)
    ref = QuadrupedWalk(2, privileged=True, gait_frequency=3.0, gait_amplitude=0.15, dtype=torch.float64)
    state = _random_state(env, 1)
    action = torch.rand(2, 12, dtype=torch.float64, generator=torch.Generator().manual_seed(2)) * 2 - 1
    now = ref.transition(state, action)
    assert torch.equal(env.transition(state, action), now)
    env.delay = env.substeps
    late = env.transition(state, action)
    p = ref.split(state.clone())
    p["phase"] -= 2 * np.pi * ref.gait_frequency * ref.dt
    prev = ref.transition(torch.cat([p[k] for k in ref.split(state)], -1), p["last_action"].clone())
    torch.testing.assert_close(late[:, :37], prev[:, :37], rtol=0, atol=1e-12)
    assert not torch.allclose(late[:, :37], now[:, :37])
    env.delay = 2
    half = env.transition(state, action)
    assert not torch.allclose(half[:, :37], late[:, :37]) and not torch.allclose(half[:, :37], now[:, :37])
