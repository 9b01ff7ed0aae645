"""The hand-written backward of the floating-base step (``contact._step._IntegrateWorld``).

Held against plain autograd through the same operations
(``_integrate_world_floating``) and against finite differences (float64
gradcheck), in the large-angle and the small-angle (Taylor) branches of the
exponential, with broadcast batch axes; double backward and ``torch.func``
still work.
"""

from __future__ import annotations

import pytest
import torch

from backdrive.contact import integrate_world
from backdrive.contact._step import _IntegrateWorld, _integrate_world_floating

from _robots import box_robot


def _inputs(scale, batch=(2,), nj=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    nq, nv = 7 + nj, 6 + nj
    q = torch.randn(*batch, nq, generator=g, dtype=torch.float64)
    q[..., 3:7] /= q[..., 3:7].norm(dim=-1, keepdim=True)
    v = torch.randn(*batch, nv, generator=g, dtype=torch.float64) * scale
    a = torch.randn(1, nv, generator=g, dtype=torch.float64) * scale  # broadcast over the batch
    return q, v, a


# (velocity scale, dt): turns of 1e-4 and 0 rad take the Taylor branch of the
# exponential in float64, 0.3 s at unit rates the closed form (~0.5 rad).
CASES = [(1.0, 0.3), (1.0, 4e-3), (1e-3, 4e-3), (0.0, 4e-3)]


@pytest.mark.parametrize("scale,dt", CASES)
def test_integrate_world_backward_gradcheck_and_plain_autograd(scale, dt):
    q, v, a = (x.requires_grad_(True) for x in _inputs(scale))

    def f(q, v, a):
        return _IntegrateWorld.apply(q, v, a, dt)

    assert torch.autograd.gradcheck(f, (q, v, a))
    out, ref = f(q, v, a), _integrate_world_floating(q, v, a, dt)
    for x, y in zip(out, ref):  # the forward is the plain one
        assert torch.equal(x, y)
    w = [torch.randn_like(o) for o in out]
    g_fast = torch.autograd.grad(out, (q, v, a), w)
    g_ref = torch.autograd.grad(ref, (q, v, a), w)
    for x, y in zip(g_fast, g_ref):
        assert x.shape == y.shape
        torch.testing.assert_close(x, y, rtol=1e-12, atol=1e-13)


def test_integrate_world_double_backward():
    q, v, a = (x.requires_grad_(True) for x in _inputs(1.0, batch=(), nj=1))
    assert torch.autograd.gradgradcheck(lambda q, v, a: _IntegrateWorld.apply(q, v, a, 0.05), (q, v, a))


def test_integrate_world_dispatch_and_torch_func():
    robot = box_robot()  # a floating box: nq 7, nv 6
    q, v, a = (x[..., : x.shape[-1] - 2] for x in _inputs(1.0, batch=()))
    a = a[0]
    q = q.clone().requires_grad_(True)
    q1, v1 = integrate_world(robot, q, v, a, 0.01)
    assert type(q1.grad_fn).__name__ == "_IntegrateWorldBackward"
    with torch.no_grad():
        q1n, v1n = integrate_world(robot, q, v, a, 0.01)
    assert torch.equal(q1n, q1.detach()) and torch.equal(v1n, v1.detach())
    # torch.func takes the plain operations (a custom Function without vmap/jvp rules would not).
    J = torch.func.jacrev(lambda a: integrate_world(robot, q.detach(), v, a, 0.01)[0])(a)
    Jf = torch.func.jacfwd(lambda a: integrate_world(robot, q.detach(), v, a, 0.01)[0])(a)
    aa = a.clone().requires_grad_(True)
    rows = [torch.autograd.grad(integrate_world(robot, q.detach(), v, aa, 0.01)[0][i], aa)[0] for i in range(7)]
    torch.testing.assert_close(J, torch.stack(rows), rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(Jf, J, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("scale", [1.0, 0.2, 5.0])
def test_quat_to_matrix_backward_gradcheck_and_plain_autograd(scale):
    from backdrive.spatial import quat_to_matrix
    from backdrive.spatial._quat import _quat_to_matrix

    g = torch.Generator().manual_seed(1)
    q = (scale * torch.randn(2, 4, generator=g, dtype=torch.float64)).requires_grad_(True)  # off unit norm too
    R = quat_to_matrix(q)
    assert type(R.grad_fn).__name__ == "_QuatToMatrixBackward"
    assert torch.equal(R, _quat_to_matrix(q))
    assert torch.autograd.gradcheck(quat_to_matrix, (q,))
    assert torch.autograd.gradgradcheck(quat_to_matrix, (q,))
    G = torch.randn(2, 3, 3, generator=g, dtype=torch.float64)
    torch.testing.assert_close(torch.autograd.grad(R, q, G)[0], torch.autograd.grad(_quat_to_matrix(q), q, G)[0],
                               rtol=1e-12, atol=1e-13)
    J = torch.func.jacrev(quat_to_matrix)(q.detach()[0])  # torch.func: the plain formula
    torch.testing.assert_close(J, torch.func.jacfwd(quat_to_matrix)(q.detach()[0]), rtol=1e-12, atol=1e-14)
