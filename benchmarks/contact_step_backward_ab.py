"""Before/after cost of ONE contact step's backward at a large batch, two checkouts in one process.

The state of ``contact_gradient_ab.py`` (robot settled by MuJoCo, ``BATCH``
copies, joint velocities perturbed by ``contact.JOINT_NOISE``), one
implicit step recorded once (``q``, ``v``, ``tau`` requiring grad; from 512
samples the fast path's single node, ``contact._fast._ImplicitStepFast``),
then, alternating the two checkouts within each repeat: the step without
gradient, and the backward of a random projection of the acceleration
(``retain_graph``: the same recorded step every time). CPU time of this
process, minimum over the repeats; prints both, and the largest relative
difference of the two checkouts' gradients. Much shorter than the 100-step
rollout of ``contact_gradient_ab.py``, and without its forward: use it to
see a change of the backward alone.

    python benchmarks/contact_step_backward_ab.py OLD_SRC NEW_SRC [quadruped|go1] [float64|float32] [BATCH] [REPEATS]
"""

import os
import sys
import time
from pathlib import Path

import torch

torch.set_num_threads(1)
sys.path.insert(0, str(Path(__file__).resolve().parent))
import _mujoco_contact as mc  # noqa: E402
import contact as cb  # noqa: E402
from _checkouts import import_pair  # noqa: E402

OLD, NEW = sys.argv[1], sys.argv[2]
robot = sys.argv[3] if len(sys.argv) > 3 else "quadruped"
dtype = sys.argv[4] if len(sys.argv) > 4 else "float64"
batch = int(sys.argv[5]) if len(sys.argv) > 5 else 1024
repeats = int(sys.argv[6]) if len(sys.argv) > 6 else 20
import_pair(OLD, NEW)

dt = 4e-3
model = mc.build_model(robot, dt=dt, integrator=cb.INTEGRATOR, stiction_width=cb.CONTACT["stiction_width"])
qpos, qvel, ctrl = cb.settled_state(model, robot)
U = cb.gradient_targets(model, ctrl, 1, cb.WIGGLE)
qpos, qvel = cb.perturbed_batch(qpos, qvel, batch)


def runners(pkg):
    bd, contact, extra, _ = cb.servo_case(robot, dtype, pkg)
    q0, v0, Ub = cb.to_backdrive_state(model, bd, qpos, qvel, U)
    tau0 = cb.servo_torque(q0, v0, Ub[0])
    q, v, tau = (x.clone().requires_grad_(True) for x in (q0, v0, tau0))
    w = torch.randn(batch, bd.nv, dtype=bd.dtype, generator=torch.Generator().manual_seed(0))

    def forward():
        with torch.no_grad():
            contact.acceleration(bd, q, v, tau, dt=dt, scheme="implicit", extra_damping=extra)

    a, _ = contact.acceleration(bd, q, v, tau, dt=dt, scheme="implicit", extra_damping=extra)
    loss = (a * w).sum()

    def backward():
        return torch.autograd.grad(loss, (q, v, tau), retain_graph=True)

    return forward, backward


runs = {"old": runners("bdold"), "new": runners("bdnew")}
g = {k: b() for k, (_, b) in runs.items()}
best = {k: [float("inf"), float("inf")] for k in runs}
for _ in range(repeats):
    for k, (forward, backward) in runs.items():
        c0 = time.process_time()
        forward()
        c1 = time.process_time()
        backward()
        c2 = time.process_time()
        best[k] = [min(best[k][0], c1 - c0), min(best[k][1], c2 - c1)]
diff = max(float((x - y).norm() / x.norm()) for x, y in zip(g["old"], g["new"]))
print(f"| {robot} | {dtype} | {batch} | " + " | ".join(f"{best[k][0] * 1e3:.1f} | {best[k][1] * 1e3:.1f}" for k in runs)
      + f" | {best['new'][1] / best['old'][1]:.3f} | {diff:.1e} | {os.getloadavg()[0]:.1f} |")
