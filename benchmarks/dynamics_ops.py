"""Operations per ``forward_dynamics`` call on the fast path, by stage: machine-independent.

Counts the ATen operations one call of ``forward_dynamics`` (``method="auto"``,
no gradient, float32, ``runtime.reuse_workspaces()``) dispatches, with a
``TorchDispatchMode``: views (``as_strided``, slices, ``view``, ``unbind``,
``expand``, ...) are not counted, and an operation is "small" when its output
has fewer than 32,768 elements (torch's parallel grain size: it runs on one
thread). Stages are the steps of ``_fast.forward_fast``, timed on one
thread with ``time.thread_time`` (minimum over rounds; at a load above 1
only the ratios between runs mean much).

    PYTHONPATH=src python benchmarks/dynamics_ops.py                  # G1, quadruped, Panda at 10,000
    BD_ROBOTS=g1 BD_BATCH=600 PYTHONPATH=src python benchmarks/dynamics_ops.py

With ``src`` of another checkout on ``PYTHONPATH`` it counts that one's
(its ``_fast`` must have the same stage functions; the 10th and 11th
sessions' checkouts do).
"""

from __future__ import annotations

import os
import re
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import backdrive as bd
import backdrive.dynamics._fast as F
from backdrive.data import get_data_path
from backdrive.data._example_robot_data import example_robot_path
from backdrive.kinematics._fk import body_transforms_fast

GRAIN = 32768
VIEWS = ("view", "unbind", "as_strided", "slice", "select.int", "expand", "permute", "split", "t.default",
         "transpose", "unsqueeze", "squeeze", "alias", "detach", "_unsafe_view", "diagonal", "reshape")


class Count(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = str(func)
        if not any(v in name for v in VIEWS):
            t = out if isinstance(out, torch.Tensor) else (out[0] if isinstance(out, (tuple, list)) and out else None)
            self.ops.append((name, t.numel() if isinstance(t, torch.Tensor) else 0))
        return out


def load(name: str):
    if name == "g1":
        m = bd.RobotModel.from_urdf(str(example_robot_path("g1")), floating_base=True)
    elif name == "panda":
        m = bd.RobotModel.from_urdf(re.sub(r"<mimic[^>]*/>", "", get_data_path("panda").read_text()))
    else:
        m = bd.RobotModel.from_urdf(str(get_data_path(name)), floating_base=True)
    return m


def stages(model, q, v, tau, mark):
    """``_fast.forward_fast(..., base_frame=True)`` step by step, ``mark(name)`` after each."""
    topo = F.fast_topology(model)
    N, nv = q.shape[0], model.nv
    fb = model.floating_base
    g = model.gravity
    if fb:
        q, g = F._to_base_frame(q, g)
    mark("base frame")
    R, p = body_transforms_fast(model, q, level_order=True, identity_base=fb)
    mark("forward kinematics")
    S = F.new((6, topo.nm, N), R)
    Sl, Sa, _ = F.motion_subspace_fast(topo, R, p, S)
    mark("motion subspaces")
    m = F._active(topo, model.body_mass)[:, None]
    com, Ib = F._active(topo, model.body_com), F._active(topo, model.body_inertia)
    packed = F.new((13, topo.na, N), R)
    packed[0].copy_(m.expand(topo.na, N))
    factors = F._active(topo, F._inertia_factors(model.body_inertia))
    h, I = F.world_inertia_fast(R[:, :, topo.o :], p[:, topo.o :], m, com, Ib, packed, factors)
    K = F.FastKin(R, p, Sl, Sa, m, h, I, packed=packed, S=S, base_frame=fb)
    gt = g.reshape(-1, 3).T
    mark("world inertias")
    vt = F._to_internal(topo, v)
    rhs = F._to_internal(topo, tau) - F.rnea_fast(model, topo, K, vt, None, gt, None, {})
    mark("RNEA")
    sp = F._sparsity(model)
    E = F.crba_entries_fast(model, topo, sp, K, fb)
    mark("CRBA")
    F.LTDLFactor(sp, topo, E, rhs)
    mark("LTDL and solve")


def main() -> None:
    torch.set_num_threads(1)
    robots = os.environ.get("BD_ROBOTS", "g1,quadruped,panda").split(",")
    N = int(os.environ.get("BD_BATCH", "10000"))
    rounds = int(os.environ.get("BD_ROUNDS", "10"))
    with open("/proc/loadavg") as f:
        print(f"load average {' '.join(f.read().split()[:3])}; batch {N}, float32, one thread, {rounds} rounds")
    print("| robot | stage | operations | small | rows written (of N) | thread CPU, min ms |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    for name in robots:
        m64 = load(name)
        model = m64.to(dtype=torch.float32)
        gen = torch.Generator().manual_seed(0)
        q = m64.random_q(N, generator=gen).float()
        v = torch.randn(N, model.nv, generator=gen)
        tau = torch.randn(N, model.nv, generator=gen)
        with bd.runtime.reuse_workspaces(), torch.no_grad():
            counter = Count()
            marks = []
            stages(model, q, v, tau, lambda k: None)
            with counter:
                stages(model, q, v, tau, lambda k: marks.append((k, len(counter.ops))))
            times = {}
            for _ in range(rounds):
                last = [time.thread_time()]

                def mark(k):
                    now = time.thread_time()
                    times.setdefault(k, []).append(now - last[0])
                    last[0] = now

                stages(model, q, v, tau, mark)
            whole = []
            for _ in range(rounds):
                t0 = time.thread_time()
                bd.dynamics.forward_dynamics(model, q, v, tau)
                whole.append(time.thread_time() - t0)
            with Count() as c:
                bd.dynamics.forward_dynamics(model, q, v, tau)
        prev = 0
        for k, n in marks:
            ops = counter.ops[prev:n]
            prev = n
            small = sum(1 for _, x in ops if x < GRAIN)
            rows = sum(x for _, x in ops) / N
            print(f"| {name} | {k} | {len(ops)} | {small} | {rows:.0f} | {min(times[k]) * 1e3:.2f} |")
        total_small = sum(1 for _, x in c.ops if x < GRAIN)
        print(f"| {name} | **forward_dynamics call** | {len(c.ops)} | {total_small} | "
              f"{sum(x for _, x in c.ops) / N:.0f} | {min(whole) * 1e3:.2f} |")


if __name__ == "__main__":
    main()
