"""Calibration through the contact simulator (identify with ContactFit): known
parameters recovered from backdrive-generated data, bad recordings rejected
with typed errors, and a parameter the data cannot determine reported."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from backdrive import InputError
from backdrive._errors import ConfigError, UnknownNameError
from backdrive.contact import ContactGeometry, ContactModel, ContactParameters
from backdrive.data import load
from backdrive.kinematics import forward_kinematics
from backdrive.model import RobotModel
from backdrive.optim import CONTACT_PARAMETERS, ContactFit, SolverOptions, identify
from backdrive.sim import PDActuator, Simulator, State
from _robots import random_targets  # noqa: E402  (shared PD targets)

F64 = torch.float64
DT = 0.002

# A box on four corner spheres with a ram sliding along an inclined axis on
# top: the ram's PD servo shakes the box, whose feet press into the ground
# and slide. Small enough to fit in a few seconds, rich enough to excite the
# masses, the contact stiffness, damping and friction, the motor strength
# and the delay.
SLED = """<robot name="sled">
 <link name="box"><inertial><mass value="2.0"/>
   <inertia ixx="0.01" ixy="0" ixz="0" iyy="0.02" iyz="0" izz="0.025"/></inertial>
  <collision><origin xyz="0.12 0.08 -0.04"/><geometry><sphere radius="0.02"/></geometry></collision>
  <collision><origin xyz="0.12 -0.08 -0.04"/><geometry><sphere radius="0.02"/></geometry></collision>
  <collision><origin xyz="-0.12 0.08 -0.04"/><geometry><sphere radius="0.02"/></geometry></collision>
  <collision><origin xyz="-0.12 -0.08 -0.04"/><geometry><sphere radius="0.02"/></geometry></collision>
 </link>
 <joint name="ram" type="prismatic"><parent link="box"/><child link="slider"/><origin xyz="0 0 0.05"/>
  <axis xyz="0.7071 0 0.7071"/><limit lower="-0.1" upper="0.1" effort="200" velocity="5"/></joint>
 <link name="slider"><inertial><mass value="1.0"/>
   <inertia ixx="0.002" ixy="0" ixz="0" iyy="0.002" iyz="0" izz="0.002"/></inertial></link>
</robot>"""

TRUTH = dict(mass=(2.3, 0.85), stiffness=3e4, damping=400.0, friction=0.55, strength=0.88, delay=2)
GUESS = dict(stiffness=2.4e4, damping=330.0, friction=0.7)
ALL_CHANNELS = ("joint_position", "joint_velocity", "base_orientation", "base_angular_velocity", "base_position",
                "base_linear_velocity")


def sled_sim(robot, stiffness, damping, friction, strength=1.0, kp=300.0, kd=8.0):
    geom = ContactGeometry.from_model(robot)
    cm = ContactModel(robot, geom, params=ContactParameters(stiffness=stiffness, damping=damping, friction=friction))
    return Simulator(robot, DT, actuator=PDActuator(kp=kp * strength, kd=kd * strength), contact=cm)


def delayed(u, d):
    """Commands acting ``d`` steps late (the first ``d`` steps hold ``u[0]``)."""
    return u if d == 0 else torch.cat([u[:, :1].expand(-1, d, -1), u[:, :-d]], 1)


@pytest.fixture(scope="module")
def sled():
    robot = RobotModel.from_urdf(SLED, floating_base=True)
    truth = robot.replace(body_mass=torch.tensor(TRUTH["mass"], dtype=F64))
    sim = sled_sim(truth, TRUTH["stiffness"], TRUTH["damping"], TRUTH["friction"], TRUTH["strength"])
    B, T = 2, 100
    g = torch.Generator().manual_seed(0)
    t = torch.arange(T, dtype=F64) * DT
    freq = 3 + 4 * torch.rand(B, 1, generator=g, dtype=F64)
    u = (0.05 * torch.sin(2 * math.pi * freq * t + 6.28 * torch.rand(B, 1, generator=g, dtype=F64)))[..., None]
    q0 = robot.neutral().expand(B, -1).clone()
    q0[:, 2] = 0.06 - 3e-4
    v0 = torch.zeros(B, robot.nv, dtype=F64)
    v0[:, 0] = torch.tensor([0.5, 0.8], dtype=F64)  # sliding
    traj = sim.rollout(State(q0, v0), delayed(u, TRUTH["delay"]))
    return robot, traj, u


def fit_quiet(*args, **kwargs):
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*torch.jit.script.*")
        return identify(*args, **kwargs)


def rel(a, b):
    return abs(float(a) / float(b) - 1.0)


def test_contact_law_masses_and_friction_are_recovered(sled):
    """Start 15-25 % off on the masses and the contact law, delay and motor
    strength known: every fitted value within 1e-4 of the truth (noise-free
    data from the same simulator), each identified, with tight intervals."""
    robot, traj, u = sled
    start = robot.replace(body_mass=torch.tensor([2.0, 1.0], dtype=F64))
    sim = sled_sim(start, GUESS["stiffness"], GUESS["damping"], GUESS["friction"], TRUTH["strength"])
    fit = fit_quiet(start, traj.q, traj.v, dt=DT,
                    params=("body_mass", "contact_stiffness", "contact_damping", "contact_friction"),
                    method=ContactFit(sim, u, segment=10, observe=ALL_CHANNELS, delays=(TRUTH["delay"],),
                                      jacobian="differences"),
                    options=SolverOptions("gauss_newton", iterations=12, progress=False))
    m = fit.params["body_mass"]
    assert rel(m[0], TRUTH["mass"][0]) < 1e-4 and rel(m[1], TRUTH["mass"][1]) < 1e-4, m
    assert rel(fit.params["contact_stiffness"], TRUTH["stiffness"]) < 1e-4
    assert rel(fit.params["contact_damping"], TRUTH["damping"]) < 1e-4
    assert rel(fit.params["contact_friction"], TRUTH["friction"]) < 1e-4
    assert fit.not_identified == [] and fit.reliable
    # Noise-free data: the interval is only rounding wide, so allow rounding
    # (1e-12 relative) at its ends.
    slack = 1e-12 * TRUTH["friction"]
    assert float(fit.lower["contact_friction"]) - slack <= TRUTH["friction"] <= float(fit.upper["contact_friction"]) + slack
    assert float(fit.upper["contact_friction"]) - float(fit.lower["contact_friction"]) < 1e-3 * TRUTH["friction"]
    assert fit.method == "contact" and fit.delay == TRUTH["delay"]
    # The calibrated simulator reproduces the recording.
    tr = fit.simulator.rollout(State(traj.q[:, 0], traj.v[:, 0]), delayed(u, fit.delay))
    assert float((tr.q - traj.q).abs().max()) < 1e-6
    assert "contact_stiffness" in fit.summary()


def test_motor_strength_and_delay_are_recovered(sled):
    """The delay is found among 0-3 steps by its likelihood-ratio margin, and
    the motor strength (start 1.0, truth 0.88) with it."""
    robot, traj, u = sled
    truth = robot.replace(body_mass=torch.tensor(TRUTH["mass"], dtype=F64))
    sim = sled_sim(truth, TRUTH["stiffness"], TRUTH["damping"], TRUTH["friction"])
    fit = fit_quiet(truth, traj.q, traj.v, dt=DT, params=("motor_strength",),
                    method=ContactFit(sim, u, segment=10, stride=20, observe=ALL_CHANNELS, delays=(0, 1, 2, 3),
                                      delay_iterations=2, jacobian="differences"),
                    options=SolverOptions("gauss_newton", iterations=8, progress=False))
    assert fit.delay == TRUTH["delay"]
    assert rel(fit.params["motor_strength"], TRUTH["strength"]) < 1e-4
    assert "delay" not in fit.not_identified
    assert set(fit.delay_losses) == {0, 1, 2, 3}
    assert min(fit.delay_losses, key=fit.delay_losses.get) == TRUTH["delay"]
    assert fit.delay_losses[1] > 1e6 * fit.delay_losses[2]
    assert "delay (steps)" in fit.summary()


def test_motor_strength_with_both_pd_gains_is_not_identified(sled):
    """Motor strength times kp and times kd is all the motion shows: fitting
    the three together, every one of them is reported as not identified
    (the product is), with a warning, and the fit still matches the data."""
    robot, traj, u = sled
    truth = robot.replace(body_mass=torch.tensor(TRUTH["mass"], dtype=F64))
    sim = sled_sim(truth, TRUTH["stiffness"], TRUTH["damping"], TRUTH["friction"])
    with pytest.warns(UserWarning, match="do not determine"):
        fit = fit_quiet(truth, traj.q[:, :41], traj.v[:, :41], dt=DT, params=("motor_strength", "kp", "kd"),
                        method=ContactFit(sim, u[:, :40], segment=10, observe=ALL_CHANNELS, delays=(TRUTH["delay"],)),
                        options=SolverOptions("gauss_newton", iterations=6, progress=False))
    assert "motor_strength" in fit.not_identified
    assert any(n.startswith("kp[") for n in fit.not_identified)
    assert any(n.startswith("kd[") for n in fit.not_identified)
    assert not fit.identified["motor_strength"]
    assert math.isinf(float(fit.upper["motor_strength"]))
    # The identifiable combination is right: strength * kp = 0.88 * 300.
    kp_eff = float(fit.params["motor_strength"]) * float(fit.params["kp"][0])
    assert abs(kp_eff / (TRUTH["strength"] * 300.0) - 1) < 1e-4
    assert fit.rms_residual < 1e-6


def test_total_mass_anchor_fixes_the_common_force_scale(sled):
    """Masses, motor strength and contact law all start off (the masses by a
    common factor 1.15: the direction the motion barely shows, since every
    force scales with them), seen through the encoder and IMU channels only.
    With the weighed total mass as an anchor every value comes back within
    1e-4; the anchor is one more residual, visible in the loss at the start."""
    robot, traj, u = sled
    start = robot.replace(body_mass=torch.tensor(TRUTH["mass"], dtype=F64) * 1.15)
    sim = sled_sim(start, GUESS["stiffness"], GUESS["damping"], TRUTH["friction"])
    total = sum(TRUTH["mass"])
    params = ("body_mass", "motor_strength", "contact_stiffness", "contact_damping")
    observe = ("joint_position", "joint_velocity", "base_orientation", "base_angular_velocity")

    def run(iterations, **anchor):
        return fit_quiet(start, traj.q[:, :61], traj.v[:, :61], dt=DT, params=params,
                         method=ContactFit(sim, u[:, :60], segment=10, observe=observe, delays=(TRUTH["delay"],),
                                           jacobian="differences", **anchor),
                         options=SolverOptions("gauss_newton", iterations=iterations, progress=False))

    # The anchor's residual at the start: (1.15 total - total) / std, on top of the sensors'.
    free, anchored = run(0), run(0, total_mass=total, total_mass_std=0.01)
    n = 2 * 6 * 10 * 8  # recordings x windows x steps x (2 joint + 6 IMU channels)
    extra = anchored.rms_residual ** 2 * (n + 1) - free.rms_residual ** 2 * n
    assert abs(extra / (0.15 * total / 0.01) ** 2 - 1) < 1e-9
    fit = run(10, total_mass=total)
    m = fit.params["body_mass"]
    assert rel(m[0], TRUTH["mass"][0]) < 1e-4 and rel(m[1], TRUTH["mass"][1]) < 1e-4, m
    assert rel(fit.params["motor_strength"], TRUTH["strength"]) < 1e-4
    assert rel(fit.params["contact_stiffness"], TRUTH["stiffness"]) < 1e-4
    assert rel(fit.params["contact_damping"], TRUTH["damping"]) < 1e-4
    assert fit.not_identified == []


def test_exact_total_mass_holds_under_a_model_mismatch(sled):
    """Data from one contact law, fitted through another (stiffness and
    damping 20 % low, not fitted) with a noise model 30x tighter than the
    default, so the mismatch leaves residuals several noise levels wide, as
    data from another engine or from hardware do (Go1 against MuJoCo: 48.6).
    The soft anchor (one prior residual, 0.1 % of the mass) is outweighed and
    the total drifts by more than 0.5 % (measured -3.9 %); ``total_mass_std=0`` holds it to
    1e-12, and the two masses, whose sum has no variance, get the same
    standard error (one moves exactly as the other moves back)."""
    robot, traj, u = sled
    start = robot.replace(body_mass=torch.tensor(TRUTH["mass"], dtype=F64) * 1.1)
    sim = sled_sim(start, GUESS["stiffness"], GUESS["damping"], GUESS["friction"])
    total = sum(TRUTH["mass"])
    noise = {"joint_position": 3e-5, "joint_velocity": 3e-4, "base_orientation": 3e-5, "base_angular_velocity": 3e-4}

    def run(std):
        return fit_quiet(start, traj.q[:, :21], traj.v[:, :21], dt=DT,
                         params=("body_mass", "motor_strength", "contact_friction"),
                         method=ContactFit(sim, u[:, :20], segment=10, noise=noise, delays=(TRUTH["delay"],),
                                           jacobian="differences", total_mass=total, total_mass_std=std),
                         options=SolverOptions("gauss_newton", iterations=2, progress=False))

    soft, exact = run(None), run(0.0)
    assert soft.rms_residual > 3 and exact.rms_residual > 3  # the mismatch, in noise levels
    assert rel(soft.params["body_mass"].sum(), total) > 5e-3, soft.params["body_mass"]
    m = exact.params["body_mass"]
    assert rel(m.sum(), total) < 1e-12, m
    assert rel(exact.robot.body_mass.sum(), total) < 1e-12
    assert rel(exact.simulator.robot.body_mass.sum(), total) < 1e-12
    assert exact.identified["body_mass"].all()
    s = exact.std["body_mass"]
    assert float(s[0]) > 0 and abs(float(s[0]) / float(s[1]) - 1) < 1e-6, s
    assert "exactly" in exact.summary()
    # The masses moved from their start (the fit is not pinned there).
    assert rel(m[0], m[1] * float(start.body_mass[0] / start.body_mass[1])) > 1e-2


def test_exact_total_mass_with_one_fitted_body(sled):
    """One fitted mass under an exact total is the weighed total less the
    unfitted bodies: no free coordinate, standard error 0, interval [m, m];
    a total below the unfitted bodies' masses is an InputError naming it."""
    robot, traj, u = sled
    sim = sled_sim(robot, 3e4, 400.0, 0.55)

    def run(total, iterations=0):
        return fit_quiet(robot, traj.q[:, :11], traj.v[:, :11], dt=DT, params=("body_mass", "motor_strength"),
                         bodies=["box"], method=ContactFit(sim, u[:, :10], segment=10, total_mass=total,
                                                           total_mass_std=0),
                         options=SolverOptions("gauss_newton", iterations=iterations, progress=False))

    fit = run(3.25)
    slider = float(robot.body_mass[1])
    assert abs(float(fit.params["body_mass"][0]) - (3.25 - slider)) < 1e-12
    assert float(fit.params["body_mass"][1]) == slider
    assert float(fit.std["body_mass"][0]) == 0.0 and bool(fit.identified["body_mass"][0])
    assert float(fit.lower["body_mass"][0]) == float(fit.upper["body_mass"][0]) == float(fit.params["body_mass"][0])
    with pytest.raises(InputError, match=r"total_mass = 0\.9 kg is not more than the 1 kg"):
        run(0.9)


@pytest.fixture(scope="module")
def quadruped():
    robot = load("quadruped", floating_base=True)
    feet = [n for n in robot.link_names if n.endswith("_foot")]
    geom = ContactGeometry.from_model(robot, links=feet)
    qj = torch.tensor([0.0, 0.8, -1.6] * 4, dtype=F64)
    q = robot.neutral()
    q[7:] = qj
    T = forward_kinematics(robot, q)
    q[2] = -min(float(T[robot.frame_index(f), 2, 3]) for f in feet) + 0.02 - 6e-4

    def sim_of(r, friction, strength):
        cm = ContactModel(r, geom, params=ContactParameters(stiffness=4e4, damping=1e3, friction=friction))
        return Simulator(r, DT, actuator=PDActuator(kp=60.0 * strength, kd=1.5 * strength, effort_limit=math.inf),
                         contact=cm)

    B, steps = 2, 60
    u = random_targets(qj, B, steps, seed=3)  # (B, steps, 12)
    masses = robot.body_mass.clone()
    masses[0] = 5.6
    truth = robot.replace(body_mass=masses)
    v0 = torch.zeros(B, robot.nv, dtype=F64)
    v0[:, 0] = 0.15
    traj = sim_of(truth, 0.6, 0.9).rollout(State(q.expand(B, -1), v0), u)
    return robot, traj, u, sim_of


def test_quadruped_trunk_mass_friction_and_motor_strength_from_encoders_and_imu(quadruped):
    """The shipped quadruped, 0.12 s of random PD targets, seen through joint
    encoders and an IMU only: trunk mass (start 5.0, truth 5.6), ground
    friction (0.8 -> 0.6) and motor strength (1.0 -> 0.9) within 1e-3."""
    robot, traj, u, sim_of = quadruped
    fit = fit_quiet(robot, traj.q, traj.v, dt=DT, params=("body_mass", "contact_friction", "motor_strength"),
                    bodies=["trunk"], method=ContactFit(sim_of(robot, 0.8, 1.0), u, segment=10, jacobian="differences"),
                    options=SolverOptions("gauss_newton", iterations=10, progress=False))
    assert rel(fit.params["body_mass"][0], 5.6) < 1e-3
    assert rel(fit.params["contact_friction"], 0.6) < 1e-3
    assert rel(fit.params["motor_strength"], 0.9) < 1e-3
    assert fit.not_identified == []
    # Only the trunk's mass was fitted; the others keep the guess.
    assert torch.equal(fit.params["body_mass"][1:], robot.body_mass[1:])
    # The walking env built from the fit, as docs/simulation.md (*Training in the calibrated sim*) shows.
    from backdrive.envs import QuadrupedWalk

    sim = fit.simulator
    env = QuadrupedWalk(num_envs=2, robot=sim.robot.to(dtype=torch.float32), kp=float(sim.actuator.kp),
                        kd=float(sim.actuator.kd), contact=sim.contact.params, action_delay=fit.delay)
    assert rel(env.robot.body_mass[0], 5.6) < 1e-3 and rel(env.kp, 60.0 * 0.9) < 1e-3
    assert rel(env.contact.params.friction, 0.6) < 1e-3 and env.action_delay == fit.delay
    m = env.evaluate(lambda obs: torch.zeros(obs.shape[0], 12), (0.0, 0.0, 0.0), seconds=0.5, settle=0.2, seed=0)
    assert m["upright"] == 1.0


def test_joint_damping_with_the_contact_law_and_strength(sled):
    """Joint damping (the Go1 calibration's ``"damping"``) through the contact
    route, fitted with the contact friction and the motor strength (which also
    scales the servo's ``kd``, another velocity damping): the ram's damping
    (start 1, truth 4 N s/m) comes back within 1e-4, identified and inside
    its 95 % interval, and the fitted simulator carries it."""
    robot, _, u = sled
    truth = robot.replace(body_mass=torch.tensor(TRUTH["mass"], dtype=F64), damping=torch.tensor([4.0], dtype=F64))
    sim = sled_sim(truth, TRUTH["stiffness"], TRUTH["damping"], TRUTH["friction"], TRUTH["strength"])
    q0 = robot.neutral().expand(2, -1).clone()
    q0[:, 2] = 0.06 - 3e-4
    v0 = torch.zeros(2, robot.nv, dtype=F64)
    v0[:, 0] = torch.tensor([0.5, 0.8], dtype=F64)
    traj = sim.rollout(State(q0, v0), u[:, :60])
    start = truth.replace(damping=torch.tensor([1.0], dtype=F64))
    fit = fit_quiet(start, traj.q, traj.v, dt=DT, params=("damping", "contact_friction", "motor_strength"),
                    method=ContactFit(sled_sim(start, TRUTH["stiffness"], TRUTH["damping"], 0.7), u[:, :60],
                                      segment=10, observe=ALL_CHANNELS, jacobian="differences"),
                    options=SolverOptions("gauss_newton", iterations=8, progress=False))
    assert rel(fit.params["damping"][0], 4.0) < 1e-4, fit.params["damping"]
    assert rel(fit.params["motor_strength"], TRUTH["strength"]) < 1e-4
    assert rel(fit.params["contact_friction"], TRUTH["friction"]) < 1e-4
    assert fit.not_identified == [] and bool(fit.identified["damping"].all())
    lo, hi = float(fit.lower["damping"][0]), float(fit.upper["damping"][0])
    assert lo - 1e-9 <= 4.0 <= hi + 1e-9 and hi - lo < 1e-2
    # The fitted simulator carries the damping (the calibration loop reads it from there).
    assert float(fit.simulator.robot.damping[0]) == float(fit.params["damping"][0])


def test_recording_joint_order_by_name(quadruped):
    """A recording whose joint columns come in another order, named by
    ContactFit.joint_names, gives the same residual as the model's order."""
    robot, traj, u, sim_of = quadruped
    order = list(reversed(robot.joint_names))
    perm = torch.tensor([robot.joint_names.index(n) for n in order])
    q = torch.cat([traj.q[..., :7], traj.q[..., 7:][..., perm]], -1)
    v = torch.cat([traj.v[..., :6], traj.v[..., 6:][..., perm]], -1)
    opts = SolverOptions("gauss_newton", iterations=0, progress=False)
    a = fit_quiet(robot, traj.q[:, :11], traj.v[:, :11], dt=DT, params=("motor_strength",),
                  method=ContactFit(sim_of(robot, 0.6, 1.0), u[:, :10], segment=10, jacobian="differences"),
                  options=opts)
    b = fit_quiet(robot, q[:, :11], v[:, :11], dt=DT, params=("motor_strength",),
                  method=ContactFit(sim_of(robot, 0.6, 1.0), u[:, :10, perm], segment=10, joint_names=tuple(order),
                                    jacobian="differences"),
                  options=opts)
    assert a.rms_residual > 0.01  # motor strength 1 against the data's 0.9: a visible residual
    assert abs(a.rms_residual / b.rms_residual - 1) < 1e-12


# ---------------------------------------------------------------------- bad input


def test_bad_recordings_give_typed_errors(sled):
    robot, traj, u = sled
    sim = sled_sim(robot, 3e4, 400.0, 0.55)
    q, v = traj.q[:, :41].clone(), traj.v[:, :41].clone()
    uu = u[:, :40]
    fit = ContactFit(sim, uu, segment=20)
    opts = SolverOptions("gauss_newton", iterations=1, progress=False)

    bad = q.clone()
    bad[1, 17, 2] = math.nan
    with pytest.raises(InputError, match=r"q has a non-finite value \(recording 1, sample 17\)"):
        identify(robot, bad, v, dt=DT, params=("motor_strength",), method=fit, options=opts)
    bad_u = uu.clone()
    bad_u[0, 3, 0] = math.inf
    with pytest.raises(InputError, match=r"controls has a non-finite value \(recording 0, sample 3\)"):
        identify(robot, q, v, dt=DT, params=("motor_strength",), method=ContactFit(sim, bad_u), options=opts)
    with pytest.raises(InputError, match="q has 41 samples but v has 40"):
        identify(robot, q, v[:, :40], dt=DT, params=("motor_strength",), method=fit, options=opts)
    with pytest.raises(InputError, match="controls must be"):
        identify(robot, q, v, dt=DT, params=("motor_strength",), method=ContactFit(sim, uu[:, :30]), options=opts)
    with pytest.raises(UnknownNameError, match="'rammm'.*closest: 'ram'"):
        identify(robot, q, v, dt=DT, params=("motor_strength",),
                 method=ContactFit(sim, uu, joint_names=("rammm",)), options=opts)
    with pytest.raises(InputError, match="shorter than one window"):
        identify(robot, q[:, :11], v[:, :11], dt=DT, params=("motor_strength",),
                 method=ContactFit(sim, uu[:, :10], segment=20), options=opts)
    with pytest.raises(InputError, match="tau is not used"):
        identify(robot, q, v, dt=DT, tau=uu, params=("motor_strength",), method=fit, options=opts)
    with pytest.raises(InputError, match="dt"):
        identify(robot, q, v, dt=0.001, params=("motor_strength",), method=fit, options=opts)
    # A total-mass anchor needs fitted masses.
    with pytest.raises(InputError, match="total_mass anchors the fitted masses.*'body_mass'"):
        identify(robot, q, v, dt=DT, params=("motor_strength",), method=ContactFit(sim, uu, total_mass=3.0),
                 options=opts)
    # Contact parameters need the contact route.
    with pytest.raises(InputError, match="need method=ContactFit"):
        identify(robot, q, v, dt=DT, params=("contact_friction",), method="simulation")
    # The other routes reject NaN samples too.
    with pytest.raises(InputError, match=r"q has a non-finite value \(recording 1, sample 17\)"):
        identify(robot, bad, v, dt=DT, tau=torch.zeros(2, 40, robot.nv, dtype=F64))


def test_contact_fit_settings_are_checked(sled):
    robot, traj, u = sled
    sim = sled_sim(robot, 3e4, 400.0, 0.55)
    with pytest.raises(ConfigError, match="Simulator with contact"):
        ContactFit(Simulator(robot, DT), u)
    with pytest.raises(ConfigError, match="delays"):
        ContactFit(sim, u, delays=(0, -1))
    with pytest.raises(ConfigError, match="observe"):
        ContactFit(sim, u, observe=("lidar",))
    with pytest.raises(ConfigError, match="noise"):
        ContactFit(sim, u, noise={"joint_position": -1.0})
    with pytest.raises(ConfigError, match="jacobian"):
        ContactFit(sim, u, jacobian="magic")
    for bad in (-1.0, 0.0, math.nan, math.inf, True, "12 kg"):
        with pytest.raises(ConfigError, match="total_mass must be a positive number of kg"):
            ContactFit(sim, u, total_mass=bad)
    for bad in (-0.1, math.nan, math.inf, True, "1 g"):
        with pytest.raises(ConfigError, match="total_mass_std must be a positive number of kg, 0"):
            ContactFit(sim, u, total_mass=3.0, total_mass_std=bad)
    assert ContactFit(sim, u, total_mass=3.0, total_mass_std=0).total_mass_std == 0  # an exact total
    with pytest.raises(ConfigError, match="total_mass_std is given without total_mass"):
        ContactFit(sim, u, total_mass_std=0.1)
    for bad in (0, -2, 1.5, True, "8"):
        with pytest.raises(ConfigError, match="select_windows must be a positive number of windows or None"):
            ContactFit(sim, u, select_windows=bad)
    # kp/kd are PD gains: a torque-controlled simulator has none.
    from backdrive.sim import TorqueActuator

    tsim = sim.replace(actuator=TorqueActuator())
    with pytest.raises(InputError, match="PDActuator"):
        identify(robot, traj.q[:, :41], traj.v[:, :41], dt=DT, params=("kp",),
                 method=ContactFit(tsim, u[:, :40]), options=SolverOptions("gauss_newton", iterations=1))
    assert set(CONTACT_PARAMETERS) >= {"contact_stiffness", "contact_damping", "contact_friction", "motor_strength"}


def test_select_windows_fits_the_windows_whose_guess_switches_contact_least(sled):
    """``select_windows=n``: the fit uses the ``n`` windows whose rollout at
    the starting guess from the recorded start has the fewest contact
    switches (counted here independently, ties to the earlier window), and
    it is the same fit as on recordings cut to exactly those windows, each
    with the commands sent before it as its history."""
    robot, traj, u = sled
    start = robot.replace(body_mass=torch.tensor([2.0, 1.0], dtype=F64))
    sim = sled_sim(start, GUESS["stiffness"], GUESS["damping"], GUESS["friction"], TRUTH["strength"])
    K, d = 10, TRUTH["delay"]
    B, T = u.shape[0], u.shape[1]
    cut = [(b, s) for b in range(B) for s in range(0, T - K + 1, K)]  # recording-major, as identify cuts them
    steps = torch.arange(K)
    sent = torch.stack([u[b, (s + steps - d).clamp_min(0)] for b, s in cut])
    q0 = torch.stack([traj.q[b, s] for b, s in cut])
    v0 = torch.stack([traj.v[b, s] for b, s in cut])
    with torch.no_grad():
        inside = sim.rollout(State(q0, v0), sent, contact_record=("penetration",)).contact.penetration > 0
    switches = (inside[:, 1:] != inside[:, :-1]).flatten(1).sum(1)
    n = int((switches == 0).sum())  # every window whose guess keeps its contacts
    assert 0 < n < len(cut)  # a real choice
    chosen = sorted(sorted(range(len(cut)), key=lambda w: int(switches[w]))[:n])
    assert any(int(switches[w]) > 0 for w in set(range(len(cut))) - set(chosen))
    params = ("body_mass", "contact_stiffness", "contact_damping", "contact_friction")
    options = SolverOptions("gauss_newton", iterations=3, progress=False)
    fit = fit_quiet(start, traj.q, traj.v, dt=DT, params=params, options=options,
                    method=ContactFit(sim, u, segment=K, observe=ALL_CHANNELS, delays=(d,), jacobian="differences",
                                      select_windows=n))
    assert f"{n} of {len(cut)} windows used (the fewest contact switches at the starting guess)" in fit.message
    pick = [cut[w] for w in chosen]
    qs = torch.stack([traj.q[b, s:s + K + 1] for b, s in pick])
    vs = torch.stack([traj.v[b, s:s + K + 1] for b, s in pick])
    us = torch.stack([u[b, s:s + K] for b, s in pick])
    hist = torch.stack([u[b, (s - d + torch.arange(d)).clamp_min(0)] for b, s in pick])
    same = fit_quiet(start, qs, vs, dt=DT, params=params, options=options,
                     method=ContactFit(sim, us, segment=K, observe=ALL_CHANNELS, delays=(d,),
                                       jacobian="differences", history=hist))
    for name in params:
        assert torch.allclose(fit.params[name], same.params[name], rtol=1e-10, atol=0), name
    # Asking for as many windows as there are (or more) uses them all.
    every = fit_quiet(start, traj.q, traj.v, dt=DT, params=params, options=options,
                      method=ContactFit(sim, u, segment=K, observe=ALL_CHANNELS, delays=(d,), jacobian="differences",
                                        select_windows=len(cut) + 5))
    assert "windows used" not in every.message


def test_a_positive_parameter_with_a_huge_interval_is_not_identified():
    """An entry the Jacobian does not leave exactly free but whose standard
    error exceeds half its value (a mass fitted to 1e-11 kg with the
    interval [1e-316, 1e292], as measured against MuJoCo) is reported as
    not identified, with the interval [0, inf]; a tight one stays."""
    from backdrive.optim._sysid_contact import _flag_weak

    out = {"body_mass": torch.tensor([4.0, 1e-11], dtype=F64), "contact_friction": torch.tensor(0.8, dtype=F64)}
    stats = {"std": {"body_mass": torch.tensor([0.1, 1e-9], dtype=F64),
                     "contact_friction": torch.tensor(0.5, dtype=F64)},
             "identified": {k: torch.ones_like(v, dtype=torch.bool) for k, v in out.items()},
             "lower": {k: v.clone() for k, v in out.items()}, "upper": {k: v.clone() for k, v in out.items()},
             "not_identified": []}
    labels = [("body_mass", (0,), "body_mass[trunk]"), ("body_mass", (1,), "body_mass[leg]"),
              ("contact_friction", (), "contact_friction")]
    _flag_weak(stats, labels, out, ("body_mass", "contact_friction"))
    assert stats["not_identified"] == ["body_mass[leg]", "contact_friction"]
    assert stats["identified"]["body_mass"].tolist() == [True, False]
    assert not bool(stats["identified"]["contact_friction"])
    assert math.isinf(float(stats["upper"]["body_mass"][1])) and float(stats["lower"]["body_mass"][1]) == 0.0
    assert float(stats["upper"]["body_mass"][0]) == 4.0  # untouched
