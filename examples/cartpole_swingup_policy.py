"""Learn a cart-pole swing-up policy through backdrive's rigid-body dynamics (SHAC).

``backdrive.envs.CartPoleSwingUp`` simulates the shipped ``cartpole`` URDF
with ``backdrive.sim.Simulator`` (semi-implicit Euler, soft track limits);
every step is differentiable, so SHAC back-propagates the return of short
windows (plus a learned critic's value of where they end) into the policy.
Training uses exploring starts (every pole angle, 100-step episodes); the
evaluation starts hanging down and runs the full 240 steps (12 s). Hanging
still scores -240; a return near 200 would mean the pole is up and balanced
most of the episode. This one is not solved yet: see README_policy.md.

    python examples/cartpole_swingup_policy.py               # ~3 min on one thread
    python examples/cartpole_swingup_policy.py --updates 60  # shorter

Writes to ``outputs/examples/``: ``cartpole_swingup_policy.png`` (learning
curve, pole angle, cart position and force of the learnt swing-up), the CSV
log, the checkpoint and a browser preview (``cartpole_swingup_policy.html``,
with the ``viz`` extra).
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import torch

from backdrive.envs import CartPoleSwingUp
from backdrive.optim._policy import evaluate_policy, load_policy, train_policy

TRAIN_ENV = dict(num_envs=64, init_noise=(0.5, math.pi, 1.0, 2.0), max_episode_steps=100)
TRAIN = dict(
    horizon=32,
    lr=2e-3,
    critic_lr=2e-3,
    gamma=0.99,
    reward_scale=0.1,
    action_noise=0.1,
    critic_iterations=8,
    critic_minibatches=4,
    critic_replay=4,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algo", choices=["shac", "apg"], default="shac")
    parser.add_argument("--updates", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("outputs/examples"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    eval_env = CartPoleSwingUp(4, autoreset=False)  # hanging starts, 240 steps
    log = args.out / f"cartpole_{args.algo}.csv"
    log.unlink(missing_ok=True)
    ckpt = args.out / f"cartpole_{args.algo}.pt"
    cpu0 = time.process_time()
    trainer = train_policy(
        CartPoleSwingUp(**TRAIN_ENV),
        args.algo,
        updates=args.updates,
        lr_decay_updates=max(1, round(args.updates * 4 / 3)),
        seed=args.seed,
        eval_fn=lambda p: evaluate_policy(p, eval_env, seed=123),
        eval_every=10,
        log_csv=log,
        checkpoint=ckpt,
        progress=True,
        num_threads=1,
        **TRAIN,
    )
    cpu = time.process_time() - cpu0
    policy = load_policy(ckpt)
    final = evaluate_policy(policy, eval_env, seed=123)
    print(f"{args.algo}: {trainer.updates_done} updates, {trainer.env_steps:,} env steps, "
          f"{trainer.wall_s:.1f} s wall ({cpu:.1f} s CPU with evaluations)")
    print(f"mean return of 4 swing-ups from hanging (240 steps, best possible < 240): {final:.1f}")

    env = CartPoleSwingUp(1, autoreset=False)
    env.reset(seed=7)
    states, forces = [env.state[0].clone()], []
    with torch.no_grad():
        obs = env.observation()
        for _ in range(env.max_episode_steps):
            action = policy(obs)
            obs, *_ = env.step(action)
            states.append(env.state[0].clone())
            forces.append(float(action[0, 0].clamp(-env.max_force, env.max_force)))
    states = torch.stack(states)
    upright = (states[:, 1].abs() < 0.2).float()
    print(f"time upright (|theta| < 0.2 rad): {float(upright.mean()) * 100:.0f}% of the episode, "
          f"final |theta| {abs(float(states[-1, 1])):.3f} rad, final x {float(states[-1, 0]):.2f} m")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in trainer.history if r["eval_return"] == r["eval_return"]]
    t = [i * env.dt for i in range(len(states))]
    fig, axes = plt.subplots(1, 4, figsize=(18, 4))
    axes[0].plot([r["env_steps"] for r in rows], [r["eval_return"] for r in rows], marker=".")
    axes[0].set_xlabel("environment steps")
    axes[0].set_ylabel("return from hanging (240 steps)")
    axes[0].set_title(f"{args.algo.upper()} learning curve")
    axes[1].plot(t, states[:, 1].numpy())
    axes[1].set_ylabel("pole angle from upright, rad")
    axes[2].plot(t, states[:, 0].numpy())
    axes[2].set_ylabel("cart position, m")
    axes[3].plot(t[1:], forces)
    axes[3].set_ylabel("force, N")
    for ax in axes[1:]:
        ax.set_xlabel("time, s")
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(args.out / "cartpole_swingup_policy.png", dpi=80)
    print(f"plots: {args.out / 'cartpole_swingup_policy.png'}")

    try:
        from backdrive.viz import preview

        page = preview(env.robot.double(), states[:, :2].double(), path=args.out / "cartpole_swingup_policy.html",
                       fps=1 / env.dt, title=f"Cart-pole swing-up learnt with {args.algo.upper()}")
        print(f"preview: {page}")
    except ImportError as exc:  # the viz extra is optional
        print(f"(no browser preview: {exc})")


if __name__ == "__main__":
    main()
