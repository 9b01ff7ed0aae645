"""Two checkouts' contact steps compared field by field, forward and gradient.

One implicit step of the throughput rows' standing workload (``contact.py``'s
servo case, MuJoCo-settled states with perturbed joint velocities, scaled by
``VSCALE`` so that some samples drop a foot in the unilateral step), without
and with autograd, through ``OLD_SRC``'s and ``NEW_SRC``'s ``backdrive``: the
largest difference of the accelerations, of every field of the
``ContactResult`` (the Jacobian included) and of the gradients of a fixed
random weighting of them with respect to ``q``, ``v`` and the servo target.

    python benchmarks/contact_step_compare.py OLD_SRC NEW_SRC [quadruped|go1] [float64|float32] [BATCH] [VSCALE]
"""

import sys
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
batch = int(sys.argv[5]) if len(sys.argv) > 5 else 512
vscale = float(sys.argv[6]) if len(sys.argv) > 6 else 1.0
dt = 0.01
FIELDS = ("point", "normal", "penetration", "normal_velocity", "slip_velocity", "normal_force", "friction_force",
          "force", "f_ext", "jacobian")
bdold, bdnew = import_pair(OLD, NEW)
model = mc.build_model(robot, dt=cb.START_DT, integrator=cb.INTEGRATOR, stiction_width=cb.CONTACT["stiction_width"])
qpos, qvel, ctrl = cb.settled_state(model, robot)
x0 = cb.initial_states(model, qpos, qvel, batch)
nq, nv = model.nq, model.nv


def one(pkg, grad: bool):
    bd, contact, extra, C = cb.servo_case(robot, dtype, pkg)
    q, v, target = cb.to_backdrive_state(model, bd, x0[:, 1:1 + nq], x0[:, 1 + nq:1 + nq + nv],
                                         np.broadcast_to(ctrl, (batch, len(ctrl))))
    v = v * vscale
    if not grad:
        with torch.no_grad():
            a, res = contact.acceleration(bd, q, v, cb.servo_torque(q, v, target), dt=dt, scheme="implicit",
                                          extra_damping=extra)
        return {"a": a, **{k: getattr(res, k) for k in FIELDS}}
    q, v, target = (t.clone().requires_grad_(True) for t in (q, v, target))
    a, res = contact.acceleration(bd, q, v, cb.servo_torque(q, v, target), dt=dt, scheme="implicit",
                                  extra_damping=extra)
    outs = {"a": a, **{k: getattr(res, k) for k in FIELDS}}
    gen = torch.Generator().manual_seed(1)
    loss = sum((o * torch.randn(o.shape, generator=gen, dtype=o.dtype)).sum() for o in outs.values())
    gq, gv, gt = torch.autograd.grad(loss, (q, v, target))
    return {"a": a.detach(), "grad_q": gq, "grad_v": gv, "grad_target": gt}


worst = 0.0
for grad in (False, True):
    old, new = one("bdold", grad), one("bdnew", grad)
    if not grad:  # a point the unilateral step dropped applies exactly zero force
        print(f"samples with a dropped point: {int((old['normal_force'] == 0).any(-1).sum())} of {batch}")
    for k in old:
        d = float((old[k] - new[k]).abs().max())
        scale = float(old[k].abs().max())
        worst = max(worst, d / max(scale, 1e-300))
        print(f"{'grad' if grad else 'step'} {k:16s} max|old - new| {d:.1e} (max |old| {scale:.1e})"
              f"{'  bit-identical' if torch.equal(old[k], new[k]) else ''}")
print(f"{robot} {dtype} batch {batch} vscale {vscale}: worst relative difference {worst:.1e}")
