"""Learn a reaching policy for the Panda through backdrive's rigid-body dynamics (APG).

``backdrive.envs.PandaReach`` simulates the shipped Panda under gravity with
a PD position servo on every joint (gravity-compensated, effort-limited),
one implicit 0.05 s dynamics step per control period. The policy maps the
joint state, the tool centre point (TCP) and the vector to a random target
point to 7 joint targets; APG back-propagates the reward (minus the TCP's
distance to the target, minus a small joint-speed penalty) through windows
of 25 steps of the dynamics and the forward kinematics. An episode is 50
steps (2.5 s) from near the home pose to a target drawn uniformly in a
0.35 x 0.7 x 0.5 m box in front of the robot.

    python examples/panda_reach_policy.py               # ~1-2 min on one thread
    python examples/panda_reach_policy.py --updates 30  # shorter

Prints the mean distance to the target at the start and at the end of 64
evaluation episodes (targets never seen in training) and the success rate
(final distance under 5 cm). Writes to ``outputs/examples/``:
``panda_reach_policy.png`` (learning curve, distance over an episode, TCP
paths), the CSV log, the checkpoint and a browser preview
(``panda_reach_policy.html``, four reaches in a row, with the ``viz`` extra).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from backdrive.envs import PandaReach
from backdrive.optim import PANDA_REACH_APG, load_policy, train_policy

# PANDA_REACH_APG: 32 arms (50-step episodes, implicit 0.05 s steps),
# 25-step windows, lr 3e-3, gamma 0.99, 60 updates.
EVAL_EPISODES, EVAL_SEED, SUCCESS_M = 64, 999, 0.05


@torch.no_grad()
def rollout(policy, env: PandaReach, seed: int):
    """States ``(T + 1, N, 19)`` of one episode per copy, from ``env.reset(seed)``."""
    obs = env.reset(seed=seed)
    states = [env.state.clone()]
    for _ in range(env.max_episode_steps):
        obs, *_ = env.step(policy(obs))
        states.append(env.state.clone())
    return torch.stack(states)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algo", choices=["shac", "apg"], default="apg")
    parser.add_argument("--updates", type=int, default=PANDA_REACH_APG.updates)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("outputs/examples"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)

    eval_env = PandaReach(16, autoreset=False)
    curve: list[tuple[int, float]] = []  # (env steps, mean final distance) per evaluation
    last_distance = [float("nan")]

    def eval_fn(policy) -> float:
        states = rollout(policy, eval_env, seed=123)
        last_distance[0] = float(eval_env.distance(states[-1]).mean())
        rewards = [eval_env.reward(a, None, b) for a, b in zip(states[:-1], states[1:])]
        return float(torch.stack(rewards).sum(0).mean())

    def on_row(row: dict) -> None:
        if row["eval_return"] == row["eval_return"]:
            curve.append((row["env_steps"], last_distance[0]))

    log = args.out / f"panda_reach_{args.algo}.csv"
    log.unlink(missing_ok=True)
    ckpt = args.out / f"panda_reach_{args.algo}.pt"
    cpu0 = time.process_time()
    trainer = train_policy(
        PANDA_REACH_APG.make_env(),
        args.algo,
        preset=PANDA_REACH_APG,
        updates=args.updates,
        seed=args.seed,
        eval_fn=eval_fn,
        eval_every=5,
        log_csv=log,
        checkpoint=ckpt,
        callback=on_row,
        progress=True,
        num_threads=1,
    )
    cpu = time.process_time() - cpu0
    policy = load_policy(ckpt)
    print(f"{args.algo}: {trainer.updates_done} updates, {trainer.env_steps:,} env steps, "
          f"{trainer.wall_s:.1f} s wall ({cpu:.1f} s CPU with evaluations)")

    env = PandaReach(EVAL_EPISODES, autoreset=False)
    states = rollout(policy, env, seed=EVAL_SEED)
    dist = env.distance(states)  # (T + 1, N)
    final = dist[-1]
    print(f"{EVAL_EPISODES} test episodes: mean distance to target {float(dist[0].mean()):.3f} m at the start, "
          f"{float(final.mean()) * 100:.1f} cm after {env.max_episode_steps * env.dt:.1f} s "
          f"(median {float(final.median()) * 100:.1f} cm, worst {float(final.max()) * 100:.1f} cm); "
          f"within {SUCCESS_M * 100:.0f} cm: {float((final < SUCCESS_M).double().mean()) * 100:.0f}%; "
          f"after 1 s: {float(dist[round(1 / env.dt)].mean()) * 100:.1f} cm")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [i * env.dt for i in range(dist.shape[0])]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    axes[0].plot([s for s, _ in curve], [d * 100 for _, d in curve], marker=".")
    axes[0].set_xlabel("environment steps")
    axes[0].set_ylabel("final distance to target, cm (16 episodes)")
    axes[0].set_yscale("log")
    axes[0].set_title(f"{args.algo.upper()} learning curve")
    axes[1].plot(t, dist.numpy() * 100, color="tab:blue", alpha=0.15, lw=0.8)
    axes[1].plot(t, dist.mean(1).numpy() * 100, color="k", lw=2, label="mean")
    axes[1].axhline(SUCCESS_M * 100, color="grey", ls="--", lw=1, label=f"{SUCCESS_M * 100:.0f} cm")
    axes[1].set_xlabel("time, s")
    axes[1].set_ylabel("distance to target, cm")
    axes[1].set_title(f"{EVAL_EPISODES} test episodes")
    axes[1].legend()
    tcp = env.tcp_position(states[..., :8])  # (T + 1, N, 3)
    for i in range(12):
        line = axes[2].plot(tcp[:, i, 0].numpy(), tcp[:, i, 2].numpy(), lw=1)[0]
        axes[2].plot(float(states[0, i, 16]), float(states[0, i, 18]), "x", color=line.get_color(), ms=8)
        axes[2].plot(float(tcp[0, i, 0]), float(tcp[0, i, 2]), ".", color=line.get_color(), ms=6,
                     label="start (near home)" if i == 0 else None)
    axes[2].set_xlabel("x, m")
    axes[2].set_ylabel("z, m")
    axes[2].set_aspect("equal")
    axes[2].set_title("TCP paths of 12 test episodes (side view), x = target")
    axes[2].legend()
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(args.out / "panda_reach_policy.png", dpi=80)
    print(f"plots: {args.out / 'panda_reach_policy.png'}")

    try:
        from backdrive.viz import preview

        show = range(4)
        q = torch.cat([states[:, i, :8] for i in show]).double()
        page = preview(env.robot.double(), q, targets=states[0, list(show), 16:].double(),
                       paths="panda_hand_tcp", path=args.out / "panda_reach_policy.html", fps=1 / env.dt,
                       title=f"Panda reaching 4 random targets, policy learnt with {args.algo.upper()}")
        print(f"preview: {page}")
    except ImportError as exc:  # the viz extra is optional
        print(f"(no browser preview: {exc})")


if __name__ == "__main__":
    main()
