"""Trajectory optimisation: the mass-spring-damper demo numbers, the solvers."""

from __future__ import annotations

import io
import math
import time

import pytest
import torch

import backdrive.optim as bopt
from backdrive import InputError
from backdrive.optim import (
    ProgressBar,
    adam,
    jacobian,
    lbfgs,
    levenberg_marquardt,
    mass_spring_damper_problem,
    optimize_trajectory,
)
from backdrive.sim import NonFiniteError

F64 = torch.float64
REFERENCE = [19.9717, 18.8422, 17.9318, 17.1367, 16.4228]  # epochs 0, 20, 40, 60, 80



def test_public_names_resolve():
    for name in bopt.__all__:
        assert getattr(bopt, name) is not None, name


@pytest.mark.parametrize("dtype", [F64, torch.float32])
def test_adam_reproduces_the_reference_losses(dtype):
    sim, state0, cost, horizon = mass_spring_damper_problem(dtype)
    res = optimize_trajectory(sim, state0, cost, horizon, optimizer="adam", iterations=100, lr=0.1)
    got = [round(res.losses[k], 4) for k in (0, 20, 40, 60, 80)]
    assert got == REFERENCE
    assert len(res.losses) == 101 and res.iterations == 100
    assert res.controls.shape == (50, 1) and res.trajectory.q.shape == (51, 1)
    # The returned trajectory is the rollout of the returned controls.
    assert (res.trajectory.q[1:, 0] ** 2).sum().item() == pytest.approx(res.loss, rel=1e-5)


def test_lbfgs_beats_adam_by_orders_of_magnitude():
    sim, state0, cost, horizon = mass_spring_damper_problem()
    start = time.perf_counter()
    res = optimize_trajectory(sim, state0, cost, horizon, optimizer="lbfgs", iterations=100)
    elapsed = time.perf_counter() - start
    print(f"\nL-BFGS on the mass-spring-damper: loss {res.loss:.4f} in {elapsed:.3f} s "
          f"({res.iterations} iterations, {res.evaluations} rollouts)")
    assert res.loss < 0.1
    # Every accepted iterate satisfies sufficient decrease.
    assert all(b <= a for a, b in zip(res.losses, res.losses[1:]))


def test_gauss_newton_solves_the_linear_problem():
    sim, state0, cost, horizon = mass_spring_damper_problem()
    res = optimize_trajectory(sim, state0, cost, horizon, optimizer="gauss_newton")
    assert res.loss < 1e-8
    assert res.converged
    with pytest.raises(InputError, match="residuals"):
        optimize_trajectory(sim, state0, lambda tr, u: (tr.q ** 2).sum(), horizon, optimizer="gauss_newton")


def test_truncated_rollouts_and_warm_start():
    sim, state0, cost, horizon = mass_spring_damper_problem()
    cold = optimize_trajectory(sim, state0, cost, horizon, optimizer="lbfgs", iterations=10,
                               truncate_every=10)
    warm = optimize_trajectory(sim, state0, cost, horizon, optimizer="lbfgs", iterations=10,
                               controls=cold.controls)
    assert warm.losses[0] == pytest.approx(cold.loss)
    assert warm.loss < cold.loss
    with pytest.raises(InputError, match="controls"):
        optimize_trajectory(sim, state0, cost, horizon, controls=torch.zeros(49, 1, dtype=F64))
    with pytest.raises(InputError, match="optimizer"):
        optimize_trajectory(sim, state0, cost, horizon, optimizer="sgd")


def test_non_finite_loss_is_an_error():
    sim, state0, _, horizon = mass_spring_damper_problem()
    with pytest.raises(NonFiniteError, match="iteration 0"):
        optimize_trajectory(sim, state0, lambda tr, u: torch.log(tr.q[..., 1:, 0] - 5.0).sum(), horizon,
                            optimizer="adam", iterations=3)


# ---------------------------------------------------------------- solvers


def rosenbrock_residuals(x):
    return torch.stack([10.0 * (x[1] - x[0] ** 2), 1.0 - x[0]])


def test_solvers_on_rosenbrock():
    x0 = torch.tensor([-1.2, 1.0], dtype=F64)
    res = lbfgs(rosenbrock_residuals, x0, iterations=200)
    torch.testing.assert_close(res.x, torch.ones(2, dtype=F64), rtol=0, atol=1e-6)
    res = levenberg_marquardt(rosenbrock_residuals, x0, iterations=100)
    torch.testing.assert_close(res.x, torch.ones(2, dtype=F64), rtol=0, atol=1e-8)
    res = adam(lambda x: ((x - 3.0) ** 2).sum(), torch.zeros(3, dtype=F64), iterations=500, lr=0.1)
    torch.testing.assert_close(res.x, torch.full((3,), 3.0, dtype=F64), rtol=0, atol=1e-3)


def test_jacobian_matches_autograd():
    A = torch.randn(5, 3, dtype=F64, generator=torch.Generator().manual_seed(0))

    def f(x):
        return torch.tanh(A @ x) * x.sum()

    x = torch.tensor([0.1, -0.4, 0.7], dtype=F64)
    r, J = jacobian(f, x)
    torch.testing.assert_close(r, f(x))
    torch.testing.assert_close(J, torch.autograd.functional.jacobian(f, x))


def test_progress_bar_draws_to_its_stream():
    buf = io.StringIO()
    bar = ProgressBar(10, "fit", enabled=True, stream=buf, interval=0.0)
    bar.update(3, 0.5)
    bar.close(10, 0.25)
    out = buf.getvalue()
    assert "fit  3/10" in out and "loss 5.0000e-01" in out and out.endswith("\n")
    assert "10/10 [########################]" in out
    quiet = io.StringIO()
    ProgressBar(10, enabled=None, stream=quiet).update(1, 1.0)  # not a terminal: silent
    assert quiet.getvalue() == ""


def test_demo_function_reports_all_three_optimisers():
    demo = bopt.demo_mass_spring_damper(epochs=20, iterations=30)
    assert round(demo.adam.losses[0], 4) == REFERENCE[0]
    assert round(demo.adam.losses[20], 4) == REFERENCE[1]
    assert demo.lbfgs.loss < demo.adam.loss and demo.gauss_newton.loss < 1e-8
    text = demo.summary()
    assert "Adam" in text and "L-BFGS" in text and "Gauss-Newton" in text
    assert math.isfinite(demo.lbfgs.wall_time)
