"""Contact gradients: float64 gradcheck of one step in every regime, rollouts vs finite differences."""

from __future__ import annotations

import math

import pytest
import torch

from backdrive.contact import ContactModel, ContactParameters, GroundPlane, contact_step

from _robots import box_robot, sphere_robot, state

G = 9.81
DT = 1e-3


def _step_fn(robot, scheme, base_params, keys):
    """``(q, v, *params) -> (q1, v1)`` with the named parameters as inputs."""

    def f(q, v, *values):
        params = base_params.replace(**dict(zip(keys, values)))
        cm = ContactModel(robot, params=params)
        q1, v1, res = contact_step(robot, cm, q, v, torch.zeros_like(v), DT, scheme=scheme)
        return q1, v1, res.normal_force, res.friction_force

    return f


def _box_state(robot, lateral, vz=0.0, lift=0.0):
    k = 4e4
    z = 0.1 - G / (4 * k) + lift
    return state(robot, (0.0, 0.0, z), lin=(lateral, 0.3 * lateral, vz), ang=(0.0, 0.0, 0.002))


REGIMES = {
    # slip far below the stiction width: the friction acts as a stiff damper
    "sticking": dict(lateral=1e-3),
    # slip far above it: Coulomb sliding
    "sliding": dict(lateral=1.0),
    # slip at the stiction width (and near the one-step stopping speed)
    "stick_slip": dict(lateral=0.01),
    # corners just reaching the ground, approaching
    "touch_down": dict(lateral=0.5, vz=-0.3, lift=0.9 * G / (4 * 4e4) + 5e-5),
    # corners leaving the ground, still pressed (normal force positive)
    "lift_off": dict(lateral=0.5, vz=0.004, lift=0.9 * G / (4 * 4e4)),
}


@pytest.mark.parametrize("scheme", ["implicit", "explicit"])
@pytest.mark.parametrize("regime", list(REGIMES))
def test_gradcheck_one_step_in_each_regime(regime, scheme):
    robot = box_robot()
    params = ContactParameters(stiffness=4e4, damping=100.0, friction=0.6, stiction_width=0.01, normal_width=1e-4)
    q, v = _box_state(robot, **REGIMES[regime])
    f = _step_fn(robot, scheme, params, ("stiffness", "friction", "stiction_width", "damping"))
    cm = ContactModel(robot, params=params)
    res = cm.forces(robot, q, v)
    bottom = res.penetration > -0.05  # the four lower corners
    assert int(bottom.sum()) == 4
    res = type(res)(**{k: getattr(res, k)[bottom] for k in ("point", "normal", "penetration", "normal_velocity", "slip_velocity", "normal_force", "friction_force", "force", "jacobian", "_c_n", "_k_n", "_mu_fn_over_s", "_s", "_mu")}, f_ext=res.f_ext)
    slip = res.slip_velocity.norm(dim=-1)
    # the state is in the regime it claims
    if regime == "sticking":
        assert float(slip.max()) < 0.3 * 0.01 and float(res.normal_force.min()) > 0
    elif regime == "sliding":
        assert float(slip.min()) > 50 * 0.01
    elif regime == "stick_slip":
        assert 0.3 * 0.01 < float(slip.max()) < 3 * 0.01
    elif regime == "touch_down":
        assert float(res.penetration.max()) < 3e-4 and float(res.normal_velocity.max()) < 0
        assert float(res.normal_force.max()) > 0
    else:
        assert float(res.normal_velocity.min()) > 0 and float(res.normal_force.min()) > 0
    inputs = (
        q.clone().requires_grad_(),
        v.clone().requires_grad_(),
        torch.tensor(4e4, dtype=torch.float64, requires_grad=True),
        torch.tensor(0.6, dtype=torch.float64, requires_grad=True),
        torch.tensor(0.01, dtype=torch.float64, requires_grad=True),
        torch.tensor(100.0, dtype=torch.float64, requires_grad=True),
    )
    assert torch.autograd.gradcheck(f, inputs, eps=1e-7, atol=1e-6, rtol=1e-5)


def test_gradcheck_sphere_per_shape_parameters_on_heightfield():
    from backdrive.contact import Heightfield

    robot = sphere_robot()
    H = torch.tensor([[0.0, 0.01, 0.0], [0.02, 0.0, -0.01], [0.0, 0.01, 0.03]], dtype=torch.float64)

    def f(q, v, H, mu):
        cm = ContactModel(
            robot,
            terrain=Heightfield(H, spacing=0.5),
            params=ContactParameters(stiffness=1e4, damping=50.0, friction=mu, stiction_width=0.01),
        )
        q1, v1, _ = contact_step(robot, cm, q, v, torch.zeros_like(v), DT)
        return q1, v1

    q, v = state(robot, (0.11, -0.07, 0.1 + 0.003), lin=(0.4, 0.1, -0.2), ang=(1.0, -2.0, 0.5))
    inputs = (q.requires_grad_(), v.requires_grad_(), H.requires_grad_(), torch.tensor([0.5], dtype=torch.float64, requires_grad=True))
    assert torch.autograd.gradcheck(f, inputs, eps=1e-7, atol=1e-6, rtol=1e-5)


def _rollout_loss(robot, cm_of, q0, v0, steps, scheme="implicit"):
    def loss(vx, mu, k):
        cm = cm_of(mu, k)
        v = v0.clone()
        v = torch.cat([vx.reshape(1), v[1:]])
        q = q0
        for _ in range(steps):
            q, v, _ = contact_step(robot, cm, q, v, torch.zeros_like(v), DT, scheme=scheme)
        return q[:3].sum() + 0.1 * v[:3].sum()

    return loss


@pytest.mark.parametrize("scheme", ["implicit", "explicit"])
def test_rollout_gradient_matches_central_differences(scheme):
    """40 steps: a tilted box lands (touch-down), slides, its friction decelerates it."""
    robot = box_robot()
    q0, v0 = state(robot, (0.0, 0.0, 0.1135), quat=(math.cos(0.05), 0.0, math.sin(0.05), 0.0), lin=(0.8, 0.1, -0.3))

    def cm_of(mu, k):
        return ContactModel(robot, params=ContactParameters(stiffness=k, damping=300.0, friction=mu, stiction_width=0.01))

    loss = _rollout_loss(robot, cm_of, q0, v0, 40, scheme)
    x = [torch.tensor(v, dtype=torch.float64, requires_grad=True) for v in (0.8, 0.6, 2e4)]
    L = loss(*x)
    grads = torch.autograd.grad(L, x)
    # the box starts in the air, then touches down and slides
    cm = cm_of(torch.tensor(0.6, dtype=torch.float64), torch.tensor(2e4, dtype=torch.float64))
    with torch.no_grad():
        assert float(cm.forces(robot, q0, v0).penetration.max()) < 0
        q, v = q0, v0
        touching = 0
        for _ in range(40):
            q, v, res = contact_step(robot, cm, q, v, torch.zeros_like(v), DT, scheme=scheme)
            on = res.normal_force > 1.0
            touching += int(on.any())
        assert touching >= 10
        assert float(res.slip_velocity.norm(dim=-1)[on].min()) > 0.1
    for i, (xi, h) in enumerate(zip(x, (1e-5, 1e-5, 1e-1))):
        with torch.no_grad():
            xp = [t.detach().clone() for t in x]
            xm = [t.detach().clone() for t in x]
            xp[i] += h
            xm[i] -= h
            fd = (loss(*xp) - loss(*xm)) / (2 * h)
        assert float(grads[i]) == pytest.approx(float(fd), rel=1e-6, abs=1e-10), i


def test_stopping_distance_gradient_matches_closed_form_through_the_simulator():
    """d x_stop / d mu = -v0^2 / (2 mu^2 g) for Coulomb friction (small stiction width)."""
    from backdrive.sim import Simulator

    robot = box_robot()
    mu0 = 0.8
    mu = torch.tensor(mu0, dtype=torch.float64, requires_grad=True)
    k = 4e4
    cm = ContactModel(robot, params=ContactParameters(stiffness=k, damping=400.0, friction=mu, stiction_width=1e-3, normal_width=1e-6))
    sim = Simulator(robot, DT, contact=cm)
    v0 = 2.0  # stops after v0 / (mu g) = 0.255 s
    q0, vel0 = state(robot, (0.0, 0.0, 0.1 - G / (4 * k)), lin=(v0, 0.0, 0.0))
    traj = sim.rollout(sim.initial_state(q0, vel0), sim.zero_controls(300))
    (g,) = torch.autograd.grad(traj.q[-1, 0], mu)
    assert float(traj.contact.normal_force[-1].sum().detach()) == pytest.approx(G, rel=1e-3)
    assert float(g) == pytest.approx(-v0 * v0 / (2 * mu0 * mu0 * G), rel=0.01)


# ---------------------------------------------------------------- whole rollouts through the Simulator


def _loss(traj):
    """A loss on the final state and, lightly, on every state: ``(...,)``."""
    q, v = traj.q, traj.v
    return q[..., -1, :].sum(-1) + 0.1 * v[..., -1, :].sum(-1) + 0.01 * q[..., 1:, :].sum((-1, -2))


def per_step_gradient_check(sim, q0, v0, controls, h):
    """The control gradient of :func:`_loss` by autograd and by central differences.

    Every control entry of every step is perturbed by ``+-h`` in one batched
    rollout (``2 T nu`` samples). Returns the trajectory, the autograd
    gradient ``(T, nu)``, the finite-difference one, the per-step relative
    error ``|G_t - FD_t| / |FD_t|`` ``(T,)`` and the cosine of the whole
    gradients.
    """
    T, nu = controls.shape
    U = controls.clone().requires_grad_()
    traj = sim.rollout(sim.initial_state(q0, v0), U)
    (G,) = torch.autograd.grad(_loss(traj), U)
    E = torch.eye(T * nu, dtype=controls.dtype).reshape(T * nu, T, nu)
    with torch.no_grad():
        L = _loss(sim.rollout(sim.initial_state(q0, v0), torch.cat([controls + h * E, controls - h * E])))
    FD = ((L[: T * nu] - L[T * nu :]) / (2 * h)).reshape(T, nu)
    rel = (G - FD).norm(dim=-1) / FD.norm(dim=-1)
    cos = float((G * FD).sum() / (G.norm() * FD.norm()))
    return traj, G, FD, rel, cos


def _regimes(contact, width):
    """``(steps with a loaded contact, sliding contact-steps, sticking contact-steps)``."""
    on = contact.normal_force.detach() > 1.0
    slip = contact.slip_velocity.detach().norm(dim=-1)
    return int(on.any(-1).sum()), int((on & (slip > 10 * width)).sum()), int((on & (slip < 0.3 * width)).sum())


def _hopper_sim(params=None, dtype=torch.float64):
    from backdrive.sim import PDActuator, Simulator

    from _robots import hopper_robot

    robot = hopper_robot(dtype)
    params = ContactParameters(stiffness=2e4, damping=1e3, friction=0.8, stiction_width=0.01) if params is None else params
    cm = ContactModel(robot, params=params)
    return Simulator(robot, DT, actuator=PDActuator(kp=300.0, kd=10.0, joints=["hip", "knee"]), contact=cm)


def _hopper_landing(robot, drop=0.003, vx=0.8, hip=-0.4, knee=0.8):
    """The hopper 3 mm above the ground with a bent knee, moving forward at ``vx`` and down at 0.3 m/s."""
    foot = 0.05 + 0.4 * math.cos(hip) + 0.4 * math.cos(hip + knee) + 0.04
    q0 = torch.tensor([0.0, foot + drop, 0.0, hip, knee], dtype=robot.dtype)
    v0 = torch.tensor([vx, -0.3, 0.0, 0.0, 0.0], dtype=robot.dtype)
    return q0, v0, torch.tensor([hip, knee], dtype=robot.dtype)


def test_hopper_rollout_gradient_per_step_and_cosine_over_100_steps():
    """The planar hopper lands sliding at 0.8 m/s, its foot sticks within 10 ms
    and it keeps pivoting on it: every step's control gradient matches
    central differences to 1e-6 and the whole gradient's cosine is >= 0.9999."""
    sim = _hopper_sim()
    q0, v0, pose = _hopper_landing(sim.robot)
    traj, G, FD, rel, cos = per_step_gradient_check(sim, q0, v0, pose.expand(100, 2), h=1e-5)
    in_contact, sliding, sticking = _regimes(traj.contact, 0.01)
    assert in_contact >= 80 and sliding >= 2 and sticking >= 32
    assert float(traj.contact.normal_force[0].detach().max()) < 1e-3  # it starts in the air (touch-down inside)
    assert float(FD.norm(dim=-1).min()) > 1e-4  # every step's control matters
    assert float(rel.max()) <= 1e-6, rel
    assert cos >= 0.9999


def test_hopper_stick_slip_transition_parameter_gradients():
    """40 steps across the slip-to-stick transition of the landing foot: the
    gradients with respect to friction, stiction width, stiffness, damping
    and the landing speed match central differences to a relative 1e-5."""
    robot = _hopper_sim().robot
    q0, v0, pose = _hopper_landing(robot)
    steps = 40

    def run(mu, width, k, d, vx):
        sim = _hopper_sim(ContactParameters(stiffness=k, damping=d, friction=mu, stiction_width=width))
        v = torch.cat([vx.reshape(1), v0[1:]])
        traj = sim.rollout(sim.initial_state(q0, v), pose.expand(steps, 2))
        return _loss(traj), traj

    x0 = (0.8, 0.01, 2e4, 1e3, 0.8)
    x = [torch.tensor(val, dtype=torch.float64, requires_grad=True) for val in x0]
    L, traj = run(*x)
    grads = torch.autograd.grad(L, x)
    # the foot slides at touch-down and sticks before the end: the slip crosses the stiction width
    slip = traj.contact.slip_velocity[:, 1].detach().norm(dim=-1)
    on = traj.contact.normal_force[:, 1].detach() > 1.0
    first = int(torch.nonzero(on)[0, 0])
    assert float(slip[first]) > 10 * 0.01 and float(slip[-1]) < 0.3 * 0.01 and bool(on[first:].all())
    crossing = int(torch.nonzero(slip < 0.01)[0, 0])
    assert first < crossing < steps - 10
    for i in range(len(x0)):
        h = 1e-5 * x0[i]  # relative steps: smaller ones lose to rounding (measured)
        with torch.no_grad():
            xp = [t.detach().clone() for t in x]
            xm = [t.detach().clone() for t in x]
            xp[i] += h
            xm[i] -= h
            fd = (run(*xp)[0] - run(*xm)[0]) / (2 * h)
        # 2.2e-6 measured on one parameter after a rounding-level change to the forward kinematics.
        assert abs(float(grads[i]) - float(fd)) <= 1e-5 * abs(float(fd)), (i, float(grads[i]), float(fd))


def _quadruped_landing(dtype=torch.float64):
    from backdrive.contact import ContactGeometry
    from backdrive.data import load
    from backdrive.sim import PDActuator, Simulator

    robot = load("quadruped", floating_base=True, dtype=dtype)
    feet = [n for n in robot.link_names if n.endswith("_foot")]
    cm = ContactModel(robot, ContactGeometry.from_model(robot, links=feet))
    sim = Simulator(robot, 2e-3, actuator=PDActuator(kp=200.0, kd=6.0), contact=cm)
    qj = torch.tensor([0.0, 0.7, -1.4] * 4, dtype=dtype)
    q0 = robot.neutral()
    q0[7:] = qj
    q0 = cm.place_on_terrain(robot, q0, clearance=0.002)  # the feet 2 mm above the ground
    v0 = torch.zeros(robot.nv, dtype=dtype)
    v0[0], v0[4] = 0.3, 0.3  # drifting forward and pitching: the feet land one pair first, sliding
    return sim, q0, v0, qj


@pytest.mark.slow
def test_quadruped_rollout_gradient_per_step_and_cosine_over_100_steps():
    """100 steps of 2 ms: the shipped quadruped lands drifting forward under PD,
    feet slide, then stick. Every step's gradient with respect to the 12 PD
    targets matches central differences (2,400 perturbed rollouts) to 1e-6,
    and the cosine of the whole gradient is >= 0.9999."""
    sim, q0, v0, qj = _quadruped_landing()
    traj, G, FD, rel, cos = per_step_gradient_check(sim, q0, v0, qj.expand(100, 12), h=1e-6)
    in_contact, sliding, sticking = _regimes(traj.contact, 0.01)
    assert in_contact >= 90 and sliding >= 20 and sticking >= 100
    assert float(rel.max()) <= 1e-6, rel
    assert cos >= 0.9999


def test_quadruped_float32_rollout_gradient_stays_close_to_float64():
    """The same landing in float32 (32 steps): its control gradient keeps a
    cosine above 0.9999 with float64's and a relative error below 1e-3
    (MJX's float32 gradient of a standing quadruped was 3.8x off here)."""
    out = {}
    for dtype in (torch.float64, torch.float32):
        sim, q0, v0, qj = _quadruped_landing(dtype)
        U = qj.expand(32, 12).clone().requires_grad_()
        (out[dtype],) = torch.autograd.grad(_loss(sim.rollout(sim.initial_state(q0, v0), U)), U)
    g64, g32 = out[torch.float64], out[torch.float32].double()
    rel = float((g32 - g64).norm() / g64.norm())
    cos = float((g32 * g64).sum() / (g32.norm() * g64.norm()))
    assert rel < 1e-3 and cos > 0.9999, (rel, cos)
