"""Close the loop of issue 13: fine-tune the walker in the calibrated and in the nominal sim, deploy both in "reality".

"Reality" is the one of ``benchmarks/calibration.py`` (MuJoCo, its own soft
contact, ``implicitfast`` at 2 ms) running the shipped quadruped with the
hidden parameters of a calibration run (``--save`` there): every link mass
scaled by 0.8-1.2, foot friction 0.4-1.0, joint damping 0.05-0.3 N m s/rad,
one motor strength 0.8-1.0 on both servo gains, armature 0.01 kg m^2
(known to both engines). The walking env's servos are ``kp`` 40 N m/rad,
``kd`` 1 N m s/rad (times the motor strength) with the URDF's effort limits,
at 50 Hz. Unlike the calibration benchmark there is no control delay here
(``locomotion_transfer.run_mujoco`` sends each action at once; the
calibration's 1-3 steps of 2 ms are a tenth of the 20 ms control period).

Both simulators are ``QuadrupedWalk`` as the shipped policy was trained
(``QuadrupedWalk.pretrained``: privileged observations, the trot generator),
at its 5 ms physics substeps:

* nominal: the URDF, joint damping 0.1 N m s/rad, armature 0.01, backdrive's
  default contact law (4e4 N/m, 1e4 N s/m, friction 0.75), motor strength 1
  (the calibration's starting guess);
* calibrated: the same with the calibrated masses, joint damping, contact
  law and motor strength read from the calibration's JSON.

Each starts from the shipped ``QuadrupedWalk.pretrained()`` policy and runs
the same number of SHAC updates (``QUADRUPED_WALK_SHAC`` settings, the actor's
learning rate lowered for fine-tuning, a fresh critic, the same seed); the
three policies (shipped, fine-tuned nominal, fine-tuned calibrated) then walk
in the MuJoCo reality under a 0.5 m/s forward command, 16 episodes x 10 s
from the env's randomised initial states (``locomotion_transfer.run_mujoco``,
whose model builder is wrapped here to apply the hidden parameters).
Reported: forward speed, per-episode speed-tracking error and the fraction
upright of each policy in reality, and, as a diagnostic, the shipped
policy's walk as each training sim predicts it.

    nice -n 10 python benchmarks/calibration.py --save outputs/calibration.json [...]
    nice -n 10 python benchmarks/calibration_loop.py outputs/calibration.json [--updates 120]
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import locomotion_transfer as LT  # noqa: E402

from backdrive.contact import ContactModel, ContactParameters  # noqa: E402
from backdrive.envs import QuadrupedWalk  # noqa: E402
from backdrive.optim import QUADRUPED_WALK_SHAC, train_policy  # noqa: E402
from backdrive.sim import Simulator  # noqa: E402

ARMATURE = 0.01  # as benchmarks/calibration.py
REALITY_DT = 0.002


def make_env(params: dict | None, num_envs: int) -> QuadrupedWalk:
    """``QuadrupedWalk`` as the shipped policy was trained, with the physics
    of ``params`` (``None``: the calibration's nominal guess)."""
    env, _ = QuadrupedWalk.pretrained(num_envs)
    r = env.robot
    nj = r.num_joints
    kw = {"dtype": env.dtype}
    if params is None:
        params = {"body_mass": r.body_mass.tolist(), "damping": [0.1] * nj, "motor_strength": 1.0,
                  "stiffness": float(ContactParameters().stiffness),
                  "contact_damping": float(ContactParameters().damping),
                  "friction": float(ContactParameters().friction)}
    robot = r.replace(body_mass=torch.tensor(params["body_mass"], **kw), damping=torch.tensor(params["damping"], **kw),
                      armature=torch.full((nj,), ARMATURE, **kw))
    s = float(params["motor_strength"])
    env, _ = QuadrupedWalk.pretrained(num_envs, robot=robot, kp=env.kp * s, kd=env.kd * s)
    # The env builds its contact from `nominal_contact` at construction; the
    # fitted law replaces it (no randomisation, so `env.sim` is the one used).
    env.nominal_contact = ContactParameters(stiffness=float(params["stiffness"]),
                                            damping=float(params["contact_damping"]),
                                            friction=float(params["friction"]))
    env.contact = ContactModel(env.robot, env.geometry, params=env.nominal_contact)
    env.sim = Simulator(env.robot, env.physics_dt, actuator=env._actuator, contact=env.contact)
    return env


def hidden_build(truth: dict):
    """``locomotion_transfer.build`` with the hidden parameters of ``truth``
    applied to its native-contact model (masses by body name, damping and
    armature per joint, motor strength on both gains, elliptic cone as in
    the calibration's reality)."""
    import mujoco

    original = LT.build

    def build(env, contact="native", dt=REALITY_DT, **physics):
        s = float(truth["strength"])
        model, perm = original(env, "native", dt, friction=float(truth["friction"]), motor_strength=s)
        model.actuator_biasprm[:, 2] = -env.kd * s  # build scales kp only
        model.opt.cone = mujoco.mjtCone.mjCONE_ELLIPTIC
        for name, m in zip(env.robot.body_names, truth["mass"]):
            model.body_mass[model.body(name).id] = m
        for name, d in zip(env.robot.joint_names, truth["damping"]):
            adr = model.jnt_dofadr[model.joint(name).id]
            model.dof_damping[adr] = d
            model.dof_armature[adr] = ARMATURE
        return model, perm

    return build


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("calibration", help="JSON written by benchmarks/calibration.py --save")
    ap.add_argument("--updates", type=int, default=120, help="SHAC updates of each fine-tuning run")
    ap.add_argument("--minutes", type=float, default=10.0, help="wall-clock cap of each fine-tuning run")
    ap.add_argument("--lr", type=float, default=3e-4, help="actor learning rate of the fine-tuning")
    ap.add_argument("--episodes", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="outputs/benchmarks/calibration_loop.json")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    cal = json.loads(Path(args.calibration).read_text())
    truth = cal["truth"]
    LT.build = hidden_build(truth)

    _, shipped = QuadrupedWalk.pretrained(1)
    num_envs = int(QUADRUPED_WALK_SHAC.env_kwargs["num_envs"])
    # Which training sim predicts the shipped policy's walk in reality better
    # (the same command, episodes and initial states, in backdrive).
    predicted = {}
    for name, params in (("nominal", None), ("calibrated", cal["calibrated"])):
        m = make_env(params, args.episodes).evaluate(shipped, LT.COMMAND, seconds=args.seconds, seed=LT.SEED,
                                                      settle=LT.SETTLE)
        predicted[name] = {k: float(m[k]) for k in ("forward_speed", "speed_error", "upright")}
    policies, train_info = {"shipped": shipped}, {}
    for name, params in (("nominal", None), ("calibrated", cal["calibrated"])):
        env = make_env(params, num_envs)
        policy = copy.deepcopy(shipped).train()
        t0 = time.perf_counter()
        stop = lambda row, t0=t0: time.perf_counter() - t0 > 60 * args.minutes  # noqa: E731
        trainer = train_policy(env, preset=QUADRUPED_WALK_SHAC, policy=policy, updates=args.updates, lr=args.lr,
                               seed=args.seed, callback=stop, num_threads=1)
        train_info[name] = {"updates": trainer.updates_done, "env_steps": trainer.env_steps,
                            "minutes": (time.perf_counter() - t0) / 60}
        policies[name] = trainer.policy.eval()
        print(f"fine-tuned in the {name} sim: {trainer.updates_done} updates, "
              f"{train_info[name]['minutes']:.1f} min", flush=True)

    rows = {}
    for name, policy in policies.items():
        env, _ = QuadrupedWalk.pretrained(args.episodes)
        t0 = time.perf_counter()
        rows[name] = LT.run_mujoco(env, policy, "native", REALITY_DT, seconds=args.seconds, seed=LT.SEED)
        rows[name]["wall_s"] = time.perf_counter() - t0
    print(f"\n{args.episodes} episodes x {args.seconds:g} s in MuJoCo with the hidden parameters, command "
          f"{LT.COMMAND[0]} m/s forward; fine-tuning: {args.updates} SHAC updates, actor lr {args.lr:g}\n")
    print("| policy | forward speed (m/s) | speed error (m/s) | upright |")
    print("| --- | ---: | ---: | ---: |")
    label = {"shipped": "shipped (no fine-tuning)", "nominal": "fine-tuned in the nominal sim",
             "calibrated": "fine-tuned in the calibrated sim"}
    for k, r in rows.items():
        print(f"| {label[k]} | {r['forward_speed']:.3f} | {r['speed_error']:.3f} | {r['upright']:.0%} |")
    print("\n| the shipped policy, same episodes | forward speed (m/s) | speed error (m/s) | upright |")
    print("| --- | ---: | ---: | ---: |")
    r = rows["shipped"]
    print(f"| in reality (MuJoCo, hidden parameters) | {r['forward_speed']:.3f} | {r['speed_error']:.3f} | "
          f"{r['upright']:.0%} |")
    for k, r in predicted.items():
        print(f"| predicted by the {k} sim | {r['forward_speed']:.3f} | {r['speed_error']:.3f} | {r['upright']:.0%} |")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"args": vars(args), "train": train_info, "rows": rows, "predicted": predicted,
                               "calibration": args.calibration}, indent=1, default=float))
    print(f"\nwrote {out}")
    return rows


if __name__ == "__main__":
    main()
