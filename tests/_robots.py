"""URDF fixtures shared by several test modules (test modules never import each other)."""

from __future__ import annotations

import torch

from backdrive import RobotModel

# A small tree exercising every feature at once: a tilted revolute joint, a
# prismatic joint, a branch, a revolute mimic with multiplier and offset,
# fixed joints whose inertias fold into their parents, rotated inertial
# frames with products of inertia, and a continuous joint.
SMALL_URDF = """<?xml version="1.0"?>
<robot name="small_tree">
  <link name="base">
    <inertial><origin xyz="0.02 -0.01 0.05" rpy="0.1 0.2 0.3"/><mass value="3.0"/>
      <inertia ixx="0.05" ixy="0.002" ixz="-0.001" iyy="0.04" iyz="0.003" izz="0.03"/></inertial>
  </link>
  <link name="arm">
    <inertial><origin xyz="0.1 0.02 0.15" rpy="0.4 -0.2 0.1"/><mass value="1.2"/>
      <inertia ixx="0.02" ixy="0.001" ixz="0.0" iyy="0.015" iyz="-0.002" izz="0.01"/></inertial>
  </link>
  <link name="bracket">
    <inertial><origin xyz="0.0 0.03 0.0"/><mass value="0.4"/>
      <inertia ixx="0.001" ixy="0" ixz="0" iyy="0.002" iyz="0" izz="0.001"/></inertial>
  </link>
  <link name="slider">
    <inertial><origin xyz="0.01 0.0 -0.02" rpy="0 0.3 0"/><mass value="0.6"/>
      <inertia ixx="0.003" ixy="0" ixz="0.0005" iyy="0.002" iyz="0" izz="0.001"/></inertial>
  </link>
  <link name="wheel">
    <inertial><origin xyz="0 0 0.01"/><mass value="0.3"/>
      <inertia ixx="0.0008" ixy="0" ixz="0" iyy="0.0008" iyz="0" izz="0.0012"/></inertial>
  </link>
  <link name="leg">
    <inertial><origin xyz="0.0 0.05 -0.1" rpy="0.2 0 0"/><mass value="0.9"/>
      <inertia ixx="0.01" ixy="0.0" ixz="0.0" iyy="0.008" iyz="0.001" izz="0.004"/></inertial>
  </link>
  <link name="foot">
    <inertial><origin xyz="0.02 0.0 -0.05"/><mass value="0.5"/>
      <inertia ixx="0.002" ixy="0.0001" ixz="0" iyy="0.003" iyz="0" izz="0.002"/></inertial>
  </link>
  <joint name="shoulder" type="revolute">
    <parent link="base"/><child link="arm"/><origin xyz="0.05 0 0.2" rpy="0.3 -0.1 0.2"/>
    <axis xyz="0 0.6 0.8"/><limit lower="-2.5" upper="2.5" effort="50" velocity="3"/>
    <dynamics damping="0.3" friction="0.2"/>
  </joint>
  <joint name="bolt" type="fixed">
    <parent link="arm"/><child link="bracket"/><origin xyz="0.0 0.05 0.3" rpy="0 0.5 0"/>
  </joint>
  <joint name="slide" type="prismatic">
    <parent link="bracket"/><child link="slider"/><origin xyz="0 0 0.05" rpy="0.2 0 0"/>
    <axis xyz="1 0 0"/><limit lower="-0.2" upper="0.3" effort="20" velocity="1"/>
    <dynamics damping="1.5" friction="0.5"/>
  </joint>
  <joint name="spin" type="continuous">
    <parent link="slider"/><child link="wheel"/><origin xyz="0.05 0 0" rpy="0 0 0.4"/>
    <axis xyz="0 0 1"/>
  </joint>
  <joint name="hip" type="revolute">
    <parent link="base"/><child link="leg"/><origin xyz="-0.1 0.05 0.0" rpy="0 0 -0.3"/>
    <axis xyz="1 0 0"/><limit lower="-1.5" upper="1.5" effort="40" velocity="4"/>
  </joint>
  <joint name="knee" type="revolute">
    <parent link="leg"/><child link="foot"/><origin xyz="0 0.1 -0.2"/>
    <axis xyz="0 1 0"/><limit lower="-2" upper="2" effort="40" velocity="4"/>
    <mimic joint="hip" multiplier="-0.7" offset="0.25"/>
  </joint>
</robot>
"""

# The same tree with the knee an independent joint (articulated-body algorithm).
SMALL_URDF_NO_MIMIC = SMALL_URDF.replace('    <mimic joint="hip" multiplier="-0.7" offset="0.25"/>\n', "")
assert SMALL_URDF_NO_MIMIC != SMALL_URDF


# A chain with every joint kind: revolute, continuous (unbounded), prismatic on
# a skew axis, a mimic joint whose leader (jside) is on a side branch and one
# whose leader (j1) is on the chain, rpy offsets everywhere and a fixed tool frame.
TOY_URDF = """<?xml version="1.0"?>
<robot name="toy">
  <link name="base"/>
  <link name="l1"/>
  <link name="l2"/>
  <link name="l3"/>
  <link name="l4"/>
  <link name="l5"/>
  <link name="tool"/>
  <link name="side"/>
  <joint name="j1" type="revolute">
    <parent link="base"/><child link="l1"/>
    <origin xyz="0 0 0.3" rpy="0 0 0.2"/><axis xyz="0 0 1"/>
    <limit lower="-2" upper="2" effort="1" velocity="1"/>
  </joint>
  <joint name="j2" type="continuous">
    <parent link="l1"/><child link="l2"/>
    <origin xyz="0.1 0 0.2" rpy="0.3 -0.4 0.1"/><axis xyz="1 0 0"/>
  </joint>
  <joint name="j3" type="prismatic">
    <parent link="l2"/><child link="l3"/>
    <origin xyz="0 0.2 0" rpy="0 0.5 0"/><axis xyz="0 0.6 0.8"/>
    <limit lower="-0.1" upper="0.4" effort="1" velocity="1"/>
  </joint>
  <joint name="j4" type="revolute">
    <parent link="l3"/><child link="l4"/>
    <origin xyz="0.05 0.1 0.15" rpy="-0.2 0.1 0.7"/><axis xyz="0 0.8 -0.6"/>
    <limit lower="-3" upper="3" effort="1" velocity="1"/>
    <mimic joint="jside" multiplier="-2" offset="0.1"/>
  </joint>
  <joint name="j5" type="revolute">
    <parent link="l4"/><child link="l5"/>
    <origin xyz="0 0 0.12" rpy="0 0 0"/><axis xyz="0 1 0"/>
    <limit lower="-3" upper="3" effort="1" velocity="1"/>
    <mimic joint="j1" multiplier="0.5" offset="-0.2"/>
  </joint>
  <joint name="jtool" type="fixed">
    <parent link="l5"/><child link="tool"/>
    <origin xyz="0 0.02 0.1" rpy="0.1 0.2 0.3"/>
  </joint>
  <joint name="jside" type="revolute">
    <parent link="base"/><child link="side"/>
    <origin xyz="0.3 0 0" rpy="0 0 0"/><axis xyz="0 0 1"/>
    <limit lower="-1" upper="1" effort="1" velocity="1"/>
  </joint>
</robot>
"""


# ---------------------------------------------------------------- single free bodies (contact tests)


def body_urdf(shape: str, mass: float, inertia: tuple[float, float, float], name: str = "body") -> str:
    """A single link with a collision ``shape`` (URDF geometry XML)."""
    ixx, iyy, izz = inertia
    return f"""<?xml version="1.0"?>
<robot name="{name}">
  <link name="{name}">
    <inertial><mass value="{mass}"/><origin xyz="0 0 0"/>
      <inertia ixx="{ixx}" iyy="{iyy}" izz="{izz}" ixy="0" ixz="0" iyz="0"/></inertial>
    <collision><origin xyz="0 0 0" rpy="0 0 0"/><geometry>{shape}</geometry></collision>
  </link>
</robot>"""


def sphere_robot(r=0.1, m=1.0, dtype=torch.float64):
    i = 0.4 * m * r * r
    return RobotModel.from_urdf(body_urdf(f'<sphere radius="{r}"/>', m, (i, i, i), "ball"), floating_base=True, dtype=dtype)


def box_robot(s=0.2, m=1.0, dtype=torch.float64):
    i = m * s * s / 6.0
    return RobotModel.from_urdf(body_urdf(f'<box size="{s} {s} {s}"/>', m, (i, i, i), "box"), floating_base=True, dtype=dtype)


def state(robot, pos, quat=(1.0, 0.0, 0.0, 0.0), lin=(0.0, 0.0, 0.0), ang=(0.0, 0.0, 0.0), batch=()):
    q = torch.tensor([*pos, *quat], dtype=robot.dtype).expand(*batch, 7).clone()
    v = torch.tensor([*lin, *ang], dtype=robot.dtype).expand(*batch, 6).clone()
    return q, v


# ---------------------------------------------------------------- a planar one-legged hopper (contact gradients)

# Gym's Hopper in spirit: a torso on a planar base (slide in x, slide in z,
# pitch about y), a thigh, a shin and a sphere foot on a fixed frame at the
# shin's end. Fixed base: the planar coordinates are ordinary joints, so the
# contact Jacobians go through prismatic and revolute columns alike.
HOPPER_URDF = """<?xml version="1.0"?>
<robot name="hopper">
  <link name="world"/>
  <link name="slider_x">
    <inertial><mass value="0.05"/><inertia ixx="1e-4" iyy="1e-4" izz="1e-4" ixy="0" ixz="0" iyz="0"/></inertial>
  </link>
  <link name="slider_z">
    <inertial><mass value="0.05"/><inertia ixx="1e-4" iyy="1e-4" izz="1e-4" ixy="0" ixz="0" iyz="0"/></inertial>
  </link>
  <link name="torso">
    <inertial><origin xyz="0 0 0.05"/><mass value="3.5"/>
      <inertia ixx="0.04" iyy="0.045" izz="0.01" ixy="0" ixz="0" iyz="0"/></inertial>
    <collision><origin xyz="0 0 0.05"/><geometry><sphere radius="0.08"/></geometry></collision>
  </link>
  <link name="thigh">
    <inertial><origin xyz="0 0 -0.2"/><mass value="1.0"/>
      <inertia ixx="0.014" iyy="0.014" izz="0.001" ixy="0" ixz="0" iyz="0"/></inertial>
  </link>
  <link name="shin">
    <inertial><origin xyz="0 0 -0.2"/><mass value="0.6"/>
      <inertia ixx="0.008" iyy="0.008" izz="0.0005" ixy="0" ixz="0" iyz="0"/></inertial>
  </link>
  <link name="foot">
    <inertial><mass value="0.2"/><inertia ixx="2e-4" iyy="2e-4" izz="2e-4" ixy="0" ixz="0" iyz="0"/></inertial>
    <collision><geometry><sphere radius="0.04"/></geometry></collision>
  </link>
  <joint name="rootx" type="prismatic">
    <parent link="world"/><child link="slider_x"/><axis xyz="1 0 0"/>
    <limit lower="-10" upper="10" effort="0" velocity="10"/>
  </joint>
  <joint name="rootz" type="prismatic">
    <parent link="slider_x"/><child link="slider_z"/><axis xyz="0 0 1"/>
    <limit lower="-10" upper="10" effort="0" velocity="10"/>
  </joint>
  <joint name="rooty" type="continuous">
    <parent link="slider_z"/><child link="torso"/><axis xyz="0 1 0"/>
  </joint>
  <joint name="hip" type="revolute">
    <parent link="torso"/><child link="thigh"/><origin xyz="0 0 -0.05"/><axis xyz="0 1 0"/>
    <limit lower="-2.6" upper="0.5" effort="150" velocity="10"/>
  </joint>
  <joint name="knee" type="revolute">
    <parent link="thigh"/><child link="shin"/><origin xyz="0 0 -0.4"/><axis xyz="0 1 0"/>
    <limit lower="-0.1" upper="2.6" effort="150" velocity="10"/>
  </joint>
  <joint name="ankle" type="fixed">
    <parent link="shin"/><child link="foot"/><origin xyz="0 0 -0.4"/>
  </joint>
</robot>
"""


def hopper_robot(dtype=torch.float64):
    """The planar hopper: ``q = [x, z, pitch, hip, knee]``; the foot sphere (4 cm) is
    0.89 m below the torso origin with straight joints."""
    return RobotModel.from_urdf(HOPPER_URDF, dtype=dtype)


# ---------------------------------------------------------------- G1 humanoid contact shapes (example-robot-data)


# One copy, in the env module (backdrive.envs._humanoid); re-exported for the contact tests.
from backdrive.envs._humanoid import g1_contact_geometry  # noqa: E402,F401


def go1_robot(dtype=torch.float32):
    """example-robot-data's Go1 (floating base); the test is skipped where that
    optional data package is not installed."""
    import pytest

    from backdrive.data import load

    try:
        return load("example-robot-data:go1", floating_base=True, dtype=dtype)
    except Exception as exc:  # noqa: BLE001 - example-robot-data is an optional install
        pytest.skip(f"example-robot-data's Go1 is not installed: {exc}")


# ---------------------------------------------------------------- random PD targets (calibration tests)


def random_targets(stand: torch.Tensor, batch: int, steps: int, seed: int, amplitude: float = 0.3) -> torch.Tensor:
    """``(batch, steps, n)`` piecewise-linear PD targets through four random
    knots within ``amplitude / 2`` of the pose ``stand`` ``(n,)``."""
    g = torch.Generator().manual_seed(seed)
    knots = stand + amplitude * (torch.rand(batch, 4, stand.shape[-1], generator=g, dtype=stand.dtype) - 0.5)
    s = torch.linspace(0, 3, steps, dtype=stand.dtype)
    lo = s.floor().long().clamp_max(2)
    w = (s - lo)[None, :, None]
    return knots[:, lo] * (1 - w) + knots[:, lo + 1] * w
