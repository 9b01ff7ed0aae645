"""Contact gradients: float64 gradcheck of one step in every regime, rollouts vs finite differences."""

from __future__ import annotations

import math

import pytest
import torch

from backdrive.contact import ContactModel, ContactParameters, GroundPlane, contact_step

from _robots import box_robot, sphere_robot, state

G = 9.81
DT = 1e-3


def _step_fn(robot, scheme, base_params, keys):
    """``(q, v, *params) -> (q1, v1)`` with the named parameters as inputs."""

    def f(q, v, *values):
        params = base_params.replace(**dict(zip(keys, values)))
        cm = ContactModel(robot, params=params)
        q1, v1, res = contact_step(robot, cm, q, v, torch.zeros_like(v), DT, scheme=scheme)
        return q1, v1, res.normal_force, res.friction_force

    return f


def _box_state(robot, lateral, vz=0.0, lift=0.0):
    k = 4e4
    z = 0.1 - G / (4 * k) + lift
    return state(robot, (0.0, 0.0, z), lin=(lateral, 0.3 * lateral, vz), ang=(0.0, 0.0, 0.002))


REGIMES = {
    # slip far below the stiction width: the friction acts as a stiff damper
    "sticking": dict(lateral=1e-3),
    # slip far above it: Coulomb sliding
    "sliding": dict(lateral=1.0),
    # slip at the stiction width (and near the one-step stopping speed)
    "stick_slip": dict(lateral=0.01),
    # corners just reaching the ground, approaching
    "touch_down": dict(lateral=0.5, vz=-0.3, lift=0.9 * G / (4 * 4e4) + 5e-5),
    # corners leaving the ground, still pressed (normal force positive)
    "lift_off": dict(lateral=0.5, vz=0.004, lift=0.9 * G / (4 * 4e4)),
}


@pytest.mark.parametrize("scheme", ["implicit", "explicit"])
@pytest.mark.parametrize("regime", list(REGIMES))
def test_gradcheck_one_step_in_each_regime(regime, scheme):
    robot = box_robot()
    params = ContactParameters(stiffness=4e4, damping=100.0, friction=0.6, stiction_width=0.01, normal_width=1e-4)
    q, v = _box_state(robot, **REGIMES[regime])
    f = _step_fn(robot, scheme, params, ("stiffness", "friction", "stiction_width", "damping"))
    cm = ContactModel(robot, params=params)
    res = cm.forces(robot, q, v)
    bottom = res.penetration > -0.05  # the four lower corners
    assert int(bottom.sum()) == 4
    res = type(res)(**{k: getattr(res, k)[bottom] for k in ("point", "normal", "penetration", "normal_velocity", "slip_velocity", "normal_force", "friction_force", "force", "jacobian", "_c_n", "_k_n", "_mu_fn_over_s", "_s", "_mu")}, f_ext=res.f_ext)
    slip = res.slip_velocity.norm(dim=-1)
    # the state is in the regime it claims
    if regime == "sticking":
        assert float(slip.max()) < 0.3 * 0.01 and float(res.normal_force.min()) > 0
    elif regime == "sliding":
        assert float(slip.min()) > 50 * 0.01
    elif regime == "stick_slip":
        assert 0.3 * 0.01 < float(slip.max()) < 3 * 0.01
    elif regime == "touch_down":
        assert float(res.penetration.max()) < 3e-4 and float(res.normal_velocity.max()) < 0
        assert float(res.normal_force.max()) > 0
    else:
        assert float(res.normal_velocity.min()) > 0 and float(res.normal_force.min()) > 0
    inputs = (
        q.clone().requires_grad_(),
        v.clone().requires_grad_(),
        torch.tensor(4e4, dtype=torch.float64, requires_grad=True),
        torch.tensor(0.6, dtype=torch.float64, requires_grad=True),
        torch.tensor(0.01, dtype=torch.float64, requires_grad=True),
        torch.tensor(100.0, dtype=torch.float64, requires_grad=True),
    )
    assert torch.autograd.gradcheck(f, inputs, eps=1e-7, atol=1e-6, rtol=1e-5)


def test_gradcheck_sphere_per_shape_parameters_on_heightfield():
    from backdrive.contact import Heightfield

    robot = sphere_robot()
    H = torch.tensor([[0.0, 0.01, 0.0], [0.02, 0.0, -0.01], [0.0, 0.01, 0.03]], dtype=torch.float64)

    def f(q, v, H, mu):
        cm = ContactModel(
            robot,
            terrain=Heightfield(H, spacing=0.5),
            params=ContactParameters(stiffness=1e4, damping=50.0, friction=mu, stiction_width=0.01),
        )
        q1, v1, _ = contact_step(robot, cm, q, v, torch.zeros_like(v), DT)
        return q1, v1

    q, v = state(robot, (0.11, -0.07, 0.1 + 0.003), lin=(0.4, 0.1, -0.2), ang=(1.0, -2.0, 0.5))
    inputs = (q.requires_grad_(), v.requires_grad_(), H.requires_grad_(), torch.tensor([0.5], dtype=torch.float64, requires_grad=True))
    assert torch.autograd.gradcheck(f, inputs, eps=1e-7, atol=1e-6, rtol=1e-5)


def _rollout_loss(robot, cm_of, q0, v0, steps, scheme="implicit"):
    def loss(vx, mu, k):
        cm = cm_of(mu, k)
        v = v0.clone()
        v = torch.cat([vx.reshape(1), v[1:]])
        q = q0
        for _ in range(steps):
            q, v, _ = contact_step(robot, cm, q, v, torch.zeros_like(v), DT, scheme=scheme)
        return q[:3].sum() + 0.1 * v[:3].sum()

    return loss


@pytest.mark.parametrize("scheme", ["implicit", "explicit"])
def test_rollout_gradient_matches_central_differences(scheme):
    """40 steps: a tilted box lands (touch-down), slides, its friction decelerates it."""
    robot = box_robot()
    q0, v0 = state(robot, (0.0, 0.0, 0.1135), quat=(math.cos(0.05), 0.0, math.sin(0.05), 0.0), lin=(0.8, 0.1, -0.3))

    def cm_of(mu, k):
        return ContactModel(robot, params=ContactParameters(stiffness=k, damping=300.0, friction=mu, stiction_width=0.01))

    loss = _rollout_loss(robot, cm_of, q0, v0, 40, scheme)
    x = [torch.tensor(v, dtype=torch.float64, requires_grad=True) for v in (0.8, 0.6, 2e4)]
    L = loss(*x)
    grads = torch.autograd.grad(L, x)
    # the box starts in the air, then touches down and slides
    cm = cm_of(torch.tensor(0.6, dtype=torch.float64), torch.tensor(2e4, dtype=torch.float64))
    with torch.no_grad():
        assert float(cm.forces(robot, q0, v0).penetration.max()) < 0
        q, v = q0, v0
        touching = 0
        for _ in range(40):
            q, v, res = contact_step(robot, cm, q, v, torch.zeros_like(v), DT, scheme=scheme)
            on = res.normal_force > 1.0
            touching += int(on.any())
        assert touching >= 10
        assert float(res.slip_velocity.norm(dim=-1)[on].min()) > 0.1
    for i, (xi, h) in enumerate(zip(x, (1e-5, 1e-5, 1e-1))):
        with torch.no_grad():
            xp = [t.detach().clone() for t in x]
            xm = [t.detach().clone() for t in x]
            xp[i] += h
            xm[i] -= h
            fd = (loss(*xp) - loss(*xm)) / (2 * h)
        assert float(grads[i]) == pytest.approx(float(fd), rel=1e-6, abs=1e-10), i


def test_stopping_distance_gradient_matches_closed_form_through_the_simulator():
    """d x_stop / d mu = -v0^2 / (2 mu^2 g) for Coulomb friction (small stiction width)."""
    from backdrive.sim import Simulator

    robot = box_robot()
    mu0 = 0.8
    mu = torch.tensor(mu0, dtype=torch.float64, requires_grad=True)
    k = 4e4
    cm = ContactModel(robot, params=ContactParameters(stiffness=k, damping=400.0, friction=mu, stiction_width=1e-3, normal_width=1e-6))
    sim = Simulator(robot, DT, contact=cm)
    v0 = 2.0  # stops after v0 / (mu g) = 0.255 s
    q0, vel0 = state(robot, (0.0, 0.0, 0.1 - G / (4 * k)), lin=(v0, 0.0, 0.0))
    traj = sim.rollout(sim.initial_state(q0, vel0), sim.zero_controls(300))
    (g,) = torch.autograd.grad(traj.q[-1, 0], mu)
    assert float(traj.contact.normal_force[-1].sum().detach()) == pytest.approx(G, rel=1e-3)
    assert float(g) == pytest.approx(-v0 * v0 / (2 * mu0 * mu0 * G), rel=0.01)
