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
