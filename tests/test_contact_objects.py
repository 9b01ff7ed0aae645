"""Free objects to push (``contact/_scene.py``): a robot and rigid bodies in one implicit step."""

from __future__ import annotations

import math

import pytest
import torch

from backdrive import InputError, InvalidValueError, RobotModel, UnknownNameError
from backdrive.contact import ContactGeometry, ContactModel, ContactParameters, GroundPlane, Scene, free_body, restitution
from backdrive.contact._scene import _solid_inertia

torch.set_num_threads(1)
F64 = torch.float64
G = 9.81

PUSHER = """<?xml version="1.0"?>
<robot name="pusher">
  <link name="world_base"/>
  <joint name="slide" type="prismatic"><parent link="world_base"/><child link="finger"/>
    <origin xyz="0 0 0.1"/><axis xyz="1 0 0"/><limit lower="-2" upper="2" effort="1000" velocity="10"/></joint>
  <link name="finger"><inertial><mass value="1"/><inertia ixx="0.001" iyy="0.001" izz="0.001" ixy="0" ixz="0" iyz="0"/></inertial>
    <collision><geometry><sphere radius="0.05"/></geometry></collision></link>
</robot>"""


def t(*x):
    return torch.tensor(x[0] if len(x) == 1 else x, dtype=F64)


def test_free_body_inertia_and_bad_objects():
    box = free_body("crate", "box", (0.2, 0.4, 0.6), 3.0)
    assert box.floating_base and box.nq == 7 and box.nv == 6 and box.link_names[0] == "crate"
    assert float(box.total_mass) == pytest.approx(3.0)
    assert _solid_inertia("box", (0.2, 0.4, 0.6), 3.0) == pytest.approx((0.13, 0.1, 0.05))
    assert _solid_inertia("sphere", (0.1,), 2.0) == pytest.approx((0.008,) * 3)
    # a capsule of zero length is a sphere; of zero radius a rod m h^2 / 12
    assert _solid_inertia("capsule", (0.1, 1e-12), 2.0) == pytest.approx((0.008,) * 3)
    assert _solid_inertia("capsule", (1e-9, 1.0), 1.2)[0] == pytest.approx(0.1, rel=1e-6)
    with pytest.raises(InvalidValueError, match="object 'crate' has unknown kind 'cone'.*box, sphere, capsule"):
        free_body("crate", "cone", (0.1,), 1.0)
    with pytest.raises(InvalidValueError, match="object 'ball' \\(sphere\\) needs 1 size"):
        free_body("ball", "sphere", (0.1, 0.2), 1.0)
    with pytest.raises(InvalidValueError, match="object 'ball' \\(sphere\\) must have finite positive sizes"):
        free_body("ball", "sphere", (-0.1,), 1.0)
    with pytest.raises(InvalidValueError, match="object 'ball' must have a finite positive mass"):
        free_body("ball", "sphere", (0.1,), float("nan"))


def test_scene_errors_name_the_link_pair_or_state():
    pusher = RobotModel.from_urdf(PUSHER)
    box = free_body("box", "box", (0.2, 0.2, 0.2), 1.0)
    robot_c = ContactModel(pusher, terrain=GroundPlane(height=-1.0))
    with pytest.raises(InputError, match="link 'box' is in system 1.*and in system 2"):
        Scene([(pusher, robot_c), (box, None), (free_body("box", "sphere", (0.1,), 1.0), None)])
    with pytest.raises(UnknownNameError, match="'fingr'"):
        Scene([(pusher, robot_c), (box, None)], exclude=[("fingr", "box")])
    with pytest.raises(InvalidValueError, match="stiffness.*'finger/box'"):
        Scene([(pusher, robot_c), (box, None)], params=ContactParameters(stiffness=torch.tensor([-1.0], dtype=F64)))
    with pytest.raises(InputError, match="contact must be a ContactModel"):
        Scene([(pusher, "ground")])
    with pytest.raises(InputError, match="was built for robot"):
        Scene([(pusher, Scene.object_contact(box))])
    scene = Scene([(pusher, robot_c), (box, Scene.object_contact(box))])
    assert scene.pair_labels == (("finger", "box"),) and scene.nq == 8 and scene.nv == 7
    with pytest.raises(InputError, match=r"scene q must have shape \(\.\.\., 8\)"):
        scene.step(torch.zeros(7, dtype=F64), torch.zeros(7, dtype=F64), torch.zeros(7, dtype=F64), 1e-3)
    with pytest.raises(InputError, match="dt > 0"):
        scene.step(torch.zeros(8, dtype=F64), torch.zeros(7, dtype=F64), torch.zeros(7, dtype=F64), 0.0)


def push_scene(mu=0.5, k=1e4, stiction=1e-3):
    pusher = RobotModel.from_urdf(PUSHER)
    box = free_body("box", "box", (0.2, 0.2, 0.2), 1.0)
    P = ContactParameters(stiffness=k, damping=200.0, friction=mu, stiction_width=stiction, normal_width=1e-6)
    # the finger has no ground contact (its ground is far below); the box sits
    # on z = 0. A smooth finger (no friction against the box): with friction
    # its contact point creeps down the face at the stiction width while the
    # box settles into its pitch, and lifts the box by up to 4 % of its weight.
    scene = Scene(
        [(pusher, ContactModel(pusher, terrain=GroundPlane(height=-1.0))), (box, Scene.object_contact(box, params=P))],
        params=P.replace(friction=0.0),
    )
    qb = box.neutral()
    qb[0], qb[2] = 0.2, 0.1 - G / (8 * P.stiffness)  # 8 corners carry it
    q, v = scene.initial((torch.tensor([0.045], dtype=F64), torch.zeros(1, dtype=F64)), (qb, torch.zeros(6, dtype=F64)))
    return scene, q, v


def velocity_servo(v_cmd, push_time, dt, kd=500.0, ramp=0.05):
    """The finger tracks ``v_cmd`` until ``push_time``, then slows to rest over
    ``ramp`` seconds (faster than friction slows the box: it separates)
    (damping implicit)."""

    def controller(step, q, v):
        target = v_cmd * min(max((push_time + ramp - step * dt) / ramp, 0.0), 1.0)
        tau = torch.zeros_like(v)
        tau = torch.cat([(kd * (target - v[..., :1])), tau[..., 1:]], -1)
        damp = torch.zeros_like(v)
        damp = torch.cat([torch.full_like(v[..., :1], kd), damp[..., 1:]], -1)
        return tau, damp

    return controller


def test_pushed_box_slides_at_mu_m_g_and_stops_as_mu_g_predicts():
    mu, dt = 0.5, 1e-3
    scene, q, v = push_scene(mu)
    qs, vs, res = scene.rollout(q, v, 450, dt, velocity_servo(t(0.5), 0.25, dt))
    fn = torch.stack([r.pairs.normal_force[0] for r in res])
    box_x, box_v = qs[:, 1], vs[:, 1]  # box x and its (base-frame) forward speed, the box does not turn
    # while pushed at a steady 0.5 m/s the finger carries the sliding friction mu m g
    steady = slice(150, 240)
    assert torch.allclose(box_v[steady], torch.full_like(box_v[steady], 0.5), atol=0.02)
    assert float(fn[steady].mean()) == pytest.approx(mu * G, rel=0.01)
    # the finger slows at 10 m/s^2, the box at mu g = 4.9 m/s^2: they part and
    # the box slides on: x_stop - x_sep = v_sep^2 / (2 mu g)
    pen = torch.stack([r.pairs.penetration[0] for r in res])
    sep = int(torch.nonzero(pen[250:] < 0)[0]) + 250
    assert float(pen[sep:].max()) < 0  # for good
    x_sep, v_sep = float(box_x[sep]), float(box_v[sep])
    assert v_sep > 0.35
    slide = v_sep**2 / (2 * mu * G)
    # semi-implicit Euler stops v_sep dt / 2 short; the stiction width creeps a little further
    assert float(box_x[-1]) - x_sep == pytest.approx(slide - v_sep * dt / 2, abs=5e-4)
    assert abs(float(box_v[-1])) < 2e-3
    # it never tipped or turned: while pushed it pitches by the friction's
    # moment on the corner springs, mu m g (0.1 m) / (4 k (0.1 m)^2) = 1.2 mrad
    # (twice that at the onset of the push, an undamped step response)
    pitch = 2 * qs[:, 6]
    assert float(pitch[steady].mean()) == pytest.approx(mu * G * 0.1 / (4 * 1e4 * 0.01), rel=0.05)
    assert float(pitch.abs().max()) < 3e-3
    assert torch.allclose(qs[:, [5, 7]], torch.zeros(451, 2, dtype=F64), atol=1e-12)


@pytest.mark.parametrize("unilateral", [False, True])
def test_head_on_spheres_exchange_momentum_with_the_spring_damper_restitution(unilateral):
    # Two free spheres (no gravity, no ground): 1 kg at 1 m/s hits 2 kg at rest.
    # A linear spring-damper (clamp_normal=False). With adhesion (unilateral
    # False) the force turns negative at the end of the contact, as in the
    # textbook closed form e = exp(-zeta pi / sqrt(1 - zeta^2)) over pi / omega_d.
    # Without (the default) the contact ends where k x + c x' = 0, at
    # omega_d t_c = pi - atan(2 beta omega_d / (omega_d^2 - beta^2)), beta = c / (2 m_red),
    # and e = exp(-beta t_c) (Schwager & Poeschel, Granular Matter 2008): 0.572 here.
    k, zeta = 1e4, 0.2
    m1, m2 = 1.0, 2.0
    m_red = m1 * m2 / (m1 + m2)
    P = ContactParameters(
        stiffness=k, damping=2 * zeta * math.sqrt(k * m_red), friction=0.3, normal_width=1e-8, clamp_normal=False
    )
    a, b = free_body("a", "sphere", (0.05,), m1), free_body("b", "sphere", (0.05,), m2)
    scene = Scene([(a, None), (b, None)], params=P, unilateral=unilateral)
    qa, qb = a.neutral(), b.neutral()
    qb[0] = 0.1 + 1e-4
    va = torch.zeros(6, dtype=F64)
    va[0] = 1.0
    q, v = scene.initial((qa, va), (qb, torch.zeros(6, dtype=F64)))
    dt = 5e-5
    qs, vs, res = scene.rollout(q, v, 700, dt, gravity=torch.zeros(3, dtype=F64))
    omega = math.sqrt(k / m_red)
    omega_d = omega * math.sqrt(1 - zeta**2)
    if unilateral:
        beta = zeta * omega
        t_c = (math.pi - math.atan(2 * beta * omega_d / (omega_d**2 - beta**2))) / omega_d
        e = math.exp(-beta * t_c)
        assert e == pytest.approx(0.5717, abs=1e-4) and e > restitution(zeta)
        fn = torch.stack([r.pairs.normal_force[0] for r in res])
        assert float(fn.min()) >= 0.0 and int((fn == 0).sum()) > 0  # never pulls; released rows
    else:
        e, t_c = restitution(zeta), math.pi / omega_d
        fn = torch.stack([r.pairs.normal_force[0] for r in res])
        assert float(fn.min()) < -1.0  # the linear damper pulls at the end
    v1 = (m1 * 1.0 - m2 * e * 1.0) / (m1 + m2)
    v2 = (m1 * 1.0 + m1 * e * 1.0) / (m1 + m2)
    # contact is over (the spheres separate), momentum is conserved to rounding
    assert float(res[-1].pairs.penetration[0]) < 0
    p = m1 * vs[:, 0] + m2 * vs[:, 6]
    assert torch.allclose(p, torch.ones_like(p), atol=1e-12)
    assert float(vs[-1, 0]) == pytest.approx(v1, abs=0.01 * (1 + e))
    assert float(vs[-1, 6]) == pytest.approx(v2, abs=0.01 * (1 + e))
    # the measured restitution: separation speed over approach speed
    e_meas = float(vs[-1, 6] - vs[-1, 0])
    assert e_meas == pytest.approx(e, rel=0.02)
    # contact time: pi / omega_d; without adhesion the time the force acts
    # (the spheres overlap a little longer, flying apart force-free)
    touching = torch.tensor([float(r.pairs.normal_force[0] if unilateral else r.pairs.penetration[0]) > 0 for r in res])
    assert float(touching.sum()) * dt == pytest.approx(t_c, rel=0.01)
    # a head-on hit turns neither sphere
    assert float(vs[-1, [3, 4, 5, 9, 10, 11]].abs().max()) < 1e-12


def test_final_box_position_gradient_wrt_pusher_velocity_matches_central_differences():
    dt, steps, push = 2e-3, 100, 0.1
    scene, q, v = push_scene(0.5)

    def final_x(v_cmd):
        qs, vs, _ = scene.rollout(q, v, steps, dt, velocity_servo(v_cmd, push, dt))
        return qs[-1, 1]

    v_cmd = t(0.4).requires_grad_()
    x = final_x(v_cmd)
    (g,) = torch.autograd.grad(x, v_cmd)
    # central differences converge at steps of 1e-6 to 1e-7 m/s (0.1721436 at
    # both; 1e-5 is still 1e-5 off, the contact makes the function stiff)
    h = 1e-6
    with torch.no_grad():
        fd = (final_x(t(0.4 + h)) - final_x(t(0.4 - h))) / (2 * h)
    assert float(x.detach()) > 0.2 + 0.02  # it was pushed
    assert float(g) == pytest.approx(float(fd), rel=1e-6)
    # about the push time plus the slide's v / (mu g), a contact-rich but smooth function
    assert 0.5 * (push + 0.4 / (0.5 * G)) < float(g) < 2 * (push + 0.4 / (0.5 * G))


def test_batched_scene_equals_single_runs_and_a_scene_step_gradchecks():
    dt = 2e-3
    scene, q, v = push_scene(0.5)
    vc = t(0.3, 0.4)[:, None]

    def controller(step, q, v):
        target = vc * min(max((0.1 + 0.05 - step * dt) / 0.05, 0.0), 1.0)
        tau = torch.cat([500.0 * (target - v[..., :1]), torch.zeros_like(v[..., 1:])], -1)
        damp = torch.cat([torch.full_like(v[..., :1], 500.0), torch.zeros_like(v[..., 1:])], -1)
        return tau, damp

    qs, vs, res = scene.rollout(q.expand(2, -1), v.expand(2, -1), 60, dt, controller)
    assert qs.shape == (2, 61, 8) and res[-1].pairs.normal_force.shape == (2, 1)
    for i in range(2):
        qs1, _, _ = scene.rollout(q, v, 60, dt, velocity_servo(vc[i, 0], 0.1, dt))
        assert torch.allclose(qs[i], qs1, atol=1e-12, rtol=0)
    # one step of the finger pressing into the box (pair and ground rows active),
    # w.r.t. the state, the force and the pair's stiffness and friction
    qp, vp = qs[1, 40].clone(), vs[1, 40].clone()
    assert float(res[39].pairs.penetration[1, 0]) > 0
    box = scene.models[1]

    def step(q, v, tau, k, mu):
        P = ContactParameters(stiffness=k, damping=200.0, friction=mu, stiction_width=1e-3, normal_width=1e-6)
        sc = Scene([(scene.models[0], scene.contacts[0]), (box, scene.contacts[1])], params=P)
        q1, v1, r = sc.step(q, v, tau, dt)
        return q1, v1, r.pairs.force, r.systems[1].force

    inputs = (qp.requires_grad_(), vp.requires_grad_(), torch.zeros(7, dtype=F64).requires_grad_(), t(1e4).requires_grad_(), t(0.3).requires_grad_())
    assert torch.autograd.gradcheck(step, inputs, eps=1e-7, atol=1e-6, rtol=1e-5)


def test_float32_cube_on_a_turned_cube_rests_on_its_octagon():
    k, m = 1e5, 2.0
    top = free_body("top", "box", (0.2, 0.2, 0.2), m, dtype=torch.float32)
    bot = free_body("bot", "box", (0.2, 0.2, 0.2), 5.0, dtype=torch.float32)
    P = ContactParameters(stiffness=k, damping=2.0 * math.sqrt(k * m) * 4, friction=0.5, normal_width=1e-7)
    scene = Scene([(bot, Scene.object_contact(bot, params=P)), (top, Scene.object_contact(top, params=P))], params=P)
    qb, qt = bot.neutral(), top.neutral()
    qb[2], qt[2] = 0.1 - 7 * G / (4 * k), 0.3
    qt[3:7] = torch.tensor([math.cos(math.pi / 8), 0.0, 0.0, math.sin(math.pi / 8)])
    z = torch.zeros(6)
    q, v = scene.initial((qb, z), (qt, z))
    qs, vs, res = scene.rollout(q, v, 300, 1e-3)
    fn = res[-1].pairs.normal_force
    assert float(fn[:16].abs().max()) == 0.0 and float(fn[24]) == 0.0
    assert torch.allclose(fn[16:24], torch.full((8,), m * G / 8), rtol=1e-3)
    assert abs(float(qs[-1, 9]) - (0.3 - 7 * G / (4 * k) - m * G / (8 * k))) < 2e-6


def test_quadruped_stands_on_a_free_platform_that_carries_it_to_the_ground():
    # A floating-base robot on a free object: the shipped quadruped, PD-held,
    # dropped 1 cm onto a 10 kg platform box lying on the ground. Its feet
    # touch the platform (sphere-box rows), the platform the ground.
    from backdrive.data import load
    from backdrive.kinematics import forward_kinematics

    robot = load("quadruped", floating_base=True)
    feet = [n for n in robot.link_names if n.endswith("_foot")]
    feet_geom = ContactGeometry.from_model(robot, links=feet)
    plat = free_body("platform", "box", (0.8, 0.6, 0.1), 10.0)
    P = ContactParameters()  # DiffRL's values for the feet on the platform
    # the platform's corners on the ground less damped (d / k = 0.05 s, not
    # DiffRL's 0.25 s) so that it has settled within the 0.8 s
    Pg = P.replace(damping=2e3)
    scene = Scene([(robot, ContactModel(robot, feet_geom)), (plat, Scene.object_contact(plat, params=Pg))], params=P)
    assert scene.pair_labels == tuple((f, "platform") for f in feet)
    qj = torch.tensor([0.0, 0.7, -1.4] * 4, dtype=F64)
    qr = robot.neutral()
    qr[7:] = qj
    T = forward_kinematics(robot, qr)
    qr[2] = 0.1 - min(float(T[robot.frame_index(f), 2, 3]) for f in feet) + 0.02 + 0.01
    qp = plat.neutral()
    qp[2] = 0.05
    q, v = scene.initial((qr, torch.zeros(18, dtype=F64)), (qp, torch.zeros(6, dtype=F64)))
    kp, kd = 200.0, 6.0
    damp = torch.cat([torch.zeros(6, dtype=F64), torch.full((12,), kd, dtype=F64), torch.zeros(6, dtype=F64)])

    def controller(step, q, v):
        tau = torch.cat([torch.zeros(6, dtype=F64), kp * (qj - q[7:19]) - kd * v[6:18], torch.zeros(6, dtype=F64)])
        return tau, damp

    qs, vs, res = scene.rollout(q, v, 400, 2e-3, controller)
    w_robot, w_plat = float(robot.total_mass) * G, 10.0 * G
    last = res[-1]
    assert float(last.pairs.force[:, 2].sum()) == pytest.approx(w_robot, rel=0.01)
    assert bool((last.pairs.normal_force > 0.1 * w_robot / 4).all())  # every foot carries load
    assert float(last.systems[1].force[:, 2].sum()) == pytest.approx(w_robot + w_plat, rel=0.01)
    assert float(last.systems[0].normal_force.abs().max()) == 0.0  # the feet never reach the ground
    # the platform stays put, sunk (w_robot + w_plat) / (4 k) on its lower corners; the robot settles on it
    assert float(qs[-1, 19:21].norm()) < 1e-4
    assert 0.05 - float(qs[-1, 21]) == pytest.approx((w_robot + w_plat) / (4 * 4e4), rel=0.02)
    assert float(qs[-100:, 2].max() - qs[-100:, 2].min()) < 1e-3 and float(vs[-1].abs().max()) < 0.02
