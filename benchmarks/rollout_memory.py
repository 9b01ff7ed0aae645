"""Peak memory and time of back-propagation through long contact rollouts, with
and without checkpointing, and of unrolled IK (issues 11 and 16).

What is measured
----------------
* **Rollout**: the shipped quadruped (floating base, four foot spheres on the
  ground, PD actuators kp 200 / kd 6, 2 ms implicit contact steps), dropped
  2 mm onto its feet while drifting forward, at batch ``B`` for ``T`` steps
  under PD targets that sway by 0.1 rad. One forward rollout and one backward
  pass of a loss on every state (the mean base height over the trajectory and
  the final state) to the ``(B, T, 12)`` targets. ``checkpoint_every=k``
  (``Simulator.rollout``) keeps only the first state of each window of ``k``
  steps (and the stored outputs) and recomputes the window in the backward
  pass; ``contact_record=False`` also leaves the per-step contact record out
  of the trajectory (the loss reads only the states).
* **IK**: ``solve_dls_ik`` on the shipped Panda, a batch of 1,000 random
  reachable targets, 16 unrolled DLS iterations, forward only (no grad) and
  forward + backward (the gradient of the solution with respect to the
  targets).

How
---
Every configuration runs in a fresh Python process (``--one``), one torch
thread. The process first builds the model and runs a short warm-up of the
same computation, then reads its peak resident set size (``getrusage``
``ru_maxrss``: the operating system's high-water mark, which sees torch's
allocations, unlike ``tracemalloc``), runs the measured computation once and
reads the peak again. The table reports the growth of the peak, i.e. the
memory the computation needed on top of the loaded process. glibc's mmap
threshold is fixed at 16 kB in these processes (``MALLOC_MMAP_THRESHOLD_``,
see :func:`measure`), so that freed arrays leave the resident set. Times are
the process's CPU time (user + system, one thread), which a loaded shared
machine disturbs less than wall time.

The graph of a plain rollout on the default (fast) contact step saves about
23.5 kB per sample and step in float32 (46.9 kB in float64; counted with
``torch.autograd.graph.saved_tensors_hooks``, ``--saved``, which counts
arrays sharing storage more than once); measured, the plain gradient of 1,000
steps at batch 256 grows the peak by 2.2 GB. To keep a shared machine's
memory free, the default run extrapolates the long plain rows from the
measured short ones (memory grows linearly with the horizon) and marks them.
The default run measures the plain rollout at ``T/8`` and ``T/4`` steps
(extrapolating to ``T/2`` and ``T``), ``checkpoint_every=10`` at ``T/4``,
``T/2`` and ``T`` steps, with and without the contact record,
``checkpoint_every=round(sqrt(T))`` at ``T``, and, for comparison, the
implementation before (``torch.utils.checkpoint``, non-reentrant, still the
fallback under ``torch.func`` transforms) at ``T/4`` and ``T/2``: the table
of ``docs/scaling.md`` (*Memory against the horizon*).

Usage::

    PYTHONPATH=src python benchmarks/rollout_memory.py            # the table of docs/scaling.md (~15 CPU min)
    PYTHONPATH=src python benchmarks/rollout_memory.py --only-record  # only the rows without the contact record
    PYTHONPATH=src python benchmarks/rollout_memory.py --quick    # small sizes, a smoke run
    PYTHONPATH=src python benchmarks/rollout_memory.py --saved    # saved-tensor bytes per step
    PYTHONPATH=src python benchmarks/rollout_memory.py --breakdown --batch 64 --steps 800  # what grows, stage by stage
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

import torch


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: kB


def quadruped(dtype):
    from backdrive.contact import ContactGeometry, ContactModel
    from backdrive.data import load
    from backdrive.sim import PDActuator, Simulator

    robot = load("quadruped", floating_base=True, dtype=dtype)
    feet = [n for n in robot.link_names if n.endswith("_foot")]
    cm = ContactModel(robot, ContactGeometry.from_model(robot, links=feet))
    sim = Simulator(robot, 2e-3, actuator=PDActuator(kp=200.0, kd=6.0), contact=cm)
    qj = torch.tensor([0.0, 0.7, -1.4] * 4, dtype=dtype)
    q0 = robot.neutral()
    q0[7:] = qj
    q0 = cm.place_on_terrain(robot, q0, clearance=0.002)  # the feet 2 mm above the ground
    v0 = torch.zeros(robot.nv, dtype=dtype)
    v0[0] = 0.3
    return sim, q0, v0, qj


def rollout_gradient(sim, q0, v0, qj, B: int, T: int, k: int | None, record=True):
    """One forward and backward pass; returns (forward s, backward s, gradient norm)."""
    from backdrive.sim import State

    t = torch.arange(T, dtype=qj.dtype)[:, None]
    U = (qj + 0.1 * torch.sin(2 * torch.pi * t * sim.dt / 0.25)).expand(B, T, 12).clone().requires_grad_()
    t0 = time.process_time()
    traj = sim.rollout(State(q0, v0), U, checkpoint_every=k, contact_record=record)
    loss = traj.q[..., 2].mean(-1).sum() + traj.q[..., -1, :3].sum() + traj.v[..., -1, :].sum()
    t1 = time.process_time()
    (g,) = torch.autograd.grad(loss, U)
    t2 = time.process_time()
    return t1 - t0, t2 - t1, float(g.norm())


def ik(B: int, iterations: int, backward: bool, dtype):
    from backdrive.data import get_data_path
    from backdrive.kinematics import DifferentiableIKCfg, SerialChainKinematics, solve_dls_ik

    chain = SerialChainKinematics.from_urdf(get_data_path("panda"), end_link_name="panda_hand_tcp", dtype=dtype)
    gen = torch.Generator().manual_seed(0)
    q = chain.lower + (chain.upper - chain.lower) * torch.rand(B, chain.dof, generator=gen, dtype=dtype)
    target = chain.forward_kinematics(q).detach()
    cfg = DifferentiableIKCfg(max_iterations=iterations)

    def run():
        x = target.clone().requires_grad_(backward)
        t0 = time.process_time()
        with torch.set_grad_enabled(backward):
            res = solve_dls_ik(chain, x, cfg=cfg)
            if backward:
                torch.autograd.grad(res.qpos.sum(), x)
        return time.process_time() - t0, float(res.success.double().mean())

    return run


def one(spec: dict) -> dict:
    """Measure one configuration in this (fresh) process."""
    torch.set_num_threads(1)
    dtype = getattr(torch, spec.get("dtype", "float32"))
    if spec["kind"] == "breakdown":
        return breakdown_one(spec)
    if spec["kind"] == "rollout":
        if spec.get("impl") == "torch.utils.checkpoint":
            # The implementation before _RecomputedWindow, kept as the fallback
            # (torch.func transforms): non-reentrant torch.utils.checkpoint.
            from backdrive.sim import Simulator

            Simulator._recompute_leaves = lambda self, q, v, u: None
        sim, q0, v0, qj = quadruped(dtype)
        record = spec.get("record", True)
        rollout_gradient(sim, q0, v0, qj, 2, 4, spec["k"] and 2, record)  # warm-up: same code paths
        base = _peak_mb()
        fwd, bwd, gnorm = rollout_gradient(sim, q0, v0, qj, spec["B"], spec["T"], spec["k"], record)
        return {**spec, "base_mb": base, "peak_mb": _peak_mb(), "forward_s": fwd, "backward_s": bwd, "grad_norm": gnorm}
    run_small = ik(4, spec["iterations"], spec["backward"], dtype)
    run_small()
    run = ik(spec["B"], spec["iterations"], spec["backward"], dtype)
    base = _peak_mb()
    seconds, success = run()
    return {**spec, "base_mb": base, "peak_mb": _peak_mb(), "seconds": seconds, "success": success}


def measure(spec: dict) -> dict:
    env = dict(os.environ)
    # A fixed mmap threshold: glibc otherwise raises it after each large free
    # and serves later arrays from a heap that it trims only from the top, so
    # the peak RSS measured fragmentation more than live arrays (measured:
    # 20 checkpointed windows of 10 `exp` on 4 MB arrays peaked 990 MB above
    # the start with the default, 161 MB with this; 80 MB of outputs).
    env.setdefault("MALLOC_MMAP_THRESHOLD_", "16384")
    out = subprocess.run(
        [sys.executable, __file__, "--one", json.dumps(spec)], capture_output=True, text=True, env=env, check=False
    )
    if out.returncode != 0:
        return {**spec, "error": out.stderr.strip().splitlines()[-1] if out.stderr.strip() else f"exit {out.returncode}"}
    return json.loads(out.stdout.strip().splitlines()[-1])


def saved_bytes() -> None:
    from backdrive.sim import State

    torch.set_num_threads(1)
    for dtype in (torch.float32, torch.float64):
        sim, q0, v0, qj = quadruped(dtype)
        B, T = 16, 20
        for k in (None, 10):
            total = [0]

            def pack(t):
                total[0] += t.numel() * t.element_size()
                return t

            U = qj.expand(B, T, 12).clone().requires_grad_()
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                traj = sim.rollout(State(q0, v0), U, checkpoint_every=k)
            c = traj.contact
            kept = sum(x.numel() * x.element_size() for x in (traj.q, traj.v, traj.effort))
            kept_contact = sum(
                getattr(c, f).numel() * getattr(c, f).element_size()
                for f in ("point", "normal", "penetration", "normal_velocity", "slip_velocity", "normal_force",
                          "friction_force", "force", "f_ext", "jacobian", "_c_n", "_k_n", "_mu_fn_over_s", "_s", "_mu")
            )
            print(
                f"{str(dtype)[6:]} checkpoint_every={k}: saved for backward {total[0] / B / T / 1e3:.1f} kB, "
                f"trajectory {kept / B / T:.0f} B + contact record {kept_contact / B / T:.0f} B per sample-step"
            )


def _live_bytes() -> int:
    """Bytes glibc's malloc has handed out and not taken back (heap in use + mmapped chunks).

    Exact at the moment it is read, unlike the resident set, which also
    counts freed memory the allocator keeps (``mallinfo2``, glibc >= 2.33).
    """
    import ctypes

    class _MallInfo2(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                    "fsmblks", "uordblks", "fordblks", "keepcost")]

    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = _MallInfo2
    m = libc.mallinfo2()
    return m.uordblks + m.hblkhd


def breakdown_one(spec: dict) -> dict:
    """Live bytes at the stages of one checkpointed rollout's forward and backward pass (this process).

    Sampled with :func:`_live_bytes`: after the controls are made, at the
    end of every window and stacking (the forward peak), after the
    rollout, when the loss's gradient of the stored configurations arrives,
    before and after every window's backward (the backward peak) and at the
    end. A window's internals (its recomputation inside the backward) do not
    grow with the horizon, so two horizons give the per-step growth of each.
    """
    from backdrive.sim import State
    from backdrive.sim import _simulator as simmod

    torch.set_num_threads(1)
    sim, q0, v0, qj = quadruped(torch.float32)
    rollout_gradient(sim, q0, v0, qj, 2, 4, 2, False)
    B, T, k = spec["B"], spec["T"], spec["k"]
    peak = [0]
    fn_backward, window, stack = simmod._RecomputedWindow.backward, simmod.Simulator._window, torch.stack

    def sampled(f):
        def g(*a, **kw):
            out = f(*a, **kw)
            peak[0] = max(peak[0], _live_bytes())
            return out
        return g

    def backward(ctx, *grads):
        peak[0] = max(peak[0], _live_bytes())
        return sampled(fn_backward)(ctx, *grads)

    simmod._RecomputedWindow.backward = staticmethod(backward)
    simmod.Simulator._window = sampled(window)
    torch.stack = sampled(stack)
    marks = {"base": _live_bytes()}
    t = torch.arange(T, dtype=qj.dtype)[:, None]
    U = (qj + 0.1 * torch.sin(2 * torch.pi * t * sim.dt / 0.25)).expand(B, T, 12).clone().requires_grad_()
    marks["controls"] = _live_bytes()
    traj = sim.rollout(State(q0, v0), U, checkpoint_every=k, contact_record=False)
    marks["after the rollout"] = _live_bytes()
    marks["forward peak"], peak[0] = peak[0], 0
    loss = traj.q[..., 2].mean(-1).sum() + traj.q[..., -1, :3].sum() + traj.v[..., -1, :].sum()

    def arrived(g):
        marks["gradient of q arrives"] = _live_bytes()
        return g

    traj.q.register_hook(arrived)
    (g,) = torch.autograd.grad(loss, U)
    marks["backward peak"] = peak[0]
    marks["after the backward pass"] = _live_bytes()
    base = marks.pop("base")
    return {**spec, "live_mb": {n: (x - base) / 1e6 for n, x in marks.items()}}


def breakdown(B: int, horizons: tuple[int, int], k: int) -> None:
    """Print the live bytes per sample-step that each stage adds, from two horizons (fresh processes)."""
    runs = [measure(dict(kind="breakdown", B=B, T=T, k=k)) for T in horizons]
    for r in runs:
        if "error" in r:
            print(f"failed: {r['error']}")
            return
    (a, b), dT = runs, horizons[1] - horizons[0]
    print(f"| stage (quadruped, float32, batch {B}, `checkpoint_every={k}`, `contact_record=False`) "
          f"| live MB at {horizons[0]} steps | at {horizons[1]} steps | growth per sample-step |")
    print("| --- | ---: | ---: | ---: |")
    for name in a["live_mb"]:
        x, y = a["live_mb"][name], b["live_mb"][name]
        print(f"| {name} | {x:.2f} | {y:.2f} | {(y - x) * 1e6 / B / dT:.0f} B |")


def _name(spec: dict) -> str:
    if spec["k"] is None:
        return "plain"
    return (
        f"`checkpoint_every={spec['k']}`"
        + (" (`torch.utils.checkpoint`, before)" if spec.get("impl") else "")
        + (", `contact_record=False`" if spec.get("record", True) is False else "")
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--one", help=argparse.SUPPRESS)
    p.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    p.add_argument("--saved", action="store_true", help="print saved-tensor bytes per sample-step")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--steps", type=int, default=1000, help="the longest horizon")
    p.add_argument("--no-before", action="store_true", help="leave out the rows of the torch.utils.checkpoint implementation")
    p.add_argument("--only-record", action="store_true", help="only the checkpointed rows without the contact record")
    p.add_argument("--breakdown", action="store_true",
                   help="live bytes per sample-step at each stage of a checkpointed rollout without the contact "
                        "record (--batch, at --steps/2 and --steps)")
    a = p.parse_args()
    if a.one:
        print(json.dumps(one(json.loads(a.one))))
        return
    if a.saved:
        saved_bytes()
        return
    if a.breakdown:
        breakdown(a.batch, (a.steps // 2, a.steps), 10)
        return
    B, T = (16, 100) if a.quick else (a.batch, a.steps)
    horizons = (T // 4, T // 2, T)
    short = (T // 8, T // 4)  # the plain rows, measured (the longer ones are extrapolated: memory)
    rows = [dict(kind="rollout", B=B, T=t, k=None) for t in short]
    rows += [dict(kind="rollout", B=B, T=t, k=10) for t in horizons]
    rows += [dict(kind="rollout", B=B, T=T, k=round(T ** 0.5))]
    if not a.no_before:
        rows += [dict(kind="rollout", B=B, T=t, k=10, impl="torch.utils.checkpoint") for t in horizons[:2]]
    # The loss reads only the states: the trajectory need not keep the contact record.
    light = [dict(kind="rollout", B=B, T=t, k=10, record=False) for t in horizons]
    rows = light if a.only_record else rows + light
    results = []
    print("| rollout (quadruped, float32) | batch | steps | peak memory growth | forward (CPU s) | backward (CPU s) | total | gradient norm |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for spec in rows:
        r = measure(spec)
        results.append(r)
        if "error" in r:
            print(f"| {_name(spec)} | {spec['B']} | {spec['T']} | failed: {r['error']} | | | | |", flush=True)
            continue
        print(
            f"| {_name(spec)} | {spec['B']} | {spec['T']} | {r['peak_mb'] - r['base_mb']:,.0f} MB | {r['forward_s']:.1f} s "
            f"| {r['backward_s']:.1f} s | {r['forward_s'] + r['backward_s']:.1f} s | {r['grad_norm']:.6g} |",
            flush=True,
        )
    pts = sorted((r for r in results if r["k"] is None and "error" not in r), key=lambda r: r["T"])
    if len(pts) == 2:
        a1, a2 = pts
        m1, m2 = a1["peak_mb"] - a1["base_mb"], a2["peak_mb"] - a2["base_mb"]
        slope = (m2 - m1) / (a2["T"] - a1["T"])
        for t in horizons[1:]:
            est = m2 + slope * (t - a2["T"])
            t_est = (a2["forward_s"] + a2["backward_s"]) * t / a2["T"]
            print(
                f"| plain (extrapolated, not run: {slope * 1e3 / B:.1f} kB per sample and step) | {B} | {t} "
                f"| ~{est:,.0f} MB | | | ~{t_est:.0f} s | |"
            )
    print()
    print("| IK (Panda, float32, 16 iterations) | batch | peak memory growth | CPU time | success |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for backward in (False, True):
        spec = dict(kind="ik", B=100 if a.quick else 1000, iterations=16, backward=backward)
        r = measure(spec)
        name = "forward + backward" if backward else "forward (no grad)"
        if "error" in r:
            print(f"| {name} | {spec['B']} | failed: {r['error']} | | |")
            continue
        print(f"| {name} | {spec['B']} | {r['peak_mb'] - r['base_mb']:,.1f} MB | {r['seconds']:.3f} s | {r['success']:.3f} |")


if __name__ == "__main__":
    main()
