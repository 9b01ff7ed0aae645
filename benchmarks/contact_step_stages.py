"""Where the fast contact step's time goes: CPU time per stage of ``contact._fast._step``.

Copies ``SRC/backdrive`` (a checkout's ``src``) to a temporary folder, puts a
timing mark (``time.process_time``) after each line of ``_step`` (and of
``_points``) that starts with one of ``MARKS`` below, then runs the
throughput rows' standing workload (``contact.py``'s servo case: ``BATCH``
MuJoCo-settled states, ``STEPS`` implicit steps of 10 ms without gradient,
one thread, freed memory retained) and prints each stage's CPU time per step
(the time since the previous mark), the sum over ``_step`` and the whole
step (``ContactModel.acceleration`` and ``integrate_world``). Marks whose
line the checkout does not have are listed and skipped, so an older
checkout gives a coarser table. The marks cost a few microseconds each.

    python benchmarks/contact_step_stages.py SRC [quadruped|go1] [float64|float32] [BATCH] [STEPS]
"""

import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

SRC = sys.argv[1]
robot = sys.argv[2] if len(sys.argv) > 2 else "quadruped"
dtype = sys.argv[3] if len(sys.argv) > 3 else "float64"
batch = int(sys.argv[4]) if len(sys.argv) > 4 else 4096
steps = int(sys.argv[5]) if len(sys.argv) > 5 else 10

#: (start of a line, the label of the time from the previous mark to the end of that statement)
MARKS = [
    ("    g = gravity_vector(robot, gravity)", None),
    ("    K = kinematics_fast(robot, topo, qf)", "kinematics (dynamics)"),
    ("    keep = {} if record else None", "rhs: tau + joint forces"),
    ("    rhs = rhs - rnea_fast(", "RNEA (dynamics)"),
    ("    E = crba_entries_fast(", "CRBA (dynamics)"),
    ("    Rp, pp, phi, n, point, pt, Jc, R0 = _points(", "points, Jacobian columns"),
    ("    v_c = _point_velocity(P, Jc, vt)", "J v"),
    ("    f_n0, f_t0, c_n0, k_n0 = f_n, f_t, c_n, k_n", "force law"),
    ("    FM = LTDLFactor(sp, topo, E)", "LTDL of M (dynamics)"),
    ("    inv_mass = ", "effective masses (Z sweep)"),
    ("    Z2 = ", "effective masses (Z sweep)"),
    ("    b = _base_turn(vt, R0, dt)", "base turn"),
    ("        CK = C + dt * Kst", "blend: C, K, CK"),
    ("        C, Kst, CK, mu, mu_fn_s = _blend(", "blend: C, K, CK"),
    ("        G.addcmul_(Jc[:, 1:2]", "G = CK J"),
    ("        E.index_add_(0, P.tgt", "J^T CK J pairs into M"),
    ("            E.index_add_(0, sp.dpos, D, alpha=dt)", "extra damping"),
    ("        full = X.rhs.new_zeros(", "right-hand side J^T (f - pred)"),
    ("        FA = LTDLFactor(sp, topo, E", "LTDL of A (dynamics)"),
    ("        at = FA.solve_fast(", "solve (dynamics)"),
    ("        x = _point_velocity(P, Jc, at)", "applied forces"),
    ("        f_nn = (force * n", "applied forces"),
    ("    fields_law = (c_n, k_n, mu_fn_s)", None),
    ("    active = None", None),
    ("    B = tuple(batch)", "unilateral passes, result fields"),
    ("    a = _from_internal(topo, at)", "result fields"),
]

tmp = tempfile.mkdtemp()
shutil.copytree(os.path.join(SRC, "backdrive"), Path(tmp) / "backdrive", ignore=shutil.ignore_patterns("__pycache__"))
path = Path(tmp) / "backdrive" / "contact" / "_fast.py"
lines = path.read_text().split("\n")
out, found, depth, pending = [], set(), 0, []
for ln in lines:
    out.append(ln)
    depth += sum(ln.count(c) for c in "([{") - sum(ln.count(c) for c in ")]}")
    for start, label in MARKS:
        if ln.startswith(start):
            found.add(start)
            pending.append(f"{re.match(r' *', ln).group(0)}_stage_mark({label!r})")
    if pending and depth == 0:
        out.extend(pending)
        pending = []
text = "\n".join(out) + '''

import time as _stage_time
STAGE_TIMES = {}
_stage_last = [0.0]


def _stage_mark(label):
    now = _stage_time.process_time()
    if label is not None:
        STAGE_TIMES[label] = STAGE_TIMES.get(label, 0.0) + now - _stage_last[0]
    _stage_last[0] = now
'''
path.write_text(text)
missing = [s for s, _ in MARKS if s not in found]
sys.path.insert(0, tmp)
sys.path.insert(1, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)
import _mujoco_contact as mc  # noqa: E402
import contact as cb  # noqa: E402
import backdrive  # noqa: E402
import backdrive.contact._fast as FF  # noqa: E402

assert backdrive.__file__.startswith(tmp)
backdrive.runtime.retain_freed_memory()
model = mc.build_model(robot, dt=cb.START_DT, integrator=cb.INTEGRATOR, stiction_width=cb.CONTACT["stiction_width"])
qpos, qvel, ctrl = cb.settled_state(model, robot)
x0 = cb.initial_states(model, qpos, qvel, batch)
bd, contact, extra, C = cb.servo_case(robot, dtype)
nq, nv = model.nq, model.nv
q0, v0, target = cb.to_backdrive_state(model, bd, x0[:, 1:1 + nq], x0[:, 1 + nq:1 + nq + nv],
                                       np.broadcast_to(ctrl, (batch, len(ctrl))))


def run(n):
    q, v = q0, v0
    with torch.no_grad():
        for _ in range(n):
            a, _ = contact.acceleration(bd, q, v, cb.servo_torque(q, v, target), dt=0.01, scheme="implicit",
                                        extra_damping=extra)
            q, v = C.integrate_world(bd, q, v, a, 0.01)


run(3)
FF.STAGE_TIMES.clear()
c0 = time.process_time()
run(steps)
total = time.process_time() - c0
print(f"{SRC}: {robot} {dtype} batch {batch}, {steps} steps, load {os.getloadavg()[0]:.1f}"
      + (f"; marks not found: {len(missing)}" if missing else ""))
print("| stage | ms per step | share |")
print("| --- | ---: | ---: |")
inside = 0.0
for k, t in FF.STAGE_TIMES.items():
    inside += t
    print(f"| {k} | {1e3 * t / steps:.2f} | {100 * t / total:.1f} % |")
print(f"| all of _step | {1e3 * inside / steps:.2f} | {100 * inside / total:.1f} % |")
print(f"| whole step (acceleration + integrate_world) | {1e3 * total / steps:.2f} | 100 % |")
