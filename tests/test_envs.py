"""backdrive.envs: the batched interface, Pendulum against gymnasium, the gymnasium adapter."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import backdrive.envs as envs
from backdrive import InputError
from backdrive.envs import DiffEnv, Pendulum, angle_normalize, to_gymnasium

import gymnasium as gym  # noqa: E402  (installed by the [test] extra)

# gymnasium returns float32 observations: |thdot| <= 8 rounds by at most 8 * 2**-24.
OBS_TOL = 1e-6
# Same float64 arithmetic in the same order: the states agree to the last bits.
STATE_TOL = 1e-12


def test_all_resolves():
    assert envs.__all__, "envs.__all__ is empty"
    for name in envs.__all__:
        assert getattr(envs, name) is not None, name


def _gym_pendulum():
    return gym.make("Pendulum-v1").unwrapped


def test_pendulum_matches_gymnasium_step_by_step_from_same_states():
    """Resynchronise every step: one-step agreement for arbitrary float32 actions."""
    g = _gym_pendulum()
    env = Pendulum(1, dtype=torch.float64, autoreset=False)
    rng = np.random.default_rng(0)
    worst = dict(obs=0.0, reward=0.0, state=0.0)
    for episode in range(5):
        g.reset(seed=episode)
        for _ in range(200):
            state = np.array(g.state, dtype=np.float64)
            env.set_state(torch.tensor(state)[None])
            action = rng.uniform(-3.0, 3.0, size=(1,)).astype(np.float32)  # beyond the limits too
            obs, reward, terminated, truncated, _ = g.step(action)
            obs2, reward2, term2, trunc2, _ = env.step(torch.tensor(action, dtype=torch.float64)[None])
            worst["obs"] = max(worst["obs"], float(np.abs(obs - obs2[0].numpy()).max()))
            worst["reward"] = max(worst["reward"], abs(reward - float(reward2[0])))
            worst["state"] = max(worst["state"], float(np.abs(g.state - env.state[0].numpy()).max()))
            assert not terminated and not bool(term2[0])
    assert worst["obs"] < OBS_TOL, worst
    assert worst["reward"] < OBS_TOL, worst
    # gymnasium computes 3 * u in float32 (numpy promotion), so one step differs by ~1e-8.
    assert worst["state"] < OBS_TOL, worst


def test_pendulum_matches_gymnasium_over_whole_episodes():
    """Free-running episodes: actions on a 1/8 grid make gymnasium's float32 products exact,
    so the trajectories agree to rounding over all 200 steps and the time limit matches."""
    g = gym.make("Pendulum-v1")
    env = Pendulum(1, dtype=torch.float64, autoreset=False)
    rng = np.random.default_rng(1)
    for episode in range(3):
        obs, _ = g.reset(seed=100 + episode)
        env.set_state(torch.tensor(np.array(g.unwrapped.state, dtype=np.float64))[None])
        ret, ret2 = 0.0, 0.0
        for t in range(200):
            action = (rng.integers(-20, 21, size=(1,)) / 8).astype(np.float32)
            obs, reward, terminated, truncated, _ = g.step(action)
            obs2, reward2, _, trunc2, _ = env.step(torch.tensor(action, dtype=torch.float64)[None])
            ret += reward
            ret2 += float(reward2[0])
            assert np.abs(obs - obs2[0].numpy()).max() < OBS_TOL
            assert np.abs(g.unwrapped.state - env.state[0].numpy()).max() < STATE_TOL
            assert bool(trunc2[0]) == truncated == (t == 199)
        assert abs(ret - ret2) < 1e-6


def test_pendulum_initial_distribution_and_seeding():
    env = Pendulum(4096, dtype=torch.float64)
    env.reset(seed=3)
    s = env.state
    assert s[:, 0].min() >= -math.pi and s[:, 0].max() <= math.pi
    assert s[:, 1].min() >= -1 and s[:, 1].max() <= 1
    assert s[:, 0].std() > 1.5 and s[:, 1].std() > 0.5  # spread, not a constant
    first = env.state.clone()
    env.reset(seed=3)
    assert torch.equal(env.state, first)
    env.reset()
    assert not torch.equal(env.state, first)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_batched_step_equals_single_steps(dtype):
    batch = Pendulum(8, dtype=dtype, autoreset=False)
    batch.reset(seed=0)
    states = batch.state.clone()
    actions = torch.linspace(-2.5, 2.5, 8, dtype=dtype)[:, None]
    obs, reward, *_ = batch.step(actions)
    single = Pendulum(1, dtype=dtype, autoreset=False)
    for i in range(8):
        single.set_state(states[i : i + 1])
        o, r, *_ = single.step(actions[i : i + 1])
        assert torch.equal(o[0], obs[i]) and torch.equal(r[0], reward[i])
    assert obs.dtype == dtype and reward.shape == (8,)


def test_angle_normalize_matches_numpy():
    x = np.linspace(-20, 20, 4001)
    ref = ((x + np.pi) % (2 * np.pi)) - np.pi
    got = angle_normalize(torch.tensor(x)).numpy()
    assert np.abs(got - ref).max() < 1e-12
    assert got.min() >= -np.pi and got.max() < np.pi


def test_step_gradcheck_wrt_action_and_state():
    env = Pendulum(3, dtype=torch.float64, autoreset=False)
    env.reset(seed=0)
    s0 = env.state.clone()

    def f(state, action):
        env.set_state(state)
        obs, reward, *_ = env.step(action)
        obs2, reward2, *_ = env.step(0.5 * action)
        return obs2, reward + reward2

    state = s0.clone().requires_grad_()
    action = torch.tensor([[0.3], [-1.1], [1.5]], dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(f, (state, action))


def test_autoreset_returns_new_obs_and_final_obs_with_gradient():
    env = Pendulum(2, dtype=torch.float64)
    env.reset(seed=0)
    env.set_state(env.state, elapsed=torch.tensor([199, 10]))
    state = env.state.clone().requires_grad_()
    env.set_state(state, elapsed=torch.tensor([199, 10]))
    action = torch.zeros(2, 1, dtype=torch.float64)
    obs, reward, terminated, truncated, info = env.step(action)
    assert truncated.tolist() == [True, False] and not terminated.any()
    assert env.elapsed.tolist() == [0, 11]
    # env 0 restarted: its observation is of the new state, final_obs of the old one
    assert torch.allclose(obs[0], env.observe(env.state[0].detach()))
    assert not torch.allclose(obs[0], info["final_obs"][0])
    assert torch.equal(obs[1], info["final_obs"][1])
    info["final_obs"][0, 2].backward()
    assert state.grad[0].abs().sum() > 0  # the last state still back-propagates


def test_detach_cuts_the_graph():
    env = Pendulum(2, dtype=torch.float64)
    env.reset(seed=0)
    state = env.state.clone().requires_grad_()
    env.set_state(state)
    env.step(torch.ones(2, 1, dtype=torch.float64))
    assert env.state.requires_grad
    env.detach()
    assert not env.state.requires_grad
    obs, *_ = env.step(torch.ones(2, 1, dtype=torch.float64))
    assert not obs.requires_grad


def test_state_dict_round_trip_replays_exactly():
    env = Pendulum(4, dtype=torch.float32)
    env.reset(seed=11)
    for _ in range(150):
        env.step(torch.ones(4, 1))
    saved = env.state_dict()
    a = [env.step(torch.full((4, 1), 0.7))[0] for _ in range(100)]  # crosses an autoreset
    env2 = Pendulum(4, dtype=torch.float32)
    env2.load_state_dict(saved)
    b = [env2.step(torch.full((4, 1), 0.7))[0] for _ in range(100)]
    assert all(torch.equal(x, y) for x, y in zip(a, b))


def test_input_errors():
    env = Pendulum(3)
    env.reset(seed=0)
    with pytest.raises(InputError, match=r"\(3, 1\)"):
        env.step(torch.zeros(3))
    with pytest.raises(InputError, match="float32"):
        env.step(torch.zeros(3, 1, dtype=torch.float64))
    with pytest.raises(InputError, match="num_envs"):
        Pendulum(0)
    with pytest.raises(InputError, match="dtype"):
        Pendulum(1, dtype=torch.int64)
    with pytest.raises(RuntimeError, match="reset"):
        Pendulum(1).step(torch.zeros(1, 1))


@pytest.mark.filterwarnings("ignore:.*symmetric and normalized space")
def test_to_gymnasium_passes_check_env():
    from gymnasium.utils.env_checker import check_env

    genv = to_gymnasium(Pendulum(1))
    assert isinstance(genv, gym.Env)
    check_env(genv, skip_render_check=True)
    assert genv.observation_space.shape == (3,) and genv.action_space.high[0] == 2.0


def test_to_gymnasium_episode_equals_backdrive_episode():
    genv = to_gymnasium(Pendulum(1, dtype=torch.float64))
    obs, _ = genv.reset(seed=5)
    inner = genv.env
    start = inner.state.clone()
    rewards, steps, truncated = [], 0, False
    while not truncated:
        obs, reward, terminated, truncated, _ = genv.step(np.array([1.0], dtype=np.float32))
        rewards.append(reward)
        steps += 1
    assert steps == 200
    ref = Pendulum(1, dtype=torch.float64, autoreset=False)
    ref.set_state(start)
    total = sum(float(ref.step(torch.ones(1, 1, dtype=torch.float64))[1][0]) for _ in range(200))
    assert abs(total - sum(rewards)) < 1e-9


def test_to_gymnasium_vector_same_step_autoreset():
    venv = to_gymnasium(Pendulum(3))
    assert isinstance(venv, gym.vector.VectorEnv)
    obs, _ = venv.reset(seed=0)
    assert obs.shape == (3, 3) and obs.dtype == np.float32
    for t in range(200):
        obs, reward, term, trunc, info = venv.step(np.zeros((3, 1), dtype=np.float32))
    assert trunc.all() and reward.shape == (3,)
    assert info["_final_obs"].all() and info["final_obs"][0].shape == (3,)
    assert not np.allclose(np.stack(info["final_obs"]), obs)
    with pytest.raises(InputError, match="num_envs"):
        to_gymnasium(Pendulum(3), vector=False)


def test_sb3_env_checker_accepts_adapter():
    import stable_baselines3 as sb3
    from stable_baselines3.common.env_checker import check_env as sb3_check

    sb3_check(to_gymnasium(Pendulum(1)), warn=False)
    assert sb3.__version__


def test_base_class_is_abstract():
    class Bare(DiffEnv):
        obs_dim = action_dim = state_dim = 1
        max_episode_steps = 5
        dt = 0.1

    with pytest.raises(NotImplementedError):
        Bare(1).reset()


# ------------------------------------------------------------------ cart-pole
def _cartpole_closed_form(state, force, g=9.81):
    """Accelerations of the shipped cart-pole from the textbook equations (URDF header)."""
    mc, mp, l, inertia = 1.0, 0.1, 0.5, 0.1 * 1.0**2 / 12
    x, th, xd, thd = state.unbind(-1)
    a11, a12 = mc + mp, mp * l * torch.cos(th)
    a22 = inertia + mp * l**2
    b1 = force + mp * l * torch.sin(th) * thd**2
    b2 = mp * g * l * torch.sin(th)
    det = a11 * a22 - a12 * a12
    xdd = (a22 * b1 - a12 * b2) / det
    thdd = (a11 * b2 - a12 * b1) / det
    return xdd, thdd


def test_cartpole_step_matches_closed_form_semi_implicit_euler():
    from backdrive.envs import CartPoleSwingUp

    env = CartPoleSwingUp(16, dtype=torch.float64, autoreset=False)
    gen = torch.Generator().manual_seed(0)
    # inside the track (the soft limits at +-2.4 m stay inactive)
    state = torch.rand(16, 4, generator=gen, dtype=torch.float64) * torch.tensor([3.0, 6.0, 4.0, 8.0]) - torch.tensor(
        [1.5, 3.0, 2.0, 4.0]
    )
    state[:, 1] = angle_normalize(state[:, 1])
    force = torch.rand(16, 1, generator=gen, dtype=torch.float64) * 16 - 8
    env.set_state(state)
    env.step(force)
    xdd, thdd = _cartpole_closed_form(state, force[:, 0], g=-float(env.robot.gravity[2]))
    dt = env.dt
    v1 = state[:, 2:] + dt * torch.stack([xdd, thdd], -1)
    q1 = state[:, :2] + dt * v1
    ref = torch.cat([q1[:, :1], angle_normalize(q1[:, 1:2]), v1], -1)
    assert (env.state - ref).abs().max() < 1e-10


def test_cartpole_starts_hanging_and_rewards_upright():
    from backdrive.envs import CartPoleSwingUp

    env = CartPoleSwingUp(64, dtype=torch.float64)
    obs = env.reset(seed=0)
    assert obs.shape == (64, 5)
    assert (obs[:, 1] < -0.99).all()  # cos(theta) ~ -1: hanging
    up = torch.zeros(1, 4, dtype=torch.float64)
    zero = torch.zeros(1, 1, dtype=torch.float64)
    assert env.reward(up, zero, up).item() == 1.0
    assert env.reward(up, zero, torch.tensor([[0.0, math.pi, 0.0, 0.0]], dtype=torch.float64)).item() == -1.0
    assert env.max_episode_steps == 240


def test_cartpole_gradcheck_and_track_limit():
    from backdrive.envs import CartPoleSwingUp

    env = CartPoleSwingUp(2, dtype=torch.float64, autoreset=False)
    env.reset(seed=1)
    s0 = env.state.clone()

    def f(state, force):
        env.set_state(state)
        obs, r, *_ = env.step(force)
        return obs, r

    assert torch.autograd.gradcheck(f, (s0.clone().requires_grad_(), torch.tensor([[3.0], [-2.0]], dtype=torch.float64, requires_grad=True)))
    env.reset(seed=0)
    for _ in range(60):  # push into the end of the track
        env.step(torch.full((2, 1), 10.0, dtype=torch.float64))
    assert env.state[:, 0].max() < 2.6 and torch.isfinite(env.state).all()


def test_cartpole_upright_is_stabilisable_within_the_force_limit():
    """A discrete LQR from the env's own linearisation (autograd Jacobians) balances
    perturbed upright starts with the force clipped at 10 N: the task is feasible."""
    from backdrive.envs import CartPoleSwingUp

    env = CartPoleSwingUp(16, dtype=torch.float64, autoreset=False, max_episode_steps=100)
    s0, u0 = torch.zeros(1, 4, dtype=torch.float64), torch.zeros(1, 1, dtype=torch.float64)
    A = torch.autograd.functional.jacobian(lambda s: env.transition(s, u0)[0], s0)[:, 0]
    B = torch.autograd.functional.jacobian(lambda u: env.transition(s0, u)[0], u0)[:, 0]
    assert torch.linalg.eigvals(A).abs().max() > 1.2  # upright is unstable: about x1.22 per step
    Q = torch.diag(torch.tensor([0.2, 1.0, 0.02, 0.02], dtype=torch.float64))
    R = torch.full((1, 1), 1e-4, dtype=torch.float64)
    P = Q.clone()
    for _ in range(500):
        K = torch.linalg.solve(R + B.T @ P @ B, B.T @ P @ A)
        P = Q + A.T @ P @ (A - B @ K)
    gen = torch.Generator().manual_seed(0)
    start = (torch.rand(16, 4, generator=gen, dtype=torch.float64) * 2 - 1) * torch.tensor([0.5, 0.2, 0.3, 0.3])
    env.set_state(start)
    total = torch.zeros(16, dtype=torch.float64)
    for _ in range(100):
        _, reward, *_ = env.step(-(env.state @ K.T))
        total += reward
    assert env.state[:, 1].abs().max() < 0.01 and env.state[:, 0].abs().max() < 0.05
    assert total.min() > 90.0


# ---------------------------------------------------------------------- Panda
def test_panda_reach_observation_reward_and_gradient():
    from backdrive.envs import PandaReach
    from backdrive.kinematics import forward_kinematics

    env = PandaReach(2, dtype=torch.float64)
    obs = env.reset(seed=0)
    assert obs.shape == (2, 20) and env.action_dim == 7
    target = env.state[:, 16:]
    assert (target >= torch.tensor(env.target_low, dtype=torch.float64)).all()
    assert (target <= torch.tensor(env.target_high, dtype=torch.float64)).all()
    q = env.state[:, :8]
    T = forward_kinematics(env.robot, q)[:, env.robot.frame_index(env.tcp_frame)]
    assert torch.allclose(obs[:, 14:17], T[:, :3, 3], atol=1e-12)
    assert torch.allclose(obs[:, 17:], target - T[:, :3, 3], atol=1e-12)
    # one step towards the home pose; the reward is differentiable in the action
    action = env.home[:7].expand(2, 7).clone().requires_grad_()
    _, reward, *_ = env.step(action)
    dist = (env.tcp_position(env.state[:, :8]) - env.state[:, 16:]).norm(dim=-1)
    assert torch.allclose(reward, -dist - 0.01 * env.state[:, 8:15].pow(2).sum(-1))
    reward.sum().backward()
    assert torch.isfinite(action.grad).all() and action.grad.abs().sum() > 0


def test_panda_implicit_step_matches_fine_semi_implicit_reference():
    """One 0.05 s backward-Euler step per control period follows a 2.5 ms symplectic-Euler
    reference through a large move (a little more damped) and settles at the same pose."""
    from backdrive.envs import PandaReach

    gen = torch.Generator()
    runs = {}
    for integrator, substeps in (("implicit", 1), ("semi_implicit", 20)):
        env = PandaReach(2, dtype=torch.float64, integrator=integrator, substeps=substeps, autoreset=False)
        env.reset(seed=0)
        gen.manual_seed(0)
        far = env.action_low + (env.action_high - env.action_low) * torch.rand(2, 7, generator=gen, dtype=torch.float64)
        targets = 0.5 * far + 0.5 * env.home[:7]
        states = []
        for _ in range(40):
            env.step(targets)
            states.append(env.state.clone())
        runs[integrator] = torch.stack(states)
        assert torch.isfinite(env.state).all()
    err = (runs["implicit"][..., :7] - runs["semi_implicit"][..., :7]).abs()
    assert err.max() < 0.15, err.max()  # during the move (0.09 rad measured)
    assert err[-1].max() < 0.005, err[-1].max()  # after 2 s (0.002 rad measured)
    # the arm went to the targets, not somewhere else
    assert (runs["implicit"][-1, :, :7] - targets).abs().max() < 0.01


def test_panda_gravity_compensation_holds_the_home_pose():
    from backdrive.envs import PandaReach

    for comp in (True, False):
        env = PandaReach(2, dtype=torch.float64, gravity_compensation=comp, autoreset=False)
        env.reset(seed=0)
        start = torch.cat([env.home, torch.zeros(8, dtype=torch.float64), torch.tensor([0.5, 0.0, 0.4], dtype=torch.float64)])
        env.set_state(start.expand(2, 19).clone())
        for _ in range(20):
            env.step(env.home[:7].expand(2, 7).clone())
        sag = float((env.state[:, :7] - env.home[:7]).abs().max())
        if comp:
            assert sag < 1e-9
        else:
            assert sag > 0.01  # gravity pulls the arm off a plain PD target


def test_panda_input_errors():
    from backdrive.envs import PandaReach

    with pytest.raises(InputError):
        PandaReach(1, integrator="rk4")
    with pytest.raises(InputError):
        PandaReach(1, substeps=0)
    assert PandaReach(1).max_episode_steps == 50 and PandaReach(1, integrator="semi_implicit").substeps == 50


@pytest.mark.parametrize("env_cls,name", [(envs.CartPoleSwingUp, "cartpole"), (envs.PandaReach, "panda")])
def test_env_rejects_a_robot_of_another_dtype(env_cls, name):
    from backdrive.data import load

    with pytest.raises(InputError, match="robot is torch.float64 on cpu, the env torch.float32 on cpu"):
        env_cls(2, robot=load(name, dtype=torch.float64))
