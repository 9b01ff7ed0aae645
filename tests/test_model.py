"""RobotModel: URDF loading, the malformed-URDF corpus, immutability, copies."""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path

import numpy as np
import pinocchio as pin
import pytest
import torch

import backdrive
from backdrive import InputError, ModelError, RobotModel, UnknownNameError
from backdrive.model import JointType

CORPUS = sorted((Path(__file__).parent / "data" / "malformed").glob("*.urdf"))
EXPECT = re.compile(r"<!-- expect (\w+): (.*?) -->")

SMALL = """<?xml version="1.0" encoding="UTF-8"?>
<robot name="small">
  <link name="base">
    <inertial><origin xyz="0 0 0.1" rpy="0.3 0.2 0.1"/><mass value="2"/>
      <inertia ixx="0.3" ixy="0.01" ixz="0.02" iyy="0.2" iyz="0.03" izz="0.1"/></inertial>
  </link>
  <link name="upper">
    <inertial><origin xyz="0.05 0 0.2" rpy="0 0.5 0"/><mass value="1.5"/>
      <inertia ixx="0.05" ixy="0" ixz="0" iyy="0.04" iyz="0" izz="0.01"/></inertial>
    <visual><origin xyz="0 0 0.2"/><geometry><cylinder radius="0.05" length="0.4"/></geometry>
      <material name="red"><color rgba="1 0 0 1"/></material></visual>
  </link>
  <link name="bracket">
    <inertial><origin xyz="0.01 0.02 0.03"/><mass value="0.5"/>
      <inertia ixx="0.002" ixy="0" ixz="0" iyy="0.002" iyz="0" izz="0.001"/></inertial>
    <collision><geometry><box size="0.1 0.1 0.05"/></geometry></collision>
  </link>
  <link name="slider"><inertial><mass value="0.3"/>
      <inertia ixx="0.001" ixy="0" ixz="0" iyy="0.001" iyz="0" izz="0.001"/></inertial></link>
  <link name="finger_a"><inertial><mass value="0.1"/>
      <inertia ixx="1e-4" ixy="0" ixz="0" iyy="1e-4" iyz="0" izz="1e-4"/></inertial></link>
  <link name="finger_b"><inertial><mass value="0.1"/>
      <inertia ixx="1e-4" ixy="0" ixz="0" iyy="1e-4" iyz="0" izz="1e-4"/></inertial></link>
  <link name="tool"/>
  <joint name="shoulder" type="revolute">
    <parent link="base"/><child link="upper"/><origin xyz="0 0 0.3" rpy="0.1 -0.2 0.3"/>
    <axis xyz="0 1 1"/><limit lower="-2" upper="2" effort="30" velocity="3"/>
    <dynamics damping="0.2" friction="0.1"/>
  </joint>
  <joint name="bolt" type="fixed">
    <parent link="upper"/><child link="bracket"/><origin xyz="0 0.1 0.4" rpy="0 0 1.2"/>
  </joint>
  <joint name="wrist" type="continuous">
    <parent link="bracket"/><child link="slider"/><origin xyz="0 0 0.05"/><axis xyz="1 0 0"/>
  </joint>
  <joint name="grip_a" type="prismatic">
    <parent link="slider"/><child link="finger_a"/><origin xyz="0 0.02 0"/><axis xyz="0 1 0"/>
    <limit lower="0" upper="0.04" effort="10" velocity="0.1"/>
  </joint>
  <joint name="grip_b" type="prismatic">
    <parent link="slider"/><child link="finger_b"/><origin xyz="0 -0.02 0"/><axis xyz="0 -1 0"/>
    <limit lower="0" upper="0.04" effort="10" velocity="0.1"/>
    <mimic joint="grip_a" multiplier="1.0" offset="0.001"/>
  </joint>
  <joint name="tool_mount" type="fixed">
    <parent link="slider"/><child link="tool"/><origin xyz="0.1 0 0"/>
  </joint>
</robot>
"""


def test_corpus_is_large_enough():
    assert len(CORPUS) >= 25


@pytest.mark.parametrize("path", CORPUS, ids=[p.stem for p in CORPUS])
def test_malformed_urdf_raises_typed_error(path: Path):
    text = path.read_text()
    cls_name, fragment = EXPECT.search(text).groups()
    cls = getattr(backdrive, cls_name)
    assert issubclass(cls, ModelError) and issubclass(cls, ValueError)
    for source in (path, str(path), text, text.encode()):
        with pytest.raises(cls) as info:
            RobotModel.from_urdf(source)
        assert fragment in str(info.value), (str(info.value), fragment)


def test_unknown_link_names_closest_candidates():
    with pytest.raises(UnknownNameError) as info:
        RobotModel.from_urdf((Path(__file__).parent / "data/malformed/missing_parent_link.urdf"))
    assert info.value.candidates[0] == "base"
    assert "closest: 'base'" in str(info.value)


def test_missing_file_and_bad_source_type():
    with pytest.raises(ModelError, match="not found"):
        RobotModel.from_urdf(Path("/nonexistent/robot.urdf"))
    with pytest.raises(ModelError, match="text, bytes or a path"):
        RobotModel.from_urdf(12)


@pytest.fixture(scope="module")
def small() -> RobotModel:
    return RobotModel.from_urdf(SMALL)


def test_encoding_declaration_text_and_bytes(small, tmp_path):
    assert small.name == "small"
    from_bytes = RobotModel.from_urdf(SMALL.encode("utf-8"))
    f = tmp_path / "small.urdf"
    f.write_text(SMALL)
    from_path = RobotModel.from_urdf(f)
    assert small.fingerprint == from_bytes.fingerprint == from_path.fingerprint
    assert from_path.source_path == f


def test_structure_fixed_folding_and_mimic(small):
    assert small.body_names == ("base", "upper", "slider", "finger_a", "finger_b")
    assert small.link_names == ("base", "upper", "bracket", "slider", "finger_a", "finger_b", "tool")
    assert small.joint_names == ("shoulder", "wrist", "grip_a")
    assert (small.nq, small.nv, small.dof, small.num_joints) == (3, 3, 3, 3)
    assert small.joint_type == (
        JointType.ROOT, JointType.REVOLUTE, JointType.REVOLUTE, JointType.PRISMATIC, JointType.PRISMATIC,
    )
    assert small.parent.tolist() == [-1, 0, 1, 2, 2]
    assert small.joint_coordinate.tolist() == [-1, 0, 1, 2, 2]
    assert small.joint_offset.tolist() == [0, 0, 0, 0, 0.001]
    # bracket is folded into body "upper"; tool into body "slider".
    assert small.frame_body.tolist() == [0, 1, 1, 2, 3, 4, 2]
    assert [lv.tolist() for lv in small.levels] == [[0], [1], [2], [3, 4]]
    assert [lp.tolist() for lp in small.level_parent] == [[], [0], [0], [0, 0]]
    assert math.isinf(float(small.lower[1])) and float(small.upper[2]) == 0.04
    assert small.damping.tolist() == [0.2, 0.0, 0.0] and small.friction.tolist() == [0.1, 0.0, 0.0]
    assert small.effort_limit.tolist() == [30.0, math.inf, 10.0]
    torch.testing.assert_close(small.joint_axis[1], torch.tensor([0, 1, 1], dtype=torch.float64) / math.sqrt(2))
    assert [g.geometry.kind for g in small.visuals] == ["cylinder"]
    assert small.visuals[0].geometry.rgba == (1.0, 0.0, 0.0, 1.0)
    assert [(g.link, g.geometry.kind) for g in small.collisions] == [("bracket", "box")]


def test_inertias_match_pinocchio(small):
    """Merged body inertias (fixed links folded, inertial rpy applied) equal Pinocchio's."""
    pm = pin.buildModelFromXML(SMALL, mimic=True)
    for b, name in enumerate(small.body_names):
        jid = 0 if b == 0 else pm.getJointId(small.body_joint_names[b])
        Y = pm.inertias[jid]
        if b == 0:
            # Pinocchio keeps the root link's inertia on the universe joint.
            Y = pm.inertias[0]
        np.testing.assert_allclose(float(small.body_mass[b]), Y.mass, rtol=1e-12)
        np.testing.assert_allclose(small.body_com[b].numpy(), Y.lever, atol=1e-12)
        np.testing.assert_allclose(small.body_inertia[b].numpy(), Y.inertia, atol=1e-12)
    np.testing.assert_allclose(float(small.total_mass), 4.5, rtol=1e-12)


def test_floating_base_layout(small):
    fb = RobotModel.from_urdf(SMALL, floating_base=True)
    assert (fb.nq, fb.nv) == (10, 9) and fb.joint_type[0] == JointType.FREE
    q0 = fb.neutral()
    assert q0[:7].tolist() == [0, 0, 0, 1, 0, 0, 0]
    q = fb.random_q(5, generator=torch.Generator().manual_seed(0))
    assert q.shape == (5, 10)
    torch.testing.assert_close(q[:, 3:7].norm(dim=-1), torch.ones(5, dtype=torch.float64))
    assert fb.fingerprint != small.fingerprint


def test_random_q_within_limits(small):
    q = small.random_q(200, generator=torch.Generator().manual_seed(1))
    assert bool(((q >= torch.where(torch.isinf(small.lower), -math.pi, small.lower)) & (q <= torch.where(torch.isinf(small.upper), math.pi, small.upper))).all())


def test_immutable_and_to(small):
    with pytest.raises(dataclasses.FrozenInstanceError):
        small.name = "other"  # type: ignore[misc]
    f32 = small.to(dtype=torch.float32)
    assert f32.dtype == torch.float32 and f32.body_inertia.dtype == torch.float32
    assert f32.parent.dtype == torch.long
    back = f32.to(dtype=torch.float64)
    # Re-cast from the float64 master: exact, not a float32 round trip.
    assert torch.equal(back.joint_placement, small.joint_placement)
    assert torch.equal(back.body_inertia, small.body_inertia)
    assert f32.fingerprint == small.fingerprint
    assert small.double().dtype == torch.float64 and small.float().dtype == torch.float32
    with pytest.raises(InputError, match="float32 or torch.float64"):
        small.to(dtype=torch.float16)


def test_replace_parameters_keeps_topology(small):
    m = small.body_mass.clone().requires_grad_(True)
    r = small.replace(body_mass=m)
    assert r.body_mass is m and r.fingerprint == small.fingerprint
    (r.body_mass * 2).sum().backward()
    assert torch.equal(m.grad, torch.full_like(m, 2.0))
    # .to keeps the replaced tensor (cast with Tensor.to) and its graph.
    r32 = r.to(dtype=torch.float32)
    assert r32.body_mass.grad_fn is not None
    with pytest.raises(UnknownNameError, match="closest: 'body_mass'"):
        small.replace(body_mas=m)
    with pytest.raises(InputError, match="shape"):
        small.replace(body_mass=torch.ones(3, dtype=torch.float64))
    with pytest.raises(InputError, match="float64"):
        small.replace(damping=torch.ones(3, dtype=torch.float32))


def test_names_and_errors(small):
    assert small.frame_index("tool") == 6
    assert small.joint_index("wrist") == 1
    assert small.body_index("finger_b") == 4
    with pytest.raises(UnknownNameError) as info:
        small.frame_index("tol")
    assert "tool" in info.value.candidates
    with pytest.raises(UnknownNameError, match="mimic"):
        small.joint_index("grip_b")
    with pytest.raises(UnknownNameError, match="closest: 'shoulder'"):
        small.joint_index("shouldr")


def test_check_inputs(small):
    small.check_q(torch.zeros(4, 3, dtype=torch.float64))
    with pytest.raises(InputError, match=r"\(\.\.\., 3\)"):
        small.check_q(torch.zeros(4, 2, dtype=torch.float64))
    with pytest.raises(InputError, match="dtype"):
        small.check_q(torch.zeros(3, dtype=torch.float32))
    with pytest.raises(InputError, match="torch.Tensor"):
        small.check_q([0.0, 0.0, 0.0])


def test_fingerprint_tracks_geometry():
    a = RobotModel.from_urdf(SMALL)
    b = RobotModel.from_urdf(SMALL.replace('xyz="0.1 0 0"/>\n  </joint>\n</robot>', 'xyz="0.1 0 1e-9"/>\n  </joint>\n</robot>'))
    c = RobotModel.from_urdf(SMALL.replace('<mass value="0.3"/>', '<mass value="0.4"/>'))
    assert a.fingerprint != b.fingerprint
    assert a.fingerprint == c.fingerprint  # inertia is not geometry
    assert len(a.fingerprint) == 64


def test_describe_lists_tree(small):
    text = small.describe()
    assert "nq=3" in text and "total mass 4.5 kg" in text
    assert "grip_b [prismatic, mimic 1 * grip_a + 0.001]" in text
    assert ". bracket (fixed frame)" in text
    assert "wrist [revolute, q[1], limits unbounded" in text


def test_public_all_resolves():
    import backdrive.model

    for mod in (backdrive, backdrive.model):
        for name in mod.__all__:
            assert hasattr(mod, name), name


# --------------------------------------------------------------------------- issue 14 part 3: loading

import warnings  # noqa: E402

from backdrive import InputTypeError, InvalidValueError, URDFParseError  # noqa: E402
from backdrive.model._urdf import nearest_physical_inertia  # noqa: E402


def _two_links(inertia_b: str, mass_b: float = 1e-6, heavy: float = 0.5) -> str:
    return f"""<robot name="r">
  <link name="base"><inertial><mass value="10"/>
    <inertia ixx="{heavy}" iyy="{heavy}" izz="{heavy}" ixy="0" ixz="0" iyz="0"/></inertial></link>
  <link name="antenna"><inertial><mass value="{mass_b}"/>
    <inertia {inertia_b}/></inertial></link>
  <joint name="j" type="revolute"><parent link="base"/><child link="antenna"/><axis xyz="0 0 1"/>
    <limit lower="-1" upper="1" effort="1" velocity="1"/></joint>
</robot>"""


# TIAGo's base_antenna_left_link, as example-robot-data 6.0.0 ships it (eigenvalue -3.5e-8).
TIAGO_ANTENNA = 'ixx="0.00000002371" ixy="0.00000006119" ixz="0.00000001179" iyy="0.00000002833" iyz="0.00000000774" izz="0.00000003849"'


def test_tiny_inertia_violation_is_repaired_with_a_warning_naming_the_link():
    with pytest.warns(UserWarning, match=r"link 'antenna' <inertia>.*not positive semi-definite.*repaired") as rec:
        m = RobotModel.from_urdf(_two_links(TIAGO_ANTENNA))
    assert "strict=True" in str(rec[0].message) and "largest entry change" in str(rec[0].message)
    I = m.body_inertia[1].numpy()
    eig = np.linalg.eigvalsh(I)
    assert eig.min() > -1e-20
    # physical: the principal moments obey the triangle inequality
    assert eig[0] + eig[1] >= eig[2] - 1e-20
    # the change is tiny: of the size of the violation
    raw = np.array([[2.371e-8, 6.119e-8, 1.179e-8], [6.119e-8, 2.833e-8, 7.74e-9], [1.179e-8, 7.74e-9, 3.849e-8]])
    assert np.abs(I - raw).max() < 1e-7
    with pytest.raises(InvalidValueError, match="strict=True refuses"):
        RobotModel.from_urdf(_two_links(TIAGO_ANTENNA), strict=True)


def test_large_inertia_violation_is_still_refused():
    bad = 'ixx="-0.1" iyy="0.2" izz="0.2" ixy="0" ixz="0" iyz="0"'
    with pytest.raises(InvalidValueError, match="not positive semi-definite.*too large to repair"):
        RobotModel.from_urdf(_two_links(bad, mass_b=1.0))


def test_nearest_physical_inertia_is_a_projection():
    rng = np.random.default_rng(0)
    for _ in range(50):
        A = rng.normal(size=(3, 3))
        I = A + A.T
        P = nearest_physical_inertia(I)
        lam = np.linalg.eigvalsh(P)
        assert lam.min() >= -1e-12 and lam[0] + lam[1] >= lam[2] - 1e-12
        # idempotent, and no random physical inertia with the same axes is closer
        assert np.abs(nearest_physical_inertia(P) - P).max() < 1e-12
        _, V = np.linalg.eigh(I)
        for _ in range(20):
            d = rng.uniform(0, 2, size=3)
            Q = (V * np.array([d[1] + d[2], d[0] + d[2], d[0] + d[1]])) @ V.T
            assert np.linalg.norm(Q - I) >= np.linalg.norm(P - I) - 1e-12
    good = np.diag([1.0, 2.0, 2.5])
    assert np.abs(nearest_physical_inertia(good) - good).max() < 1e-15


@pytest.mark.parametrize("name", ["tiago", "tiago_dual", "tiago_no_hand"])
def test_tiago_loads_with_the_same_coordinates_and_mass_as_pinocchio(name):
    from backdrive.data import get_data_path, load

    try:
        path = get_data_path(f"example-robot-data:{name}")
    except backdrive.MissingDependencyError:
        pytest.skip("example-robot-data is not installed")
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        m = load(f"example-robot-data:{name}")
    repaired = sorted(re.search(r"link '(\w+)'", str(w.message)).group(1) for w in rec if "repaired" in str(w.message))
    assert repaired == ["base_antenna_left_link", "base_antenna_right_link"]
    ref = pin.buildModelFromUrdf(str(path))
    assert m.nv == ref.nv  # (Pinocchio's nq counts cos/sin for the continuous wheels)
    assert abs(float(m.total_mass) - sum(i.mass for i in ref.inertias)) < 1e-9


ROMEO_LIKE = """<robot name="hand">
  <link name="palm"><inertial><mass value="1"/>
    <inertia ixx="0.01" iyy="0.01" izz="0.01" ixy="0" ixz="0" iyz="0"/></inertial></link>
  <link name="finger"/>
  <link name="arm"><inertial><mass value="1"/>
    <inertia ixx="0.01" iyy="0.01" izz="0.01" ixy="0" ixz="0" iyz="0"/></inertial></link>
  <joint name="LHand" type="revolute"><parent link="palm"/><child link="finger"/><axis xyz="0 0 1"/>
    <limit lower="-1" upper="1" effort="1" velocity="1"/></joint>
  <joint name="elbow" type="revolute"><parent link="palm"/><child link="arm"/><origin xyz="0.2 0 0"/>
    <axis xyz="0 1 0"/><limit lower="-1" upper="1" effort="1" velocity="1"/></joint>
</robot>"""


def test_zero_inertia_coordinates_are_warned_and_armature_fixes_them():
    import backdrive.dynamics as D

    with pytest.warns(UserWarning, match=r"moves no mass or inertia \('LHand'\).*replace\(armature="):
        m = RobotModel.from_urdf(ROMEO_LIKE)
    assert m.zero_inertia_joints() == ("LHand",)
    q = m.neutral()
    a = D.forward_dynamics(m, q, torch.zeros_like(q), torch.zeros_like(q))
    assert not torch.isfinite(a).all()  # what the warning is about
    fixed = m.replace(armature=torch.tensor([1e-3, 0.0], dtype=torch.float64))
    assert fixed.zero_inertia_joints() == ()
    assert torch.isfinite(D.forward_dynamics(fixed, q, torch.zeros_like(q), torch.zeros_like(q))).all()
    with pytest.raises(InvalidValueError, match="strict=True"):
        RobotModel.from_urdf(ROMEO_LIKE, strict=True)
    # a kinematics-only description (no mass at all) is not flagged
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        RobotModel.from_urdf(_massless())


def _massless() -> str:
    return """<robot name="k"><link name="a"/><link name="b"/>
      <joint name="j" type="continuous"><parent link="a"/><child link="b"/></joint></robot>"""


def test_zero_inertia_diagonal_matches_the_mass_matrix(small):
    import backdrive.dynamics as D
    from backdrive.model._model import _mass_matrix_diagonal

    for model in (small, RobotModel.from_urdf(SMALL, floating_base=True), backdrive.data.load("panda")):
        M = D.mass_matrix(model, model.neutral())
        nb = 6 if model.floating_base else 0
        want = torch.diagonal(M)[nb:].numpy()
        assert np.abs(_mass_matrix_diagonal(model) - want).max() < 1e-12 * max(1.0, np.abs(want).max())


MIMIC_BROKEN = """<robot name="m">
  <link name="a"><inertial><mass value="1"/><inertia ixx="1" iyy="1" izz="1" ixy="0" ixz="0" iyz="0"/></inertial></link>
  <link name="b"><inertial><mass value="1"/><inertia ixx="1" iyy="1" izz="1" ixy="0" ixz="0" iyz="0"/></inertial></link>
  <link name="c"><inertial><mass value="1"/><inertia ixx="1" iyy="1" izz="1" ixy="0" ixz="0" iyz="0"/></inertial></link>
  <joint name="Left_q1" type="revolute"><parent link="a"/><child link="b"/><axis xyz="0 0 1"/>
    <limit lower="-1" upper="1" effort="1" velocity="1"/></joint>
  <joint name="Left_q2" type="revolute"><parent link="b"/><child link="c"/><axis xyz="0 0 1"/>
    <limit lower="-1" upper="1" effort="1" velocity="1"/><mimic joint="q1" multiplier="1.1"/></joint>
</robot>"""


def test_broken_mimic_has_a_way_out():
    # alex_psyonic_hands: the mimic leader's name lacks the side prefix
    with pytest.raises(UnknownNameError, match="mimic=False") as info:
        RobotModel.from_urdf(MIMIC_BROKEN)
    assert info.value.candidates[0] == "Left_q1"
    m = RobotModel.from_urdf(MIMIC_BROKEN, mimic=False)
    assert m.joint_names == ("Left_q1", "Left_q2")
    # mimic=False on a sound model: every mimic joint becomes a coordinate (Pinocchio without mimic=True)
    assert RobotModel.from_urdf(SMALL, mimic=False).num_joints == RobotModel.from_urdf(SMALL).num_joints + 1


def test_replace_gets_the_loaders_checks(small):
    m = small.body_mass.clone()
    with pytest.raises(InvalidValueError, match="body 'upper' has negative mass -"):
        small.replace(body_mass=torch.where(torch.arange(len(m)) == 1, -m, m))
    with pytest.raises(InvalidValueError, match="negative damping"):
        small.replace(damping=-torch.ones_like(small.damping))
    for name in ("friction", "armature"):
        with pytest.raises(InvalidValueError, match=f"negative {name}"):
            small.replace(**{name: torch.full_like(small.damping, -0.1)})
    with pytest.raises(InvalidValueError, match="not finite"):
        small.replace(body_com=torch.full_like(small.body_com, math.nan))
    with pytest.raises(InvalidValueError, match="not finite"):
        small.replace(gravity=torch.tensor([0.0, 0.0, math.inf], dtype=torch.float64))
    I = small.body_inertia.clone()
    I[2] = torch.diag(torch.tensor([-0.1, 0.2, 0.2], dtype=torch.float64))
    with pytest.raises(InvalidValueError, match="not positive semi-definite"):
        small.replace(body_inertia=I)
    I = small.body_inertia.clone()
    I[0, 0, 1] += 0.01
    with pytest.raises(InvalidValueError, match="not symmetric"):
        small.replace(body_inertia=I)
    # grad-requiring values are not checked: gradcheck steps to -1e-6 at a zero mass
    # (the root link of the double pendulum), and optimisers may step outside too
    at_boundary = m.clone()
    at_boundary[0] = -1e-6
    assert small.replace(body_mass=at_boundary.requires_grad_(True)).body_mass[0] == -1e-6
    ok = m.clone().requires_grad_(True)
    assert small.replace(body_mass=ok * 2).body_mass.grad_fn is not None


def test_replace_inside_torch_func_is_not_checked(small):
    import backdrive.dynamics as D
    from torch.func import jacrev

    q = small.neutral()
    J = jacrev(lambda mm: D.inverse_dynamics(small.replace(body_mass=mm), q, q * 0, q * 0 + 1))(small.body_mass)
    assert J.shape == (small.nv, small.num_bodies) and torch.isfinite(J).all()


def test_source_messages(tmp_path, monkeypatch):
    text = SMALL
    # a byte-order mark in a str (e.g. read with encoding='utf-8' instead of 'utf-8-sig')
    assert RobotModel.from_urdf("\ufeff" + text).fingerprint == RobotModel.from_urdf(text).fingerprint
    assert RobotModel.from_urdf("\ufeff" + text.split("?>", 1)[1]).num_joints == 3
    assert RobotModel.from_urdf(b"\xef\xbb\xbf" + text.encode()).num_joints == 3
    with pytest.raises(URDFParseError, match="empty string"):
        RobotModel.from_urdf("")
    with pytest.raises(URDFParseError, match="empty"):
        RobotModel.from_urdf(b"  ")
    with pytest.raises(URDFParseError, match="is a directory, not a URDF file"):
        RobotModel.from_urdf(tmp_path)
    (tmp_path / "a.urdf").write_text(text)
    with pytest.raises(URDFParseError, match="URDF files in it: a.urdf"):
        RobotModel.from_urdf(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(URDFParseError, match=r"backdrive.data.load\('example-robot-data:ur5'\)"):
        RobotModel.from_urdf("ur5")
    with pytest.raises(URDFParseError, match=r"shipped with backdrive: backdrive.data.load\('panda'\)"):
        RobotModel.from_urdf("panda.urdf")
    with pytest.raises(URDFParseError, match="relative to the working directory"):
        RobotModel.from_urdf("nothing_here.urdf")
    with pytest.raises(URDFParseError, match="cannot read URDF file|not found"):
        RobotModel.from_urdf("x" * 5000)  # was "File name too long" from the OS


XACRO = """<?xml version="1.0"?>
<robot name="arm" xmlns:xacro="http://www.ros.org/wiki/xacro">
  <xacro:property name="len" value="0.3"/>
  <link name="base"/>
</robot>"""


def test_xacro_input_says_to_expand_it(tmp_path):
    with pytest.raises(URDFParseError, match=r"xacro markup \(<xacro:property>\).*expanded to plain URDF first"):
        RobotModel.from_urdf(XACRO)
    expr = '<robot name="a"><link name="b"><visual><geometry><box size="${s} 1 1"/></geometry></visual></link></robot>'
    with pytest.raises(URDFParseError, match="unexpanded xacro expression"):
        RobotModel.from_urdf(expr)
    p = tmp_path / "arm.urdf.xacro"
    p.write_text(XACRO.replace(' xmlns:xacro="http://www.ros.org/wiki/xacro"', ""))  # unbound prefix
    with pytest.raises(URDFParseError, match=r"uses xacro.*xacro robot.urdf.xacro"):
        RobotModel.from_urdf(p)
    with pytest.raises(URDFParseError, match="MJCF"):
        RobotModel.from_urdf('<mujoco model="m"><worldbody/></mujoco>')


# --------------------------------------------------------------------------- issue 14 part 4: dtype and device


def test_dtype_errors_suggest_only_possible_fixes(small):
    for bad in (torch.int64, torch.float16, torch.bfloat16):
        with pytest.raises(InputTypeError) as info:
            small.check_q(torch.zeros(3, dtype=bad))
        msg = str(info.value)
        assert f"model.to(dtype={bad})" not in msg and "q.to(torch.float64)" in msg, msg
    with pytest.raises(InputTypeError, match=r"model.to\(dtype=torch.float32\)"):
        small.check_q(torch.zeros(3, dtype=torch.float32))
    from backdrive.kinematics import SerialChainKinematics

    chain = SerialChainKinematics.from_model(small.float(), end_link_name="tool")
    with pytest.raises(InputTypeError, match="float32 or float64 only"):
        chain.forward_kinematics(torch.zeros(chain.dof, dtype=torch.int64))


@pytest.mark.parametrize("device", ["gpu", "cuda:", "npu0", 3.5])
def test_unknown_device_strings_name_the_device(device):
    with pytest.raises(InputError, match=re.escape(repr(device))):
        RobotModel.from_urdf(SMALL, device=device)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a build or machine without CUDA")
def test_cuda_on_a_cpu_machine_is_an_input_error(small):
    for call in (
        lambda: RobotModel.from_urdf(SMALL, device="cuda"),
        lambda: small.to(device="cuda"),
        lambda: small.to(device=torch.device("cuda:0")),
    ):
        with pytest.raises(InputError, match=r"device 'cuda(:0)?' is not available here.*available: 'cpu'"):
            call()
    from backdrive.kinematics import SerialChainKinematics

    with pytest.raises(InputError, match="not available"):
        SerialChainKinematics.from_model(small, end_link_name="tool").to(device="cuda")


@pytest.mark.parametrize("numpy_path", [True, False])
def test_replace_fast_check_both_paths_agree(small, numpy_path):
    """The numpy (CPU) and the fused-torch (other devices) paths of the replace() check."""
    from backdrive.model._model import _physical_ok

    good = {k: getattr(small, k) for k in ("body_mass", "body_com", "body_inertia", "damping", "friction", "armature", "gravity")}
    assert _physical_ok(good, numpy_path)
    I_bad = small.body_inertia.clone()
    I_bad[1] = torch.diag(torch.tensor([-1e-3, 1.0, 1.0], dtype=torch.float64))
    I_asym = small.body_inertia.clone()
    I_asym[0, 1, 2] += 1e-3
    for k, v in {
        "body_mass": -small.body_mass,
        "damping": torch.full_like(small.damping, -1e-9),
        "body_com": torch.full_like(small.body_com, math.inf),
        "gravity": torch.tensor([0.0, math.nan, 0.0], dtype=torch.float64),
        "body_inertia": I_bad,
    }.items():
        assert not _physical_ok(dict(good, **{k: v}), numpy_path), k
    assert not _physical_ok(dict(good, body_inertia=I_asym), numpy_path)
    # rounding-level negative eigenvalues (1e-12 of a 1 kg m^2 inertia) pass, as in the loader
    I_round = small.body_inertia.clone()
    I_round[1] = torch.diag(torch.tensor([-1e-12, 1.0, 1.0], dtype=torch.float64))
    assert _physical_ok(dict(good, body_inertia=I_round), numpy_path)


def test_home_relative_path(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "r.urdf").write_text(SMALL)
    assert RobotModel.from_urdf("~/r.urdf").num_joints == 3
