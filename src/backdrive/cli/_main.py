"""Argument parsing and the small subcommands; the demo lives in ``_demo``."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from .._errors import BackdriveError

BENCHMARKS = ("kinematics", "dynamics", "learning")


def _resolve_robot(name: str) -> Path | str:
    """A path if it exists, else a shipped or example-robot-data name."""
    p = Path(name)
    if p.exists():
        return p
    from ..data import get_data_path

    return get_data_path(name)


def cmd_info(args) -> int:
    import torch

    from ..model import RobotModel

    model = RobotModel.from_urdf(_resolve_robot(args.robot), floating_base=args.floating_base)
    print(model.describe())
    print(f"joints ({model.num_joints}): {', '.join(model.joint_names)}")
    print(f"frames ({model.num_frames}): {', '.join(model.link_names)}")
    print(f"fingerprint: {model.fingerprint}")
    if args.fk:
        from ..kinematics import forward_kinematics

        T = forward_kinematics(model, model.neutral())
        print("frame poses at the neutral configuration (position, m):")
        for name, t in zip(model.link_names, T[..., :3, 3].tolist(), strict=True):
            print(f"  {name:<28s} {t[0]: .4f} {t[1]: .4f} {t[2]: .4f}")
    del torch
    return 0


def cmd_view(args) -> int:
    import numpy as np
    import torch

    from ..model import RobotModel
    from ..viz import preview

    model = RobotModel.from_urdf(_resolve_robot(args.robot), floating_base=args.floating_base)
    traj = None
    if args.trajectory:
        data = np.load(args.trajectory)
        key = args.key or ("q" if "q" in data.files else data.files[0])
        traj = torch.as_tensor(data[key], dtype=model.dtype)
        if traj.ndim != 2 or traj.shape[-1] != model.nq:
            raise BackdriveError(
                f"trajectory {key!r} in {args.trajectory} must have shape (T, {model.nq}), got {tuple(traj.shape)}"
            )
    out = preview(model, traj, path=args.out, fps=args.fps)
    print(f"preview written to {out}")
    print(f"open it in a browser: file://{Path(out).resolve()}")
    return 0


def cmd_bench(args) -> int:
    root = Path(__file__).resolve().parents[3]
    script = root / "benchmarks" / f"{args.name}.py"
    if not script.exists():
        raise BackdriveError(
            f"benchmark script {script} not found: `backdrive bench` runs the scripts in a "
            "source checkout's benchmarks/ folder (make bench installs the peers)"
        )
    cmd = [sys.executable, str(script)] + (["--quick"] if args.quick else [])
    return subprocess.call(cmd)


def cmd_demo(args) -> int:
    from ._demo import run_demo

    return run_demo(out=Path(args.out), quick=args.quick)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="backdrive",
        description="backdrive: differentiable robotics for PyTorch (kinematics, dynamics, simulation).",
    )
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    d = sub.add_parser(
        "demo",
        help="run the main job: trajectory optimisation, IK, swing-up, previews, plots",
        description="Run the end-to-end demo and write previews, plots and summary.md.",
    )
    d.add_argument("--quick", action="store_true", help="a reduced version (under a minute) for CI")
    d.add_argument("--out", default="outputs/demo", help="output folder (default: outputs/demo)")
    d.set_defaults(func=cmd_demo)

    i = sub.add_parser(
        "info",
        help="print a robot's kinematic tree, joint limits, degrees of freedom and mass",
        description="Print a robot's tree, joint types and limits, degrees of freedom and total mass. "
        "ROBOT is a URDF path, a shipped name (panda, pendulum, double_pendulum, cartpole, "
        "quadruped) or example-robot-data:NAME.",
    )
    i.add_argument("robot", help="URDF path or robot name")
    i.add_argument("--floating-base", action="store_true", help="add a free joint at the root")
    i.add_argument("--fk", action="store_true", help="also print every frame's position at the neutral pose")
    i.set_defaults(func=cmd_info)

    v = sub.add_parser(
        "view",
        help="write a browser preview of a robot, optionally along a trajectory",
        description="Write an offline browser preview of ROBOT (one self-contained HTML file that opens "
        "from disk, with a timeline to play, pause and scrub), posed along a trajectory if given.",
    )
    v.add_argument("robot", help="URDF path or robot name")
    v.add_argument("--trajectory", help=".npz file holding a (T, nq) array (key 'q' or the first array)")
    v.add_argument("--key", help="array name inside the .npz file")
    v.add_argument("--floating-base", action="store_true", help="add a free joint at the root")
    v.add_argument("--fps", type=float, default=30.0, help="playback frames per second (default 30)")
    v.add_argument(
        "--out",
        default="outputs/preview.html",
        help="output HTML file; an existing folder gets ROBOT.html inside (default: outputs/preview.html)",
    )
    v.set_defaults(func=cmd_view)

    b = sub.add_parser(
        "bench",
        help="run a benchmark script side by side with the peers",
        description="Run benchmarks/NAME.py from a source checkout (install peers with `make bench`).",
    )
    b.add_argument("name", choices=BENCHMARKS, help="which benchmark")
    b.add_argument("--quick", action="store_true", help="smaller sizes")
    b.set_defaults(func=cmd_bench)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    try:
        return int(args.func(args) or 0)
    except BackdriveError as exc:
        print(f"backdrive {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
