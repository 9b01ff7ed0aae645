"""How the smoothing widths trade gradient variance for bias (Suh et al., ICML 2022).

``python tests/test_contact_smoothing.py`` prints the table of docs/contact.md.
"""

from __future__ import annotations

import torch

from backdrive.contact import ContactGeometry, ContactModel, ContactParameters, integrate_world
from backdrive.data import load
from backdrive.kinematics import forward_kinematics


def landing_gradients(normal_width: float, stiction_width: float, n: int = 100, steps: int = 32, seed: int = 0):
    """Gradients ``(n, 12)`` of a loss on the final base state with respect to
    the PD targets, for ``n`` quadruped landings from perturbed initial states
    (drop height 0-4 mm, forward speed 0-0.4 m/s, pitch rate +-0.5 rad/s),
    and the mean final base height (the bias of the smoothing shows there)."""
    robot = load("quadruped", floating_base=True)
    feet = [f for f in robot.link_names if f.endswith("_foot")]
    cm = ContactModel(
        robot,
        ContactGeometry.from_model(robot, links=feet),
        params=ContactParameters(normal_width=normal_width, stiction_width=stiction_width),
    )
    gen = torch.Generator().manual_seed(seed)
    qj = torch.tensor([0.0, 0.7, -1.4] * 4, dtype=robot.dtype)
    q0 = robot.neutral()
    q0[7:] = qj
    T = forward_kinematics(robot, q0)
    z0 = -min(float(T[robot.frame_index(f), 2, 3]) for f in feet) + 0.02
    q = q0.expand(n, -1).clone()
    q[:, 2] = z0 + 0.004 * torch.rand(n, generator=gen, dtype=robot.dtype)
    v = torch.zeros(n, robot.nv, dtype=robot.dtype)
    v[:, 0] = 0.4 * torch.rand(n, generator=gen, dtype=robot.dtype)
    v[:, 4] = torch.rand(n, generator=gen, dtype=robot.dtype) - 0.5
    target = qj.expand(n, 12).clone().requires_grad_()
    zeros6 = torch.zeros(n, 6, dtype=robot.dtype)
    damping = torch.cat([torch.zeros(6, dtype=robot.dtype), torch.full((12,), 6.0, dtype=robot.dtype)])
    for _ in range(steps):
        tau = torch.cat([zeros6, 200.0 * (target - q[:, 7:]) - 6.0 * v[:, 6:]], -1)
        a, _ = cm.acceleration(robot, q, v, tau, dt=2e-3, extra_damping=damping)
        q, v = integrate_world(robot, q, v, a, 2e-3)
    loss = (q[:, 0] + 2.0 * q[:, 2] + q[:, 4] + 0.1 * v[:, :6].sum(-1)).sum()
    (g,) = torch.autograd.grad(loss, target)
    return g, float(q[:, 2].detach().mean())


def spread(g: torch.Tensor) -> float:
    """Relative spread: mean distance of the samples' gradients from their mean, over the mean's norm."""
    m = g.mean(0)
    return float((g - m).norm(dim=-1).mean() / m.norm())


def test_wider_normal_smoothing_gives_less_gradient_variance():
    spreads = [spread(landing_gradients(w, 0.01, n=24, steps=24)[0]) for w in (1e-5, 1e-3)]
    assert spreads[1] < spreads[0]


if __name__ == "__main__":
    torch.set_num_threads(1)
    print("| normal width (m) | stiction width (m/s) | gradient spread | mean |grad| | final base height (m) |")
    print("| --- | --- | --- | --- | --- |")
    for wn, wt in ((1e-5, 0.01), (1e-4, 0.01), (1e-3, 0.01), (1e-4, 1e-3), (1e-4, 0.1)):
        g, z = landing_gradients(wn, wt)
        print(f"| {wn:g} | {wt:g} | {spread(g):.3f} | {float(g.norm(dim=-1).mean()):.3g} | {z:.4f} |", flush=True)
