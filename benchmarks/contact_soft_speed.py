"""Step time of MuJoCo's soft contact (``SoftContactParameters``) against the
penalty law (``ContactParameters``), side by side in one run: the shipped
quadruped standing 0.5 mm in the floor under PD servos, 100 steps without
gradient, float64, one thread.

    python benchmarks/contact_soft_speed.py [--batches 1,32]
"""

from __future__ import annotations

import argparse
import math
import time

import torch

from backdrive.contact import ContactGeometry, ContactModel, ContactParameters, SoftContactParameters
from backdrive.data import load
from backdrive.sim import PDActuator, Simulator, State


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batches", default="1,32")
    ap.add_argument("--steps", type=int, default=100)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    robot = load("quadruped", floating_base=True, dtype=torch.float64)
    feet = [n for n in robot.link_names if n.endswith("_foot")]
    geo = ContactGeometry.from_model(robot, links=feet)
    q = robot.neutral()
    q[7:] = torch.tensor([0.0, 0.8, -1.6] * 4, dtype=torch.float64)
    print("| batch | penalty law, ms/step | soft contact, ms/step | ratio |")
    print("| --- | --- | --- | --- |")
    for B in (int(b) for b in args.batches.split(",")):
        times = {}
        for name, params in (("penalty", ContactParameters()), ("soft", SoftContactParameters())):
            cm = ContactModel(robot, geo, params=params)
            sim = Simulator(robot, 0.002, actuator=PDActuator(kp=80.0, kd=2.0, effort_limit=math.inf), contact=cm)
            state = State(cm.place_on_terrain(robot, q, clearance=-5e-4).expand(B, -1),
                          torch.zeros(B, robot.nv, dtype=torch.float64))
            u = q[7:].expand(B, args.steps, 12)
            with torch.no_grad():
                sim.rollout(state, u[:, :10])  # warm-up
                t = time.perf_counter()
                sim.rollout(state, u)
                times[name] = (time.perf_counter() - t) / args.steps * 1e3
        print(f"| {B} | {times['penalty']:.2f} | {times['soft']:.2f} | {times['soft'] / times['penalty']:.1f}x |")


if __name__ == "__main__":
    main()
