"""Before/after timing of the serial chain (``SerialChainKinematics``) of two
checkouts of backdrive in ONE process, interleaved.

As ``benchmarks/compare_checkouts.py``: copies ``OLD/backdrive`` and
``NEW/backdrive`` (two ``src`` folders, e.g. ``git archive`` of the old
commit) to a temporary folder as the packages ``bdold`` and ``bdnew``, then
times every row with the two alternating within each repeat (thread CPU time,
one torch thread, minimum and median over repeats), so that outside load
hits both alike. Rows: the Panda chain (``panda_hand_tcp``, float32) FK, FK + Jacobian,
FK + Jacobian forward+backward, IK (16 iterations) forward and
forward+backward, at the given batch sizes. Prints a markdown table of
new/old.

    python benchmarks/compare_chain_checkouts.py OLD_SRC NEW_SRC 1,64,256,1000,10000

``REPEATS`` (environment, default 7): interleaved repeats per row;
``ROWS`` (default all): the rows to time, comma-separated (``FK``,
``FK + Jacobian``, ...); ``THREADS`` (default 1): torch threads (thread CPU time then counts only the
calling thread: compare wall clocks with ``CLOCK=wall``).
"""
import os
import statistics
import sys
import time

import torch

torch.set_num_threads(int(os.environ.get("THREADS", "1")))
_now = time.perf_counter if os.environ.get("CLOCK") == "wall" else time.thread_time
OLD, NEW = sys.argv[1], sys.argv[2]
batches = [int(x) for x in (sys.argv[3] if len(sys.argv) > 3 else "1,64,256,1000,10000").split(",")]
REPEATS = int(os.environ.get("REPEATS", "7"))  # interleaved repeats per row (minimum taken)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _checkouts import import_pair  # noqa: E402

import_pair(OLD, NEW)
import bdnew  # noqa: E402
import bdold  # noqa: E402
from bdnew.kinematics import DifferentiableIKCfg as CfgN  # noqa: E402
from bdnew.kinematics import SerialChainKinematics as ChainN  # noqa: E402
from bdnew.layers import DifferentiableFKLayer as FKN, DifferentiableIKLayer as IKN  # noqa: E402
from bdold.kinematics import DifferentiableIKCfg as CfgO  # noqa: E402
from bdold.kinematics import SerialChainKinematics as ChainO  # noqa: E402
from bdold.layers import DifferentiableFKLayer as FKO, DifferentiableIKLayer as IKO  # noqa: E402

path = str(bdnew.data.get_data_path("panda"))


def layers(Chain, FK, IK, Cfg):
    fk = FK(Chain.from_urdf(path, end_link_name="panda_hand_tcp"))
    return fk, IK(fk, Cfg())


def rows(fk, ik, q, targets):
    qg, tg = q.clone().requires_grad_(), targets.clone().requires_grad_()

    def fb():
        T, J = fk.evaluate(qg)
        (T.sum() + J.sum()).backward()

    def ik_fb():
        ik.solve(tg).qpos.sum().backward()

    return {
        "FK": (lambda: fk(q), False),
        "FK + Jacobian": (lambda: fk.evaluate(q), False),
        "FK + Jacobian forward+backward": (fb, True),
        "IK 16 iterations, forward": (lambda: ik.solve(targets), False),
        "IK 16 iterations, forward+backward": (ik_fb, True),
    }


def clock(fn, grad, n):
    ctx = torch.enable_grad if grad else torch.no_grad
    with ctx():
        t0 = _now()
        for _ in range(n):
            fn()
        return (_now() - t0) / n


fo, io = layers(ChainO, FKO, IKO, CfgO)
fn_, in_ = layers(ChainN, FKN, IKN, CfgN)
print("| row | batch | old min | new min | new/old min | old median | new median | new/old median |")
print("|---|---|---|---|---|---|---|---|", flush=True)
for B in batches:
    g = torch.Generator().manual_seed(0)
    q = fo.lower + (fo.upper - fo.lower) * torch.rand(B, 7, generator=g)
    with torch.no_grad():
        targets = fo(fo.lower + (fo.upper - fo.lower) * torch.rand(B, 7, generator=g))
    if B == 1:
        q, targets = q[0], targets[0]
    Ro, Rn = rows(fo, io, q, targets), rows(fn_, in_, q, targets)
    wanted = os.environ.get("ROWS")
    for name in Ro:
        if wanted and name not in wanted.split(","):
            continue
        (f_o, grad), (f_n, _) = Ro[name], Rn[name]
        # Calls per timing: about 20 ms of work each.
        t1 = clock(f_o, grad, 1)
        inner = max(1, int(0.02 / max(t1, 1e-6)))
        to, tn = [], []
        for _ in range(REPEATS):
            to.append(clock(f_o, grad, inner))
            tn.append(clock(f_n, grad, inner))
        ms = lambda t: f"{t * 1e3:.3f} ms"  # noqa: E731
        mo, mn = statistics.median(to), statistics.median(tn)
        print(
            f"| {name} | {B:,} | {ms(min(to))} | {ms(min(tn))} | {min(tn) / min(to):.2f} "
            f"| {ms(mo)} | {ms(mn)} | {mn / mo:.2f} |",
            flush=True,
        )
