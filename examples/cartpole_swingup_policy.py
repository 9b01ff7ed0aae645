"""Learn a cart-pole swing-up policy through backdrive's rigid-body dynamics (SHAC).

``backdrive.envs.CartPoleSwingUp`` simulates the shipped ``cartpole`` URDF
with ``backdrive.sim.Simulator`` (semi-implicit Euler, soft track limits);
every step is differentiable, so SHAC back-propagates the return of short
windows (20 steps, 1 s; plus a learned critic's value of where they end)
into the policy. Training uses exploring starts (every pole angle, 100-step
episodes); the evaluation starts hanging down and runs the full 240 steps
(12 s). Hanging still scores -240; swinging up in about 3 s and balancing
the rest of the episode scores about +150.

    python examples/cartpole_swingup_policy.py               # ~2-3 min on one thread
    python examples/cartpole_swingup_policy.py --algo apg    # APG, same windows

Prints the mean return of 16 test swing-ups from hanging and the fraction of
their last 50 steps with the pole within 0.2 rad of upright. Writes to
``outputs/examples/``: ``cartpole_swingup_policy.png`` (learning curve, pole
angle, cart position and force of the test swing-ups), the CSV log, the
checkpoint and a browser preview (``cartpole_swingup_policy.html``, with the
``viz`` extra).
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import torch

from backdrive.envs import CartPoleSwingUp
from backdrive.optim import CARTPOLE_SHAC, evaluate_policy, load_policy, train_policy

# backdrive.optim.CARTPOLE_SHAC (as in benchmarks/learning_cartpole.py):
# 20-step windows, SHAC with gamma 0.95 and a light critic fit; APG ignores the
# critic settings and uses gamma 0.99.
GAMMA = {"shac": 0.95, "apg": 0.99}
TEST_EPISODES, TEST_SEED = 16, 999


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algo", choices=["shac", "apg"], default="shac")
    parser.add_argument("--updates", type=int, default=CARTPOLE_SHAC.updates)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("outputs/examples"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    torch.set_num_threads(1)
    eval_env = CartPoleSwingUp(8, autoreset=False)  # hanging starts, 240 steps
    log = args.out / f"cartpole_{args.algo}.csv"
    log.unlink(missing_ok=True)
    ckpt = args.out / f"cartpole_{args.algo}.pt"
    cpu0 = time.process_time()
    trainer = train_policy(
        CARTPOLE_SHAC.make_env(),
        args.algo,
        preset=CARTPOLE_SHAC,
        updates=args.updates,
        gamma=GAMMA[args.algo],
        lr_decay_updates=max(1, round(args.updates * 4 / 3)),
        seed=args.seed,
        eval_fn=lambda p: evaluate_policy(p, eval_env, seed=123),
        eval_every=10,
        log_csv=log,
        checkpoint=ckpt,
        progress=True,
        num_threads=1,
    )
    cpu = time.process_time() - cpu0
    policy = load_policy(ckpt)
    print(f"{args.algo}: {trainer.updates_done} updates, {trainer.env_steps:,} env steps, "
          f"{trainer.wall_s:.1f} s wall ({cpu:.1f} s CPU with evaluations)")

    env = CartPoleSwingUp(TEST_EPISODES, autoreset=False)
    env.reset(seed=TEST_SEED)
    states, forces, total = [env.state.clone()], [], torch.zeros(TEST_EPISODES, dtype=torch.float64)
    with torch.no_grad():
        obs = env.observation()
        for _ in range(env.max_episode_steps):
            action = policy(obs)
            obs, reward, *_ = env.step(action)
            total += reward.double()
            states.append(env.state.clone())
            forces.append(action[:, 0].clamp(-env.max_force, env.max_force))
    states, forces = torch.stack(states), torch.stack(forces)  # (241, N, 4), (240, N)
    upright = states[1:, :, 1].abs() < 0.2
    up_at = torch.where(upright.any(0), upright.double().argmax(0).double(), torch.full((TEST_EPISODES,), math.nan))
    first_up = "never" if bool(up_at.isnan().all()) else f"after {float(up_at.nanmedian()) * env.dt:.1f} s (median)"
    print(f"{TEST_EPISODES} test swing-ups from hanging (240 steps, best possible < 240): mean return "
          f"{float(total.mean()):.1f} (min {float(total.min()):.1f}); pole within 0.2 rad of upright in "
          f"{float(upright[-50:].double().mean()) * 100:.0f}% of the last 50 steps "
          f"({float(upright.double().mean()) * 100:.0f}% of the episode), first upright {first_up}; "
          f"mean |x| over the last 50 steps {float(states[-50:, :, 0].abs().mean()):.2f} m")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in trainer.history if r["eval_return"] == r["eval_return"]]
    t = [i * env.dt for i in range(len(states))]
    show = 4  # test episodes in the plots
    fig, axes = plt.subplots(1, 4, figsize=(18, 4))
    axes[0].plot([r["env_steps"] for r in rows], [r["eval_return"] for r in rows], marker=".")
    axes[0].set_xlabel("environment steps")
    axes[0].set_ylabel("return from hanging (240 steps, 8 episodes)")
    axes[0].set_title(f"{args.algo.upper()} learning curve")
    axes[0].ticklabel_format(axis="x", style="sci", scilimits=(0, 0))
    axes[1].plot(t, states[:, :show, 1].numpy(), lw=1)
    axes[1].set_ylabel("pole angle from upright, rad")
    axes[2].plot(t, states[:, :show, 0].numpy(), lw=1)
    axes[2].set_ylabel("cart position, m")
    axes[3].plot(t[1:], forces[:, :1].numpy(), lw=1)
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

        page = preview(env.robot.double(), states[:, 0, :2].double(), path=args.out / "cartpole_swingup_policy.html",
                       fps=1 / env.dt, title=f"Cart-pole swing-up learnt with {args.algo.upper()}")
        print(f"preview: {page}")
    except ImportError as exc:  # the viz extra is optional
        print(f"(no browser preview: {exc})")


if __name__ == "__main__":
    main()
