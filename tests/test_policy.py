"""Policy learning: gradients, a short run that learns, exact resume, clear errors, NaN stops."""

from __future__ import annotations

import copy
import csv
import math

import pytest
import torch
from torch.func import functional_call

from backdrive.envs import Pendulum
from backdrive.optim._policy import (
    MLPPolicy,
    PolicyConfigError,
    PolicyTrainer,
    TrainingDivergedError,
    evaluate_policy,
    load_policy,
    train_policy,
)


@pytest.fixture(autouse=True)
def _one_thread():
    # Tiny networks: one thread is fastest and keeps reductions deterministic.
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def _params(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_short_horizon_return_gradcheck_wrt_policy_parameters():
    env = Pendulum(3, dtype=torch.float64, autoreset=False)
    env.reset(seed=0)
    s0 = env.state.clone()
    torch.manual_seed(0)
    policy = MLPPolicy(3, 1, env.action_low, env.action_high, hidden=(5,), activation="tanh").double()
    names = [n for n, _ in policy.named_parameters()]
    shapes = [p.shape for _, p in policy.named_parameters()]
    flat0 = torch.cat([p.detach().reshape(-1) for p in policy.parameters()])
    # A scaled-up last layer so that the actions are not all near zero.
    flat0 = flat0 * 3.0

    def window_return(flat: torch.Tensor) -> torch.Tensor:
        params, i = {}, 0
        for n, shp in zip(names, shapes):
            k = math.prod(shp)
            params[n] = flat[i : i + k].reshape(shp)
            i += k
        env.set_state(s0)
        obs, total = env.observation(), 0.0
        for _ in range(4):
            obs, reward, *_ = env.step(functional_call(policy, params, (obs,)))
            total = total + reward
        return total

    assert torch.autograd.gradcheck(window_return, (flat0.clone().requires_grad_(),))


@pytest.mark.parametrize("algo", ["apg", "shac"])
def test_short_training_improves_return(algo):
    # Stabilising the pendulum from near upright is learnt in a few updates.
    env = Pendulum(32, x_init=1.0, y_init=1.0, max_episode_steps=64)
    eval_env = Pendulum(32, x_init=1.0, y_init=1.0, max_episode_steps=64, autoreset=False)
    untrained = PolicyTrainer(env, algo, horizon=16, lr=1e-2, seed=0)
    before = evaluate_policy(untrained.policy, eval_env, seed=7)
    trainer = train_policy(
        Pendulum(32, x_init=1.0, y_init=1.0, max_episode_steps=64),
        algo,
        updates=30,
        horizon=16,
        lr=1e-2,
        critic_lr=1e-3,
        reward_scale=0.05,
        critic_iterations=4,
        critic_minibatches=2,
        seed=0,
    )
    after = evaluate_policy(trainer.policy, eval_env, seed=7)
    # costs (negative returns) down by at least 30%, and by 50 per episode
    assert after > 0.7 * before and after > before + 50, (before, after)
    assert trainer.env_steps == 30 * 32 * 16  # every env transition counts


def test_same_seed_same_run_other_seed_other_run():
    kw = dict(updates=3, horizon=8, critic_iterations=2, critic_minibatches=2, action_noise=0.2)
    a = train_policy(Pendulum(4), "shac", seed=3, **kw)
    b = train_policy(Pendulum(4), "shac", seed=3, **kw)
    c = train_policy(Pendulum(4), "shac", seed=4, **kw)
    assert _same(_params(a.policy), _params(b.policy))
    assert _same(_params(a.critic), _params(b.critic))
    assert not _same(_params(a.policy), _params(c.policy))


@pytest.mark.parametrize("algo", ["apg", "shac"])
def test_checkpoint_resume_is_exact(tmp_path, algo):
    kw = dict(
        horizon=8,
        lr=5e-3,
        critic_iterations=2,
        critic_minibatches=2,
        critic_replay=2,
        action_noise=0.3,
        lr_decay_updates=10,
        seed=1,
    )
    # 26 steps of 8: the windows straddle the 48-step episode ends (autoreset).
    straight = train_policy(Pendulum(4, max_episode_steps=48), algo, updates=6, **kw)
    path = tmp_path / "ckpt.pt"
    train_policy(Pendulum(4, max_episode_steps=48), algo, updates=3, checkpoint=path, **kw)
    resumed = train_policy(Pendulum(4, max_episode_steps=48), algo, updates=6, resume=path, **kw)
    assert resumed.updates_done == 6 and resumed.env_steps == straight.env_steps == 6 * 4 * 8
    assert _same(_params(straight.policy), _params(resumed.policy))
    assert _same(_params(straight.critic), _params(resumed.critic))
    assert _same(_params(straight.target_critic), _params(resumed.target_critic))
    assert torch.equal(straight.env.state, resumed.env.state)
    opt_a, opt_b = straight.actor_opt.state_dict()["state"], resumed.actor_opt.state_dict()["state"]
    assert all(torch.equal(opt_a[i]["exp_avg_sq"], opt_b[i]["exp_avg_sq"]) for i in opt_a)
    assert [r["actor_loss"] for r in straight.history] == [r["actor_loss"] for r in resumed.history]


def test_checkpoint_holds_normaliser_and_loads_as_policy(tmp_path):
    path = tmp_path / "p.pt"
    trainer = train_policy(Pendulum(8), "apg", updates=2, horizon=8, checkpoint=path, seed=0)
    assert trainer.policy.normalizer.count > 0
    policy = load_policy(path)
    obs = Pendulum(5).reset(seed=2)
    with torch.no_grad():
        assert torch.equal(policy(obs), trainer.policy(obs))
    assert torch.equal(policy.normalizer.mean, trainer.policy.normalizer.mean)


def test_csv_log_progress_bar_and_evaluation(tmp_path, capsys):
    log = tmp_path / "log.csv"
    trainer = train_policy(
        Pendulum(4),
        "shac",
        updates=4,
        horizon=8,
        critic_iterations=1,
        critic_minibatches=1,
        eval_env=Pendulum(3, autoreset=False),
        eval_every=2,
        log_csv=log,
        progress=True,
        seed=0,
    )
    rows = list(csv.DictReader(open(log)))
    assert [int(r["update"]) for r in rows] == [1, 2, 3, 4]
    assert [int(r["env_steps"]) for r in rows] == [32, 64, 96, 128]
    evaluated = [r["eval_return"] != "nan" for r in rows]
    assert evaluated == [False, True, False, True]
    assert float(rows[-1]["eval_return"]) == trainer.history[-1]["eval_return"] < 0
    err = capsys.readouterr().err
    assert "4/4" in err and "return" in err and "steps 128" in err


def test_errors_before_training():
    env = Pendulum(4)
    with pytest.raises(PolicyConfigError, match="longer than the episode"):
        train_policy(env, "apg", horizon=201, updates=1)
    with pytest.raises(PolicyConfigError, match="lr must be a positive"):
        train_policy(env, "shac", lr=0.0, updates=1)
    with pytest.raises(PolicyConfigError, match="critic_lr must be a positive"):
        train_policy(env, "shac", critic_lr=-1e-3, updates=1)
    with pytest.raises(PolicyConfigError, match="unknown algo 'ppo'; valid: 'apg', 'shac'"):
        train_policy(env, "ppo", updates=1)
    with pytest.raises(PolicyConfigError, match="gamma"):
        train_policy(env, "shac", gamma=1.5, updates=1)
    wrong = MLPPolicy(5, 1, env.action_low, env.action_high)
    with pytest.raises(PolicyConfigError, match="size 5.*gives size 3"):
        train_policy(env, "apg", policy=wrong, updates=1, horizon=8)
    bare = torch.nn.Linear(4, 1)  # no obs_dim attribute: found by a trial forward pass
    with pytest.raises(PolicyConfigError, match="observations of size 3"):
        train_policy(env, "apg", policy=bare, updates=1, horizon=8)
    with pytest.raises(PolicyConfigError, match="eval_env has obs size"):
        from backdrive.envs import CartPoleSwingUp

        train_policy(env, "apg", eval_env=CartPoleSwingUp(1), updates=1, horizon=8)


def test_resume_with_other_settings_is_an_error(tmp_path):
    path = tmp_path / "c.pt"
    train_policy(Pendulum(4), "apg", updates=1, horizon=8, checkpoint=path)
    with pytest.raises(PolicyConfigError, match="horizon: checkpoint 8 vs now 16"):
        train_policy(Pendulum(4), "apg", updates=2, horizon=16, resume=path)


class _PoisonedPendulum(Pendulum):
    """Returns a NaN reward from the given transition on."""

    def __init__(self, *args, poison_at: int, **kwargs):
        super().__init__(*args, **kwargs)
        self.poison_at = poison_at
        self.calls = 0

    def reward(self, state, action, next_state):
        self.calls += 1
        r = super().reward(state, action, next_state)
        return r * math.nan if self.calls >= self.poison_at else r


@pytest.mark.parametrize("algo", ["apg", "shac"])
def test_nan_gradient_stops_naming_the_update_and_keeps_last_checkpoint(tmp_path, algo):
    path = tmp_path / "ckpt.pt"
    env = _PoisonedPendulum(4, poison_at=3 * 8 + 5)  # inside update 4 (8 steps per update)
    trainer = PolicyTrainer(env, algo, horizon=8, critic_iterations=1, critic_minibatches=1, seed=0)
    with pytest.raises(TrainingDivergedError, match="update 4") as info:
        trainer.train(10, checkpoint=path, checkpoint_every=1)
    assert info.value.update == 4 and info.value.checkpoint == str(path)
    assert "update 3" in str(info.value)
    # the parameters were not touched by the bad gradient, the checkpoint is update 3
    assert all(torch.isfinite(p).all() for p in trainer.policy.parameters())
    assert torch.load(path, weights_only=True)["updates_done"] == 3
    assert _same(_params(load_policy(path)), _params(trainer.policy))


# ------------------------------------------------- settings, replay, step counts
def test_config_dataclass_and_keywords_give_the_same_run():
    from dataclasses import FrozenInstanceError

    from backdrive.optim import PolicyTrainerConfig

    cfg = PolicyTrainerConfig(horizon=8, critic_iterations=2, critic_minibatches=2, action_noise=0.2, seed=3)
    a = train_policy(Pendulum(4), updates=3, config=cfg)
    b = train_policy(Pendulum(4), "shac", updates=3, horizon=8, critic_iterations=2, critic_minibatches=2,
                     action_noise=0.2, seed=3)
    assert a.settings == b.settings == cfg
    assert _same(_params(a.policy), _params(b.policy))
    # keywords override the config's fields; the config itself is frozen
    c = PolicyTrainer(Pendulum(4), config=cfg, horizon=4, hidden=[16, 16])
    assert c.settings.horizon == 4 and c.settings.hidden == (16, 16) and c.settings.seed == 3
    assert cfg.horizon == 8
    with pytest.raises(FrozenInstanceError):
        cfg.horizon = 4
    with pytest.raises(TypeError, match="unknown training setting.*'horizn'"):
        train_policy(Pendulum(4), updates=1, horizn=8)


def test_new_settings_are_checked_before_training():
    env = Pendulum(4)
    with pytest.raises(PolicyConfigError, match="actor_replay_steps needs a critic"):
        train_policy(env, "apg", updates=1, horizon=8, actor_replay_steps=4)
    with pytest.raises(PolicyConfigError, match="critic_batch_size must be a positive int"):
        train_policy(env, "shac", updates=1, horizon=8, critic_batch_size=0)
    with pytest.raises(PolicyConfigError, match="actor_replay_steps must be a non-negative int"):
        train_policy(env, "shac", updates=1, horizon=8, actor_replay_steps=-1)
    with pytest.raises(PolicyConfigError, match="actor_batch_size must be a positive int"):
        train_policy(env, "shac", updates=1, horizon=8, actor_replay_steps=1, actor_batch_size=0)


class _CountingPendulum(Pendulum):
    """Counts every transition computed by the simulator (rows of ``transition``)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.transitions = 0

    def transition(self, state, action):
        self.transitions += state.reshape(-1, self.state_dim).shape[0]
        return super().transition(state, action)


def test_env_steps_count_every_simulator_transition_and_replay_takes_none():
    env = _CountingPendulum(4, y_init=8.0, max_episode_steps=8)
    trainer = train_policy(env, "shac", updates=5, horizon=8, critic_iterations=4, critic_batch_size=32,
                           critic_replay=100, actor_replay_steps=4, actor_batch_size=32, seed=0)
    # 5 windows of 4 envs x 8 steps: the replayed critic and actor steps reuse
    # stored transitions (and their Jacobians) without calling the simulator.
    assert env.transitions == trainer.env_steps == 5 * 4 * 8
    assert len(trainer._replay) == 5


def test_replayed_windows_feed_the_critic():
    # critic_replay = 3: the critic's minibatches are drawn from the last 3
    # windows, not only the newest (recorded by wrapping the critic's forward).
    trainer = PolicyTrainer(Pendulum(4), "shac", horizon=8, critic_iterations=20, critic_batch_size=16,
                            critic_replay=3, seed=0)
    for _ in range(5):
        trainer.update()
    assert len(trainer._replay) == 3
    norm = copy.deepcopy(trainer.policy.normalizer)  # the statistics the fit will use
    seen = []
    forward = trainer.critic.forward

    def spy(x):
        seen.append(x.detach().clone())
        return forward(x)

    trainer.critic.forward = spy
    trainer.update()
    assert len(trainer._replay) == 3 and trainer.env_steps == 6 * 4 * 8
    samples = torch.cat([norm(w["obs"]).reshape(-1, 3) for w in trainer._replay])  # (96, 3), oldest first
    drawn = torch.cat(seen)
    assert drawn.shape == (20 * 16, 3)
    # each drawn sample is one of the replayed ones; 320 draws from 96 samples
    # miss a whole window with probability about 3 * (2/3)**320
    dist, which = (drawn[:, None] - samples[None]).abs().amax(-1).min(dim=1)
    assert float(dist.max()) < 1e-6
    assert set((which // 32).tolist()) == {0, 1, 2}


def test_action_jacobians_match_the_simulator():
    # The Jacobians read off the window's graph equal the derivative of one
    # env step at the stored state and action (float64, autograd.functional).
    env = Pendulum(3, y_init=8.0, max_episode_steps=8, dtype=torch.float64)
    trainer = PolicyTrainer(env, "shac", horizon=4, actor_replay_steps=1, action_noise=0.5, reward_scale=0.1, seed=0)
    states = []
    step = env.step

    def recording_step(action):
        states.append(env.state.detach().clone())
        return step(action)

    env.step = recording_step
    roll = trainer._rollout()
    jac_obs, jac_reward = trainer._action_jacobians(roll)
    assert jac_obs.shape == (4, 3, 3, 1) and jac_reward.shape == (4, 3, 1)
    for t in range(4):
        s, a = states[t], roll["action"][t]
        f_obs = lambda u: env.observe(env.transition(s, u))  # noqa: E731
        f_rew = lambda u: env.reward(s, u, env.transition(s, u)) * 0.1  # noqa: E731
        j_obs = torch.autograd.functional.jacobian(f_obs, a)  # (3, 3, 3, 1)
        j_rew = torch.autograd.functional.jacobian(f_rew, a)  # (3, 3, 1)
        for i in range(3):
            assert torch.allclose(jac_obs[t, i], j_obs[i, :, i], atol=1e-12)
            assert torch.allclose(jac_reward[t, i], j_rew[i, i], atol=1e-12)
    # the stored actions are in the box, the speed row is 3 dt / (m l^2)
    assert float(roll["action"].abs().max()) <= 2.0
    assert torch.allclose(jac_obs[..., 2, 0][roll["action"][..., 0].abs() < 2], torch.tensor(0.15, dtype=torch.float64))


def test_replayed_actor_steps_resume_exactly(tmp_path):
    kw = dict(horizon=8, lr=5e-3, critic_iterations=3, critic_batch_size=16, critic_replay=50,
              actor_replay_steps=3, actor_batch_size=16, action_noise=0.3, reward_scale=0.02, seed=2)
    straight = train_policy(Pendulum(4, y_init=8.0, max_episode_steps=8), "shac", updates=6, **kw)
    path = tmp_path / "r.pt"
    train_policy(Pendulum(4, y_init=8.0, max_episode_steps=8), "shac", updates=3, checkpoint=path, **kw)
    resumed = train_policy(Pendulum(4, y_init=8.0, max_episode_steps=8), "shac", updates=6, resume=path, **kw)
    assert _same(_params(straight.policy), _params(resumed.policy))
    assert _same(_params(straight.critic), _params(resumed.critic))


def test_checkpoint_from_before_the_new_settings_still_resumes(tmp_path):
    # A checkpoint written before critic_batch_size / actor_replay_steps /
    # actor_batch_size existed had them at their defaults.
    path = tmp_path / "old.pt"
    kw = dict(horizon=8, critic_iterations=1, critic_minibatches=1, seed=0)
    train_policy(Pendulum(4), "shac", updates=2, checkpoint=path, **kw)
    ckpt = torch.load(path, weights_only=True)
    for key in ("critic_batch_size", "actor_replay_steps", "actor_batch_size"):
        del ckpt["config"][key]
    torch.save(ckpt, path)
    assert train_policy(Pendulum(4), "shac", updates=3, resume=path, **kw).updates_done == 3
    with pytest.raises(PolicyConfigError, match="actor_replay_steps: checkpoint 0 vs now 2"):
        train_policy(Pendulum(4), "shac", updates=3, resume=path, actor_replay_steps=2, **kw)


def test_pendulum_preset_swings_up_within_1024_env_steps():
    # PENDULUM_SHAC, 16 of its updates (1,024 env steps), evaluated from
    # gymnasium's start distribution (16 episodes of 200 steps).
    from backdrive.optim import PENDULUM_SHAC

    trainer = train_policy(PENDULUM_SHAC.make_env(), preset=PENDULUM_SHAC, updates=16, seed=0)
    assert trainer.config == PENDULUM_SHAC.config
    assert trainer.env_steps == 1024
    ret = evaluate_policy(trainer.policy, Pendulum(16, autoreset=False), seed=123)
    assert ret > -250, ret


def test_cartpole_preset_settings_are_accepted_and_count_steps():
    # CARTPOLE_SHAC drives the cart-pole example and benchmark; two of its
    # updates run, with every setting accepted, and count num_envs * horizon
    # steps per update.
    from backdrive.envs import CartPoleSwingUp
    from backdrive.optim import CARTPOLE_SHAC

    trainer = train_policy(CARTPOLE_SHAC.make_env(), preset=CARTPOLE_SHAC, updates=2, seed=0, num_threads=1)
    assert isinstance(trainer.env, CartPoleSwingUp) and trainer.config == CARTPOLE_SHAC.config
    assert trainer.updates_done == 2
    assert trainer.env_steps == 2 * CARTPOLE_SHAC.env_kwargs["num_envs"] * CARTPOLE_SHAC.config.horizon
    assert all(math.isfinite(p.detach().abs().sum().item()) for p in trainer.policy.parameters())


# ------------------------------------------- old checkpoints, unsafe checkpoints
DATA = __import__("pathlib").Path(__file__).parent / "data" / "policy"


def test_checkpoint_of_the_single_module_trainer_loads_and_resumes_to_float32_rounding():
    # shac_v1.pt was written by optim/_policy.py before it became a package
    # (tests/data/policy/README.md); the expected values come from that code.
    expected = torch.load(DATA / "shac_v1_expected.pt", weights_only=True)
    policy = load_policy(DATA / "shac_v1.pt")
    # The expected values were written on another CPU: float32 matrix products
    # may round differently across instruction sets, so compare to float32
    # rounding here (exact resume on one machine: test_checkpoint_resume_is_exact).
    with torch.no_grad():
        torch.testing.assert_close(policy(expected["obs"]), expected["actions"], rtol=1e-6, atol=1e-6)
    # resume without repeating the settings: the checkpoint's are used
    trainer = train_policy(Pendulum(2, max_episode_steps=16), updates=4, resume=DATA / "shac_v1.pt")
    assert trainer.config.hidden == (8,) and trainer.config.seed == 5 and trainer.updates_done == 4
    got, want = _params(trainer.policy), expected["policy_after_4"]
    assert got.keys() == want.keys()
    for k in got:
        torch.testing.assert_close(got[k], want[k], rtol=1e-5, atol=1e-6)
    # given settings must still match the checkpoint's
    with pytest.raises(PolicyConfigError, match="horizon: checkpoint 4 vs now 8"):
        train_policy(Pendulum(2, max_episode_steps=16), updates=4, resume=DATA / "shac_v1.pt", horizon=8,
                     hidden=(8,), critic_iterations=1, critic_minibatches=1, action_noise=0.1, seed=5)


class _Payload:
    """Unpickling this creates ``path`` (``open(path, "w")``): stands for any code in a pickle."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_checkpoint_with_a_pickled_payload_is_refused_without_running_it(tmp_path):
    # A real checkpoint with one object added that would run code when unpickled.
    good = tmp_path / "good.pt"
    train_policy(Pendulum(2), "apg", updates=1, horizon=4, hidden=(4,), checkpoint=good)
    ckpt = torch.load(good, weights_only=True)
    marker = tmp_path / "payload_ran"
    ckpt["history"].append({"note": _Payload(marker)})
    bad = tmp_path / "bad.pt"
    torch.save(ckpt, bad)
    # the payload is live: an unsafe load runs it (on a copy pointed elsewhere)
    probe = tmp_path / "probe_ran"
    torch.save({"x": _Payload(probe)}, tmp_path / "probe.pt")
    torch.load(tmp_path / "probe.pt", weights_only=False)
    assert probe.exists()

    with pytest.raises(PolicyConfigError, match=r"refusing to load .*pickled Python objects \(.*open\).*weights_only"):
        load_policy(bad)
    assert not marker.exists()
    with pytest.raises(PolicyConfigError, match="refusing to load"):
        train_policy(Pendulum(2), "apg", updates=2, horizon=4, hidden=(4,), resume=bad)
    with pytest.raises(PolicyConfigError, match="refusing to load"):
        train_policy(Pendulum(2), updates=2, resume=bad)  # settings read from the file: refused too
    assert not marker.exists()


def test_files_that_are_not_checkpoints_get_a_reason(tmp_path):
    text = tmp_path / "notes.pt"
    text.write_text("not a checkpoint")
    with pytest.raises(PolicyConfigError, match="not a checkpoint torch can read safely|not a torch checkpoint"):
        load_policy(text)
    other = tmp_path / "weights.pt"
    torch.save({"weight": torch.ones(2)}, other)
    with pytest.raises(PolicyConfigError, match="not a backdrive policy checkpoint"):
        load_policy(other)


# ----------------------------------------------------------- config and presets
def test_config_is_validated_when_built():
    from backdrive.optim import PolicyTrainerConfig

    bad = {
        "algo": ("ppo", "unknown algo 'ppo'; valid: 'apg', 'shac'"),
        "horizon": (0, "horizon must be a positive int"),
        "lr": (float("nan"), "lr must be a positive finite number"),
        "gamma": (0.0, r"gamma must be in \(0, 1\]"),
        "lam": (1.5, r"lam must be in \[0, 1\]"),
        "hidden": ((64, 0), "hidden must be a sequence of positive ints"),
        "activation": ("gelu", "unknown activation 'gelu'; valid: 'elu'"),
        "betas": ((0.9,), "betas must be two numbers"),
        "squash": ("sigmoid", "unknown squash"),
        "critic_replay": (True, "critic_replay must be a positive int"),
        "normalize_obs": (1, "normalize_obs must be a bool"),
        "seed": (-1, "seed must be a non-negative int"),
    }
    for name, (value, message) in bad.items():
        with pytest.raises(PolicyConfigError, match=message):
            PolicyTrainerConfig(**{name: value})
    with pytest.raises(PolicyConfigError, match="actor_replay_steps needs a critic"):
        PolicyTrainerConfig(algo="apg", actor_replay_steps=1)
    cfg = PolicyTrainerConfig(horizon=8, hidden=[16])
    assert cfg.hidden == (16,) and hash(cfg) == hash(PolicyTrainerConfig(horizon=8, hidden=(16,)))
    assert cfg.replace(lr=1e-3).lr == 1e-3 and cfg.lr == 2e-3
    with pytest.raises(PolicyConfigError, match="lr must be"):
        cfg.replace(lr=-1.0)
    with pytest.raises(TypeError, match="unknown training setting.*'horizn'.*valid: algo, horizon"):
        cfg.replace(horizn=4)
    assert PolicyTrainerConfig.from_dict(cfg.to_dict()) == cfg


def test_default_settings_are_refused_and_name_the_preset():
    # train_policy(Pendulum(), "shac") with the generic defaults ran 453 s and
    # scored -1365 in Pendulum-v1; now it stops at once and names the preset.
    from backdrive.envs import CartPoleSwingUp
    from backdrive.optim import PolicyTrainerConfig

    env = _CountingPendulum()
    with pytest.raises(PolicyConfigError, match=r"no training settings.*PENDULUM_SHAC.*make_env\(\)") as info:
        train_policy(env, "shac")
    assert "preset=PENDULUM_SHAC" in str(info.value) and "config=PolicyTrainerConfig()" in str(info.value)
    with pytest.raises(PolicyConfigError, match="PENDULUM_APG"):
        train_policy(env, "apg", updates=5, seed=3)  # a seed alone does not choose settings
    with pytest.raises(PolicyConfigError, match="CARTPOLE_SHAC"):
        train_policy(CartPoleSwingUp(1), "shac")
    assert env.transitions == 0  # refused before any step
    # saying which settings is enough, the generic ones included
    trainer = train_policy(Pendulum(2), config=PolicyTrainerConfig(horizon=4), updates=1)
    assert trainer.env_steps == 8


def test_preset_objects_run_warn_on_another_env_and_keep_the_old_dicts_for_a_while():
    from backdrive.optim import PENDULUM_SHAC, PRESETS, Preset

    assert isinstance(PENDULUM_SHAC, Preset) and PRESETS["pendulum_shac"] is PENDULUM_SHAC
    assert PENDULUM_SHAC.env_steps == 2560 and PENDULUM_SHAC.updates == 40
    with pytest.raises(TypeError):
        PENDULUM_SHAC.env_kwargs["num_envs"] = 1  # read-only
    env = PENDULUM_SHAC.make_env()
    assert (env.num_envs, env.y_init, env.max_episode_steps) == (8, 8.0, 8) and PENDULUM_SHAC.mismatches(env) == []
    # the preset's run length by default: stop after one update through the callback
    rows = []
    trainer = train_policy(env, preset="pendulum_shac", critic_iterations=2, actor_replay_steps=2,
                           callback=lambda row: rows.append(row) or True)
    assert trainer.config == PENDULUM_SHAC.config.replace(critic_iterations=2, actor_replay_steps=2)
    assert trainer.updates_done == 1 and len(rows) == 1
    # the trap in another form: the preset's settings on a default env
    with pytest.warns(UserWarning, match=r"num_envs=1 \(preset: 8\).*make_env\(\)"):
        train_policy(Pendulum(), preset=PENDULUM_SHAC, updates=1, critic_iterations=1, actor_replay_steps=1)
    with pytest.raises(PolicyConfigError, match="unknown preset 'pendulum'; valid: 'pendulum_shac'"):
        train_policy(env, preset="pendulum")
    with pytest.raises(PolicyConfigError, match="for a Preset use preset='pendulum_shac'"):
        train_policy(env, config=PENDULUM_SHAC)
    with pytest.raises(PolicyConfigError, match="preset or config, not both"):
        train_policy(env, preset=PENDULUM_SHAC, config=PENDULUM_SHAC.config)
    # the dicts presets used to be, with a DeprecationWarning
    with pytest.warns(DeprecationWarning, match=r"PENDULUM_SHAC\['train'\] is deprecated"):
        train = dict(PENDULUM_SHAC["train"])
    with pytest.warns(DeprecationWarning):
        assert PENDULUM_SHAC["env"] == {"num_envs": 8, "y_init": 8.0, "max_episode_steps": 8}
    assert train["updates"] == 40 and train["horizon"] == 8 and train["actor_replay_steps"] == 32
    assert "algo" not in train
    old_style = PolicyTrainer(PENDULUM_SHAC.make_env(), "shac", **{k: v for k, v in train.items() if k != "updates"})
    assert old_style.config == PENDULUM_SHAC.config


def test_every_preset_builds_its_env_and_its_settings_fit_it():
    from backdrive.optim import PRESETS

    for preset in PRESETS.values():
        env = preset.make_env(num_envs=2)
        preset.config.check_env(env)
        assert preset.mismatches(env) == [f"num_envs=2 (preset: {preset.env_kwargs['num_envs']})"]


def test_td_lambda_and_window_objective_in_closed_form():
    from backdrive.optim._policy.returns import segment_discounts, td_lambda, window_objective

    g = 0.9
    r = torch.tensor([[1.0], [2.0], [3.0]], dtype=torch.float64)
    v = torch.tensor([[10.0], [20.0], [30.0]], dtype=torch.float64)
    no_end = torch.zeros(3, 1, dtype=torch.bool)
    # lambda = 1: the discounted rewards to the window end plus its discounted value
    full = td_lambda(r, v, no_end, g, 1.0)
    assert torch.allclose(full[0], r[0] + g * r[1] + g**2 * r[2] + g**3 * v[2])
    # lambda = 0: one-step targets
    assert torch.allclose(td_lambda(r, v, no_end, g, 0.0), r + g * v)
    # an episode end at step 0 cuts the bootstrapping there
    ended = torch.tensor([[True], [False], [False]])
    assert torch.allclose(td_lambda(r, v, ended, g, 1.0)[0], r[0] + g * v[0])
    # discounts restart after the end; the value enters at segment ends only
    disc = segment_discounts(ended, g, torch.float64)[:, 0]
    assert torch.allclose(disc, torch.tensor([1.0, 1.0, g], dtype=torch.float64))
    j = window_objective(r, ended, g, v).sum()
    assert torch.allclose(j, (r[0] + g * v[0]) + (r[1] + g * r[2] + g**2 * v[2]))
    assert torch.allclose(window_objective(r, ended, g).sum(), r[0] + r[1] + g * r[2])


def test_max_action_change_scales_the_step_back():
    # A large step on the pendulum: uncapped it moves the actions by more than the cap; capped, the
    # same first update moves them by at most the cap, along the same parameter direction.
    kw = dict(horizon=8, lr=0.05, action_noise=0.0, seed=3)
    env = Pendulum(8)
    start = train_policy(Pendulum(8), "shac", updates=0, **kw)
    free = train_policy(Pendulum(8), "shac", updates=1, **kw)
    capped = train_policy(env, "shac", updates=1, max_action_change=0.02, **kw)
    obs = capped._replay[-1]["obs"].reshape(-1, env.obs_dim)
    half = (env.action_high - env.action_low) / 2
    with torch.no_grad():
        # The cap is measured before the window's observations enter the statistics: compare the three
        # policies at the statistics they had then (the untrained one's).
        for t in (free, capped):
            t.policy.normalizer.load_state_dict(start.policy.normalizer.state_dict())

        def rms(a, b):
            return float(((a.policy(obs) - b.policy(obs)) / half).pow(2).mean().sqrt())

        assert rms(free, start) > 0.05
        assert rms(capped, start) == pytest.approx(capped.history[0]["action_change"], rel=1e-5)
        assert 0.015 < capped.history[0]["action_change"] <= 0.02 * (1 + 1e-6)
        s0 = torch.cat([p.flatten() for p in start.policy.parameters()])
        d_free = torch.cat([p.flatten() for p in free.policy.parameters()]) - s0
        d_cap = torch.cat([p.flatten() for p in capped.policy.parameters()]) - s0
    scale = float(d_cap @ d_free / (d_free @ d_free))
    assert 0.0 < scale < 0.5
    assert torch.allclose(d_cap, scale * d_free, atol=1e-6)
    assert math.isnan(free.history[0]["action_change"])  # off: not measured


def test_max_action_change_above_every_step_changes_nothing():
    kw = dict(horizon=8, lr=1e-3, seed=2, action_noise=0.2)
    a = train_policy(Pendulum(4), "shac", updates=3, **kw)
    b = train_policy(Pendulum(4), "shac", updates=3, max_action_change=10.0, **kw)
    assert _same(_params(a.policy), _params(b.policy)) and _same(_params(a.critic), _params(b.critic))
    assert all(0.0 < r["action_change"] < 10.0 for r in b.history)


@pytest.mark.parametrize("bad", [0.0, -0.1, float("nan"), True, "0.1"])
def test_max_action_change_must_be_positive(bad):
    with pytest.raises(PolicyConfigError, match="max_action_change"):
        train_policy(Pendulum(2), "shac", updates=1, horizon=4, max_action_change=bad)


def test_action_change_memory_caps_the_step_on_past_observations_too():
    # Pendulum, a large lr: every step hits the cap. With a memory of 64 past observations the step is
    # scaled back until the RMS action change is within the cap on the window AND on the memory.
    kw = dict(horizon=8, lr=0.05, seed=4, max_action_change=0.02, critic_replay=100)
    t = train_policy(Pendulum(8), "shac", updates=3, action_change_memory=64, **kw)
    assert t._memory.shape == (64, t.env.obs_dim) and t._memory_seen == 3 * 8 * 8
    # every remembered observation is one of the windows' (all kept: critic_replay=100)
    seen = torch.cat([w["obs"].reshape(-1, t.env.obs_dim) for w in t._replay])
    assert all(bool((seen == m).all(1).any()) for m in t._memory)
    before, memory = copy.deepcopy(t.policy), t._memory.clone()
    t.train(4)
    window = t._replay[-1]["obs"].reshape(-1, t.env.obs_dim)
    half = (t.env.action_high - t.env.action_low) / 2
    after = copy.deepcopy(t.policy)
    # the cap is measured before this window enters the observation statistics
    after.normalizer.load_state_dict(before.normalizer.state_dict())
    with torch.no_grad():
        rms = [float(((after(x) - before(x)) / half).pow(2).mean().sqrt()) for x in (window, memory)]
    assert max(rms) <= 0.02 * (1 + 1e-6) and max(rms) == pytest.approx(t.history[-1]["action_change"], rel=1e-5)
    # the same run without the memory takes other steps (the memory's change was the larger one here)
    plain = train_policy(Pendulum(8), "shac", updates=4, **kw)
    assert not _same(_params(plain.policy), _params(t.policy))


def test_action_change_memory_is_a_uniform_sample_and_resumes_exactly(tmp_path):
    t = train_policy(Pendulum(2), "shac", updates=0, horizon=4, max_action_change=0.1, action_change_memory=500, seed=0)
    # offer 20,000 numbered observations in batches of 256: a reservoir keeps each with probability 500 / 20,000
    n = 20_000
    marks = torch.arange(n, dtype=t.env.dtype)[:, None].expand(n, t.env.obs_dim)
    for i in range(0, n, 256):
        t._remember(marks[i : i + 256])
    kept = t._memory[:, 0]
    assert t._memory_seen == n and len(set(kept.tolist())) == 500
    # uniform over [0, n): mean n/2 (sd of the mean about n / sqrt(12 * 500) = 258), a quarter in each quarter
    assert abs(float(kept.mean()) - n / 2) < 1000
    counts = torch.histc(kept, bins=4, min=0, max=n)
    assert bool((counts > 90).all()) and bool((counts < 160).all())
    kw = dict(horizon=8, lr=0.05, seed=1, max_action_change=0.02, action_change_memory=40, max_episode_steps=48)
    env_kw = {k: kw.pop(k) for k in ("max_episode_steps",)}
    straight = train_policy(Pendulum(4, **env_kw), "shac", updates=6, **kw)
    path = tmp_path / "ckpt.pt"
    train_policy(Pendulum(4, **env_kw), "shac", updates=3, checkpoint=path, **kw)
    resumed = train_policy(Pendulum(4, **env_kw), "shac", updates=6, resume=path, **kw)
    assert torch.equal(straight._memory, resumed._memory) and straight._memory_seen == resumed._memory_seen
    assert _same(_params(straight.policy), _params(resumed.policy))


@pytest.mark.parametrize(
    "settings, match",
    [
        ({"action_change_memory": -1, "max_action_change": 0.1}, "action_change_memory must be a non-negative int"),
        ({"action_change_memory": 1.5, "max_action_change": 0.1}, "action_change_memory must be a non-negative int"),
        ({"action_change_memory": 64}, "action_change_memory needs max_action_change"),
    ],
)
def test_action_change_memory_is_checked(settings, match):
    with pytest.raises(PolicyConfigError, match=match):
        train_policy(Pendulum(2), "shac", updates=1, horizon=4, **settings)


def test_random_episode_start_staggers_the_truncations():
    # Pendulum episodes of 48 steps, 4-step windows: without it every copy truncates at step 48 together
    # (update 12); with it the step counters start spread over [0, 48), the state is the usual initial one.
    kw = dict(horizon=4, lr=1e-3, seed=5)
    plain = train_policy(Pendulum(16, max_episode_steps=48), "shac", updates=0, **kw)
    assert int(plain.env.elapsed.max()) == 0
    spread = train_policy(Pendulum(16, max_episode_steps=48), "shac", updates=0, random_episode_start=True, **kw)
    e = spread.env.elapsed
    assert int(e.min()) >= 0 and int(e.max()) < 48 and len(set(e.tolist())) > 8
    assert torch.equal(spread.env.state, plain.env.state)
    again = train_policy(Pendulum(16, max_episode_steps=48), "shac", updates=0, random_episode_start=True, **kw)
    assert torch.equal(again.env.elapsed, e)  # seeded
    spread.train(3)
    plain.train(3)
    # Episodes already ended by update 3 (a training return is logged), none of the plain run's.
    assert math.isnan(plain.history[-1]["train_return"]) and not math.isnan(spread.history[-1]["train_return"])
    with pytest.raises(PolicyConfigError, match="random_episode_start must be a bool"):
        train_policy(Pendulum(2), "shac", updates=1, horizon=4, random_episode_start=1)


def test_keep_best_puts_back_the_best_evaluated_policy():
    # Scripted evaluations (updates 2, 4, 6): the second is the best, so its policy is the one returned.
    scores, seen = iter([1.0, 5.0, 3.0]), []

    def eval_fn(policy):
        seen.append(_params(policy))
        return next(scores)

    trainer = train_policy(Pendulum(4), "shac", updates=6, horizon=4, seed=1, eval_fn=eval_fn, eval_every=2,
                           keep_best=True)
    assert trainer.best == {"update": 4, "eval_return": 5.0} and trainer.updates_done == 6
    assert _same(_params(trainer.policy), seen[1]) and not _same(seen[1], seen[2])
    plain = train_policy(Pendulum(4), "shac", updates=6, horizon=4, seed=1, eval_fn=lambda p: 0.0, eval_every=2)
    assert plain.best is None and _same(_params(plain.policy), seen[2])  # without it: the last policy
    with pytest.raises(PolicyConfigError, match="keep_best needs an evaluation"):
        train_policy(Pendulum(2), "shac", updates=1, horizon=4, keep_best=True)
    with pytest.raises(PolicyConfigError, match="keep_best must be a bool"):
        train_policy(Pendulum(2), "shac", updates=1, horizon=4, eval_fn=lambda p: 0.0, keep_best="yes")


def test_provenance_names_the_source_torch_and_kernels(tmp_path, monkeypatch):
    # What a trained policy records about where it was made (examples/quadruped_walk.py --ship).
    import re
    import subprocess

    from backdrive.optim._policy import checkpoints

    p = checkpoints.provenance()
    assert set(p) == {"git_commit", "src_modified", "torch", "cpu_capability", "machine", "threads"}
    # It goes into policy files, which are read with weights_only=True: plain types only.
    checkpoints.write_checkpoint({"format": checkpoints.FORMAT, "provenance": p}, tmp_path / "p.pt")
    assert checkpoints.read_checkpoint(tmp_path / "p.pt")["provenance"] == p
    assert type(p["torch"]) is str
    assert p["torch"] == torch.__version__ and p["threads"] == torch.get_num_threads()
    assert p["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    root = checkpoints.Path(checkpoints.__file__).resolve().parents[4]
    if (root / ".git").exists():  # run from a checkout (the test suite is): the commit git reports
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True).stdout.strip()
        assert re.fullmatch("[0-9a-f]{40}", p["git_commit"]) and p["git_commit"] == head
        assert isinstance(p["src_modified"], bool)
    # Not from a checkout (an installed package): no commit is claimed.
    monkeypatch.setattr(checkpoints, "__file__", str(tmp_path / "a" / "b" / "c" / "d" / "checkpoints.py"))
    p = checkpoints.provenance()
    assert p["git_commit"] is None and p["src_modified"] is None
