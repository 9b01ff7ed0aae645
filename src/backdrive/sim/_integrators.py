"""Fixed-step integrators over ``(q, v)`` with configuration updates on the manifold.

Each integrator takes the acceleration function ``accel(q, v) -> a`` (control
held constant over the step) and the system's ``integrate(q, v, dt)``, which
moves a configuration along a velocity (a plain sum for joint coordinates, the
exponential map for a floating base).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

__all__ = ["INTEGRATORS", "semi_implicit_euler", "explicit_euler", "rk4"]

Accel = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
Integrate = Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor]


def semi_implicit_euler(accel: Accel, integrate: Integrate, q, v, dt: float):
    """Symplectic Euler: velocity first, then position with the new velocity.

    ``v1 = v + dt * a(q, v)``, ``q1 = integrate(q, v1, dt)``. First order; for
    a conservative system the energy error stays bounded instead of drifting.
    """
    v1 = v + dt * accel(q, v)
    return integrate(q, v1, dt), v1


def explicit_euler(accel: Accel, integrate: Integrate, q, v, dt: float):
    """Forward Euler: ``q1 = integrate(q, v, dt)``, ``v1 = v + dt * a(q, v)``."""
    a = accel(q, v)
    return integrate(q, v, dt), v + dt * a


def rk4(accel: Accel, integrate: Integrate, q, v, dt: float):
    """Classical fourth-order Runge-Kutta on ``(q, v)``.

    Stage configurations are reached with ``integrate`` from ``q`` and the
    final update applies the weighted mean velocity
    ``(k1 + 2 k2 + 2 k3 + k4) / 6`` the same way. Fourth order for joint
    coordinates; for a floating base the stage velocities are not transported
    between tangent spaces, which leaves the base orientation second order.
    """
    h = 0.5 * dt
    a1 = accel(q, v)
    v2 = v + h * a1
    q2 = integrate(q, v, h)
    a2 = accel(q2, v2)
    v3 = v + h * a2
    q3 = integrate(q, v2, h)
    a3 = accel(q3, v3)
    v4 = v + dt * a3
    q4 = integrate(q, v3, dt)
    a4 = accel(q4, v4)
    v_mean = (v + 2.0 * v2 + 2.0 * v3 + v4) / 6.0
    a_mean = (a1 + 2.0 * a2 + 2.0 * a3 + a4) / 6.0
    return integrate(q, v_mean, dt), v + dt * a_mean


INTEGRATORS = {
    "semi_implicit": semi_implicit_euler,
    "euler": explicit_euler,
    "rk4": rk4,
}
