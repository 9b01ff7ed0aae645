"""Which path the contact rollout gradient should take, by batch size.

The scenario of ``benchmarks/contact.py``'s gradient profile (the settled
robot, joint velocities perturbed by ``contact.JOINT_NOISE`` across the
batch, PD targets wiggled, 4 ms steps, one thread; the scalar final base
height + 0.1 x summed over the batch, its gradient with respect to all
targets). Per batch size: the forward rollout without gradient (automatic
path), and the gradient (recording forward + backward) with
``use_path("fast")`` (the fast step's own backward, ``contact/_fast.py``)
and ``use_path("reference")`` (autograd through the reference step). CPU
time per step, minimum of the interleaved repeats; the ratios are against
the forward. ``kinematics._paths.FAST_MIN_BATCH["contact_step_grad"]`` is
where the fast gradient starts to win.

    python benchmarks/contact_gradient_paths.py [quadruped|go1] [float64|float32] [BATCHES] [STEPS] [REPEATS]

``BATCHES``: comma-separated (default ``64,256,512,1024``).
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

from backdrive.kinematics import use_path  # noqa: E402

robot = sys.argv[1] if len(sys.argv) > 1 else "quadruped"
dtype = sys.argv[2] if len(sys.argv) > 2 else "float64"
batches = [int(b) for b in (sys.argv[3] if len(sys.argv) > 3 else "64,256,512,1024").split(",")]
T = int(sys.argv[4]) if len(sys.argv) > 4 else 10
repeats = int(sys.argv[5]) if len(sys.argv) > 5 else 3
dt = 4e-3
model = mc.build_model(robot, dt=dt, integrator=cb.INTEGRATOR, stiction_width=cb.CONTACT["stiction_width"])
qpos, qvel, ctrl = cb.settled_state(model, robot)
U = cb.gradient_targets(model, ctrl, T, cb.WIGGLE)
bd, contact, step = cb._backdrive_setup(robot, dtype)
print("| robot | dtype | batch | forward (ms/step) | gradient, fast (ms/step) | ratio | gradient, reference (ms/step) | ratio | load |")
print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
for batch in batches:
    rng = np.random.default_rng(0)
    qvels = np.repeat(qvel[None], batch, 0)
    qvels[1:, 6:] += cb.JOINT_NOISE * rng.standard_normal((batch - 1, qvel.shape[0] - 6))
    q0, v0, Ub = cb.to_backdrive_state(model, bd, np.repeat(qpos[None], batch, 0), qvels, U)

    def rollout(targets):
        q, v = q0, v0
        for t in range(T):
            q, v = step(q, v, targets[t], dt)
        return (q[..., 2] + 0.1 * q[..., 0]).sum()

    best = {}
    for _ in range(repeats + 1):  # the first round warms the caches
        for name, path, grad in (("forward", "auto", False), ("fast", "fast", True), ("reference", "reference", True)):
            with use_path(path):
                c0 = time.process_time()
                if grad:
                    targets = Ub.clone().requires_grad_(True)
                    torch.autograd.grad(rollout(targets), targets)
                else:
                    with torch.no_grad():
                        rollout(Ub)
                best[name] = min(best.get(name, float("inf")), time.process_time() - c0)
    f = best["forward"]
    ms = {k: v / T * 1e3 for k, v in best.items()}
    print(f"| {robot} | {dtype} | {batch} | {ms['forward']:.1f} | {ms['fast']:.1f} | {best['fast'] / f:.2f}x "
          f"| {ms['reference']:.1f} | {best['reference'] / f:.2f}x | {os.getloadavg()[0]:.1f} |", flush=True)
