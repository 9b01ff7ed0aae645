"""HumanoidBalance: the G1 standing through backdrive's contact simulator, its pushes, errors and gradients."""

from __future__ import annotations

import math

import pytest
import torch

from backdrive import InputError
from backdrive.envs import HumanoidBalance
from backdrive.envs._humanoid import G1_JOINTS, g1_contact_geometry


@pytest.fixture(scope="module")
def g1():
    try:
        from backdrive.envs._humanoid import _load_g1

        return _load_g1(torch.float64, torch.device("cpu"))
    except Exception as exc:  # noqa: BLE001 - the data package is optional
        pytest.skip(f"example-robot-data G1 not available: {exc}")


@pytest.fixture(scope="module")
def g1_32(g1):
    return g1.to(dtype=torch.float32)


def world_velocity(state):
    from backdrive.spatial import quat_apply

    return quat_apply(state[:, 3:7], state[:, 36:39])


def test_shapes_and_observation(g1_32):
    env = HumanoidBalance(3, robot=g1_32, push_velocity=0.0)
    obs = env.reset(seed=0)
    assert env.action_dim == 15 and env.state_dim == 89 and env.obs_dim == 82
    assert obs.shape == (3, 82) and env.state.shape == (3, 89)
    assert torch.isfinite(obs).all()
    # joint positions relative to the standing pose: the reset noise (ankles take up hip and knee noise)
    assert obs[:, :29].abs().max() <= 2 * env.init_noise + 1e-6
    assert obs[:, :29].abs().max() > 0
    # gravity in the pelvis frame: upright at reset (yaw only)
    assert torch.allclose(obs[:, 61:64], torch.tensor([0.0, 0.0, -1.0]).expand(3, 3), atol=1e-6)
    assert torch.equal(obs[:, 64:79], torch.zeros(3, 15))  # last action
    assert torch.equal(obs[:, 79:82], torch.zeros(3, 3))  # standing command
    priv = HumanoidBalance(3, robot=g1_32, privileged=True)
    o = priv.reset(seed=0)
    assert o.shape == (3, 86)
    assert torch.allclose(o[:, 85], 10.0 * (priv.state[:, 2] - priv.stand_height))  # the pelvis height
    assert len(g1_contact_geometry(g1_32).shapes) == 25  # six sole spheres per foot
    assert len(g1_contact_geometry(g1_32, "urdf").shapes) == 21  # the URDF's four foot spheres per foot
    assert tuple(g1_32.joint_names) == G1_JOINTS


def test_stands_two_seconds_under_zero_action(g1_32):
    env = HumanoidBalance(2, robot=g1_32, push_velocity=0.0)
    m = env.evaluate(None, seconds=2.0, seed=3)
    assert m["upright"] == 1.0 and m["fell"] == 0
    z = m["q"][-1, :, 2]
    assert (z - env.stand_height).abs().max() < 0.01, z
    # standing still: the pelvis stays within 2 cm of where it started
    drift = (m["q"][-1, :, :2] - m["q"][0, :, :2]).norm(dim=-1)
    assert drift.max() < 0.02, drift
    assert env.nonfinite_resets == 0


def test_push_changes_base_velocity_by_the_drawn_amount(g1_32):
    env = HumanoidBalance(64, robot=g1_32, push_velocity=0.5, push_interval=0.02)  # a push every step
    env.reset(seed=1)
    dv = env.draw_push(64)
    size = dv.norm(dim=-1)
    assert (size <= 0.5 + 1e-6).all() and size.max() > 0.35 and (dv[:, 2] == 0).all()
    pushed = env.push(env.state, dv)
    assert torch.allclose(world_velocity(pushed) - world_velocity(env.state), dv, atol=1e-6)
    assert torch.equal(pushed[:, 39:71], env.state[:, 39:71])  # joint rates unchanged
    assert torch.equal(pushed[:, :36], env.state[:, :36])
    # Through a step: against the same step without the push, the base moves by the push (less
    # the 20 ms of friction and servo response), in its direction.
    quiet = HumanoidBalance(64, robot=g1_32, push_velocity=0.0)
    quiet.set_state(env.state.clone())
    zero = torch.zeros(64, 15)
    env.step(zero)
    quiet.step(zero)
    diff = world_velocity(env.state) - world_velocity(quiet.state)
    drawn = env.last_push
    assert (drawn.norm(dim=-1) > 0).all()
    cos = (diff[:, :2] * drawn[:, :2]).sum(-1) / (diff[:, :2].norm(dim=-1) * drawn[:, :2].norm(dim=-1))
    big = drawn.norm(dim=-1) > 0.1
    assert (cos[big] > 0.9).all()
    assert torch.allclose(diff[:, :2].norm(dim=-1), drawn[:, :2].norm(dim=-1), atol=0.15)
    # rare pushes: on average one per push_interval
    rare = HumanoidBalance(256, robot=g1_32, push_velocity=0.5, push_interval=1.0)
    rare.reset(seed=2)
    rate = sum(float((rare.draw_push(256).norm(dim=-1) > 0).double().mean()) for _ in range(20)) / 20
    assert 0.01 < rate < 0.035  # dt / interval = 0.02


def test_typed_errors(g1_32):
    env = HumanoidBalance(2, robot=g1_32)
    env.reset(seed=0)
    with pytest.raises(InputError, match="shape"):
        env.step(torch.zeros(2, 12))
    with pytest.raises(InputError, match="float32"):
        env.step(torch.zeros(2, 15, dtype=torch.float64))
    with pytest.raises(InputError, match=r"vx = 0.3.*\[0.0, 0.0\]"):
        env.set_command(torch.tensor([0.3, 0.0, 0.0]))
    walk = HumanoidBalance(2, robot=g1_32, command_ranges={"vx": (0.0, 0.3)})
    walk.reset(seed=0)
    obs = walk.set_command(torch.tensor([0.3, 0.0, 0.0]))
    assert torch.allclose(obs[:, 79], torch.full((2,), 0.3))
    with pytest.raises(InputError, match="vx = 0.5"):
        walk.set_command(torch.tensor([0.5, 0.0, 0.0]))
    with pytest.raises(InputError, match="unknown command 'speed'"):
        HumanoidBalance(1, robot=g1_32, command_ranges={"speed": (0, 1)})
    with pytest.raises(InputError, match="push_velocity"):
        HumanoidBalance(1, robot=g1_32, push_velocity=-0.1)
    with pytest.raises(InputError, match="unknown reward term 'alive'"):
        HumanoidBalance(1, robot=g1_32, reward_weights={"alive": 1.0})
    with pytest.raises(InputError, match="float64"):
        HumanoidBalance(1, robot=g1_32, dtype=torch.float64)
    with pytest.raises(InputError, match="RobotModel"):
        HumanoidBalance(1, robot="g1")


def test_nonfinite_copy_is_reset_and_counted(g1_32):
    env = HumanoidBalance(3, robot=g1_32, push_velocity=0.0)
    env.reset(seed=0)
    state = env.state.clone()
    state[1, 40] = math.nan
    env.set_state(state)
    action = torch.zeros(3, 15, requires_grad=True)
    obs, reward, term, trunc, info = env.step(action)
    assert info["nonfinite"].tolist() == [False, True, False]
    assert env.nonfinite_resets == 1 and bool(trunc[1]) and torch.isfinite(obs).all()
    reward.sum().backward()
    assert torch.isfinite(action.grad).all() and (action.grad[1] == 0).all()


def test_gradient_through_control_steps_float64(g1):
    """d(return of 3 control steps)/d(actions) is finite and matches central differences."""
    env = HumanoidBalance(2, robot=g1, push_velocity=0.0, dtype=torch.float64)
    env.reset(seed=4)
    start = env.state.clone()
    gen = torch.Generator().manual_seed(0)
    actions = 0.3 * torch.randn(3, 2, 15, generator=gen, dtype=torch.float64)

    def ret(a):
        env.set_state(start)
        return sum(env.step(a[t])[1].sum() for t in range(3))

    a = actions.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(ret(a), a)
    assert torch.isfinite(grad).all() and grad.abs().max() > 0
    direction = torch.randn(actions.shape, generator=gen, dtype=torch.float64)
    eps = 1e-6
    with torch.no_grad():
        fd = (ret(actions + eps * direction) - ret(actions - eps * direction)) / (2 * eps)
    ad = (grad * direction).sum()
    assert abs(float(ad - fd)) <= 1e-4 * max(1.0, abs(float(fd))), (float(ad), float(fd))


def test_pretrained_policy_beats_zero_action():
    from importlib.resources import files

    if not files("backdrive.data").joinpath(HumanoidBalance.SHIPPED_POLICY).is_file():
        with pytest.raises(FileNotFoundError, match="lacks the file the package ships"):
            HumanoidBalance.pretrained(1)
        return  # nothing ships
    try:
        env, policy = HumanoidBalance.pretrained(16, push_velocity=0.5, push_interval=1.0)
    except Exception as exc:  # noqa: BLE001 - the data package is optional
        pytest.skip(f"example-robot-data G1 not available: {exc}")
    assert env.balance_feedback is not None and env.feet == "sole"  # the residual's prior and feet, from the file
    # Harder than the target (a push every second on average) and shorter (4 s), to keep the test quick.
    trained = env.evaluate(policy, seconds=4.0, seed=7)
    pd_only = HumanoidBalance(16, push_velocity=0.5, push_interval=1.0, feet=env.feet)
    pd_only = pd_only.evaluate(None, seconds=4.0, seed=7)
    assert trained["pushes"] > 2.0
    assert trained["upright"] >= 0.75  # 13/16 when shipped (a push every second is harder than the target)
    assert trained["upright"] > pd_only["upright"], (trained["upright"], pd_only["upright"])


def test_gymnasium_view(g1_32):
    import numpy as np

    from backdrive.envs import to_gymnasium

    g = to_gymnasium(HumanoidBalance(1, robot=g1_32, push_velocity=0.0))
    obs, _ = g.reset(seed=0)
    assert obs.shape == (82,) and g.action_space.shape == (15,) and g.observation_space.shape == (82,)
    obs, reward, terminated, truncated, _ = g.step(np.zeros(15, dtype=np.float32))
    assert obs.shape == (82,) and np.isfinite(obs).all()
    assert 1.0 < reward < 1.6 and not terminated and not truncated  # standing: most terms near their best


def _leaning(env, pitch: float, roll: float = 0.0):
    """``env``'s reset state with the pelvis (yaw 0) turned by ``pitch`` about y, then ``roll`` about x."""
    s = env.state.clone()
    cp, sp, cr, sr = math.cos(pitch / 2), math.sin(pitch / 2), math.cos(roll / 2), math.sin(roll / 2)
    # q_pitch (x) q_roll, wxyz
    s[:, 3:7] = torch.tensor([cp * cr, cp * sr, sp * cr, -sp * sr], dtype=s.dtype)
    return s


def test_balance_feedback_signs_and_errors(g1_32):
    from backdrive.envs._humanoid import BALANCE_FEEDBACK_KEYS, G1_BALANCE_FEEDBACK

    off = HumanoidBalance(1, robot=g1_32, push_velocity=0.0)
    off.reset(seed=0)
    assert off.balance_feedback is None
    assert torch.equal(off.feedback_offsets(_leaning(off, 0.1)), torch.zeros(1, 15))

    env = HumanoidBalance(1, robot=g1_32, push_velocity=0.0, balance_feedback={"ankle_tilt": 1.0, "hip_rate": 0.5})
    env.reset(seed=0)
    # a forward lean (pitch about +y) raises both ankle pitch targets (the torque that tips the body back)
    d = env.feedback_offsets(_leaning(env, 0.1))
    assert d[0, 4] > 0.09 and d[0, 10] > 0.09
    assert torch.allclose(d[0, 4], d[0, 10])
    assert d[0, [0, 1, 2, 3, 5, 6, 7, 8, 9, 11, 12, 13, 14]].abs().max() < 1e-6  # no rate: the hips stay
    assert env.feedback_offsets(_leaning(env, -0.1))[0, 4] < -0.09  # a backward lean lowers them
    # a lean to the right (roll about +x) moves the ankle roll targets, not the pitch ones
    r = env.feedback_offsets(_leaning(env, 0.0, 0.1))
    assert r[0, 5] > 0.09 and r[0, 11] > 0.09 and r[0, [4, 10]].abs().max() < 1e-6
    # a pitch rate drives the hip pitch joints by its gain (0.5 x 0.2 rad/s, through a tanh at 0.25 rad)
    s = _leaning(env, 0.0)
    s[:, 36 + 4] = 0.2  # w_y, rad/s
    expect = torch.full((2,), 0.25 * math.tanh(0.1 / 0.25))
    assert torch.allclose(env.feedback_offsets(s)[0, [0, 6]], expect, atol=1e-5)
    # saturated at the action scale
    assert env.feedback_offsets(_leaning(env, 1.0))[0, 4] < env.action_scale

    # physically: after a forward push of 0.3 m/s, the prior keeps the pelvis leaning forward less
    lean = {}
    for name, fb in (("pd", None), ("prior", G1_BALANCE_FEEDBACK)):
        e = HumanoidBalance(1, robot=g1_32, push_velocity=0.0, init_noise=0.0, balance_feedback=fb)
        e.reset(seed=0)
        e.set_state(e.push(_leaning(e, 0.0), torch.tensor([[0.3, 0.0, 0.0]])))
        peak = 0.0
        with torch.no_grad():
            for _ in range(25):
                e.step(torch.zeros(1, 15))
                peak = max(peak, float(e.projected_gravity(e.state)[0, 0]))
        lean[name] = peak
    assert lean["prior"] < lean["pd"], lean

    with pytest.raises(InputError, match="ankle_tilt"):
        HumanoidBalance(1, robot=g1_32, balance_feedback={"ankle": 1.0})
    with pytest.raises(InputError, match="finite"):
        HumanoidBalance(1, robot=g1_32, balance_feedback={"hip_rate": math.nan})
    assert set(G1_BALANCE_FEEDBACK) <= set(BALANCE_FEEDBACK_KEYS)


def test_sole_points_lie_on_the_foot_mesh_sole(g1_32):
    """The sole spheres sit on the flat bottom of example-robot-data's foot mesh and span more of it than the URDF's."""
    import struct
    import numpy as np

    from backdrive.envs._humanoid import G1_SOLE_POINTS

    from backdrive.model._meshes import resolve_mesh_path

    name = next(f.geometry.filename for f in g1_32.visuals if f.link == "left_ankle_roll_link")
    mesh = resolve_mesh_path(name)
    if mesh is None:
        pytest.skip(f"the G1's foot mesh is not installed ({name})")
    raw = mesh.read_bytes()
    n = struct.unpack("<I", raw[80:84])[0]
    tri = np.frombuffer(raw[84:84 + 50 * n], dtype=np.dtype([("n", "<f4", 3), ("v", "<f4", (3, 3)), ("a", "<u2")]))
    v = tri["v"].reshape(-1, 3).astype(np.float64)
    z0 = v[:, 2].min()
    sole = v[v[:, 2] < z0 + 5e-4]
    for x, y in G1_SOLE_POINTS:
        # inside the sole's outline: the outline's vertices within 5 mm of x reach further out on both sides
        near = sole[np.abs(sole[:, 0] - x) < 5e-3]
        assert len(near) > 0 and near[:, 1].min() <= -abs(y) and abs(y) <= near[:, 1].max(), (x, y)
    assert abs(-0.035 - z0) < 1e-3  # sphere bottoms (centre z -0.03, radius 5 mm) on the sole's plane
    xs = [x for x, _ in G1_SOLE_POINTS]
    assert max(xs) - min(xs) > 0.19 > 0.17  # the URDF's spheres span 17 cm (x -0.05 .. 0.12)
    with pytest.raises(InputError, match="feet"):
        HumanoidBalance(1, robot=g1_32, feet="box")


def test_com_signals_after_a_push(g1_32):
    """A push moves the whole body: the centre of mass's velocity is the push, in the heading frame."""
    env = HumanoidBalance(4, robot=g1_32, push_velocity=0.0, init_noise=0.0)
    env.reset(seed=5)
    s = env.state.clone()
    s[:, 36:] = torch.cat([torch.zeros(4, 35), s[:, 71:]], -1)  # at rest
    c, cdot = env.com_signals(s)
    assert cdot.abs().max() < 1e-3 and c.abs().max() < 0.05  # standing: the centre of mass over the soles
    dv = torch.tensor([[0.3, 0.0, 0.0], [0.0, -0.2, 0.0], [0.1, 0.1, 0.0], [0.0, 0.0, 0.0]])
    pushed = env.push(s, dv)
    c2, cdot2 = env.com_signals(pushed)
    assert torch.allclose(c2, c, atol=1e-6)
    yaw = 2 * torch.atan2(s[:, 6], s[:, 3])  # the reset turns the pelvis about z only
    cos, sin = torch.cos(yaw), torch.sin(yaw)
    expect = torch.stack([cos * dv[:, 0] + sin * dv[:, 1], -sin * dv[:, 0] + cos * dv[:, 1]], -1)
    assert torch.allclose(cdot2, expect, atol=2e-3), (cdot2, expect)
    # moving the whole robot leaves the offset from the soles unchanged
    moved = s.clone()
    moved[:, :2] += torch.tensor([0.3, -0.2])
    assert torch.allclose(env.com_signals(moved)[0], c, atol=1e-5)
    # the capture-point feedback: a forward centre-of-mass velocity raises both ankle pitch targets
    fb = HumanoidBalance(4, robot=g1_32, push_velocity=0.0, balance_feedback={"ankle_comvel": 0.5})
    d = fb.feedback_offsets(pushed)
    lim = fb.action_scale
    assert torch.allclose(d[:, 4], lim * torch.tanh(0.5 * cdot2[:, 0] / lim), atol=1e-5)
    assert torch.allclose(d[:, 5], lim * torch.tanh(-0.5 * cdot2[:, 1] / lim), atol=1e-5)
    assert torch.allclose(d[:, 4], d[:, 10]) and d[:, [0, 1, 2, 3, 6, 7, 8, 9, 12, 13, 14]].abs().max() < 1e-6


def test_gait_prior_layout_offsets_and_errors(g1_32):
    from backdrive.envs._humanoid import GAIT_KEYS

    gait = {"frequency": 1.5, "lift": 0.2, "sway": 0.05, "stride": 0.3}
    env = HumanoidBalance(3, robot=g1_32, push_velocity=0.0, gait=gait, command_ranges={"vx": (0.0, 0.3)})
    plain = HumanoidBalance(3, robot=g1_32, push_velocity=0.0, command_ranges={"vx": (0.0, 0.3)})
    assert env.state_dim == 92 and env.obs_dim == 84 and plain.state_dim == 89 and plain.obs_dim == 82
    obs = env.reset(seed=4)
    # The clock is drawn last: the rest of the reset is the standing env's; the commanded heading starts at
    # the reset's heading (no heading error).
    plain.reset(seed=4)
    assert torch.equal(env.state[:, :89], plain.state)
    assert torch.allclose(env.state[:, 90], 2 * torch.atan2(env.state[:, 6], env.state[:, 3]), atol=1e-6)
    assert float(env.heading_error(env.state).abs().max()) < 1e-6 and torch.equal(env.state[:, 91], torch.zeros(3))
    phase = env.state[:, 89]
    assert torch.allclose(obs[:, 82], torch.cos(phase)) and torch.allclose(obs[:, 83], torch.sin(phase))
    env.step(torch.zeros(3, 15))
    step = torch.remainder(env.state[:, 89] - phase, 2 * math.pi)
    assert torch.allclose(step, torch.full((3,), 2 * math.pi * 1.5 * env.dt), atol=1e-5)
    # Left swing at phase pi/2: hip -lift, knee 2 lift, ankle -lift (foot flat); sway on both rolls; right leg still.
    cmd = torch.tensor([[0.0, 0.0, 0.0], [0.3, 0.0, 0.0]])
    off = env.gait_offsets(torch.full((2, 1), math.pi / 2), cmd)
    assert torch.allclose(off[0, :6], torch.tensor([-0.2, 0.05, 0.0, 0.4, -0.2, -0.05]), atol=1e-6)
    assert torch.allclose(off[0, 6:12], torch.tensor([0.0, 0.05, 0.0, 0.0, 0.0, -0.05]), atol=1e-6)
    assert torch.equal(off[:, 12:], torch.zeros(2, 3))  # the waist
    # Stride at phase 0 (no swing): the left leg back, the right forward, by stride * vx; feet kept flat.
    off = env.gait_offsets(torch.zeros(2, 1), cmd)
    assert torch.allclose(off[1, [0, 4, 6, 10]], torch.tensor([0.09, -0.09, -0.09, 0.09]), atol=1e-6)
    assert torch.equal(off[0], torch.zeros(15))  # no command: no stride
    assert torch.equal(plain.gait_offsets(torch.zeros(2, 1), cmd), torch.zeros(2, 15))
    assert GAIT_KEYS == ("frequency", "lift", "sway", "stride", "placement", "reference", "torso", "level",
                         "capture", "turn", "roll", "steer", "steer_rate", "smoothing", "arms", "profile", "twist",
                         "counter", "support")
    # Foot placement: running 0.2 m/s ahead of the command swings the left foot further forward (flat).
    placing = HumanoidBalance(1, robot=g1_32, gait={"frequency": 1.5, "placement": 0.5})
    off = placing.gait_offsets(torch.full((1, 1), math.pi / 2), torch.zeros(1, 3), torch.tensor([0.2]))
    assert torch.allclose(off[0, [0, 4, 6, 10]], torch.tensor([-0.1, 0.1, 0.0, 0.0]), atol=1e-6)
    for bad, match in (({"lift": 0.1}, "frequency must be > 0"), ({"frequency": 1.0, "lenght": 0.1}, "lenght"),
                       ({"frequency": math.nan}, "frequency must be a finite"),
                       ({"frequency": 30.0}, "half the control"),
                       ({"frequency": 1.0, "lift": True}, "lift must be a finite"), ([1.0], "mapping")):
        with pytest.raises(InputError, match=match):
            HumanoidBalance(1, robot=g1_32, gait=bad)


def test_gait_prior_torso_level_roll_capture_and_turn_terms(g1_32):
    env = HumanoidBalance(2, robot=g1_32, push_velocity=0.0, command_ranges={"vx": (0.0, 0.3)},
                          gait={"frequency": 1.5, "stride": 0.3, "torso": 2.0, "level": 1.0, "capture": 0.4,
                                "turn": 0.3, "roll": 0.5})
    cmd = torch.tensor([[0.3, 0.0, 0.0], [0.3, 0.0, 0.0]])
    lean = torch.tensor([0.1, -0.1])  # pelvis leaning forward, backward
    # Mid-swing of the left leg (phase pi/2): the right (stance) hip extends by torso * lean, the left
    # (swing) hip takes the lean off (level 1); the ankles are left alone.
    off = env.gait_offsets(torch.full((2, 1), math.pi / 2), cmd, lean=lean)
    assert torch.allclose(off[:, 6], 2.0 * lean, atol=1e-6) and torch.allclose(off[:, 0], -lean, atol=1e-6)
    assert torch.allclose(off[:, [4, 10]], torch.zeros(2, 2), atol=1e-6)
    # Sideways (roll 0.5): the same terms on the hip rolls, half as strong, from the second lean column.
    off = env.gait_offsets(torch.full((2, 1), math.pi / 2), cmd, lean=torch.stack([lean, -2 * lean], -1))
    assert torch.allclose(off[:, 6], 2.0 * lean, atol=1e-6) and torch.allclose(off[:, 0], -lean, atol=1e-6)
    assert torch.allclose(off[:, 7], 0.5 * 2.0 * (-2 * lean), atol=1e-6)
    assert torch.allclose(off[:, 1], 0.5 * -(-2 * lean), atol=1e-6)
    # Turn: the stance (right) hip yaw against the pelvis's yaw rate above the command's; the swing hip alone.
    off = env.gait_offsets(torch.full((2, 1), math.pi / 2), torch.tensor([[0.3, 0.0, 0.0], [0.3, 0.0, 0.2]]),
                           yaw_rate=torch.tensor([0.5, 0.5]))
    assert torch.allclose(off[:, 8], torch.tensor([0.15, 0.09]), atol=1e-6)
    assert torch.allclose(off[:, 2], torch.zeros(2), atol=1e-6)
    # Touchdown of the left foot (phase pi): both legs half stance, half swing; the stride is at its extreme.
    off = env.gait_offsets(torch.full((2, 1), math.pi), cmd, lean=lean)
    half = 0.5 * (2.0 - 1.0) * lean
    assert torch.allclose(off[:, 0], -0.09 + half, atol=1e-6) and torch.allclose(off[:, 6], 0.09 + half, atol=1e-6)
    # Capture: the centre of mass 0.1 m/s ahead of the command lengthens the stride by 0.04 rad: the left foot
    # lands further forward; 0.1 m/s behind shortens it. Without a velocity the command's stride.
    com_v = torch.tensor([0.4, 0.2])
    off = env.gait_offsets(torch.full((2, 1), math.pi), cmd, com_velocity=com_v)
    assert torch.allclose(off[:, 0], torch.tensor([-0.13, -0.05]), atol=1e-6)
    assert torch.allclose(env.gait_offsets(torch.full((2, 1), math.pi), cmd)[:, 0], torch.full((2,), -0.09))
    # The transition feeds the pelvis's lean (g_x, -g_y), the centre of mass's forward velocity and the yaw
    # rate in: the same step as an env without those terms whose action adds the offsets they give.
    plain = HumanoidBalance(2, robot=g1_32, push_velocity=0.0, command_ranges={"vx": (0.0, 0.3)},
                            gait={"frequency": 1.5, "stride": 0.3})
    plain.reset(seed=1)
    s = plain.state.clone()
    s[:, 86] = 0.3
    s[:, 89] = torch.tensor([math.pi / 3, 4.0])
    s[:, 36] = torch.tensor([0.5, 0.1])  # moving forward
    s[:, 41] = torch.tensor([0.4, -0.3])  # and turning
    s[:, 3:7] = torch.tensor([[math.cos(0.05), 0.0, math.sin(0.05), 0.0],  # pitched 0.1 rad forward
                              [math.cos(0.05), math.sin(0.05), 0.0, 0.0]])  # rolled 0.1 rad
    g = env.projected_gravity(s)
    lean = torch.stack([g[:, 0], -g[:, 1]], -1)
    assert torch.allclose(lean, torch.tensor([[math.sin(0.1), 0.0], [0.0, math.sin(0.1)]]), atol=1e-5)
    cdot = env.com_signals(s)[1][:, 0]
    assert float(cdot[0] - cdot[1]) > 0.3
    extra = (env.gait_offsets(s[:, 89:90], s[:, 86:89], lean=lean, com_velocity=cdot, yaw_rate=s[:, 41])
             - plain.gait_offsets(s[:, 89:90], s[:, 86:89]))
    assert float(extra.abs().max()) > 0.05 and float(extra.abs().max()) < env.action_scale
    a = extra / env.action_scale
    qv = env.transition(s, torch.zeros(2, 15))[:, :71]  # (the last action's columns differ)
    assert torch.allclose(qv, plain.transition(s, a)[:, :71], atol=1e-5)
    assert not torch.allclose(qv, plain.transition(s, torch.zeros(2, 15))[:, :71], atol=1e-3)
    with pytest.raises(InputError, match="torso must be a finite"):
        HumanoidBalance(1, robot=g1_32, gait={"frequency": 1.0, "torso": math.inf})


def test_gait_prior_lifts_the_swing_foot(g1_32):
    from backdrive.kinematics import forward_kinematics

    env = HumanoidBalance(1, robot=g1_32, push_velocity=0.0, init_noise=0.0, gait={"frequency": 1.5, "lift": 0.2})
    env.reset(seed=0)
    state = env.state.clone()
    state[:, 89] = 0.0  # the left foot's swing starts now; it peaks a quarter period later
    env.set_state(state)
    feet = [g1_32.frame_index(f"{s}_ankle_roll_link") for s in ("left", "right")]
    for _ in range(round(0.25 / 1.5 / env.dt)):
        env.step(torch.zeros(1, 15))
    z = forward_kinematics(g1_32, env.state[:, :36])[0, feet, 2, 3]
    assert float(z[0] - z[1]) > 0.02, z  # the left foot is off the ground, the right one on it
    assert not bool(env.is_terminal(env.state).any())


def test_balance_feedback_velocities_are_relative_to_the_command(g1_32):
    env = HumanoidBalance(2, robot=g1_32, push_velocity=0.0, init_noise=0.0, command_ranges={"vx": (0.0, 0.3)},
                          balance_feedback={"ankle_comvel": 0.5, "ankle_vel": 0.2})
    env.reset(seed=0)
    s = env.state.clone()
    s[:, 3:7] = torch.tensor([1.0, 0.0, 0.0, 0.0])  # heading along x: base and heading frames agree
    s[:, 36] = 0.3  # moving forward at 0.3 m/s
    s[:, 86] = torch.tensor([0.0, 0.3])  # commanded: standing, and 0.3 m/s forward
    off = env.feedback_offsets(s)
    ankles = [4, 10]
    assert float(off[0, ankles].min()) > 0.1  # a push-like forward velocity: the ankles push back
    assert float(off[1, ankles].abs().max()) < 0.01  # the commanded velocity is not fought
    half = HumanoidBalance(2, robot=g1_32, push_velocity=0.0, command_ranges={"vx": (0.0, 0.3)},
                           balance_feedback={"ankle_comvel": 0.5, "ankle_vel": 0.2},
                           gait={"frequency": 1.0, "reference": 0.5})
    s2 = torch.cat([s, torch.zeros(2, 3)], -1)  # the clock's and the heading's columns
    off2 = half.feedback_offsets(s2)
    # Relative to half the command: a 0.15 m/s excess, 0.7 * 0.15 = 0.105 rad before the saturation.
    assert torch.allclose(off2[1, ankles], torch.full((2,), 0.25 * math.tanh(0.105 / 0.25)), atol=2e-3)


def test_walking_prior_walks_forward(g1_32):
    # The stepping prior with the lean terms (docs/locomotion.md, Walking): 4 robots at a 0.3 m/s command
    # stay up for 3 s and move forward along their start heading (the prior without the lean terms falls
    # after 1.4-4 s; with them 30 of 32 held-out robots walked 10 s).
    from backdrive.envs import G1_CAPTURE_FEEDBACK

    env = HumanoidBalance(4, robot=g1_32, privileged=True, push_velocity=0.0, command_ranges={"vx": (0.0, 0.3)},
                          balance_feedback=dict(G1_CAPTURE_FEEDBACK),
                          gait={"frequency": 1.5, "lift": 0.15, "stride": 0.3, "torso": 1.0, "level": 1.0,
                                "roll": 1.0})
    m = env.evaluate(None, command=(0.3, 0.0, 0.0), seconds=3.0, seed=5)
    assert m["upright"] == 1.0
    q = m["q"]
    yaw0 = 2 * torch.atan2(q[0, :, 6], q[0, :, 3])
    d = q[-1, :, :2] - q[0, :, :2]
    along = d[:, 0] * torch.cos(yaw0) + d[:, 1] * torch.sin(yaw0)
    assert float(along.min()) > 0.25, along  # 0.24 m/s x 3 s less the start


def test_gait_prior_steer_term_and_commanded_heading(g1_32):
    # steer: the stride's amplitude per leg from the heading error (pelvis heading minus the commanded heading,
    # a state column that starts at the reset's heading and turns at the commanded yaw rate).
    env = HumanoidBalance(2, robot=g1_32, push_velocity=0.0, command_ranges={"vx": (0.0, 0.3), "yaw": (-0.5, 0.5)},
                          gait={"frequency": 1.5, "stride": 0.3, "steer": 0.2})
    cmd = torch.tensor([[0.3, 0.0, 0.0], [0.3, 0.0, 0.0]])
    err = torch.tensor([0.25, -0.1])  # turned left, right of the commanded heading
    # Phase 0 (the stride's extreme, the left foot back): turned left, the right leg strides further.
    off = env.gait_offsets(torch.zeros(2, 1), cmd, heading_error=err)
    assert torch.allclose(off[:, 0], 0.09 - 0.2 * err, atol=1e-6)  # left hip pitch: amplitude 0.09 - 0.2 err
    assert torch.allclose(off[:, 6], -(0.09 + 0.2 * err), atol=1e-6)  # right hip pitch: 0.09 + 0.2 err
    assert torch.allclose(off[:, [4, 10]], -off[:, [0, 6]], atol=1e-6)  # feet flat
    assert torch.allclose(env.gait_offsets(torch.zeros(2, 1), cmd)[:, 0], torch.full((2,), 0.09), atol=1e-6)
    # The commanded heading: the reset's heading, advanced by the commanded yaw rate each step, wrapped.
    env.reset(seed=3)
    s = env.state.clone()
    s[:, 88] = torch.tensor([0.5, -0.5])  # commanded yaw rates
    s[:, 90] = torch.tensor([0.2, -math.pi + 0.005])
    nxt = env.transition(s, torch.zeros(2, 15))
    want = torch.tensor([0.2 + 0.5 * env.dt, math.pi + 0.005 - 0.5 * env.dt])
    assert torch.allclose(nxt[:, 90], want, atol=1e-5)
    # The transition feeds the heading error in: the same step as an env without steer whose action adds it.
    plain = HumanoidBalance(2, robot=g1_32, push_velocity=0.0, command_ranges={"vx": (0.0, 0.3)},
                            gait={"frequency": 1.5, "stride": 0.3})
    plain.reset(seed=1)
    s = plain.state.clone()
    s[:, 86] = 0.3
    s[:, 89] = torch.tensor([0.3, 3.5])
    s[:, 90] = s[:, 90] + torch.tensor([-0.3, 0.4])  # the commanded heading 0.3 right, 0.4 left of the pelvis's
    e = env.heading_error(s)
    assert torch.allclose(e, torch.tensor([0.3, -0.4]), atol=1e-5)
    extra = env.gait_offsets(s[:, 89:90], s[:, 86:89], heading_error=e) - plain.gait_offsets(s[:, 89:90], s[:, 86:89])
    assert float(extra.abs().max()) > 0.03
    qv = env.transition(s, torch.zeros(2, 15))[:, :71]
    assert torch.allclose(qv, plain.transition(s, extra / env.action_scale)[:, :71], atol=1e-5)
    assert not torch.allclose(qv, plain.transition(s, torch.zeros(2, 15))[:, :71], atol=1e-3)
    # smoothing: the steer acts on the state's low-passed heading error (column 91), which each step moves
    # dt / (smoothing + dt) of the way to the new error.
    smooth = HumanoidBalance(2, robot=g1_32, push_velocity=0.0, command_ranges={"vx": (0.0, 0.3)},
                             gait={"frequency": 1.5, "stride": 0.3, "steer": 0.2, "smoothing": 0.3})
    s[:, 91] = torch.tensor([-0.2, 0.1])
    nxt = smooth.transition(s, torch.zeros(2, 15))
    lag = s[:, 91] + env.dt / 0.32 * (smooth.heading_error(nxt) - s[:, 91])
    assert torch.allclose(nxt[:, 91], lag, atol=1e-5)
    extra = (smooth.gait_offsets(s[:, 89:90], s[:, 86:89], heading_error=s[:, 91])
             - plain.gait_offsets(s[:, 89:90], s[:, 86:89]))
    assert torch.allclose(nxt[:, :71], plain.transition(s, extra / env.action_scale)[:, :71], atol=1e-5)
    # steer_rate: the same differential stride from the yaw rate above the commanded one.
    rate = HumanoidBalance(2, robot=g1_32, push_velocity=0.0, command_ranges={"vx": (0.0, 0.3)},
                           gait={"frequency": 1.5, "stride": 0.3, "steer_rate": 0.1})
    off = rate.gait_offsets(torch.zeros(2, 1), torch.tensor([[0.3, 0.0, 0.0], [0.3, 0.0, 0.2]]),
                            yaw_rate=torch.tensor([0.5, 0.5]))
    assert torch.allclose(off[:, 0], torch.tensor([0.09 - 0.05, 0.09 - 0.03]), atol=1e-6)
    assert torch.allclose(off[:, 6], -torch.tensor([0.09 + 0.05, 0.09 + 0.03]), atol=1e-6)
    # arms: each shoulder pitch swings with the other side's hip stride; the transition drives the arm servos.
    arms = HumanoidBalance(2, robot=g1_32, push_velocity=0.0, command_ranges={"vx": (0.0, 0.3)},
                           gait={"frequency": 1.5, "stride": 0.3, "arms": 2.0})
    swing = arms.arm_offsets(torch.zeros(2, 1), cmd)  # phase 0: the left hip back by 0.09, the right forward
    assert torch.allclose(swing[:, [0, 7]], torch.tensor([[-0.18, 0.18], [-0.18, 0.18]]), atol=1e-6)
    assert torch.equal(swing[:, [1, 2, 3, 4, 5, 6, 8, 9, 10, 11, 12, 13]], torch.zeros(2, 12))
    assert torch.equal(plain.arm_offsets(torch.zeros(2, 1), cmd), torch.zeros(2, 14))
    s[:, 89] = 0.0
    dq = arms.transition(s, torch.zeros(2, 15))[:, 7:36] - plain.transition(s, torch.zeros(2, 15))[:, 7:36]
    assert float(dq[:, 15].max()) < -1e-4 and float(dq[:, 22].min()) > 1e-4  # left arm forward, right back
    assert float(dq[:, :15].abs().max()) < float(dq[:, [15, 22]].abs().min())
    with pytest.raises(InputError, match="smoothing must be >= 0"):
        HumanoidBalance(1, robot=g1_32, gait={"frequency": 1.0, "smoothing": -0.1})
    with pytest.raises(InputError, match="steer must be a finite"):
        HumanoidBalance(1, robot=g1_32, gait={"frequency": 1.0, "steer": math.nan})
    with pytest.raises(InputError, match="gait="):
        HumanoidBalance(1, robot=g1_32).heading_error(torch.zeros(1, 89))


def test_gait_prior_wobble_keys_profile_twist_counter_support(g1_32):
    # The 11th session's keys: profile (the stride's waveform), twist and counter (the waist yaw on the
    # pelvis's yaw rate and heading error), support (a double support without lift).
    cmd = torch.tensor([[0.3, 0.0, 0.0], [0.3, 0.0, 0.2]])
    base = {"frequency": 1.5, "stride": 0.3}
    plain = HumanoidBalance(2, robot=g1_32, push_velocity=0.0, gait=base)
    prof = HumanoidBalance(2, robot=g1_32, push_velocity=0.0, gait={**base, "profile": 1.0})
    half = HumanoidBalance(2, robot=g1_32, push_velocity=0.0, gait={**base, "profile": 0.5})
    # profile 0 is the cosine stride (the default); at phase 0 every profile starts the left swing from
    # the left hip's back extreme (+0.09) with the right hip forward (-0.09).
    for env in (prof, half):
        off = env.gait_offsets(torch.zeros(2, 1), cmd)
        assert torch.allclose(off[0, [0, 4, 6, 10]], torch.tensor([0.09, -0.09, -0.09, 0.09]), atol=1e-6)
    # Phase pi/4: the left swing a quarter done (the cubic 8u^3 - 12u^2 + 2u + 1 at u = 1/4: 0.875, it has
    # not yet left the back), the right stance a quarter done (-1 + 2u = -0.5: swept back at a constant rate).
    ph = torch.full((2, 1), math.pi / 4)
    off = prof.gait_offsets(ph, cmd)
    assert torch.allclose(off[0, [0, 6]], torch.tensor([0.09 * 0.875, 0.09 * -0.5]), atol=1e-6)
    blend = 0.5 * plain.gait_offsets(ph, cmd) + 0.5 * off
    assert torch.allclose(half.gait_offsets(ph, cmd), blend, atol=1e-6)
    # The stance hip's rate is constant, and the swing starts and ends at it (a retraction at touchdown).
    phases = torch.linspace(0.0, 2 * math.pi, 721, dtype=torch.float64)[:-1, None]
    hip = prof.gait_offsets(phases.float(), cmd[:1].expand(720, 3))[:, 6].double()  # the right leg
    rate = torch.diff(hip) / float(phases[1] - phases[0])
    stance = rate[5:355]  # the right stance: phases (0, pi)
    assert float(stance.std()) < 1e-4 and abs(float(stance.mean()) - 0.18 / math.pi) < 1e-4
    assert abs(float(rate[362]) - 0.18 / math.pi) < 0.01 and abs(float(rate[715]) - 0.18 / math.pi) < 0.01
    assert float(hip.abs().max()) < 0.09 * 1.1
    # twist and counter: the waist yaw target, from the yaw rate above the command's and the heading error;
    # nothing else changes.
    waist = HumanoidBalance(2, robot=g1_32, push_velocity=0.0, gait={**base, "twist": 0.2, "counter": 1.5})
    rate, err = torch.tensor([0.5, -0.4]), torch.tensor([0.1, 0.3])
    off = waist.gait_offsets(ph, cmd, yaw_rate=rate, heading_error=err)
    assert torch.allclose(off[:, 12], 0.2 * (rate - cmd[:, 2]) + 1.5 * err, atol=1e-6)
    ref = plain.gait_offsets(ph, cmd, yaw_rate=rate, heading_error=err)
    assert torch.equal(off[:, :12], ref[:, :12]) and torch.equal(off[:, 13:], ref[:, 13:])
    # The transition drives the waist yaw from the state's heading error: the pelvis turned left of the
    # commanded heading turns the torso further left (waist yaw +) and the pelvis back (its yaw rate -).
    plain.reset(seed=2)
    s = plain.state.clone()
    s[:, 90] = s[:, 90] - 0.3
    counter = HumanoidBalance(2, robot=g1_32, push_velocity=0.0, gait={**base, "counter": 1.0})
    a, b = counter.transition(s, torch.zeros(2, 15)), plain.transition(s, torch.zeros(2, 15))
    assert bool((a[:, 7 + 12] - b[:, 7 + 12] > 1e-3).all()) and bool((a[:, 41] - b[:, 41] < -1e-2).all())
    # support: no lift while |sin(phase)| <= support; full lift at mid-swing.
    lift = HumanoidBalance(2, robot=g1_32, push_velocity=0.0, gait={"frequency": 1.5, "lift": 0.2, "support": 0.3})
    off = lift.gait_offsets(torch.tensor([[0.25], [math.pi / 2]]), torch.zeros(2, 3))  # sin 0.247, 1
    assert torch.equal(off[0, [0, 3, 4]], torch.zeros(3))
    assert torch.allclose(off[1, [0, 3, 4]], torch.tensor([-0.2, 0.4, -0.2]), atol=1e-6)
    mid = lift.gait_offsets(torch.full((1, 1), math.asin(0.65)), torch.zeros(1, 3))[0, 3]
    assert abs(float(mid) - 0.4 * 0.5 ** 2) < 1e-6  # (0.65 - 0.3) / 0.7 = 0.5
    for bad, match in (({"profile": 1.5}, "profile must be in"), ({"profile": -0.1}, "profile must be in"),
                       ({"support": 1.0}, "support must be in"), ({"support": -0.2}, "support must be in"),
                       ({"twist": math.nan}, "twist must be a finite"), ({"counter": "1"}, "counter must be a finite")):
        with pytest.raises(InputError, match=match):
            HumanoidBalance(1, robot=g1_32, gait={"frequency": 1.0, **bad})
