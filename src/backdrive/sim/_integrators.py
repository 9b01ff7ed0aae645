"""Fixed-step integrators over ``(q, v)`` with configuration updates on the manifold.

Each integrator takes the acceleration function ``accel(q, v) -> a`` (control
held constant over the step) and the system's ``integrate(q, v, dt)``, which
moves a configuration along a velocity (a plain sum for joint coordinates, the
exponential map for a floating base); :func:`rk4` also takes the system's
``dexp_inv`` to stay fourth order on a Lie group.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

__all__ = ["INTEGRATORS", "semi_implicit_euler", "explicit_euler", "rk4"]

Accel = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
Integrate = Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor]


def semi_implicit_euler(accel: Accel, integrate: Integrate, q, v, dt: float, dexp_inv=None):
    """Symplectic Euler: velocity first, then position with the new velocity.

    ``v1 = v + dt * a(q, v)``, ``q1 = integrate(q, v1, dt)``. First order; for
    a conservative system the energy error stays bounded instead of drifting.
    """
    # torch.add with alpha: one autograd node instead of two per update.
    v1 = torch.add(v, accel(q, v), alpha=dt)
    return integrate(q, v1, dt), v1


def explicit_euler(accel: Accel, integrate: Integrate, q, v, dt: float, dexp_inv=None):
    """Forward Euler: ``q1 = integrate(q, v, dt)``, ``v1 = v + dt * a(q, v)``."""
    a = accel(q, v)
    return integrate(q, v, dt), torch.add(v, a, alpha=dt)


def rk4(accel: Accel, integrate: Integrate, q, v, dt: float, dexp_inv=None):
    """Classical fourth-order Runge-Kutta, in local coordinates around ``q``.

    The configuration is written ``q(t) = integrate(q, xi(t), 1)`` and the
    stages integrate ``xi' = dexp_inv(xi, v)``, ``v' = a`` in that vector
    space; the step ends at ``integrate(q, xi(dt), 1)``. For joint coordinates
    ``dexp_inv`` is the identity and this is textbook RK4; for a floating base
    it carries each stage's base-frame twist back to the tangent space at
    ``q``, which keeps the method fourth order on SE(3) (Munthe-Kaas).
    """
    if dexp_inv is None:
        def dexp_inv(xi, w):
            return w

    h = 0.5 * dt
    kx1, kv1 = v, accel(q, v)
    xi2 = h * kx1
    v2 = v + h * kv1
    kx2, kv2 = dexp_inv(xi2, v2), accel(integrate(q, xi2, 1.0), v2)
    xi3 = h * kx2
    v3 = v + h * kv2
    kx3, kv3 = dexp_inv(xi3, v3), accel(integrate(q, xi3, 1.0), v3)
    xi4 = dt * kx3
    v4 = v + dt * kv3
    kx4, kv4 = dexp_inv(xi4, v4), accel(integrate(q, xi4, 1.0), v4)
    xi = (dt / 6.0) * (kx1 + 2.0 * kx2 + 2.0 * kx3 + kx4)
    return integrate(q, xi, 1.0), v + (dt / 6.0) * (kv1 + 2.0 * kv2 + 2.0 * kv3 + kv4)


INTEGRATORS = {
    "semi_implicit": semi_implicit_euler,
    "euler": explicit_euler,
    "rk4": rk4,
}
