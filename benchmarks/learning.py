"""Policy learning side by side: backdrive SHAC and APG against Stable-Baselines3 PPO and SAC.

Pendulum swing-up, in one process, 3 seeds per method (the cart-pole
comparison is ``benchmarks/learning_cartpole.py``, which reuses this file's
clock and plot).

* SB3 PPO and SAC with the rl-baselines3-zoo hyperparameters for
  ``Pendulum-v1`` (``hyperparams/ppo.yml``, ``hyperparams/sac.yml``), trained
  on ``gymnasium.make("Pendulum-v1")``.
* backdrive SHAC and APG trained by back-propagating through
  ``backdrive.envs.Pendulum`` (the same dynamics and reward in closed form;
  ``tests/test_envs.py`` checks it against gymnasium step by step). SHAC's
  training env uses "exploring starts": initial velocities uniform in
  ``[-8, 8]`` rad/s instead of ``[-1, 1]`` (gymnasium's own ``y_init`` reset
  option) and 8-step episodes, so that its short windows see every part of
  the state space; without them first-order methods stall in the "hold it
  sideways" local optimum (see docs/learning.md). SHAC runs
  ``backdrive.optim.PENDULUM_SHAC``: its critic refits every past window
  and its actor takes extra steps on replayed transitions through their
  stored action Jacobians (no simulator calls, so no env steps). APG, which
  has no critic to see past its window, trains on whole episodes from
  gymnasium's starts.

Every policy is evaluated the same way: 5 deterministic episodes of the
unmodified ``gymnasium.make("Pendulum-v1")`` (reset seeds 1000-1004): SAC,
SHAC and APG at the first step or update at or after every multiple of 500
environment steps, PPO after every rollout (its policy changes only there).
Reported per method and seed:
environment steps (every env transition counts: ``num_envs * horizon`` per
backdrive update) and seconds until the evaluated mean return first reaches
-200, and the final evaluated return.

Seconds are the process CPU time of training (``time.process_time``, one
torch thread for every method, evaluation time excluded), which a loaded
machine disturbs far less than wall-clock time; wall-clock seconds are in the
table and the CSV too.

    python benchmarks/learning.py                      # 3 seeds (~40 min, 30 of them SAC)
    python benchmarks/learning.py --methods shac ppo --seeds 1

Outputs (``--out``, default ``outputs/learning``): ``pendulum_curves.csv``
(every evaluation), ``pendulum.json`` (settings and results) and
``pendulum_curves.png`` (return against steps and against CPU seconds).

Needs ``stable-baselines3`` and ``gymnasium`` (the ``bench`` extra) and
matplotlib for the plot.
"""

from __future__ import annotations

import argparse
import csv
import json
import platform
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch

from backdrive.envs import Pendulum
from backdrive.optim import PENDULUM_SHAC, PolicyTrainer

THRESHOLD = -200.0
EVAL_SEEDS = (1000, 1001, 1002, 1003, 1004)
# Pendulum: SAC, SHAC and APG are evaluated at the first update (SAC: step)
# at or after every multiple of this many environment steps; PPO after every
# rollout (its policy only changes there).
EVAL_EVERY_STEPS = 500

# rl-baselines3-zoo, hyperparams/ppo.yml and sac.yml, "Pendulum-v1".
PPO_ZOO = dict(
    n_envs=4,
    n_timesteps=100_000,
    n_steps=1024,
    gae_lambda=0.95,
    gamma=0.9,
    n_epochs=10,
    ent_coef=0.0,
    learning_rate=1e-3,
    clip_range=0.2,
    use_sde=True,
    sde_sample_freq=4,
)
SAC_ZOO = dict(n_timesteps=20_000, learning_rate=1e-3)

# backdrive: the training env and the trainer settings (docs/learning.md).
BACKDRIVE = {
    # backdrive.optim.PENDULUM_SHAC: 8 envs, 8-step windows (64 env steps per
    # update), exploring starts, the critic fitted off-policy on every past
    # window, and 32 replayed actor steps per update through the stored
    # action Jacobians; 60 updates = 3,840 env steps. Plain dicts, written
    # to the results' JSON.
    "shac": dict(
        env=dict(PENDULUM_SHAC.env_kwargs),
        train=dict(PENDULUM_SHAC.config.changed(), algo="shac", updates=60),
    ),
    # APG has no critic: it only sees its window, so it is trained on whole
    # 200-step episodes from gymnasium's own starts, 32-step windows.
    "apg": dict(
        env=dict(num_envs=64),
        train=dict(algo="apg", updates=60, horizon=32, lr=1e-2, gamma=0.99),
    ),
}


# ----------------------------------------------------------------- evaluation
def gym_return(act) -> float:
    """Mean return of 5 deterministic episodes in gymnasium's own Pendulum-v1."""
    env = gym.make("Pendulum-v1")
    total = 0.0
    for seed in EVAL_SEEDS:
        obs, _ = env.reset(seed=seed)
        done = False
        while not done:
            obs, reward, terminated, truncated, _ = env.step(act(obs))
            total += float(reward)
            done = terminated or truncated
    env.close()
    return total / len(EVAL_SEEDS)


class Clock:
    """Training time: CPU and wall-clock seconds, with evaluations taken out."""

    def __init__(self) -> None:
        self.cpu0 = time.process_time()
        self.wall0 = time.perf_counter()
        self.paused_cpu = 0.0
        self.paused_wall = 0.0

    def now(self) -> tuple[float, float]:
        return (
            time.process_time() - self.cpu0 - self.paused_cpu,
            time.perf_counter() - self.wall0 - self.paused_wall,
        )

    def pause(self, fn):
        c, w = time.process_time(), time.perf_counter()
        out = fn()
        self.paused_cpu += time.process_time() - c
        self.paused_wall += time.perf_counter() - w
        return out


# --------------------------------------------------------------------- runs
def run_sb3(method: str, seed: int) -> list[dict]:
    from stable_baselines3 import PPO, SAC
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env

    curve: list[dict] = []
    clock = Clock()

    def evaluate(model, steps: int) -> None:
        def act(obs):
            return model.predict(obs, deterministic=True)[0]

        ret = clock.pause(lambda: gym_return(act))
        cpu, wall = clock.now()
        curve.append({"steps": steps, "cpu_s": cpu, "wall_s": wall, "return": ret})

    class Eval(BaseCallback):
        def __init__(self, every: int | None):
            super().__init__()
            self.every = every

        def _on_rollout_start(self) -> None:
            # PPO: the policy has just been updated on the previous rollout.
            if self.every is None and self.num_timesteps > 0:
                evaluate(self.model, self.num_timesteps)

        def _on_step(self) -> bool:
            if self.every is not None and self.num_timesteps % self.every == 0:
                evaluate(self.model, self.num_timesteps)
            return True

    if method == "ppo":
        hp = dict(PPO_ZOO)
        env = make_vec_env("Pendulum-v1", n_envs=hp.pop("n_envs"), seed=seed)
        total = hp.pop("n_timesteps")
        model = PPO("MlpPolicy", env, seed=seed, device="cpu", verbose=0, **hp)
        callback = Eval(None)
    else:
        hp = dict(SAC_ZOO)
        env = gym.make("Pendulum-v1")
        total = hp.pop("n_timesteps")
        model = SAC("MlpPolicy", env, seed=seed, device="cpu", verbose=0, **hp)
        callback = Eval(EVAL_EVERY_STEPS)
    clock.__init__()
    model.learn(total_timesteps=total, callback=callback)
    if not curve or curve[-1]["steps"] != model.num_timesteps:
        evaluate(model, model.num_timesteps)
    return curve


def run_backdrive(method: str, seed: int) -> list[dict]:
    cfg = BACKDRIVE[method]
    train = dict(cfg["train"])
    algo, updates = train.pop("algo"), train.pop("updates")
    curve: list[dict] = []
    clock = Clock()
    next_eval = EVAL_EVERY_STEPS

    def act(obs):
        with torch.no_grad():
            return trainer.policy(torch.as_tensor(obs, dtype=torch.float32)[None])[0].numpy()

    def on_row(row: dict) -> None:
        # Evaluate at the first update at or after each multiple of
        # EVAL_EVERY_STEPS env steps (and after the last): the steps reported
        # are the env steps actually taken by then.
        nonlocal next_eval
        if row["env_steps"] >= next_eval or row["update"] == updates:
            next_eval = (row["env_steps"] // EVAL_EVERY_STEPS + 1) * EVAL_EVERY_STEPS
            ret = clock.pause(lambda: gym_return(act))
            cpu, wall = clock.now()
            curve.append({"steps": row["env_steps"], "cpu_s": cpu, "wall_s": wall, "return": ret})

    clock.__init__()
    trainer = PolicyTrainer(Pendulum(**cfg["env"]), algo, seed=seed, **train)
    trainer.train(updates, callback=on_row)
    return curve


# ------------------------------------------------------------------ report
def summarise(curve: list[dict], threshold: float) -> dict:
    first = next((p for p in curve if p["return"] >= threshold), None)
    return {
        "threshold": threshold,
        "steps_to_threshold": None if first is None else first["steps"],
        "cpu_s_to_threshold": None if first is None else first["cpu_s"],
        "wall_s_to_threshold": None if first is None else first["wall_s"],
        "final_return": curve[-1]["return"],
        "final_steps": curve[-1]["steps"],
        "final_cpu_s": curve[-1]["cpu_s"],
    }


def fmt(x, spec: str) -> str:
    return "not reached" if x is None else format(x, spec)


def table(results: dict[str, list[dict]], label: str) -> str:
    lines = [
        f"| method | seed | steps to {label} | CPU s to {label} | wall s to {label} | final return "
        "| steps trained | CPU s trained |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for method, runs in results.items():
        for seed, run in enumerate(runs):
            s = run["summary"]
            lines.append(
                f"| {method} | {seed} | {fmt(s['steps_to_threshold'], ',')} | "
                f"{fmt(s['cpu_s_to_threshold'], '.1f')} | {fmt(s['wall_s_to_threshold'], '.1f')} | "
                f"{s['final_return']:.0f} | {s['final_steps']:,} | {s['final_cpu_s']:.1f} |"
            )
        reached = [r["summary"] for r in runs if r["summary"]["steps_to_threshold"] is not None]
        if len(runs) > 1:
            med = (
                f"{np.median([s['steps_to_threshold'] for s in reached]):,.0f} | "
                f"{np.median([s['cpu_s_to_threshold'] for s in reached]):.1f} | "
                f"{np.median([s['wall_s_to_threshold'] for s in reached]):.1f}"
                if reached
                else "- | - | -"
            )
            lines.append(
                f"| {method} | median ({len(reached)}/{len(runs)} reached) | {med} | "
                f"{np.median([r['summary']['final_return'] for r in runs]):.0f} | | |"
            )
    return "\n".join(lines)


def plot(results: dict[str, list[dict]], path: Path, title: str, threshold: float, ylabel: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    colours = {"shac": "tab:red", "apg": "tab:orange", "ppo": "tab:blue", "sac": "tab:green"}
    for method, runs in results.items():
        for i, run in enumerate(runs):
            c = run["curve"]
            kw = dict(color=colours.get(method), alpha=0.8, lw=1.4, label=method if i == 0 else None)
            axes[0].plot([p["steps"] for p in c], [p["return"] for p in c], **kw)
            axes[1].plot([p["cpu_s"] for p in c], [p["return"] for p in c], **kw)
    from matplotlib.ticker import NullFormatter

    for ax in axes:
        ax.axhline(threshold, color="grey", ls="--", lw=1)
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(NullFormatter())  # minor labels collide within one decade
        ax.grid(alpha=0.3)
    axes[0].set_xlabel("environment steps")
    axes[1].set_xlabel("training CPU seconds (one thread)")
    axes[0].set_ylabel(ylabel)
    axes[0].legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def write_outputs(results, out: Path, name: str, config: dict) -> None:
    with open(out / f"{name}_curves.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["method", "seed", "steps", "cpu_s", "wall_s", "return"])
        for method, runs in results.items():
            for seed, run in enumerate(runs):
                for p in run["curve"]:
                    w.writerow([method, seed, p["steps"], f"{p['cpu_s']:.3f}", f"{p['wall_s']:.3f}", f"{p['return']:.2f}"])
    (out / f"{name}.json").write_text(json.dumps({"config": config, "results": results}, indent=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--methods", nargs="+", choices=["shac", "apg", "ppo", "sac"],
                        default=["shac", "apg", "ppo", "sac"])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("outputs/learning"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    args.out.mkdir(parents=True, exist_ok=True)

    import stable_baselines3

    print(
        f"# pendulum: torch {torch.__version__}, gymnasium {gym.__version__}, "
        f"stable-baselines3 {stable_baselines3.__version__}, {platform.machine()}, 1 torch thread",
        flush=True,
    )
    results: dict[str, list[dict]] = {}
    for method in args.methods:
        results[method] = []
        for seed in range(args.seeds):
            run = run_backdrive if method in BACKDRIVE else run_sb3
            curve = run(method, seed)
            results[method].append({"curve": curve, "summary": summarise(curve, THRESHOLD)})
            print(f"{method} seed {seed}: {json.dumps(results[method][-1]['summary'])}", flush=True)
    config = {"ppo": PPO_ZOO, "sac": SAC_ZOO, "backdrive": BACKDRIVE, "eval_every_steps": EVAL_EVERY_STEPS}

    write_outputs(results, args.out, "pendulum", config)
    print()
    print(table(results, "-200"))
    try:
        png = args.out / "pendulum_curves.png"
        plot(results, png, "Pendulum swing-up: backdrive APG / SHAC vs Stable-Baselines3 PPO / SAC",
             THRESHOLD, "return in gymnasium Pendulum-v1 (5 episodes)")
        print(f"\nplot: {png}")
    except ImportError:
        print("\n(matplotlib not installed: no plot)")


if __name__ == "__main__":
    main()
