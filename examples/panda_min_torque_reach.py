"""Move the Panda's hand to a target and stop there with small torques, under gravity.

Torque control of all joints for one second (25 semi-implicit steps of
0.04 s), from rest in the "ready" posture. The torques start as the constant
gravity-compensating torques of that posture (the arm holds still) and are
optimised through the simulator by Gauss-Newton: the hand's tool frame must
end at a target 15 cm forward, 25 cm sideways and 15 cm down, at rest, inside
the joint limits, with the smallest torques. The only way to move is to
fight or use gravity, and the torque profile shows it.

    python examples/panda_min_torque_reach.py          # one to two minutes
    python examples/panda_min_torque_reach.py --quick

The figure goes to ``outputs/examples/panda_min_torque_reach.png``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from backdrive.kinematics import frame_transforms
from backdrive.optim import panda_min_torque_reach


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer iterations")
    parser.add_argument("--optimizer", default="gauss_newton", choices=["gauss_newton", "lbfgs", "adam"])
    parser.add_argument("--iterations", type=int, default=None)
    parser.add_argument("--out", type=Path, default=Path("outputs/examples"))
    args = parser.parse_args()
    torch.set_num_threads(1)  # small tensors: threads only add overhead

    run = panda_min_torque_reach(quick=args.quick, optimizer=args.optimizer, iterations=args.iterations,
                                 progress=None)
    print(run.summary())

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    robot = run.simulator.robot
    traj = run.result.trajectory
    t = traj.time.numpy()
    _, p = frame_transforms(robot, traj.q, ["panda_hand_tcp"])
    p = p[:, 0, :].numpy()
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    ax = axes[0]
    for k, name in enumerate("xyz"):
        ax.plot(t, p[:, k], label=f"tool {name}")
        ax.axhline(float(run.target[k]), color=f"C{k}", ls=":")
    ax.set_xlabel("time (s)")
    ax.set_ylabel("tool-frame position (m); dotted: target")
    ax.legend()
    ax = axes[1]
    for j in range(7):
        ax.step(t[:-1], traj.effort[:, j].numpy(), where="post", label=f"joint {j + 1}")
    ax.set_xlabel("time (s)")
    ax.set_ylabel("torque (N m)")
    ax.set_title(f"torque rms {run.torque_rms:.2f} N m (holding still: {run.hold_torque_rms:.2f})")
    ax.legend(fontsize=7, ncol=2)
    ax = axes[2]
    ax.semilogy(run.result.losses)
    ax.set_xlabel(f"iteration ({run.result.optimizer})")
    ax.set_ylabel("loss")
    ax.set_title(f"final error {1000 * run.position_error:.1f} mm")
    fig.tight_layout()
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "panda_min_torque_reach.png"
    fig.savefig(path, dpi=110)
    print(f"figure: {path}")


if __name__ == "__main__":
    main()
