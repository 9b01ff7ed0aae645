"""Stability of the simulator on every example-robot-data model, with the
joint damping and friction of its own URDF.

For each model with joints (float64, every joint torque-driven without
saturation, zero torque):

* ``rest``: fixed base, gravity off, 2 s at dt 2 ms from the neutral pose at
  rest (the condition of issue 14): largest joint speed, implicit scheme.
* ``pushed``: the same from a random pose with ~0.05 rad/s on every joint:
  largest speed of the damped or frictional joints over the last second
  (friction stops a joint; light damping on a heavy joint only slows it).
* ``free fall``: floating base, gravity on, from rest: the joints must stay
  still; implicit (default) over 2 s at dt 2 ms, explicit (the scheme
  before) over 0.5 s.
* ``fixed, 1 ms``: fixed base, gravity on, at dt 1 ms: the arms fall against
  their friction; NaN or the largest joint speed, implicit over 0.5 s,
  explicit over 0.25 s.

Usage::

    python benchmarks/sim_stability.py            # the whole sweep (tens of minutes on 2 cores)
    python benchmarks/sim_stability.py go1 talos  # some models
    python benchmarks/sim_stability.py --speed    # step cost, implicit / explicit

Prints a Markdown table (the one in docs/simulation.md).
"""

from __future__ import annotations

import math
import sys
import time
import warnings

import torch

from backdrive.data import load
from backdrive.data._example_robot_data import list_example_robots
from backdrive.sim import Simulator, State, TorqueActuator

F64 = torch.float64


def _sim(robot, dt, mode):
    return Simulator(robot, dt, actuator=TorqueActuator(effort_limit=math.inf), joint_forces=mode)


def _speed(robot, traj, start: int = 0) -> str:
    """Largest joint speed from state ``start`` on, or where it went NaN."""
    vj = traj.v[start:, robot.nv - robot.num_joints:]
    ok = torch.isfinite(traj.v).all(-1)
    if not bool(ok.all()):
        return f"NaN at step {int((~ok).nonzero()[0, 0])}"
    return f"{float(vj.abs().max()):.1e}"


def sweep_one(name: str) -> str:
    try:
        fixed = load(f"example-robot-data:{name}")
        floating = load(f"example-robot-data:{name}", floating_base=True)
    except Exception as exc:  # a model that does not load is a row, not a crash
        return f"| {name} | - | - | - | load error: {type(exc).__name__} | | | | | |"
    nj = fixed.num_joints
    if nj == 0:
        return None
    fr, dp = float(fixed.friction.max()), float(fixed.damping.max())
    cells = []
    # rest and pushed, gravity off: one rollout of a batch of two
    g0 = fixed.replace(gravity=torch.zeros(3, dtype=F64))
    sim = _sim(g0, 2e-3, "auto")
    gen = torch.Generator().manual_seed(1)
    lo, hi = g0.lower.clamp(-1, 1), g0.upper.clamp(-1, 1)
    q0 = torch.stack([g0.neutral(), lo + (hi - lo) * torch.rand(nj, generator=gen, dtype=F64)])
    v0 = torch.stack([torch.zeros(nj, dtype=F64), 0.05 * torch.randn(nj, generator=gen, dtype=F64)])
    tr = sim.rollout(State(q0, v0), sim.zero_controls(1000, 2), check_finite=False)
    rest = type(tr)(q=tr.q[0], v=tr.v[0], effort=tr.effort[0], controls=tr.controls[0], dt=tr.dt)
    cells.append(_speed(g0, rest))
    damped = (g0.friction > 0) | (g0.damping > 0)
    if bool(torch.isfinite(tr.v[1]).all()):
        vd = tr.v[1, 500:][:, damped].abs().max() if bool(damped.any()) else torch.tensor(0.0)
        cells.append(f"{float(vd):.1e} ({int(damped.sum())}/{nj} damped)")
    else:
        cells.append(_speed(g0, type(tr)(q=tr.q[1], v=tr.v[1], effort=tr.effort[1], controls=tr.controls[1], dt=tr.dt)))
    # free fall, floating base: 2 s implicit, 0.5 s explicit (it goes wrong within it)
    for mode, T in (("implicit", 1000), ("explicit", 250)):
        sim = _sim(floating, 2e-3, mode)
        cells.append(_speed(floating, sim.rollout(sim.initial_state(), sim.zero_controls(T), check_finite=False)))
    # fixed base, gravity on, 1 ms: 0.5 s implicit, 0.25 s explicit
    for mode, T in (("implicit", 500), ("explicit", 250)):
        sim = _sim(fixed, 1e-3, mode)
        cells.append(_speed(fixed, sim.rollout(sim.initial_state(), sim.zero_controls(T), check_finite=False)))
    return f"| {name} | {nj} | {fr:g} | {dp:g} | " + " | ".join(cells) + " |"


HEADER = (
    "| model | joints | max friction (N m) | max damping (N m s/rad) | rest, g off: max joint speed (rad/s) "
    "| pushed, g off: last 1 s, damped joints | free fall: implicit | free fall: explicit "
    "| fixed, g on, 1 ms: implicit | fixed, g on, 1 ms: explicit |\n"
    "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
)


def speed() -> None:
    """Step cost of the implicit scheme relative to the explicit one (same
    process, interleaved, minimum of repeats), batch 1 and 1,024, float64."""
    print("| model | path | batch | implicit / explicit (step) | implicit / explicit (step + backward) |")
    print("| --- | --- | ---: | ---: | ---: |")
    cases = [
        ("go1 (friction + damping)", load("example-robot-data:go1", floating_base=True)),
        ("panda (damping)", load("example-robot-data:panda")),
        ("ur5 (neither)", load("example-robot-data:ur5")),
    ]
    for label, robot in cases:
        for batch in (1, 1024):
            sims = {m: _sim(robot, 2e-3, m) for m in ("implicit", "explicit")}
            impl = sims["implicit"]._implicit
            which = "friction solve" if impl.has_friction else ("armature" if impl.has_damping else "plain")
            q = robot.neutral().expand(batch, -1).clone()
            v = 0.1 * torch.randn(batch, robot.nv, dtype=F64)
            u = torch.zeros(batch, sims["implicit"].nu, dtype=F64)
            best = {}
            for grad in (False, True):
                for rep in range(5):
                    for m, sim in sims.items():
                        uu = u.clone().requires_grad_(grad)
                        t0 = time.perf_counter()
                        n = 3 if batch > 1 else 20
                        for _ in range(n):
                            st = sim.step(State(q, v), uu, check_finite=False)
                            if grad:
                                st.v.sum().backward()
                        dt = (time.perf_counter() - t0) / n
                        key = (m, grad)
                        best[key] = min(best.get(key, math.inf), dt)
            r0 = best[("implicit", False)] / best[("explicit", False)]
            r1 = best[("implicit", True)] / best[("explicit", True)]
            print(f"| {label} | {which} | {batch} | {r0:.2f} | {r1:.2f} |", flush=True)


def main(argv: list[str]) -> None:
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    if argv and argv[0] == "--speed":
        speed()
        return
    names = argv or list_example_robots()
    print(HEADER, flush=True)
    for name in names:
        row = sweep_one(name)
        if row is not None:
            print(row, flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
