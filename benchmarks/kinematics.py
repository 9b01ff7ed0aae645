"""Kinematics side by side: backdrive vs pytorch_kinematics, EmbodiChain and Pinocchio.

Runs every library on the same Panda (the shipped model, tool frame
``panda_hand_tcp``), on the CPU, in float32, in one process, and prints a
markdown table of wall-clock times and ratios (peer time / backdrive time, so
above 1 means backdrive is faster). Ratios from one run are the result; the
absolute times depend on the machine and its load.

    python benchmarks/kinematics.py            # full run (about a minute)
    python benchmarks/kinematics.py --quick    # fewer repeats, multi-start on 200 targets
    python benchmarks/kinematics.py --sweep    # backdrive alone: FK, Jacobian, IK at batch 1 to 10,000

Peers are optional: ``pip install pytorch-kinematics==0.10.0`` and
``pip install --no-deps embodichain==0.3.2``; a missing one shows as "n/a".
Pinocchio (``pin``) provides the per-sample C++ loop.
"""

from __future__ import annotations

import argparse
import platform
import re
import statistics
import sys
import time
import warnings
from dataclasses import dataclass, field

import torch

from backdrive.data import get_data_path
from backdrive.kinematics import DifferentiableIKCfg, SerialChainKinematics
from backdrive.layers import DifferentiableFKLayer, DifferentiableIKLayer

END_LINK = "panda_hand_tcp"
MULTISTART_CFG = dict(num_seeds=32, max_iterations=24, step_size=1.0, pos_eps=1e-3, rot_eps=1e-2)


def timeit(fn, repeats: int, warmup: int = 5, best: bool = False) -> float:
    """Median (or, with ``best``, minimum) wall-clock seconds of ``fn()`` over
    ``repeats`` runs, after ``warmup`` untimed runs (the first calls of a
    large batch pay for growing the process heap)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times) if best else statistics.median(times)


def fmt_time(t: float | None) -> str:
    if t is None:
        return "n/a"
    if t < 1e-3:
        return f"{t * 1e6:.1f} us"
    if t < 1.0:
        return f"{t * 1e3:.2f} ms"
    return f"{t:.2f} s"


@dataclass
class Row:
    case: str
    backdrive: float | None
    peers: dict = field(default_factory=dict)  # name -> seconds (or None)
    target: str = ""
    note: str = ""


# ---------------------------------------------------------------------- peers


def load_pk(urdf_text: str):
    try:
        import pytorch_kinematics as pk
    except ImportError:
        return None
    return pk, pk.build_serial_chain_from_urdf(urdf_text, END_LINK).to(dtype=torch.float32)


def load_embodichain(urdf_text: str):
    try:
        from embodichain.compute.kinematics import DifferentiableIKCfg as ECfg
        from embodichain.compute.kinematics.serial_chain import SerialChainKinematics as ESerial
        from embodichain.learning.layers import DifferentiableIKLayer as EIK
        from embodichain.learning.layers import KinematicsLayer as EFK
    except ImportError:
        return None
    fk = EFK(ESerial.from_urdf(urdf_text, END_LINK))
    return fk, EIK(fk, ECfg())


def load_pin(path: str):
    try:
        import pinocchio as pin
    except ImportError:
        return None
    model = pin.buildModelFromUrdf(path, mimic=True)
    return pin, model, model.createData(), model.getFrameId(END_LINK)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer repeats, multi-start on 200 targets")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    ap.add_argument(
        "--sweep", action="store_true", help="backdrive alone: FK, Jacobian and IK rows at batch 1 to 10,000"
    )
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    if args.sweep:
        print(sweep(args.quick))
        return 0
    reps = 3 if args.quick else 7
    n_ik = 1000
    n_ms = 200 if args.quick else 1000

    path = str(get_data_path("panda"))
    # pytorch_kinematics (and so EmbodiChain) refuses XML text with an
    # encoding declaration: strip it for the peers.
    urdf_text = re.sub(r"^\s*<\?xml[^>]*\?>", "", open(path).read())
    chain = SerialChainKinematics.from_urdf(path, end_link_name=END_LINK)
    fk = DifferentiableFKLayer(chain)
    ik = DifferentiableIKLayer(fk, DifferentiableIKCfg())
    pk_ = load_pk(urdf_text)
    ec = load_embodichain(urdf_text)
    pn = load_pin(path)

    g = torch.Generator().manual_seed(0)
    rows: list[Row] = []

    # ------------------------------------------------------------ FK + Jacobian, batch 10000
    q = fk.lower + (fk.upper - fk.lower) * torch.rand(10_000, 7, generator=g)
    with torch.no_grad():
        t_bd = timeit(lambda: fk.evaluate(q), reps)
        peers = {}
        if pk_:
            pkc = pk_[1]
            peers["pytorch_kinematics"] = timeit(lambda: pkc.jacobian(q, ret_eef_pose=True), reps)
        if ec:
            peers["EmbodiChain"] = timeit(lambda: ec[0].evaluate(q), reps)
    if pn:
        pin, pm, pd, fid = pn
        qn = q.double().numpy()
        fix = _pin_q_fixer(pin, pm, chain)

        def pin_loop():
            for row in qn:
                qp = fix(row)
                pin.computeJointJacobians(pm, pd, qp)
                pin.updateFramePlacements(pm, pd)
                pin.getFrameJacobian(pm, pd, fid, pin.LOCAL_WORLD_ALIGNED)

        peers["Pinocchio loop"] = timeit(pin_loop, 1 if args.quick else 3, warmup=1)
    rows.append(Row("FK + Jacobian, batch 10000", t_bd, peers, ">= 3x pytorch_kinematics"))

    # ------------------------------------------------------------ forward + backward, batch 10000
    qg = q.clone().requires_grad_()

    def bd_fb():
        T, J = fk.evaluate(qg)
        (T.sum() + J.sum()).backward()

    peers = {}
    t_bd = timeit(bd_fb, reps)
    if pk_:
        def pk_fb():
            J, T = pk_[1].jacobian(qg, ret_eef_pose=True)
            (T.sum() + J.sum()).backward()

        peers["pytorch_kinematics"] = timeit(pk_fb, reps)
    if ec:
        def ec_fb():
            T, J = ec[0].evaluate(qg)
            (T.sum() + J.sum()).backward()

        peers["EmbodiChain"] = timeit(ec_fb, reps)
    rows.append(Row("FK + Jacobian forward+backward, batch 10000", t_bd, peers, ">= 5x EmbodiChain"))

    # ------------------------------------------------------------ batch-1 FK latency
    q1 = q[0].clone()
    r1 = 300 if args.quick else 2000
    with torch.no_grad():
        t_bd = timeit(lambda: fk(q1), r1, warmup=50)
        peers = {}
        if pk_:
            peers["pytorch_kinematics"] = timeit(lambda: pk_[1].forward_kinematics(q1), r1, warmup=20)
        if ec:
            peers["EmbodiChain"] = timeit(lambda: ec[0](q1[None]), r1, warmup=20)
    if pn:
        qp1 = fix(q1.double().numpy())
        peers["Pinocchio loop"] = timeit(
            lambda: (pin.forwardKinematics(pm, pd, qp1), pin.updateFramePlacement(pm, pd, fid)), r1, warmup=50
        )
    rows.append(Row("FK latency, batch 1 (median)", t_bd, peers, "< 0.1 ms"))
    # On a shared machine the median carries other processes' load; the best
    # of many calls is the uncontended cost.
    with torch.no_grad():
        t_bd = timeit(lambda: fk(q1), r1, warmup=50, best=True)
        peers = {}
        if pk_:
            peers["pytorch_kinematics"] = timeit(lambda: pk_[1].forward_kinematics(q1), r1, best=True)
        if ec:
            peers["EmbodiChain"] = timeit(lambda: ec[0](q1[None]), r1, best=True)
    if pn:
        peers["Pinocchio loop"] = timeit(
            lambda: (pin.forwardKinematics(pm, pd, qp1), pin.updateFramePlacement(pm, pd, fid)), r1, best=True
        )
    rows.append(Row("FK latency, batch 1 (best of runs)", t_bd, peers, "< 0.1 ms"))

    # ------------------------------------------------------------ IK, 16 iterations
    q_true = fk.lower + (fk.upper - fk.lower) * torch.rand(n_ik, 7, generator=g)
    with torch.no_grad():
        targets = fk(q_true)
    ik_reps = 1 if args.quick else 3
    with torch.no_grad():
        t_bd = timeit(lambda: ik.solve(targets), ik_reps, warmup=1)
        peers = {"EmbodiChain": timeit(lambda: ec[1].solve(targets), ik_reps, warmup=1)} if ec else {}
    rows.append(Row(f"IK {n_ik} targets, 16 iterations, forward", t_bd, peers, ">= 3x EmbodiChain"))

    tg = targets.clone().requires_grad_()

    def bd_ik_fb():
        ik.solve(tg).qpos.sum().backward()

    peers = {}
    t_bd = timeit(bd_ik_fb, ik_reps, warmup=1)
    if ec:
        def ec_ik_fb():
            ec[1].solve(tg).qpos.sum().backward()

        peers["EmbodiChain"] = timeit(ec_ik_fb, ik_reps, warmup=1)
    rows.append(Row(f"IK {n_ik} targets, 16 iterations, forward+backward", t_bd, peers, ">= 3x EmbodiChain"))

    # ------------------------------------------------------------ success rates
    with torch.no_grad():
        res = ik.solve(targets)
        bd_rate = res.success.float().mean().item()
        lm = DifferentiableIKLayer(fk, DifferentiableIKCfg(adaptive_damping=True)).solve(targets)
        lm_rate = lm.success.float().mean().item()
        ec_rate = ec[1].solve(targets).success.float().mean().item() if ec else None
    success_lines = [
        f"| IK success, default seed, 16 iterations (5e-4 m / 5e-4 rad) | {bd_rate:.1%} "
        f"| {'n/a' if ec_rate is None else f'{ec_rate:.1%}'} (EmbodiChain) | same algorithm: equal is the floor |",
        f"| same, `adaptive_damping=True` (LM) | {lm_rate:.1%} | | higher success per iteration |",
    ]

    # ------------------------------------------------------------ multi-start vs pk PseudoInverseIK
    ms_ik = DifferentiableIKLayer(fk, DifferentiableIKCfg(**MULTISTART_CFG))
    targets = targets[:n_ms]
    t0 = time.perf_counter()
    with torch.no_grad():
        ms = ms_ik.solve(targets)
    t_ms = time.perf_counter() - t0
    ms_rate = ms.success.float().mean().item()
    pk_rate, t_pk = None, None
    if pk_:
        pk, pkc = pk_
        limits = torch.stack([fk.lower, fk.upper], dim=1)
        solver = pk.PseudoInverseIK(
            pkc, num_retries=10, joint_limits=limits, pos_tolerance=1e-3, rot_tolerance=1e-2
        )
        t0 = time.perf_counter()
        sol = solver.solve(pk.Transform3d(matrix=targets))
        t_pk = time.perf_counter() - t0
        pk_rate = _pk_success(sol, targets, fk)
    rows.append(
        Row(
            f"multi-start IK, {n_ms} targets (K=32, 24 iterations)",
            t_ms,
            {"pytorch_kinematics": t_pk} if t_pk is not None else {},
            "faster than pk PseudoInverseIK, 10 retries",
        )
    )
    success_lines.append(
        f"| multi-start success (1 mm / 0.01 rad), K=32, 24 iterations | {ms_rate:.1%} "
        f"| {'n/a' if pk_rate is None else f'{pk_rate:.1%}'} (pk PseudoInverseIK, 10 retries) | >= 99.5% |"
    )

    print(_table(rows, success_lines, args, n_ik))
    return 0


SWEEP_BATCHES = (1, 64, 256, 1_000, 10_000)


def sweep(quick: bool = False) -> str:
    """Median times of the serial chain's FK, Jacobian and IK rows at the
    batch sizes of :data:`SWEEP_BATCHES` (Panda, float32, no peers): the
    before/after table of ``docs/kinematics.md``."""
    path = str(get_data_path("panda"))
    chain = SerialChainKinematics.from_urdf(path, end_link_name=END_LINK)
    fk = DifferentiableFKLayer(chain)
    ik = DifferentiableIKLayer(fk, DifferentiableIKCfg())
    g = torch.Generator().manual_seed(0)
    cases = {}
    for n in SWEEP_BATCHES:
        # Fewer repeats for the larger batches: about the same time per row.
        reps = max(3, min(400, 200_000 // (n * 50) + 3)) // (3 if quick else 1) + 1
        q = fk.lower + (fk.upper - fk.lower) * torch.rand(n, 7, generator=g)
        if n == 1:
            q = q[0]
        qg = q.clone().requires_grad_()
        with torch.no_grad():
            targets = fk(fk.lower + (fk.upper - fk.lower) * torch.rand(*q.shape, generator=g))
        tg = targets.clone().requires_grad_()

        def fwd_bwd():
            T, J = fk.evaluate(qg)
            (T.sum() + J.sum()).backward()

        def ik_fwd_bwd():
            ik.solve(tg).qpos.sum().backward()

        with torch.no_grad():
            cases[("FK", n)] = timeit(lambda: fk(q), reps * 4)
            cases[("FK + Jacobian", n)] = timeit(lambda: fk.evaluate(q), reps * 2)
        cases[("FK + Jacobian forward+backward", n)] = timeit(fwd_bwd, reps * 2)
        ik_reps = max(3, reps // 8)
        with torch.no_grad():
            cases[("IK 16 iterations, forward", n)] = timeit(lambda: ik.solve(targets), ik_reps, warmup=2)
        cases[("IK 16 iterations, forward+backward", n)] = timeit(ik_fwd_bwd, ik_reps, warmup=2)
    names = dict.fromkeys(k for k, _ in cases)
    out = [
        f"backdrive serial chain sweep: Panda ({END_LINK}), CPU float32, torch {torch.__version__}, "
        f"{torch.get_num_threads()} thread(s), median times",
        "",
        "| row | " + " | ".join(f"batch {n:,}" for n in SWEEP_BATCHES) + " |",
        "|---|" + "---|" * len(SWEEP_BATCHES),
    ]
    for name in names:
        out.append(f"| {name} | " + " | ".join(fmt_time(cases[(name, n)]) for n in SWEEP_BATCHES) + " |")
    return "\n".join(out)


def _pin_q_fixer(pin, pm, chain):
    """Map chain joints (7,) to Pinocchio's q (arm joints by name, fingers neutral)."""
    import numpy as np

    idx = [pm.joints[pm.getJointId(n)].idx_q for n in chain.joint_names]
    base = pin.neutral(pm)

    def fix(row):
        out = base.copy()
        out[idx] = row
        return np.asarray(out)

    return fix


def _pk_success(sol, targets, fk) -> float:
    """Share of targets whose best pk retry is within 1 mm / 0.01 rad and the
    limits, judged with the same FK and pose error as backdrive's solutions."""
    from backdrive.kinematics import pose_error

    score = sol.err_pos / 1e-3 + sol.err_rot / 1e-2  # (targets, retries)
    best = score.argmin(dim=1)
    q = sol.solutions[torch.arange(len(best)), best].to(fk.dtype)
    with torch.no_grad():
        pe, re = pose_error(fk(q), targets)
    within = ((q >= fk.lower - 1e-6) & (q <= fk.upper + 1e-6)).all(-1)
    ok = (pe.norm(dim=-1) <= 1e-3) & (re.norm(dim=-1) <= 1e-2) & within
    return float(ok.float().mean())


def _ratio(x: float) -> str:
    return f"{x:.1f}x" if x >= 1 else f"{x:.2g}x"


def _table(rows: list[Row], success_lines: list[str], args, n_ik: int) -> str:
    names = ["pytorch_kinematics", "EmbodiChain", "Pinocchio loop"]
    head = "| case | backdrive | " + " | ".join(names) + " | ratios (peer / backdrive) | target |"
    sep = "|" + "---|" * (len(names) + 4)
    out = [
        f"backdrive kinematics benchmark: Panda ({END_LINK}), CPU float32, torch {torch.__version__}, "
        f"{args.threads} thread(s), Python {platform.python_version()}, {'quick' if args.quick else 'full'} run",
        "",
        head,
        sep,
    ]
    for r in rows:
        cells = [fmt_time(r.peers.get(n)) for n in names]
        ratios = ", ".join(
            f"{n.split()[0] if n != 'pytorch_kinematics' else 'pk'} {_ratio(r.peers[n] / r.backdrive)}"
            for n in names
            if r.peers.get(n) is not None and r.backdrive
        )
        out.append(f"| {r.case} | {fmt_time(r.backdrive)} | " + " | ".join(cells) + f" | {ratios} | {r.target} |")
    out += ["", "| success | backdrive | peer | target |", "|---|---|---|---|", *success_lines]
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
