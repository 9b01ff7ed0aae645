"""The contact step's gradient at small batches (11th session): the path each
batch size takes, and the reference path's written-out pieces held against
plain autograd through the same formulas (float64).

- ``FAST_MIN_BATCH["contact_step_grad"]``: below it (batch 1 included) a
  recording step runs the reference path, whose gradient is autograd's
  through ``_model.py``; from it, the fast step's own backward;
- ``_model._InverseMasses`` (the friction blend's effective masses
  ``diag(J M^-1 J^T)`` with the backward ``g_J = 2 g z^T``, ``g_M = -Z
  diag(g) Z^T``) against autograd through ``cholesky_ex`` and
  ``solve_triangular``, gradcheck and double backward;
- ``row_matrices(..., combined=True)`` against ``C + dt K``, and the step's
  predicted force ``dt k_n v_n n + CK dt b`` against the matrix form
  ``C dt b + K dt (J v + dt b)`` it replaced.
"""

from __future__ import annotations

import torch

from backdrive.contact import ContactGeometry, ContactModel
from backdrive.contact import _fast
from backdrive.contact._model import _inverse_masses_plain, _InverseMasses, row_matrices
from backdrive.kinematics import use_path
from backdrive.kinematics._paths import FAST_MIN_BATCH

from test_contact_fast import DT, _quadruped, _spy, _states


def _model():
    robot, feet = _quadruped()
    return robot, feet, ContactModel(robot, ContactGeometry.from_model(robot, links=feet))


def _step_grads(cm, robot, q, v, tau, damping):
    xs = [x.detach().clone().requires_grad_(True) for x in (q, v, tau)]
    a, res = cm.acceleration(robot, *xs, dt=DT, extra_damping=damping)
    g = torch.Generator().manual_seed(5)
    loss = sum((o * torch.randn(o.shape, generator=g, dtype=o.dtype)).sum() for o in (a, res.force, res.f_ext))
    return torch.autograd.grad(loss, xs)


def test_batch_one_takes_the_reference_path_with_its_gradient(monkeypatch):
    """Batch 1 and one sample below the threshold record the reference step
    (at batch 1 the same gradient as forcing it); the threshold itself
    switches to the fast step (``test_contact_fast_backward.py`` holds that
    gradient to the reference path's)."""
    robot, feet, cm = _model()
    damping = torch.cat([torch.zeros(6, dtype=robot.dtype), torch.full((12,), 2.0, dtype=robot.dtype)])
    n = FAST_MIN_BATCH["contact_step_grad"]
    assert 1 < n <= 192  # measured: the fast step's backward costs no more from 128-192 samples (docs/contact.md)
    q, v, tau = _states(robot, feet, (n,), seed=4)
    called = _spy(monkeypatch, "implicit_acceleration_recorded")
    auto = _step_grads(cm, robot, q[:1], v[:1], tau[:1], damping)
    assert called == []
    with use_path("reference"):
        ref = _step_grads(cm, robot, q[:1], v[:1], tau[:1], damping)
    for x, y in zip(auto, ref):
        assert float(x.abs().max()) > 0 and torch.equal(x, y)
    tau_g = tau.clone().requires_grad_(True)
    a, _ = cm.acceleration(robot, q[1:], v[1:], tau_g[1:], dt=DT)
    assert called == [] and a.requires_grad
    a, _ = cm.acceleration(robot, q, v, tau_g, dt=DT)
    assert called == [1] and a.requires_grad
    assert not _fast.reference_only(cm, robot, None)


def _mass_and_rows(batch=(2,), rows=4, nv=7, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(*batch, nv, nv, generator=g, dtype=torch.float64)
    M = X @ X.transpose(-1, -2) + nv * torch.eye(nv, dtype=torch.float64)
    Jf = torch.randn(*batch, 3 * rows, nv, generator=g, dtype=torch.float64)
    return M, Jf


def test_inverse_masses_backward_against_autograd_gradcheck_double_backward():
    M, Jf = _mass_and_rows()
    Mg, Jg = M.clone().requires_grad_(True), Jf.clone().requires_grad_(True)
    out, ref = _InverseMasses.apply(Mg, Jg), _inverse_masses_plain(Mg, Jg)
    assert out.shape == (2, 4)
    torch.testing.assert_close(out, ref, rtol=1e-13, atol=0)
    w = torch.randn(out.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    for x, y in zip(torch.autograd.grad(out, (Mg, Jg), w), torch.autograd.grad(ref, (Mg, Jg), w)):
        torch.testing.assert_close(x, y, rtol=1e-12, atol=1e-14)
    # Finite differences along symmetric perturbations of M (what it is given).
    sym = lambda A: 0.5 * (A + A.transpose(-1, -2))  # noqa: E731
    M1, J1 = _mass_and_rows(batch=(), rows=1, nv=3, seed=2)
    f = lambda A, J: _InverseMasses.apply(sym(A), J)  # noqa: E731
    args = (M1.requires_grad_(True), J1.requires_grad_(True))
    assert torch.autograd.gradcheck(f, args)
    assert torch.autograd.gradgradcheck(f, args)
    # torch.func takes the plain operations.
    from backdrive.contact._model import _inverse_masses

    jac = torch.func.jacrev(lambda J: _inverse_masses(M1.detach(), J, ()))(J1.detach())
    jac_ref = torch.autograd.functional.jacobian(lambda J: _inverse_masses_plain(M1.detach(), J), J1.detach())
    torch.testing.assert_close(jac, jac_ref, rtol=1e-12, atol=1e-14)


def test_combined_row_matrix_and_predicted_force_match_the_matrix_forms():
    robot, feet, cm = _model()
    q, v, tau = _states(robot, feet, (6,), seed=3)
    with torch.no_grad():
        terms = cm.implicit_terms(robot, q, v, DT)
    res = terms.result
    assert 0 < int((res.penetration > 0).sum()) < res.penetration.numel()
    assert float(res.slip_velocity.norm(dim=-1).max()) > 0.1
    Jf = res.jacobian.reshape(*res.jacobian.shape[:-3], -1, robot.nv)
    args = (res.normal, res.slip_velocity, res._s, res._mu, res.normal_force, res._c_n, res._k_n, Jf, terms._M, DT)
    C, K = row_matrices(*args)
    CK = row_matrices(*args, combined=True)
    torch.testing.assert_close(CK, C + DT * K, rtol=1e-13, atol=1e-9)
    torch.testing.assert_close(terms._CK, CK, rtol=0, atol=0)
    # The prediction as matrices: C dt b + K dt (J v + dt b), b = J_base (w x v_base).
    Jv = (res.jacobian @ v[..., None, :, None])[..., 0]
    R0 = res._bodies[0][..., 0, :, :]
    b = DT * (R0 @ torch.linalg.cross(v[..., 3:6], v[..., :3])[..., None]).transpose(-1, -2)
    pred = (C @ b[..., None])[..., 0] + (K @ (DT * (Jv + b))[..., None])[..., 0]
    scale = float(pred.abs().max())
    assert scale > 0
    assert float((terms._pred - pred).abs().max()) <= 1e-12 * scale
    force = (Jf.transpose(-1, -2) @ (res.force - pred).reshape(*Jf.shape[:-2], -1, 1))[..., 0]
    assert float((terms.force - force).abs().max()) <= 1e-12 * float(force.abs().max())
    matrix = Jf.transpose(-1, -2) @ (CK @ res.jacobian).reshape(Jf.shape)
    assert float((terms.matrix - matrix).abs().max()) <= 1e-12 * float(matrix.abs().max())
