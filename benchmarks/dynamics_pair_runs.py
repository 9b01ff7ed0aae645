"""CRBA's short pair runs gathered into one block or not: the G1 at a large batch.

``crba_entries_fast`` forms ``M[j, i] = S_j . F_i`` for the tree's joint
pairs as strided runs (six operations each); runs shorter than
``_fast._MIN_RUN`` (4) are gathered into one block (four operations in all).
For the G1 humanoid that is 76 operations instead of 270, but the gather
copies each of those rows once: on one thread the two were within a few
percent (10th session, under load); what two threads make of it needs a
quiet machine. This script times ``forward_dynamics`` (``method="auto"``,
no gradient, ``runtime.reuse_workspaces()``) with the runs' threshold at 1
(every run its own six operations, as before the 10th session), 4 (the
default) and 1000 (every pair but the diagonal gathered), on 1 and on 2
torch threads, interleaved in one process, wall clock, and Pinocchio's
``abaInParallel`` on 2 threads beside them.

    PYTHONPATH=src python benchmarks/dynamics_pair_runs.py     # ~1 minute on a quiet machine

Environment: ``BD_BATCH`` (10000), ``BD_ROUNDS`` (15), ``BD_DTYPE`` (float32).
"""

from __future__ import annotations

import os
import statistics
import time

import numpy as np
import torch

import backdrive as bd
import backdrive.dynamics._fast as F
from backdrive.data._example_robot_data import example_robot_path
from backdrive.model._model import _DERIVED


def load_average() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def main() -> None:
    import pinocchio as pin

    dtype = getattr(torch, os.environ.get("BD_DTYPE", "float32"))
    batch = int(os.environ.get("BD_BATCH", "10000"))
    rounds = int(os.environ.get("BD_ROUNDS", "15"))
    path = str(example_robot_path("g1"))
    m64 = bd.RobotModel.from_urdf(path, floating_base=True)
    robot = m64.to(dtype=dtype)
    g = torch.Generator().manual_seed(0)
    q64 = m64.random_q(batch, generator=g)
    v64 = torch.randn(batch, robot.nv, generator=g, dtype=torch.float64)
    t64 = torch.randn(batch, robot.nv, generator=g, dtype=torch.float64)
    q, v, t = (x.to(dtype) for x in (q64, v64, t64))
    key = ("dynamics.ltdl", robot.fingerprint, robot.dtype, str(robot.device))
    default = F._MIN_RUN
    plans = {}
    for min_run in (1, default, 1000):
        F._MIN_RUN = min_run
        plans[min_run] = F._build_sparsity(robot)
    F._MIN_RUN = default
    pm = pin.buildModelFromUrdf(path, pin.JointModelFreeFlyer())
    qn = q64.numpy().copy()
    qn[:, 3:7] = qn[:, [4, 5, 6, 3]]  # Pinocchio's quaternion is (x, y, z, w)
    pool = pin.ModelPool(pm, 2)
    Qc, Vc, Tc = (np.asfortranarray(x.T) for x in (qn, v64.numpy(), t64.numpy()))
    out = np.zeros((pm.nv, batch), order="F")

    def run(min_run, threads):
        def f():
            torch.set_num_threads(threads)
            _DERIVED[key] = plans[min_run]
            bd.dynamics.forward_dynamics(robot, q, v, t)
        return f

    fns = {f"runs>={k}, {th} thr": run(k, th) for th in (1, 2) for k in plans}
    fns["abaInParallel (2)"] = lambda: pin.abaInParallel(2, pool, Qc, Vc, Tc, out)
    times = {k: [] for k in fns}
    print(f"load average before: {load_average()}; batch {batch}, {str(dtype)[6:]}, {rounds} rounds, wall clock, G1")
    with torch.no_grad(), bd.runtime.reuse_workspaces():
        for f in fns.values():
            f(), f()
        for r in range(rounds):
            for k in list(fns) if r % 2 == 0 else list(fns)[::-1]:
                t0 = time.perf_counter()
                fns[k]()
                times[k].append(time.perf_counter() - t0)
    _DERIVED[key] = plans[default]
    torch.set_num_threads(1)
    pin_min = min(times["abaInParallel (2)"])
    print("| variant | min (median) ms | abaInParallel / this |")
    print("| --- | --- | ---: |")
    for k, x in times.items():
        print(f"| {k} | {min(x) * 1e3:.1f} ({statistics.median(x) * 1e3:.1f}) | {pin_min / min(x):.2f} |")
    print(f"load average after: {load_average()}")


if __name__ == "__main__":
    main()
