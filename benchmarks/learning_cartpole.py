"""Cart-pole swing-up on backdrive's dynamics: SHAC and APG against Stable-Baselines3 PPO.

All three methods train on the same system, ``backdrive.envs.CartPoleSwingUp``
(the shipped cart-pole URDF on backdrive's rigid-body dynamics, 240 steps of
0.05 s from hanging):

* SB3 PPO through ``to_sb3_vec_env``: one batched backdrive env of 16 copies
  behind an SB3 ``VecEnv`` (one torch call per step for all copies), with
  ``VecNormalize`` and the rl-baselines3-zoo PPO settings of the closest zoo
  env, ``InvertedPendulumSwingupBulletEnv-v0`` (no zoo entry exists for this
  one), for 300k steps.
* backdrive SHAC and APG through the env's gradients (``train_policy``), with
  "exploring starts" in training: every pole angle, cart within 0.5 m,
  speeds up to 1 m/s and 2 rad/s, 100-step episodes.

Every method is evaluated the same way, on a fixed interval of environment
steps: 8 deterministic swing-ups from hanging (240 steps, reset seed 123).
Reported: environment steps (every env transition counts, ``num_envs *
horizon`` per backdrive update) and CPU seconds of training until the
evaluated mean return first reaches PPO's final return and until the policy
first balances (the pole within 0.2 rad of upright in at least 90% of the
last 50 steps of the 8 episodes), the final return and upright fraction.
Seconds are the training process's CPU time (``time.process_time``, one torch
thread, evaluations excluded), which a loaded machine disturbs less than
wall-clock time; wall-clock seconds are in the CSV too.

    python benchmarks/learning_cartpole.py                       # 1 seed, ~8 min
    python benchmarks/learning_cartpole.py --methods shac apg    # without PPO (bar 0)
    python benchmarks/learning_cartpole.py --seeds 3

Outputs (``--out``, default ``outputs/learning``): ``cartpole_curves.csv``
(every evaluation), ``cartpole.json`` (settings and results) and
``cartpole_curves.png``. Needs the ``bench`` (or ``rl``) extra (gymnasium,
stable-baselines3) and matplotlib for the plot.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import platform
from pathlib import Path

import numpy as np
import torch

from backdrive.envs import CartPoleSwingUp, to_sb3_vec_env
# The clock (evaluations taken out), the formatting and the two-panel plot of
# the Pendulum comparison; this file's folder is on sys.path when it runs.
from learning import Clock, fmt, plot  # noqa: E402
from backdrive.optim import CARTPOLE_SHAC, train_policy

EVAL_EPISODES, EVAL_SEED = 8, 123
UPRIGHT_RAD, LAST_STEPS, BALANCED = 0.2, 50, 0.9

# rl-baselines3-zoo hyperparams/ppo.yml, "InvertedPendulumSwingupBulletEnv-v0":
# normalize, gamma 0.99, gae 0.95, 10 epochs, batch 64, lr 2.5e-4, clip 0.2;
# 16 envs x 1024 steps per rollout and 300k steps (the zoo runs 2M).
PPO = dict(
    n_envs=16,
    n_timesteps=300_000,
    n_steps=1024,
    batch_size=64,
    gae_lambda=0.95,
    gamma=0.99,
    n_epochs=10,
    ent_coef=0.0,
    learning_rate=2.5e-4,
    clip_range=0.2,
)
# backdrive.optim.CARTPOLE_SHAC: exploring starts (every pole angle, 100-step
# episodes) and 20-step windows (1 s): longer ones (32 steps, 1.6 s)
# back-propagate through too much of the unstable upright equilibrium (x1.22
# per step) and did not learn to balance. SHAC with gamma 0.95 (a 1 s value
# horizon) and a light critic fit; with gamma 0.99 the critic's value
# dominated the window and the policy did not balance either. APG: the same
# windows and learning rate, gamma 0.99, no critic. Plain dicts, written to
# the results' JSON.
_SHAC = CARTPOLE_SHAC.config
BACKDRIVE = {
    "shac": dict(
        env=dict(CARTPOLE_SHAC.env_kwargs),
        train=dict(_SHAC.changed(), algo="shac", updates=CARTPOLE_SHAC.updates),
        eval_every=10,
    ),
    "apg": dict(
        env=dict(CARTPOLE_SHAC.env_kwargs),
        train=dict(
            {k: getattr(_SHAC, k) for k in ("horizon", "lr", "lr_decay_updates", "action_noise")},
            updates=CARTPOLE_SHAC.updates,
            algo="apg",
            gamma=0.99,
        ),
        eval_every=10,
    ),
}


@torch.no_grad()
def evaluate(act) -> tuple[float, float]:
    """Mean return of the swing-ups from hanging and the upright fraction of their last 50 steps."""
    env = CartPoleSwingUp(EVAL_EPISODES, autoreset=False)
    obs = env.reset(seed=EVAL_SEED)
    total = torch.zeros(EVAL_EPISODES, dtype=torch.float64)
    upright = []
    for _ in range(env.max_episode_steps):
        obs, reward, *_ = env.step(act(obs))
        total += reward.double()
        upright.append(env.state[:, 1].abs() < UPRIGHT_RAD)
    return float(total.mean()), float(torch.stack(upright[-LAST_STEPS:]).double().mean())


def run_ppo(seed: int) -> list[dict]:
    from stable_baselines3 import PPO as SB3PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.vec_env import VecNormalize

    hp = dict(PPO)
    venv = VecNormalize(to_sb3_vec_env(CartPoleSwingUp(hp.pop("n_envs"))), gamma=hp["gamma"])
    total = hp.pop("n_timesteps")
    model = SB3PPO("MlpPolicy", venv, seed=seed, device="cpu", verbose=0, **hp)
    curve: list[dict] = []
    clock = Clock()

    def act(obs):
        return torch.as_tensor(model.predict(venv.normalize_obs(obs.numpy()), deterministic=True)[0])

    def record(steps: int) -> None:
        ret, up = clock.pause(lambda: evaluate(act))
        cpu, wall = clock.now()
        curve.append({"steps": steps, "cpu_s": cpu, "wall_s": wall, "return": ret, "upright": up})

    class Eval(BaseCallback):
        def _on_rollout_start(self) -> None:
            if self.num_timesteps > 0:
                record(self.num_timesteps)

        def _on_step(self) -> bool:
            return True

    clock.__init__()
    model.learn(total_timesteps=total, callback=Eval())
    record(model.num_timesteps)
    return curve


def run_backdrive(method: str, seed: int) -> list[dict]:
    cfg = BACKDRIVE[method]
    curve: list[dict] = []
    clock = Clock()
    last = {}

    def eval_fn(policy) -> float:
        last["return"], last["upright"] = clock.pause(lambda: evaluate(policy))
        return last["return"]

    def on_row(row: dict) -> None:
        if not math.isnan(row["eval_return"]):
            cpu, wall = clock.now()
            curve.append({"steps": row["env_steps"], "cpu_s": cpu, "wall_s": wall, **last})

    clock.__init__()
    train_policy(CartPoleSwingUp(**cfg["env"]), seed=seed, eval_fn=eval_fn, eval_every=cfg["eval_every"],
                 callback=on_row, num_threads=1, **cfg["train"])
    return curve


def summarise(curve: list[dict], threshold: float) -> dict:
    first = next((p for p in curve if p["return"] >= threshold), None)
    bal = next((p for p in curve if p["upright"] >= BALANCED), None)
    return {
        "threshold": threshold,
        "steps_to_threshold": None if first is None else first["steps"],
        "cpu_s_to_threshold": None if first is None else first["cpu_s"],
        "steps_to_balanced": None if bal is None else bal["steps"],
        "cpu_s_to_balanced": None if bal is None else bal["cpu_s"],
        "final_return": curve[-1]["return"],
        "final_upright": curve[-1]["upright"],
        "final_steps": curve[-1]["steps"],
        "final_cpu_s": curve[-1]["cpu_s"],
    }


def table(results: dict[str, list[dict]], threshold: float) -> str:
    lines = [
        f"| method | seed | steps to {threshold:.0f} | CPU s to {threshold:.0f} | steps to balanced | CPU s to balanced "
        "| final return | final upright (last 50 steps) | steps trained | CPU s trained |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for method, runs in results.items():
        for seed, run in enumerate(runs):
            s = run["summary"]
            lines.append(
                f"| {method} | {seed} | {fmt(s['steps_to_threshold'], ',')} | {fmt(s['cpu_s_to_threshold'], '.1f')} | "
                f"{fmt(s['steps_to_balanced'], ',')} | {fmt(s['cpu_s_to_balanced'], '.1f')} | "
                f"{s['final_return']:.0f} | {s['final_upright'] * 100:.0f}% | {s['final_steps']:,} | {s['final_cpu_s']:.1f} |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--methods", nargs="+", choices=["ppo", "shac", "apg"], default=["ppo", "shac", "apg"])
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("outputs/learning"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    args.out.mkdir(parents=True, exist_ok=True)

    import gymnasium
    import stable_baselines3

    print(f"# cartpole: torch {torch.__version__}, gymnasium {gymnasium.__version__}, "
          f"stable-baselines3 {stable_baselines3.__version__}, {platform.machine()}, 1 torch thread", flush=True)
    curves = {}
    for m in args.methods:
        curves[m] = []
        for s in range(args.seeds):
            curves[m].append(run_ppo(s) if m == "ppo" else run_backdrive(m, s))
            last = curves[m][-1][-1]
            print(f"{m} seed {s}: final return {last['return']:.1f}, upright {last['upright']:.2f}, "
                  f"{last['steps']:,} steps, {last['cpu_s']:.1f} CPU s", flush=True)
    # The bar: PPO's final return (mean over its seeds), or 0 without PPO.
    threshold = float(np.mean([c[-1]["return"] for c in curves["ppo"]])) if "ppo" in curves else 0.0
    results = {m: [{"curve": c, "summary": summarise(c, threshold)} for c in cs] for m, cs in curves.items()}

    with open(args.out / "cartpole_curves.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["method", "seed", "steps", "cpu_s", "wall_s", "return", "upright"])
        for m, runs in results.items():
            for s, run in enumerate(runs):
                for p in run["curve"]:
                    w.writerow([m, s, p["steps"], f"{p['cpu_s']:.3f}", f"{p['wall_s']:.3f}", f"{p['return']:.2f}",
                                f"{p['upright']:.3f}"])
    config = {"ppo": PPO, "backdrive": BACKDRIVE, "eval": dict(episodes=EVAL_EPISODES, seed=EVAL_SEED)}
    (args.out / "cartpole.json").write_text(json.dumps({"config": config, "results": results}, indent=1))
    print()
    print(table(results, threshold))
    try:
        png = args.out / "cartpole_curves.png"
        plot(results, png, "Cart-pole swing-up (backdrive dynamics): SHAC / APG vs Stable-Baselines3 PPO",
             threshold, f"return from hanging, 240 steps ({EVAL_EPISODES} episodes)")
        print(f"\nplot: {png}")
    except ImportError:
        print("\n(matplotlib not installed: no plot)")


if __name__ == "__main__":
    main()
