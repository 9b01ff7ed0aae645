"""Rigid-body dynamics side by side: backdrive vs Pinocchio, on the CPU.

Runs inverse dynamics (RNEA), the mass matrix (CRBA) and forward dynamics at
batch 1, 100 and 10000 for the Panda (shipped model, fingers as independent
joints so that Pinocchio's ``aba`` accepts it: nv = 9), the shipped
floating-base quadruped (nv = 18) and the G1 humanoid of example-robot-data
(floating, nv = 35; ``--no-humanoid`` leaves it out), in one process, and
prints markdown tables. backdrive runs inside
``backdrive.runtime.reuse_workspaces()``, as in its own loops (the first
table also shows glibc's default and ``retain_freed_memory()``). A table
measured with another process busy on one core compares torch on 2 threads,
on 1, and backdrive's choice (``runtime.threads_for_batch``).

* backdrive: one batched call, float32 and float64; forward dynamics by the
  default ``method="auto"`` (from 96 samples with a gradient, 192 without,
  the fast, batch-last path:
  sparse CRBA with a tree-sparse LTDL factorisation and an analytic
  backward; below, the reference path: CRBA with a batched Cholesky solve,
  plain autograd), by ``"crba"`` (dense CRBA and Cholesky,
  plain autograd) and by ABA.
* Pinocchio per sample: its C++ called once per sample from a Python loop.
* Pinocchio in parallel: ``rneaInParallel`` / ``abaInParallel`` with a
  ``ModelPool`` and 2 threads on column-stacked ``(nq, B)`` arrays.
* backdrive compiled: ``compile_forward_dynamics`` (``torch.compile`` with
  inductor's C++ kernels; one compilation per robot, dtype and batch, whose
  time is listed in a table of its own; ``--no-compile`` skips it).
* Gradients at batch 10000: forward + backward of ``forward_dynamics`` (the
  gradient of a scalar loss with respect to q, v and tau) against its forward
  alone (measured alternately), for ``"auto"`` and ``"crba"``, and against
  ``pin.computeABADerivatives`` per sample (which returns the full Jacobians).

Ratios compare against backdrive float64 (peer time / backdrive time: above 1
means backdrive is faster). Quote ratios from one run; absolute times depend
on the machine and its load.

Timing: the functions of one row run in turn within each repeat (so that
bursts of outside load hit them alike), and each gets the minimum over
repeats of the calling thread's CPU time
(``time.thread_time``) for everything that runs on one thread (backdrive
with ``torch.set_num_threads(1)``, the default here, and the per-sample
loops), which is robust to other processes sharing the machine and to
Pinocchio's OpenMP workers still spinning after a parallel call; Pinocchio's
parallel functions use several threads, so they get the minimum wall-clock
time. ``--wall`` uses wall-clock time everywhere (on a quiet machine) and
``--threads N`` gives torch N threads (wall-clock time then; ``--threads 2``
matches the 2 threads Pinocchio's parallel functions get).

    python benchmarks/dynamics.py            # full run (a few minutes)
    python benchmarks/dynamics.py --quick    # fewer repeats
    python benchmarks/dynamics.py --no-compile   # without the torch.compile rows
    python benchmarks/dynamics.py --large-only   # the first table alone (wall clock, 15 rounds; ~2 minutes)
"""

from __future__ import annotations

import os

import argparse
import contextlib
import platform
import re
import subprocess
import sys
import time

import numpy as np
import torch

import backdrive.dynamics as D
from backdrive import RobotModel, runtime
from backdrive.data import get_data_path

BATCHES = (1, 100, 10000)
PIN_THREADS = 2
#: Include the G1 humanoid of example-robot-data (``--no-humanoid`` leaves it out).
HUMANOID = True
#: ``--one-thread``: leave out the first table's rows with torch on 2 threads.
ONE_THREAD = False


# CPU time of the calling thread: with torch on one thread, everything but
# Pinocchio's parallel functions runs on it, and OpenMP workers that Pinocchio
# left spinning (or other processes) are not counted. --wall switches to
# perf_counter.
CLOCK = time.thread_time


def timeit(fn, repeats: int, warmup: int = 1, clock=None) -> float:
    """Minimum seconds of ``fn()`` over ``repeats`` runs, on ``clock`` (default :data:`CLOCK`)."""
    clock = clock or CLOCK
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = clock()
        fn()
        times.append(clock() - t0)
    return min(times)


def timeit_round_robin(fns: dict, repeats: int) -> dict:
    """Minimum seconds of each ``fn`` in ``{key: (fn, clock)}``, the functions
    run in turn within each repeat, so that a burst of outside load hits them
    alike (this machine is shared)."""
    for fn, _ in fns.values():
        fn()
    times = {k: [] for k in fns}
    for _ in range(repeats):
        for k, (fn, clock) in fns.items():
            t0 = clock()
            fn()
            times[k].append(clock() - t0)
    return {k: min(v) for k, v in times.items()}


def timeit_pair(fn_a, fn_b, repeats: int) -> tuple[float, float]:
    """Minimum seconds of ``fn_a()`` and of ``fn_b()``, run alternately."""
    fn_a()
    fn_b()
    ta, tb = [], []
    for _ in range(repeats):
        t0 = CLOCK()
        fn_a()
        ta.append(CLOCK() - t0)
        t0 = CLOCK()
        fn_b()
        tb.append(CLOCK() - t0)
    return min(ta), min(tb)


#: torch's intra-op threads for backdrive (``--threads``).
THREADS = 1


def with_threads(x, threads: int | None = None):
    """Set torch's thread count (``THREADS`` by default) and return ``x``.

    Pinocchio and torch load the same OpenMP runtime (``libgomp.so.1``), and
    Pinocchio's parallel functions set its thread count to their own (2): left
    alone, every backdrive call after one of them would silently run on 2
    threads. Each timed backdrive call therefore sets the count first.
    """
    torch.set_num_threads(THREADS if threads is None else threads)
    return x


def large_batch_table(reps: int, retain: bool = False) -> list[str]:
    """Forward dynamics at batch 10000 under the CPU settings that decide it:
    glibc's default allocator, backdrive's own :class:`backdrive.runtime.reuse_workspaces`
    (no change to the allocator) and, with ``retain``, the process-wide
    :func:`backdrive.runtime.retain_freed_memory`, with torch on 1 or 2
    threads, beside Pinocchio's ``abaInParallel`` (2 threads). ``retain``
    cannot be undone in a process: run it last."""
    import pinocchio as pin

    batch = BATCHES[-1]
    lines = [] if retain else [
        "| robot | memory | torch threads | clock | backdrive f32 | backdrive f64 | "
        f"Pinocchio abaInParallel ({PIN_THREADS} threads, wall) | abaInParallel / f32 | abaInParallel / f64 |",
        "|" + " --- |" * 9,
    ]
    setups = []
    for name, rb64, pm in robots():
        q, v, a = states(rb64, batch)
        pool = pin.ModelPool(pm, PIN_THREADS)
        Qc, Vc, Ac = (np.asfortranarray(x.T) for x in (to_pin_q(rb64, q), v.numpy(), a.numpy()))
        out = np.zeros((pm.nv, batch), order="F")
        setups.append((name, rb64, (q, v, a), lambda pool=pool, Qc=Qc, Vc=Vc, Ac=Ac, out=out: pin.abaInParallel(
            PIN_THREADS, pool, Qc, Vc, Ac, out)))
    settings = (("glibc default", 1), ("reuse_workspaces()", 1), ("reuse_workspaces()", 2))
    if retain:
        settings = (("retain_freed_memory()", 1), ("retain_freed_memory()", 2))
    if ONE_THREAD:  # --one-thread: no torch rows on 2 threads (meaningless on a loaded machine)
        settings = tuple(x for x in settings if x[1] == 1)
        runtime.retain_freed_memory()
    for allocator, threads in settings:
        clock = time.thread_time if threads == 1 and CLOCK is time.thread_time else time.perf_counter
        ws = runtime.reuse_workspaces() if allocator == "reuse_workspaces()" else contextlib.nullcontext()
        for name, rb64, (q, v, a), parallel in setups:
            rb32 = rb64.float()
            q32, v32, a32 = q.float(), v.float(), a.float()
            fns = {
                "f32": (lambda: D.forward_dynamics(with_threads(rb32, threads), q32, v32, a32), clock),
                "f64": (lambda: D.forward_dynamics(with_threads(rb64, threads), q, v, a), clock),
                "parallel": (parallel, time.perf_counter),
            }
            with torch.no_grad(), ws:
                t = timeit_round_robin(fns, reps)
            lines.append(
                f"| {name} | {allocator} | {threads} | {'thread CPU' if clock is time.thread_time else 'wall'} | "
                f"{fmt_time(t['f32'])} | {fmt_time(t['f64'])} | {fmt_time(t['parallel'])} | "
                f"{fmt_ratio(t['parallel'], t['f32'])} | {fmt_ratio(t['parallel'], t['f64'])} |"
            )
            print(lines[-1], flush=True)
    with_threads(None)
    return lines


def competing_load_table(reps: int) -> list[str]:
    """Wall-clock time with another process busy on one core (a Python loop
    that never sleeps), as on a user's laptop: a 50-step rollout of the
    floating-base quadruped without gradient at a small batch (64), and
    forward dynamics at batch 10000, with torch on 2
    threads throughout, on 1 thread, and as backdrive chooses
    (:class:`backdrive.runtime.threads_for_batch`, which the simulator and
    the trainers enter: one thread below ``SMALL_BATCH`` samples, above it
    the cores other processes leave free)."""
    from backdrive.sim import Simulator

    quad = RobotModel.from_urdf(str(get_data_path("quadruped")), floating_base=True).float()
    sim = Simulator(quad, dt=0.002)
    lines = [
        "| under load (one other process busy on one core) | batch | torch 2 threads | torch 1 thread | "
        "backdrive's choice | 2 threads / choice |",
        "|" + " --- |" * 6,
    ]
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.5)
        for what, batch in (("rollout, 50 steps (quadruped)", 64), ("forward_dynamics (quadruped)", 10000)):
            q, v, a = states(quad, batch)
            if what.startswith("rollout"):
                s0 = sim.initial_state(q, v * 0.1)
                u = sim.zero_controls(50, batch)

                def plain(s0=s0, u=u):
                    with torch.no_grad():
                        runtime.adaptive_threads(False)
                        try:
                            sim.rollout(s0, u)
                        finally:
                            runtime.adaptive_threads(True)

                def chosen(s0=s0, u=u):
                    with torch.no_grad():
                        sim.rollout(s0, u)
            else:

                def plain(q=q, v=v, a=a):
                    with torch.no_grad():
                        D.forward_dynamics(quad, q, v, a)

                def chosen(q=q, v=v, a=a):
                    with torch.no_grad(), runtime.threads_for_batch(batch):
                        D.forward_dynamics(quad, q, v, a)

            fns = {
                "2": (lambda f=plain: (with_threads(None, 2), f()), time.perf_counter),
                "1": (lambda f=plain: (with_threads(None, 1), f()), time.perf_counter),
                "choice": (lambda f=chosen: (with_threads(None, 2), f()), time.perf_counter),
            }
            t = timeit_round_robin(fns, reps)
            lines.append(
                f"| {what} | {batch} | {fmt_time(t['2'])} | {fmt_time(t['1'])} | {fmt_time(t['choice'])} | "
                f"{t['2'] / t['choice']:.2f} |"
            )
            print(lines[-1], flush=True)
    finally:
        busy.kill()
        busy.wait()
        with_threads(None)
    return lines


def fmt_time(t: float | None) -> str:
    if t is None:
        return "n/a"
    if t < 1e-3:
        return f"{t * 1e6:.0f} us"
    if t < 1.0:
        return f"{t * 1e3:.2f} ms"
    return f"{t:.2f} s"


def fmt_ratio(peer: float | None, ours: float | None) -> str:
    if peer is None or ours is None:
        return "n/a"
    return f"{peer / ours:.2f}"


def robots():
    """(name, backdrive model, Pinocchio model) for the two benchmark robots."""
    import pinocchio as pin

    panda_text = get_data_path("panda").read_text()
    # Independent fingers: Pinocchio's aba rejects mimic joints.
    panda_text = re.sub(r"<mimic[^>]*/>", "", panda_text)
    panda = RobotModel.from_urdf(panda_text)
    pin_panda = pin.buildModelFromXML(panda_text)
    quad_path = str(get_data_path("quadruped"))
    quad = RobotModel.from_urdf(quad_path, floating_base=True)
    pin_quad = pin.buildModelFromUrdf(quad_path, pin.JointModelFreeFlyer())
    assert pin_panda.nv == panda.nv and pin_quad.nv == quad.nv
    out = [("Panda (nv 9)", panda, pin_panda), ("quadruped (nv 18, floating)", quad, pin_quad)]
    if HUMANOID:
        try:
            from backdrive.data._example_robot_data import example_robot_path

            g1_path = str(example_robot_path("g1"))
        except Exception as e:  # example-robot-data is not installed
            print(f"(no G1 humanoid rows: {e})", flush=True)
        else:
            g1 = RobotModel.from_urdf(g1_path, floating_base=True)
            pin_g1 = pin.buildModelFromUrdf(g1_path, pin.JointModelFreeFlyer())
            assert pin_g1.nv == g1.nv
            out.append(("G1 humanoid (nv 35, floating)", g1, pin_g1))
    return out


def states(robot: RobotModel, batch: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q = robot.random_q(batch, generator=g)
    v = torch.randn(batch, robot.nv, generator=g, dtype=robot.dtype)
    a = torch.randn(batch, robot.nv, generator=g, dtype=robot.dtype)
    return q, v, a


def to_pin_q(robot: RobotModel, q: torch.Tensor) -> np.ndarray:
    """``(B, nq)`` backdrive -> ``(B, nq)`` Pinocchio (quaternion xyzw)."""
    qn = q.detach().double().numpy().copy()
    if robot.floating_base:
        qn[:, 3:7] = qn[:, [4, 5, 6, 3]]
    return qn


def run(quick: bool, compile_fd: bool = True) -> str:
    import pinocchio as pin

    rep_small = 5 if quick else 20
    rep_large = 2 if quick else 8
    lines = []
    header = (
        "| robot | function | batch | backdrive f32 | backdrive f64 | Pinocchio per sample | "
        f"Pinocchio parallel ({PIN_THREADS} threads, wall) | per sample / f64 | parallel / f64 |"
    )
    lines += [header, "|" + " --- |" * 9]
    compile_lines = [
        "",
        "| robot | compile_forward_dynamics: first call (trace + compile) | batch | f32 | f64 |",
        "|" + " --- |" * 5,
    ]
    for name, rb64, pm in robots():
        pd = pm.createData()
        pool = pin.ModelPool(pm, PIN_THREADS)
        rb32 = rb64.float()
        if compile_fd:
            # One compiled function per model; it compiles once per batch shape.
            # eager_from=None: compiled kernels at every batch (by default
            # batches from 256 samples without gradient run eagerly).
            compiled = {r: D.compile_forward_dynamics(r, eager_from=None) for r in (rb32, rb64)}
        for batch in BATCHES:
            reps = rep_small if batch < 10000 else rep_large
            q, v, a = states(rb64, batch)
            q32, v32, a32 = q.float(), v.float(), a.float()
            Qp = to_pin_q(rb64, q)
            Vp, Ap = v.numpy(), a.numpy()
            # Pinocchio's parallel API: column-stacked (n, B) arrays.
            Qc, Vc, Ac = (np.asfortranarray(x.T) for x in (Qp, Vp, Ap))
            out = np.zeros((pm.nv, batch), order="F")

            def loop(f):
                def go():
                    for i in range(batch):
                        f(pm, pd, Qp[i], Vp[i], Ap[i])

                return go

            cases = [
                (
                    "inverse_dynamics",
                    lambda r, q, v, a: D.inverse_dynamics(r, q, v, a),
                    loop(pin.rnea),
                    lambda: pin.rneaInParallel(PIN_THREADS, pool, Qc, Vc, Ac, out),
                ),
                (
                    "mass_matrix",
                    lambda r, q, v, a: D.mass_matrix(r, q),
                    loop(lambda m, d, q, v, a: pin.crba(m, d, q)),
                    None,
                ),
                (
                    "forward_dynamics (auto)",
                    lambda r, q, v, a: D.forward_dynamics(r, q, v, a),
                    loop(pin.aba),
                    lambda: pin.abaInParallel(PIN_THREADS, pool, Qc, Vc, Ac, out),
                ),
                (
                    "forward_dynamics (crba)",
                    lambda r, q, v, a: D.forward_dynamics(r, q, v, a, method="crba"),
                    loop(pin.aba),
                    lambda: pin.abaInParallel(PIN_THREADS, pool, Qc, Vc, Ac, out),
                ),
                (
                    "forward_dynamics (aba)",
                    lambda r, q, v, a: D.forward_dynamics(r, q, v, a, method="aba"),
                    loop(pin.aba),
                    lambda: pin.abaInParallel(PIN_THREADS, pool, Qc, Vc, Ac, out),
                ),
            ]
            if compile_fd:
                first = {}
                for key, rb, xs in (("f32", rb32, (q32, v32, a32)), ("f64", rb64, (q, v, a))):
                    with torch.no_grad():
                        t0 = time.perf_counter()
                        compiled[rb](*xs)
                        first[key] = time.perf_counter() - t0
                compile_lines.append(
                    f"| {name} | wall clock | {batch} | {fmt_time(first['f32'])} | {fmt_time(first['f64'])} |"
                )
                print(compile_lines[-1], flush=True)
                cases.append(
                    (
                        "forward_dynamics (compiled)",
                        lambda r, q, v, a: compiled[r](q, v, a),
                        loop(pin.aba),
                        lambda: pin.abaInParallel(PIN_THREADS, pool, Qc, Vc, Ac, out),
                    )
                )
            for fname, ours, per_sample, parallel in cases:
                fns = {
                    "f32": (lambda: ours(with_threads(rb32), q32, v32, a32), CLOCK),
                    "f64": (lambda: ours(with_threads(rb64), q, v, a), CLOCK),
                    "loop": (per_sample, CLOCK),
                }
                if parallel is not None:
                    fns["parallel"] = (parallel, time.perf_counter)
                with torch.no_grad():
                    t = timeit_round_robin(fns, reps)
                t32, t64, tl, tp = t["f32"], t["f64"], t["loop"], t.get("parallel")
                lines.append(
                    f"| {name} | {fname} | {batch} | {fmt_time(t32)} | {fmt_time(t64)} | {fmt_time(tl)} | "
                    f"{fmt_time(tp)} | {fmt_ratio(tl, t64)} | {fmt_ratio(tp, t64)} |"
                )
                print(lines[-1], flush=True)

    # Gradients at the largest batch.
    grad_lines = [
        "",
        "| robot | gradient of forward_dynamics, batch 10000 | backdrive f32 | backdrive f64 | "
        "forward alone f32 | forward alone f64 | ratio f32 | ratio f64 | "
        "Pinocchio computeABADerivatives per sample | Pinocchio / f64 |",
        "|" + " --- |" * 10,
    ]
    for name, rb64, pm in robots():
        pd = pm.createData()
        batch = BATCHES[-1]
        q, v, tau = states(rb64, batch, seed=1)
        Qp, Vp, Tp = to_pin_q(rb64, q), v.numpy(), tau.numpy()

        def pin_derivs():
            for i in range(batch):
                pin.computeABADerivatives(pm, pd, Qp[i], Vp[i], Tp[i])

        tpd = timeit(pin_derivs, rep_large)
        # "auto": the analytic backward (M^-1 g and the reverse pass of RNEA);
        # "crba": plain autograd through CRBA, RNEA and the Cholesky solve.
        for method in ("auto", "crba"):
            res, fwd = {}, {}
            for key, rb in (("f32", rb64.float()), ("f64", rb64)):
                qq, vv, tt = (x.to(rb.dtype) for x in (q, v, tau))

                def fwd_bwd():
                    with_threads(None)
                    xs = [x.clone().requires_grad_(True) for x in (qq, vv, tt)]
                    D.forward_dynamics(rb, *xs, method=method).square().sum().backward()

                def fwd_only():
                    with_threads(None)
                    with torch.no_grad():
                        D.forward_dynamics(rb, qq, vv, tt, method=method)

                # Interleaved, so that both see the same load.
                res[key], fwd[key] = timeit_pair(fwd_bwd, fwd_only, rep_large)
            grad_lines.append(
                f"| {name} | forward + backward ({method}) | {fmt_time(res['f32'])} | {fmt_time(res['f64'])} | "
                f"{fmt_time(fwd['f32'])} | {fmt_time(fwd['f64'])} | {res['f32'] / fwd['f32']:.2f} | "
                f"{res['f64'] / fwd['f64']:.2f} | {fmt_time(tpd)} | {fmt_ratio(tpd, res['f64'])} |"
            )
            print(grad_lines[-1], flush=True)
    lines += grad_lines
    if compile_fd:
        lines += compile_lines
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    parser.add_argument("--wall", action="store_true", help="wall-clock time everywhere")
    parser.add_argument("--no-humanoid", action="store_true", help="leave out the G1 humanoid rows")
    parser.add_argument(
        "--one-thread", action="store_true", help="no torch rows on 2 threads in the first table (loaded machine)"
    )
    parser.add_argument(
        "--no-compile", action="store_true", help="skip the compile_forward_dynamics rows (torch.compile)"
    )
    parser.add_argument(
        "--large-only",
        action="store_true",
        help="only the first table (forward dynamics at 10,000 beside abaInParallel), wall clock, 15 rounds",
    )
    args = parser.parse_args()
    global CLOCK, THREADS, HUMANOID, ONE_THREAD
    HUMANOID = not args.no_humanoid
    ONE_THREAD = args.one_thread
    THREADS = args.threads
    torch.set_num_threads(args.threads)
    if args.wall or args.threads > 1 or args.large_only:
        CLOCK = time.perf_counter
    import pinocchio as pin

    print(
        f"backdrive dynamics benchmark: torch {torch.__version__} ({torch.get_num_threads()} threads), "
        f"pinocchio {pin.__version__}, {platform.processor() or platform.machine()}, "
        f"python {platform.python_version()}, {os.cpu_count()} cores, load average "
        f"{os.getloadavg()[0]:.1f}, {'wall-clock' if CLOCK is time.perf_counter else 'thread CPU'} time"
        f"{', quick' if args.quick else ''}\n",
        flush=True,
    )
    if args.large_only:
        large = large_batch_table(15)
        large += large_batch_table(15, retain=True)
        print("\n" + "\n".join(large))
        return
    large = large_batch_table(8 if args.quick else 30)
    loaded = competing_load_table(3 if args.quick else 8)
    # The main tables: glibc's default allocator, backdrive's workspaces (as
    # in the simulator and the trainers).
    with runtime.reuse_workspaces():
        table = run(args.quick, compile_fd=not args.no_compile)
    # Last: the process-wide allocator setting, which cannot be undone.
    large += large_batch_table(8 if args.quick else 30, retain=True)
    print("\n" + "\n".join(large) + "\n\n" + "\n".join(loaded) + "\n\n" + table)


if __name__ == "__main__":
    main()
