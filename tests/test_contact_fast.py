"""The implicit contact step's fast path (``contact/_fast.py``) against the reference path.

Both paths compute the same step; the fast one reuses one kinematics pass
and factorises the step's matrix with the tree-sparse LTDL. Every field of
the result must agree to float64 rounding, in every kind of model the fast
path accepts; the others must fall back to the reference path.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from backdrive.contact import ContactGeometry, ContactModel, ContactParameters, GroundPlane, Heightfield, SelfCollision
from backdrive.contact import _fast
from backdrive.data import load
from backdrive.kinematics import forward_kinematics, use_path

DT = 4e-3


def _states(robot, feet, batch, seed=0, drop=0.0):
    """Random states around standing with the feet near the ground (some in, some out)."""
    g = torch.Generator().manual_seed(seed)
    q = robot.neutral().expand(*batch, -1).clone()
    if robot.floating_base:
        q[..., 7:] = torch.tensor([0.0, 0.7, -1.4] * 4, dtype=robot.dtype)
        q[..., 7:] += 0.2 * torch.randn(*batch, robot.num_joints, generator=g, dtype=robot.dtype)
        quat = torch.tensor([1.0, 0, 0, 0], dtype=robot.dtype) + 0.05 * torch.randn(*batch, 4, generator=g, dtype=robot.dtype)
        q[..., 3:7] = quat / quat.norm(dim=-1, keepdim=True)
        T = forward_kinematics(robot, q)
        low = torch.stack([T[..., robot.frame_index(f), 2, 3] for f in feet], -1).min(-1).values
        q[..., 2] = -low + 0.02 - 0.002 + drop + 0.004 * torch.rand(*batch, generator=g, dtype=robot.dtype)
    else:
        q = q + 0.5 * torch.randn(*batch, robot.nq, generator=g, dtype=robot.dtype)
    v = 0.3 * torch.randn(*batch, robot.nv, generator=g, dtype=robot.dtype)
    tau = 5.0 * torch.randn(*batch, robot.nv, generator=g, dtype=robot.dtype)
    if robot.floating_base:
        tau[..., :6] = 0.0
    return q, v, tau


def _compare(cm, robot, q, v, tau, *, tol=1e-9, **kw):
    with torch.no_grad():
        with use_path("reference"):
            a0, r0 = cm.acceleration(robot, q, v, tau, dt=DT, **kw)
        with use_path("fast"):
            a1, r1 = cm.acceleration(robot, q, v, tau, dt=DT, **kw)
    scale = float(a0.abs().max())
    assert a1.shape == a0.shape
    assert float((a1 - a0).abs().max()) <= tol * scale
    for f in dataclasses.fields(r0):
        if f.name == "_bodies":
            continue
        x, y = getattr(r0, f.name), getattr(r1, f.name)
        assert y.shape == x.shape, f.name
        assert float((y - x).abs().max()) <= tol * (float(x.abs().max()) + 1.0), f.name
    return r0


def _spy(monkeypatch, name: str) -> list:
    """Replace ``_fast.<name>`` for the test by a wrapper that records each call; the list of calls."""
    called = []
    orig = getattr(_fast, name)

    def spy(*a, **k):
        called.append(1)
        return orig(*a, **k)

    monkeypatch.setattr(_fast, name, spy)
    return called


def _quadruped():
    robot = load("quadruped", floating_base=True)
    feet = [n for n in robot.link_names if n.endswith("_foot")]
    return robot, feet


def test_fast_step_equals_reference_quadruped_feet():
    robot, feet = _quadruped()
    cm = ContactModel(robot, ContactGeometry.from_model(robot, links=feet))
    q, v, tau = _states(robot, feet, (40,))
    damping = torch.cat([torch.zeros(6, dtype=robot.dtype), torch.full((12,), 2.0, dtype=robot.dtype)])
    res = _compare(cm, robot, q, v, tau, extra_damping=damping)
    # The states cover contact and no contact, sticking and sliding.
    assert 0 < int((res.penetration > 0).sum()) < res.penetration.numel()
    assert float(res.slip_velocity.norm(dim=-1).max()) > 0.1


def test_fast_step_equals_reference_every_shape_heightfield_batched_parameters():
    """Trunk and thigh boxes, hip and calf cylinders (points on the base:
    columns of unequal support, padded), a heightfield, per-shape parameters
    with two batch axes, the unclamped law and a batch of gravities."""
    import warnings

    robot, feet = _quadruped()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        geom = ContactGeometry.from_model(robot)
    ns = len(geom.shapes)
    g = torch.Generator().manual_seed(3)
    batch = (3, 7)
    params = ContactParameters(
        stiffness=2e4 + 4e4 * torch.rand(*batch, ns, generator=g, dtype=robot.dtype),
        friction=0.3 + torch.rand(ns, generator=g, dtype=robot.dtype),
        stiction_width=torch.tensor([0.02], dtype=robot.dtype),
        clamp_normal=False,
    )
    H = 0.01 * torch.randn(21, 21, generator=g, dtype=robot.dtype)
    cm = ContactModel(robot, geom, Heightfield(H, spacing=0.05, origin=(-0.5, -0.5)), params)
    q, v, tau = _states(robot, feet, batch, seed=1, drop=0.005)
    gravity = torch.tensor([0.0, 0.0, -9.81], dtype=robot.dtype) + 0.3 * torch.randn(*batch, 3, generator=g, dtype=robot.dtype)
    _compare(cm, robot, q, v, tau, gravity=gravity)


def test_fast_step_equals_reference_fixed_base_arm():
    robot = load("panda")
    links = [n for n in robot.link_names if n.startswith("panda_link")][3:]
    geom = ContactGeometry.spheres(robot, {n: 0.05 for n in links})
    q, v, tau = _states(robot, [], (50,), seed=2)
    T = forward_kinematics(robot, q[0])
    z = float(T[robot.frame_index(links[-1]), 2, 3])
    cm = ContactModel(robot, geom, GroundPlane(height=z))  # some spheres below, some above
    res = _compare(cm, robot, q, v, tau)
    assert int((res.penetration > 0).sum()) > 0


def test_paths_switch_and_fallbacks(monkeypatch):
    robot, feet = _quadruped()
    cm = ContactModel(robot, ContactGeometry.from_model(robot, links=feet))
    assert _fast.fast_eligible(cm, robot)
    sc = SelfCollision.build(robot, ContactGeometry.from_model(robot, links=feet))
    assert not _fast.fast_eligible(ContactModel(robot, cm.geometry, self_collision=sc), robot)
    from backdrive.kinematics._paths import FAST_MIN_BATCH

    q, v, tau = _states(robot, feet, (FAST_MIN_BATCH["contact_step"],))
    called = _spy(monkeypatch, "implicit_acceleration_fast")
    with torch.no_grad():
        cm.acceleration(robot, q, v, tau, dt=DT)  # auto at the threshold: fast
    assert called == [1]
    tau_g = tau.clone().requires_grad_(True)
    a, _ = cm.acceleration(robot, q, v, tau_g, dt=DT)  # a gradient: reference
    assert called == [1] and a.requires_grad
    with torch.no_grad():
        cm.acceleration(robot, q[:2], v[:2], tau[:2], dt=DT)  # small batch: reference
    assert called == [1]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_fast_rollout_tracks_reference_rollout(dtype):
    """100 steps of 4 ms under PD: the two paths' trajectories stay together
    (float32: to its rounding, amplified by the stiff contact)."""
    robot, feet = _quadruped()
    robot = robot.to(dtype=dtype)
    cm = ContactModel(robot, ContactGeometry.from_model(robot, links=feet))
    q0, v0, _ = _states(robot.to(dtype=torch.float64), feet, (48,), seed=4)
    q0, v0 = q0.to(dtype), 0.1 * v0.to(dtype)
    qj = torch.tensor([0.0, 0.7, -1.4] * 4, dtype=dtype)
    damping = torch.cat([torch.zeros(6, dtype=dtype), torch.full((12,), 6.0, dtype=dtype)])
    from backdrive.contact import integrate_world

    out = {}
    for path in ("reference", "fast"):
        q, v = q0, v0
        with torch.no_grad(), use_path(path):
            for _ in range(100):
                tau = torch.cat([torch.zeros(48, 6, dtype=dtype), 200.0 * (qj - q[:, 7:]) - 6.0 * v[:, 6:]], -1)
                a, _ = cm.acceleration(robot, q, v, tau, dt=DT, extra_damping=damping)
                q, v = integrate_world(robot, q, v, a, DT)
        out[path] = q
    err = float((out["fast"] - out["reference"]).abs().max())
    assert err < (1e-9 if dtype == torch.float64 else 1e-3)


def test_spd_solve_backward_gradcheck_and_double_backward():
    """The implicit step's solve with its written-out backward (``_model.spd_solve``)."""
    from backdrive.contact._model import spd_solve

    g = torch.Generator().manual_seed(5)
    B = torch.randn(3, 6, 6, generator=g, dtype=torch.float64)
    A = (B @ B.mT + 6 * torch.eye(6, dtype=torch.float64)).requires_grad_(True)
    b = torch.randn(3, 6, generator=g, dtype=torch.float64, requires_grad=True)

    def f(A, b):
        return spd_solve(0.5 * (A + A.mT), b)

    assert torch.autograd.gradcheck(f, (A, b))
    assert torch.autograd.gradgradcheck(f, (A, b))
    # A shared matrix against a batch of right-hand sides (the gradient is summed back).
    assert torch.autograd.gradcheck(f, (A[0].detach().clone().requires_grad_(True), b))
    x = f(A, b)
    torch.testing.assert_close(x, torch.linalg.solve(0.5 * (A + A.mT), b[..., None])[..., 0])


def test_fast_result_builds_its_jacobian_on_first_read():
    """Without gradient the fast step defers the dense Jacobian: nothing is
    built until the field is read; then it equals the recorded step's (and the
    reference's through _compare), survives pickling and dataclasses.replace,
    and J^T f gives the generalised force."""
    import pickle

    robot, feet = _quadruped()
    cm = ContactModel(robot, ContactGeometry.from_model(robot, links=feet))
    q, v, tau = _states(robot, feet, (2, 100), seed=4)
    with torch.no_grad(), use_path("fast"):
        _, res = cm.acceleration(robot, q, v, tau, dt=DT)
    assert callable(res.__dict__["_deferred_jacobian"])  # not built yet
    tau_r = tau.clone().requires_grad_(True)
    with use_path("fast"):
        _, rec = cm.acceleration(robot, q, v, tau_r, dt=DT)
    assert isinstance(rec.__dict__["_deferred_jacobian"], torch.Tensor)  # the recorded step's is an output
    J = res.jacobian
    assert J.shape == (2, 100, len(feet), 3, robot.nv)
    assert torch.equal(J, rec.jacobian.detach())
    assert res.jacobian is J  # built once
    back = pickle.loads(pickle.dumps(res))
    assert torch.equal(back.jacobian, J)
    with torch.no_grad(), use_path("fast"):
        _, res2 = cm.acceleration(robot, q, v, tau, dt=DT)
    moved = dataclasses.replace(res2, force=2 * res2.force)
    assert torch.equal(moved.jacobian, J)
    gf = torch.einsum("...pin,...pi->...n", J, res.force)
    assert torch.allclose(res.generalized_force(), gf)
    assert float(gf.abs().max()) > 1.0


def test_fast_result_builds_its_wrenches_on_first_read():
    """Without gradient the fast step defers the body wrenches ``f_ext`` as
    it does the Jacobian: nothing is built until the field is read; a result
    kept while later steps run (other states, another batch) still gives its
    own step's wrenches, equal bit for bit to the recorded step's output
    (which builds them at once) and to the reference path's to rounding;
    pickling and ``dataclasses.replace`` see the tensor."""
    import pickle

    robot, feet = _quadruped()
    cm = ContactModel(robot, ContactGeometry.from_model(robot, links=feet))
    q, v, tau = _states(robot, feet, (3, 70), seed=7)
    with torch.no_grad(), use_path("fast"):
        _, res = cm.acceleration(robot, q, v, tau, dt=DT)
        assert callable(res.__dict__["_deferred_f_ext"])  # not built yet
        q2, v2, tau2 = _states(robot, feet, (150,), seed=8)
        _, later = cm.acceleration(robot, q2, v2, tau2, dt=DT)  # another step before the first result is read
    tau_r = tau.clone().requires_grad_(True)
    with use_path("fast"):
        _, rec = cm.acceleration(robot, q, v, tau_r, dt=DT)
    assert isinstance(rec.__dict__["_deferred_f_ext"], torch.Tensor)  # the recorded step's is an output
    W = res.f_ext
    assert W.shape == (3, 70, robot.num_bodies, 6)
    assert torch.equal(W, rec.f_ext.detach())
    assert res.f_ext is W  # built once
    with torch.no_grad(), use_path("reference"):
        _, ref = cm.acceleration(robot, q, v, tau, dt=DT)  # per body from the points (_model._body_wrenches)
    assert float((W - ref.f_ext).abs().max()) <= 1e-9 * float(ref.f_ext.abs().max())
    assert float(W.abs().max()) > 1.0
    assert later.f_ext.shape == (150, robot.num_bodies, 6)
    back = pickle.loads(pickle.dumps(res))
    assert torch.equal(back.f_ext, W)
    with torch.no_grad(), use_path("fast"):
        _, res2 = cm.acceleration(robot, q, v, tau, dt=DT)
    moved = dataclasses.replace(res2, force=2 * res2.force)
    assert torch.equal(moved.f_ext, W)
