"""Quadrupeds standing on flat ground: contact simulation throughput and the
cost of a 100-step rollout gradient, backdrive against MuJoCo, side by side.

What is measured
----------------
Robots: example-robot-data's Go1 and backdrive's shipped quadruped, from their
URDFs, with a free-floating base, spheres at the four feet on a floor, and a
PD servo on every leg joint holding the standing pose (kp 80 N m/rad, kd 2
N m s/rad). MuJoCo's models come from ``benchmarks/_mujoco_contact.py`` (its
docstring derives how MuJoCo's soft contact is set to the penalty law
``f = k p - (b + k dt) v_n'`` of backdrive's implicit contact step, with k
4e4 N/m, b 1e4 N s/m, mu 0.75; MuJoCo's ``impratio`` set so that its
friction at rest has the slope of backdrive's 1 cm/s stiction width).

Every rollout starts from the robot settled on the ground (a 3 s drop and
settle), with the joint velocities perturbed per batch element (0.01 rad/s,
so that the elements differ), under constant standing targets, for
``--steps`` steps.

* **Stable step sizes** (first, per robot): each engine drops the robot 1 cm
  and holds it for 3 s at each step of ``STEP_CANDIDATES`` (1 to 10 ms).
  A step counts when the robot settles (max |qvel| < 0.05, ground reaction
  within 2 % of the weight) with its standing height within 3 mm of the
  reference, MuJoCo with the matched law at 1 ms. Each engine then runs at
  its largest such step: MuJoCo's matched law (``implicitfast``; at 8 ms it
  no longer settles), MuJoCo's own default soft contact (``solref (0.02,
  1)``), and backdrive's implicit contact step in float32 and float64.
  ``--dt`` runs every engine at one given step instead.
* **Throughput**: steps per wall-second (one step of one robot) and
  simulated robot-seconds per wall-second (``steps/s * dt``), at batch 1,
  64, 1,024 and 4,096, and the ratio to MuJoCo's 2-thread rollout at the
  same batch:
  - MuJoCo ``mj_step`` called from a Python loop (batch 1: what a Python
    user pays per step),
  - ``mujoco.rollout`` (MuJoCo's C rollout loop) with 1 and 2 threads,
  - backdrive's implicit contact step (``ContactModel.acceleration`` and
    ``integrate_world`` under ``no_grad``; from 128 samples its batch-last fast
    path) in float32 and float64, torch on 1 and 2 threads, with freed
    memory kept for reuse (``backdrive.runtime.retain_freed_memory``, as in
    ``benchmarks/dynamics.py``; ``--no-retain`` to skip),
  - the same step with the batch split over ``--processes`` processes (2
    by default), one torch thread each, each simulating its share of the
    robots from the same start states (``backdrive_process_rows``): the way
    backdrive uses several cores (``docs/scaling.md``), since torch threads
    inside one process barely speed up a step of small operations,
  - MJX on the CPU in float64 (``--mjx-robots``, none by default, batch 64
    by default: compiling takes about a minute per shape here, and batch
    1,024 did not finish compiling and running within 15 minutes on the
    shared 2-core machine), when ``mujoco-mjx`` and ``jax[cpu]`` are
    installed (the ``bench`` extra). MJX's rollout gradient (its solver at
    one iteration, or a fixed number of them) is timed by
    ``benchmarks/contact_mjx.py``.
  Every rollout starts from MuJoCo's settled state (at 2 ms for backdrive's
  rows, whose step may be beyond MuJoCo's stable range), checked (max
  |qvel| < 0.05, ground reaction within 2 % of the weight) before anything
  is timed.
* **Rollout gradient**: the gradient of a scalar of the final state (the
  base height plus 0.1 times the base x position after 100 steps) with
  respect to all 100 x 12 servo targets (standing targets plus a 0.01 rad,
  2 Hz wiggle: every foot stays loaded and sticking, see ``WIGGLE``):
  - MuJoCo: ``mjd_transitionFD`` (centred, eps 1e-6) at each of the 100
    states, chained backwards (``lambda_t = A_t^T lambda_{t+1}``,
    ``g_t = B_t^T lambda_{t+1}``), its cost relative to one forward
    rollout, and its agreement (cosine, normwise error) with central finite
    differences of whole rollouts (2 x 1,200 rollouts through
    ``mujoco.rollout``, eps 1e-6 rad),
  - backdrive autograd in float64 and float32 (:func:`backdrive_gradient_runner`),
    forward and gradient interleaved in one process, and the cosine of the
    float32 gradient to the float64 one.

Timing: wall-clock (``time.perf_counter``), minimum over ``--repeats``;
torch on one thread except where threads are the point. The machine is
shared: quote ratios from one run, not absolute numbers.

Run: ``python benchmarks/contact.py`` (``--quick`` for one repeat and the
small batches only; ``--robots``, ``--batches``, ``--dtypes``, ``--threads``
to narrow it; ``--gradient-only`` for the gradient table alone,
``--gradient-profile 1 64 1024`` for the gradient's time split and autograd
nodes per step at those batches, ``--gradient-pieces`` for the hand-written
backward passes against plain autograd). Prints markdown tables, with the load average at the start
and the end.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _mujoco_contact as mc  # noqa: E402

BATCHES = (1, 64, 1024, 4096)
# Servo-target wiggle of the gradient scenario, rad: at 0.01 rad every foot
# stays loaded and sticking (Go1: min normal force 17 N, friction use 0.6);
# at 0.03 rad a Go1 foot slides on the cone edge and lifts off, where MuJoCo's
# dynamics have kinks and finite differences depend on eps (cosine 0.24
# between eps 1e-6 chained and whole-rollout differences at 0.1 rad).
WIGGLE = 0.01
# MuJoCo integrator of the benchmark: implicitfast treats the servo and joint
# damping implicitly (as backdrive's implicit step does with extra_damping);
# semi-implicit Euler with explicit servo damping is unstable at 4 ms for the
# shipped quadruped (and for Go1 with MuJoCo's default contact).
INTEGRATOR = "implicitfast"
# Joint-velocity noise of the batch's start states, rad/s. With b = 1e4 N s/m
# a foot moving at 2 cm/s (0.1 rad/s at the joints) already feels 200 N.
JOINT_NOISE = 0.01
ROBOTS = ("go1", "quadruped")


# ----------------------------------------------------------------- scenario


def settled_state(model, robot: str, seconds: float = 3.0):
    """``(qpos, qvel, ctrl)`` of the robot settled on the ground under PD.

    Raises:
        RuntimeError: the configuration is not stable at this step (a
            benchmark of a chattering or exploding simulation would be
            meaningless).
    """
    r = mc.settle(model, robot, duration=seconds, every=int(round(seconds / model.opt.timestep)))
    if not (np.abs(r.qvel).max() < 0.05 and abs(r.normal_force[-1] / r.weight - 1) < 0.02):
        raise RuntimeError(
            f"{robot} does not settle at dt={model.opt.timestep}: max |qvel| {np.abs(r.qvel).max():.3g}, "
            f"ground reaction / weight {r.normal_force[-1] / r.weight:.3f}")
    _, ctrl = mc.standing_state(model, robot)
    return r.qpos, r.qvel, ctrl


def initial_states(model, qpos, qvel, batch: int, seed: int = 0) -> np.ndarray:
    """``(batch, nstate)`` MuJoCo full-physics states: the settled state with
    joint velocities perturbed by ``JOINT_NOISE`` (std) per element."""
    import mujoco

    spec = mujoco.mjtState.mjSTATE_FULLPHYSICS
    data = mujoco.MjData(model)
    rng = np.random.default_rng(seed)
    out = np.empty((batch, mujoco.mj_stateSize(model, spec)))
    for i in range(batch):
        data.qpos[:] = qpos
        data.qvel[:] = qvel
        data.qvel[6:] += JOINT_NOISE * rng.standard_normal(model.nv - 6)
        data.time = 0.0
        mujoco.mj_getState(model, data, out[i], spec)
    return out


# ------------------------------------------------------------- MuJoCo rows


def mujoco_step_loop(model, x0: np.ndarray, ctrl: np.ndarray, nstep: int) -> Callable[[], None]:
    """Batch 1, a Python loop of ``mj_step``."""
    import mujoco

    data = mujoco.MjData(model)
    spec = mujoco.mjtState.mjSTATE_FULLPHYSICS

    def run():
        mujoco.mj_setState(model, data, x0[0], spec)
        data.ctrl[:] = ctrl
        for _ in range(nstep):
            mujoco.mj_step(model, data)

    return run


def mujoco_rollout_runner(model, x0: np.ndarray, ctrl: np.ndarray, nstep: int, nthread: int):
    """``mujoco.rollout`` of ``len(x0)`` elements on ``nthread`` threads.

    Returns ``(run, close)``; ``run()`` does the rollout into a preallocated
    state array (so allocation is not timed)."""
    import mujoco
    from mujoco import rollout

    datas = [mujoco.MjData(model) for _ in range(nthread)]
    control = np.broadcast_to(ctrl, (len(x0), nstep, model.nu)).copy()
    nstate = x0.shape[1]
    state = np.empty((len(x0), nstep, nstate))
    pool = rollout.Rollout(nthread=nthread) if nthread > 1 else None

    def run():
        if pool is None:
            rollout.rollout(model, datas[0], x0, control, state=state)
        else:
            pool.rollout(model, datas, x0, control, state=state)

    def close():
        if pool is not None:
            pool.close()

    return run, close


def timed(fn: Callable[[], None], repeats: int, inner: int = 1) -> float:
    """Minimum over ``repeats`` of the wall time of ``inner`` calls of
    ``fn()``, per call (after one warm-up call). ``LAST_CPU[0]`` is set to
    the minimum process CPU time (all threads) per call of the same repeats."""
    fn()
    best = cpu = float("inf")
    for _ in range(repeats):
        t, c = time.perf_counter(), time.process_time()
        for _ in range(inner):
            fn()
        best = min(best, (time.perf_counter() - t) / inner)
        cpu = min(cpu, (time.process_time() - c) / inner)
    LAST_CPU[0] = cpu
    return best


# CPU time per call of the last ``timed`` (a shared machine slows wall time; a
# process's CPU time much less): the tables show steps per CPU-second too.
LAST_CPU = [float("nan")]


def _inner(batch: int, nstep: int) -> int:
    """Calls per timing so that each one covers at least 5,000 robot-steps."""
    return max(1, -(-5000 // (batch * nstep)))


# ----------------------------------------------------------- backdrive slots
#
# The backdrive rows. Each returns None where backdrive has no contact
# simulation (``import backdrive.contact`` fails); the MuJoCo rows run alone.
# They are written against ``backdrive.contact`` as of the contact branch
# (``ContactModel``, ``ContactGeometry.spheres``, ``ContactParameters``,
# ``contact_step``); if that API changes, only ``_backdrive_setup`` needs to.

CONTACT = {"stiffness": 4e4, "damping": 1e4, "friction": 0.75, "normal_width": 1e-4, "stiction_width": 1e-2}
KP, KD = 80.0, 2.0


def servo_case(robot: str, dtype: str = "float64", package: str = "backdrive"):
    """``(bd_robot, contact_model, extra_damping, contact_module)`` of ``robot``
    as the MuJoCo model has it, from the importable package ``package`` (the
    A/B scripts pass the renamed checkouts ``bdold`` and ``bdnew``)."""
    import importlib

    import torch

    C, D = importlib.import_module(package + ".contact"), importlib.import_module(package + ".data")
    rs = mc.ROBOTS[robot]
    bd = D.load(rs.name, floating_base=True, dtype=getattr(torch, dtype))
    # As in the MuJoCo model: no joint Coulomb friction (module docstring of _mujoco_contact).
    bd = bd.replace(friction=torch.zeros_like(bd.friction))
    geometry = C.ContactGeometry.spheres(bd, {f: rs.foot_radius for f in rs.feet})
    contact = C.ContactModel(bd, geometry, params=C.ContactParameters(**CONTACT))
    # The servo damping is treated implicitly, like MuJoCo's implicitfast.
    extra = torch.cat([torch.zeros(6, dtype=bd.dtype), torch.full((bd.nv - 6,), KD, dtype=bd.dtype)])
    return bd, contact, extra, C


def servo_torque(q, v, target):
    """The PD servos' generalized force (zero on the floating base)."""
    import torch

    return torch.cat([q.new_zeros(q.shape[:-1] + (6,)), KP * (target - q[..., 7:]) - KD * v[..., 6:]], -1)


def perturbed_batch(qpos: np.ndarray, qvel: np.ndarray, batch: int, seed: int = 0):
    """``batch`` copies of a settled ``(qpos, qvel)``, the joint velocities of
    all but the first perturbed by ``JOINT_NOISE`` (std)."""
    qvels = np.repeat(qvel[None], batch, 0)
    qvels[1:, 6:] += JOINT_NOISE * np.random.default_rng(seed).standard_normal((batch - 1, qvel.shape[0] - 6))
    return np.repeat(qpos[None], batch, 0), qvels


def _backdrive_setup(robot: str, dtype: str = "float64"):
    """``(bd_robot, contact_model, step)`` or ``None``; ``step(q, v, target, dt)``
    is one step of backdrive's implicit contact scheme under the PD servos."""
    try:
        bd, contact, extra, C = servo_case(robot, dtype)
    except ImportError:
        return None

    def step(q, v, target, dt, result=False):
        a, res = contact.acceleration(bd, q, v, servo_torque(q, v, target), dt=dt, scheme="implicit",
                                      extra_damping=extra)
        q1, v1 = C.integrate_world(bd, q, v, a, dt)
        return (q1, v1, res) if result else (q1, v1)

    return bd, contact, step


def to_backdrive_state(model, bd, qpos: np.ndarray, qvel: np.ndarray, ctrl: np.ndarray):
    """MuJoCo ``(qpos, qvel, ctrl)`` (leading batch axes allowed) as backdrive
    ``(q, v, target)`` tensors: joints reordered by name, and the base linear
    velocity turned from MuJoCo's world frame into the base frame."""
    import torch

    perm = mc.joint_permutation(model, bd.joint_names)
    R = mc.quat_to_matrix(qpos[..., 3:7])
    lin_base = np.einsum("...ji,...j->...i", R, qvel[..., :3])
    q = np.concatenate([qpos[..., :7], qpos[..., 7:][..., perm]], -1)
    v = np.concatenate([lin_base, qvel[..., 3:6], qvel[..., 6:][..., perm]], -1)
    t = lambda a: torch.as_tensor(np.ascontiguousarray(a), dtype=bd.dtype)  # noqa: E731
    return t(q), t(v), t(ctrl[..., perm])


def backdrive_rollout_runner(robot: str, dt: float, batch: int, nstep: int, dtype: str = "float64",
                             mj_model=None, x0: np.ndarray | None = None, ctrl: np.ndarray | None = None):
    """Backdrive's throughput row: ``run()`` simulates ``batch`` copies of
    ``robot`` standing on the floor (same servos, contact parameters
    ``CONTACT`` and start states ``x0`` as MuJoCo's rows) for ``nstep`` steps
    of ``dt`` without gradient; ``None`` where ``backdrive.contact`` is missing.
    """
    setup = _backdrive_setup(robot, dtype)
    if setup is None or mj_model is None:
        return None
    import torch

    bd, _, step = setup
    nq, nv = mj_model.nq, mj_model.nv
    q0, v0, target = to_backdrive_state(mj_model, bd, x0[:, 1:1 + nq], x0[:, 1 + nq:1 + nq + nv],
                                        np.broadcast_to(ctrl, (len(x0), len(ctrl))))

    def run():
        with torch.no_grad():
            q, v = q0, v0
            for _ in range(nstep):
                q, v = step(q, v, target, dt)
        if not bool(torch.isfinite(q).all()):
            raise FloatingPointError(f"backdrive rollout of {robot} became non-finite")

    return run


def backdrive_gradient_runner(robot: str, dt: float, nstep: int, dtype: str = "float64",
                              mj_model=None, qpos=None, qvel=None, U: np.ndarray | None = None):
    """Backdrive's gradient row: ``(forward, gradient)``; ``forward()`` runs
    the ``nstep``-step rollout from the settled state under targets ``U``;
    ``gradient()`` also back-propagates and returns the ``(nstep, 12)``
    gradient (MuJoCo's actuator order) of the scalar of
    :func:`mujoco_chained_gradient` (final base height + 0.1 * final base x).
    ``None`` where ``backdrive.contact`` is missing."""
    setup = _backdrive_setup(robot, dtype)
    if setup is None or mj_model is None:
        return None
    import torch

    bd, _, step = setup
    q0, v0, Ub = to_backdrive_state(mj_model, bd, qpos, qvel, U)
    perm = mc.joint_permutation(mj_model, bd.joint_names)

    def rollout(targets):
        q, v = q0, v0
        for t in range(nstep):
            q, v = step(q, v, targets[t], dt)
        return q[2] + 0.1 * q[0]

    def forward():
        with torch.no_grad():
            rollout(Ub)

    def gradient():
        targets = Ub.clone().requires_grad_(True)
        (g,) = torch.autograd.grad(rollout(targets), targets)
        out = np.empty_like(U)
        out[:, perm] = g.numpy()
        return out

    return forward, gradient


def autograd_nodes(*outputs) -> int:
    """Autograd nodes reachable from ``outputs`` (walks ``grad_fn.next_functions``)."""
    seen, todo = set(), [o.grad_fn for o in outputs]
    while todo:
        f = todo.pop()
        if f is None or f in seen:
            continue
        seen.add(f)
        todo.extend(nf for nf, _ in f.next_functions)
    return len(seen)


def gradient_profile(robot: str, dt: float, T: int, batch: int, dtype: str, repeats: int) -> dict:
    """Where the rollout gradient's time goes at one batch size: the ``T``-step
    rollout without gradient, the same rollout recording the graph, and the
    backward pass alone (CPU seconds of this process, minimum of ``repeats``,
    interleaved), plus the autograd nodes of one step with ``q``, ``v`` and the
    targets requiring grad. The batch's start states are the settled state with
    ``JOINT_NOISE`` on the joint velocities; the targets those of the gradient
    scenario, the same for every batch element; the scalar is summed over the batch."""
    import torch

    model = mc.build_model(robot, dt=dt, integrator=INTEGRATOR, stiction_width=CONTACT["stiction_width"])
    qpos, qvel, ctrl = settled_state(model, robot)
    U = gradient_targets(model, ctrl, T, WIGGLE)
    bd, _, step = _backdrive_setup(robot, dtype)
    q0, v0, Ub = to_backdrive_state(model, bd, *perturbed_batch(qpos, qvel, batch), U)

    def rollout(targets):
        q, v = q0, v0
        for t in range(T):
            q, v = step(q, v, targets[t], dt)
        return (q[..., 2] + 0.1 * q[..., 0]).sum()

    qn, vn, tn = q0.clone().requires_grad_(True), v0.clone().requires_grad_(True), Ub[0].clone().requires_grad_(True)
    nodes = autograd_nodes(*step(qn, vn, tn, dt))
    best = [float("inf")] * 3
    for _ in range(max(repeats, 2) + 1):
        c0 = time.process_time()
        with torch.no_grad():
            rollout(Ub)
        c1 = time.process_time()
        targets = Ub.clone().requires_grad_(True)
        s = rollout(targets)
        c2 = time.process_time()
        torch.autograd.grad(s, targets)
        c3 = time.process_time()
        best = [min(b, x) for b, x in zip(best, (c1 - c0, c2 - c1, c3 - c2))]
    fwd, rec, bwd = best
    return {"forward_s": fwd, "record_s": rec, "backward_s": bwd, "ratio": (rec + bwd) / fwd, "nodes": nodes}


def gradient_pieces(repeats: int = 15, calls: int = 200) -> dict:
    """Forward + backward of one call, batch 1, float64, CPU seconds (minimum of
    ``repeats`` interleaved repeats of ``calls`` calls): the floating-base
    update and ``quat_to_matrix`` as their hand-written autograd Functions
    and as the plain operations they replace."""
    import torch

    from backdrive.contact._step import _IntegrateWorld, _integrate_world_floating
    from backdrive.spatial._quat import _QuatToMatrix, _quat_to_matrix

    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 19, generator=g, dtype=torch.float64)
    q[:, 3:7] /= q[:, 3:7].norm()
    v = 0.1 * torch.randn(1, 18, generator=g, dtype=torch.float64)
    a = torch.randn(1, 18, generator=g, dtype=torch.float64)
    cases = {
        "integrate_world, Function": (lambda q, v, a: _IntegrateWorld.apply(q, v, a, 4e-3), (q, v, a)),
        "integrate_world, plain autograd": (lambda q, v, a: _integrate_world_floating(q, v, a, 4e-3), (q, v, a)),
        "quat_to_matrix, Function": (_QuatToMatrix.apply, (q[:, 3:7],)),
        "quat_to_matrix, plain autograd": (_quat_to_matrix, (q[:, 3:7],)),
    }
    best = dict.fromkeys(cases, float("inf"))
    for _ in range(repeats):
        for k, (f, xs) in cases.items():
            xs = [x.clone().requires_grad_(True) for x in xs]
            c0 = time.process_time()
            for _ in range(calls):
                out = f(*xs)
                out = out if isinstance(out, tuple) else (out,)
                torch.autograd.backward(out, [torch.ones_like(o) for o in out])
            best[k] = min(best[k], (time.process_time() - c0) / calls)
    return best


# ------------------------------------------------------- stable step sizes


STEP_CANDIDATES = (1e-3, 2e-3, 4e-3, 5e-3, 8e-3, 10e-3)
# Step of the MuJoCo settle that gives backdrive's start states.
START_DT = 2e-3
# Accuracy bound of the step selection: the standing height within this of
# the reference (MuJoCo, matched law, at the smallest candidate step), m.
HEIGHT_TOLERANCE = 3e-3
SETTLE_SECONDS = 3.0


def _settled_ok(qvel_max: float, grf_ratio: float) -> bool:
    return bool(np.isfinite(qvel_max) and qvel_max < 0.05 and abs(grf_ratio - 1) < 0.02)


def mujoco_standing(robot: str, dt: float, native: bool = False) -> dict:
    """MuJoCo dropped 1 cm and settled for ``SETTLE_SECONDS`` at step ``dt``:
    ``{"ok", "height" (mean of the last 0.5 s), "qvel_max", "grf"}``."""
    model = mc.build_model(robot, dt=dt, native=native, integrator=INTEGRATOR,
                           stiction_width=None if native else CONTACT["stiction_width"])
    try:
        r = mc.settle(model, robot, drop=0.01, duration=SETTLE_SECONDS, every=1)
    except FloatingPointError:
        return {"ok": False, "height": float("nan"), "qvel_max": float("inf"), "grf": float("nan")}
    tail = r.t >= r.t[-1] - 0.5
    out = {"height": float(r.base_height[tail].mean()), "qvel_max": float(np.abs(r.qvel).max()),
           "grf": float(r.normal_force[-1] / r.weight)}
    out["ok"] = _settled_ok(out["qvel_max"], out["grf"])
    return out


def backdrive_standing(robot: str, dt: float, dtype: str = "float64") -> dict | None:
    """backdrive from the same 1 cm drop, settled for ``SETTLE_SECONDS`` at
    step ``dt`` (batch 1); the same fields as :func:`mujoco_standing`."""
    setup = _backdrive_setup(robot, dtype)
    if setup is None:
        return None
    import torch

    bd, _, step = setup
    model = mc.build_model(robot, dt=dt, integrator=INTEGRATOR, stiction_width=CONTACT["stiction_width"])
    qpos, ctrl = mc.drop_state(model, robot, 0.01)
    q, v, target = to_backdrive_state(model, bd, qpos, np.zeros(model.nv), ctrl)
    n = int(round(SETTLE_SECONDS / dt))
    heights = []
    with torch.no_grad():
        for k in range(n):
            q, v, res = step(q, v, target, dt, result=True)
            heights.append(float(q[2]))
            if not bool(torch.isfinite(q).all()):
                return {"ok": False, "height": float("nan"), "qvel_max": float("inf"), "grf": float("nan")}
    weight = float(bd.total_mass) * 9.81
    tail = int(round(0.5 / dt))
    out = {"height": float(np.mean(heights[-tail:])), "qvel_max": float(v.abs().max()),
           "grf": float(res.total_force[2]) / weight}
    out["ok"] = _settled_ok(out["qvel_max"], out["grf"])
    return out


def select_steps(robot: str, candidates=STEP_CANDIDATES, dtypes=("float64", "float32")) -> dict:
    """Each engine's largest candidate step that settles (max |qvel| < 0.05,
    ground reaction within 2 % of the weight) with its standing height within
    ``HEIGHT_TOLERANCE`` of the reference (MuJoCo, matched law, smallest step).

    Returns ``{"reference": height, "table": [(engine, dt, result)], engine: dt}``
    for the engines ``"mujoco"``, ``"mujoco_native"`` and ``"backdrive_<dtype>"``.
    """
    out = {"table": []}
    ref = None
    for dt in candidates:
        r = mujoco_standing(robot, dt)
        if ref is None:
            ref = r["height"]
        out["table"].append(("MuJoCo matched penalty", dt, r))
    out["reference"] = ref

    def pick(name, results):
        good = [dt for dt, r in results if r["ok"] and abs(r["height"] - ref) <= HEIGHT_TOLERANCE]
        out[name] = max(good) if good else None

    pick("mujoco", [(dt, r) for e, dt, r in out["table"]])
    native = [(dt, mujoco_standing(robot, dt, native=True)) for dt in candidates]
    out["table"] += [("MuJoCo default contact", dt, r) for dt, r in native]
    pick("mujoco_native", native)
    for dtype in dtypes:
        rows = []
        for dt in candidates[1:]:  # the reference step is only MuJoCo's (the slowest to simulate)
            r = backdrive_standing(robot, dt, dtype)
            if r is None:
                break
            rows.append((dt, r))
        out["table"] += [(f"backdrive {dtype}", dt, r) for dt, r in rows]
        pick(f"backdrive_{dtype}", rows)
    return out


# ------------------------------------------------------------ the gradient


def objective_weights(model) -> np.ndarray:
    """``w`` with ``L = w . x_T`` in MuJoCo's tangent state ``(dq (nv), qvel (nv))``:
    base height + 0.1 * base x."""
    w = np.zeros(2 * model.nv)
    w[2] = 1.0
    w[0] = 0.1
    return w


def mujoco_forward(model, qpos, qvel, U: np.ndarray):
    """One rollout under targets ``U (T, nu)``; returns the final ``(qpos, qvel)``."""
    import mujoco

    data = mujoco.MjData(model)
    data.qpos[:] = qpos
    data.qvel[:] = qvel
    for u in U:
        data.ctrl[:] = u
        mujoco.mj_step(model, data)
    return data.qpos.copy(), data.qvel.copy()


def mujoco_chained_gradient(model, qpos, qvel, U: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """``dL/dU (T, nu)`` by centred ``mjd_transitionFD`` at each step, chained."""
    import mujoco

    T, nu = U.shape
    nx = 2 * model.nv
    data = mujoco.MjData(model)
    data.qpos[:] = qpos
    data.qvel[:] = qvel
    A = np.zeros((T, nx, nx))
    B = np.zeros((T, nx, nu))
    for t in range(T):
        data.ctrl[:] = U[t]
        mujoco.mjd_transitionFD(model, data, eps, True, A[t], B[t], None, None)
        mujoco.mj_step(model, data)
    lam = objective_weights(model)
    G = np.zeros((T, nu))
    for t in reversed(range(T)):
        G[t] = B[t].T @ lam
        lam = A[t].T @ lam
    return G


def mujoco_fd_gradient(model, qpos, qvel, U: np.ndarray, eps: float = 1e-6, nthread: int = 2) -> np.ndarray:
    """``dL/dU (T, nu)`` by central differences of whole rollouts (``mujoco.rollout``)."""
    import mujoco
    from mujoco import rollout

    T, nu = U.shape
    n = T * nu
    Up = np.repeat(U[None], 2 * n, 0)
    idx = np.arange(n)
    Up[idx, idx // nu, idx % nu] += eps
    Up[n + idx, idx // nu, idx % nu] -= eps
    x0 = initial_states(model, qpos, qvel, 1)
    x0[0, 1 + model.nq:1 + model.nq + model.nv] = qvel  # no perturbation
    x0 = np.repeat(x0, 2 * n, 0)
    datas = [mujoco.MjData(model) for _ in range(nthread)]
    with rollout.Rollout(nthread=nthread) as pool:
        state, _ = pool.rollout(model, datas, x0, Up)
    qT = state[:, -1, 1:1 + model.nq]
    vT = state[:, -1, 1 + model.nq:1 + model.nq + model.nv]
    w = objective_weights(model)
    # The objective reads base position and velocity only (no quaternion parts).
    L = qT[:, :3] @ w[:3] + vT @ w[model.nv:]
    return ((L[:n] - L[n:]) / (2 * eps)).reshape(T, nu)


def gradient_targets(model, ctrl, T: int, amplitude: float = WIGGLE, seed: int = 1) -> np.ndarray:
    """Standing targets plus a smooth per-joint wiggle (2 Hz, ``amplitude``
    rad, random phases) so the robot moves with every foot loaded."""
    rng = np.random.default_rng(seed)
    t = np.arange(T)[:, None] * model.opt.timestep
    phase = rng.uniform(0, 2 * np.pi, model.nu)
    return ctrl[None] + amplitude * np.sin(2 * np.pi * 2.0 * t + phase)


def contact_regime(model, qpos, qvel, U: np.ndarray) -> tuple[float, float]:
    """Along the nominal rollout: the smallest foot normal force (N; 0 if a
    foot lifts off) and the largest friction use ``|f_t| / (mu f_n)`` (1 =
    sliding on the cone)."""
    import mujoco

    data = mujoco.MjData(model)
    data.qpos[:] = qpos
    data.qvel[:] = qvel
    f6 = np.zeros(6)
    fmin, use = np.inf, 0.0
    for u in U:
        data.ctrl[:] = u
        mujoco.mj_step(model, data)
        mujoco.mj_forward(model, data)
        fn = []
        for i in range(data.ncon):
            mujoco.mj_contactForce(model, data, i, f6)
            fn.append(f6[0])
            use = max(use, float(np.hypot(f6[1], f6[2]) / (data.contact[i].friction[0] * f6[0] + 1e-12)))
        fmin = min(fmin, min(fn) if len(fn) == 4 else 0.0)
    return float(fmin), use


# --------------------------------------------------------------------- MJX


def mjx_throughput(robot: str, dt: float, nstep: int, batch: int, repeats: int):
    """MJX (JAX, CPU) rollout of ``batch`` copies, ``jit(vmap(scan(mjx.step)))``
    in float64, from the settled state with the same joint-velocity noise.

    Returns ``(steps_per_s, compile_s, base_height_spread)`` or ``None`` where
    ``mujoco.mjx`` / ``jax`` are missing. Compiling takes 40-200 s per shape
    on a 2-core CPU.
    """
    try:
        import jax
        import jax.numpy as jp

        jax.config.update("jax_enable_x64", True)
        import mujoco
        from mujoco import mjx
    except ImportError:
        return None
    model = mc.build_model(robot, dt=dt, integrator=INTEGRATOR, stiction_width=CONTACT["stiction_width"])
    qpos, qvel, ctrl = settled_state(model, robot)
    data = mujoco.MjData(model)
    data.qpos[:], data.qvel[:], data.ctrl[:] = qpos, qvel, ctrl
    mm = mjx.put_model(model)
    md = mjx.put_data(model, data)
    # In x64 mode the step makes int64 contact indices; start from a step's types.
    md = jax.jit(mjx.forward)(mm, md)
    rng = np.random.default_rng(0)
    noise = np.zeros((batch, model.nv))
    noise[:, 6:] = JOINT_NOISE * rng.standard_normal((batch, model.nv - 6))
    qv = jp.asarray(qvel[None] + noise)

    def roll(v0):
        def body(d, _):
            return mjx.step(mm, d), None

        d, _ = jax.lax.scan(body, md.replace(qvel=v0), None, length=nstep)
        return d.qpos

    f = jax.jit(jax.vmap(roll))
    t = time.perf_counter()
    out = f(qv).block_until_ready()
    compile_s = time.perf_counter() - t
    best = timed(lambda: f(qv).block_until_ready(), repeats)
    z = np.asarray(out[:, 2])
    return batch * nstep / best, compile_s - best, float(z.max() - z.min())


# ------------------------------------------------------------------ report


def mujoco_rows(robot: str, dt: float, nstep: int, repeats: int, batches, native: bool = False):
    """MuJoCo's rows at step ``dt``: ``(label, runner, batch, threads, dt, steps/s)``."""
    model = mc.build_model(robot, dt=dt, native=native, integrator=INTEGRATOR,
                           stiction_width=None if native else CONTACT["stiction_width"])
    qpos, qvel, ctrl = settled_state(model, robot)
    label = "MuJoCo default contact" if native else "MuJoCo matched penalty"
    rows = []
    x1 = initial_states(model, qpos, qvel, 1)
    t = timed(mujoco_step_loop(model, x1, ctrl, nstep), repeats, _inner(1, nstep))
    rows.append((label, "mj_step loop (Python)", 1, 1, dt, nstep / t, nstep / LAST_CPU[0]))
    for batch in batches:
        x0 = initial_states(model, qpos, qvel, batch)
        for nthread in ((1,) if batch == 1 else (1, 2)):
            run, close = mujoco_rollout_runner(model, x0, ctrl, nstep, nthread)
            try:
                t = timed(run, repeats, _inner(batch, nstep))
            finally:
                close()
            rows.append((label, "rollout", batch, nthread, dt, batch * nstep / t, batch * nstep / LAST_CPU[0]))
    return rows


def backdrive_rows(robot: str, dt: float, nstep: int, repeats: int, batches, dtype: str, threads=(1, 2)):
    """backdrive's rows at step ``dt``: the implicit contact step under the
    same servos, from MuJoCo's settled state (at ``dt``) with the same
    joint-velocity noise; ``[]`` where ``backdrive.contact`` is missing."""
    import torch

    # The start: MuJoCo's settled state at a step where MuJoCo is stable
    # (backdrive's own step may be beyond it; the standing heights agree to 0.1 mm).
    model = mc.build_model(robot, dt=START_DT, integrator=INTEGRATOR, stiction_width=CONTACT["stiction_width"])
    qpos, qvel, ctrl = settled_state(model, robot)
    rows = []
    before = torch.get_num_threads()
    try:
        for batch in batches:
            x0 = initial_states(model, qpos, qvel, batch)
            bd = backdrive_rollout_runner(robot, dt, batch, nstep, dtype, mj_model=model, x0=x0, ctrl=ctrl)
            if bd is None:
                return rows
            for nthread in ((1,) if batch == 1 else threads):
                torch.set_num_threads(nthread)
                # One rollout per timing: even batch 1 takes well above the timer's resolution.
                try:
                    sps = batch * nstep / timed(bd, repeats)
                    cps = batch * nstep / LAST_CPU[0]
                except Exception as e:  # a blow-up is a result to report, not a crash
                    sps, cps = f"fails: {type(e).__name__}", None
                rows.append((f"backdrive {dtype}", "implicit contact step", batch, nthread, dt, sps, cps))
    finally:
        torch.set_num_threads(before)
    return rows


def _process_worker(rank, robot, dt, nstep, dtype, x0, ctrl, repeats, barrier, results):
    """One process of :func:`backdrive_process_rows`: its share ``x0`` of the
    batch on one torch thread, timed between the parent's barriers; puts
    ``(rank, CPU seconds of its fastest repeat or an error message)``."""
    import torch

    torch.set_num_threads(1)
    try:
        from backdrive.runtime import retain_freed_memory

        retain_freed_memory()
        model = mc.build_model(robot, dt=START_DT, integrator=INTEGRATOR, stiction_width=CONTACT["stiction_width"])
        run = backdrive_rollout_runner(robot, dt, len(x0), nstep, dtype, mj_model=model, x0=x0, ctrl=ctrl)
        run()  # warm-up: the model's caches, the workspaces
    except Exception as e:  # reported by the parent as the row's result
        results.put((rank, f"fails: {type(e).__name__}: {e}"))
        barrier.abort()
        return
    cpu = float("inf")
    for _ in range(repeats):
        barrier.wait()
        c = time.process_time()
        run()
        cpu = min(cpu, time.process_time() - c)
        barrier.wait()
    results.put((rank, cpu))


def backdrive_process_rows(robot: str, dt: float, nstep: int, repeats: int, batch: int, dtype: str,
                           nproc: int = 2, timeout: float = 1800.0):
    """backdrive's rows with the batch split over ``nproc`` processes, torch
    on one thread in each (the data-parallel split of ``docs/scaling.md``:
    each process simulates ``batch / nproc`` robots): the same scenario and
    start states as :func:`backdrive_rows`, wall time from the moment every
    process starts its share to the moment the last one finishes (minimum
    over ``repeats``, after one warm-up rollout each). Threads inside one
    process do not scale the step: its ~2,000 small operations each pass the
    Python lock back and forth (``docs/contact.md``, *Speed*)."""
    import multiprocessing as mp
    import threading

    if batch % nproc:
        return [(f"backdrive {dtype}", f"implicit contact step, {nproc} processes", batch, nproc, dt,
                 f"skipped: batch {batch} does not split into {nproc}", None)]
    model = mc.build_model(robot, dt=START_DT, integrator=INTEGRATOR, stiction_width=CONTACT["stiction_width"])
    qpos, qvel, ctrl = settled_state(model, robot)
    x0 = initial_states(model, qpos, qvel, batch)
    ctx = mp.get_context("spawn")
    barrier, results = ctx.Barrier(nproc + 1), ctx.Queue()
    share = batch // nproc
    procs = [ctx.Process(target=_process_worker, daemon=True,
                         args=(r, robot, dt, nstep, dtype, x0[r * share:(r + 1) * share], ctrl, repeats, barrier,
                               results)) for r in range(nproc)]
    for p in procs:
        p.start()
    label, runner = f"backdrive {dtype}", f"implicit contact step, {nproc} processes"
    best = float("inf")
    try:
        for _ in range(repeats):
            barrier.wait(timeout)
            t = time.perf_counter()
            barrier.wait(timeout)
            best = min(best, time.perf_counter() - t)
    except threading.BrokenBarrierError:
        best = None
    if best is not None:  # every process finished its repeats: one result each
        out = dict(results.get(timeout=60) for _ in procs)
    else:  # a process failed (and broke the barrier): whatever messages came
        out = {}
        while not results.empty():
            r, msg = results.get()
            out[r] = msg
    for p in procs:
        p.join(60)
        if p.is_alive():
            p.terminate()
    errors = [v for v in out.values() if isinstance(v, str)]
    if best is None or errors:
        return [(label, runner, batch, nproc, dt, errors[0] if errors else "fails: a process did not finish", None)]
    return [(label, runner, batch, nproc, dt, batch * nstep / best, batch * nstep / sum(out.values()))]


def gradient_report(robot: str, dt: float, T: int, repeats: int, amplitude: float = WIGGLE) -> dict:
    model = mc.build_model(robot, dt=dt, integrator=INTEGRATOR, stiction_width=CONTACT["stiction_width"])
    qpos, qvel, ctrl = settled_state(model, robot)
    U = gradient_targets(model, ctrl, T, amplitude)
    fmin, use = contact_regime(model, qpos, qvel, U)
    t_fwd = timed(lambda: mujoco_forward(model, qpos, qvel, U), repeats)
    t0 = time.perf_counter()
    G = mujoco_chained_gradient(model, qpos, qvel, U)
    t_chain = time.perf_counter() - t0
    t0 = time.perf_counter()
    G_fd = mujoco_fd_gradient(model, qpos, qvel, U)
    t_fd = time.perf_counter() - t0
    cos = float(G.ravel() @ G_fd.ravel() / (np.linalg.norm(G) * np.linalg.norm(G_fd)))
    out = {
        "robot": robot, "T": T, "forward_s": t_fwd, "chained_fd_s": t_chain, "rollout_fd_s": t_fd,
        "cosine": cos, "normwise": float(np.linalg.norm(G - G_fd) / np.linalg.norm(G_fd)),
        "grad_norm": float(np.linalg.norm(G_fd)), "min_normal_force": fmin, "friction_use": use,
    }
    out["backdrive"] = {}
    for dtype in ("float64", "float32"):
        bd = backdrive_gradient_runner(robot, dt, T, dtype, mj_model=model, qpos=qpos, qvel=qvel, U=U)
        if bd is None:
            break
        fwd, grad = bd
        r = out["backdrive"][dtype] = {}
        try:
            # Interleaved, minimum of each: the ratio is what counts on a shared machine.
            tf, tg = float("inf"), float("inf")
            fwd()
            grad()
            for _ in range(max(repeats, 3)):
                t0 = time.perf_counter()
                fwd()
                t1 = time.perf_counter()
                Gb = np.asarray(grad())
                t2 = time.perf_counter()
                tf, tg = min(tf, t1 - t0), min(tg, t2 - t1)
            r["forward_s"], r["gradient_s"] = tf, tg
            r["cosine_vs_mujoco_fd"] = float(Gb.ravel() @ G_fd.ravel() / (np.linalg.norm(Gb) * np.linalg.norm(G_fd)))
            r["grad"] = Gb
        except Exception as e:  # reported, not a crash
            r["error"] = f"fails: {type(e).__name__}: {e}"[:120]
    b = out["backdrive"]
    if "grad" in b.get("float64", {}) and "grad" in b.get("float32", {}):
        g64, g32 = b["float64"]["grad"], b["float32"]["grad"]
        b["float32"]["cosine_vs_float64"] = float(g64.ravel() @ g32.ravel() / (np.linalg.norm(g64) * np.linalg.norm(g32)))
    return out


def _load() -> str:
    try:
        return "load average " + " ".join(f"{x:.2f}" for x in __import__("os").getloadavg())
    except OSError:
        return "load average unknown"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="one repeat, batches 1 and 64 only")
    ap.add_argument("--dt", type=float, default=None,
                    help="one step for every engine, s (default: each engine's own largest accurate step)")
    ap.add_argument("--mujoco-dt", type=float, default=None, help="with --backdrive-dt: skip the step selection")
    ap.add_argument("--backdrive-dt", type=float, default=None, help="with --mujoco-dt: skip the step selection")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batches", nargs="+", type=int, default=None)
    ap.add_argument("--robots", nargs="+", default=list(ROBOTS), choices=ROBOTS)
    ap.add_argument("--dtypes", nargs="+", default=["float32", "float64"], choices=["float32", "float64"])
    ap.add_argument("--threads", nargs="+", type=int, default=[1, 2], help="backdrive's torch threads")
    ap.add_argument("--processes", nargs="*", type=int, default=[2],
                    help="backdrive rows with the batch split over this many processes (one torch thread each); "
                         "none: skip")
    ap.add_argument("--no-gradient", action="store_true")
    ap.add_argument("--gradient-profile", nargs="+", type=int, default=None, metavar="BATCH",
                    help="only the gradient's time split (forward, recording, backward) at these batch sizes")
    ap.add_argument("--gradient-pieces", action="store_true",
                    help="only the hand-written backward passes against plain autograd, one call each")
    ap.add_argument("--gradient-only", action="store_true",
                    help="only the rollout-gradient table (no step selection, no throughput)")
    ap.add_argument("--no-native", action="store_true", help="skip the rows of MuJoCo's default contact")
    ap.add_argument("--no-retain", action="store_true",
                    help="do not call backdrive.runtime.retain_freed_memory() (large batches then page-fault)")
    ap.add_argument("--gradient-dt", type=float, default=4e-3, help="step of the gradient scenario, s")
    ap.add_argument("--wiggle", type=float, default=WIGGLE, help="servo-target wiggle of the gradient scenario, rad")
    ap.add_argument("--mjx-robots", nargs="*", default=[], choices=ROBOTS,
                    help="robots for the MJX rows (default none: each shape compiles for 40-200 s)")
    ap.add_argument("--mjx-batches", nargs="+", type=int, default=[64])
    args = ap.parse_args(argv)
    import mujoco

    try:
        import torch

        torch.set_num_threads(1)
        tv = torch.__version__
    except ImportError:
        tv = "missing"
    retained = False
    if not args.no_retain:
        try:
            from backdrive.runtime import retain_freed_memory

            retained = retain_freed_memory()
        except ImportError:
            pass

    repeats = 1 if args.quick else args.repeats
    batches = args.batches or ((1, 64) if args.quick else BATCHES)
    print(f"# Contact benchmark: {platform.processor() or platform.machine()}, {__import__('os').cpu_count()} cores, "
          f"MuJoCo {mujoco.__version__}, torch {tv}, {args.steps} steps per rollout, wall time, min of {repeats}; "
          f"{_load()} at the start; freed memory {'retained' if retained else 'not retained'}\n")
    if args.gradient_pieces:
        print("| piece, batch 1, float64 | forward + backward (us, CPU) |\n| --- | ---: |")
        for k, t in gradient_pieces().items():
            print(f"| {k} | {t * 1e6:.0f} |")
        print(f"\n{_load()} at the end")
        return
    if args.gradient_profile:
        print(f"## Rollout gradient: where the time goes ({args.steps} steps of {args.gradient_dt * 1e3:g} ms, "
              "CPU time of this process, one thread)\n")
        print("| robot | dtype | batch | forward, no grad (ms) | forward recording (ms) | backward (ms) "
              "| gradient / forward | autograd nodes per step |")
        print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
        for robot in args.robots:
            for d in args.dtypes:
                for b in args.gradient_profile:
                    r = gradient_profile(robot, args.gradient_dt, args.steps, b, d, repeats)
                    print(f"| {robot} | {d} | {b} | {r['forward_s'] * 1e3:.1f} | {r['record_s'] * 1e3:.1f} | "
                          f"{r['backward_s'] * 1e3:.1f} | {r['ratio']:.2f}x | {r['nodes']} |", flush=True)
        print(f"\n{_load()} at the end")
        return
    summary = []
    for robot in ([] if args.gradient_only else args.robots):
        if args.mujoco_dt and args.backdrive_dt:
            steps = {"mujoco": args.mujoco_dt, "mujoco_native": args.mujoco_dt,
                     **{f"backdrive_{d}": args.backdrive_dt for d in args.dtypes}}
        elif args.dt is None:
            sel = select_steps(robot, dtypes=tuple(args.dtypes))
            print(f"## {robot}: stable step sizes\n")
            print(f"Dropped 1 cm, PD-held, {SETTLE_SECONDS:g} s. Stable: max |qvel| < 0.05 and ground reaction "
                  f"within 2 % of the weight at the end. Accurate: standing height within "
                  f"{HEIGHT_TOLERANCE * 1e3:g} mm of MuJoCo's (matched law) at {STEP_CANDIDATES[0] * 1e3:g} ms "
                  f"({sel['reference']:.5f} m).\n")
            print("| engine | step (ms) | stable | standing height (m) | minus reference (mm) | max qvel | GRF / weight |")
            print("| --- | ---: | --- | ---: | ---: | ---: | ---: |")
            for eng, dt, r in sel["table"]:
                print(f"| {eng} | {dt * 1e3:g} | {'yes' if r['ok'] else 'no'} | {r['height']:.5f} | "
                      f"{(r['height'] - sel['reference']) * 1e3:+.2f} | {r['qvel_max']:.2g} | {r['grf']:.4f} |")
            print()
            steps = {k: sel[k] for k in sel if k not in ("table", "reference")}
        else:
            steps = {"mujoco": args.dt, "mujoco_native": args.dt, **{f"backdrive_{d}": args.dt for d in args.dtypes}}
        print(f"## {robot}: throughput, each engine at its step\n")
        print("| robot | engine | runner | batch | threads | step (ms) | steps/s | robot-s per wall-s "
              "| vs MuJoCo rollout, 2 threads | steps per CPU-s |")
        print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        base = {}

        def show(rows):  # printed as they come: a long run on a busy machine shows its progress
            for label, runner, batch, nthread, dt, sps, cps in rows:
                if label == "MuJoCo matched penalty" and runner == "rollout" and (nthread == 2 or batch == 1) \
                        and not isinstance(sps, str):
                    base[batch] = sps * dt
            for label, runner, batch, nthread, dt, sps, cps in rows:
                if isinstance(sps, str):
                    print(f"| {robot} | {label} | {runner} | {batch} | {nthread} | {dt * 1e3:g} | {sps} | | | |")
                    continue
                rs = sps * dt
                ratio = f"{rs / base[batch]:.2f}x" if batch in base else ""
                print(f"| {robot} | {label} | {runner} | {batch} | {nthread} | {dt * 1e3:g} | {sps:,.0f} | {rs:,.1f} "
                      f"| {ratio} | {cps:,.0f} |", flush=True)
                if label.startswith("backdrive") and batch == max(batches) and ratio:
                    how = f"{nthread} processes" if "processes" in runner else \
                        f"{nthread} thread{'s' if nthread > 1 else ''}"
                    summary.append((robot, label, how, rs / base[batch]))

        if steps.get("mujoco"):
            show(mujoco_rows(robot, steps["mujoco"], args.steps, repeats, batches))
        if steps.get("mujoco_native") and not args.no_native:
            show(mujoco_rows(robot, steps["mujoco_native"], args.steps, repeats, batches, native=True))
        for d in args.dtypes:
            if steps.get(f"backdrive_{d}"):
                for b in batches:
                    show(backdrive_rows(robot, steps[f"backdrive_{d}"], args.steps, repeats, (b,), d,
                                        tuple(args.threads)))
                    for n in args.processes if b > 1 else ():
                        show(backdrive_process_rows(robot, steps[f"backdrive_{d}"], args.steps, repeats, b, d, n))
        print()
    for robot in args.mjx_robots:
        for batch in args.mjx_batches:
            dt = args.dt or 4e-3
            r = mjx_throughput(robot, dt, args.steps, batch, repeats)
            if r is None:
                print(f"| {robot} | MJX | not installed (pip install mujoco-mjx 'jax[cpu]') | {batch} | | | | | |")
                break
            sps, comp, spread = r
            print(f"| {robot} | MJX float64 (compile {comp:.0f} s) | jit(vmap(scan(step))) | {batch} | jax "
                  f"| {dt * 1e3:g} | {sps:,.0f} | {sps * dt:,.1f} | |")
    if summary:
        print("\nAt the largest batch, robot-seconds per wall-second against MuJoCo's 2-thread rollout: "
              + "; ".join(f"{r} {lab} {how} {x:.2f}x" for r, lab, how, x in summary))
    if args.no_gradient:
        print(f"\n{_load()} at the end")
        return
    dt = args.gradient_dt
    print(f"\n## Gradient of a {args.steps}-step rollout (final base height + 0.1 x) w.r.t. {args.steps} x 12 targets, "
          f"{dt * 1e3:g} ms steps\n")
    print(f"Servo targets wiggled by {args.wiggle} rad; min foot normal force and max friction use "
          "|f_t| / (mu f_n) along the rollout show the contact regime. backdrive: forward and gradient "
          "interleaved in one process, batch 1, one thread.\n")
    print("| robot | engine | min f_n (N) | friction use | forward rollout (ms) | gradient (ms) | ratio |"
          " cosine vs MuJoCo rollout FD | normwise error | rollout FD, 2 x T x 12 rollouts on 2 threads (ms) |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for robot in args.robots:
        g = gradient_report(robot, dt, args.steps, repeats, args.wiggle)
        print(f"| {robot} | MuJoCo, chained mjd_transitionFD | {g['min_normal_force']:.1f} | {g['friction_use']:.2f} | "
              f"{g['forward_s'] * 1e3:.2f} | {g['chained_fd_s'] * 1e3:.1f} | {g['chained_fd_s'] / g['forward_s']:.0f}x | "
              f"{g['cosine']:.6f} | {g['normwise']:.1e} | {g['rollout_fd_s'] * 1e3:.0f} |")
        for dtype, r in g["backdrive"].items():
            if "error" in r:
                print(f"| {robot} | backdrive {dtype} autograd | {r['error']} | | | | | | | |")
                continue
            extra = f" (vs float64: {r['cosine_vs_float64']:.7f})" if "cosine_vs_float64" in r else ""
            print(f"| {robot} | backdrive {dtype} autograd | | | {r['forward_s'] * 1e3:.1f} | {r['gradient_s'] * 1e3:.1f} | "
                  f"{r['gradient_s'] / r['forward_s']:.2f}x | {r['cosine_vs_mujoco_fd']:.6f}{extra} | | |")
    print(f"\n{_load()} at the end")


if __name__ == "__main__":
    main()
