"""The Simulator's default contact step before and after the 12th session, two checkouts in one process.

Before: with ``joint_forces="auto"`` (implicit) every contact step passed the
contact's terms to ``ImplicitJointForces.velocity`` (dense mass matrix,
Cholesky) at every batch size. After: the contact's own step
(``ContactModel.acceleration``, its fast path from 128 samples without a
gradient and 160 with one), joint friction solved on it
(``contact/_fast.py``, ``JointFriction``).

What is timed (one torch thread, CPU time of this process, the minimum over
``REPEATS`` repeats, old and new alternating within each repeat):

* ``step``: a rollout of ``T`` steps without gradient, per step; the
  shipped quadruped (no joint damping or friction) and example-robot-data's
  Go1 (URDF friction 0.2 N m, damping 0.01), four foot spheres, PD (kp 30,
  kd 1), 2 ms, standing 3 mm sunk with random joint offsets and velocities;
* ``grad``: the same rollout recording a gradient, plus the backward of a
  loss on the final state to the controls, initial state included, per
  step; ``ratio`` = grad / step;
* ``shac``: one ``PolicyTrainer.update()`` (SHAC, the preset
  ``QUADRUPED_WALK_SHAC``: horizon 8, 4 physics substeps, privileged
  observations) at 64 and 32 copies (the update's rollouts take the
  reference contact step at these sizes: below 128/160 samples).

It also prints the largest relative difference of the final states (old vs
new; the same step, so about 1e-12 in float64).

Usage::

    mkdir -p /tmp/sfold && (cd /work/main && git archive 07dbc18 src | tar -x -C /tmp/sfold)
    python benchmarks/sim_contact_paths.py /tmp/sfold/src src [--quick] [--repeats N] [--steps T]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch

torch.set_num_threads(1)
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _checkouts import import_pair  # noqa: E402


def case(pkg, name, dtype, batch, steps, seed=0):
    load = pkg.data.load
    robot = load(name, floating_base=True, dtype=dtype)
    feet = [n for n in robot.link_names if n.endswith("_foot")]
    cm = pkg.contact.ContactModel(robot, pkg.contact.ContactGeometry.from_model(robot, links=feet))
    sim = pkg.sim.Simulator(robot, 2e-3, actuator=pkg.sim.PDActuator(kp=30.0, kd=1.0), contact=cm)
    g = torch.Generator().manual_seed(seed)
    kw = {"dtype": dtype}
    q = robot.neutral().expand(batch, -1).clone()
    q[:, 7:] = torch.tensor([0.0, 0.8, -1.5] * 4, **kw) + 0.1 * torch.randn(batch, 12, generator=g, **kw)
    q = cm.place_on_terrain(robot, q, clearance=-0.003)
    v = 0.3 * torch.randn(batch, robot.nv, generator=g, **kw)
    u = q[:, None, 7:] + 0.1 * torch.randn(batch, steps, 12, generator=g, **kw)
    State = pkg.sim.State

    def forward():
        with torch.no_grad():
            return sim.rollout(State(q, v), u, check_finite=False).q[:, -1]

    def grad():
        uu, q0, v0 = (x.clone().requires_grad_(True) for x in (u, q, v))
        tr = sim.rollout(State(q0, v0), uu, check_finite=False, contact_record=False)
        loss = (tr.q[:, -1, :3] ** 2).sum() + (tr.v[:, -1] ** 2).sum()
        torch.autograd.grad(loss, (uu, q0, v0))

    return forward, grad


def shac_update(pkg, copies):
    env = pkg.envs.QuadrupedWalk(copies, **{k: v for k, v in pkg.optim.QUADRUPED_WALK_SHAC.env_kwargs.items() if k != "num_envs"})
    trainer = pkg.optim.PolicyTrainer(env, config=pkg.optim.QUADRUPED_WALK_SHAC.config)
    trainer.update()  # warm-up
    return trainer.update


def timed(fn) -> float:
    c0 = time.process_time()
    fn()
    return time.process_time() - c0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--quick", action="store_true", help="float32 only, batches 1 and 1024, no SHAC")
    ap.add_argument("--robots", default="quadruped,example-robot-data:go1")
    ap.add_argument("--batches", default="1,32,256,1024")
    ap.add_argument("--dtypes", default="float32,float64")
    ap.add_argument("--no-shac", action="store_true")
    a = ap.parse_args()
    old, new = import_pair(a.old, a.new)
    pkgs = {"old": old, "new": new}
    batches = [1, 1024] if a.quick else [int(b) for b in a.batches.split(",")]
    dtypes = ["float32"] if a.quick else a.dtypes.split(",")
    print(f"# one thread, {a.steps}-step rollouts, best of {a.repeats}; load {os.getloadavg()[0]:.1f} at start")
    print("| robot | dtype | batch | step old ms | step new ms | old/new | grad old ms | grad new ms | old/new "
          "| ratio old | ratio new | state diff | load |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name in filter(None, a.robots.split(",")):  # --robots "": the SHAC rows alone
        for dt_name in dtypes:
            dtype = getattr(torch, dt_name)
            for batch in batches:
                runs = {k: case(p, name, dtype, batch, a.steps) for k, p in pkgs.items()}
                ends = {k: f() for k, (f, _) in runs.items()}  # warm-up (and the states to compare)
                for _, g in runs.values():
                    g()
                best = {k: [float("inf"), float("inf")] for k in runs}
                for _ in range(a.repeats):
                    for k, (f, g) in runs.items():
                        best[k][0] = min(best[k][0], timed(f))
                        best[k][1] = min(best[k][1], timed(g))
                diff = float((ends["old"] - ends["new"]).abs().max() / ends["old"].abs().max())
                s = {k: [x * 1e3 / a.steps for x in best[k]] for k in runs}
                print(f"| {name.split(':')[-1]} | {dt_name} | {batch} | {s['old'][0]:.2f} | {s['new'][0]:.2f} | "
                      f"{s['old'][0] / s['new'][0]:.2f} | {s['old'][1]:.2f} | {s['new'][1]:.2f} | "
                      f"{s['old'][1] / s['new'][1]:.2f} | {s['old'][1] / s['old'][0]:.2f} | "
                      f"{s['new'][1] / s['new'][0]:.2f} | {diff:.1e} | {os.getloadavg()[0]:.1f} |", flush=True)
    if a.quick or a.no_shac:
        return
    print()
    print("| SHAC update (QuadrupedWalk, float32) | copies | old s | new s | old/new | load |")
    print("|---|---|---|---|---|---|")
    for copies in (64, 32):
        ups = {k: shac_update(p, copies) for k, p in pkgs.items()}
        best = {k: float("inf") for k in ups}
        for _ in range(a.repeats):
            for k, up in ups.items():
                best[k] = min(best[k], timed(up))
        print(f"| quadruped_walk_shac | {copies} | {best['old']:.2f} | {best['new']:.2f} | "
              f"{best['old'] / best['new']:.2f} | {os.getloadavg()[0]:.1f} |", flush=True)


if __name__ == "__main__":
    main()
