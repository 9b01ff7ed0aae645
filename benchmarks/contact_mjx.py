"""MJX on the CPU beside MuJoCo, on the quadrupeds of ``benchmarks/contact.py``:
the gradient of a 100-step rollout by ``jax.grad``, and throughput rows.

What is measured
----------------
The scenario, robots, contact law and servos are ``benchmarks/contact.py``'s
(its helpers are imported: ``settled_state``, ``gradient_targets``,
``objective_weights``, ``mujoco_fd_gradient``, ``mujoco_rows``,
``mjx_throughput``); MJX runs the same compiled MuJoCo model
(``mjx.put_model``) in float64 (``jax_enable_x64``).

* ``--gradient`` (default on): the robot settled on the ground (MuJoCo, 3 s,
  default solver), then ``--steps`` steps of ``--dt`` (4 ms) under the
  servo-target wiggle of ``gradient_targets``; the scalar is the final base
  height + 0.1 x the final base x (``objective_weights``), its gradient taken
  w.r.t. all ``steps x 12`` servo targets.

  Reverse mode through ``mjx.step`` needs the constraint solver at one
  iteration (``opt.iterations = 1``: MJX then calls the solver body once
  instead of a ``while_loop``, which JAX cannot transpose); the line search
  is a fixed-length scan of ``opt.ls_iterations`` (``--ls-iterations``).
  ``--iterations N`` (N > 1) runs the solver's N iterations as a fixed-length
  ``lax.scan`` that idles once converged (:class:`_fixed_iterations`), so
  that reverse mode goes through all of them.

  One solver iteration per step (warm-started from the previous step's
  acceleration) is different physics from MuJoCo's default (up to 100
  iterations to tolerance 1e-8): the report shows how different (the
  objective after the rollout and the largest |qvel| along it, for MuJoCo's
  C engine at the default and at the reduced solver and for MJX; and, from
  the settled state held 3 s at the standing targets, the base height and
  the ground reaction over the weight, where a warm-started iteration
  suffices and the three agree).

  Timed: ``jax.jit(rollout)`` (forward) and ``jax.jit(jax.grad(loss))``,
  each compiled ahead of time (``.lower().compile()``, compile times
  reported separately), then called interleaved, minimum of ``--repeats``,
  wall and CPU (process) time. Agreement, as cosines of the ``steps x 12``
  gradients:

  - against MuJoCo's central differences of whole rollouts at MuJoCo's
    default solver (``mujoco_fd_gradient``, eps 1e-6: the ``G_fd`` of
    ``contact.py``'s gradient table),
  - against the same differences with MuJoCo's C solver at the same
    ``iterations`` and ``ls_iterations`` (the reduced solver in C; C's loop
    and line search are not MJX's, so this is the same physics only where
    both converge),
  - against MJX's own central differences along ``--directions`` random
    unit directions ``d``: ``g . d`` vs ``(L(U + eps d) - L(U - eps d)) / (2 eps)``.

* ``--throughput``: MuJoCo's rows (``mj_step`` loop, ``mujoco.rollout`` on 1
  and 2 threads) and MJX's ``jit(vmap(scan(mjx.step)))`` at its default
  solver, at ``--batches`` and step ``--throughput-dt`` (default 5 ms, the
  matched law's largest accurate step selected by ``contact.py``; MJX runs
  the same model and solver, so the same step), with MJX's compile time and
  its steps/s as a ratio to MuJoCo's rollout.

Run (one thread for XLA too, as the tables were made)::

    XLA_FLAGS="--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1" \\
        python benchmarks/contact_mjx.py --robots quadruped --iterations 1 --ls-iterations 4
    python benchmarks/contact_mjx.py --robots quadruped --iterations 4 --ls-iterations 4
    python benchmarks/contact_mjx.py --no-gradient --throughput --batches 1 64
    python benchmarks/contact_mjx.py --no-gradient --throughput --batches 1024 --linalg xla

Prints markdown tables, with the load average at the start and the end.
``--linalg xla`` lowers JAX's Cholesky factorisation and triangular solve
on the CPU to XLA's own expansions instead of jaxlib's LAPACK calls
(``lapack_dpotrf_ffi``, ``lapack_dtrsm_ffi``; the Newton solver and the
``implicitfast`` step factor with them). With jax 0.10.2 on a 2-core
machine, MJX at batch 1,024 (Go1) never returns with the LAPACK calls: the
batched factorisation splits its batch over XLA's intra-op thread pool and
waits for the pieces from inside that pool's threads, and with every pool
thread waiting nobody runs them (no CPU time used after the compile). The
two lowerings agree to 6e-17 on a batch of 18 x 18 solves.

``--json PATH`` also appends this run to ``PATH`` (a json file with a list
``runs``), rewritten after every throughput row: a run stopped from outside
(e.g. ``timeout 2700``) while MJX compiles keeps the rows before, and its
``in_progress`` entry says which batch was compiling since when.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _mujoco_contact as mc  # noqa: E402
import contact as cb  # noqa: E402


def _jax():
    """``(jax, jax.numpy, mjx)`` in float64, or ``None`` where not installed."""
    try:
        import jax
        import jax.numpy as jp

        jax.config.update("jax_enable_x64", True)
        from mujoco import mjx
    except ImportError:
        return None
    return jax, jp, mjx


def xla_linalg() -> None:
    """Lower JAX's Cholesky and triangular solve on the CPU to XLA's own
    expansions (the lowering JAX uses off the CPU) instead of jaxlib's LAPACK
    custom calls; before anything is traced."""
    from jax._src.interpreters import mlir
    from jax._src.lax import linalg

    mlir.register_lowering(linalg.cholesky_p, linalg._cholesky_lowering, platform="cpu")
    mlir.register_lowering(linalg.triangular_solve_p, linalg._triangular_solve_lowering, platform="cpu")


def one_iteration(model, ls_iterations: int, iterations: int = 1):
    """A copy of ``model`` with the constraint solver at ``iterations``
    iterations and ``ls_iterations`` line-search iterations."""
    import copy

    m = copy.copy(model)
    m.opt.iterations = iterations
    m.opt.ls_iterations = ls_iterations
    return m


class _fixed_iterations:
    """While active, MJX's solver runs its ``iterations`` as a fixed-length
    ``lax.scan`` that idles once converged (MJX's own ``_while_loop_scan``,
    as its line search does) instead of ``lax.while_loop``, so that reverse
    mode goes through more than one iteration. Tracing only: wrap
    ``jit(...).lower()``."""

    def __init__(self, iterations: int):
        self.n = iterations

    def __enter__(self):
        import jax
        from mujoco.mjx._src import solver

        n = self.n

        class Lax:
            def __getattr__(self, k):
                return getattr(jax.lax, k)

            @staticmethod
            def while_loop(cond, body, init):
                return solver._while_loop_scan(cond, body, init, n)

        class Jax:
            lax = Lax()

            def __getattr__(self, k):
                return getattr(jax, k)

        self.solver, self.saved = solver, solver.jax
        solver.jax = Jax()
        return self

    def __exit__(self, *exc):
        self.solver.jax = self.saved


def c_rollout(model, qpos, qvel, U, warm=None):
    """C engine: final ``(qpos, qvel)``, ground reaction along z (the free
    base's world-z constraint force) and max |qvel| along the rollout."""
    import mujoco

    d = mujoco.MjData(model)
    d.qpos[:], d.qvel[:] = qpos, qvel
    if warm is not None:
        d.qacc_warmstart[:] = warm
    vmax = 0.0
    for u in U:
        d.ctrl[:] = u
        mujoco.mj_step(model, d)
        vmax = max(vmax, float(np.abs(d.qvel).max()))
    return d.qpos.copy(), d.qvel.copy(), float(d.qfrc_constraint[2]), vmax


def objective_of(qpos, qvel, model) -> float:
    """``L = w . x_T`` (``objective_weights`` reads base position only)."""
    w = cb.objective_weights(model)
    return float(np.asarray(qpos)[:3] @ w[:3] + np.asarray(qvel) @ w[model.nv:])


def _cos(a, b) -> float:
    a, b = np.ravel(a), np.ravel(b)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


HOLD_SECONDS = 3.0


def mjx_gradient_report(robot: str, dt: float = 4e-3, T: int = 100, ls_iterations: int = 4,
                        repeats: int = 3, directions: int = 3, eps: float = 1e-6, iterations: int = 1,
                        log=print) -> dict | None:
    """The MJX row of the rollout-gradient table (module docstring); ``None``
    where MJX is not installed."""
    J = _jax()
    if J is None:
        return None
    jax, jp, mjx = J
    import mujoco

    err = sys.stderr
    out = {"robot": robot, "T": T, "dt": dt, "ls_iterations": ls_iterations, "iterations": iterations}
    model = mc.build_model(robot, dt=dt, integrator=cb.INTEGRATOR, stiction_width=cb.CONTACT["stiction_width"])
    qpos, qvel, ctrl = cb.settled_state(model, robot)
    U = cb.gradient_targets(model, ctrl, T, cb.WIGGLE)
    m1 = one_iteration(model, ls_iterations, iterations)
    weight = mc.robot_weight(model)
    nhold = int(round(HOLD_SECONDS / dt / T))  # holds of T steps at the standing targets
    hold = np.repeat(ctrl[None], T, 0)

    # MuJoCo (C): the reference gradient, its forward, and the physics at the reduced solver.
    out["mujoco_forward_s"] = cb.timed(lambda: cb.mujoco_forward(model, qpos, qvel, U), repeats)
    t0 = time.perf_counter()
    G_fd = cb.mujoco_fd_gradient(model, qpos, qvel, U, nthread=1)
    out["mujoco_rollout_fd_s"] = time.perf_counter() - t0
    G_fd1 = cb.mujoco_fd_gradient(m1, qpos, qvel, U, nthread=1)
    out["cos_fd1_vs_fd"] = _cos(G_fd1, G_fd)
    for key, m in (("default", model), ("reduced", m1)):
        q1, v1, _, vmax = c_rollout(m, qpos, qvel, U)
        out[f"L_mujoco_{key}"], out[f"vmax_mujoco_{key}"] = objective_of(q1, v1, m), vmax
        q2, v2, fz, _ = c_rollout(m, qpos, qvel, np.concatenate([hold] * nhold))
        out[f"hold_mujoco_{key}"] = {"height": float(q2[2]), "grf": fz / weight, "qvel_max": float(np.abs(v2).max())}
    log(f"# {robot}: MuJoCo references done ({_load()})", file=err, flush=True)

    # MJX at the reduced solver.
    data = mujoco.MjData(m1)
    data.qpos[:], data.qvel[:], data.ctrl[:] = qpos, qvel, ctrl
    mm = mjx.put_model(m1)
    md = mjx.put_data(m1, data)
    # In x64 mode the step makes int64 contact indices: start from a step's
    # types; no warm start, as the C rollouts from a fresh MjData.
    md = jax.jit(mjx.forward)(mm, md)
    md = md.replace(qacc_warmstart=jp.zeros_like(md.qacc_warmstart))

    def rollout(q0, v0, w0, Ut):
        def body(d, u):
            return mjx.step(mm, d.replace(ctrl=u)), None

        d, _ = jax.lax.scan(body, md.replace(qpos=q0, qvel=v0, qacc_warmstart=w0), Ut)
        return d.qpos, d.qvel, d.qacc_warmstart, d.qfrc_constraint[2]

    def loss(Ut):
        qT = rollout(md.qpos, md.qvel, md.qacc_warmstart, Ut)[0]
        return qT[2] + 0.1 * qT[0]

    Uj = jp.asarray(U)
    x0 = (md.qpos, md.qvel, md.qacc_warmstart)
    t0, c0 = time.perf_counter(), time.process_time()
    with _fixed_iterations(iterations):
        fwd = jax.jit(rollout).lower(*x0, Uj).compile()
    out["compile_forward_s"], out["compile_forward_cpu_s"] = time.perf_counter() - t0, time.process_time() - c0
    r = fwd(*x0, Uj)
    out["L_mjx"] = objective_of(r[0], r[1], model)
    log(f"# {robot}: MJX forward compiled in {out['compile_forward_s']:.0f} s, L {out['L_mjx']:.8f} "
        f"(C default {out['L_mujoco_default']:.8f}) ({_load()})", file=err, flush=True)
    x = x0 + (None,)
    for _ in range(nhold):
        x = fwd(*x[:3], jp.asarray(hold))
    fz = float(x[3])
    out["hold_mjx"] = {"height": float(x[0][2]), "grf": fz / weight, "qvel_max": float(np.abs(np.asarray(x[1])).max())}
    t0, c0 = time.perf_counter(), time.process_time()
    with _fixed_iterations(iterations):
        grad = jax.jit(jax.grad(loss)).lower(Uj).compile()
    out["compile_gradient_s"], out["compile_gradient_cpu_s"] = time.perf_counter() - t0, time.process_time() - c0
    log(f"# {robot}: MJX gradient compiled in {out['compile_gradient_s']:.0f} s ({_load()})", file=err, flush=True)

    G = np.asarray(grad(Uj))
    tf = tg = cf = cg = float("inf")
    for _ in range(max(repeats, 3)):
        t0, c0 = time.perf_counter(), time.process_time()
        fwd(*x0, Uj)[0].block_until_ready()
        t1, c1 = time.perf_counter(), time.process_time()
        grad(Uj).block_until_ready()
        t2, c2 = time.perf_counter(), time.process_time()
        tf, tg, cf, cg = min(tf, t1 - t0), min(tg, t2 - t1), min(cf, c1 - c0), min(cg, c2 - c1)
    out.update(forward_s=tf, gradient_s=tg, forward_cpu_s=cf, gradient_cpu_s=cg)
    out["finite"] = bool(np.isfinite(G).all())
    out["cos_vs_fd"] = _cos(G, G_fd)
    out["cos_vs_fd1"] = _cos(G, G_fd1)
    out["normwise_vs_fd"] = float(np.linalg.norm(G - G_fd) / np.linalg.norm(G_fd))
    out["normwise_vs_fd1"] = float(np.linalg.norm(G - G_fd1) / np.linalg.norm(G_fd1))
    out["grad_norm"], out["fd_norm"], out["fd1_norm"] = (float(np.linalg.norm(x)) for x in (G, G_fd, G_fd1))
    rng = np.random.default_rng(2)
    dirs = []
    L = lambda Ut: objective_of(*fwd(*x0, jp.asarray(Ut))[:2], model)  # noqa: E731
    for _ in range(directions):
        d = rng.standard_normal(U.shape)
        d /= np.linalg.norm(d)
        dirs.append((float(np.sum(G * d)), (L(U + eps * d) - L(U - eps * d)) / (2 * eps)))
    out["directional"] = dirs
    np.savez(Path(os.environ.get("MJX_SAVE", "/tmp")) / f"mjx_gradient_{robot}_it{iterations}_ls{ls_iterations}.npz",
             G=G, G_fd=G_fd, G_fd1=G_fd1, U=U)
    return out


def _load() -> str:
    try:
        return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "load average unknown"


def print_gradient(g: dict) -> None:
    r, it, ls = g["robot"], g["iterations"], g["ls_iterations"]
    solver = f"solver at {it} iteration{'s' if it > 1 else ''}, ls_iterations {ls}"
    print(f"## {r}: MJX rollout gradient ({g['T']} steps of {g['dt'] * 1e3:g} ms, {solver}, float64)\n")
    print("| engine | forward (ms) | gradient (ms) | gradient / forward | forward CPU (ms) | gradient CPU (ms) "
          "| compile forward, wall / CPU (s) | compile gradient, wall / CPU (s) |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    print(f"| MJX `jax.jit(rollout)`, `jax.jit(jax.grad(loss))` | {g['forward_s'] * 1e3:.1f} | {g['gradient_s'] * 1e3:.1f} "
          f"| {g['gradient_s'] / g['forward_s']:.1f}x | {g['forward_cpu_s'] * 1e3:.1f} | {g['gradient_cpu_s'] * 1e3:.1f} "
          f"| {g['compile_forward_s']:.0f} / {g.get('compile_forward_cpu_s', float('nan')):.0f} "
          f"| {g['compile_gradient_s']:.0f} / {g.get('compile_gradient_cpu_s', float('nan')):.0f} |")
    print(f"| MuJoCo `mj_step` loop (Python), default solver; rollout FD 2 x {g['T'] * 12} rollouts, 1 thread "
          f"| {g['mujoco_forward_s'] * 1e3:.2f} | {g['mujoco_rollout_fd_s'] * 1e3:.0f} "
          f"| {g['mujoco_rollout_fd_s'] / g['mujoco_forward_s']:.0f}x | | | | |\n")
    print("| MJX gradient against | cosine | normwise error |\n| --- | ---: | ---: |")
    print(f"| MuJoCo rollout FD, default solver (contact.py's G_fd) | {g['cos_vs_fd']:.6f} | {g['normwise_vs_fd']:.1e} |")
    print(f"| MuJoCo rollout FD, C {solver} | {g['cos_vs_fd1']:.6f} | {g['normwise_vs_fd1']:.1e} |")
    print(f"| (MuJoCo FD, C {solver}, against MuJoCo FD, default solver) | {g['cos_fd1_vs_fd']:.6f} | |\n")
    print(f"Gradient norms: MJX {g['grad_norm']:.4g}, MuJoCo FD default {g['fd_norm']:.4g}, "
          f"C {solver} {g['fd1_norm']:.4g}. All MJX entries finite: {g['finite']}.\n")
    print("| direction | MJX g . d | MJX (L(U+eps d) - L(U-eps d)) / 2 eps, eps 1e-6 | relative difference |")
    print("| ---: | ---: | ---: | ---: |")
    for i, (a, b) in enumerate(g["directional"]):
        print(f"| {i} | {a:.8e} | {b:.8e} | {abs(a - b) / max(abs(b), 1e-300):.1e} |")
    print(f"\nThe physics at the reduced solver: the objective of the rollout (and the largest |qvel| along it, "
          f"C only), and from the settled state {HOLD_SECONDS:g} s at the standing targets: base height, "
          "ground reaction / weight and max |qvel| at the end.\n")
    print("| engine, solver | objective L (m) | max qvel along the rollout | held: base height (m) "
          "| held: ground reaction / weight | held: max qvel |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    rows = (("MuJoCo C, default (up to 100 iterations, tol 1e-8)", g["L_mujoco_default"], g["vmax_mujoco_default"],
             g["hold_mujoco_default"]),
            (f"MuJoCo C, {solver}", g["L_mujoco_reduced"], g["vmax_mujoco_reduced"], g["hold_mujoco_reduced"]),
            (f"MJX, {solver}", g["L_mjx"], None, g["hold_mjx"]))
    for lab, L, vmax, h in rows:
        vm = "" if vmax is None else f"{vmax:.3g}"
        print(f"| {lab} | {L:.8f} | {vm} | {h['height']:.5f} | {h['grf']:.4f} | {h['qvel_max']:.3g} |")
    print(flush=True)


class RunLog:
    """This run's entry in a json file of runs (``--json``), rewritten whole
    after every change; a no-op without a path."""

    def __init__(self, path: str | None, header: dict):
        self.path = Path(path) if path else None
        self.run = dict(header, started_utc=_utc(), rows=[], in_progress=None, finished=False)
        if self.path is None:
            return
        with self._locked():
            runs = json.loads(self.path.read_text())["runs"] if self.path.exists() else []
            self.index = len(runs)
            runs.append(self.run)
            self._write(runs)

    def _write(self, runs) -> None:
        tmp = self.path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"runs": runs}, indent=1) + "\n")
        tmp.replace(self.path)

    def _locked(self):
        import fcntl

        f = open(self.path.with_suffix(".lock"), "w")
        fcntl.flock(f, fcntl.LOCK_EX)  # released when f is closed
        return f

    def update(self, **kw) -> None:
        self.run.update(kw)
        if self.path is None:
            return
        with self._locked():
            runs = json.loads(self.path.read_text())["runs"]
            runs[self.index] = self.run
            self._write(runs)

    def row(self, **row) -> None:
        self.run["rows"].append(row)
        self.update()


def _utc() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def throughput(robot: str, dt: float, nstep: int, batches, repeats: int, log: RunLog | None = None) -> None:
    log = log or RunLog(None, {})
    print(f"## {robot}: MJX throughput beside MuJoCo ({nstep} steps of {dt * 1e3:g} ms, matched law)\n")
    print("| engine | runner | batch | threads | steps/s | robot-s per wall-s | vs MuJoCo rollout, 1 thread "
          "| vs MuJoCo rollout, 2 threads | steps per CPU-s | CPU-time vs MuJoCo rollout, 1 thread | compile (s) "
          "| final base-height spread (m) |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    rows = cb.mujoco_rows(robot, dt, nstep, repeats, batches)
    base1 = {b: s for lab, run, b, nt, _, s, _ in rows if run == "rollout" and nt == 1}
    base2 = {b: s for lab, run, b, nt, _, s, _ in rows if run == "rollout" and (nt == 2 or b == 1)}
    cpu1 = {b: c for lab, run, b, nt, _, _, c in rows if run == "rollout" and nt == 1}
    def ratio(x, base, b):  # the step loop's batch 1 has no rollout row unless 1 is among --batches
        return f"{x / base[b]:.2f}x" if b in base else ""

    for lab, run, b, nt, _, s, c in rows:
        print(f"| {lab} | {run} | {b} | {nt} | {s:,.0f} | {s * dt:,.1f} | {ratio(s, base1, b)} | {ratio(s, base2, b)} "
              f"| {c:,.0f} | {ratio(c, cpu1, b)} | | |", flush=True)
        log.row(robot=robot, engine=lab, runner=run, batch=b, threads=nt, dt=dt, steps=nstep, steps_per_s=s,
                steps_per_cpu_s=c, load=_load())
    for b in batches:
        print(f"# {robot}: MJX batch {b} compiling ({_load()})", file=sys.stderr, flush=True)
        log.update(in_progress={"robot": robot, "batch": b, "since_utc": _utc(), "load": _load()})
        t0, c0 = time.perf_counter(), time.process_time()
        r = cb.mjx_throughput(robot, dt, nstep, b, repeats)
        if r is None:
            print(f"| MJX | not installed (pip install mujoco-mjx 'jax[cpu]') | {b} | | | | | | | | | |")
            log.update(in_progress=None)
            return
        sps, comp, spread = r
        cps = b * nstep / cb.LAST_CPU[0]
        log.row(robot=robot, engine="MJX float64, default solver", runner="jit(vmap(scan(step)))", batch=b,
                threads="1 (XLA)", dt=dt, steps=nstep, steps_per_s=sps, steps_per_cpu_s=cps, compile_s=comp,
                base_height_spread=spread, vs_rollout_1thread=sps / base1[b], vs_rollout_2threads=sps / base2[b],
                cpu_vs_rollout_1thread=cps / cpu1[b], total_wall_s=time.perf_counter() - t0,
                total_cpu_s=time.process_time() - c0, load=_load())
        log.update(in_progress=None)
        print(f"| MJX float64, default solver | jit(vmap(scan(step))) | {b} | 1 (XLA) | {sps:,.0f} | {sps * dt:,.1f} "
              f"| {sps / base1[b]:.3f}x | {sps / base2[b]:.3f}x | {cps:,.0f} | {cps / cpu1[b]:.3f}x | {comp:.0f} "
              f"| {spread:.2e} |", flush=True)
    print()


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--robots", nargs="+", default=["quadruped"], choices=cb.ROBOTS)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dt", type=float, default=4e-3, help="step of the gradient scenario, s")
    ap.add_argument("--ls-iterations", type=int, default=4, help="MJX line-search iterations of the gradient run")
    ap.add_argument("--iterations", type=int, default=4,
                    help="MJX solver iterations of the gradient run (above 1: a fixed-length scan)")
    ap.add_argument("--directions", type=int, default=3, help="random directions of MJX's own finite differences")
    ap.add_argument("--no-gradient", action="store_true")
    ap.add_argument("--throughput", action="store_true")
    ap.add_argument("--throughput-dt", type=float, default=5e-3,
                    help="step of the throughput rows, s (the matched law's largest accurate step)")
    ap.add_argument("--batches", nargs="+", type=int, default=[1, 64])
    ap.add_argument("--linalg", choices=("lapack", "xla"), default="lapack",
                    help="CPU lowering of JAX's Cholesky and triangular solve (module docstring)")
    ap.add_argument("--json", help="append this run to this json file of runs (rewritten after every row)")
    args = ap.parse_args(argv)
    import mujoco

    J = _jax()
    jv = "missing" if J is None else J[0].__version__
    if J is not None and args.linalg == "xla":
        xla_linalg()
    print(f"# MJX on the CPU: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"MuJoCo {mujoco.__version__}, jax {jv}, XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}, "
          f"linalg {args.linalg}; "
          f"{_load()} at the start\n", flush=True)
    log = RunLog(args.json, {"argv": sys.argv[1:] if argv is None else list(argv), "cpu": platform.processor()
                             or platform.machine(), "cores": os.cpu_count(), "mujoco": mujoco.__version__, "jax": jv,
                             "xla_flags": os.environ.get("XLA_FLAGS", ""), "linalg": args.linalg,
                             "load_start": _load()})
    if not args.no_gradient:
        for robot in args.robots:
            g = mjx_gradient_report(robot, args.dt, args.steps, args.ls_iterations, args.repeats, args.directions,
                                    iterations=args.iterations)
            if g is None:
                print("MJX not installed (pip install mujoco-mjx 'jax[cpu]')")
                break
            print_gradient(g)
    if args.throughput:
        for robot in args.robots:
            try:
                throughput(robot, args.throughput_dt, args.steps, args.batches, args.repeats, log)
            except Exception as e:
                log.update(error=f"{type(e).__name__}: {e}", error_utc=_utc())
                raise
    print(f"{_load()} at the end")
    log.update(finished=True, finished_utc=_utc(), load_end=_load())


if __name__ == "__main__":
    main()
