"""identify restarts a log-parameter that collapsed towards 0 (its gradient gone with it)."""

from __future__ import annotations

import math

import torch

from backdrive.optim import SolverOptions, minimize
from backdrive.optim._sysid_contact import _COLLAPSE, _restart_note, _restarted

F64 = torch.float64
GN = SolverOptions("gauss_newton", iterations=30)


def fitted_at(fun, x):
    """A converged-looking result sitting at ``x`` (no iterations)."""
    return minimize(fun, torch.as_tensor(x, dtype=F64), SolverOptions("gauss_newton", iterations=0))


def test_a_collapsed_coordinate_is_restarted_and_the_better_fit_kept():
    # a = exp(x0) should be 0.5, b = x1 should be 2; the fit left a at 1e-5.
    def fun(x):
        return torch.stack([torch.exp(x[0]) - 0.5, x[1] - 2.0])

    res = fitted_at(fun, [math.log(1e-5), 2.0])
    out, log = _restarted(minimize, fun, None, res, GN, "toy", [(0, "damping[j]")], torch.zeros(2, dtype=F64))
    assert len(log) == 1 and log[0][0] == ["damping[j]"] and log[0][3]
    assert log[0][2] < 1e-12 < log[0][1]
    assert abs(math.exp(float(out.x[0])) - 0.5) < 1e-6
    # One history: the first fit's losses, then the restart's iterations.
    assert out.losses[0] == res.losses[0] and len(out.losses) == out.iterations + 1
    note = _restart_note(log)
    assert "damping[j] collapsed" in note and "1 kept" in note


def test_a_restart_that_does_not_lower_the_loss_is_refused():
    # The data want a -> 0: the restart from a = 1 cannot beat the collapse
    # in 3 iterations, so the collapsed fit stays.
    def fun(x):
        return torch.exp(x[:1])

    res = fitted_at(fun, [math.log(1e-9)])
    out, log = _restarted(minimize, fun, None, res, SolverOptions("gauss_newton", iterations=3), "toy",
                          [(0, "friction[j]")], torch.zeros(1, dtype=F64))
    assert len(log) == 1 and not log[0][3] and log[0][2] > log[0][1]
    assert torch.equal(out.x, res.x)
    assert "0 kept" in _restart_note(log)


def test_no_restart_above_the_collapse_threshold_or_for_other_coordinates():
    def fun(x):
        return torch.stack([torch.exp(x[0]) - 0.5, x[1] - 2.0])

    # x0 a little above the threshold; x1 far below its reference but not a log-coordinate.
    res = fitted_at(fun, [-_COLLAPSE + 0.01, -50.0])
    out, log = _restarted(minimize, fun, None, res, GN, "toy", [(0, "damping[j]")], torch.zeros(2, dtype=F64))
    assert log == [] and out is res and _restart_note(log) == ""


def test_identify_reports_the_restart_of_a_damping_whose_truth_is_zero():
    """A joint without damping: the fit drives its damping to 0, the restart
    from the guess goes back there (refused, no lower loss), the message says
    so, and the other parameters are fitted as without it."""
    from backdrive.data import load
    from backdrive.optim import InverseDynamicsFit, identify
    from backdrive.sim import Simulator, State

    robot = load("double_pendulum")
    hidden = robot.replace(body_mass=robot.body_mass * torch.tensor([1.0, 1.1, 0.9], dtype=F64),
                           damping=torch.tensor([0.0, 0.6], dtype=F64))
    start = robot.replace(damping=torch.tensor([0.1, 0.1], dtype=F64))
    g = torch.Generator().manual_seed(3)
    t = torch.arange(200, dtype=F64)[:, None] * 0.01
    freq, phase = 0.3 + 1.5 * torch.rand(4, 1, 2, generator=g, dtype=F64), torch.rand(4, 1, 2, generator=g, dtype=F64)
    torques = torch.tensor([8.0, 4.0], dtype=F64) * torch.sin(2 * math.pi * (freq * t + phase))
    sim = Simulator(hidden, 0.01, joint_forces="explicit")
    traj = sim.rollout(State(torch.zeros(4, 2, dtype=F64), torch.zeros(4, 2, dtype=F64)), torques)
    fit = identify(start, traj.q, traj.v, dt=0.01, tau=traj.effort, params=("body_mass", "damping"),
                   method=InverseDynamicsFit(), options=SolverOptions("gauss_newton", iterations=40))
    assert "damping[joint1] collapsed" in fit.message and "restarted from it" in fit.message
    assert float(fit.params["damping"][0]) < 1e-6
    assert abs(float(fit.params["damping"][1]) / 0.6 - 1) < 1e-6
    assert torch.allclose(fit.params["body_mass"][1:], hidden.body_mass[1:], rtol=1e-6)
