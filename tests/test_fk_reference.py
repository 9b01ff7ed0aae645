"""Whole-tree FK, frame Jacobians and serial chains against Pinocchio.

Reference tests at 100 random configurations per robot: float64 results agree
with Pinocchio to 1e-12 (poses and Jacobians, absolute), float32 to 1e-5.
Pinocchio's ``LOCAL_WORLD_ALIGNED`` frame Jacobian is ``[linear; angular]`` at
the frame origin in world axes, the backdrive convention. Its configuration
vector differs from backdrive's in two places that the helpers convert: the
free-flyer quaternion is ``xyzw`` (backdrive: ``wxyz``), and a continuous
joint takes two coordinates ``(cos, sin)`` (backdrive: one angle).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import pinocchio as pin

from backdrive import RobotModel  # noqa: E402
from backdrive.data import get_data_path  # noqa: E402
from backdrive.kinematics import (  # noqa: E402
    SerialChainKinematics,
    body_transforms,
    forward_kinematics,
    frame_jacobian,
)

TOL64 = 1e-12
TOL32 = 1e-5
NUM_Q = 100

# (name, floating base); "panda" is the shipped model, the others come from
# example-robot-data. Arms, a two-armed tree (baxter), a robot with continuous
# joints (kinova) and a floating-base quadruped (solo12).
TREE_ROBOTS = [
    ("panda", False),
    ("example-robot-data:panda", False),
    ("example-robot-data:ur5", False),
    ("example-robot-data:z1", False),
    ("example-robot-data:kinova", False),
    ("example-robot-data:xarm7", False),
    ("example-robot-data:so100", False),
    ("example-robot-data:talos_arm", False),
    ("example-robot-data:baxter", False),
    ("example-robot-data:solo12", True),
]

# Every arm-like chain found in the installed model packages: (robot, end link
# or None for the deepest leaf).
CHAIN_ROBOTS = [
    ("panda", "panda_hand_tcp"),
    ("example-robot-data:panda", "panda_hand_tcp"),
    ("example-robot-data:ur3", "tool0"),
    ("example-robot-data:ur5", "tool0"),
    ("example-robot-data:ur10", "tool0"),
    ("example-robot-data:z1", None),
    ("example-robot-data:kinova", None),
    ("example-robot-data:xarm7", "link_eef"),
    ("example-robot-data:so100", None),
    ("example-robot-data:so101", None),
    ("example-robot-data:talos_arm", None),
    ("example-robot-data:baxter", None),
]


def _path(name: str) -> str:
    # example-robot-data is installed by the [test] extra: a missing robot is a failure.
    return str(get_data_path(name))


def _pin_model(path: str, floating: bool):
    if floating:
        return pin.buildModelFromUrdf(path, pin.JointModelFreeFlyer(), mimic=True)
    return pin.buildModelFromUrdf(path, mimic=True)


def _pin_q(pm, model: RobotModel, q: np.ndarray) -> np.ndarray:
    out = pin.neutral(pm)
    if model.floating_base:
        out[0:3] = q[0:3]
        out[3:6] = q[4:7]  # xyz
        out[6] = q[3]  # w
        joints = q[7:]
    else:
        joints = q
    for c, name in enumerate(model.joint_names):
        j = pm.joints[pm.getJointId(name)]
        if j.nq == 1:
            out[j.idx_q] = joints[c]
        else:  # continuous / unbounded revolute: (cos, sin)
            assert j.nq == 2
            out[j.idx_q] = np.cos(joints[c])
            out[j.idx_q + 1] = np.sin(joints[c])
    return out


def _pin_columns(pm, model: RobotModel) -> list[int]:
    cols = list(range(6)) if model.floating_base else []
    return cols + [pm.joints[pm.getJointId(n)].idx_v for n in model.joint_names]


def _pin_frame(pm, link: str) -> int:
    fid = pm.getFrameId(link, pin.BODY)
    assert fid < len(pm.frames), link
    return fid


def _jacobian_frames(model: RobotModel) -> list[int]:
    """Every frame of small robots; about 20 spread over the tree (the last,
    deepest-listed one included) for large ones such as Baxter."""
    nf = model.num_frames
    step = max(1, -(-nf // 20))
    return sorted(set(range(0, nf, step)) | {nf - 1})


@pytest.fixture(scope="module", params=TREE_ROBOTS, ids=[n for n, _ in TREE_ROBOTS])
def tree_case(request):
    name, floating = request.param
    path = _path(name)
    model = RobotModel.from_urdf(path, floating_base=floating)
    pm = _pin_model(path, floating)
    pd = pm.createData()
    g = torch.Generator().manual_seed(7)
    q = model.random_q(NUM_Q, generator=g)
    cols = _pin_columns(pm, model)
    frames = [_pin_frame(pm, n) for n in model.link_names]
    T_ref = np.zeros((NUM_Q, len(frames), 4, 4))
    J_ref = np.zeros((NUM_Q, len(frames), 6, model.nv))
    for i in range(NUM_Q):
        qp = _pin_q(pm, model, q[i].numpy())
        pin.computeJointJacobians(pm, pd, qp)
        pin.updateFramePlacements(pm, pd)
        for k, fid in enumerate(frames):
            T_ref[i, k] = pd.oMf[fid].homogeneous
            J = pin.getFrameJacobian(pm, pd, fid, pin.LOCAL_WORLD_ALIGNED)
            J_ref[i, k] = J[:, cols]
    return model, q, torch.from_numpy(T_ref), torch.from_numpy(J_ref)


def test_configuration_layouts_match(tree_case):
    model, q, _, _ = tree_case
    assert q.shape == (NUM_Q, model.nq)


def test_forward_kinematics_float64(tree_case):
    model, q, T_ref, _ = tree_case
    T = forward_kinematics(model, q)
    assert T.dtype == torch.float64
    err = (T - T_ref).abs().max().item()
    assert err < TOL64, f"{model.name}: FK off by {err:.3g}"


def test_forward_kinematics_float32(tree_case):
    model, q, T_ref, _ = tree_case
    m32 = model.to(dtype=torch.float32)
    T = forward_kinematics(m32, q.float())
    assert T.dtype == torch.float32
    err = (T.double() - T_ref).abs().max().item()
    assert err < TOL32, f"{model.name}: float32 FK off by {err:.3g}"


def test_frame_jacobian_float64(tree_case):
    model, q, _, J_ref = tree_case
    worst = 0.0
    bodies = body_transforms(model, q)  # one FK pass for every frame
    for k in _jacobian_frames(model):
        link = model.link_names[k]
        J = frame_jacobian(model, q, link, bodies=bodies) if k else frame_jacobian(model, q, link)
        assert J.shape == (NUM_Q, 6, model.nv)
        worst = max(worst, (J - J_ref[:, k]).abs().max().item())
    assert worst < TOL64, f"{model.name}: frame Jacobian off by {worst:.3g}"


def test_frame_jacobian_float32(tree_case):
    model, q, _, J_ref = tree_case
    m32 = model.to(dtype=torch.float32)
    worst = 0.0
    bodies = body_transforms(m32, q.float())
    for k in _jacobian_frames(model):
        J = frame_jacobian(m32, q.float(), model.link_names[k], bodies=bodies)
        worst = max(worst, (J.double() - J_ref[:, k]).abs().max().item())
    assert worst < TOL32, f"{model.name}: float32 frame Jacobian off by {worst:.3g}"


# ---------------------------------------------------------------------- serial chains


def _deepest_link(model: RobotModel) -> str:
    parent = model.parent.tolist()

    def depth(b: int) -> int:
        d = 0
        while b > 0:
            d, b = d + 1, parent[b]
        return d

    depths = [depth(int(b)) for b in model.frame_body]
    return model.link_names[int(np.argmax(depths))]


def _chain_reference(model, pm, chain, q_full):
    """Pinocchio's T_root_end and root-frame Jacobian over the chain coordinates."""
    pd = pm.createData()
    f_root = _pin_frame(pm, chain.root_link_name)
    f_end = _pin_frame(pm, chain.end_link_name)
    cols = [pm.joints[pm.getJointId(n)].idx_v for n in chain.joint_names]
    Ts, Js = [], []
    for i in range(q_full.shape[0]):
        qp = _pin_q(pm, model, q_full[i].numpy())
        pin.computeJointJacobians(pm, pd, qp)
        pin.updateFramePlacements(pm, pd)
        oMr, oMe = pd.oMf[f_root], pd.oMf[f_end]
        Ts.append((oMr.inverse() * oMe).homogeneous)
        J = pin.getFrameJacobian(pm, pd, f_end, pin.LOCAL_WORLD_ALIGNED)[:, cols]
        R = oMr.rotation.T
        Js.append(np.vstack([R @ J[:3], R @ J[3:]]))
    return torch.from_numpy(np.stack(Ts)), torch.from_numpy(np.stack(Js))


def _chain_q(model, chain, q_full):
    idx = [model.joint_names.index(n) for n in chain.joint_names]
    return q_full[:, idx]


@pytest.mark.parametrize(
    "name,end", CHAIN_ROBOTS, ids=[f"{n.split(':')[-1]}-{e}" for n, e in CHAIN_ROBOTS]
)
def test_serial_chain_matches_pinocchio(name, end):
    path = _path(name)
    model = RobotModel.from_urdf(path)
    end = end or _deepest_link(model)
    chain = SerialChainKinematics.from_model(model, end_link_name=end)
    pm = _pin_model(path, False)
    q_full = model.random_q(NUM_Q, generator=torch.Generator().manual_seed(3))
    T_ref, J_ref = _chain_reference(model, pm, chain, q_full)
    q = _chain_q(model, chain, q_full)
    T, J = chain.evaluate(q)
    assert (T - T_ref).abs().max().item() < TOL64
    assert (J - J_ref).abs().max().item() < TOL64
    assert (chain.forward_kinematics(q) - T_ref).abs().max().item() < TOL64
    # The small-batch (product tree) FK path, one sample and a few.
    assert (chain.forward_kinematics(q[0]) - T_ref[0]).abs().max().item() < TOL64
    assert (chain.forward_kinematics(q[:5]) - T_ref[:5]).abs().max().item() < TOL64
    c32 = chain.to(dtype=torch.float32)
    T32, J32 = c32.evaluate(q.float())
    assert (T32.double() - T_ref).abs().max().item() < TOL32
    assert (J32.double() - J_ref).abs().max().item() < TOL32
    assert (c32.forward_kinematics(q[:3].float()).double() - T_ref[:3]).abs().max().item() < TOL32


@pytest.mark.parametrize(
    "root,end",
    [
        ("panda_link2", "panda_hand_tcp"),  # a chain rooted inside the tree
        ("panda_link0", "panda_rightfinger"),  # a mimic joint whose leader is off the chain
        ("panda_link5", "panda_leftfinger"),  # a prismatic joint
    ],
)
def test_panda_subchains_match_pinocchio(root, end):
    path = _path("panda")
    model = RobotModel.from_urdf(path)
    chain = SerialChainKinematics.from_model(model, end_link_name=end, root_link_name=root)
    pm = _pin_model(path, False)
    q_full = model.random_q(NUM_Q, generator=torch.Generator().manual_seed(5))
    T_ref, J_ref = _chain_reference(model, pm, chain, q_full)
    q = _chain_q(model, chain, q_full)
    T, J = chain.evaluate(q)
    assert (T - T_ref).abs().max().item() < TOL64
    assert (J - J_ref).abs().max().item() < TOL64
    assert (chain.forward_kinematics(q[:4]) - T_ref[:4]).abs().max().item() < TOL64
