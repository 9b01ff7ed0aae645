"""Trajectory optimisation: the mass-spring-damper demo numbers, the solvers."""

from __future__ import annotations

import io
import math
import time

import pytest
import torch

import backdrive.optim as bopt
from backdrive import InputError
from backdrive._errors import ConfigError
from backdrive.optim import (
    DEFAULT_ITERATIONS,
    ProgressBar,
    SolverOptions,
    adam,
    jacobian,
    lbfgs,
    levenberg_marquardt,
    mass_spring_damper_problem,
    minimize,
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
    res = optimize_trajectory(sim, state0, cost, horizon,
                              options=SolverOptions("adam", iterations=100, lr=0.1))
    got = [round(res.losses[k], 4) for k in (0, 20, 40, 60, 80)]
    assert got == REFERENCE
    assert len(res.losses) == 101 and res.iterations == 100
    assert res.controls.shape == (50, 1) and res.trajectory.q.shape == (51, 1)
    # The returned trajectory is the rollout of the returned controls.
    assert (res.trajectory.q[1:, 0] ** 2).sum().item() == pytest.approx(res.loss, rel=1e-5)


def test_lbfgs_beats_adam_by_orders_of_magnitude():
    sim, state0, cost, horizon = mass_spring_damper_problem()
    start = time.perf_counter()
    res = optimize_trajectory(sim, state0, cost, horizon, options=SolverOptions("lbfgs", iterations=100))
    elapsed = time.perf_counter() - start
    print(f"\nL-BFGS on the mass-spring-damper: loss {res.loss:.4f} in {elapsed:.3f} s "
          f"({res.iterations} iterations, {res.evaluations} rollouts)")
    assert res.loss < 0.1
    # Every accepted iterate satisfies sufficient decrease.
    assert all(b <= a for a, b in zip(res.losses, res.losses[1:]))


def test_gauss_newton_solves_the_linear_problem():
    sim, state0, cost, horizon = mass_spring_damper_problem()
    gn = SolverOptions("gauss_newton")
    res = optimize_trajectory(sim, state0, cost, horizon, options=gn)
    assert res.loss < 1e-8
    assert res.converged and res.options is gn
    with pytest.raises(InputError, match="residuals"):
        optimize_trajectory(sim, state0, lambda tr, u: (tr.q ** 2).sum(), horizon, options=gn)


def test_truncated_rollouts_and_warm_start():
    sim, state0, cost, horizon = mass_spring_damper_problem()
    ten = SolverOptions("lbfgs", iterations=10)
    cold = optimize_trajectory(sim, state0, cost, horizon, options=ten, truncate_every=10)
    warm = optimize_trajectory(sim, state0, cost, horizon, options=ten, controls=cold.controls)
    assert warm.losses[0] == pytest.approx(cold.loss)
    assert warm.loss < cold.loss
    with pytest.raises(InputError, match="controls"):
        optimize_trajectory(sim, state0, cost, horizon, controls=torch.zeros(49, 1, dtype=F64))
    with pytest.raises(ConfigError, match="method must be one of 'lbfgs', 'adam', 'gauss_newton'; got 'sgd'"):
        optimize_trajectory(sim, state0, cost, horizon, options=SolverOptions("sgd"))


def test_non_finite_loss_is_an_error():
    sim, state0, _, horizon = mass_spring_damper_problem()
    with pytest.raises(NonFiniteError, match="iteration 0"):
        optimize_trajectory(sim, state0, lambda tr, u: torch.log(tr.q[..., 1:, 0] - 5.0).sum(), horizon,
                            options=SolverOptions("adam", iterations=3))


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


# ---------------------------------------------------------------- options


def test_solver_options_are_validated_and_frozen():
    opts = SolverOptions("adam", iterations=5, lr=0.2)
    with pytest.raises(AttributeError):
        opts.lr = 0.3  # frozen
    assert opts.get("lr") == 0.2 and opts.get("betas") == (0.9, 0.999) and opts.get("iterations") == 5
    assert SolverOptions("gauss_newton").get("iterations") == DEFAULT_ITERATIONS["gauss_newton"] == 50
    assert SolverOptions().method == "lbfgs" and SolverOptions().progress is None
    for bad, match in [
        (dict(method="lbgfs"), "did you mean 'lbfgs'"),
        (dict(iterations=-1), "iterations"),
        (dict(iterations=2.5), "iterations"),
        (dict(iterations=True), "iterations"),
        (dict(method="adam", lr=0.0), "lr"),
        (dict(method="adam", lr=float("nan")), "lr"),
        (dict(tolerance=-1e-3), "tolerance"),
        (dict(method="adam", betas=(0.9, 1.0)), "betas"),
        (dict(history=0), "history"),
        (dict(progress="yes"), "progress"),
        (dict(callback=3), "callback"),
        (dict(max_time=0), "max_time"),
    ]:
        with pytest.raises(ConfigError, match=match):
            SolverOptions(**bad)
    # ConfigError is an InputError and a ValueError: old except clauses still catch it.
    assert issubclass(ConfigError, InputError) and issubclass(ConfigError, ValueError)


def test_an_option_the_method_does_not_read_is_reported():
    with pytest.warns(UserWarning, match=r"damping does not apply to method='adam'.*gauss_newton"):
        opts = SolverOptions("adam", damping=1e-2)
    assert opts.ignored() == ["damping"]
    with pytest.warns(UserWarning, match="lr, history do not apply to method='gauss_newton'"):
        SolverOptions("gauss_newton", lr=0.1, history=5)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        SolverOptions("lbfgs", history=5, tolerance=1e-9, gradient_tolerance=0.0)  # all read by L-BFGS
        # A problem's own defaults only fill what the method reads: no warning.
        assert SolverOptions("gauss_newton").with_defaults(lr=0.01).lr is None
        assert SolverOptions("adam").with_defaults(lr=0.01).lr == 0.01
        assert SolverOptions("adam", lr=0.5).with_defaults(lr=0.01).lr == 0.5


def test_old_keywords_still_work_with_a_deprecation_warning():
    sim, state0, cost, horizon = mass_spring_damper_problem()
    new = optimize_trajectory(sim, state0, cost, horizon, options=SolverOptions("adam", iterations=20, lr=0.1))
    with pytest.warns(DeprecationWarning, match=r"optimizer=\.\.\., iterations=\.\.\., lr=\.\.\..*SolverOptions"):
        old = optimize_trajectory(sim, state0, cost, horizon, optimizer="adam", iterations=20, lr=0.1)
    assert old.losses == new.losses and old.optimizer == "adam"
    # An old keyword the chosen method never read (lr with L-BFGS) is now reported.
    with pytest.warns(DeprecationWarning), pytest.warns(UserWarning, match="lr does not apply"):
        optimize_trajectory(sim, state0, cost, horizon, optimizer="lbfgs", iterations=2, lr=0.5)
    with pytest.raises(ConfigError, match="not both"):
        optimize_trajectory(sim, state0, cost, horizon, options=SolverOptions(), iterations=3)
    with pytest.raises(ConfigError, match="'iteratoins'"):
        optimize_trajectory(sim, state0, cost, horizon, iteratoins=3)
    with pytest.raises(ConfigError, match="SolverOptions"):
        optimize_trajectory(sim, state0, cost, horizon, options={"method": "adam"})


def test_minimize_is_the_one_dispatch():
    x0 = torch.tensor([-1.2, 1.0], dtype=F64)
    seen = []
    res = minimize(rosenbrock_residuals, x0, SolverOptions("gauss_newton", iterations=100,
                                                           callback=lambda k, x, f: seen.append((k, f))))
    torch.testing.assert_close(res.x, torch.ones(2, dtype=F64), rtol=0, atol=1e-8)
    assert res.method == "gauss_newton" and res.jacobian.shape == (2, 2)
    assert [k for k, _ in seen] == list(range(res.iterations + 1))
    assert [f for _, f in seen] == res.losses
    # The per-solver functions are minimize with a fixed method; old keyword names map over.
    via_alias = lbfgs(rosenbrock_residuals, x0, iterations=200, tolerance_change=1e-12, tolerance_grad=1e-10)
    direct = minimize(rosenbrock_residuals, x0, SolverOptions("lbfgs", iterations=200))
    assert via_alias.losses == direct.losses and via_alias.method == "lbfgs"
    with pytest.raises(ConfigError, match="unknown setting.*'step'"):
        adam(rosenbrock_residuals, x0, step=0.1)
    with pytest.raises(ConfigError, match="residuals"):
        minimize(lambda x: (x ** 2).sum(), x0, SolverOptions("gauss_newton"))
    # max_time stops every solver.
    for method in ("adam", "lbfgs", "gauss_newton"):
        r = minimize(rosenbrock_residuals, x0, SolverOptions(method, iterations=10**6, max_time=1e-9))
        assert r.message == "time limit" and r.iterations <= 1, method


def test_minimize_draws_its_progress_bar(monkeypatch, capsys):
    import sys

    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    x0 = torch.tensor([-1.2, 1.0], dtype=F64)
    minimize(rosenbrock_residuals, x0, SolverOptions("gauss_newton", iterations=3, progress=None), label="fit")
    assert "fit[gauss_newton]" in capsys.readouterr().err
    minimize(rosenbrock_residuals, x0, SolverOptions("gauss_newton", iterations=3, progress=False), label="fit")
    assert capsys.readouterr().err == ""
