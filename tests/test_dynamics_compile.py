"""compile_forward_dynamics (torch.compile, inductor) against the eager forward_dynamics.

Each compilation takes seconds to tens of seconds on the CPU (inductor's
on-disk cache makes reruns faster); the batches are small to keep the whole
file near a minute.
"""

from __future__ import annotations

import re

import pytest
import torch

import backdrive.dynamics as D
from backdrive import InputError, RobotModel
from backdrive.data import get_data_path

BATCH = 3


def _panda() -> RobotModel:
    # Independent fingers, as in benchmarks/dynamics.py.
    return RobotModel.from_urdf(re.sub(r"<mimic[^>]*/>", "", get_data_path("panda").read_text()))


def _quadruped() -> RobotModel:
    return RobotModel.from_urdf(get_data_path("quadruped"), floating_base=True)


def _states(robot: RobotModel, batch: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q = robot.random_q(batch, generator=g)
    v = torch.randn(batch, robot.nv, generator=g, dtype=robot.dtype)
    tau = torch.randn(batch, robot.nv, generator=g, dtype=robot.dtype)
    return q, v, tau


def _close(a: torch.Tensor, b: torch.Tensor, tol: float) -> None:
    # Relative to the size of the reference (accelerations reach hundreds).
    scale = max(1.0, b.abs().max().item())
    err = (a - b).abs().max().item()
    assert err <= tol * scale, f"max error {err:.3e} > {tol:g} x {scale:.3g}"


# Float32 tolerances relative to the largest acceleration. The fused kernels
# round differently (FMA, another summation order), and forward dynamics
# amplifies rounding by the mass matrix's condition number: for the
# quadruped (light feet) the compiled and eager float32 results differ by
# about 3e-5 of the largest acceleration, as much as each differs from the
# float64 solution; the float64 comparison below checks that.
@pytest.mark.parametrize(
    "make,dtype,tol",
    [
        (_panda, torch.float32, 1e-5),
        (_panda, torch.float64, 1e-12),
        # 2e-4 measured after the reference FK's sine/cosine change (rounding only).
        (_quadruped, torch.float32, 3e-4),
        (_quadruped, torch.float64, 1e-12),
    ],
    ids=["panda-f32", "panda-f64", "quadruped-f32", "quadruped-f64"],
)
def test_compiled_matches_eager(make, dtype, tol):
    robot = make().to(dtype=dtype)
    q, v, tau = _states(robot, BATCH)
    fd = D.compile_forward_dynamics(robot)
    with torch.no_grad():
        got = fd(q, v, tau)
        want = D.forward_dynamics(robot, q, v, tau)
    assert got.shape == want.shape == (BATCH, robot.nv)
    assert got.dtype == dtype
    assert torch.isfinite(got).all()
    _close(got, want, tol)
    if dtype == torch.float32:
        # No less accurate than eager float32 against the float64 solution.
        r64 = robot.double()
        exact = D.forward_dynamics(r64, q.double(), v.double(), tau.double())
        err_compiled = (got.double() - exact).abs().max().item()
        err_eager = (want.double() - exact).abs().max().item()
        assert err_compiled <= 3.0 * err_eager + 1e-6 * exact.abs().max().item()
    # A second state through the already compiled function.
    q2, v2, tau2 = _states(robot, BATCH, seed=1)
    with torch.no_grad():
        _close(fd(q2, v2, tau2), D.forward_dynamics(robot, q2, v2, tau2), tol)


def test_compiled_gradients_match_eager():
    # Plain autograd through the compiled graph (forward and backward are
    # compiled: about a minute for the Panda, so a small chain here).
    robot = RobotModel.from_urdf(get_data_path("double_pendulum")).double()
    q, v, tau = _states(robot, 2, seed=2)
    fd = D.compile_forward_dynamics(robot)

    def grads(f):
        xs = [x.clone().requires_grad_(True) for x in (q, v, tau)]
        loss = f(*xs).square().sum()
        return torch.autograd.grad(loss, xs)

    got = grads(fd)
    want = grads(lambda q, v, tau: D.forward_dynamics(robot, q, v, tau))
    for g, w in zip(got, want):
        assert torch.isfinite(g).all()
        _close(g, w, 1e-10)


def test_large_batches_without_gradient_run_eager():
    # From eager_from samples (default 256) no graph is compiled: the eager
    # batch-last path, bit for bit.
    robot = _quadruped()
    q, v, tau = _states(robot, 300, seed=3)
    fd = D.compile_forward_dynamics(robot)
    with torch.no_grad():
        assert torch.equal(fd(q, v, tau), D.forward_dynamics(robot, q, v, tau))
    with pytest.raises(InputError, match="eager_from"):
        D.compile_forward_dynamics(robot, eager_from=0)


def test_compile_forward_dynamics_rejects_bad_arguments():
    robot = _panda()
    with pytest.raises(InputError, match="unknown forward dynamics method"):
        D.compile_forward_dynamics(robot, method="featherstone")
    with pytest.raises(InputError, match="friction_width"):
        D.compile_forward_dynamics(robot, friction_width=0.0)


def test_missing_cxx_compiler_is_a_clear_error(monkeypatch):
    import backdrive.dynamics._compiled as C

    monkeypatch.setattr(C.shutil, "which", lambda name: None)
    with pytest.raises(D.CompilerUnavailableError, match="C\\+\\+ compiler"):
        D.compile_forward_dynamics(_panda())
