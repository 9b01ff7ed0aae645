"""backdrive.data: the shipped URDF models and the name resolvers.

Every shipped model is checked three ways: its own text (sources named,
primitive shapes, valid inertias and limits), Pinocchio, and MuJoCo. The
closed-form systems are checked against the equations their files document.
"""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET
from pathlib import Path

import mujoco
import numpy as np
import pinocchio as pin
import pytest

import backdrive._errors as backdrive_errors
import backdrive.data as bd
from backdrive.data import (
    MissingDependencyError,
    UnknownRobotError,
    example_robot_data_dir,
    get_data_path,
    list_example_robots,
    list_robots,
    load,
)

SHIPPED = ("cartpole", "double_pendulum", "panda", "pendulum", "quadruped")
# Independent coordinates as Pinocchio counts them with a fixed base, mimic off.
PIN_NQ = {"cartpole": 2, "double_pendulum": 2, "panda": 9, "pendulum": 1, "quadruped": 12}
G = 9.81  # Pinocchio's default gravity magnitude
EXACT = 1e-12  # float64 closed form against Pinocchio


def _rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def _xml(name: str) -> ET.Element:
    return ET.parse(get_data_path(name)).getroot()


def _inertia_matrix(el: ET.Element) -> np.ndarray:
    v = {k: float(el.get(k)) for k in ("ixx", "ixy", "ixz", "iyy", "iyz", "izz")}
    return np.array(
        [
            [v["ixx"], v["ixy"], v["ixz"]],
            [v["ixy"], v["iyy"], v["iyz"]],
            [v["ixz"], v["iyz"], v["izz"]],
        ]
    )


def _random_q(model: pin.Model, rng: np.random.Generator) -> np.ndarray:
    return rng.uniform(model.lowerPositionLimit, model.upperPositionLimit)


# --------------------------------------------------------------- public surface


def test_all_resolves():
    assert len(bd.__all__) == len(set(bd.__all__))
    for name in bd.__all__:
        assert getattr(bd, name) is not None, name


def test_list_robots():
    assert list_robots() == SHIPPED


@pytest.mark.parametrize("name", SHIPPED)
def test_get_data_path_shipped(name):
    path = get_data_path(name)
    assert isinstance(path, Path)
    assert path.is_absolute() and path.is_file()
    assert path.name == f"{name}.urdf"
    assert get_data_path(f"{name}.urdf") == path


# ------------------------------------------------------------- the files' text


@pytest.mark.parametrize("name", SHIPPED)
def test_file_names_its_sources_first(name):
    text = get_data_path(name).read_text()
    # No XML declaration: pytorch_kinematics (and EmbodiChain through it)
    # rejects URDF text that carries an encoding declaration.
    assert not text.lstrip().startswith("<?xml")
    assert text.lstrip().startswith("<!--")
    header = text[: text.index("-->")]
    assert len(header.split()) > 40, "the header comment should document the model"
    if name == "panda":
        for source in ("Gaz", "RA-L", "Denavit-Hartenberg", "FCI", "datasheet"):
            assert source in header
    if name == "cartpole":
        assert "Barto" in header and "Sutton" in header


@pytest.mark.parametrize("name", SHIPPED)
def test_primitive_geometry_with_colours(name):
    root = _xml(name)
    assert root.tag == "robot"
    colours = {m.get("name") for m in root.findall("material") if m.find("color") is not None}
    assert root.findall(".//mesh") == []
    shapes = {"box", "sphere", "cylinder"}
    n_visual = 0
    for link in root.findall("link"):
        for kind in ("visual", "collision"):
            for el in link.findall(kind):
                (geometry,) = list(el.find("geometry"))
                assert geometry.tag in shapes, (link.get("name"), geometry.tag)
        for visual in link.findall("visual"):
            n_visual += 1
            material = visual.find("material")
            assert material is not None, link.get("name")
            assert material.find("color") is not None or material.get("name") in colours
    assert n_visual >= 2


@pytest.mark.parametrize("name", SHIPPED)
def test_inertias_physical(name):
    root = _xml(name)
    n = 0
    for link in root.findall("link"):
        inertial = link.find("inertial")
        if inertial is None:
            continue
        n += 1
        mass = float(inertial.find("mass").get("value"))
        assert mass > 0, link.get("name")
        inertia = _inertia_matrix(inertial.find("inertia"))
        eig = np.linalg.eigvalsh(inertia)
        assert eig[0] > 0, (link.get("name"), eig)
        # Principal moments of a real body: each at most the sum of the others.
        assert eig[2] <= eig[0] + eig[1] + 1e-15, (link.get("name"), eig)
    assert n >= 1


@pytest.mark.parametrize("name", SHIPPED)
def test_joints_limited_and_moving_links_massive(name):
    root = _xml(name)
    with_mass = {ln.get("name") for ln in root.findall("link") if ln.find("inertial") is not None}
    for joint in root.findall("joint"):
        kind = joint.get("type")
        child = joint.find("child").get("link")
        if kind == "fixed":
            continue
        assert kind in ("revolute", "prismatic"), (joint.get("name"), kind)
        # MuJoCo rejects a moving body without mass; fixed children are merged.
        assert child in with_mass, joint.get("name")
        limit = joint.find("limit")
        lower, upper = float(limit.get("lower")), float(limit.get("upper"))
        assert lower < upper, joint.get("name")
        assert float(limit.get("velocity")) > 0
        assert float(limit.get("effort")) >= 0
        axis = np.array([float(x) for x in joint.find("axis").get("xyz").split()])
        assert np.isclose(np.linalg.norm(axis), 1.0)


# ---------------------------------------------------------- reference engines


@pytest.mark.parametrize("name", SHIPPED)
def test_pinocchio_parses(name):
    model = pin.buildModelFromUrdf(str(get_data_path(name)))
    assert model.nq == PIN_NQ[name]
    assert model.nv == PIN_NQ[name]
    data = model.createData()
    q = _random_q(model, _rng())
    # The mass matrix of a valid model is symmetric positive definite.
    mass = pin.crba(model, data, q)
    mass = np.triu(mass) + np.triu(mass, 1).T
    assert np.linalg.eigvalsh(mass)[0] > 0


@pytest.mark.parametrize("name", SHIPPED)
def test_mujoco_loads(name):
    m = mujoco.MjModel.from_xml_path(str(get_data_path(name)))
    # MuJoCo welds a URDF root to the world, so the quadruped has 12 here too.
    assert m.nq == PIN_NQ[name]
    assert m.njnt == PIN_NQ[name]
    moving = m.body_mass[1:][m.body_jntnum[1:] > 0]
    assert np.all(moving > 0)
    d = mujoco.MjData(m)
    mujoco.mj_step(m, d)
    assert np.all(np.isfinite(d.qpos))


# ---------------------------------------------------------------------- panda

# Franka's modified DH table (a, d, alpha) for joints 1-7, FCI documentation.
PANDA_DH = (
    (0.0, 0.333, 0.0),
    (0.0, 0.0, -math.pi / 2),
    (0.0, 0.316, math.pi / 2),
    (0.0825, 0.0, math.pi / 2),
    (-0.0825, 0.384, -math.pi / 2),
    (0.0, 0.0, math.pi / 2),
    (0.088, 0.0, math.pi / 2),
)
PANDA_Q_MIN = (-2.8973, -1.7628, -2.8973, -3.0718, -2.8973, -0.0175, -2.8973)
PANDA_Q_MAX = (2.8973, 1.7628, 2.8973, -0.0698, 2.8973, 3.7525, 2.8973)
PANDA_DQ_MAX = (2.1750,) * 4 + (2.6100,) * 3
PANDA_TAU_MAX = (87.0,) * 4 + (12.0,) * 3


def _rot_x(a):
    c, s = math.cos(a), math.sin(a)
    return np.array([[1, 0, 0, 0], [0, c, -s, 0], [0, s, c, 0], [0, 0, 0, 1.0]])


def _rot_z(a):
    c, s = math.cos(a), math.sin(a)
    return np.array([[c, -s, 0, 0], [s, c, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1.0]])


def _trans(x, y, z):
    T = np.eye(4)
    T[:3, 3] = (x, y, z)
    return T


def _panda_dh_fk(q):
    """Craig-convention forward kinematics, written from the DH table alone."""
    T = np.eye(4)
    frames = []
    for (a, d, alpha), qi in zip(PANDA_DH, q, strict=True):
        T = T @ _rot_x(alpha) @ _trans(a, 0, 0) @ _rot_z(qi) @ _trans(0, 0, d)
        frames.append(T)
    flange = T @ _trans(0, 0, 0.107)
    hand = flange @ _rot_z(-math.pi / 4)
    tcp = hand @ _trans(0, 0, 0.1034)
    return frames, flange, hand, tcp


def test_panda_joint_counts_and_frames():
    path = str(get_data_path("panda"))
    plain = pin.buildModelFromUrdf(path)
    mimic = pin.buildModelFromUrdf(path, mimic=True)
    assert (plain.nq, plain.nv) == (9, 9)
    assert (mimic.nq, mimic.nv) == (8, 8)
    links = [f"panda_link{i}" for i in range(9)]
    links += ["panda_hand", "panda_leftfinger", "panda_rightfinger", "panda_hand_tcp"]
    for link in links:
        assert plain.existFrame(link), link
    assert list(plain.names)[1:] == [f"panda_joint{i}" for i in range(1, 8)] + [
        "panda_finger_joint1",
        "panda_finger_joint2",
    ]


def test_panda_limits_as_published():
    model = pin.buildModelFromUrdf(str(get_data_path("panda")))
    np.testing.assert_array_equal(model.lowerPositionLimit[:7], PANDA_Q_MIN)
    np.testing.assert_array_equal(model.upperPositionLimit[:7], PANDA_Q_MAX)
    np.testing.assert_array_equal(model.velocityLimit[:7], PANDA_DQ_MAX)
    np.testing.assert_array_equal(model.effortLimit[:7], PANDA_TAU_MAX)
    np.testing.assert_array_equal(model.lowerPositionLimit[7:], (0.0, 0.0))
    np.testing.assert_array_equal(model.upperPositionLimit[7:], (0.04, 0.04))
    mimic = _xml("panda").find("joint[@name='panda_finger_joint2']/mimic")
    assert mimic.get("joint") == "panda_finger_joint1"


def test_panda_kinematics_match_dh_table():
    model = pin.buildModelFromUrdf(str(get_data_path("panda")))
    data = model.createData()
    rng = _rng(1)
    for _ in range(20):
        q = _random_q(model, rng)
        pin.framesForwardKinematics(model, data, q)
        frames, flange, hand, tcp = _panda_dh_fk(q[:7])
        for i, T in enumerate(frames, start=1):
            got = data.oMf[model.getFrameId(f"panda_link{i}")].homogeneous
            np.testing.assert_allclose(got, T, atol=1e-12)
        for name, T in (("panda_link8", flange), ("panda_hand", hand), ("panda_hand_tcp", tcp)):
            np.testing.assert_allclose(data.oMf[model.getFrameId(name)].homogeneous, T, atol=1e-12)


def test_panda_tcp_at_zero():
    model = pin.buildModelFromUrdf(str(get_data_path("panda")))
    data = model.createData()
    pin.framesForwardKinematics(model, data, np.zeros(model.nq))
    tcp = data.oMf[model.getFrameId("panda_hand_tcp")]
    # 0.333 + 0.316 + 0.384 - 0.107 - 0.1034 straight up, 0.088 forward.
    np.testing.assert_allclose(tcp.translation, (0.088, 0.0, 0.8226), atol=1e-12)


def test_panda_masses_from_gaz_2019():
    root = _xml("panda")
    mass = {
        ln.get("name"): float(ln.find("inertial/mass").get("value"))
        for ln in root.findall("link")
        if ln.find("inertial") is not None
    }
    gaz = (4.970684, 0.646926, 3.228604, 3.587895, 1.225946, 1.666555, 0.735522)
    assert tuple(mass[f"panda_link{i}"] for i in range(1, 8)) == gaz
    assert mass["panda_hand"] == 0.73
    # Franka's datasheet: about 18 kg for the arm, 0.7 kg for the hand.
    assert 17.0 < sum(mass.values()) < 18.5


# ------------------------------------------------------- closed-form systems


def test_pendulum_parameters_as_documented():
    model = pin.buildModelFromUrdf(str(get_data_path("pendulum")))
    inertia = model.inertias[1]
    assert inertia.mass == 1.0
    np.testing.assert_array_equal(inertia.lever, (0.0, 0.0, -1.0))
    np.testing.assert_allclose(inertia.inertia, np.eye(3) * 1e-9, rtol=0, atol=0)
    np.testing.assert_array_equal(model.joints[1].shortname(), "JointModelRY")


def test_pendulum_matches_closed_form():
    model = pin.buildModelFromUrdf(str(get_data_path("pendulum")))
    data = model.createData()
    m, length, i_yy = 1.0, 1.0, 1e-9
    for q, v, a in _rng(2).uniform(-3, 3, size=(20, 3)):
        tau = pin.rnea(model, data, np.array([q]), np.array([v]), np.array([a]))
        expected = (m * length**2 + i_yy) * a + m * G * length * math.sin(q)
        assert abs(tau[0] - expected) < EXACT
    # q > 0 swings the bob towards -x.
    pin.forwardKinematics(model, data, np.array([0.3]))
    com = data.oMi[1].act(model.inertias[1].lever)
    np.testing.assert_allclose(com, (-math.sin(0.3), 0.0, -math.cos(0.3)), atol=1e-15)


def test_mujoco_pendulum_parameters():
    m = mujoco.MjModel.from_xml_path(str(get_data_path("pendulum")))
    body = m.jnt_bodyid[0]
    assert m.body_mass[body] == 1.0
    np.testing.assert_allclose(m.body_ipos[body], (0.0, 0.0, -1.0))
    np.testing.assert_allclose(m.jnt_axis[0], (0.0, 1.0, 0.0))


def test_double_pendulum_matches_closed_form():
    model = pin.buildModelFromUrdf(str(get_data_path("double_pendulum")))
    data = model.createData()
    m, L, lc, ic = 1.0, 1.0, 0.5, 1.0 / 12.0
    for q1, q2, v1, v2, a1, a2 in _rng(3).uniform(-3, 3, size=(20, 6)):
        c2, s2 = math.cos(q2), math.sin(q2)
        M = np.array(
            [
                [2 * ic + m * lc**2 + m * (L**2 + lc**2 + 2 * L * lc * c2), ic + m * (lc**2 + L * lc * c2)],
                [ic + m * (lc**2 + L * lc * c2), ic + m * lc**2],
            ]
        )
        h = m * L * lc * s2 * np.array([-(2 * v1 * v2 + v2**2), v1**2])
        g = m * G * np.array(
            [lc * math.sin(q1) + L * math.sin(q1) + lc * math.sin(q1 + q2), lc * math.sin(q1 + q2)]
        )
        q, v, a = np.array([q1, q2]), np.array([v1, v2]), np.array([a1, a2])
        tau = pin.rnea(model, data, q, v, a)
        np.testing.assert_allclose(tau, M @ a + h + g, rtol=0, atol=EXACT)


def test_cartpole_matches_classic_equations():
    model = pin.buildModelFromUrdf(str(get_data_path("cartpole")))
    data = model.createData()
    mc, mp, l = 1.0, 0.1, 0.5  # noqa: E741 - the paper's half-length
    i_c = mp * (2 * l) ** 2 / 12
    np.testing.assert_array_equal(model.lowerPositionLimit[0], -2.4)
    np.testing.assert_array_equal(model.upperPositionLimit[0], 2.4)
    for th, xd, thd, xdd, thdd in _rng(4).uniform(-3, 3, size=(20, 5)):
        q, v, a = np.array([0.7, th]), np.array([xd, thd]), np.array([xdd, thdd])
        tau = pin.rnea(model, data, q, v, a)
        force = (mc + mp) * xdd + mp * l * math.cos(th) * thdd - mp * l * math.sin(th) * thd**2
        torque = mp * l * math.cos(th) * xdd + (i_c + mp * l**2) * thdd - mp * G * l * math.sin(th)
        np.testing.assert_allclose(tau, (force, torque), rtol=0, atol=EXACT)
    # Zero angle: pole up; pi: hanging down.
    for angle, z in ((0.0, 1.0), (math.pi, -1.0)):
        pin.framesForwardKinematics(model, data, np.array([0.0, angle]))
        tip = data.oMi[2].act(np.array([0.0, 0.0, 1.0]))
        np.testing.assert_allclose(tip, (0.0, 0.0, z), atol=1e-15)


# ------------------------------------------------------------------ quadruped


def test_quadruped_floating_base():
    path = str(get_data_path("quadruped"))
    model = pin.buildModelFromUrdf(path, pin.JointModelFreeFlyer())
    assert (model.nq, model.nv) == (19, 18)
    assert model.frames[model.getFrameId("trunk")].parentJoint == 1
    legs = ("FL", "FR", "RL", "RR")
    for leg in legs:
        for part in ("hip", "thigh", "calf", "foot"):
            assert model.existFrame(f"{leg}_{part}")
    assert sum(i.mass for i in model.inertias) == pytest.approx(12.44, abs=1e-12)
    data = model.createData()
    pin.framesForwardKinematics(model, data, pin.neutral(model))
    feet = np.array([data.oMf[model.getFrameId(f"{leg}_foot")].translation for leg in legs])
    np.testing.assert_allclose(feet[:, 2], -0.4, atol=1e-15)
    # Random configurations: the floating-base mass matrix stays positive definite.
    rng = _rng(5)
    for _ in range(5):
        q = pin.randomConfiguration(model)
        q[:3] = rng.uniform(-1, 1, 3)
        mass = pin.crba(model, data, q)
        mass = np.triu(mass) + np.triu(mass, 1).T
        assert np.linalg.eigvalsh(mass)[0] > 0


def test_quadruped_not_accidentally_symmetric():
    root = _xml("quadruped")
    trunk = root.find("link[@name='trunk']/inertial")
    com = np.array([float(x) for x in trunk.find("origin").get("xyz").split()])
    assert np.all(com != 0)
    inertia = _inertia_matrix(trunk.find("inertia"))
    assert np.all(inertia[np.triu_indices(3, 1)] != 0)
    left = _inertia_matrix(root.find("link[@name='FL_thigh']/inertial/inertia"))
    right = _inertia_matrix(root.find("link[@name='FR_thigh']/inertial/inertia"))
    mirror = np.diag([1.0, -1.0, 1.0])
    np.testing.assert_array_equal(right, mirror @ left @ mirror)
    assert not np.array_equal(left, right)


# ---------------------------------------------------------------- bad names


def test_unknown_name_lists_valid_and_close():
    with pytest.raises(UnknownRobotError) as info:
        get_data_path("pandaa")
    err = info.value
    assert isinstance(err, ValueError)
    assert err.name == "pandaa"
    assert err.candidates[0] == "panda"
    assert err.valid == SHIPPED
    message = str(err)
    assert "'pandaa'" in message and "Did you mean 'panda'?" in message
    for name in SHIPPED:
        assert repr(name) in message
    assert "example-robot-data:" in message


def test_unknown_name_without_close_match():
    with pytest.raises(UnknownRobotError) as info:
        get_data_path("zzzz")
    assert info.value.candidates == ()
    assert "Did you mean" not in str(info.value)
    assert "'cartpole'" in str(info.value)


def test_example_robot_name_without_prefix_points_to_prefix():
    with pytest.raises(UnknownRobotError, match="'example-robot-data:ur5'"):
        get_data_path("ur5")


def test_name_must_be_a_string():
    with pytest.raises(TypeError, match="from_urdf"):
        get_data_path(get_data_path("panda"))


# ------------------------------------------------------- example-robot-data

REQUIRED_EXAMPLE_ROBOTS = (
    "ur3", "ur5", "ur10", "panda", "z1", "kinova", "xarm7",
    "solo12", "go1", "a1", "anymal", "talos",
)  # fmt: skip


def test_example_robot_data_dir_found():
    root = example_robot_data_dir()
    assert root.is_absolute() and root.is_dir()
    assert root.parts[-3:] == ("share", "example-robot-data", "robots")


def test_example_robots_listed_and_present():
    names = list_example_robots()
    assert names == tuple(sorted(names))
    for name in REQUIRED_EXAMPLE_ROBOTS:
        assert name in names, name
    for name in names:
        path = get_data_path(f"example-robot-data:{name}")
        assert path.is_file() and path.suffix == ".urdf", name


@pytest.mark.parametrize(
    ("name", "file", "nq"),
    [("ur5", "ur5_robot.urdf", 6), ("solo12", "solo12.urdf", 12)],
)
def test_example_robot_resolves_and_parses(name, file, nq):
    path = get_data_path(f"example-robot-data:{name}")
    assert path.name == file
    assert path.is_relative_to(example_robot_data_dir())
    assert get_data_path(f"example-robot-data:{name}.urdf") == path
    assert pin.buildModelFromUrdf(str(path)).nq == nq


def test_example_robot_relative_path():
    rel = "ur_description/urdf/ur5_gripper.urdf"
    path = get_data_path(f"example-robot-data:{rel}")
    assert path == example_robot_data_dir() / rel
    with pytest.raises(UnknownRobotError):
        get_data_path("example-robot-data:../../../../robots/ur_description/urdf/ur5_robot.urdf")
    with pytest.raises(UnknownRobotError):
        get_data_path("example-robot-data:ur_description/urdf/nothing.urdf")


def test_example_robot_unknown_name():
    with pytest.raises(UnknownRobotError) as info:
        get_data_path("example-robot-data:ur6")
    assert "ur5" in info.value.candidates
    assert "'solo12'" in str(info.value)
    assert isinstance(info.value, ValueError)


def test_missing_example_robot_data(monkeypatch):
    monkeypatch.setattr(bd._example_robot_data, "_candidate_roots", lambda: iter(()))
    for call in (
        example_robot_data_dir,
        list_example_robots,
        lambda: get_data_path("example-robot-data:ur5"),
    ):
        with pytest.raises(MissingDependencyError, match="pip install example-robot-data") as info:
            call()
        assert isinstance(info.value, ImportError)
        assert "make test" in str(info.value)
    # Shipped models do not need the package.
    assert get_data_path("panda").is_file()


# ---------------------------------------------------------------------- load


def test_load_returns_robot_model():
    from backdrive.model import RobotModel

    panda = load("panda")
    assert isinstance(panda, RobotModel)
    # Mimic joints are not independent coordinates (DESIGN.md).
    assert panda.nq == 8
    assert float(panda.total_mass) == pytest.approx(
        sum(float(x.get("value")) for x in _xml("panda").iter("mass")), abs=1e-12
    )
    quadruped = load("quadruped", floating_base=True)
    assert (quadruped.nq, quadruped.nv) == (19, 18)
    with pytest.raises(UnknownRobotError):
        load("not-a-robot")


# ------------------------------------------------------- issue 14: robots as they come


def test_name_type_error_is_typed():
    from backdrive import InputTypeError

    with pytest.raises(InputTypeError, match="from_urdf"):
        get_data_path(3)


def test_alex_psyonic_hands_loads_with_mimic_false():
    # its <mimic> tags name leaders without the Left_/Right_ prefix
    with pytest.raises(backdrive_errors.UnknownNameError, match="mimic=False"):
        bd.load("example-robot-data:alex_psyonic_hands")
    m = bd.load("example-robot-data:alex_psyonic_hands", mimic=False)
    ref = pin.buildModelFromUrdf(str(get_data_path("example-robot-data:alex_psyonic_hands")))  # mimic off
    assert m.nv == ref.nv


def test_romeo_hands_are_flagged_and_armature_makes_dynamics_finite():
    import torch

    import backdrive.dynamics as D

    with pytest.warns(UserWarning, match=r"\('LHand', 'RHand'\).*replace\(armature="):
        m = bd.load("example-robot-data:romeo", floating_base=True)
    q = m.neutral()
    zero = torch.zeros(m.nv, dtype=m.dtype)
    assert not torch.isfinite(D.forward_dynamics(m, q, zero, zero)).all()
    arm = m.armature.clone()
    for name in m.zero_inertia_joints():
        arm[m.joint_index(name)] = 1e-3
    fixed = m.replace(armature=arm)
    assert fixed.zero_inertia_joints() == ()
    assert torch.isfinite(D.forward_dynamics(fixed, q, zero, zero)).all()


def test_every_example_robot_loads():
    """TIAGo's three variants used to be refused; with mimic=False for the one broken <mimic>."""
    import warnings

    failed = {}
    for name in bd.list_example_robots():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                bd.load(f"example-robot-data:{name}", mimic=name != "alex_psyonic_hands")
            except backdrive_errors.BackdriveError as exc:
                failed[name] = str(exc)[:120]
    assert failed == {}


def test_load_unknown_option_names_the_closest():
    from backdrive import InputTypeError

    with pytest.raises(InputTypeError, match="unknown option 'floatng_base'; did you mean 'floating_base'"):
        bd.load("panda", floatng_base=True)
