"""Before/after timing of two checkouts of backdrive in ONE process, interleaved.

Copies ``OLD/backdrive`` and ``NEW/backdrive`` (two ``src`` folders, e.g. a
``git worktree`` of the old commit) to a temporary folder as the packages
``bdold`` and ``bdnew``, then times every row with the two alternating within
each repeat (thread CPU time, one torch thread, minimum over repeats), so
that outside load hits both alike. Prints a markdown table of new/old.

    python benchmarks/compare_checkouts.py OLD_SRC NEW_SRC fk,rnea,fd 1,64,10000

Robots: ``BD_ROBOTS`` (comma-separated, default ``panda,quadruped``; ``g1``
is example-robot-data's G1, floating); dtypes: ``BD_DTYPES`` (default
``float32,float64``); time per row: ``BD_SECONDS`` (default 0.6).
"""
import os
import sys, time
import torch

torch.set_num_threads(1)
OLD, NEW = sys.argv[1], sys.argv[2]
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _checkouts import import_pair  # noqa: E402

import_pair(OLD, NEW)
import bdold, bdnew
import bdold.dynamics as Do, bdnew.dynamics as Dn, bdold.kinematics as Ko, bdnew.kinematics as Kn
from bdold.data import load as lo
from bdnew.data import load as ln
SECONDS = float(os.environ.get("BD_SECONDS", "0.6"))  # time budget per row
ops = sys.argv[3].split(","); batches = [int(x) for x in sys.argv[4].split(",")]
def fns(D, K, robot, q, v, a, link):
    def grad(f, *xs):
        xs = [x.clone().requires_grad_(True) for x in xs]
        return lambda: torch.autograd.grad(f(*xs).sum(), xs)
    return {
        "fk": lambda: K.forward_kinematics(robot, q), "fk_grad": grad(lambda q: K.forward_kinematics(robot, q), q),
        "jac": lambda: K.frame_jacobian(robot, q, link),
        "rnea": lambda: D.inverse_dynamics(robot, q, v, a), "rnea_grad": grad(lambda q, v, a: D.inverse_dynamics(robot, q, v, a), q, v, a),
        "bias": lambda: D.bias_forces(robot, q, v), "crba": lambda: D.mass_matrix(robot, q),
        "crba_grad": grad(lambda q: D.mass_matrix(robot, q), q), "fd": lambda: D.forward_dynamics(robot, q, v, a),
        "fd_grad": grad(lambda q, v, a: D.forward_dynamics(robot, q, v, a), q, v, a),
        "aba": lambda: D.forward_dynamics(robot, q, v, a, method="aba"),
        "ke": lambda: D.kinetic_energy(robot, q, v), "pe": lambda: D.potential_energy(robot, q)}
print("| robot | dtype | batch | op | old ms | new ms | new/old |\n|---|---|---|---|---|---|---|", flush=True)
_names = {"g1": "example-robot-data:g1"}
for rname in os.environ.get("BD_ROBOTS", "panda,quadruped").split(","):
    fb = rname != "panda"
    ro64, rn64 = lo(_names.get(rname, rname), floating_base=fb), ln(_names.get(rname, rname), floating_base=fb)
    for dt in [getattr(torch, d) for d in os.environ.get("BD_DTYPES", "float32,float64").split(",")]:
        ro, rn = ro64.to(dtype=dt), rn64.to(dtype=dt)
        for B in batches:
            g = torch.Generator().manual_seed(0)
            q = ro.random_q(B, generator=g).to(dt)
            v = torch.randn(B, ro.nv, generator=g, dtype=torch.float64).to(dt)
            a = torch.randn(B, ro.nv, generator=g, dtype=torch.float64).to(dt)
            Fo = fns(Do, Ko, ro, q, v, a, ro.link_names[-1]); Fn = fns(Dn, Kn, rn, q, v, a, rn.link_names[-1])
            for op in ops:
                if op == "aba" and not fb:
                    continue
                ctx = torch.enable_grad if op.endswith("grad") else torch.no_grad
                with ctx():
                    fo, fn = Fo[op], Fn[op]
                    fo(); fn(); fo(); fn()
                    to, tn = [], []
                    end = time.perf_counter() + SECONDS
                    while len(to) < 5 or (time.perf_counter() < end and len(to) < 40 * SECONDS / 0.6):
                        for f, ts in ((fo, to), (fn, tn)) if len(to) % 2 == 0 else ((fn, tn), (fo, to)):
                            t0 = time.thread_time(); f(); ts.append(time.thread_time() - t0)
                o, n = min(to), min(tn)
                print(f"| {rname} | {str(dt)[-7:]} | {B} | {op} | {o*1e3:.3f} | {n*1e3:.3f} | {n/o:.2f}{' !' if n/o > 1.1 else ''} |", flush=True)
