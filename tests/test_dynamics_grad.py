"""Gradients of backdrive.dynamics: gradcheck in float64 against finite differences.

Inputs are states (q, v, a / tau, external wrenches) and physical parameters
replaced by grad-requiring tensors (masses, centres of mass, inertias,
damping, friction, armature, gravity). Small robots keep this fast.
"""

from __future__ import annotations

import pytest
import torch
from torch.autograd import gradcheck

import backdrive.dynamics as D
from backdrive import RobotModel
from backdrive.data import get_data_path

from _robots import SMALL_URDF, SMALL_URDF_NO_MIMIC


def _gc(fn, *inputs):
    """gradcheck in float64, in fast mode (random projections of the Jacobian).

    ``eps = 1e-5``: central differences then carry ~1e-10 truncation error and
    ~1e-11 / 1e-5 rounding, amplified by the mass matrix's condition number
    (~6e3 for the floating small tree) in forward dynamics: ~3e-6 absolute.
    """
    inputs = tuple(x.detach().clone().requires_grad_(True) for x in inputs)
    assert gradcheck(fn, inputs, eps=1e-5, atol=1e-5, rtol=1e-5, fast_mode=True)


@pytest.fixture(scope="module", params=["small_tree", "small_tree_floating", "cartpole", "no_mimic_floating"])
def robot(request) -> RobotModel:
    name = request.param
    if name.startswith("small_tree"):
        rb = RobotModel.from_urdf(SMALL_URDF, floating_base=name.endswith("floating"))
    elif name == "cartpole":
        rb = RobotModel.from_urdf(get_data_path("cartpole"))
    else:
        rb = RobotModel.from_urdf(SMALL_URDF_NO_MIMIC, floating_base=True)
    nj = rb.num_joints
    g = torch.Generator().manual_seed(1)
    # Nonzero joint parameters so that their terms are exercised.
    return rb.replace(
        damping=torch.rand(nj, generator=g, dtype=torch.float64),
        friction=torch.rand(nj, generator=g, dtype=torch.float64),
        armature=0.1 * torch.rand(nj, generator=g, dtype=torch.float64),
    )


def _state(rb: RobotModel, n: int = 2, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q = rb.random_q(n, generator=g)
    v = torch.randn(n, rb.nv, generator=g, dtype=torch.float64)
    a = torch.randn(n, rb.nv, generator=g, dtype=torch.float64)
    f = torch.randn(n, rb.num_bodies, 6, generator=g, dtype=torch.float64)
    return q, v, a, f


def _methods(rb: RobotModel):
    mimic = rb.num_bodies - 1 != rb.num_joints
    return ["auto", "crba"] if mimic else ["auto", "crba", "aba"]


def test_gradcheck_state(robot):
    rb = robot
    q, v, a, f = _state(rb)
    _gc(lambda q, v, a, f: D.inverse_dynamics(rb, q, v, a, f_ext=f), q, v, a, f)
    _gc(lambda q: D.mass_matrix(rb, q), q)
    _gc(lambda q, v: D.bias_forces(rb, q, v), q, v)
    _gc(lambda q: D.gravity_forces(rb, q), q)
    for method in _methods(rb):
        _gc(lambda q, v, t, f: D.forward_dynamics(rb, q, v, t, f_ext=f, method=method), q, v, a, f)
    _gc(lambda q, v: D.kinetic_energy(rb, q, v), q, v)
    _gc(lambda q: D.potential_energy(rb, q), q)
    _gc(lambda q: D.center_of_mass(rb, q), q)
    _gc(lambda v: D.joint_forces(rb, v), v)


def test_gradcheck_physical_parameters(robot):
    rb = robot
    q, v, a, _ = _state(rb, seed=1)
    names = ("body_mass", "body_com", "body_inertia", "damping", "friction", "armature", "gravity")
    base = [getattr(rb, k) for k in names]
    # Perturb each parameter relative to its size (plus 1% of the largest, for
    # zeros): small inertias make forward dynamics strongly nonlinear in them,
    # and an absolute step would be all truncation error.
    scale = [p.abs() + 0.01 * p.abs().max().clamp_min(1e-3) for p in base]

    def replaced(*xs):
        xs = list(xs)
        # Inertias are symmetric: perturb them along symmetric directions only
        # (Cholesky reads one triangle, so other directions are conventions).
        xs[2] = 0.5 * (xs[2] + xs[2].transpose(-1, -2))
        return rb.replace(**{k: p + s * x for k, p, s, x in zip(names, base, scale, xs)})

    zeros = tuple(torch.zeros_like(p) for p in base)
    for method in _methods(rb):
        _gc(lambda *xs: D.forward_dynamics(replaced(*xs), q, v, a, method=method), *zeros)
    _gc(lambda *xs: D.inverse_dynamics(replaced(*xs), q, v, a), *zeros)
    _gc(lambda *xs: D.mass_matrix(replaced(*xs), q), *zeros)
    _gc(
        lambda *xs: torch.stack([D.kinetic_energy(replaced(*xs), q, v), D.potential_energy(replaced(*xs), q)]),
        *zeros,
    )
    _gc(lambda *xs: D.center_of_mass(replaced(*xs), q), *zeros)


def test_parameter_gradients_reach_leaf_tensors(robot):
    rb = robot
    q, v, tau, _ = _state(rb, seed=2)
    mass = rb.body_mass.clone().requires_grad_(True)
    damping = rb.damping.clone().requires_grad_(True)
    model = rb.replace(body_mass=mass, damping=damping)
    D.forward_dynamics(model, q, v, tau).square().sum().backward()
    assert mass.grad is not None and torch.isfinite(mass.grad).all() and mass.grad.abs().sum() > 0
    assert damping.grad is not None and torch.isfinite(damping.grad).all() and damping.grad.abs().sum() > 0


@pytest.mark.parametrize("fb", [False, True])
def test_gradcheck_integrate_difference(fb):
    rb = RobotModel.from_urdf(SMALL_URDF, floating_base=fb)
    q0, v, _, _ = _state(rb, seed=3)
    q1 = rb.random_q(2, generator=torch.Generator().manual_seed(4))
    dt = torch.tensor([0.3, -0.2], dtype=torch.float64)
    _gc(lambda q, v, dt: D.integrate(rb, q, v, dt), q0, v, dt)
    _gc(lambda a, b: D.difference(rb, a, b), q0, q1)
    # At zero velocity and at q1 == q0 the small-angle branches are taken.
    _gc(lambda q, v: D.integrate(rb, q, v, 0.1), q0, torch.zeros_like(v))
    _gc(lambda b: D.difference(rb, q0, b), q0)


def test_no_nan_gradients_at_rest_and_at_pi():
    rb = RobotModel.from_urdf(SMALL_URDF, floating_base=True).replace(
        friction=torch.ones(4, dtype=torch.float64)
    )
    q = rb.neutral().clone().requires_grad_(True)
    v = torch.zeros(rb.nv, dtype=torch.float64, requires_grad=True)
    tau = torch.zeros(rb.nv, dtype=torch.float64, requires_grad=True)
    D.forward_dynamics(rb, q, v, tau).sum().backward()
    for x in (q, v, tau):
        assert torch.isfinite(x.grad).all()
    # difference across a rotation by pi (the far end of the log's range)
    q1 = rb.neutral().clone()
    q1[3:7] = torch.tensor([0.0, 0.0, 0.0, 1.0], dtype=torch.float64)
    q1.requires_grad_(True)
    d = D.difference(rb, rb.neutral(), q1)
    assert torch.allclose(d[3:6], torch.tensor([0.0, 0.0, torch.pi], dtype=torch.float64))
    d.sum().backward()
    assert torch.isfinite(q1.grad).all()
