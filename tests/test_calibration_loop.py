"""The fine-tuning recipe of ``benchmarks/calibration_loop.py``: the critic
warm-up leaves the shipped actor untouched (also under a learning-rate
decay), the actor moves after it, the proximal anchor pulls it back to the
shipped weights, and the own-sim selection considers the shipped policy."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("mujoco")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import calibration_loop as cl  # noqa: E402

from backdrive.envs import QuadrupedWalk  # noqa: E402


def _weights(module):
    return [p.detach().clone() for p in module.parameters()]


def test_critic_warmup_freezes_the_actor_and_anchor_pulls_back():
    torch.set_num_threads(1)
    _, shipped = QuadrupedWalk.pretrained(1)
    w0 = _weights(shipped)
    stats = shipped.normalizer.mean.clone()

    # Two critic-only updates: the actor (and its observation statistics) is the shipped one.
    policy, trainer, drift = cl.fine_tune_policy(cl.make_env(None, 2), shipped, updates=2, warmup=2, lr=1e-3)
    assert drift == 0.0 and trainer.updates_done == 2
    assert all(torch.equal(a, b) for a, b in zip(_weights(policy), w0))
    assert torch.equal(policy.normalizer.mean, stats)
    assert all(torch.isfinite(torch.tensor(r["critic_loss"])) for r in trainer.history)

    # One warm-up update, then one actor step: the actor moves.
    policy, _, drift = cl.fine_tune_policy(cl.make_env(None, 2), shipped, updates=2, warmup=1, lr=1e-3)
    assert drift > 1e-5
    assert not all(torch.equal(a, b) for a, b in zip(_weights(policy), w0))

    # anchor = 1 returns every weight to the shipped one after each actor step.
    policy, _, drift = cl.fine_tune_policy(cl.make_env(None, 2), shipped, updates=2, warmup=1, lr=1e-3, anchor=1.0)
    assert drift < 1e-9  # float32 rounding of w - (w - w0)
    # The shipped policy itself is never modified.
    assert all(torch.equal(a, b) for a, b in zip(_weights(shipped), w0))


def test_warmup_holds_under_a_learning_rate_decay_and_the_shipped_policy_is_a_candidate(monkeypatch):
    # GO1_WALK_SHAC decays its learning rates (lr_decay_updates); the trainer
    # rewrites the actor's learning rate at every update, which once undid the
    # warm-up's lr 0 (the Go1 actor then followed the unfitted critic).
    torch.set_num_threads(1)
    _, shipped = QuadrupedWalk.pretrained(1)
    w0 = _weights(shipped)
    config = cl.QUADRUPED_WALK_SHAC.config.replace(lr_decay_updates=167)
    policy, trainer, drift = cl.fine_tune_policy(cl.make_env(None, 2), shipped, updates=2, warmup=2, lr=1e-3,
                                                 config=config)
    assert drift == 0.0 and trainer.updates_done == 2
    assert all(torch.equal(a, b) for a, b in zip(_weights(policy), w0))

    # Own-sim selection: the shipped policy is candidate 0 (before any actor step), then every actor update.
    monkeypatch.setitem(cl.SELECT, "seconds", 0.3)
    monkeypatch.setattr(cl.LT, "SETTLE", 0.1)
    policy, trainer, drift = cl.fine_tune_policy(cl.make_env(None, 2), shipped, updates=3, warmup=1, lr=1e-3,
                                                 config=config, select=(cl.make_env(None, 2), 1))
    cands = trainer.selection["candidates"]
    assert [c["update"] for c in cands] == [0, 1, 2]
    m = cl.make_env(None, 2).evaluate(shipped, cl.LT.COMMAND, seconds=0.3, seed=cl.SELECT["seed"], settle=0.1)
    assert cands[0]["forward_speed"] == pytest.approx(m["forward_speed"], abs=1e-6)
    assert cands[1]["forward_speed"] != cands[0]["forward_speed"]  # the actor moved
    assert (drift == 0.0) == (trainer.selection["kept"] == 0)


def test_go1_mujoco_targets_follow_the_env_joint_layout():
    # Go1's URDF lists its legs FR, FL, RR, RL; the env (and its policy) uses FL, FR, RL, RR.
    # From the same physical state the loop's MuJoCo path must send the servo targets backdrive would.
    import numpy as np

    import locomotion_transfer as lt

    torch.set_num_threads(1)
    env, policy = QuadrupedWalk.pretrained(3, robot="go1", dtype=torch.float64)
    policy = policy.to(torch.float64)
    env.reset(seed=5)
    state = env.state.clone()
    p = env.split(state)
    g = torch.Generator().manual_seed(0)
    p["q"][:, 7:] += 0.2 * torch.randn(3, 12, generator=g, dtype=torch.float64)  # legs differ from each other
    p["v"].copy_(0.5 * torch.randn(3, 18, generator=g, dtype=torch.float64))
    p["last_action"].copy_(torch.rand(3, 12, generator=g, dtype=torch.float64) * 2 - 1)
    with torch.no_grad():
        action = policy(env.observe(state)).clamp(-1, 1)
        target = env.to_robot_order(env.q_stand + env.action_scale * action + env.gait_offsets(p["phase"])).numpy()

    model, perm = lt.build_hidden(env, cl.hidden_truth(0, env.robot, "go1"))
    n = {k: t.numpy() for k, t in p.items()}
    qpos, qvel = lt.to_mujoco(n["q"], n["v"], perm)
    eperm = lt.env_order(env, perm)
    a, t = cl.policy_targets(env, policy, qpos, qvel, eperm, n["last_action"], n["command"], n["phase"])
    ctrl = cl.to_ctrl(t, eperm)
    np.testing.assert_allclose(a, action.numpy(), atol=1e-9)
    np.testing.assert_allclose(ctrl[:, perm], target, atol=1e-9)  # robot order: what the calibration sees
    for i in range(12):  # each MuJoCo actuator drives the joint of its name
        joint = model.joint(model.actuator_trnid[i, 0]).name
        np.testing.assert_allclose(ctrl[:, i], target[:, env.robot.joint_names.index(joint)], atol=1e-9)
    # The robot's order in place of the env's (the quadruped's harness as it was) gives other targets on Go1.
    a_wrong, _ = cl.policy_targets(env, policy, qpos, qvel, perm, n["last_action"], n["command"], n["phase"])
    assert np.abs(a_wrong - action.numpy()).max() > 1e-2


@pytest.mark.parametrize("observe", [None, "joint_position,base_orientation,base_linear_velocity"])
def test_observe_reaches_the_fit_with_the_estimators_noise(monkeypatch, tmp_path, observe):
    # The calibration passes --observe to ContactFit; the base velocity is weighed by the noise the
    # recording's state estimator adds (calibration.ESTIMATOR), the encoders and IMU by calibration.NOISE.
    seen = {}

    class Stop(Exception):
        pass

    def identify(robot, q, v, **kw):
        seen["method"] = kw["method"]
        raise Stop

    monkeypatch.setattr(cl, "identify", identify)
    argv = ["--robot", "go1", "--seed", "3", "--calibrate-only", "--windows", "4", "--record", "2",
            "--out", str(tmp_path / "c.json")] + (["--observe", observe] if observe else [])
    with pytest.raises(Stop):
        cl.main(argv)
    method = seen["method"]
    assert method.observe == (tuple(observe.split(",")) if observe else None)
    assert method.noise["base_linear_velocity"] == cl.CAL.ESTIMATOR[1]
    assert method.noise["joint_position"] == cl.CAL.NOISE["joint_position"]


def test_windows_longer_than_the_push_free_stretches_are_refused_clearly(monkeypatch, tmp_path):
    argv = ["--robot", "go1", "--seed", "3", "--calibrate-only", "--segment", "50", "--record", "3",
            "--out", str(tmp_path / "c.json")]
    with pytest.raises(SystemExit, match="no push-free calibration piece of 200 steps .* pushes the trunk every 1 s"):
        cl.main(argv)

    # Without pushes the same windows fit in the recording and reach the fit.
    class Stop(Exception):
        pass

    def identify(robot, q, v, **kw):
        assert kw["method"].segment == 50 and q.shape[-2] == 4 * 50 + 1
        raise Stop

    monkeypatch.setattr(cl, "identify", identify)
    with pytest.raises(Stop):
        cl.main(argv + ["--push-every", "0"])
