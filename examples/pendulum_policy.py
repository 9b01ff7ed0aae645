"""Learn a pendulum swing-up policy by back-propagating through the simulator (SHAC).

``backdrive.envs.Pendulum`` is gymnasium's ``Pendulum-v1`` (same dynamics and
reward, batched, differentiable). SHAC rolls 8 pendulums forward 8 steps,
differentiates the return plus a learned critic's value of the final states
with respect to the policy, and takes one Adam step; the critic is refitted
on every window so far, and the actor takes 32 more steps on replayed
transitions through their stored action Jacobians (no new environment
steps). 40 such updates (2,560 environment steps; about 1,000 already reach
-200) give a policy that swings the pendulum up from any start
(``backdrive.optim.PENDULUM_SHAC``). Training uses "exploring starts"
(initial speeds up to 8 rad/s, 8-step episodes); the evaluation does not: it
runs the plain Pendulum-v1 start distribution, here in backdrive and, when
gymnasium is installed, in gymnasium's own ``Pendulum-v1`` (5 episodes,
seeds 1000-1004, as the benchmark).

    python examples/pendulum_policy.py            # ~10 s of CPU on one thread
    python examples/pendulum_policy.py --algo apg

Writes to ``outputs/examples/``: the learning curve and swing-up plots
(``pendulum_policy.png``), the CSV log, the checkpoint and a browser preview
of one swing-up (``pendulum_policy.html``, with the ``viz`` extra).
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import torch

from backdrive.envs import Pendulum, angle_normalize
from backdrive.optim import PENDULUM_APG, PENDULUM_SHAC, evaluate_policy, load_policy, train_policy

# Presets: the env to build (exploring starts), the settings and the run length.
PRESETS = {"shac": PENDULUM_SHAC, "apg": PENDULUM_APG}


def gymnasium_return(policy) -> float | None:
    try:
        import gymnasium as gym
    except ImportError:
        return None
    env = gym.make("Pendulum-v1")
    total = 0.0
    for seed in range(1000, 1005):
        obs, _ = env.reset(seed=seed)
        done = False
        while not done:
            with torch.no_grad():
                action = policy(torch.as_tensor(obs)[None])[0].numpy()
            obs, reward, terminated, truncated, _ = env.step(action)
            total += float(reward)
            done = terminated or truncated
    return total / 5


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algo", choices=sorted(PRESETS), default="shac")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("outputs/examples"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    preset = PRESETS[args.algo]

    eval_env = Pendulum(16, autoreset=False)  # the plain Pendulum-v1 start distribution
    log = args.out / f"pendulum_{args.algo}.csv"
    log.unlink(missing_ok=True)
    ckpt = args.out / f"pendulum_{args.algo}.pt"
    cpu0 = time.process_time()
    trainer = train_policy(
        preset.make_env(),
        preset=preset,
        seed=args.seed,
        eval_fn=lambda p: evaluate_policy(p, eval_env, seed=123),
        eval_every=5,
        log_csv=log,
        checkpoint=ckpt,
        progress=True,
        num_threads=1,
    )
    cpu = time.process_time() - cpu0
    policy = load_policy(ckpt)
    final = evaluate_policy(policy, eval_env, seed=123)
    print(f"{args.algo}: {trainer.updates_done} updates, {trainer.env_steps:,} env steps, "
          f"{trainer.wall_s:.1f} s wall ({cpu:.1f} s CPU with evaluations)")
    print(f"mean return over 16 backdrive Pendulum episodes: {final:.1f}")
    g = gymnasium_return(policy)
    if g is not None:
        print(f"mean return over 5 gymnasium Pendulum-v1 episodes: {g:.1f} (solved: >= -200)")

    # Swing-ups from the bottom and from random starts, for the plot and the preview.
    env = Pendulum(4, dtype=torch.float32, autoreset=False)
    env.reset(seed=5)
    env.set_state(torch.tensor([[math.pi, 0.0], [math.pi - 0.3, 0.5], [1.5, -1.0], [-2.5, 0.8]]))
    angles, torques = [env.state[:, 0].clone()], []
    with torch.no_grad():
        obs = env.observation()
        for _ in range(env.max_episode_steps):
            action = policy(obs)
            obs, *_ = env.step(action)
            angles.append(env.state[:, 0].clone())
            torques.append(action[:, 0].clamp(-2, 2))
    angles = angle_normalize(torch.stack(angles))
    torques = torch.stack(torques)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in trainer.history if r["eval_return"] == r["eval_return"]]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    axes[0].plot([r["env_steps"] for r in rows], [r["eval_return"] for r in rows], marker=".")
    axes[0].axhline(-200, color="grey", ls="--", lw=1)
    axes[0].set_xlabel("environment steps")
    axes[0].set_ylabel("mean return (16 episodes)")
    axes[0].set_title(f"{args.algo.upper()} learning curve")
    t = [i * env.dt for i in range(len(angles))]
    for i in range(angles.shape[1]):
        axes[1].plot(t, angles[:, i].numpy())
        axes[2].plot(t[1:], torques[:, i].numpy())
    axes[1].set_xlabel("time, s")
    axes[1].set_ylabel("angle from upright, rad")
    axes[1].set_title("learned swing-ups")
    axes[2].set_xlabel("time, s")
    axes[2].set_ylabel("torque, N m")
    axes[2].set_title("torques (limit 2 N m)")
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(args.out / "pendulum_policy.png", dpi=80)
    print(f"plots: {args.out / 'pendulum_policy.png'}")

    try:
        from backdrive.data import load
        from backdrive.viz import preview

        # The shipped pendulum hangs at q = 0; gymnasium's angle is 0 upright.
        q = (angles[:, 0] + math.pi)[:, None].double()
        page = preview(load("pendulum"), q, path=args.out / "pendulum_policy.html", fps=1 / env.dt,
                       title="Pendulum swing-up learnt with SHAC")
        print(f"preview: {page}")
    except ImportError as exc:  # the viz extra is optional
        print(f"(no browser preview: {exc})")


if __name__ == "__main__":
    main()
