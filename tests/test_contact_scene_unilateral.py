"""The scene step without adhesion (issue 11): ``Scene.step``'s pair rows and
its systems' rows leave the step where their applied normal force is negative.

A ball (1 kg) rests on a box (50 kg) that rests on the ground; pulled up hard
within one 2 ms step, the linearised ball-box row's damping would pull the
box along (adhesion). The scene's switch (``Scene(..., unilateral=)``) is the
pair rows'; each system's rows follow its ``ContactModel``'s.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from backdrive import InputError
from backdrive.contact import ContactGeometry, ContactModel, ContactParameters, Scene, SceneResult, free_body, integrate_world
from backdrive.data import load
from backdrive.kinematics import use_path

torch.set_num_threads(1)
F64 = torch.float64
G = 9.81
DT = 2e-3
# Heavy enough that the first (adhesive) solve does not unload its ground
# rows too: they would drop with the pair row (dropped rows stay dropped).
M_BOX = 50.0
P = ContactParameters(stiffness=1e4, damping=500.0, friction=0.5, stiction_width=1e-2)


def ball_on_box(unilateral=True, objects=True, exclude=(), params=P):
    """The scene and its resting state: the box's 8 corners on the ground, the ball on the box's top face.
    ``unilateral``: the pair rows' switch; ``objects``: the systems' (their ground contact models)."""
    box = free_body("box", "box", (0.4, 0.4, 0.2), M_BOX)
    ball = free_body("ball", "sphere", (0.05,), 1.0)
    systems = [(m, Scene.object_contact(m, params=P).replace(unilateral=objects, robot=m)) for m in (box, ball)]
    scene = Scene(systems, params=params, unilateral=unilateral, exclude=exclude)
    qb, qs = box.neutral(), ball.neutral()
    qb[2] = 0.1 - (M_BOX + 1) * G / (4 * 1e4)  # the 4 lower corners carry both
    qs[2] = 0.2 + 0.05 + float(qb[2]) - 0.1 - G / 1e4
    z = torch.zeros(6, dtype=F64)
    q, v = scene.initial((qb, z), (qs, z))
    return scene, q, v


def pull(scene, batch_forces):
    """``tau (len, nv)``: an upward force on the ball (its body frame is the world's) per sample."""
    tau = torch.zeros(len(batch_forces), scene.nv, dtype=F64)
    tau[:, 8] = torch.tensor(batch_forces, dtype=F64)
    return tau


def test_ball_pulled_off_a_box_gets_no_pulling_force():
    scene_off, q, v = ball_on_box(unilateral=False, objects=False)
    tau = pull(scene_off, [300.0])
    _, v_off, r_off = scene_off.step(q, v, tau, DT)
    assert float(r_off.pairs.normal_force[0, 0]) < -50.0  # the damper pulls the box along
    scene, _, _ = ball_on_box()
    assert scene.unilateral and "unilateral" not in repr(scene) and "unilateral=False" in repr(scene_off)
    _, v1, r = scene.step(q, v, tau, DT)
    assert float(r.pairs.normal_force[0, 0]) == 0.0 and bool((r.pairs.force == 0).all())
    for res in r.systems:
        assert bool((res.normal_force >= 0).all())
    assert float(r.systems[0].normal_force.sum()) == pytest.approx((M_BOX + 1) * G, rel=0.05)  # the box stays on the ground
    # The step of a scene without the ball-box pair: the ball flies free.
    scene_x, _, _ = ball_on_box(exclude=[("ball", "box")])
    assert scene_x.num_pair_rows == 0
    _, v_x, _ = scene_x.step(q, v, tau, DT)
    assert float((v_x - v1).abs().max()) <= 1e-12 * float(v1.abs().max())
    assert float(v1[0, 8]) == pytest.approx(DT * (300.0 - G), rel=1e-9)
    assert float(v_off[0, 8]) < 0.75 * float(v1[0, 8])  # with adhesion the box held the ball back


def test_a_box_pulled_off_the_ground_drops_its_ground_rows_and_keeps_the_ball():
    """System rows drop too (the box's ground corners), the pair row that
    pushes the ball stays; each system's switch is its ContactModel's."""
    scene, q, v = ball_on_box()
    tau = torch.zeros(1, scene.nv, dtype=F64)
    tau[0, 2] = 20000.0  # up on the box
    _, v1, r = scene.step(q, v, tau, DT)
    ground = r.systems[0].normal_force[0]
    assert float(ground.abs().max()) == 0.0 and float(r.pairs.normal_force[0, 0]) > 5.0
    scene_sys_off, _, _ = ball_on_box(objects=False)
    _, _, r2 = scene_sys_off.step(q, v, tau, DT)
    assert float(r2.systems[0].normal_force.min()) < -10.0 and float(r2.pairs.normal_force[0, 0]) > 5.0


def _detached(r):
    return dataclasses.replace(r, **{k: getattr(r, k).detach() for k in ("force", "normal_force", "friction_force")})


@pytest.mark.parametrize("grad", [False, True])
def test_samples_without_a_dropped_row_are_bit_identical(grad):
    """A batch: the ball pulled hard (drops), resting, pushed down: the other
    samples equal the step without the switch bit for bit."""
    scene_off, q, v = ball_on_box(unilateral=False, objects=False)
    scene_on, _, _ = ball_on_box()
    tau = pull(scene_on, [300.0, 0.0, -20.0])
    if grad:
        tau.requires_grad_(True)
    with torch.set_grad_enabled(grad):
        out_off = scene_off.step(q, v, tau, DT)
        out_on = scene_on.step(q, v, tau, DT)
    (q0, v0, r0), (q1, v1, r1) = out_off, out_on
    q0, v0, q1, v1 = (x.detach() for x in (q0, v0, q1, v1))
    r0, r1 = (SceneResult(tuple(_detached(s) for s in r.systems), _detached(r.pairs)) for r in (r0, r1))
    assert float(r0.pairs.normal_force[0, 0]) < 0 and float(r1.pairs.normal_force[0, 0]) == 0.0
    assert bool((r0.pairs.normal_force[1:] > 0).all())
    assert torch.equal(q0[1:], q1[1:]) and torch.equal(v0[1:], v1[1:])
    for f in ("force", "normal_force", "friction_force"):
        assert torch.equal(getattr(r0.pairs, f)[1:], getattr(r1.pairs, f)[1:]), f
        for s0, s1 in zip(r0.systems, r1.systems):
            assert torch.equal(getattr(s0, f)[1:], getattr(s1, f)[1:]), f
    assert torch.equal(r0.systems[0].f_ext[1:], r1.systems[0].f_ext[1:])
    assert float((v0[0] - v1[0]).abs().max()) > 0.1


def test_scene_step_gradcheck_with_a_dropped_pair_row():
    """float64 gradcheck in the state, the forces and the pair law's stiffness
    and friction, in a step where the ball-box row drops (its force stays
    strongly negative under the perturbations) while the box slides on the
    ground (friction active)."""
    _, q, v = ball_on_box()
    v = v.clone()
    v[0] = 0.3  # the box slides
    v[6] = 0.2  # the ball too, a little faster: the pair row's friction acts in the first solve
    tau = pull(ball_on_box()[0], [300.0])[0]
    box, ball = ball_on_box()[0].models

    def step(q, v, tau, k, mu):
        sc, _, _ = ball_on_box(params=P.replace(stiffness=k, friction=mu))
        q1, v1, r = sc.step(q, v, tau, DT)
        return q1, v1, r.pairs.force, r.systems[0].force

    _, _, fp, fs = step(q, v, tau, torch.tensor(1e4, dtype=F64), torch.tensor(0.5, dtype=F64))
    assert float(fp.abs().max()) == 0.0 and float(fs[..., 2].sum()) > 0.9 * M_BOX * G
    off, _, _ = ball_on_box(unilateral=False)
    assert float(off.step(q, v, tau, DT)[2].pairs.normal_force[0]) < -50.0
    inputs = (q.clone().requires_grad_(), v.requires_grad_(), tau.clone().requires_grad_(),
              torch.tensor(1e4, dtype=F64, requires_grad=True), torch.tensor(0.5, dtype=F64, requires_grad=True))
    assert torch.autograd.gradcheck(step, inputs, eps=1e-7, atol=1e-6, rtol=1e-5)


def _quadruped_lifting_a_foot(unilateral):
    """The shipped quadruped 3 mm sunk, its first foot pulled up hard within one step (PD torques)."""
    robot = load("quadruped", floating_base=True, dtype=F64)
    feet = [n for n in robot.link_names if n.endswith("_foot")]
    cm = ContactModel(robot, ContactGeometry.from_model(robot, links=feet), unilateral=unilateral)
    q = robot.neutral().clone()
    q[7:] = torch.tensor([0.0, 0.8, -1.5] * 4, dtype=F64)
    q = cm.place_on_terrain(robot, q, clearance=-0.003)[None]
    v = torch.zeros(1, robot.nv, dtype=F64)
    target = q[:, 7:].clone()
    target[0, 1] += 1.0
    target[0, 2] -= 1.0
    kp, kd = 60.0, 1.0
    tau = torch.cat([torch.zeros(1, 6, dtype=F64), kp * (target - q[:, 7:])], -1)
    damping = torch.cat([torch.zeros(1, 6, dtype=F64), torch.full((1, 12), kd, dtype=F64)], -1)
    return robot, cm, q, v, tau, damping


@pytest.mark.parametrize("unilateral", [True, False])
def test_a_scene_of_one_robot_is_the_contact_models_step(unilateral):
    """A scene of the quadruped alone (ground rows only) takes the step of
    ``ContactModel.acceleration`` (reference path) and ``integrate_world``:
    the lifting foot dropped (switch on) or pulling (off), to 1e-12."""
    robot, cm, q, v, tau, kd = _quadruped_lifting_a_foot(unilateral)
    scene = Scene([(robot, cm)])
    q1, v1, r = scene.step(q, v, tau, DT, extra_damping=kd)
    with use_path("reference"):
        a, res = cm.acceleration(robot, q, v, tau, dt=DT, extra_damping=kd)
    q2, v2 = integrate_world(robot, q, v, a, DT)
    fn = r.systems[0].normal_force[0]
    if unilateral:
        assert float(fn[0]) == 0.0 and bool((fn[1:] > 1.0).all())
    else:
        assert float(fn[0]) < -100.0
    for x, y in ((q1, q2), (v1, v2), (r.systems[0].force, res.force), (r.systems[0].f_ext, res.f_ext)):
        assert float((x - y).abs().max()) <= 1e-12 * float(y.abs().max())


def test_scene_switch_must_be_a_bool():
    box = free_body("box", "box", (0.4, 0.4, 0.2), 5.0)
    with pytest.raises(InputError, match="unilateral must be True or False"):
        Scene([(box, None)], unilateral=1)
