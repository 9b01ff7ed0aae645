"""The reference dynamics as one autograd node (12th session, batch 1):
``dynamics._tree.kinematics`` where autograd records ``q``, with the mass
matrix (``mass=True``) and the bias forces (``bias=(v, g)``) formed in the
same node, against plain autograd through the same formulas (float64).

- every output alone and all together (poses, motion subspaces, first
  moments, inertias, centres of mass, ``M``, ``C v + g``), on a fixed base
  with a mimic joint, prismatic and tilted joints (``small_tree``), its
  floating twin, a cart-pole (prismatic), a floating tree without mimic
  joints and the shipped quadruped with a quaternion off unit norm;
- gradcheck and double backward (``create_graph`` differentiates the plain
  formulas);
- where the node does not apply (mimic coupling, grad-requiring masses) the
  plain formulas run;
- the contact step at batch 1 records the node, and its gradients equal
  those of the plain formulas (forced by a grad-requiring mass).
"""

from __future__ import annotations

import pytest
import torch
from torch.autograd import gradcheck, gradgradcheck

from backdrive import RobotModel
from backdrive.contact import ContactGeometry, ContactModel
from backdrive.data import get_data_path, load
from backdrive.dynamics._crba import crba_core
from backdrive.dynamics._rnea import rnea_core
from backdrive.dynamics._tree import _kinematics, kinematics, topology

from _robots import SMALL_URDF, SMALL_URDF_NO_MIMIC
from test_contact_fast import DT, _quadruped, _states

FIELDS = ("R", "p", "S", "h", "I", "c")


def _robot(name: str) -> RobotModel:
    if name.startswith("small_tree"):
        return RobotModel.from_urdf(SMALL_URDF, floating_base=name.endswith("floating"))
    if name == "cartpole":
        return RobotModel.from_urdf(get_data_path("cartpole"))
    if name == "no_mimic_floating":
        return RobotModel.from_urdf(SMALL_URDF_NO_MIMIC, floating_base=True)
    return load("quadruped", floating_base=True)


def _inputs(rb: RobotModel, seed: int):
    g = torch.Generator().manual_seed(seed)
    q = rb.random_q(2, generator=g)
    if rb.floating_base:
        q[:, 3:7] *= 1.3  # off unit norm: the quaternion's radial direction has no effect
    v = torch.randn(2, rb.nv, generator=g, dtype=torch.float64)
    return q.requires_grad_(True), v.requires_grad_(True)


def _outputs(rb, q, v, node: bool):
    topo = topology(rb)
    if node:
        kin = kinematics(rb, topo, q, mass=True, bias=(v, rb.gravity))
        M, h = crba_core(rb, topo, kin), kin.bias
        if h is None:
            h = rnea_core(rb, topo, kin, v, None, rb.gravity)
    else:
        kin = _kinematics(rb, topo, q)[0]
        M, h = crba_core(rb, topo, kin), rnea_core(rb, topo, kin, v, None, rb.gravity)
    return kin, [getattr(kin, f) for f in FIELDS] + [M, h]


@pytest.mark.parametrize("name", ["small_tree", "small_tree_floating", "cartpole", "no_mimic_floating", "quadruped"])
def test_node_gradients_equal_the_formulas(name):
    rb = _robot(name)
    q, v = _inputs(rb, 1)
    kin, outs = _outputs(rb, q, v, node=True)
    _, refs = _outputs(rb, q, v, node=False)
    assert "KinematicsVJP" in kin.R.grad_fn.name()
    fused = name in ("cartpole", "no_mimic_floating", "quadruped")  # no mimic coupling
    assert (kin.M is not None) == fused and (kin.bias is not None) == fused
    for x, y in zip(outs, refs):
        torch.testing.assert_close(x, y, rtol=0, atol=1e-13)
    g = torch.Generator().manual_seed(2)
    cots = [torch.randn(x.shape, generator=g, dtype=x.dtype) for x in outs]
    for k in list(range(len(outs))) + [None]:
        pick = range(len(outs)) if k is None else [k]
        got = torch.autograd.grad([outs[i] for i in pick], (q, v), [cots[i] for i in pick], retain_graph=True, allow_unused=True)
        want = torch.autograd.grad([refs[i] for i in pick], (q, v), [cots[i] for i in pick], retain_graph=True, allow_unused=True)
        for a, b in zip(got, want):
            if b is None or not b.abs().max() > 0:
                assert a is None or float(a.abs().max()) < 1e-12
                continue
            assert float(b.abs().max()) > 0
            err = float((a - b).abs().max() / b.abs().max())
            assert err < 1e-12, (name, k, err)


@pytest.mark.parametrize("name", ["cartpole", "no_mimic_floating", "small_tree"])
def test_node_gradcheck_and_double_backward(name):
    rb = _robot(name)
    q, v = (x.detach()[:1].clone().requires_grad_(True) for x in _inputs(rb, 3))
    topo = topology(rb)

    def f(q, v):
        kin = kinematics(rb, topo, q, mass=True, bias=(v, rb.gravity))
        h = kin.bias if kin.bias is not None else rnea_core(rb, topo, kin, v, None, rb.gravity)
        return kin.R, kin.p, kin.S, kin.I, kin.c, crba_core(rb, topo, kin), h

    assert gradcheck(f, (q, v))
    assert gradgradcheck(lambda q, v: tuple(x.sum(-2) for x in f(q, v)[5:]), (q, v))


def test_plain_formulas_where_the_node_does_not_apply():
    rb = _robot("no_mimic_floating")
    q, v = _inputs(rb, 4)
    heavy = rb.replace(body_mass=rb.body_mass.clone().requires_grad_(True))
    kin = kinematics(heavy, topology(heavy), q, mass=True, bias=(v, heavy.gravity))
    assert "KinematicsVJP" not in kin.R.grad_fn.name() and kin.M is None and kin.bias is None
    (gm,) = torch.autograd.grad(crba_core(heavy, topology(heavy), kin).sum(), heavy.body_mass)
    assert float(gm.abs().max()) > 0
    with torch.no_grad():
        assert kinematics(rb, topology(rb), q, mass=True).M is None


def test_contact_step_at_batch_one_records_the_node_with_the_same_gradient():
    robot, feet = _quadruped()
    cm = ContactModel(robot, ContactGeometry.from_model(robot, links=feet))
    damping = torch.cat([torch.zeros(6, dtype=robot.dtype), torch.full((12,), 2.0, dtype=robot.dtype)])
    q, v, tau = (x[:1] for x in _states(robot, feet, (2,), seed=4))

    def grads(rb):
        xs = [x.detach().clone().requires_grad_(True) for x in (q, v, tau)]
        a, res = cm.acceleration(rb, *xs, dt=DT, extra_damping=damping)
        g = torch.Generator().manual_seed(5)
        loss = sum((o * torch.randn(o.shape, generator=g, dtype=o.dtype)).sum() for o in (a, res.force, res.f_ext))
        seen, stack = set(), [loss.grad_fn]
        while stack:
            n = stack.pop()
            if n is not None and n not in seen:
                seen.add(n)
                stack.extend(f for f, _ in n.next_functions)
        return torch.autograd.grad(loss, xs), {n.name() for n in seen}, len(seen)

    got, names, nodes = grads(robot)
    # The plain formulas: a mass that needs a gradient (the same values).
    want, names_plain, nodes_plain = grads(robot.replace(body_mass=robot.body_mass.clone().requires_grad_(True)))
    assert "_KinematicsVJPBackward" in names and "_KinematicsVJPBackward" not in names_plain
    assert nodes < nodes_plain - 150  # measured: 156 against 414 nodes per step
    for a, b in zip(got, want):
        assert float(b.abs().max()) > 0
        assert float((a - b).abs().max() / b.abs().max()) < 1e-12
