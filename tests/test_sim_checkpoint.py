"""Checkpointed rollouts: the same gradients, with memory that does not grow with the horizon."""

from __future__ import annotations

import pytest
import torch

from backdrive import InputError
from backdrive.contact import ContactGeometry, ContactModel, ContactParameters
from backdrive.data import load
from backdrive.kinematics import forward_kinematics
from backdrive.sim import PDActuator, Simulator, State, TorqueActuator

from _robots import hopper_robot


def _quadruped(mu):
    robot = load("quadruped", floating_base=True)
    feet = [n for n in robot.link_names if n.endswith("_foot")]
    cm = ContactModel(robot, ContactGeometry.from_model(robot, links=feet), params=ContactParameters(friction=mu))
    sim = Simulator(robot, 2e-3, actuator=PDActuator(kp=200.0, kd=6.0), contact=cm)
    qj = torch.tensor([0.0, 0.7, -1.4] * 4, dtype=robot.dtype)
    q0 = robot.neutral()
    q0[7:] = qj
    T = forward_kinematics(robot, q0)
    q0[2] = -min(float(T[robot.frame_index(f), 2, 3]) for f in feet) + 0.02 + 0.002
    gen = torch.Generator().manual_seed(0)
    q0 = q0.expand(3, -1).clone()
    q0[:, 2] += 0.003 * torch.rand(3, generator=gen, dtype=robot.dtype)
    v0 = 0.05 * torch.randn(3, robot.nv, generator=gen, dtype=robot.dtype)
    return sim, q0, v0, qj


def _grads(sim, q0, v0, U, mu, **kwargs):
    q0 = q0.clone().requires_grad_()
    v0 = v0.clone().requires_grad_()
    U = U.clone().requires_grad_()
    traj = sim.rollout(State(q0, v0), U, **kwargs)
    loss = (traj.q[..., :3] ** 2).sum() + traj.v.sum() + traj.contact.normal_force.sum() * 1e-3
    loss = loss + (traj.contact.slip_velocity ** 2).sum()
    return traj, torch.autograd.grad(loss, (q0, v0, U, mu))


@pytest.mark.parametrize("k", [3, 7, 40])
def test_checkpointed_contact_rollout_has_the_plain_gradients(k):
    """25 steps of a batch of three quadruped landings: the gradients with
    respect to the initial state, the controls and the friction coefficient
    (a parameter inside the contact model, not a rollout input) are equal to
    the plain rollout's within 1e-12, for windows that divide the horizon,
    do not, and exceed it."""
    mu = torch.tensor(0.75, dtype=torch.float64, requires_grad=True)
    sim, q0, v0, qj = _quadruped(mu)
    U = qj.expand(3, 25, 12) + 0.05 * torch.randn(3, 25, 12, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    plain, g0 = _grads(sim, q0, v0, U, mu)
    ckpt, g1 = _grads(sim, q0, v0, U, mu, checkpoint_every=k)
    assert float(plain.contact.normal_force[:, -1].detach().sum(-1).min()) > 50.0  # landed: contact active
    assert torch.equal(plain.q, ckpt.q) and torch.equal(plain.v, ckpt.v)
    assert torch.equal(plain.contact.force, ckpt.contact.force)
    for a, b in zip(g0, g1):
        assert float(a.abs().max()) > 0
        assert float((a - b).abs().max()) <= 1e-12 * float(a.abs().max())


def test_checkpoint_with_truncation_and_gradient_monitor():
    """Checkpoint windows (5) that straddle truncation points (every 8): the
    gradients and the per-state gradient norms are the plain rollout's."""
    robot = hopper_robot()
    cm = ContactModel(robot)
    sim = Simulator(robot, 1e-3, actuator=TorqueActuator(joints=["hip", "knee"]), contact=cm)
    q0 = torch.tensor([0.0, 0.75, 0.1, -0.4, 0.8], dtype=torch.float64)
    out = []
    for k in (None, 5):
        U = torch.linspace(-5.0, 5.0, 40, dtype=torch.float64)[:, None].repeat(1, 2).requires_grad_()
        traj = sim.rollout(sim.initial_state(q0), U, truncate_every=8, checkpoint_every=k, monitor_gradients=True)
        traj.q[-5:].sum().backward()
        out.append((U.grad, traj.state_gradient_norms()))
    (ga, na), (gb, nb) = out
    assert torch.equal(ga, gb) and torch.equal(na, nb)
    assert float(ga[:24].abs().max()) == 0.0 and float(ga[-5:].abs().min()) > 0  # truncation took effect
    assert float(na[-8:].min()) > 0


def _saved_bytes(fn):
    """Bytes autograd saves for backward while ``fn`` runs (outside checkpointed windows).

    A checkpointed window installs its own saved-tensor hooks, which take
    precedence inside it, so only what the graph keeps besides the windows
    reaches this outer hook.
    """
    total = [0]

    def pack(t):
        total[0] += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return total[0], out


def test_checkpointing_keeps_saved_memory_from_growing_with_the_horizon():
    """Without checkpointing the graph saves every step's internals (growing
    linearly with T); with a window of 10 steps it saves almost nothing
    beyond the stored trajectory, whatever the horizon."""
    mu = torch.tensor(0.75, dtype=torch.float64, requires_grad=True)
    sim, q0, v0, qj = _quadruped(mu)
    sizes = {}
    for T in (10, 20):
        U = qj.expand(3, T, 12).clone().requires_grad_()
        for k in (None, 10):
            sizes[T, k], traj = _saved_bytes(lambda: sim.rollout(State(q0, v0), U, checkpoint_every=k))
            (g,) = torch.autograd.grad(traj.q[..., -1, 2].sum(), U)
            assert bool(torch.isfinite(g).all())
    plain, ckpt = sizes[20, None], sizes[20, 10]
    assert sizes[20, None] > 1.8 * sizes[10, None]  # grows with the horizon
    assert ckpt < 0.02 * plain, (ckpt, plain)


def test_checkpoint_every_must_be_a_positive_int():
    sim = Simulator(hopper_robot(), 1e-3, actuator=TorqueActuator(joints=["hip", "knee"]))
    s = sim.initial_state()
    for bad in (0, -3, 2.5, True, "10"):
        with pytest.raises(InputError, match="checkpoint_every"):
            sim.rollout(s, sim.zero_controls(4), checkpoint_every=bad)


def test_checkpoint_without_grad_mode_is_a_plain_rollout():
    sim = Simulator(hopper_robot(), 1e-3, actuator=TorqueActuator(joints=["hip", "knee"]))
    s = sim.initial_state()
    with torch.no_grad():
        a = sim.rollout(s, sim.zero_controls(12), checkpoint_every=5)
    assert a.q.grad_fn is None
    b = sim.rollout(s, sim.zero_controls(12))
    assert torch.equal(a.q, b.q) and a.q.shape == (13, 5)


def _graph_nodes(*tensors):
    """The autograd nodes reachable from ``tensors``."""
    seen, todo = {}, [t.grad_fn for t in tensors if t.grad_fn is not None]
    while todo:
        node = todo.pop()
        if id(node) not in seen:
            seen[id(node)] = node
            todo.extend(n for n, _ in node.next_functions if n is not None)
    return len(seen)


def test_checkpointed_graph_keeps_one_node_per_window():
    """The graph a checkpointed rollout leaves for backward does not hold the
    steps' operations (about 190 per contact step here since the 12th
    session, each with its bookkeeping): with windows of 5 steps it has a few nodes per window."""
    mu = torch.tensor(0.75, dtype=torch.float64, requires_grad=True)
    sim, q0, v0, qj = _quadruped(mu)
    nodes = {}
    for T in (20, 40):
        for k in (None, 5):
            U = qj.expand(3, T, 12).clone().requires_grad_()
            traj = sim.rollout(State(q0, v0), U, checkpoint_every=k)
            nodes[T, k] = _graph_nodes(traj.q, traj.v, traj.effort, traj.contact.force)
    # plain: every operation of every step (about 188 per step on the
    # reference contact step since the 12th session's one-node dynamics, 650 before)
    assert nodes[40, None] - nodes[20, None] > 20 * 100, nodes
    assert nodes[20, 5] < 20 and nodes[40, 5] < 2 * nodes[20, 5], nodes  # checkpointed: 4 and 8 windows


def test_checkpoint_reaches_a_derived_parameter():
    """A friction coefficient computed from a raw parameter outside the
    rollout (``softplus(raw)``): the checkpointed gradient with respect to the
    raw parameter is the plain one (to rounding: summed per window)."""
    raw = torch.tensor(0.4, dtype=torch.float64, requires_grad=True)
    mu = torch.nn.functional.softplus(raw)
    sim, q0, v0, qj = _quadruped(mu)
    U = qj.expand(3, 20, 12).clone()
    out = []
    for k in (None, 6):
        traj = sim.rollout(State(q0, v0), U, checkpoint_every=k)
        loss = (traj.contact.slip_velocity ** 2).sum() + traj.q[..., 0].sum()
        (g,) = torch.autograd.grad(loss, raw, retain_graph=True)
        out.append(g)
    assert float(out[0].abs()) > 0
    assert float((out[0] - out[1]).abs()) <= 1e-12 * float(out[0].abs()), out


def test_contact_record_keeps_only_the_named_fields():
    """``contact_record=("normal_force", "slip_velocity")`` keeps those two
    fields (the others ``None``) with the gradients of the full record, plain
    and checkpointed; ``False`` keeps none; a bad value is an InputError
    naming it."""
    mu = torch.tensor(0.75, dtype=torch.float64, requires_grad=True)
    sim, q0, v0, qj = _quadruped(mu)
    U = qj.expand(3, 12, 12) + 0.05 * torch.randn(3, 12, 12, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    full, g0 = _grads(sim, q0, v0, U, mu)
    for k in (None, 5):
        part, g1 = _grads(sim, q0, v0, U, mu, checkpoint_every=k, contact_record=("normal_force", "slip_velocity"))
        assert part.contact.jacobian is None and part.contact.force is None
        assert torch.equal(part.contact.normal_force, full.contact.normal_force)
        for a, b in zip(g0, g1):
            assert float(a.abs().max()) > 0 and torch.equal(a, b)
    none = sim.rollout(State(q0, v0), U, contact_record=False, checkpoint_every=5)
    assert none.contact is None and torch.equal(none.q, full.q.detach())
    for bad, match in (("normal_force", "sequence"), (("normal_force", "bogus"), "bogus"), (("_mu",), "_mu")):
        with pytest.raises(InputError, match=match):
            sim.rollout(State(q0, v0), U, contact_record=bad)
