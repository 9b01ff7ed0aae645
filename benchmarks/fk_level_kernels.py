"""The tree's fast FK level kernel against a GEMM level kernel in the serial
chain's transposed batch-last form (issue 15, docs/kinematics.md "One
reference FK"). Forward only, no gradient; one torch thread, thread CPU
time, minimum of interleaved repeats.

The GEMM kernel keeps one transposed rotation per body, ``RT (nb, 3, 3, N)``
(``RT[b, c, r] = R_b[r, c]``); a level is one GEMM of its bodies' constant
``10 x 3`` (``11 x 3`` with prismatic joints) blocks ``[Rpl, Rpl K, Rpl K^2,
p_pl(, Rpl a)]^T`` with the parent's ``RT`` viewed as ``3 x 3N`` (one shared
parent), or a ``bmm`` with the gathered parents, then the Rodrigues mix; for
a width-1 level that is exactly the chain's step. The result is permuted to
the tree's ``(3, 3, nb, N)`` layout that the dynamics consume. Not used by
the library: it loses to the elementwise kernel from 1,000 samples.

    python benchmarks/fk_level_kernels.py [robots] [batches] [dtype]
    python benchmarks/fk_level_kernels.py panda,quadruped,g1 256,1000,10000 float32
"""
import sys
import time

import torch

from backdrive.data import load
from backdrive.kinematics import _fk
from backdrive.kinematics._schedule import tree_schedule
from backdrive.spatial import quat_to_matrix

torch.set_num_threads(1)


def build(model):
    c = _fk._cache(model)
    perm = torch.tensor([b - 1 for b in tree_schedule(model).order[1:]])
    Rpl, A, B, ppl, Rax = (c[k].index_select(0, perm) for k in ("Rpl", "A", "B", "ppl", "Raxis"))
    blocks = torch.cat([Rpl, A, B, ppl[:, :, None], Rax[:, :, None]], 2)  # (n, 3, 11)
    bt = blocks.transpose(1, 2).contiguous()[:, : 11 if c["has_pri"] else 10]
    lv = [
        (sl, par, bt[sl].contiguous(), bt[sl].reshape(-1, 3).contiguous())
        for sl, par in zip(c["level_slices"], c["level_parents"])
    ]
    return {"lv": lv, "perm": perm, "pri": c["has_pri"], "is_pri": c["is_pri"].index_select(0, perm)[:, None]}


def fk_gemm(model, k, qf):
    N = qf.shape[0]
    theta = _fk.joint_values(model, qf).T.index_select(0, k["perm"])
    d = theta * k["is_pri"] if k["pri"] else None
    ang = theta - d if k["pri"] else theta
    s, omc = torch.sin(ang), 1.0 - torch.cos(ang)
    if model.floating_base:
        RT0 = quat_to_matrix(qf[:, 3:7]).permute(2, 1, 0)[None].contiguous()
        p0 = qf[:, 0:3].T[None].contiguous()
    else:
        RT0 = torch.eye(3, dtype=qf.dtype)[None, :, :, None].expand(1, 3, 3, N)
        p0 = qf.new_zeros(1, 3, N)
    RTs, ps = [RT0], [p0]
    for sl, par, bt, btflat in k["lv"]:
        RTp, pp = RTs[-1], ps[-1]
        w, m = bt.shape[0], bt.shape[1]
        if par is None:  # every body of the level has the one parent
            X = (btflat @ RTp.reshape(3, 3 * N)).view(w, m, 3, N)
        else:
            RTp, pp = _fk._take(RTp, par, 0), _fk._take(pp, par, 0)
            X = torch.bmm(bt, RTp.reshape(w, 3, 3 * N)).view(w, m, 3, N)
        RT = torch.addcmul(torch.addcmul(X[:, 0:3], s[sl][:, None, None], X[:, 3:6]), omc[sl][:, None, None], X[:, 6:9])
        p = X[:, 9] + pp
        if d is not None:
            p = p + d[sl][:, None] * X[:, 10]
        RTs.append(RT)
        ps.append(p)
    RT, p = torch.cat(RTs, 0), torch.cat(ps, 0)
    return RT.permute(2, 1, 0, 3).contiguous(), p.permute(1, 0, 2).contiguous()


def clock(f, n):
    t0 = time.thread_time()
    for _ in range(n):
        f()
    return (time.thread_time() - t0) / n


def main():
    robots = (sys.argv[1] if len(sys.argv) > 1 else "panda,quadruped,g1").split(",")
    batches = [int(x) for x in (sys.argv[2] if len(sys.argv) > 2 else "256,1000,10000").split(",")]
    dtype = getattr(torch, sys.argv[3] if len(sys.argv) > 3 else "float32")
    names = {"g1": "example-robot-data:g1"}
    print("| robot | batch | elementwise ms | GEMM ms | GEMM/elementwise |\n|---|---|---|---|---|")
    for r in robots:
        m = load(names.get(r, r), floating_base=r != "panda").to(dtype=dtype)
        k = build(m)
        for N in batches:
            qf = m.random_q(N, generator=torch.Generator().manual_seed(0)).to(dtype)
            with torch.no_grad():
                Ro, po = _fk._fk_fast(m, qf, True)[:2]
                Rn, pn = fk_gemm(m, k, qf)
                tol = 1e-4 if dtype == torch.float32 else 1e-12
                assert (Ro - Rn).abs().max() < tol and (po - pn).abs().max() < tol
                fo, fn = (lambda: _fk._fk_fast(m, qf, True)), (lambda: fk_gemm(m, k, qf))
                inner = max(1, int(0.02 / clock(fo, 2)))
                a = b = float("inf")
                for _ in range(9):
                    a, b = min(a, clock(fo, inner)), min(b, clock(fn, inner))
            print(f"| {r} | {N:,} | {a * 1e3:.3f} | {b * 1e3:.3f} | {b / a:.2f} |", flush=True)


if __name__ == "__main__":
    main()
