"""Forward dynamics at a large batch on torch's 2 threads: two checkouts of
backdrive and Pinocchio's ``abaInParallel`` (2 threads), in ONE process, interleaved.

The question of issue 14's last item (the G1 humanoid at 10,000 samples in
float32 against ``abaInParallel``) needs a same-run comparison: this script
times ``forward_dynamics`` (the default ``method="auto"``, no gradient,
inside ``runtime.reuse_workspaces()`` as ``benchmarks/dynamics.py
--large-only`` does) of an OLD and a NEW ``src`` folder (imported side by
side by ``_checkouts.import_pair``), on 1 and on 2 torch threads, and
``abaInParallel`` on 2 threads, all in turn within each round (wall clock,
minimum and median over rounds), and prints ``uptime``'s load before and
after. With one folder given, it is compared with itself.

    python benchmarks/dynamics_two_threads.py OLD_SRC NEW_SRC   # G1, quadruped, Panda; ~2 minutes
    BD_ROBOTS=g1 BD_ROUNDS=10 python benchmarks/dynamics_two_threads.py OLD_SRC NEW_SRC

``OLD_SRC`` e.g. from ``git archive <commit> src | tar -x -C /tmp/old``
(then ``/tmp/old/src``). Environment: ``BD_ROBOTS`` (``g1,quadruped,panda``),
``BD_DTYPE`` (``float32``), ``BD_BATCH`` (10000), ``BD_ROUNDS`` (15).
"""

from __future__ import annotations

import os
import re
import statistics
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _checkouts import import_pair  # noqa: E402


def load_average() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def main() -> None:
    old_src = sys.argv[1]
    new_src = sys.argv[2] if len(sys.argv) > 2 else sys.argv[1]
    import_pair(old_src, new_src)
    import bdnew
    import bdnew.dynamics as Dn
    import bdold
    import bdold.dynamics as Do
    import pinocchio as pin

    robots = os.environ.get("BD_ROBOTS", "g1,quadruped,panda").split(",")
    dtype = getattr(torch, os.environ.get("BD_DTYPE", "float32"))
    batch = int(os.environ.get("BD_BATCH", "10000"))
    rounds = int(os.environ.get("BD_ROUNDS", "15"))
    print(f"load average before: {load_average()} ({os.cpu_count()} cores); torch {torch.__version__}, "
          f"pinocchio {pin.__version__}, batch {batch}, {str(dtype)[6:]}, {rounds} rounds, wall clock", flush=True)
    print("| robot | old 1 thread | new 1 thread | old 2 threads | new 2 threads | abaInParallel (2) "
          "| old / new (2 threads) | pin / new (2 threads) | pin / old (2 threads) |")
    print("|" + " --- |" * 9)
    for name in robots:
        g = torch.Generator().manual_seed(0)
        if name == "panda":
            from bdnew.data import get_data_path

            text = re.sub(r"<mimic[^>]*/>", "", get_data_path("panda").read_text())
            models = [bd.RobotModel.from_urdf(text) for bd in (bdold, bdnew)]
            pm = pin.buildModelFromXML(text)
        else:
            if name == "g1":
                from bdnew.data._example_robot_data import example_robot_path

                path = str(example_robot_path("g1"))
            else:
                from bdnew.data import get_data_path

                path = str(get_data_path(name))
            models = [bd.RobotModel.from_urdf(path, floating_base=True) for bd in (bdold, bdnew)]
            pm = pin.buildModelFromUrdf(path, pin.JointModelFreeFlyer())
        ro, rn = (m.to(dtype=dtype) for m in models)
        q64 = models[1].random_q(batch, generator=g)
        v64 = torch.randn(batch, rn.nv, generator=g, dtype=torch.float64)
        a64 = torch.randn(batch, rn.nv, generator=g, dtype=torch.float64)
        q, v, a = (x.to(dtype) for x in (q64, v64, a64))
        qn = q64.numpy().copy()
        if rn.floating_base:
            qn[:, 3:7] = qn[:, [4, 5, 6, 3]]  # Pinocchio's quaternion is (x, y, z, w)
        pool = pin.ModelPool(pm, 2)
        Qc, Vc, Ac = (np.asfortranarray(x.T) for x in (qn, v64.numpy(), a64.numpy()))
        out = np.zeros((pm.nv, batch), order="F")

        def bd(D, robot, threads):
            def f():
                torch.set_num_threads(threads)  # Pinocchio's parallel call sets the shared OpenMP count
                with torch.no_grad():
                    D.forward_dynamics(robot, q, v, a)
            return f

        fns = {
            "o1": bd(Do, ro, 1),
            "n1": bd(Dn, rn, 1),
            "o2": bd(Do, ro, 2),
            "n2": bd(Dn, rn, 2),
            "pin": lambda: pin.abaInParallel(2, pool, Qc, Vc, Ac, out),
        }
        times = {k: [] for k in fns}
        # Each checkout's workspaces (its own runtime module), open for the whole row.
        with bdold.runtime.reuse_workspaces(), bdnew.runtime.reuse_workspaces():
            for f in fns.values():
                f(), f()
            for r in range(rounds):
                keys = list(fns) if r % 2 == 0 else list(fns)[::-1]
                for k in keys:
                    t0 = time.perf_counter()
                    fns[k]()
                    times[k].append(time.perf_counter() - t0)
        torch.set_num_threads(1)
        mn = {k: min(x) * 1e3 for k, x in times.items()}
        md = {k: statistics.median(x) * 1e3 for k, x in times.items()}
        cell = lambda k: f"{mn[k]:.1f} ({md[k]:.1f})"  # noqa: E731
        print(f"| {name} | {cell('o1')} | {cell('n1')} | {cell('o2')} | {cell('n2')} | {cell('pin')} | "
              f"{mn['o2'] / mn['n2']:.2f} | {mn['pin'] / mn['n2']:.2f} | {mn['pin'] / mn['o2']:.2f} |", flush=True)
    print(f"load average after: {load_average()}; cells: min (median) ms; ratios of minima")
    if float(load_average().split()[0]) > 1.5:
        print("(the machine was busy: two-thread wall-clock times wait for descheduled threads; re-run when quiet)")


if __name__ == "__main__":
    main()
