"""Why backdrive's Go1 walks slower than the calibration loop's MuJoCo "reality" (12th session, issues 13 and 12).

One parameter at a time: from the calibration loop's nominal guess (URDF
masses, joint damping 0.1 N m s/rad, armature 0.01 kg m^2, motor strength 1,
friction 0.75, no delay) each hidden parameter of draw ``--seed``'s reality
alone (masses, joint damping, strength, foot friction, delay), then all of
them (the truth), and the URDF's own joints (armature 0, damping 0.01, as
``locomotion_transfer.py``'s nominal rows). Each row runs the shipped Go1
policy (``--episodes`` x ``--seconds`` at the 0.5 m/s command, reset seed
``--reset-seed``) in

* ``mujoco``: the reality engine (``locomotion_transfer.build_hidden``:
  MuJoCo's soft contact ``solref (0.02, 1)``, elliptic cone,
  ``implicitfast``, 5 ms) with these parameters and ``run_mujoco(delay=)``;
* ``backdrive``: ``calibration_loop.make_env`` with the same parameters
  (``truth_params``; backdrive's default contact law, joint Coulomb friction
  of the URDF), the sim the loop calibrates and fine-tunes in;
* ``no_adhesion``: the same with :class:`calibration_loop.NoAdhesionSimulator`
  (the implicit contact step never applies a negative normal force);
* ``matched``: MuJoCo with backdrive's contact law (``locomotion_transfer.build``'s
  ``matched`` contact) and the row's joints, masses, strength and delay
  (friction: the row's).

``--law 1.3e4,500`` runs the backdrive columns with that contact law
(stiffness N/m, damping N s/m; friction the row's); ``--joint-friction 0``
with joints free of Coulomb friction, as the MuJoCo reality's (14th session). ``--calibration JSON`` adds the row ``calibrated``: the sim of the JSON's
``"calibrated"`` parameters (backdrive columns only).

    python benchmarks/calibration_gap.py --engines mujoco,backdrive,no_adhesion,matched \
        --calibration benchmarks/results/calibration_loop_go1_s0.json

Writes ``--out`` (JSON) and prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import calibration_loop as CL  # noqa: E402
import locomotion_transfer as LT  # noqa: E402

from backdrive.contact import ContactParameters  # noqa: E402
from backdrive.envs import QuadrupedWalk  # noqa: E402

ENGINES = ("mujoco", "backdrive", "no_adhesion", "matched")


def variants(robot, truth: dict) -> dict:
    """``{row: truth-like dict}``: the loop's nominal guess, each hidden parameter alone, all, URDF joints."""
    base = {"mass": robot.body_mass.tolist(), "damping": [0.1] * robot.num_joints, "strength": 1.0,
            "friction": 0.75, "delay": 0, "armature": CL.ARMATURE}
    rows = {"urdf joints": {**base, "armature": 0.0, "damping": [0.01] * robot.num_joints},  # armature 0, damping 0.01
            "armature 0": {**base, "armature": 0.0}, "nominal": base}
    for k in ("mass", "damping", "strength", "friction", "delay"):
        rows[k] = {**base, k: truth[k]}
    rows["truth"] = dict(truth)
    return rows


def matched_model(env, t: dict, dt: float):
    """MuJoCo with backdrive's contact law and the joints, masses and strength of ``t``."""
    model, perm = LT.build(env, "matched", dt, friction=float(t["friction"]), motor_strength=float(t["strength"]))
    model.actuator_biasprm[:, 2] = -env.kd * float(t["strength"])
    for name, m in zip(env.robot.body_names, t["mass"], strict=True):
        model.body_mass[model.body(name).id] = float(m)
    for name, d in zip(env.robot.joint_names, t["damping"], strict=True):
        adr = model.jnt_dofadr[model.joint(name).id]
        model.dof_damping[adr] = float(d)
        model.dof_armature[adr] = float(t["armature"])
    return model, perm


def speed(engine: str, t: dict, policy, args) -> dict:
    n, sec, seed = args.episodes, args.seconds, args.reset_seed
    if "params" in t:  # a calibrated sim: backdrive only
        if engine not in ("backdrive", "no_adhesion"):
            return {"forward_speed": float("nan"), "upright": float("nan")}
        p = t["params"] | {"no_adhesion": engine == "no_adhesion"}
        m = CL.make_env(p, n, robot_name="go1").evaluate(policy, LT.COMMAND, seconds=sec, seed=seed, settle=LT.SETTLE)
        return {"forward_speed": float(m["forward_speed"]), "upright": float(m["upright"])}
    if engine in ("mujoco", "matched"):
        env, _ = QuadrupedWalk.pretrained(n, robot="go1")
        model = LT.build_hidden(env, t, 0.005) if engine == "mujoco" else matched_model(env, t, 0.005)
        m = LT.run_mujoco(env, policy, dt=0.005, seconds=sec, seed=seed, model=model, delay=int(t["delay"]))
    else:
        law = None if args.law is None else ContactParameters(stiffness=args.law[0], damping=args.law[1])
        p = CL.truth_params(t, law) | {"armature": float(t["armature"]), "no_adhesion": engine == "no_adhesion"}
        if args.joint_friction is not None:
            p["joint_friction"] = args.joint_friction
        m = CL.make_env(p, n, robot_name="go1").evaluate(policy, LT.COMMAND, seconds=sec, seed=seed,
                                                         settle=LT.SETTLE)
    return {"forward_speed": float(m["forward_speed"]), "upright": float(m["upright"])}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seed", type=int, default=0, help="the hidden draw (calibration.reality)")
    ap.add_argument("--episodes", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--reset-seed", type=int, default=CL.SELECT["seed"])
    ap.add_argument("--engines", default="mujoco,backdrive,no_adhesion")
    ap.add_argument("--rows", default=None, help="comma-separated row names (default all: urdf joints, armature 0, "
                    "nominal, mass, damping, strength, friction, delay, truth, and calibrated with --calibration)")
    ap.add_argument("--law", default=None, type=lambda x: tuple(float(v) for v in x.split(",")),
                    help="STIFFNESS,DAMPING (N/m, N s/m): backdrive's contact law in the backdrive columns "
                         "(default: ContactParameters(), 4e4, 1e4)")
    ap.add_argument("--joint-friction", type=float, default=None, metavar="NM",
                    help="joint Coulomb friction (N m) of the backdrive columns (default the URDF's, Go1 0.2; the "
                         "MuJoCo reality has none)")
    ap.add_argument("--calibration", default=None,
                    help="a calibration_loop JSON: adds the row 'calibrated' (its sim, backdrive engines only)")
    ap.add_argument("--out", default="outputs/benchmarks/calibration_gap.json")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    engines = [e for e in args.engines.split(",") if e]
    bad = [e for e in engines if e not in ENGINES]
    if bad:
        raise SystemExit(f"unknown engines {bad}; valid: {', '.join(ENGINES)}")
    env, policy = QuadrupedWalk.pretrained(1, robot="go1")
    truth = CL.hidden_truth(args.seed, env.robot, "go1")
    rows = variants(env.robot, truth)
    if args.calibration:
        rows["calibrated"] = {"params": json.loads(Path(args.calibration).read_text())["calibrated"]}
    if args.rows:
        rows = {k: rows[k] for k in args.rows.split(",")}
    out = Path(args.out)
    result = {"args": vars(args), "truth": truth, "rows": {}}
    for name, t in rows.items():
        result["rows"][name] = {}
        for e in engines:
            t0 = time.perf_counter()
            result["rows"][name][e] = speed(e, t, policy, args) | {"wall_s": time.perf_counter() - t0}
        print(name, {e: round(r["forward_speed"], 3) for e, r in result["rows"][name].items()}, flush=True)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1))
    print(f"\n{args.episodes} episodes x {args.seconds:g} s at 0.5 m/s, reset seed {args.reset_seed}, draw {args.seed}\n")
    print("| parameters | " + " | ".join(engines) + " |")
    print("| --- |" + " ---: |" * len(engines))
    for name, r in result["rows"].items():
        print(f"| {name} | " + " | ".join(f"{r[e]['forward_speed']:.3f}" for e in engines) + " |")
    print(f"\nwrote {out}")
    return result


if __name__ == "__main__":
    main()
