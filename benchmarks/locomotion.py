"""Quadruped walking through contact: SHAC through backdrive against SB3 PPO, same wall-clock budget.

Both learn ``backdrive.envs.QuadrupedWalk`` built as ``QUADRUPED_WALK_SHAC``
says (the shipped 12.4 kg quadruped, 50 Hz PD targets, 4 x 5 ms contact
substeps, a 3 Hz trot generator, forward commands in [0.2, 0.8] m/s):

* SHAC: ``train_policy(preset=QUADRUPED_WALK_SHAC)``, stopped when its
  training wall time reaches the budget;
* SB3 PPO through ``to_gymnasium(vector=True)`` behind an SB3 ``VecEnv``
  (``backdrive.envs.to_sb3_vec_env``: one torch call steps every
  copy) with ``VecMonitor`` and ``VecNormalize``, the same env keywords and
  the settings of ``PPO_CONFIGS`` (default ``tuned``: 256 copies), stopped
  at the same budget.

Each trained policy is then evaluated on 16 fresh 10-second episodes at a
0.5 m/s forward command: the mean forward speed (base frame, upright
robots, after the first 2 s), the mean per-episode speed error, and the
fraction of episodes that stay upright. Issue 12's targets: within 0.1 m/s
of 0.5 m/s, at least 95 % upright, at most 15 minutes of CPU training.

    python benchmarks/locomotion.py                          # 3 seeds x (SHAC, PPO), 15 min each
    python benchmarks/locomotion.py --minutes 5 --seeds 0    # a quick look
    python benchmarks/locomotion.py --methods shac           # without PPO
    python benchmarks/locomotion.py --reach --seeds 0 1 2    # SHAC's env steps and CPU to reach PPO's return
    python benchmarks/locomotion.py --methods ppo --budget cpu --minutes 4.5 --seeds 0
                                                             # PPO for 4.5 min of CPU time (a loaded machine)
    python benchmarks/locomotion.py --reach --ppo-json ppo0.json ppo1.json --seeds 0 1
                                                             # ... to reach those PPO runs' best final return
    python benchmarks/locomotion.py --methods shac --blind-actor --seeds 0
                                                             # an actor without base velocity and height
    python benchmarks/locomotion.py --methods shac --blind-actor --preset go1_walk_shac --updates 150 \
        --budget cpu --seeds 0                               # ... on Go1 with its recipe (lr decay, 150 updates)
    python benchmarks/locomotion.py --methods shac --blind-actor --lr-decay-updates 333 --updates 300 \
        --budget cpu --seeds 0                               # ... the shipped quadruped with a lr decay
    python benchmarks/locomotion.py --methods ppo --budget cpu --minutes 15 --ppo-eval-every 0.5 --seeds 0 1 2 --out ppo.json
    python benchmarks/locomotion.py --reach --target 1e9 --reach-max-update 150 --seeds 0 --out shac0.json  # (1, 2 alike)
    python benchmarks/locomotion.py --reach-table shac0.json shac1.json shac2.json --ppo-json ppo.json
                                                             # issue 12's protocol: the per-seed table below
    python benchmarks/locomotion.py --reach --target 1e9 --compile --reach-updates 10 20 30 40 50 60 80 --seeds 0
                                                             # SHAC on QuadrupedWalk(compile=True), sparse grid
    python benchmarks/locomotion.py --reach --target 1e9 --shac-set num_envs=32 --reach-updates 40 50 60 80 --seeds 0
                                                             # SHAC with 32 copies per update (fewer env steps)

``--reach`` answers issue 12's "env steps and CPU seconds each method needs
to reach PPO's final return": it trains SHAC and evaluates it (the same
``evaluate`` as the table: 16 episodes of 10 s at 0.5 m/s, seed 999, return
= the mean over episodes of the summed rewards of all 500 steps) before the
first update and after updates 1, 2, 5, 10, 15, 20, 30, 40, 50, 60, 80, 100,
150, 200, 300 and 420 (``REACH_UPDATES``), and reports the
first evaluation at or above the target return (default: the PPO runs of
``docs/locomotion.md``, or the PPO rows of ``--ppo-json``), with the env
steps and the training CPU seconds (evaluations excluded) spent until then.

PPO is also evaluated every ``--ppo-eval-every`` minutes of training (the
``curve`` of its JSON row: env steps, training CPU seconds, return), so its
own env steps and CPU seconds to reach its final return are known. PPO keeps
its best evaluated policy (``BestPolicy``: the weights and ``VecNormalize``'s
observation statistics at its best evaluation): its row's ``best`` is that
evaluation and ``best_check`` the kept policy evaluated again after training,
``--ppo-keep-best`` saves it. ``--reach`` without ``--target`` aims at PPO's
best evaluated return (PPO's evaluation return rises and then collapses, so
its final one is no target) and says so.

``--compile`` trains SHAC on ``QuadrupedWalk(compile=True)`` (inductor): the
env's gradient graph is compiled before training (``make_shac_env``), its CPU
seconds counted in the training CPU and reported on their own
(``compile_cpu_s``). ``--reach-updates`` evaluates SHAC after those updates
only (one evaluation costs about the CPU of 20 eager updates).

``--preset`` (SHAC rows only) trains and evaluates with another preset of
``SHAC_PRESETS``: ``go1_walk_shac`` trains on Go1 and runs the 16 test
episodes on Go1. ``--updates`` also stops SHAC after that many updates (the
``--minutes`` budget still applies), ``--lr-decay-updates`` replaces the
preset's ``lr_decay_updates`` (``PolicyTrainerConfig``'s linear decay of
both learning rates to zero at that update). With ``--blind-actor`` they give
the blind actor the Go1 recipe, or the quadruped recipe with a decay.

``--shac-set KEY=JSON`` (SHAC rows and ``--reach``; ``shac_variant``) trains with a copy of the preset
with ``num_envs`` or ``PolicyTrainerConfig`` fields changed (``num_envs=32``: 256 env steps per update
instead of 512), the evaluation unchanged; the shipped preset stays as it is.

``--reach-table`` puts the two together without training (``reach_table``):
per seed, PPO's final return (its evaluation after the whole budget) and its
best evaluation (PPO's evaluation return rises and collapses during
training, so "PPO's final return" alone can sit below where it once was),
and for each of the two the env steps and training CPU seconds PPO and SHAC
(same seed, its ``--reach --target 1e9`` curve) spend to first evaluate at
or above it, their ratios and the means over seeds. It also reads the stdout
logs of runs stopped before their end (a PPO row then takes its last
evaluation as its final one). The CPU seconds are training only for both:
``--reach`` curves record SHAC's env and trainer build as ``setup_cpu_s``
and the table leaves it out, as PPO's clock starts after its env is built.

Writes ``outputs/benchmarks/locomotion.json`` and prints a markdown table.
Run it on a quiet machine: the default budget is wall time; ``--budget cpu``
counts the process's CPU time instead (evaluations excluded from both).
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from backdrive.envs import QuadrupedWalk  # noqa: E402
from backdrive.optim import GO1_WALK_SHAC, QUADRUPED_WALK_SHAC, train_policy  # noqa: E402
from backdrive.optim._policy import QUADRUPED_WALK_SHAC_DECAY, QUADRUPED_WALK_SHAC_FEW  # noqa: E402
from backdrive.optim._policy.presets import GO1_WALK_SHAC_LONG  # noqa: E402

COMMAND = (0.5, 0.0, 0.0)
EVAL_EPISODES, EVAL_SEED, EVAL_SECONDS = 16, 999, 10.0


#: The SHAC presets ``--preset`` accepts (SHAC rows only): the shipped quadruped's, its few-copy
#: variant (the 13th session's reach setting) and Go1's (``go1_walk_shac_long``: the 16th session's).
SHAC_PRESETS = {p.name: p for p in (QUADRUPED_WALK_SHAC, QUADRUPED_WALK_SHAC_FEW, QUADRUPED_WALK_SHAC_DECAY,
                                     GO1_WALK_SHAC, GO1_WALK_SHAC_LONG)}


def shac_preset(name: str = QUADRUPED_WALK_SHAC.name, lr_decay_updates: int | None = None):
    """The preset ``--preset name`` names, with ``--lr-decay-updates`` (when given) in its config.

    Raises:
        PolicyConfigError: ``name`` is not in ``SHAC_PRESETS``, or ``lr_decay_updates`` is not a
            positive int (``PolicyTrainerConfig``'s own check).
    """
    import dataclasses

    if name not in SHAC_PRESETS:
        from backdrive._errors import PolicyConfigError

        raise PolicyConfigError(f"preset {name!r} is not one of {sorted(SHAC_PRESETS)}")
    preset = SHAC_PRESETS[name]
    if lr_decay_updates is None:
        return preset
    return dataclasses.replace(preset, config=preset.config.replace(lr_decay_updates=lr_decay_updates))


def shac_variant(preset, settings: dict):
    """``preset`` with some settings changed (``--shac-set KEY=JSON``): ``num_envs`` and the other
    keywords of its env type (e.g. ``max_episode_steps``) go to ``env_kwargs``, every other key is a
    ``PolicyTrainerConfig`` field
    (``config.replace``: an unknown name or a bad value raises there). Its name lists the changes,
    e.g. ``quadruped_walk_shac+num_envs=16``; no settings: ``preset`` itself.

    Raises:
        PolicyConfigError: ``num_envs`` is not a positive int, or a bad config value.
        InputTypeError: a key that is neither an env keyword of the preset nor a config field.
    """
    import dataclasses

    if not settings:
        return preset
    import inspect

    env_keys = set(preset.env_kwargs) | set(inspect.signature(preset.env_type).parameters) - {"self"}
    env_changes = {k: v for k, v in settings.items() if k in env_keys}
    n = env_changes.get("num_envs", 1)
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        from backdrive._errors import PolicyConfigError

        raise PolicyConfigError(f"--shac-set num_envs must be a positive int, got {n!r}")
    config = preset.config.replace(**{k: v for k, v in settings.items() if k not in env_keys})
    name = preset.name + "+" + ",".join(f"{k}={json.dumps(v, separators=(',', ':'))}" for k, v in settings.items())
    return dataclasses.replace(preset, name=name, env_kwargs={**preset.env_kwargs, **env_changes}, config=config)


def parse_settings(items: list[str]) -> dict:
    """``KEY=JSON`` strings (``--ppo-set``, ``--shac-set``) as a dict; a value that is not JSON stays a string."""
    out = {}
    for kv in items:
        k, v = kv.split("=", 1)
        try:
            out[k] = json.loads(v)
        except json.JSONDecodeError:
            out[k] = v
    return out


def env_kwargs(preset=QUADRUPED_WALK_SHAC) -> dict:
    return {k: v for k, v in preset.env_kwargs.items() if k != "num_envs"}


def evaluate(act, preset=QUADRUPED_WALK_SHAC) -> dict:
    """The test episodes on ``preset``'s env (its robot and keywords; the default: the shipped quadruped):
    forward speed, speed error, distance, upright fraction, mean yaw rate (rad/s; the command asks 0)
    and the mean episode return."""
    env = QuadrupedWalk(EVAL_EPISODES, **env_kwargs(preset))
    m = env.evaluate(act, COMMAND, seconds=EVAL_SECONDS, seed=EVAL_SEED)
    return {k: m[k] for k in ("forward_speed", "speed_error", "distance", "upright", "yaw_rate")} | {
        "return": float(m["rewards"].sum(0).mean())
    }


#: Observation entries a robot does not measure directly: the privileged
#: base linear velocity (base frame) and height, the last 4 of 51.
PRIVILEGED = slice(47, 51)


def blind_actor(env, preset=QUADRUPED_WALK_SHAC) -> torch.nn.Module:
    """The preset's policy network with its inputs from the privileged observations cut.

    Asymmetric actor-critic: the critic still sees all 51 observations, the
    actor only the 47 a robot measures. The first layer's weights from the
    privileged inputs start at zero and their gradient is zeroed, so Adam
    never moves them (a zero gradient leaves Adam's moments and the weight
    at zero): the saved policy is a plain ``MLPPolicy`` that ignores them.
    """
    from backdrive.optim._policy.networks import MLPPolicy

    c = preset.config
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(c.seed)
        policy = MLPPolicy(env.obs_dim, env.action_dim, env.action_low, env.action_high, c.hidden, c.activation,
                           c.squash)
    first = policy.net[0].weight
    with torch.no_grad():
        first[:, PRIVILEGED] = 0.0

    def cut(grad):
        grad = grad.clone()
        grad[:, PRIVILEGED] = 0.0
        return grad

    first.register_hook(cut)
    return policy


def make_shac_env(compile: bool = False, preset=QUADRUPED_WALK_SHAC):
    """The preset's training env, eager or with ``QuadrupedWalk(compile=True)`` (inductor), and the CPU
    seconds spent compiling it (0 when eager).

    Compiled, the env's training graph (one env step with the gradient of an action, SHAC's grad
    pattern: forward and backward graphs) is built here, before training, so its CPU is counted on
    its own (``compile_cpu_s``); the trainer resets the env with its seed afterwards, so the warm-up
    step changes nothing in training.
    """
    if not compile:
        return preset.make_env(), 0.0
    t0 = time.process_time()
    env = preset.make_env(compile=True)
    env.reset(seed=0)
    action = torch.zeros(env.num_envs, env.action_dim, requires_grad=True)
    obs, reward, *_ = env.step(action)
    (obs.sum() + reward.sum()).backward()
    if env.compiled_step.eager_reason is not None:
        from backdrive._errors import CompilerUnavailableError

        # An eager fallback would time the eager step under the compiled name.
        raise CompilerUnavailableError(f"--compile: the env step runs eagerly ({env.compiled_step.eager_reason})")
    return env, time.process_time() - t0


def run_shac(seed: int, minutes: float, *, blind: bool = False, checkpoint: Path | None = None,
             budget: str = "wall", compile: bool = False, preset=QUADRUPED_WALK_SHAC,
             updates: int | None = None) -> dict:
    """Train SHAC with ``preset`` until ``minutes`` of the ``budget`` clock or ``updates`` updates
    (whichever comes first; no update cap when None), then evaluate it on ``preset``'s env."""
    cpu0 = time.process_time()

    def spent(row) -> float:
        return row["wall_s"] if budget == "wall" else time.process_time() - cpu0

    env, compile_cpu = make_shac_env(compile, preset)
    cpu_at: list[float] = []  # the process's CPU seconds after each update (for ``train_log``)

    def stop(row) -> bool:
        cpu_at.append(time.process_time() - cpu0)
        return spent(row) > 60.0 * minutes

    trainer = train_policy(
        env, preset=preset, updates=100_000 if updates is None else updates, seed=seed, num_threads=1,
        policy=blind_actor(env, preset) if blind else None, checkpoint=checkpoint, checkpoint_every=25,
        callback=stop,
    )
    cpu = time.process_time() - cpu0
    if checkpoint is not None:
        trainer.save(checkpoint)
    policy = trainer.policy.eval()
    with torch.no_grad():
        result = evaluate(policy, preset)
        if blind:
            # The actor ignores the privileged inputs: changing them changes no action.
            obs = torch.randn(8, env.obs_dim)
            obs2 = obs.clone()
            obs2[:, PRIVILEGED] += 1.0
            result["blind_check"] = float((policy(obs) - policy(obs2)).abs().max())
    method = ("shac (blind actor)" if blind else "shac") + (" compiled" if compile else "")
    if preset is not QUADRUPED_WALK_SHAC:
        decay = preset.config.lr_decay_updates
        method += f", {preset.name}" + ("" if decay is None else f", lr decay to 0 at update {decay}")
    return {"method": method, "preset": preset.name, "lr_decay_updates": preset.config.lr_decay_updates,
            "seed": seed, "env_steps": trainer.env_steps, "train_wall_s": trainer.wall_s,
            "train_cpu_s": cpu, "compile_cpu_s": compile_cpu, "updates": trainer.updates_done, **result,
            # The training curve, one entry per update: the trainer's log row (train_return: the mean
            # return of the training episodes that ended in that update) and the CPU seconds until then.
            "train_log": [{k: h[k] for k in ("update", "env_steps", "train_return", "window_reward", "grad_norm")}
                          | {"cpu_s": c} for h, c in zip(trainer.history, cpu_at)]}


#: SB3 PPO settings. ``sb3_small`` is the previous session's run (SB3's default
#: action std of 1, 16 copies); ``tuned`` follows published settings for PPO on
#: massively parallel legged locomotion (legged_gym / rsl_rl's ``LeggedRobotCfgPPO``:
#: 24-step rollouts of many copies, 4 minibatches, 5 epochs, gamma 0.99, GAE
#: lambda 0.95, clip 0.2, gradient norm 1, ELU networks, a KL-limited step) and
#: RL-Zoo's PyBullet locomotion entries (``VecNormalize``, a small initial action
#: std through ``log_std_init``), adapted to one CPU core. SB3's orthogonal init is kept: its 0.01
#: gain on the action layer starts the policy near the zero action, which (PD standing pose plus
#: the trot generator) keeps most robots upright; without it the untrained policy's deterministic
#: actions felled all 16 evaluation robots (returns -2,398 and -2,949 for seeds 0 and 1).
PPO_CONFIGS = {
    "sb3_small": {"n_envs": 16, "n_steps": 128, "batch_size": 512, "n_epochs": 5, "learning_rate": 3e-4,
                  "gamma": 0.99, "gae_lambda": 0.95, "ent_coef": 0.0, "net_arch": [128, 128]},
    "tuned": {"n_envs": 256, "n_steps": 24, "batch_size": 1536, "n_epochs": 5, "learning_rate": 1e-3,
              "gamma": 0.99, "gae_lambda": 0.95, "clip_range": 0.2, "ent_coef": 0.0, "max_grad_norm": 1.0,
              "target_kl": 0.01, "net_arch": [256, 128], "activation": "elu", "log_std_init": -1.0},
}


def make_ppo(config: dict, seed: int):
    """SB3 PPO on ``QuadrupedWalk`` (``VecMonitor`` for episode stats, ``VecNormalize`` obs and reward)."""
    from stable_baselines3 import PPO
    from stable_baselines3.common.logger import Logger
    from stable_baselines3.common.vec_env import VecMonitor, VecNormalize

    from backdrive.envs import to_sb3_vec_env

    c = dict(config)
    n_envs = c.pop("n_envs")
    policy_kwargs = {"net_arch": c.pop("net_arch")}
    act = c.pop("activation", None)
    if act is not None:
        policy_kwargs["activation_fn"] = {"elu": torch.nn.ELU, "tanh": torch.nn.Tanh, "relu": torch.nn.ReLU}[act]
    for k in ("log_std_init", "ortho_init"):
        if c.get(k, None) is not None:
            policy_kwargs[k] = c.pop(k)
        c.pop(k, None)
    lr = c.pop("learning_rate")
    # The fraction of the training budget spent, which run_ppo keeps up to date (SB3's own progress
    # is num_timesteps / total_timesteps, and a budgeted run asks for 10**10 steps: it stays near 0).
    budget_fraction = [0.0]
    if c.pop("lr_linear", False):
        lr0, floor = lr, c.pop("lr_floor", 0.1)
        lr = lambda _progress: lr0 * max(1.0 - budget_fraction[0], floor)  # noqa: E731
    c.pop("lr_floor", None)
    venv = VecNormalize(VecMonitor(to_sb3_vec_env(QuadrupedWalk(n_envs, **env_kwargs()))), gamma=c["gamma"])
    model = PPO("MlpPolicy", venv, seed=seed, device="cpu", verbose=0, learning_rate=lr,
                policy_kwargs=policy_kwargs, **c)
    model.set_logger(Logger(folder=None, output_formats=[]))  # SB3's default leaves an empty folder in /tmp
    model.budget_fraction = budget_fraction
    return model, venv


class BestPolicy:
    """PPO's best evaluated policy: the policy's weights and ``VecNormalize``'s observation statistics
    at the evaluation with the highest return (the first of equal ones), copied when it happens.

    PPO's evaluation return rises and then collapses during training (docs/locomotion.md), so the
    policy a run keeps is this one; ``point`` is that evaluation (env steps, training CPU, return).
    """

    def __init__(self, model, venv):
        self.model, self.venv = model, venv
        self.point: dict | None = None
        self.policy_state: dict | None = None
        self.obs_rms = None

    def offer(self, point: dict) -> bool:
        """Keep the live policy if ``point`` (its evaluation) beats the best so far; whether it did."""
        if self.point is not None and not point["return"] > self.point["return"]:
            return False
        self.point = dict(point)
        self.policy_state = copy.deepcopy(self.model.policy.state_dict())
        self.obs_rms = copy.deepcopy(self.venv.obs_rms)
        return True

    def restore(self) -> None:
        """Put the kept policy and its observation statistics back into the model and its ``VecNormalize``."""
        if self.point is None:
            raise RuntimeError("BestPolicy.restore: no evaluation was offered")
        self.model.policy.load_state_dict(self.policy_state)
        self.venv.obs_rms = copy.deepcopy(self.obs_rms)


def ppo_actor(model, venv):
    def act(obs):
        a = model.predict(venv.normalize_obs(obs.numpy()), deterministic=True)[0]
        return torch.as_tensor(np.asarray(a), dtype=torch.float32)

    return act


def run_ppo(seed: int, minutes: float, config: dict | str = "tuned", *, eval_every: float = 0.0,
            log_std_init: float | None = None, budget: str = "wall", max_wall_minutes: float = float("inf"),
            keep_best: Path | None = None) -> dict:
    """PPO trained for ``minutes`` of training wall time (``budget="wall"``) or of the process's CPU
    time (``budget="cpu"``); evaluations are excluded from both clocks.

    With ``eval_every`` (minutes, on the budget's clock) it also evaluates (``evaluate``) at that
    interval and returns the curve: env steps and training CPU seconds at each evaluation. It keeps
    the best evaluated policy (``BestPolicy``; the final evaluation counts too): the row's ``best``
    is that evaluation, ``return`` stays the final policy's, and ``best_check`` is the kept policy
    evaluated again after training (restored into the model: the same return when the copy is
    whole). With ``keep_best`` the kept policy is saved there (``PPO.save``, and its
    ``VecNormalize`` statistics beside it as ``<name>_vecnormalize.pkl``).
    """
    from stable_baselines3.common.callbacks import BaseCallback

    name = config if isinstance(config, str) else "custom"
    config = dict(PPO_CONFIGS[config] if isinstance(config, str) else config)
    if log_std_init is not None:
        config["log_std_init"] = log_std_init
    model, venv = make_ppo(config, seed)
    clock = {"wall": 0.0, "cpu": 0.0, "t": time.perf_counter(), "c": time.process_time()}
    curve: list[dict] = []
    best = BestPolicy(model, venv)

    def tick():
        now, cnow = time.perf_counter(), time.process_time()
        clock["wall"] += now - clock["t"]
        clock["cpu"] += cnow - clock["c"]
        clock["t"], clock["c"] = now, cnow

    def evaluate_now():
        tick()
        with torch.no_grad():
            m = evaluate(ppo_actor(model, venv))
        eps = list(model.ep_info_buffer or [])
        curve.append({"env_steps": int(model.num_timesteps), "train_wall_s": clock["wall"],
                      "train_cpu_s": clock["cpu"],
                      "train_ep_len": float(np.mean([e["l"] for e in eps])) if eps else None,
                      "train_ep_return": float(np.mean([e["r"] for e in eps])) if eps else None,
                      "std": float(torch.exp(model.policy.log_std.detach()).mean()), **m})
        best.offer(curve[-1])
        print(json.dumps({"seed": seed, **curve[-1]}), flush=True)
        clock["t"], clock["c"] = time.perf_counter(), time.process_time()

    class Budget(BaseCallback):
        next_eval = 60.0 * eval_every

        def _on_rollout_end(self) -> None:
            tick()
            model.budget_fraction[0] = clock[budget] / (60.0 * minutes)
            if eval_every > 0 and clock[budget] >= self.next_eval:
                evaluate_now()
                self.next_eval = clock[budget] + 60.0 * eval_every

        def _on_step(self) -> bool:
            tick()
            return clock[budget] < 60.0 * minutes and clock["wall"] < 60.0 * max_wall_minutes

    if eval_every > 0:
        evaluate_now()
    model.learn(total_timesteps=10**10, callback=Budget())
    tick()
    wall, cpu, steps = clock["wall"], clock["cpu"], int(model.num_timesteps)
    with torch.no_grad():
        result = evaluate(ppo_actor(model, venv))
    last = {"env_steps": steps, "train_wall_s": wall, "train_cpu_s": cpu, **result}
    best.offer(last)
    if eval_every > 0:
        curve.append(last)
    best.restore()
    with torch.no_grad():
        check = evaluate(ppo_actor(model, venv))
    if keep_best is not None:
        keep_best.parent.mkdir(parents=True, exist_ok=True)
        model.save(keep_best)
        venv.save(str(keep_best.with_suffix("")) + "_vecnormalize.pkl")
    return {"method": "ppo", "seed": seed, "config": name, "ppo_settings": config, "budget": budget, "env_steps": steps,
            "train_wall_s": wall, "train_cpu_s": cpu, **result,
            "best": {k: best.point[k] for k in ("env_steps", "train_cpu_s", "train_wall_s", "return", "forward_speed",
                                                 "speed_error", "upright")},
            "best_check": {k: check[k] for k in ("return", "forward_speed", "upright")}, "curve": curve}


#: PPO's final evaluation returns (``evaluate``'s definition) of the two SB3
#: PPO runs in ``docs/locomotion.md`` (14.4 min of wall time each), with
#: their env steps and training CPU seconds.
PPO_RECORDED = [
    {"method": "ppo", "seed": 0, "return": -2838.0, "env_steps": 230_896, "train_cpu_s": 8.6 * 60},
    {"method": "ppo", "seed": 1, "return": -2856.0, "env_steps": 227_088, "train_cpu_s": 11.5 * 60},
]
REACH_UPDATES = (1, 2, 5, 10, 15, 20, 30, 40, 50, 60, 80, 100, 150, 200, 300, 420)


def provenance() -> dict:
    """The source, torch, CPU kernels and threads a SHAC curve ran on (``backdrive.optim``'s
    :func:`provenance`, with this script's own changes counted as source changes)."""
    from backdrive.optim._policy.checkpoints import provenance as _provenance

    return _provenance(("src", "benchmarks/locomotion.py"))


def run_shac_reach(seed: int, target: float, updates=REACH_UPDATES, out: Path | None = None,
                   compile: bool = False, start_eval: bool = True, preset=QUADRUPED_WALK_SHAC) -> dict:
    """SHAC's evaluation curve and the first point at or above ``target`` return.

    With ``out``, the curve so far is written there (the ``reach_table`` format) after each
    evaluation, so a run stopped early still leaves its curve. With ``compile`` the env is
    ``QuadrupedWalk(compile=True)`` (``make_shac_env``): each point's ``train_cpu_s`` includes the
    compile, which its ``compile_cpu_s`` gives on its own. ``start_eval=False`` skips the evaluation
    before the first update. ``preset``: the settings trained with (``shac_variant``: e.g. fewer
    copies); the evaluation is the same for every preset of the shipped quadruped.
    """
    cpu0 = time.process_time()
    env, compile_cpu = make_shac_env(compile, preset)
    trainer = train_policy(env, preset=preset, updates=0, seed=seed, num_threads=1)
    cpu = time.process_time() - cpu0
    # Building the env and the trainer (imports excluded; the compile is counted on its own): PPO's
    # training clock starts after its env is built, so reach_table leaves this out of SHAC's CPU too.
    setup_cpu = cpu - compile_cpu
    source = provenance()
    curve = []
    for k in ((0,) if start_eval else ()) + tuple(updates):
        t0 = time.process_time()
        trainer.train(k)
        cpu += time.process_time() - t0
        with torch.no_grad():
            m = evaluate(trainer.policy.eval())
        trainer.policy.train()
        curve.append({"seed": seed, "update": k, "env_steps": trainer.env_steps, "train_cpu_s": cpu,
                      "compile_cpu_s": compile_cpu, "setup_cpu_s": setup_cpu, **m})
        print(json.dumps(curve[-1]), flush=True)
        if out is not None:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps({"shac": [{"method": "shac", "seed": seed, "compile": compile,
                                                  "preset": preset.name, "provenance": source, "curve": curve}]},
                                      indent=1))
        if m["return"] >= target:
            break
    hit = next((c for c in curve if c["return"] >= target), None)
    return {"method": "shac", "seed": seed, "compile": compile, "compile_cpu_s": compile_cpu,
            "setup_cpu_s": setup_cpu, "preset": preset.name, "provenance": source, "num_envs": env.num_envs,
            "horizon": trainer.config.horizon,
            "target_return": target, "curve": curve,
            "reached_at_update": None if hit is None else hit["update"],
            "env_steps_to_target": None if hit is None else hit["env_steps"],
            "cpu_s_to_target": None if hit is None else hit["train_cpu_s"]}


def ppo_best_return(row: dict) -> float:
    """A PPO row's best evaluated return: its ``best`` (the policy ``run_ppo`` keeps), else the highest
    of its curve and its final return (rows written before ``best`` existed)."""
    if "best" in row:
        return row["best"]["return"]
    return max([row["return"], *(c["return"] for c in row.get("curve", []))])


def first_at(curve: list[dict], target: float) -> tuple[dict | None, dict | None]:
    """The first point of ``curve`` at or above ``target`` return, and the point before it (the grid's
    lower bound on the crossing; ``None`` when the first point is already there)."""
    for i, c in enumerate(curve):
        if c["return"] >= target:
            return c, (curve[i - 1] if i > 0 else None)
    return None, None


def load_shac_curves(paths: list[Path]) -> dict[int, list[dict]]:
    """SHAC evaluation curves by seed, from ``--reach`` outputs (JSON) or from their stdout logs
    (one JSON curve point per line: a run stopped before it wrote its output). A log's seed is read
    from its points (``run_shac_reach`` writes it into each), never from the file name.

    Raises:
        InputError: a log whose points name no seed (written before they carried it) or several.
    """
    curves: dict[int, list[dict]] = {}
    for path in paths:
        text = path.read_text()
        try:
            data = json.loads(text)
        except json.JSONDecodeError:
            points = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
            points = [c for c in points if "update" in c]
            seeds = {c["seed"] for c in points if "seed" in c}
            if len(seeds) != 1 or any("seed" not in c for c in points):
                from backdrive._errors import InputError

                found = "no seed" if not seeds else f"seeds {sorted(seeds)}" if len(seeds) > 1 else "points without a seed"
                raise InputError(f"SHAC log {path}: its curve points must all name one seed, found {found} "
                                 "(a log of a run before the points carried their seed: give the --out JSON instead)")
            curves[seeds.pop()] = points
            continue
        for r in data["shac"]:
            curves[r["seed"]] = r["curve"]
    return curves


def load_ppo_rows(paths: list[Path]) -> list[dict]:
    """PPO rows from PPO runs' outputs (JSON), or from their stdout logs (one JSON evaluation per line,
    ``run_ppo``'s curve: a run stopped before the end of its budget). A row from a log takes its last
    evaluation as its final one (``"stopped_early": True``)."""
    rows = []
    for path in paths:
        text = path.read_text()
        try:
            rows += [r for r in json.loads(text) if r["method"] == "ppo"]
            continue
        except json.JSONDecodeError:
            pass
        points = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
        curve = [c for c in points if "method" not in c and "return" in c]
        done = [c for c in points if c.get("method") == "ppo"]
        if done:  # the run finished (its row is printed last) but its output is missing
            rows.append({**done[-1], "curve": curve + [{k: done[-1][k] for k in curve[-1] if k in done[-1]}]})
        elif curve:
            last = curve[-1]
            rows.append({"method": "ppo", "seed": last["seed"], "return": last["return"],
                         "env_steps": last["env_steps"], "train_cpu_s": last["train_cpu_s"],
                         "train_wall_s": last["train_wall_s"], "curve": curve, "stopped_early": True})
    return rows


def reach_table(ppo_rows: list[dict], shac_curves: dict[int, list[dict]]) -> tuple[str, list[dict]]:
    """Issue 12's comparison, per seed: PPO's final and best evaluation returns, and the env steps and
    training CPU seconds PPO and SHAC (same seed) spend to first evaluate at or above each.

    "PPO's final return" is its evaluation after the whole budget; PPO's evaluation return rises and
    collapses during training, so its best evaluation (and where it happened) is reported too. The
    crossings are bounded by the evaluation grids (the point before each is kept in the rows).

    CPU seconds are the training's only, for both: PPO's clock starts after its env is built, and
    SHAC's points give their env and trainer build as ``setup_cpu_s`` (``run_shac_reach``), which is
    taken off here (the row keeps it as ``shac_setup_cpu_s``; curves written before it was recorded
    have none, so their CPU still includes it). A compile (``--compile``) stays in, stated on its own.
    """

    def cpu(method: str, point: dict) -> float:
        return point["train_cpu_s"] - (point.get("setup_cpu_s", 0.0) if method == "shac" else 0.0)

    rows = []
    for p in ppo_rows:
        curve = p.get("curve") or [p]
        best = max(curve, key=lambda c: c["return"])
        row = {"seed": p["seed"], "ppo_final": p["return"], "ppo_final_steps": p["env_steps"],
               "ppo_final_cpu_s": p["train_cpu_s"], "ppo_best": best["return"], "ppo_start": curve[0]["return"]}
        shac = shac_curves.get(p["seed"], [])
        row["shac_last"] = ({k: shac[-1][k] for k in ("update", "env_steps", "return")}
                            | {"train_cpu_s": cpu("shac", shac[-1])} if shac else None)
        row["shac_setup_cpu_s"] = shac[0].get("setup_cpu_s") if shac else None
        for name, target in (("final", p["return"]), ("best", best["return"])):
            for method, c in (("ppo", curve), ("shac", shac)):
                hit, before = first_at(c, target)
                row[f"{method}_to_{name}"] = None if hit is None else {
                    "env_steps": hit["env_steps"], "cpu_s": cpu(method, hit),
                    "after": None if before is None else {"env_steps": before["env_steps"],
                                                          "cpu_s": cpu(method, before)}}
                if hit is not None and method == "shac":
                    # SHAC on the compiled env (--compile): cpu_s includes the compile, this is its part
                    row[f"shac_to_{name}"]["compile_cpu_s"] = hit.get("compile_cpu_s", 0.0)
            a, b = row[f"ppo_to_{name}"], row[f"shac_to_{name}"]
            # A target already met before any update (a collapse below the start) gives no ratio.
            ok = a is not None and b is not None and min(a["env_steps"], b["env_steps"]) > 0
            row[f"steps_ratio_{name}"] = a["env_steps"] / b["env_steps"] if ok else None
            row[f"cpu_ratio_{name}"] = a["cpu_s"] / b["cpu_s"] if ok else None
            row[f"cpu_ratio_{name}_excl_compile"] = (a["cpu_s"] / (b["cpu_s"] - b["compile_cpu_s"])
                                                     if ok and b["compile_cpu_s"] > 0 else None)
        rows.append(row)

    def cell(x, last=None) -> str:
        if x is None:
            return "not reached" if last is None else f"not reached by update {last['update']} ({last['env_steps']:,})"
        if x["env_steps"] == 0:
            return "0 (before any update)"
        compiled = f" (incl. {x['compile_cpu_s']:.0f} s compile)" if x.get("compile_cpu_s", 0.0) > 0 else ""
        return f"{x['env_steps']:,} / {x['cpu_s']:.0f} s{compiled}"

    def ratio(x, excl=None) -> str:
        return "-" if x is None else f"{x:.1f}x" + ("" if excl is None else f" ({excl:.1f}x without compile)")

    lines = ["| seed | PPO final (steps / CPU) | PPO best | target | PPO to reach it (steps / CPU) "
             "| SHAC to reach it (steps / CPU) | fewer env steps | less CPU |",
             "| ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: |"]
    for r in rows:
        for name in ("final", "best"):
            head = (f"| {r['seed']} | {r['ppo_final']:+,.0f} ({r['ppo_final_steps']:,} / {r['ppo_final_cpu_s']:.0f} s) "
                    f"| {r['ppo_best']:+,.0f} " if name == "final" else "| | | ")
            lines.append(f"{head}| {name} ({r['ppo_' + name]:+,.0f}) | {cell(r['ppo_to_' + name])} "
                         f"| {cell(r['shac_to_' + name], r['shac_last'])} | {ratio(r['steps_ratio_' + name])} "
                         f"| {ratio(r['cpu_ratio_' + name], r['cpu_ratio_' + name + '_excl_compile'])} |")
    for name in ("final", "best"):
        s = [r[f"steps_ratio_{name}"] for r in rows if r[f"steps_ratio_{name}"] is not None]
        c = [r[f"cpu_ratio_{name}"] for r in rows if r[f"cpu_ratio_{name}"] is not None]
        e = [r[f"cpu_ratio_{name}_excl_compile"] for r in rows if r[f"cpu_ratio_{name}_excl_compile"] is not None]
        if s:
            lines.append(f"| mean ({len(s)} seeds) | | | {name} | | | {np.mean(s):.1f}x "
                         f"| {ratio(np.mean(c), np.mean(e) if len(e) == len(c) else None)} |")
    return "\n".join(lines), rows


def ppo_untrained(seed: int, config: dict | str = "tuned") -> dict:
    """``evaluate`` of SB3 PPO's policy before any update (as ``run_ppo`` builds it): PPO's own start."""
    model, venv = make_ppo(PPO_CONFIGS[config] if isinstance(config, str) else config, seed)
    return {"method": "ppo (untrained)", "seed": seed, "env_steps": 0, **evaluate(ppo_actor(model, venv))}


def table(rows: list[dict]) -> str:
    lines = [
        "| method | seed | env steps | training wall, min | training CPU, min | forward speed at 0.5 m/s command | mean speed error "
        "| walked in 10 s, m | upright |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        lines.append(
            f"| {r['method']} | {r['seed']} | {r['env_steps']:,} | {r['train_wall_s'] / 60:.1f} | "
            f"{r['train_cpu_s'] / 60:.1f} | "
            f"{r['forward_speed']:.3f} m/s | {r['speed_error']:.3f} m/s | {r['distance']:.2f} | "
            f"{r['upright'] * 100:.0f}% |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--minutes", type=float, default=15.0, help="training budget per run, minutes of --budget (wall or CPU) time")
    parser.add_argument("--methods", nargs="+", default=["shac", "ppo"], choices=["shac", "ppo"])
    parser.add_argument("--out", type=Path, default=None,
                        help="JSON output (default outputs/benchmarks/locomotion.json, locomotion_reach.json with --reach)")
    parser.add_argument("--ppo-config", default="tuned", choices=sorted(PPO_CONFIGS),
                        help="SB3 PPO settings (PPO_CONFIGS); default: tuned")
    parser.add_argument("--ppo-set", nargs="*", default=[], metavar="KEY=JSON",
                        help="override PPO settings, e.g. learning_rate=1e-3 n_envs=512 net_arch=[128,128]")
    parser.add_argument("--budget", choices=["wall", "cpu"], default="wall",
                        help="--minutes of training wall time or of process CPU time (fairer on a loaded machine)")
    parser.add_argument("--max-wall-minutes", type=float, default=float("inf"),
                        help="PPO: also stop at this much training wall time (with --budget cpu on a loaded machine)")
    parser.add_argument("--ppo-eval-every", type=float, default=1.5,
                        help="PPO: evaluate every this many minutes of the --budget clock (0: only at the end)")
    parser.add_argument("--ppo-log-std", type=float, default=None, help="SB3 PPO's log_std_init (overrides the config)")
    parser.add_argument("--ppo-keep-best", type=Path, default=None,
                        help="PPO: save the best evaluated policy here (.zip, with its VecNormalize statistics "
                             "beside it); one seed")
    parser.add_argument("--blind-actor", action="store_true",
                        help="SHAC with an actor that does not see the base velocity and height (critic does)")
    parser.add_argument("--checkpoint", type=Path, default=None, help="SHAC: write its checkpoint here")
    parser.add_argument("--preset", default=QUADRUPED_WALK_SHAC.name, choices=sorted(SHAC_PRESETS),
                        help="SHAC rows (--methods shac): train and evaluate with this preset, its robot included "
                             "(default: quadruped_walk_shac, the shipped quadruped)")
    parser.add_argument("--updates", type=int, default=None,
                        help="SHAC rows: also stop after this many updates (default: only --minutes stops it)")
    parser.add_argument("--lr-decay-updates", type=int, default=None,
                        help="SHAC rows: the preset's config with this lr_decay_updates (linear decay of both "
                             "learning rates to 0 at this update)")
    parser.add_argument("--shac-set", nargs="*", default=[], metavar="KEY=JSON",
                        help="SHAC (rows and --reach): change the preset's settings, e.g. num_envs=16 (its env) or "
                             "lr_decay_updates=100 (PolicyTrainerConfig fields); the evaluation stays the same")
    parser.add_argument("--compile", action="store_true",
                        help="SHAC: train on QuadrupedWalk(compile=True) (inductor); its compile CPU counts as "
                             "training and is also reported on its own (compile_cpu_s)")
    parser.add_argument("--reach", action="store_true",
                        help="SHAC's env steps and CPU to reach PPO's final return (see the module docstring)")
    parser.add_argument("--target", type=float, default=None,
                        help="with --reach: this return instead of PPO's best evaluated return")
    parser.add_argument("--ppo-json", type=Path, nargs="+", default=None,
                        help="with --reach: take PPO's returns from this output of a PPO run instead of the recorded ones")
    parser.add_argument("--reach-updates", type=int, nargs="+", default=None, metavar="UPDATE",
                        help="with --reach: evaluate after these updates instead of 0 and REACH_UPDATES (one "
                             "evaluation costs about as much CPU as 20 eager SHAC updates)")
    parser.add_argument("--reach-max-update", type=int, default=None,
                        help="with --reach: stop SHAC's curve after this update (REACH_UPDATES up to it)")
    parser.add_argument("--reach-table", type=Path, nargs="+", default=None, metavar="SHAC_JSON",
                        help="with --ppo-json (PPO outputs, or logs of PPO runs stopped early): no training; the "
                             "per-seed table of PPO's final and best returns and the steps and CPU each method "
                             "needs to reach them, from these --reach outputs (or logs)")
    args = parser.parse_args()
    shac_options = [o for o, v in (("--preset", args.preset != QUADRUPED_WALK_SHAC.name),
                                   ("--updates", args.updates is not None),
                                   ("--lr-decay-updates", args.lr_decay_updates is not None)) if v]
    if shac_options and (args.reach or args.reach_table is not None or args.methods != ["shac"]):
        parser.error(f"{', '.join(shac_options)}: SHAC rows only (--methods shac, without --reach or --reach-table)")
    for name in ("updates", "lr_decay_updates"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name.replace('_', '-')} must be a positive number of updates, got {value}")
    preset = shac_preset(args.preset, args.lr_decay_updates)
    try:
        preset = shac_variant(preset, parse_settings(args.shac_set))
    except (ValueError, TypeError) as e:  # PolicyConfigError, InputTypeError
        parser.error(f"--shac-set: {e}")
    torch.set_num_threads(1)
    if args.reach_table is not None:
        if args.ppo_json is None:
            parser.error("--reach-table needs --ppo-json")
        text, rows = reach_table(load_ppo_rows(args.ppo_json), load_shac_curves(args.reach_table))
        if args.out is not None:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(rows, indent=1))
        print(text)
        for r in rows:
            if r["shac_last"] is not None:
                last = r["shac_last"]
                setup = r["shac_setup_cpu_s"]
                print(f"SHAC seed {r['seed']}: last evaluated at update {last['update']} ({last['env_steps']:,} steps, "
                      f"{last['train_cpu_s']:.0f} CPU s): return {last['return']:+,.0f}; "
                      + ("its CPU includes the env and trainer build (not recorded)" if setup is None else
                         f"env and trainer build {setup:.1f} CPU s, left out of its CPU"))
        return
    if args.reach:
        ppo = PPO_RECORDED
        if args.ppo_json is not None:
            ppo = [r for f in args.ppo_json for r in json.loads(f.read_text()) if r["method"] == "ppo"]
        # Default: PPO's best evaluated return (the best evaluation of the best run; PPO collapses after
        # its peak, so its final return is no target: docs/locomotion.md), stated as such below.
        target = max(ppo_best_return(r) for r in ppo) if args.target is None else args.target
        print(f"target return: {target:+,.1f} ("
              + ("PPO's best evaluated return" if args.target is None else "--target") + ")", flush=True)
        out = args.out or Path("outputs/benchmarks/locomotion_reach.json")
        grid = REACH_UPDATES if args.reach_updates is None else tuple(sorted(set(args.reach_updates) - {0}))
        updates = tuple(u for u in grid if args.reach_max_update is None or u <= args.reach_max_update)
        rows = [run_shac_reach(seed, target, updates, out=out if len(args.seeds) == 1 else None, compile=args.compile,
                               start_eval=args.reach_updates is None or 0 in args.reach_updates, preset=preset)
                for seed in args.seeds]
        start = ppo_untrained(args.seeds[0]) if args.target is None else None
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"ppo": ppo, "ppo_untrained": start, "shac": rows}, indent=1))
        if start is not None:
            print(f"SB3 PPO before any update (seed {start['seed']}): return {start['return']:,.0f}, "
                  f"upright {start['upright'] * 100:.0f}%, forward speed {start['forward_speed']:.3f} m/s")
        print(f"| method | seed | final return | env steps to reach {target:,.0f} | CPU s to reach it |")
        print("| --- | ---: | ---: | ---: | ---: |")
        for r in ppo:
            # PPO's own first evaluation at or above the target (its evaluation curve, when recorded)
            hit = next((c for c in r.get("curve", []) if c["return"] >= target), None)
            steps, cpu = (r["env_steps"], r["train_cpu_s"]) if hit is None else (hit["env_steps"], hit["train_cpu_s"])
            tail = "" if hit is not None or r["return"] >= target else " (not reached; its whole run)"
            print(f"| SB3 PPO | {r['seed']} | {r['return']:,.0f} | {steps:,}{tail} | {cpu:.0f} |")
        for r in rows:
            c = r["curve"][-1]
            reached = "not reached" if r["env_steps_to_target"] is None else (
                f"{r['env_steps_to_target']:,} (update {r['reached_at_update']})")
            cpu = "-" if r["cpu_s_to_target"] is None else f"{r['cpu_s_to_target']:.0f}"
            print(f"| SHAC | {r['seed']} | {c['return']:,.0f} at update {c['update']} | {reached} | {cpu} |")
        return
    args.out = args.out or Path("outputs/benchmarks/locomotion.json")
    rows = []
    for seed in args.seeds:
        for method in args.methods:
            if method == "shac":
                row = run_shac(seed, args.minutes, blind=args.blind_actor, checkpoint=args.checkpoint,
                               budget=args.budget, compile=args.compile, preset=preset, updates=args.updates)
            else:
                config = dict(PPO_CONFIGS[args.ppo_config]) | parse_settings(args.ppo_set)
                row = run_ppo(seed, args.minutes, config, eval_every=args.ppo_eval_every,
                              log_std_init=args.ppo_log_std, budget=args.budget,
                              max_wall_minutes=args.max_wall_minutes, keep_best=args.ppo_keep_best)
                row["config"] = args.ppo_config + ("".join(f" {kv}" for kv in args.ppo_set))
            print(json.dumps({k: v for k, v in row.items() if k not in ("curve", "train_log")}), flush=True)
            rows.append(row)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rows, indent=1))
    print(table(rows))


if __name__ == "__main__":
    main()
