"""Before/after cost of the contact rollout gradient, two checkouts in ONE process.

The scenario of ``benchmarks/contact.py``'s gradient table (robot settled by
MuJoCo, 100 steps of 4 ms, PD targets wiggled, batch 1, one thread; the
gradient of final base height + 0.1 x with respect to all targets). Copies
``OLD_SRC/backdrive`` and ``NEW_SRC/backdrive`` to a temporary folder as the
packages ``bdold`` and ``bdnew`` (as ``compare_checkouts.py`` does), then
alternates the two within each repeat: forward without gradient, then
forward + backward; CPU time of this process, minimum over the repeats.
Prints both ratios (gradient / forward) and the relative difference of the
two gradients.

    python benchmarks/contact_gradient_ab.py OLD_SRC NEW_SRC [quadruped|go1] [float64|float32] [REPEATS] [BATCH]

``BATCH`` (default 1): that many copies of the settled state, joint
velocities perturbed by ``contact.JOINT_NOISE`` (as ``--gradient-profile``),
the scalar summed over the batch.
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

OLD, NEW = sys.argv[1], sys.argv[2]
robot = sys.argv[3] if len(sys.argv) > 3 else "quadruped"
dtype = sys.argv[4] if len(sys.argv) > 4 else "float64"
repeats = int(sys.argv[5]) if len(sys.argv) > 5 else 5
batch = int(sys.argv[6]) if len(sys.argv) > 6 else 1
from _checkouts import import_pair  # noqa: E402

import_pair(OLD, NEW)

dt, T = 4e-3, 100
model = mc.build_model(robot, dt=dt, integrator=cb.INTEGRATOR, stiction_width=cb.CONTACT["stiction_width"])
qpos, qvel, ctrl = cb.settled_state(model, robot)
U = cb.gradient_targets(model, ctrl, T, cb.WIGGLE)
if batch > 1:
    qpos, qvel = cb.perturbed_batch(qpos, qvel, batch)


def runners(pkg):
    bd, contact, extra, C = cb.servo_case(robot, dtype, pkg)
    q0, v0, Ub = cb.to_backdrive_state(model, bd, qpos, qvel, U)

    def rollout(targets):
        q, v = q0, v0
        for t in range(T):
            a, _ = contact.acceleration(bd, q, v, cb.servo_torque(q, v, targets[t]), dt=dt, scheme="implicit", extra_damping=extra)
            q, v = C.integrate_world(bd, q, v, a, dt)
        return (q[..., 2] + 0.1 * q[..., 0]).sum()

    def forward():
        with torch.no_grad():
            rollout(Ub)

    def gradient():
        targets = Ub.clone().requires_grad_(True)
        return torch.autograd.grad(rollout(targets), targets)[0]

    return forward, gradient


runs = {"old": runners("bdold"), "new": runners("bdnew")}
g = {k: grad() for k, (_, grad) in runs.items()}
best = {k: [float("inf"), float("inf")] for k in runs}
for _ in range(repeats):
    for k, (forward, gradient) in runs.items():
        c0 = time.process_time()
        forward()
        c1 = time.process_time()
        gradient()
        c2 = time.process_time()
        best[k] = [min(best[k][0], c1 - c0), min(best[k][1], c2 - c1)]
diff = float((g["old"] - g["new"]).norm() / g["old"].norm())
print(f"| {robot} | {dtype} | {batch} | " + " | ".join(f"{best[k][0] * 1e3:.0f} | {best[k][1] * 1e3:.0f} | {best[k][1] / best[k][0]:.2f}x"
                                            for k in runs) + f" | {diff:.1e} | {os.getloadavg()[0]:.1f} |")
