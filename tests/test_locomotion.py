"""QuadrupedWalk: shapes, standing, gradients against finite differences, errors, NaN resets,
the gymnasium view and the shipped walking policy."""

from __future__ import annotations

import math

import pytest
import torch

from backdrive import InputError
from backdrive.envs import QuadrupedWalk, Randomization, to_gymnasium
from backdrive.envs._quadruped import REWARD_WEIGHTS
from _robots import go1_robot  # shared fixture

FORWARD = {"vx": (0.5, 0.5), "vy": (0.0, 0.0), "yaw": (0.0, 0.0)}


def test_shapes_dtypes_and_layout():
    env = QuadrupedWalk(3, command_ranges=FORWARD)
    obs = env.reset(seed=0)
    assert obs.shape == (3, env.obs_dim) == (3, 47) and obs.dtype == torch.float32
    assert env.state.shape == (3, env.state_dim) == (3, 65)
    obs, r, te, tr, info = env.step(torch.zeros(3, 12))
    assert obs.shape == (3, 47) and r.shape == (3,) and te.dtype == torch.bool and tr.shape == (3,)
    assert info["final_obs"].shape == (3, 47) and info["nonfinite"].shape == (3,)
    parts = env.split(env.state)
    assert torch.equal(parts["command"], torch.tensor([[0.5, 0.0, 0.0]]).expand(3, 3))
    assert torch.equal(parts["last_action"], torch.zeros(3, 12))
    # The observed command and gravity direction are where the docstring says.
    assert torch.allclose(obs[:, 42:45], parts["command"])
    assert torch.allclose(obs[:, 27:30], env.projected_gravity(env.state))
    priv = QuadrupedWalk(2, privileged=True, dtype=torch.float64)
    assert priv.reset(seed=0).shape == (2, 51) and priv.state.dtype == torch.float64


def test_nominal_action_stands_upright():
    env = QuadrupedWalk(4, command_ranges=FORWARD, autoreset=False)
    env.reset(seed=1)
    with torch.no_grad():
        for _ in range(100):  # 2 s: dropped from the reset pose, it bounces for about 1.5 s
            _, _, term, _, _ = env.step(torch.zeros(4, 12))
            assert not term.any()
    s = env.split(env.state)
    # Settled on its feet near the documented standing height, at rest and upright.
    assert torch.allclose(s["q"][:, 2], torch.full((4,), env.stand_height), atol=0.02)
    assert env.projected_gravity(env.state)[:, 2].max() < -0.99
    assert s["v"][:, :3].norm(dim=-1).max() < 0.05
    assert s["contact"].min() > 0.5  # every foot loaded (normal force > 7 N)


def test_reward_gradient_matches_finite_differences_float64():
    env = QuadrupedWalk(1, dtype=torch.float64, command_ranges=FORWARD, autoreset=False)
    env.reset(seed=2)
    s0 = env.state.clone()
    gen = torch.Generator().manual_seed(0)
    a0 = 0.3 * torch.rand(3, 1, 12, generator=gen, dtype=torch.float64) - 0.15

    def window(actions):
        env.set_state(s0)
        total = 0.0
        for t in range(actions.shape[0]):
            _, r, _, _, _ = env.step(actions[t])
            total = total + r.sum()
        return total

    a = a0.clone().requires_grad_(True)
    (g,) = torch.autograd.grad(window(a), a)
    assert torch.isfinite(g).all() and g.abs().max() > 1e-3
    eps = 1e-6
    for t, j in [(0, 1), (0, 5), (1, 2), (2, 10)]:
        d = torch.zeros_like(a0)
        d[t, 0, j] = eps
        with torch.no_grad():
            fd = (window(a0 + d) - window(a0 - d)) / (2 * eps)
        assert float(g[t, 0, j]) == pytest.approx(float(fd), rel=1e-4, abs=1e-6)


def test_bad_input_gets_typed_errors():
    env = QuadrupedWalk(2, command_ranges={"vx": (0.0, 1.0)})
    env.reset(seed=0)
    with pytest.raises(InputError, match="shape"):
        env.step(torch.zeros(2, 11))
    with pytest.raises(InputError, match="float32"):
        env.step(torch.zeros(2, 12, dtype=torch.float64))
    with pytest.raises(InputError, match=r"command vx = 1\.5 .*\[0\.0, 1\.0\]"):
        env.set_command(torch.tensor([1.5, 0.0, 0.0]))
    with pytest.raises(InputError, match="command yaw"):
        env.set_command(torch.tensor([0.5, 0.0, 2.0]))
    with pytest.raises(InputError, match="unknown reward term 'speed'"):
        QuadrupedWalk(1, reward_weights={"speed": 1.0})
    with pytest.raises(InputError, match="unknown command 'vz'"):
        QuadrupedWalk(1, command_ranges={"vz": (0, 1)})
    with pytest.raises(InputError, match="unknown robot 'anymal'"):
        QuadrupedWalk(1, robot="anymal")
    with pytest.raises(InputError, match="substeps"):
        QuadrupedWalk(1, substeps=0)


def test_nan_in_one_env_resets_it_and_stays_out_of_the_gradient():
    env = QuadrupedWalk(3, command_ranges=FORWARD, dtype=torch.float64)
    env.reset(seed=3)
    state = env.state.clone()
    state[1, 20] = math.nan  # env 1's base velocity
    env.set_state(state)
    w = torch.zeros(47, 12, dtype=torch.float64, requires_grad=True)
    obs = env.observation()
    total = 0.0
    for k in range(2):
        obs, r, _, trunc, info = env.step(torch.tanh(torch.nan_to_num(obs) @ w))
        total = total + r.sum()
        if k == 0:
            assert info["nonfinite"].tolist() == [False, True, False] and bool(trunc[1])
            assert float(r[1].detach()) == 0.0 and torch.isfinite(info["final_obs"]).all()
    assert env.nonfinite_resets == 1
    assert torch.isfinite(env.state).all() and torch.isfinite(total)
    (g,) = torch.autograd.grad(total, w)
    assert torch.isfinite(g).all() and g.abs().sum() > 0


def test_randomization_and_gymnasium_view():
    pytest.importorskip("gymnasium")
    env = QuadrupedWalk(1, randomization=Randomization(push_velocity=0.5, push_interval=0.02))
    gym_env = to_gymnasium(env)
    obs, _ = gym_env.reset(seed=0)
    assert obs.shape == (47,) and gym_env.action_space.shape == (12,)
    s = env.split(env.state)
    assert 0.5 <= float(s["friction"]) <= 1.25 and 0.9 <= float(s["motor_strength"]) <= 1.1
    obs, r, term, trunc, _ = gym_env.step(gym_env.action_space.sample() * 0)
    assert obs.shape == (47,) and math.isfinite(r)
    # push_interval = dt: every step pushes, so the base velocity jumps.
    assert float(env.split(env.state)["v"][0, :2].norm()) > 0.01
    with pytest.raises(Exception, match="push_velocity"):
        Randomization(push_velocity=-1.0)


def test_shipped_policy_walks_forward():
    env, policy = QuadrupedWalk.pretrained(2)
    assert env.privileged and env.gait_frequency > 0 and env.obs_dim == 51
    m = env.evaluate(policy, (0.5, 0.0, 0.0), seconds=2.0, seed=5, settle=0.5)
    # Standing in place under the trot generator gives ~0 m/s; the shipped
    # policy walks near the commanded 0.5 m/s and stays upright.
    assert m["upright"] == 1.0
    assert 0.35 < m["forward_speed"] < 0.65, m["forward_speed"]
    assert m["distance"] > 0.4  # along the start heading, in 2 s
    # The file is QUADRUPED_WALK_SHAC_DECAY's seed-0 run (examples/quadruped_walk.py --ship, the example's
    # default preset): it names the preset, its env keywords are the preset's, and the test numbers it
    # records (16 episodes x 10 s, seed 999; docs/locomotion.md) meet issue 12's target.
    ckpt = QuadrupedWalk.shipped_checkpoint("quadruped")
    preset = QuadrupedWalk.shipped_preset()
    assert preset.name == ckpt["preset"] == "quadruped_walk_shac_decay"
    assert ckpt["env_kwargs"] == _listed({k: v for k, v in preset.env_kwargs.items() if k != "num_envs"})
    metrics = ckpt["metrics"]
    assert metrics["upright"] == 1.0 and metrics["env_steps"] == 215_040
    assert abs(metrics["forward_speed"] - 0.519) < 0.001 and metrics["speed_error"] < 0.1
    assert metrics["train_cpu_minutes"] < 15.0
    # Where it was made (training is chaotic across machines): a commit of this repository, unmodified sources.
    prov = ckpt["provenance"]
    assert len(prov["git_commit"]) == 40 and prov["src_modified"] is False and prov["threads"] == 1


def _listed(kwargs: dict) -> dict:
    # The file keeps tuples as lists (examples/quadruped_walk.py's slim_checkpoint).
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in kwargs.items()}


def test_preset_builds_its_env():
    from backdrive.optim import PRESETS, QUADRUPED_WALK_SHAC
    from backdrive.optim._policy.presets import get_preset

    env = QUADRUPED_WALK_SHAC.make_env(num_envs=2)
    assert isinstance(env, QuadrupedWalk) and env.privileged and env.gait_frequency == 3.0
    assert env.command_ranges["vx"] == (0.2, 0.8)
    assert QUADRUPED_WALK_SHAC.mismatches(QUADRUPED_WALK_SHAC.make_env()) == []
    assert get_preset("quadruped_walk_shac") is QUADRUPED_WALK_SHAC is PRESETS["quadruped_walk_shac"]
    QUADRUPED_WALK_SHAC.config.check_env(env)
    dr = get_preset("quadruped_walk_shac_dr")
    assert dr.config == QUADRUPED_WALK_SHAC.config and dr.updates == QUADRUPED_WALK_SHAC.updates
    dr_env = dr.make_env(num_envs=2)
    assert dr_env.randomization == Randomization() and dr.mismatches(dr.make_env()) == []


def test_go1_legs_are_mapped_by_joint_name_and_it_stands():
    from backdrive.data import load

    go1 = go1_robot()
    assert go1.joint_names[:3] == ("FR_hip_joint", "FR_thigh_joint", "FR_calf_joint")  # the URDF's order
    env = QuadrupedWalk(2, robot=go1, command_ranges=FORWARD, init_noise=0.0, autoreset=False)
    assert env.feet == ("FL_foot", "FR_foot", "RL_foot", "RR_foot")
    want = [f"{leg}_{j}_joint" for leg in ("FL", "FR", "RL", "RR") for j in ("hip", "thigh", "calf")]
    assert [go1.joint_names[i] for i in env.joint_index.tolist()] == want
    env.reset(seed=0)
    s = env.state.clone()
    s[:, 19:25] = 0.0  # base at rest
    env.set_state(s)
    base = env.observation()
    # Perturb one named joint in the state: exactly its observation entry moves.
    s2 = s.clone()
    s2[:, 7 + go1.joint_index("RL_calf_joint")] += 0.3
    s2[:, 25 + go1.joint_index("FR_hip_joint")] += 2.0  # a joint velocity
    diff = env.observe(s2) - base
    expect = torch.zeros(2, env.obs_dim)
    expect[:, want.index("RL_calf_joint")] = 0.3
    expect[:, 12 + want.index("FR_hip_joint")] = 2.0
    assert torch.allclose(diff, expect, atol=1e-6)
    # An action on one env joint drives that named joint of the robot.
    a = torch.zeros(2, 12)
    a[:, want.index("FL_thigh_joint")] = 0.5
    env.step(a)
    moved = (env.state[:, 7:19] - s[:, 7:19]).abs().mean(0)
    assert int(moved.argmax()) == go1.joint_index("FL_thigh_joint")
    # Zero action for 2 s: Go1 stays upright at its standing height, every foot loaded.
    env.set_state(s)
    with torch.no_grad():
        for _ in range(100):
            _, _, term, _, _ = env.step(torch.zeros(2, 12))
            assert not term.any()
    p = env.split(env.state)
    assert torch.allclose(p["q"][:, 2], torch.full((2,), env.stand_height), atol=0.005)
    assert env.projected_gravity(env.state)[:, 2].max() < -0.99 and p["contact"].min() > 0.5
    assert QuadrupedWalk(1, robot="go1").robot.name == go1.name
    with pytest.raises(InputError, match="missing"):
        QuadrupedWalk(1, robot=load("example-robot-data:solo12", floating_base=True, dtype=torch.float32))
    with pytest.raises(InputError, match="floating-base"):
        QuadrupedWalk(1, robot=load("quadruped", dtype=torch.float32))


def test_base_mass_randomization_per_copy():
    rand = Randomization(friction=None, stiffness_scale=None, motor_strength=None, push_velocity=0.0,
                         base_mass=(1.0, 1.6))
    env = QuadrupedWalk(4, command_ranges=FORWARD, init_noise=0.0, randomization=rand, autoreset=False)
    env.reset(seed=0)
    s = env.state.clone()
    s[:, 19:25] = 0.0
    env.split(s)["mass_scale"][:, 0] = torch.tensor([1.0, 1.6, 1.6, 1.0])  # a view into s
    env.set_state(s)
    with torch.no_grad():
        for _ in range(40):  # 0.8 s
            env.step(torch.zeros(4, 12))
    z = env.split(env.state)["q"][:, 2]
    # The heavier base (+3 kg) settles lower; equal copies agree.
    assert float(z[1] - z[0]) < -1e-3 and abs(float(z[1] - z[2])) < 1e-6 and abs(float(z[0] - z[3])) < 1e-6
    # At rest the ground carries each copy's own weight (one more physics step, groups in mixed rows).
    robot = env.robot
    m0 = float(robot.total_mass)
    heavy = m0 + 0.6 * float(robot.body_mass[0])
    with torch.no_grad():
        groups = env._simulators(env.split(env.state))
        _, _, _, normal, _ = env._substep(groups, env.state[:, :19], env.state[:, 19:37],
                                           env.to_robot_order(env.q_stand).expand(4, 12))
    total = normal.sum(-1)
    g = float(robot.gravity.norm())
    assert torch.allclose(total, g * torch.tensor([m0, heavy, heavy, m0]), rtol=0.02), total
    with pytest.raises(Exception, match="base_mass"):
        Randomization(base_mass=(1.0, -1.0))


def test_base_mass_groups_gradient_matches_finite_differences_float64():
    rand = Randomization(friction=None, stiffness_scale=None, motor_strength=None, push_velocity=0.0,
                         base_mass=(0.8, 1.3))
    env = QuadrupedWalk(3, dtype=torch.float64, command_ranges=FORWARD, randomization=rand, autoreset=False)
    env.reset(seed=4)
    s0 = env.state.clone()
    env.split(s0)["mass_scale"][:, 0] = torch.tensor([1.3, 0.8, 1.3], dtype=torch.float64)
    a0 = 0.1 * torch.ones(3, 12, dtype=torch.float64)

    def loss(a):
        env.set_state(s0)
        _, r, _, _, _ = env.step(a)
        return (r * torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)).sum()

    a = a0.clone().requires_grad_(True)
    (g,) = torch.autograd.grad(loss(a), a)
    eps = 1e-6
    for i, j in [(0, 1), (1, 4), (2, 8)]:  # a joint of each copy: rows come back to their own copy
        d = torch.zeros_like(a0)
        d[i, j] = eps
        with torch.no_grad():
            fd = (loss(a0 + d) - loss(a0 - d)) / (2 * eps)
        assert abs(float(fd)) > 1e-4 and float(g[i, j]) == pytest.approx(float(fd), rel=1e-4, abs=1e-7)


def test_go1_preset_builds_its_env():
    from backdrive.optim import GO1_WALK_SHAC, QUADRUPED_WALK_SHAC
    from backdrive.optim._policy.presets import get_preset

    go1_robot()
    assert get_preset("go1_walk_shac") is GO1_WALK_SHAC
    # The quadruped recipe with a linear learning-rate decay to 0.1x at its last update.
    assert GO1_WALK_SHAC.config == QUADRUPED_WALK_SHAC.config.replace(lr_decay_updates=167)
    assert GO1_WALK_SHAC.updates == 150 and QUADRUPED_WALK_SHAC.config.lr_decay_updates is None
    env = GO1_WALK_SHAC.make_env(num_envs=2)
    assert env.robot_name == "go1" and env.privileged and env.gait_frequency == 3.0
    assert GO1_WALK_SHAC.mismatches(GO1_WALK_SHAC.make_env()) == []
    # The preset names its robot: an env on the shipped quadruped differs from it.
    assert GO1_WALK_SHAC.mismatches(QUADRUPED_WALK_SHAC.make_env()) == ["robot='quadruped' (preset: 'go1')"]
    # The DR variant: the same training settings, Randomization() on in its env.
    dr = get_preset("go1_walk_shac_dr")
    assert dr.config == GO1_WALK_SHAC.config and dr.updates == GO1_WALK_SHAC.updates
    assert {k: v for k, v in dr.env_kwargs.items() if k != "randomization"} == GO1_WALK_SHAC.env_kwargs
    dr_env = dr.make_env(num_envs=2)
    assert dr_env.robot_name == "go1" and dr_env.randomization == Randomization()
    assert dr.mismatches(dr.make_env()) == [] and dr.mismatches(env) != []
    # The shipped recipe on the step without adhesion: GO1_WALK_SHAC with a 10x foot-slip penalty.
    slip = get_preset("go1_walk_shac_slip")
    assert slip.config == GO1_WALK_SHAC.config and slip.updates == GO1_WALK_SHAC.updates
    assert {k: v for k, v in slip.env_kwargs.items() if k != "reward_weights"} == GO1_WALK_SHAC.env_kwargs
    slip_env = slip.make_env(num_envs=2)
    assert slip_env.reward_weights == {**REWARD_WEIGHTS, "foot_slip": 0.5} and slip_env.randomization is None
    assert slip.mismatches(slip.make_env()) == [] and slip.mismatches(env) != []


def test_go1_shipped_policy_walks_forward():
    go1_robot()
    env, policy = QuadrupedWalk.pretrained(2, robot="go1")
    assert env.robot_name == "go1" and env.privileged and env.obs_dim == 51
    m = env.evaluate(policy, (0.5, 0.0, 0.0), seconds=2.0, seed=5, settle=0.5)
    # Under the trot generator alone Go1 steps in place and drifts backwards
    # (about -0.17 m/s); the shipped policy walks forward and stays upright.
    assert m["upright"] == 1.0
    assert 0.35 < m["forward_speed"] < 0.65, m["forward_speed"]
    # The file is GO1_WALK_SHAC_SLIP's seed-0 run (examples/quadruped_walk.py --preset go1_walk_shac_slip
    # --ship): its env keywords are the preset's, and the test numbers it records (16 episodes x 10 s,
    # seed 999; docs/locomotion.md) meet issue 12's target.
    ckpt = QuadrupedWalk.shipped_checkpoint("go1")
    preset = QuadrupedWalk.shipped_preset("go1")
    assert preset.name == ckpt["preset"] == "go1_walk_shac_slip"
    assert ckpt["env_kwargs"] == {k: v for k, v in preset.env_kwargs.items() if k != "num_envs"}
    assert env.reward_weights["foot_slip"] == 0.5
    metrics = ckpt["metrics"]
    assert metrics["upright"] == 1.0 and metrics["env_steps"] == 76_800
    assert abs(metrics["forward_speed"] - 0.468) < 0.001 and metrics["speed_error"] < 0.1
    with pytest.raises(InputError, match="anymal"):
        QuadrupedWalk.pretrained(1, robot="anymal")


def test_pretrained_takes_a_robot_model_of_a_shipped_robot():
    # A model (e.g. with calibrated parameters) picks the policy by its name
    # and becomes the env's robot; a model of another name is refused.
    from backdrive.data import load

    base = load("quadruped", floating_base=True, dtype=torch.float32)
    model = base.replace(body_mass=base.body_mass * 1.1)
    env, policy = QuadrupedWalk.pretrained(1, robot=model)
    assert env.robot is model and policy(env.reset(seed=0)).shape == (1, 12)
    with pytest.raises(InputError, match="'pendulum'"):
        QuadrupedWalk.pretrained(1, robot=load("pendulum"))
