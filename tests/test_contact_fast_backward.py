"""The gradient of the implicit contact step's fast path (``contact/_fast.py``,
``_ImplicitStepFast``): its backward by the implicit function theorem against
plain autograd through the reference path, float64 gradcheck (finite
differences), double backward, the fallbacks and the batch-size switch."""

from __future__ import annotations

import pytest
import torch

from backdrive.contact import ContactGeometry, ContactModel, ContactParameters, Heightfield
from backdrive.contact import _fast
from backdrive.data import load
from backdrive.kinematics import use_path
from backdrive.kinematics._paths import FAST_MIN_BATCH

from test_contact_fast import DT, _quadruped, _spy, _states

FIELDS = ("normal_force", "friction_force", "force", "f_ext", "point", "normal", "penetration",
          "normal_velocity", "slip_velocity", "jacobian")


def _loss_fn(cm, robot, weights=None, fields=FIELDS, gravity=None):
    """``(q, v, tau, damping) -> scalar``: the step's acceleration and result fields, randomly weighted."""

    def f(q, v, tau, damping):
        a, res = cm.acceleration(robot, q, v, tau, dt=DT, extra_damping=damping, gravity=gravity)
        outs = [a] + [getattr(res, k) for k in fields]
        g = torch.Generator().manual_seed(7)
        return sum((o * torch.randn(o.shape, generator=g, dtype=o.dtype)).sum() for o in outs)

    return f


def _grads(f, inputs, path):
    xs = [x.detach().clone().requires_grad_(True) for x in inputs]
    with use_path(path):
        return torch.autograd.grad(f(*xs), xs)


def _inputs(robot, feet, batch, seed=0):
    q, v, tau = _states(robot, feet, batch, seed=seed)
    damping = torch.cat([torch.zeros(6, dtype=robot.dtype), torch.full((robot.nv - 6,), 2.0, dtype=robot.dtype)])
    return q, v, tau, damping


def test_fast_backward_equals_reference_quadruped_every_field():
    robot, feet = _quadruped()
    cm = ContactModel(robot, ContactGeometry.from_model(robot, links=feet))
    q, v, tau, damping = _inputs(robot, feet, (12,))
    with torch.no_grad():
        _, res = cm.acceleration(robot, q, v, tau, dt=DT)
    assert 0 < int((res.penetration > 0).sum()) < res.penetration.numel()  # contact and none
    f = _loss_fn(cm, robot)
    ref, fast = _grads(f, (q, v, tau, damping), "reference"), _grads(f, (q, v, tau, damping), "fast")
    for name, x, y in zip(("q", "v", "tau", "damping"), ref, fast):
        assert float(x.abs().max()) > 0, name
        assert float((x - y).abs().max()) <= 1e-9 * float(x.abs().max()), name
    # The acceleration alone (no result field carries a gradient).
    f = _loss_fn(cm, robot, fields=())
    for x, y in zip(_grads(f, (q, v, tau, damping), "reference"), _grads(f, (q, v, tau, damping), "fast")):
        assert float((x - y).abs().max()) <= 1e-9 * float(x.abs().max())


@pytest.mark.parametrize("wrt", ["q", "v", "q_fields", "q_geometry"])
def test_fast_backward_partial_inputs_in_place_tree_sums(wrt, monkeypatch):
    """Gradients with respect to ``q`` alone (through the acceleration, with
    result fields too, or with fields that do not depend on the acceleration)
    or ``v`` alone: the backward's branches that skip
    the effective masses' ``M(q)`` term or the poses' reverse pass; with the
    tree sums in place, as the fast path runs them above a few hundred samples."""
    from backdrive.kinematics import _paths

    monkeypatch.setattr(_paths, "LEVEL_SUM_MIN_BATCH", 0)
    robot, feet = _quadruped()
    cm = ContactModel(robot, ContactGeometry.from_model(robot, links=feet))
    q, v, tau, damping = _inputs(robot, feet, (7,), seed=8)
    fields = {"q_fields": ("force", "f_ext", "point"), "q_geometry": ("point", "normal", "penetration")}
    f = _loss_fn(cm, robot, fields=fields.get(wrt, ()))
    i = 1 if wrt == "v" else 0
    out = []
    for path in ("reference", "fast"):
        xs = [q, v, tau, damping]
        xs[i] = xs[i].clone().requires_grad_(True)
        with use_path(path):
            out.append(torch.autograd.grad(f(*xs), xs[i])[0])
    assert float(out[0].abs().max()) > 0
    assert float((out[0] - out[1]).abs().max()) <= 1e-9 * float(out[0].abs().max())


def test_fast_backward_equals_reference_heightfield_broadcast_batch_gravity():
    """Several shapes (unequal supports, padded), a heightfield, two batch
    axes, ``tau`` broadcast over the batch and a batch of gravities."""
    import warnings

    robot, feet = _quadruped()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        geom = ContactGeometry.from_model(robot)
    g = torch.Generator().manual_seed(3)
    H = 0.01 * torch.randn(21, 21, generator=g, dtype=robot.dtype)
    cm = ContactModel(robot, geom, Heightfield(H, spacing=0.05, origin=(-0.5, -0.5)),
                      ContactParameters(friction=0.8, clamp_normal=False))
    q, v, _, damping = _inputs(robot, feet, (2, 3), seed=1)
    tau = 3.0 * torch.randn(robot.nv, generator=g, dtype=robot.dtype)
    gravity = torch.tensor([0.0, 0.0, -9.81], dtype=robot.dtype) + 0.3 * torch.randn(2, 3, 3, generator=g, dtype=robot.dtype)
    f = _loss_fn(cm, robot, fields=("force", "f_ext", "slip_velocity"), gravity=gravity)
    ref, fast = _grads(f, (q, v, tau, damping), "reference"), _grads(f, (q, v, tau, damping), "fast")
    for x, y in zip(ref, fast):
        assert y.shape == x.shape
        assert float((x - y).abs().max()) <= 1e-9 * float(x.abs().max())


def test_fast_backward_equals_reference_fixed_base_arm():
    from backdrive.contact import GroundPlane
    from backdrive.kinematics import forward_kinematics

    robot = load("panda")
    links = [n for n in robot.link_names if n.startswith("panda_link")][3:]
    q, v, tau = _states(robot, [], (6,), seed=2)
    z = float(forward_kinematics(robot, q[0])[robot.frame_index(links[-1]), 2, 3])
    cm = ContactModel(robot, ContactGeometry.spheres(robot, {n: 0.05 for n in links}), GroundPlane(height=z))
    damping = torch.full((robot.nv,), 0.5, dtype=robot.dtype)
    f = _loss_fn(cm, robot, fields=("force", "jacobian"))
    ref, fast = _grads(f, (q, v, tau, damping), "reference"), _grads(f, (q, v, tau, damping), "fast")
    for x, y in zip(ref, fast):
        assert float((x - y).abs().max()) <= 1e-9 * float(x.abs().max())


def test_fast_backward_gradcheck():
    """Finite differences (float64) of the fast path's acceleration and forces,
    sliding and sticking feet."""
    robot, feet = _quadruped()
    cm = ContactModel(robot, ContactGeometry.from_model(robot, links=feet))
    q, v, tau, damping = _inputs(robot, feet, (2,), seed=5)
    v = v * torch.tensor([[1.0], [1e-3]], dtype=robot.dtype)  # one state sliding, one near sticking

    def f(q, v, tau, damping):
        with use_path("fast"):
            a, res = cm.acceleration(robot, q, v, tau, dt=DT, extra_damping=damping)
        return a, res.force

    inputs = tuple(x.clone().requires_grad_(True) for x in (q, v, tau, damping))
    # Entries reach 7e3 (the stiff ground); central differences are good to
    # about 5e-6 there, on the reference path as on this one. fast_mode:
    # random projections of the Jacobians (a full one costs ~10 s).
    assert torch.autograd.gradcheck(f, inputs, eps=1e-7, atol=3e-5, rtol=1e-5, fast_mode=True)


def test_fast_backward_double_backward_and_parameter_fallback():
    robot, feet = _quadruped()
    cm = ContactModel(robot, ContactGeometry.from_model(robot, links=feet))
    q, v, tau, _ = _inputs(robot, feet, (3,), seed=6)
    w = torch.randn(3, robot.nv, generator=torch.Generator().manual_seed(1), dtype=robot.dtype)
    out = {}
    for path in ("reference", "fast"):
        qq, tt = q.clone().requires_grad_(True), tau.clone().requires_grad_(True)
        with use_path(path):
            a, _ = cm.acceleration(robot, qq, v, tt, dt=DT)
            (gq,) = torch.autograd.grad((a * w).sum(), qq, create_graph=True)
            (gqt,) = torch.autograd.grad(gq.square().sum(), tt)
        out[path] = (gq.detach(), gqt)
    for x, y in zip(out["reference"], out["fast"]):
        assert float(x.abs().max()) > 0
        assert float((x - y).abs().max()) <= 1e-9 * float(x.abs().max())
    # A contact parameter that requires grad: the reference path, with its gradient.
    k = torch.tensor(3e4, dtype=robot.dtype, requires_grad=True)
    cmk = ContactModel(robot, cm.geometry, params=ContactParameters(stiffness=k))
    assert _fast.reference_only(cmk, robot, None) and not _fast.reference_only(cm, robot, None)
    with use_path("fast"):
        a, _ = cmk.acceleration(robot, q, v, tau, dt=DT)
    (gk,) = torch.autograd.grad((a * w).sum(), k)
    assert float(gk.abs()) > 0


def test_gradient_switches_path_at_its_batch_size(monkeypatch):
    robot, feet = _quadruped()
    cm = ContactModel(robot, ContactGeometry.from_model(robot, links=feet))
    n = FAST_MIN_BATCH["contact_step_grad"]
    q, v, tau = _states(robot, feet, (n,))
    called = _spy(monkeypatch, "implicit_acceleration_recorded")
    tau_g = tau.clone().requires_grad_(True)
    a, _ = cm.acceleration(robot, q, v, tau_g, dt=DT)  # auto at the threshold: fast
    assert called == [1] and a.requires_grad
    a, _ = cm.acceleration(robot, q[:8], v[:8], tau_g[:8], dt=DT)  # below: reference
    assert called == [1] and a.requires_grad


@pytest.mark.parametrize("name, kw", [("quadruped", {"floating_base": True}), ("quadruped", {"floating_base": False}),
                                      ("cartpole", {}), ("panda", {})])
def test_mass_quadratic_vjp_equals_dense_mass_matrix_autograd(name, kw, monkeypatch):
    """``mass_quadratic_vjp_fast`` (``sum_c w_c d(y_c^T M(q) y_c)/dq``,
    written out; the contact backward's effective-mass term) against
    autograd through the dense mass matrix: a floating base, a fixed base in
    a permuted internal order, a prismatic joint, mimic joints; armature; in
    column chunks; the tree sums in place (as above a few hundred samples).
    ``kinetic_energy_fast``, which shares its twists, against ``0.5 y^T M y``."""
    from backdrive.dynamics import _fast as dfast
    from backdrive.dynamics._fast import (_from_internal, _to_internal, dense_mass_matrix_fast, fast_topology,
                                          kinematics_fast, kinetic_energy_fast, mass_quadratic_vjp_fast)
    from backdrive.kinematics import _paths

    robot = load(name, **kw)
    g = torch.Generator().manual_seed(4)
    robot = robot.replace(armature=torch.rand(robot.num_joints, generator=g, dtype=robot.dtype))
    topo = fast_topology(robot)
    N, C, fb = 5, 3, robot.floating_base
    q = robot.neutral().expand(N, -1).clone()
    if fb:
        q[:, :3] = torch.randn(N, 3, generator=g, dtype=robot.dtype)
        quat = torch.randn(N, 4, generator=g, dtype=robot.dtype)
        q[:, 3:7] = quat / quat.norm(dim=-1, keepdim=True)
    q[:, -robot.num_joints:] += 0.5 * torch.randn(N, robot.num_joints, generator=g, dtype=robot.dtype)
    y = torch.randn(C, N, robot.nv, generator=g, dtype=robot.dtype)
    w = torch.randn(C, N, generator=g, dtype=robot.dtype)
    qq = q.clone().requires_grad_(True)
    K = kinematics_fast(robot, topo, qq)
    ref = torch.einsum("cni,nij,cnj->cn", y, dense_mass_matrix_fast(robot, topo, K), y)
    (gref,) = torch.autograd.grad((ref * w).sum(), qq)
    yi = torch.stack([_to_internal(topo, y[c]) for c in range(C)], 1)
    scale = float(gref.abs().max())
    ref = ref.detach()
    # Inertias about the origin or formed here; one column at a time; tree sums in place.
    for origin, chunk, level_min in ((True, 4096, 512), (False, N, 512), (False, 4096, 0)):
        monkeypatch.setattr(dfast, "MASS_QUADRATIC_CHUNK", chunk)
        monkeypatch.setattr(_paths, "LEVEL_SUM_MIN_BATCH", level_min)
        gj = mass_quadratic_vjp_fast(robot, topo, kinematics_fast(robot, topo, q, origin=origin), yi, w)  # (nj, N)
        gc = _from_internal(topo, torch.cat([gj.new_zeros(robot.nv - gj.shape[0], N), gj], 0))[:, -robot.num_joints:]
        assert scale > 0 and float((gc - gref[:, -robot.num_joints:]).abs().max()) <= 1e-12 * scale
        with torch.no_grad():
            ke = kinetic_energy_fast(robot, q, y[0])
        assert float((2.0 * ke - ref[0]).abs().max()) <= 1e-12 * float(ref[0].abs().max())
    if fb:  # the base pose does not enter y^T M y
        assert float(gref[:, :7].abs().max()) <= 1e-12 * scale


def _max_rel(ref, fast):
    return max(float((x - y).abs().max()) / float(x.abs().max()) for x, y in zip(ref, fast))


@pytest.mark.parametrize("field", FIELDS)
def test_fast_backward_each_field_alone(field):
    """Each result field alone (with the acceleration) through the written-out
    contact VJP (``_field_grads``): its own reverse, with ``q`` and ``v``;
    the fields that do not depend on ``a`` (``normal`` alone has no graph at
    all on a ground plane) included. Float64: to 1e-12 of the largest entry."""
    robot, feet = _quadruped()
    cm = ContactModel(robot, ContactGeometry.from_model(robot, links=feet))
    q, v, tau, damping = _inputs(robot, feet, (6,), seed=9)
    f = _loss_fn(cm, robot, fields=(field,))
    ref, fast = _grads(f, (q, v, tau, damping), "reference"), _grads(f, (q, v, tau, damping), "fast")
    assert all(float(x.abs().max()) > 0 for x in ref)
    assert _max_rel(ref, fast) <= 1e-12


@pytest.mark.parametrize("case", ["no_contact", "at_rest", "sticking", "tau_fields", "damping_only"])
def test_fast_backward_contact_states_and_inputs(case):
    """Every point out of contact (the law, the blend and the effective masses'
    weights all zero); all velocities exactly zero (no slip: the friction
    blend's ``gamma`` is 0/tiny, whose reverse must stay finite); near
    sticking (slip far below the stiction width); gradients with respect to
    ``tau`` alone with result fields (only the solve with ``A``: the fields'
    part through ``a``); ``extra_damping`` alone."""
    robot, feet = _quadruped()
    cm = ContactModel(robot, ContactGeometry.from_model(robot, links=feet))
    q, v, tau, damping = _inputs(robot, feet, (5,), seed=11)
    if case == "no_contact":
        q = q.clone()
        q[:, 2] += 0.05
        with torch.no_grad():
            _, res = cm.acceleration(robot, q, v, tau, dt=DT)
        assert float(res.normal_force.abs().max()) < 1e-100  # the smooth onset far outside: no force
    elif case == "at_rest":
        v = torch.zeros_like(v)
    elif case == "sticking":
        v = 1e-4 * v
    f = _loss_fn(cm, robot)
    which = {"tau_fields": (2,), "damping_only": (3,)}.get(case, (0, 1, 2, 3))
    out = []
    for path in ("reference", "fast"):
        xs = [q, v, tau, damping]
        for i in which:
            xs[i] = xs[i].clone().requires_grad_(True)
        with use_path(path):
            out.append(torch.autograd.grad(f(*xs), [xs[i] for i in which]))
    ref, fast = out
    assert all(bool(torch.isfinite(x).all()) for x in fast)
    assert all(float(x.abs().max()) > 0 for x in ref)
    assert _max_rel(ref, fast) <= (1e-12 if case in ("no_contact", "tau_fields", "damping_only") else 1e-10)


@pytest.mark.parametrize("name, kw", [("quadruped", {"floating_base": False}), ("cartpole", {})])
def test_fast_backward_permuted_order_prismatic_tilted_plane(name, kw):
    """A fixed base whose internal coordinate order is permuted (the
    ``jacobian`` field's reverse, the joints' gradients), a prismatic joint
    (its motion subspace has no angular part), on a tilted ground plane
    (the closed-form reverse of its distance), every field."""
    from backdrive.contact import GroundPlane
    from backdrive.dynamics._fast import fast_topology
    from backdrive.kinematics import forward_kinematics

    robot = load(name, **kw)
    topo = fast_topology(robot)
    assert topo.dof_inv is not None if name == "quadruped" else topo.has_pri
    g = torch.Generator().manual_seed(1)
    q = robot.neutral().expand(6, -1) + 0.3 * torch.randn(6, robot.nq, generator=g, dtype=robot.dtype)
    v, tau = (torch.randn(6, robot.nv, generator=g, dtype=robot.dtype) for _ in range(2))
    damping = torch.full((robot.nv,), 0.5, dtype=robot.dtype)
    links = robot.link_names[-3:]
    z = float(forward_kinematics(robot, q[0])[robot.frame_index(links[-1]), 2, 3])
    cm = ContactModel(robot, ContactGeometry.spheres(robot, {n: 0.05 for n in links}),
                      GroundPlane(height=z, normal=(0.1, 0.0, 1.0)))
    f = _loss_fn(cm, robot)
    ref, fast = _grads(f, (q, v, tau, damping), "reference"), _grads(f, (q, v, tau, damping), "fast")
    assert all(float(x.abs().max()) > 0 for x in ref)
    assert _max_rel(ref, fast) <= 1e-12
