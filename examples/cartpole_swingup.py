"""Swing the cart-pole up from hanging to upright by trajectory optimisation.

The shipped cart-pole (Barto, Sutton and Anderson's numbers: 1 kg cart, 0.1 kg
and 1 m pole, 10 N force limit, 2.4 m track) starts hanging at rest. Only the
cart is pushed; its force saturates smoothly at 10 N and the track ends are
soft spring-dampers. Fifty forces over 2.5 s (semi-implicit Euler, dt 0.05 s)
are optimised through the simulator by Gauss-Newton (Levenberg-Marquardt with
the Jacobian from autograd) so that the pole ends upright with the cart
centred and at rest, using small forces.

    python examples/cartpole_swingup.py           # about a minute
    python examples/cartpole_swingup.py --quick   # fewer iterations
    python examples/cartpole_swingup.py --optimizer lbfgs

The figure goes to ``outputs/examples/cartpole_swingup.png``.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import torch

from backdrive.optim import cartpole_swingup


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer iterations")
    parser.add_argument("--optimizer", default="gauss_newton", choices=["gauss_newton", "lbfgs", "adam"])
    parser.add_argument("--iterations", type=int, default=None)
    parser.add_argument("--out", type=Path, default=Path("outputs/examples"))
    args = parser.parse_args()
    torch.set_num_threads(1)  # tiny tensors: threads only add overhead

    run = cartpole_swingup(quick=args.quick, optimizer=args.optimizer, iterations=args.iterations, progress=None)
    print(run.summary())
    print("success (within 0.1 rad of upright, speed < 0.5):", run.success)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    traj = run.result.trajectory
    t = traj.time.numpy()
    x = traj.q[:, 0].numpy()
    theta = traj.q[:, 1].numpy()
    fig = plt.figure(figsize=(14, 7))
    ax = fig.add_subplot(2, 3, 1)
    ax.plot(t, x)
    ax.set_ylabel("cart position (m)")
    ax.set_xlabel("time (s)")
    ax = fig.add_subplot(2, 3, 2)
    ax.plot(t, theta)
    ax.axhline(0.0, color="k", ls=":")
    ax.axhline(2 * math.pi, color="k", ls=":")
    ax.axhline(-2 * math.pi, color="k", ls=":")
    ax.set_ylabel("pole angle (rad, 0 = upright)")
    ax.set_xlabel("time (s)")
    ax = fig.add_subplot(2, 3, 3)
    ax.step(t[:-1], traj.effort[:, 0].numpy(), where="post")
    ax.axhline(10, color="r", ls=":")
    ax.axhline(-10, color="r", ls=":")
    ax.set_ylabel("force on the cart (N)")
    ax.set_xlabel("time (s)")
    ax = fig.add_subplot(2, 3, 4)
    ax.semilogy(run.result.losses)
    ax.set_xlabel(f"iteration ({run.result.optimizer})")
    ax.set_ylabel("loss")
    ax = fig.add_subplot(2, 3, (5, 6))
    frames = range(0, len(t), 5)
    for k, i in enumerate(frames):
        shade = 0.25 + 0.75 * k / max(len(frames) - 1, 1)
        tip = (x[i] + math.sin(theta[i]), math.cos(theta[i]))
        ax.plot([x[i], tip[0]], [0.0, tip[1]], color=(0.8 * shade, 0.5 * shade, 0.2), lw=2)
        ax.add_patch(plt.Rectangle((x[i] - 0.2, -0.1), 0.4, 0.2, fill=False, ec=(0.2, 0.4, 0.75, shade)))
    ax.axhline(-0.12, color="grey")
    ax.set_aspect("equal")
    ax.set_title("every 0.25 s, dark (start) to light (end)")
    fig.tight_layout()
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "cartpole_swingup.png"
    fig.savefig(path, dpi=110)
    print(f"figure: {path}")


if __name__ == "__main__":
    main()
