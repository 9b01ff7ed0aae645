"""Two checkouts' fast contact steps compared bit for bit on the test models.

Beside ``contact_step_compare.py`` (the throughput rows' feet on a plane):
the quadruped with every URDF shape as contact shapes (columns of unequal
support, padded) over a heightfield, per-shape stiffness with two batch axes
(3 x 70) and the unclamped law; and the fixed-base Panda with spheres on its
links, half of them below a plane (200 samples). One step without gradient
(every field of the result) and the gradients with respect to ``q`` and
``v`` of a fixed random weighting of the acceleration and five fields, the
fast path forced. Prints whether every array is identical, and the largest
difference.

    python benchmarks/contact_step_compare_shapes.py OLD_SRC NEW_SRC
"""

import dataclasses
import sys
import warnings
from pathlib import Path

import torch

torch.set_num_threads(1)
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _checkouts import import_pair  # noqa: E402

old, new = import_pair(sys.argv[1], sys.argv[2])
def case(bd, kind, grad):
    robot = bd.data.load("quadruped" if kind != "panda" else "panda", **({"floating_base": True} if kind != "panda" else {}))
    C = bd.contact
    g = torch.Generator().manual_seed(3)
    if kind == "hf":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            geom = C.ContactGeometry.from_model(robot)
        ns = len(geom.shapes); batch = (3, 70)
        params = C.ContactParameters(stiffness=2e4 + 4e4 * torch.rand(*batch, ns, generator=g, dtype=robot.dtype),
                                     friction=0.3 + torch.rand(ns, generator=g, dtype=robot.dtype),
                                     stiction_width=torch.tensor([0.02], dtype=robot.dtype), clamp_normal=False)
        H = 0.01 * torch.randn(21, 21, generator=g, dtype=robot.dtype)
        cm = C.ContactModel(robot, geom, C.Heightfield(H, spacing=0.05, origin=(-0.5, -0.5)), params)
        q = robot.neutral().expand(*batch, -1).clone()
        q[..., 7:] = torch.tensor([0.0, 0.7, -1.4] * 4, dtype=robot.dtype) + 0.2 * torch.randn(*batch, 12, generator=g, dtype=robot.dtype)
        q[..., 2] = 0.3 + 0.05 * torch.rand(*batch, generator=g, dtype=robot.dtype)
    else:
        links = [n for n in robot.link_names if n.startswith("panda_link")][3:]
        geom = C.ContactGeometry.spheres(robot, {n: 0.05 for n in links})
        batch = (200,)
        q = robot.neutral().expand(*batch, -1) + 0.5 * torch.randn(*batch, robot.nq, generator=g, dtype=robot.dtype)
        T = bd.kinematics.forward_kinematics(robot, q[0])
        cm = C.ContactModel(robot, geom, C.GroundPlane(height=float(T[robot.frame_index(links[-1]), 2, 3])))
    v = 0.3 * torch.randn(*batch, robot.nv, generator=g, dtype=robot.dtype)
    tau = 5.0 * torch.randn(*batch, robot.nv, generator=g, dtype=robot.dtype)
    if robot.floating_base:
        tau[..., :6] = 0
    with bd.kinematics.use_path("fast"):
        if not grad:
            with torch.no_grad():
                a, r = cm.acceleration(robot, q, v, tau, dt=4e-3)
            return [a] + [getattr(r, f.name) for f in dataclasses.fields(r) if f.name != "_bodies"]
        q = q.clone().requires_grad_(True); v = v.clone().requires_grad_(True)
        a, r = cm.acceleration(robot, q, v, tau, dt=4e-3)
        outs = [a] + [getattr(r, k) for k in ("force", "normal_force", "f_ext", "point", "jacobian")]
        gen = torch.Generator().manual_seed(1)
        loss = sum((o * torch.randn(o.shape, generator=gen, dtype=o.dtype)).sum() for o in outs)
        return list(torch.autograd.grad(loss, (q, v)))

for kind in ("hf", "panda"):  # heightfield quadruped, fixed-base arm
    for grad in (False, True):
        xs, ys = case(old, kind, grad), case(new, kind, grad)
        print(kind, "grad" if grad else "step", all(torch.equal(x, y) for x, y in zip(xs, ys)),
              max(float((x - y).abs().max()) for x, y in zip(xs, ys)))
