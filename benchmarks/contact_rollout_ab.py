"""Before/after throughput of the batched contact rollout, two checkouts in one process.

The workload of ``contact.py``'s throughput rows (``backdrive_rollout_runner``):
``BATCH`` copies of the robot settled by MuJoCo, joint velocities perturbed
by ``contact.JOINT_NOISE``, standing under the PD servos for ``STEPS``
implicit steps of 10 ms without gradient. The two checkouts run alternately
within each repeat, with freed memory retained as in ``contact.py``
(``runtime.retain_freed_memory``) (CPU time of this process, one thread, minimum over the
repeats), so a shared machine's drift cancels in their ratio; the final
states of the two are compared too.

    python benchmarks/contact_rollout_ab.py OLD_SRC NEW_SRC [quadruped|go1] [float64|float32] [BATCH] [STEPS] [REPEATS]
"""

import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

torch.set_num_threads(1)
sys.path.insert(0, str(Path(__file__).resolve().parent))
import _mujoco_contact as mc  # noqa: E402
import contact as cb  # noqa: E402
from _checkouts import import_pair  # noqa: E402

OLD, NEW = sys.argv[1], sys.argv[2]
robot = sys.argv[3] if len(sys.argv) > 3 else "quadruped"
dtype = sys.argv[4] if len(sys.argv) > 4 else "float64"
batch = int(sys.argv[5]) if len(sys.argv) > 5 else 4096
steps = int(sys.argv[6]) if len(sys.argv) > 6 else 20
repeats = int(sys.argv[7]) if len(sys.argv) > 7 else 3
dt = 0.01
bdold, bdnew = import_pair(OLD, NEW)
bdnew.runtime.retain_freed_memory()  # as contact.py does (the allocator is the process's: one call serves both)

model = mc.build_model(robot, dt=cb.START_DT, integrator=cb.INTEGRATOR, stiction_width=cb.CONTACT["stiction_width"])
qpos, qvel, ctrl = cb.settled_state(model, robot)
x0 = cb.initial_states(model, qpos, qvel, batch)
nq, nv = model.nq, model.nv


def runner(pkg):
    bd, contact, extra, C = cb.servo_case(robot, dtype, pkg)
    q0, v0, target = cb.to_backdrive_state(model, bd, x0[:, 1:1 + nq], x0[:, 1 + nq:1 + nq + nv],
                                           np.broadcast_to(ctrl, (batch, len(ctrl))))

    def run():
        q, v = q0, v0
        with torch.no_grad():
            for _ in range(steps):
                a, _ = contact.acceleration(bd, q, v, cb.servo_torque(q, v, target), dt=dt, scheme="implicit",
                                            extra_damping=extra)
                q, v = C.integrate_world(bd, q, v, a, dt)
        return q

    return run


runs = {"old": runner("bdold"), "new": runner("bdnew")}
final = {k: r() for k, r in runs.items()}
best = {k: float("inf") for k in runs}
for _ in range(repeats):
    for k, run in runs.items():
        c0 = time.process_time()
        run()
        best[k] = min(best[k], time.process_time() - c0)
diff = float((final["old"] - final["new"]).abs().max())
print("| robot | dtype | batch | old steps/CPU s | new steps/CPU s | new / old | max |q_old - q_new| | load |")
print(f"| {robot} | {dtype} | {batch} | " + " | ".join(f"{batch * steps / best[k]:,.0f}" for k in runs)
      + f" | {best['old'] / best['new']:.3f} | {diff:.1e} | {os.getloadavg()[0]:.1f} |")
