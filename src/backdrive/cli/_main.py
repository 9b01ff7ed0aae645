"""Argument parsing and the small subcommands; the demo lives in ``_demo``."""

from __future__ import annotations

import argparse
import subprocess
import sys
import warnings
from pathlib import Path

from .._errors import BackdriveError, InputError

BENCHMARKS = ("kinematics", "dynamics", "learning")
_FILE_SUFFIXES = (".urdf", ".xml", ".xacro", ".sdf")


def _resolve_robot(name: str) -> Path | str:
    """A path if it exists or looks like one, else a shipped or example-robot-data name.

    ``missing.urdf`` is a file that does not exist (the loader says so), not
    an unknown robot called ``missing``; ``panda.urdf`` still names the
    shipped Panda when no such file exists.
    """
    from ..data import EXAMPLE_ROBOT_DATA_PREFIX, get_data_path, list_robots

    if not name.strip():
        raise InputError(
            f"the robot argument is empty; give a URDF path or a robot name ({', '.join(list_robots())}, "
            "or example-robot-data:NAME)"
        )
    if name.startswith(EXAMPLE_ROBOT_DATA_PREFIX):
        return get_data_path(name)
    p = Path(name)
    if p.exists():
        return p
    if p.suffix in _FILE_SUFFIXES or "/" in name or "\\" in name:
        if p.parent == Path(".") and p.stem in list_robots() and p.suffix == ".urdf":
            return get_data_path(name)
        return p
    return get_data_path(name)


def _load(args):
    from ..model import RobotModel

    return RobotModel.from_urdf(
        _resolve_robot(args.robot), floating_base=args.floating_base, mimic=not args.no_mimic
    )


def cmd_info(args) -> int:
    import torch

    model = _load(args)
    print(model.describe())
    print(f"joints ({model.num_joints}): {', '.join(model.joint_names)}")
    print(f"frames ({model.num_frames}): {', '.join(model.link_names)}")
    print(f"fingerprint: {model.fingerprint}")
    zero = model.zero_inertia_joints() if float(model.body_mass.sum()) > 0 else ()
    if zero:
        print(
            f"warning: {len(zero)} coordinate(s) move no mass or inertia: {', '.join(zero)}; forward dynamics "
            "is undefined (NaN) until they get armature: model.replace(armature=...)"
        )
    if args.fk:
        from ..kinematics import forward_kinematics

        T = forward_kinematics(model, model.neutral())
        print("frame poses at the neutral configuration (position, m):")
        for name, t in zip(model.link_names, T[..., :3, 3].tolist(), strict=True):
            print(f"  {name:<28s} {t[0]: .4f} {t[1]: .4f} {t[2]: .4f}")
    del torch
    return 0


def cmd_view(args) -> int:
    from ..viz import preview

    model = _load(args)
    traj = _load_trajectory(args.trajectory, args.key, model) if args.trajectory else None
    out = preview(model, traj, path=args.out, fps=args.fps)
    print(f"preview written to {out}")
    print(f"open it in a browser: file://{Path(out).resolve()}")
    return 0


def _load_trajectory(path: str, key: str | None, model):
    """A ``(T, nq)`` tensor from a ``.npy`` array or a ``.npz`` archive (array ``key``,
    else ``q``, else the first)."""
    import numpy as np
    import torch

    try:
        data = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise InputError(f"trajectory file not found: {path!r}") from None
    except (OSError, ValueError) as exc:
        raise InputError(f"cannot read trajectory {path!r} as a .npy array or .npz archive: {exc}") from None
    if isinstance(data, np.ndarray):
        if key:
            raise InputError(f"--key {key!r} selects an array in a .npz archive; {path} holds one array (.npy)")
        what, arr = path, data
    else:
        files = list(data.files)
        if not files:
            raise InputError(f"trajectory archive {path} holds no arrays")
        key = key or ("q" if "q" in files else files[0])
        if key not in files:
            raise InputError(f"trajectory archive {path} has no array {key!r}; it holds {', '.join(map(repr, files))}")
        what, arr = f"{key!r} in {path}", data[key]
    if arr.dtype.kind not in "fiu":
        raise InputError(f"trajectory {what} must hold real numbers, got dtype {arr.dtype}")
    if arr.ndim != 2 or arr.shape[-1] != model.nq:
        raise InputError(f"trajectory {what} must have shape (T, {model.nq}), got {tuple(arr.shape)}")
    if not np.isfinite(arr).all():
        raise InputError(f"trajectory {what} holds NaN or inf (first at row {int(np.nonzero(~np.isfinite(arr))[0][0])})")
    return torch.as_tensor(np.asarray(arr, dtype=np.float64), dtype=model.dtype)


def cmd_sensitivity(args) -> int:
    """Rank the commands of a recorded rollout by their effect on a metric; write report.md and heatmap.png."""
    import numpy as np

    from ..analysis import METRICS, load_trajectory, sensitivity
    from ..analysis._io import read_npz
    from ..model import RobotModel

    if args.metric not in METRICS:
        raise InputError(f"unknown metric {args.metric!r}; choose one of {', '.join(METRICS)}")
    if args.top < 1:
        raise InputError(f"--top must be a positive integer, got {args.top}")
    data = read_npz(args.trajectory)
    source = _resolve_robot(args.robot)
    if "floating_base" in data:
        floating = bool(data["floating_base"])
    else:
        fixed = RobotModel.from_urdf(source, floating_base=False)
        floating = data["q"].ndim == 2 and data["q"].shape[-1] == fixed.nq + 7
    robot = RobotModel.from_urdf(source, floating_base=floating)
    sim, state0, controls, data = load_trajectory(args.trajectory, robot)
    options = {}
    if args.metric == "tracking_error" and "reference" in data:
        options["reference"] = np.asarray(data["reference"], dtype=np.float64)
    if args.metric == "end_effector_error":
        if args.frame is None or args.target is None:
            raise InputError("--metric end_effector_error needs --frame NAME and --target X Y Z")
        options = {"frame": args.frame, "target": args.target}
    sens = sensitivity(sim, state0, controls, args.metric, parameters=args.parameters or (), metric_options=options)
    report = sens.report(top=args.top, window=args.window, size=args.size, goal=args.goal)
    # How well the re-simulation replays the record (a different simulator setting shows here).
    replay = float(np.abs(sens.trajectory.q.cpu().numpy() - data["q"]).max())
    report.notes.append(f"\n- replay: the re-simulated q differs from the recorded q by at most {replay:.3g}")
    paths = report.save(args.out, heatmap=not args.no_heatmap, preview=args.preview)
    print(f"{args.metric} = {sens.value:.6g}{report.metric_unit} over {sens.trajectory.horizon} steps")
    for line in report.lines():
        print(line)
    print(f"replay deviation (max |q_sim - q_recorded|): {replay:.3g}")
    for k, pth in paths.items():
        if pth is not None:
            print(f"{k}: {pth}")
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

    return run_demo(out=Path(args.out), quick=args.quick, robot=args.robot)


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
    d.add_argument("--robot", default="quadruped", choices=["quadruped", "go1"],
                   help="the walking stage's robot and shipped policy: the shipped quadruped (default) or "
                        "example-robot-data's Unitree Go1 (needs the example-robot-data package)")
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
    i.add_argument("--no-mimic", action="store_true", help="ignore <mimic> tags (mimic joints become independent)")
    i.set_defaults(func=cmd_info)

    v = sub.add_parser(
        "view",
        help="write a browser preview of a robot, optionally along a trajectory",
        description="Write an offline browser preview of ROBOT (one self-contained HTML file that opens "
        "from disk, with a timeline to play, pause and scrub), posed along a trajectory if given.",
    )
    v.add_argument("robot", help="URDF path or robot name")
    v.add_argument(
        "--trajectory", help=".npy file holding a (T, nq) array, or .npz archive (key 'q' or the first array)"
    )
    v.add_argument("--no-mimic", action="store_true", help="ignore <mimic> tags (mimic joints become independent)")
    v.add_argument("--key", help="array name inside the .npz file")
    v.add_argument("--floating-base", action="store_true", help="add a free joint at the root")
    v.add_argument("--fps", type=float, default=30.0, help="playback frames per second (default 30)")
    v.add_argument(
        "--out",
        default="outputs/preview.html",
        help="output HTML file; an existing folder gets ROBOT.html inside (default: outputs/preview.html)",
    )
    v.set_defaults(func=cmd_view)

    se = sub.add_parser(
        "sensitivity",
        help="rank a recorded rollout's commands by their effect on a metric, checked by re-simulation",
        description="Differentiate a metric of a recorded rollout (.npz: q, v, controls, dt, ...; see "
        "docs/analysis.md) with respect to every command, rank (joint, time) changes, re-simulate the top "
        "ones and write report.md, sensitivity.npz and heatmap.png into --out.",
    )
    se.add_argument("robot", help="URDF path or robot name")
    se.add_argument("--trajectory", required=True, help=".npz trajectory archive (format: docs/analysis.md)")
    se.add_argument("--metric", default="foot_slip", help="foot_slip (default), final_base_height, tracking_error, "
                    "peak_contact_force, energy or end_effector_error")
    se.add_argument("--top", type=int, default=10, help="entries in the report (default 10)")
    se.add_argument("--window", type=int, help="steps per entry (default: 20 ms worth)")
    se.add_argument("--size", type=float, help="command change per entry (default 0.003 rad for PD targets)")
    se.add_argument("--goal", choices=("decrease", "increase"), default="decrease", help="which way to push the metric")
    se.add_argument("--parameters", nargs="*", help="physical parameters to report too (body_mass, contact.friction, kp, ...)")
    se.add_argument("--frame", help="frame of end_effector_error")
    se.add_argument("--target", type=float, nargs=3, metavar=("X", "Y", "Z"), help="target of end_effector_error, m")
    se.add_argument("--no-heatmap", action="store_true", help="skip heatmap.png (no matplotlib needed)")
    se.add_argument("--preview", action="store_true", help="also write preview.html: the rollout with the "
                    "most sensitive joints traced (needs viser)")
    se.add_argument("--out", default="outputs/sensitivity", help="output folder (default: outputs/sensitivity)")
    se.set_defaults(func=cmd_sensitivity)

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
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("default")
            try:
                return int(args.func(args) or 0)
            finally:
                # one line each, without the file:line prefix Python adds
                for w in caught:
                    print(f"backdrive {args.command}: warning: {w.message}", file=sys.stderr)
    except BackdriveError as exc:
        print(f"backdrive {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except ImportError as exc:
        # an optional package a command needs (viser, matplotlib, ...)
        missing = exc.name or str(exc)
        print(
            f"backdrive {args.command}: error: the optional package {missing!r} is missing ({exc}); "
            "install the extra: pip install 'backdrive[viz]'",
            file=sys.stderr,
        )
        return 2
    except OSError as exc:  # e.g. an output folder that cannot be written
        print(f"backdrive {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
