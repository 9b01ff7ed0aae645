"""``sb3_vec_env``: a Stable-Baselines3 VecEnv over a batched backdrive env."""

import numpy as np
import pytest
import torch

pytest.importorskip("stable_baselines3")

from backdrive._errors import InputError  # noqa: E402
from backdrive.envs import Pendulum  # noqa: E402
from backdrive.envs import to_sb3_vec_env as sb3_vec_env  # noqa: E402


def test_steps_every_copy_like_the_backdrive_env():
    venv = sb3_vec_env(Pendulum(3, dtype=torch.float64))
    venv.seed(7)
    obs = venv.reset()
    assert obs.shape == (3, 3) and obs.dtype == np.float32 and venv.num_envs == 3
    ref = Pendulum(3, dtype=torch.float64, autoreset=False)
    ref.set_state(venv.genv.env.state.clone())
    rng = np.random.default_rng(0)
    for _ in range(10):
        a = rng.uniform(-2, 2, size=(3, 1)).astype(np.float32)
        obs, reward, done, infos = venv.step(a)
        r_obs, r_reward, *_ = ref.step(torch.as_tensor(a, dtype=torch.float64))
        np.testing.assert_allclose(obs, r_obs.numpy(), rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(reward, r_reward.numpy(), rtol=1e-6, atol=1e-6)
        assert reward.dtype == np.float32 and not done.any() and infos == [{}, {}, {}]


def test_seed_then_reset_is_reproducible():
    venv = sb3_vec_env(Pendulum(4))
    venv.seed(3)
    a = venv.reset()
    venv.seed(3)
    b = venv.reset()
    c = venv.reset()  # no seed: a fresh draw
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a, c)


def test_time_limit_gives_terminal_observation_and_same_step_reset():
    venv = sb3_vec_env(Pendulum(2, max_episode_steps=5))
    venv.seed(0)
    venv.reset()
    for t in range(5):
        obs, reward, done, infos = venv.step(np.ones((2, 1), dtype=np.float32))
        assert done.all() == (t == 4)
    for i in range(2):
        last = infos[i]["terminal_observation"]
        assert last.shape == (3,) and infos[i]["TimeLimit.truncated"] is True
        assert not np.allclose(last, obs[i])  # obs is the restarted episode's first
    obs2, *_ = venv.step(np.ones((2, 1), dtype=np.float32))
    assert not np.allclose(obs2, obs)


def test_ppo_learns_through_it_and_errors():
    from stable_baselines3 import PPO
    from stable_baselines3.common.logger import Logger
    from stable_baselines3.common.vec_env import VecNormalize

    venv = VecNormalize(sb3_vec_env(Pendulum(4)))
    assert venv.get_attr("num_envs") == [4] * 4 and venv.env_is_wrapped(object) == [False] * 4
    model = PPO("MlpPolicy", venv, n_steps=8, batch_size=16, n_epochs=1, seed=0, device="cpu")
    model.set_logger(Logger(folder=None, output_formats=[]))  # SB3's default makes an empty folder in /tmp
    model.learn(64)
    assert model.num_timesteps == 64
    with pytest.raises(InputError, match="autoreset"):
        sb3_vec_env(Pendulum(2, autoreset=False))
    with pytest.raises(InputError, match="DiffEnv"):
        sb3_vec_env("pendulum")
