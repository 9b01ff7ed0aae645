"""Sensitivity reports (backdrive.analysis): gradients, re-simulation checks, metrics, bad input, CLI."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from backdrive._errors import InputError, UnknownNameError
from backdrive.analysis import (
    METRICS,
    check_linearity,
    load_trajectory,
    make_metric,
    resimulate,
    save_trajectory,
    sensitivity,
)
from backdrive.contact import ContactGeometry, ContactModel
from backdrive.data import load
from backdrive.kinematics import forward_kinematics
from backdrive.sim import PDActuator, Simulator, State

STAND = [0.0, 0.7, -1.4] * 4


def quadruped(drop: float, forward: float, *, dt: float = 2e-3):
    """The shipped quadruped under PD over the ground, ``drop`` m above touching, drifting ``forward`` m/s."""
    robot = load("quadruped", floating_base=True)
    feet = [n for n in robot.link_names if n.endswith("_foot")]
    cm = ContactModel(robot, ContactGeometry.from_model(robot, links=feet))
    sim = Simulator(robot, dt, actuator=PDActuator(kp=200.0, kd=6.0), contact=cm)
    qj = torch.tensor(STAND, dtype=robot.dtype)
    q0 = robot.neutral()
    q0[7:] = qj
    T = forward_kinematics(robot, q0)
    q0[2] = -min(float(T[robot.frame_index(f), 2, 3]) for f in feet) + 0.02 + drop
    v0 = torch.zeros(robot.nv, dtype=robot.dtype)
    v0[0] = forward
    return sim, State(q0, v0), qj


@pytest.fixture(scope="module")
def landing():
    """30 steps of 2 ms: a 2 mm drop while drifting forward at 0.3 m/s, so the feet land and slide."""
    sim, s0, qj = quadruped(0.002, 0.3)
    u = qj.expand(30, 12).clone()
    return sim, s0, u, sensitivity(sim, s0, u, "foot_slip")


def test_gradients_match_central_differences_in_float64():
    """Feet already loaded and sliding: d foot_slip / d (commands, v0, mass, friction, kp) against
    central differences, the perturbed rollouts batched where they can be."""
    sim, s0, qj = quadruped(-0.0007, 0.3)
    steps = 6
    u = qj.expand(steps, 12).clone()
    s = sensitivity(sim, s0, u, "foot_slip", parameters=["body_mass", "contact.friction", "kp"])
    assert s.controls.shape == (steps, 12) and s.initial_q.shape == (19,) and s.initial_v.shape == (18,)
    assert s.parameters["body_mass"].shape == (sim.robot.num_bodies,) and s.parameters["kp"].shape == (12,)
    assert float(s.trajectory.contact.normal_force.min()) > 1.0  # every foot loaded
    h = 1e-6
    # commands: four entries, both signs, one batch
    picks = [(0, 2), (1, 5), (3, 7), (4, 11)]  # step 5 only reaches the final state
    d = torch.zeros(2 * len(picks), steps, 12, dtype=u.dtype)
    for i, (t, j) in enumerate(picks):
        d[2 * i, t, j], d[2 * i + 1, t, j] = h, -h
    _, vals, _ = resimulate(s, d)
    fd = (vals[0::2] - vals[1::2]) / (2 * h)
    ad = torch.tensor([float(s.controls[t, j]) for t, j in picks], dtype=torch.float64)
    assert float(ad.abs().min()) > 1e-6  # the picks do move the metric
    torch.testing.assert_close(fd, ad, rtol=1e-5, atol=1e-9)
    # initial forward velocity
    m = make_metric("foot_slip", sim)
    vp, vm = s0.v.clone(), s0.v.clone()
    vp[0] += h
    vm[0] -= h
    with torch.no_grad():
        fdv = (m(sim.rollout(State(s0.q, vp), u)) - m(sim.rollout(State(s0.q, vm), u))) / (2 * h)
    assert abs(float(fdv) - float(s.initial_v[0])) <= 1e-5 * abs(float(s.initial_v[0])) + 1e-9
    # physical parameters: a rebuilt simulator per finite difference
    robot = sim.robot
    k = robot.body_names.index("RL_calf")

    def with_mass(dm):
        mass = robot.body_mass.clone()
        mass[k] += dm
        r = robot.replace(body_mass=mass)
        return sim.replace(robot=r, contact=ContactModel(r, sim.contact.geometry))

    def with_friction(mu):
        return sim.replace(contact=ContactModel(robot, sim.contact.geometry, params=sim.contact.params.replace(friction=mu)))

    def with_kp(j, dk):
        kp = torch.full((12,), 200.0, dtype=robot.dtype)
        kp[j] += dk
        return sim.replace(actuator=PDActuator(kp=kp, kd=6.0))

    checks = [
        (with_mass(h), with_mass(-h), float(s.parameters["body_mass"][k])),
        (with_friction(0.75 + h), with_friction(0.75 - h), float(s.parameters["contact.friction"])),
        (with_kp(4, 1e-3), with_kp(4, -1e-3), float(s.parameters["kp"][4]) * 1e-3 / h),
    ]
    for sp, sm, g in checks:
        with torch.no_grad():
            fdp = (m(sp.rollout(s0, u)) - m(sm.rollout(s0, u))) / (2 * h)
        assert abs(float(fdp) - g) <= 1e-5 * abs(g) + 1e-9, (float(fdp), g)
    # the report re-simulates the parameters with the largest predicted effect (+1 %)
    r = s.report(top=2, parameter_checks=3)
    assert len(r.parameter_checks) == 3
    for c in r.parameter_checks:
        assert c.agrees, c
        assert c.change == pytest.approx(0.01 * c.value)
    assert "Re-simulated (the largest predicted effects)" in r.to_markdown()


def test_small_perturbations_agree_on_18_of_20_random_cases(landing):
    """The landing with slip (contacts switch on during the rollout): 20 random command perturbations
    of 1e-5 rad per command, re-simulated in one batch, against the linear prediction."""
    sim, s0, u, s = landing
    active = s.contact_active()
    assert bool(~active[0].any()) and bool(active[-1].all())  # lands during the window
    assert s.value > 1e-3  # it slips
    c = check_linearity(s, 20, size=1e-5, seed=0)
    assert c.num_agree >= 18, c.to_markdown()
    assert not c.contact_switch.any()


def test_report_ranks_checks_and_marks_contact_switches(landing, tmp_path):
    sim, s0, u, s = landing
    r = s.report(top=6)
    assert [e.rank for e in r.entries] == list(range(1, 7))
    mags = [abs(e.gradient) for e in r.entries]
    assert mags == sorted(mags, reverse=True)
    for e in r.entries:
        # the change is chosen to lower the metric, so the prediction is negative
        assert e.predicted < 0 and e.predicted == pytest.approx(e.gradient * e.change)
        assert np.isfinite(e.actual)
        assert e.joint in sim.robot.joint_names
    assert r.best.actual == min(e.actual for e in r.entries)
    # one entry re-simulated by hand gives the same actual change
    e = r.entries[0]
    d = torch.zeros(1, *u.shape, dtype=u.dtype)
    d[0, e.start_step : e.stop_step, sim.robot.joint_names.index(e.joint)] = e.change
    nominal, vals, _ = resimulate(s, d)
    assert float(vals[0]) - nominal == pytest.approx(e.actual, rel=1e-9, abs=1e-15)
    # a big change before touch-down (all calves straightened) changes when feet touch: flagged
    big = torch.zeros(1, *u.shape, dtype=u.dtype)
    big[0, :, 2::3] = 0.5
    _, _, sw = resimulate(s, big)
    assert bool(sw[0])
    _, _, sw0 = resimulate(s, torch.zeros_like(big))
    assert not bool(sw0[0])
    md = r.to_markdown()
    assert "| rank | joint |" in md and e.joint in md and "re-simulated" in md
    paths = r.save(tmp_path)
    assert paths["report"].read_text() == md
    z = np.load(paths["gradients"])
    assert z["controls"].shape == (30, 12)
    assert paths["heatmap"].stat().st_size > 10_000


def test_named_metrics_give_finite_gradients(landing):
    sim, s0, u, _ = landing
    u = u[:8]
    opts = {
        "tracking_error": {},
        "end_effector_error": {"frame": "FL_foot", "target": [0.3, 0.2, 0.0]},
    }
    for name in METRICS:
        s = sensitivity(sim, s0, u, name, metric_options=opts.get(name))
        assert np.isfinite(s.value) and bool(torch.isfinite(s.controls).all()), name
        assert float(s.controls.abs().max()) > 0, name
    s = sensitivity(sim, s0, u, lambda tr: tr.q[..., -1, 0])
    assert s.metric_name == "<lambda>" and float(s.controls.abs().max()) > 0


def test_bad_input_raises_typed_errors(landing):
    sim, s0, u, _ = landing
    with pytest.raises(UnknownNameError, match="foot_slip"):
        sensitivity(sim, s0, u, "slipperiness")
    with pytest.raises(UnknownNameError, match="contact.friction"):
        sensitivity(sim, s0, u, "foot_slip", parameters=["mu"])
    with pytest.raises(InputError, match=r"\(T, nu\)"):
        sensitivity(sim, s0, u[:, :5], "foot_slip")
    with pytest.raises(InputError, match="batch"):
        sensitivity(sim, State(s0.q.expand(2, -1), s0.v.expand(2, -1)), u, "foot_slip")
    bad = u.clone()
    bad[3, 4] = float("nan")
    with pytest.raises(InputError, match="step 3, joint 4"):
        sensitivity(sim, s0, bad, "foot_slip")
    with pytest.raises(InputError, match="one number"):
        sensitivity(sim, s0, u, lambda tr: tr.q[..., -1, :3])
    with pytest.raises(InputError, match="takes no option"):
        make_metric("energy", sim, frame="FL_foot")
    with pytest.raises(InputError, match="frame="):
        make_metric("end_effector_error", sim)
    no_contact = Simulator(sim.robot, sim.dt, actuator=sim.actuator)
    with pytest.raises(InputError, match="contact"):
        sensitivity(no_contact, s0, u[:2], "foot_slip")
    s = sensitivity(sim, s0, u[:2], "final_base_height")
    with pytest.raises(InputError, match="top"):
        s.report(top=0)
    with pytest.raises(InputError, match="window"):
        s.report(window=5)


def test_trajectory_archive_round_trip(landing, tmp_path):
    sim, s0, u, _ = landing
    traj = sim.rollout(s0, u[:4])
    path = save_trajectory(tmp_path / "t.npz", sim, traj)
    sim2, s1, u2, data = load_trajectory(path, sim.robot)
    torch.testing.assert_close(u2, u[:4])
    torch.testing.assert_close(s1.q, s0.q)
    assert sim2.dt == sim.dt and sim2.contact is not None and sim2.nu == 12
    torch.testing.assert_close(sim2.rollout(s1, u2).q, traj.q)
    np.savez(tmp_path / "short.npz", q=data["q"][:3], v=data["v"], controls=data["controls"], dt=data["dt"])
    with pytest.raises(InputError, match="lengths do not match"):
        load_trajectory(tmp_path / "short.npz", sim.robot)
    np.savez(tmp_path / "nodt.npz", q=data["q"], v=data["v"], controls=data["controls"])
    with pytest.raises(InputError, match="'dt'"):
        load_trajectory(tmp_path / "nodt.npz", sim.robot)


def test_cli_sensitivity_on_a_tiny_archive(landing, tmp_path, capsys):
    from backdrive.cli import main

    sim, s0, u, _ = landing
    path = save_trajectory(tmp_path / "rec.npz", sim, sim.rollout(s0, u[:12]))
    out = tmp_path / "out"
    rc = main(["sensitivity", "quadruped", "--trajectory", str(path), "--metric", "foot_slip", "--top", "3",
               "--window", "4", "--out", str(out), "--no-heatmap", "--preview"])
    text = capsys.readouterr().out
    assert rc == 0, text
    assert "foot_slip = " in text and "re-simulated" in text and "replay deviation" in text
    md = (out / "report.md").read_text()
    assert md.count("\n| 3 |") == 1 and "| 4 |" not in md
    html = (out / "preview.html").read_text()
    assert "most sensitive joints 1. " in html
    # replaying the record reproduces it: the archive holds the simulator's settings
    dev = float(text.split("replay deviation (max |q_sim - q_recorded|): ")[1].split()[0])
    assert dev < 1e-9
    # bad input: one line on stderr, rc 2
    for argv, needle in [
        (["--metric", "slip"], "unknown metric 'slip'"),
        (["--top", "0"], "--top"),
    ]:
        rc = main(["sensitivity", "quadruped", "--trajectory", str(path), "--out", str(out), *argv])
        err = capsys.readouterr().err
        assert rc == 2 and needle in err and len(err.strip().splitlines()) == 1, err
    rc = main(["sensitivity", "quadruped", "--trajectory", str(tmp_path / "missing.npz"), "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and "not found" in err
    np.savez(tmp_path / "bad.npz", q=np.zeros((3, 19)), v=np.zeros((3, 18)), controls=np.zeros((2, 12)))
    rc = main(["sensitivity", "quadruped", "--trajectory", str(tmp_path / "bad.npz"), "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and "'dt'" in err


def test_worked_example_reduces_the_slip(tmp_path, capsys):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "examples" / "quadruped_slip_sensitivity.py"
    spec = importlib.util.spec_from_file_location("quadruped_slip_sensitivity", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.main(tmp_path)  # asserts itself that the slip drops
    text = capsys.readouterr().out
    before = float(text.split("foot slip before: ")[1].split()[0])
    after = float(text.split("after: ")[1].split()[0])
    assert after < 0.95 * before
    assert (tmp_path / "report.md").exists() and (tmp_path / "landing_step.npz").exists()


def test_heatmap_without_matplotlib_names_the_extra():
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent(
        """
        import sys
        sys.modules["matplotlib"] = None  # makes `import matplotlib` fail
        from backdrive.analysis import plot_sensitivity
        from backdrive import MissingExtraError
        try:
            plot_sensitivity(None, "x.png")
        except MissingExtraError as exc:
            assert "backdrive[viz]" in str(exc) and "matplotlib" in str(exc)
            print("named")
        """
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.stdout.strip() == "named", r.stderr


def test_torque_actuated_pendulum_metrics_match_central_differences():
    """No contact, torque control: energy, end-effector and tracking metrics against central
    differences, and every report entry (1 % of the largest torque) re-simulates within 10 %."""
    robot = load("double_pendulum")
    sim = Simulator(robot, 0.01)
    gen = torch.Generator().manual_seed(3)
    u = 0.5 * torch.randn(20, sim.nu, generator=gen, dtype=robot.dtype)
    s0 = sim.initial_state(torch.tensor([0.3, -0.2], dtype=robot.dtype))
    h = 1e-6
    d = torch.zeros(4, 20, sim.nu, dtype=robot.dtype)
    d[0, 5, 1], d[1, 5, 1], d[2, 12, 0], d[3, 12, 0] = h, -h, h, -h
    for name, opts in [
        ("energy", None),
        ("end_effector_error", {"frame": robot.link_names[-1], "target": [0.1, 0.0, 0.2]}),
        ("tracking_error", {"reference": torch.zeros(2, dtype=robot.dtype)}),
    ]:
        s = sensitivity(sim, s0, u, name, metric_options=opts, parameters=["body_mass"])
        assert s.control_unit == "N m"
        _, v, _ = resimulate(s, d)
        fd = torch.stack([(v[0] - v[1]) / (2 * h), (v[2] - v[3]) / (2 * h)])
        torch.testing.assert_close(fd, torch.stack([s.controls[5, 1], s.controls[12, 0]]), rtol=1e-5, atol=1e-10)
        r = s.report(top=4)
        assert r.size == pytest.approx(0.01 * float(u.abs().max()))
        assert all(e.agrees and not e.contact_switch for e in r.entries), r.lines()
        assert r.parameter_checks and all(c.agrees for c in r.parameter_checks)
