"""SerialChainKinematics: chain selection, mimic coupling, FK/Jacobian paths, gradients, errors."""

from __future__ import annotations

import math

import pytest
import torch
from torch.autograd import gradcheck

import backdrive
from backdrive import InputError, RobotModel, UnknownNameError
from backdrive.data import get_data_path
from backdrive.kinematics import (
    SerialChainKinematics,
    forward_kinematics,
    frame_jacobian,
)
from backdrive.kinematics import _chain as chain_module

from _robots import TOY_URDF  # noqa: E402  (shared fixture)


@pytest.fixture(scope="module")
def toy_model():
    return RobotModel.from_urdf(TOY_URDF)


@pytest.fixture(scope="module")
def toy(toy_model):
    return SerialChainKinematics.from_model(toy_model, end_link_name="tool")


@pytest.fixture(scope="module")
def panda():
    return SerialChainKinematics.from_urdf(
        get_data_path("panda"), end_link_name="panda_hand_tcp", dtype=torch.float64
    )


def _random_q(chain, *shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    lo = torch.where(torch.isfinite(chain.lower), chain.lower, torch.full_like(chain.lower, -math.pi))
    hi = torch.where(torch.isfinite(chain.upper), chain.upper, torch.full_like(chain.upper, math.pi))
    u = torch.rand(*shape, chain.dof, generator=g, dtype=torch.float64).to(chain.dtype)
    return lo + (hi - lo) * u


def _full_q(model, chain, q):
    idx = [chain.joint_names.index(n) for n in model.joint_names]
    return q[..., idx]


# ---------------------------------------------------------------------- structure


def test_chain_attributes(toy):
    assert toy.joint_names == ("j1", "j2", "j3", "jside")  # mimics are not coordinates
    assert toy.dof == 4
    assert toy.lower.tolist()[0] == -2.0 and math.isinf(toy.lower[1]) and toy.lower[1] < 0
    assert math.isinf(toy.upper[1]) and toy.upper[1] > 0
    assert toy.upper[2].item() == pytest.approx(0.4)
    assert isinstance(toy.fingerprint, str) and len(toy.fingerprint) == 64
    assert toy.root_link_name == "base" and toy.end_link_name == "tool"
    assert "dof=4" in repr(toy)


def test_from_urdf_accepts_text_bytes_and_path(tmp_path):
    path = tmp_path / "toy.urdf"
    path.write_text(TOY_URDF)
    chains = [
        SerialChainKinematics.from_urdf(src, end_link_name="tool", dtype=torch.float64)
        for src in (TOY_URDF, TOY_URDF.encode(), path, str(path))
    ]
    q = _random_q(chains[0], 3)
    ref = chains[0].forward_kinematics(q)
    for c in chains[1:]:
        assert c.fingerprint == chains[0].fingerprint
        assert torch.equal(c.forward_kinematics(q), ref)


def test_from_urdf_default_dtype_is_float32(toy):
    c = SerialChainKinematics.from_urdf(TOY_URDF, end_link_name="tool")
    assert c.dtype == torch.float32 and c.lower.dtype == torch.float32
    assert c.forward_kinematics(torch.zeros(4)).dtype == torch.float32


def test_chain_matches_whole_tree(toy_model, toy):
    q = _random_q(toy, 50)
    q_full = _full_q(toy_model, toy, q)
    f = toy_model.frame_index("tool")
    T_ref = forward_kinematics(toy_model, q_full)[:, f]
    J_ref = frame_jacobian(toy_model, q_full, "tool")
    J_ref = J_ref[..., [toy_model.joint_names.index(n) for n in toy.joint_names]]
    T, J = toy.evaluate(q)
    assert (T - T_ref).abs().max() < 1e-13
    assert (J - J_ref).abs().max() < 1e-13
    assert (toy.forward_kinematics(q) - T_ref).abs().max() < 1e-13


def test_jacobian_is_derivative_of_pose(toy, panda):
    for chain in (toy, panda):
        q = _random_q(chain, seed=3)
        T = chain.forward_kinematics(q)
        dT = torch.autograd.functional.jacobian(chain.forward_kinematics, q)  # (4, 4, dof)
        J = chain.jacobian(q)
        assert (J[:3] - dT[:3, 3, :]).abs().max() < 1e-12
        R = T[:3, :3]
        for j in range(chain.dof):
            W = dT[:3, :3, j] @ R.T  # skew(omega_j)
            omega = torch.stack([W[2, 1], W[0, 2], W[1, 0]])
            assert (W + W.T).abs().max() < 1e-12
            assert (J[3:, j] - omega).abs().max() < 1e-12


def test_root_inside_the_tree(toy_model):
    c = SerialChainKinematics.from_model(toy_model, end_link_name="tool", root_link_name="l2")
    assert c.joint_names == ("j3", "jside", "j1")  # j4 follows jside, j5 follows j1
    full = SerialChainKinematics.from_model(toy_model, end_link_name="tool")
    q = _random_q(full, 10)
    T_world = full.forward_kinematics(q)
    f2 = toy_model.frame_index("l2")
    T_w2 = forward_kinematics(toy_model, _full_q(toy_model, full, q))[:, f2]
    T_2tool = c.forward_kinematics(q[:, [2, 3, 0]])
    assert (T_w2 @ T_2tool - T_world).abs().max() < 1e-13


def test_no_clipping_outside_limits(toy_model, toy):
    q = torch.tensor([3.5, 10.0, 0.9, -2.5], dtype=torch.float64)  # all beyond the limits
    T_ref = forward_kinematics(toy_model, _full_q(toy_model, toy, q))[toy_model.frame_index("tool")]
    assert (toy.forward_kinematics(q) - T_ref).abs().max() < 1e-13


# ---------------------------------------------------------------------- paths and batches


@pytest.mark.parametrize("shape", [(), (1,), (5,), (2, 3), (2, 1, 40), (130,)])
def test_batch_shapes(toy, shape):
    q = _random_q(toy, *shape, seed=1)
    T = toy.forward_kinematics(q)
    T2, J = toy.evaluate(q)
    assert T.shape == (*shape, 4, 4) and T2.shape == (*shape, 4, 4)
    assert J.shape == (*shape, 6, 4)
    flat_T, flat_J = toy.evaluate(q.reshape(-1, 4))
    assert torch.equal(T2.reshape(-1, 4, 4), flat_T)
    assert torch.equal(J.reshape(-1, 6, 4), flat_J)
    assert (T - T2).abs().max() < 1e-14
    assert torch.equal(T[..., 3, :], torch.tensor([0.0, 0, 0, 1], dtype=torch.float64).expand(*shape, 4))


def test_small_batch_tree_matches_serial_path(panda, toy):
    """The pose on the reference FK kernel (every layout: 1 and 2 samples
    batch-first, 64 batch-last 4x4, 600 batch-last three rows) equals the
    Jacobian pass's pose, as 4x4 and in the IK's transposed layout."""
    for chain in (panda, toy):
        for n in (1, 2, 7, 64, 600):
            q = _random_q(chain, n, seed=n)
            T_tree = chain._pose(q, None)
            T_serial = chain.evaluate(q)[0]
            assert T_tree.shape == (n, 4, 4)
            assert (T_tree - T_serial).abs().max() < 1e-14
            RT, p = chain.pose_soa(q.T.contiguous(), None)
            RT_s, p_s, _ = chain.fast_plain(q.T.contiguous(), None)
            assert (RT - RT_s).abs().max() < 1e-14 and (p - p_s).abs().max() < 1e-14


def test_empty_batch(toy):
    T, J = toy.evaluate(torch.zeros(0, 4, dtype=torch.float64))
    assert T.shape == (0, 4, 4) and J.shape == (0, 6, 4)


def test_tcp_moves_the_tool_point(panda):
    tcp = torch.eye(4, dtype=torch.float64)
    tcp[:3, 3] = torch.tensor([0.01, -0.02, 0.1], dtype=torch.float64)
    q = _random_q(panda, 20)
    T0, J0 = panda.evaluate(q)
    T1, J1 = panda.evaluate(q, tcp)
    assert (T1 - T0 @ tcp).abs().max() < 1e-14
    # Same angular rows; linear rows gain omega x offset.
    offset = (T1[:, :3, 3] - T0[:, :3, 3])[:, None, :]
    lin = J0[:, :3] + torch.linalg.cross(J0[:, 3:].transpose(1, 2), offset.expand(-1, 7, -1)).transpose(1, 2)
    assert (J1[:, 3:] - J0[:, 3:]).abs().max() < 1e-14
    assert (J1[:, :3] - lin).abs().max() < 1e-14
    assert (panda.forward_kinematics(q[:3], tcp) - T1[:3]).abs().max() < 1e-14


# ---------------------------------------------------------------------- gradients


def test_gradcheck_fk_every_layout(toy, panda):
    """The pose's gradients in every layout of the reference FK kernel (one
    sample: ``multi_dot``; 3 batch-first; 40 batch-last 4x4 and 600 batch-last
    top three rows, both with the fused first round), with a prismatic joint
    (toy: four weights per joint) and a tcp that requires grad; second
    derivatives, and forward mode (``torch.func.jvp``) against reverse mode
    (``vjp``) through the fused round."""
    tcp = torch.eye(4, dtype=torch.float64)
    tcp[:3, 3] = torch.tensor([0.05, -0.02, 0.1], dtype=torch.float64)
    tcp.requires_grad_()
    for chain in (toy, panda):
        for n in (1, 3, 40, 600):
            q = _random_q(chain, n, seed=4 + n).requires_grad_()
            q = q[0].detach().requires_grad_() if n == 1 else q
            fast = chain is panda or n != 3  # fast mode (random projections) but for one full check
            assert gradcheck(chain.forward_kinematics, (q,), fast_mode=fast), (chain, n)
            if chain is toy and n in (1, 600):
                assert gradcheck(chain.forward_kinematics, (q, tcp), fast_mode=True), n
    q = _random_q(toy, 40, seed=9).requires_grad_()
    assert torch.autograd.gradgradcheck(toy.forward_kinematics, (q,), fast_mode=True)
    g = torch.Generator().manual_seed(2)
    for chain in (toy, panda):
        x = _random_q(chain, 40, seed=10)
        v = torch.randn(x.shape, generator=g, dtype=torch.float64)
        u = torch.randn(40, 4, 4, generator=g, dtype=torch.float64)
        _, jv = torch.func.jvp(chain.forward_kinematics, (x,), (v,))
        _, pullback = torch.func.vjp(chain.forward_kinematics, x)
        (uj,) = pullback(u)
        assert abs(float((u * jv).sum() - (uj * v).sum())) < 1e-10


def test_gradcheck_evaluate_pose_and_jacobian(toy, panda):
    for chain in (toy, panda):
        q = _random_q(chain, 2, seed=5).requires_grad_()
        assert gradcheck(lambda x: chain.evaluate(x), (q,))
    tcp = torch.eye(4, dtype=torch.float64)
    tcp[:3, 3] = 0.1
    tcp.requires_grad_()
    q = _random_q(toy, 2, seed=6).requires_grad_()
    assert gradcheck(lambda x, t: toy.evaluate(x, t), (q, tcp))


def test_second_derivatives(toy):
    q = _random_q(toy, 2, seed=8).requires_grad_()
    assert torch.autograd.gradgradcheck(lambda x: toy.evaluate(x)[1], (q,))


def test_float32_geometry_is_recast_exactly(panda):
    q = _random_q(panda, 10)
    round_trip = panda.to(dtype=torch.float32).to(dtype=torch.float64)
    assert round_trip.fingerprint == panda.fingerprint
    assert torch.equal(round_trip.evaluate(q)[0], panda.evaluate(q)[0])
    c32 = panda.float()
    assert c32.dtype == torch.float32 and c32.lower.dtype == torch.float32
    assert c32.double().dtype == torch.float64
    assert panda.dtype == torch.float64  # .to returned copies


# ---------------------------------------------------------------------- fingerprints


def test_fingerprint_depends_on_geometry_only():
    a = SerialChainKinematics.from_urdf(TOY_URDF, end_link_name="tool")
    b = SerialChainKinematics.from_urdf(TOY_URDF, end_link_name="tool", dtype=torch.float64)
    assert a.fingerprint == b.fingerprint
    moved = TOY_URDF.replace('<origin xyz="0 0.02 0.1" rpy="0.1 0.2 0.3"/>', '<origin xyz="0 0.02 0.1001" rpy="0.1 0.2 0.3"/>')
    c = SerialChainKinematics.from_urdf(moved, end_link_name="tool")
    assert c.fingerprint != a.fingerprint
    d = SerialChainKinematics.from_urdf(TOY_URDF, end_link_name="l5")
    assert d.fingerprint != a.fingerprint
    # Limits are not geometry.
    relimited = TOY_URDF.replace('lower="-2" upper="2"', 'lower="-1.5" upper="2"')
    assert SerialChainKinematics.from_urdf(relimited, end_link_name="tool").fingerprint == a.fingerprint


# ---------------------------------------------------------------------- errors


def test_unknown_link_lists_closest_names(toy_model):
    with pytest.raises(UnknownNameError) as exc:
        SerialChainKinematics.from_model(toy_model, end_link_name="tol")
    assert "tool" in exc.value.candidates
    assert "tool" in str(exc.value)
    with pytest.raises(UnknownNameError, match="base"):
        SerialChainKinematics.from_model(toy_model, end_link_name="tool", root_link_name="bse")
    with pytest.raises(ValueError):  # a ValueError for callers that do not care
        SerialChainKinematics.from_urdf(TOY_URDF, end_link_name="nope")


def test_root_must_be_an_ancestor(toy_model):
    with pytest.raises(InputError, match="not an ancestor"):
        SerialChainKinematics.from_model(toy_model, end_link_name="tool", root_link_name="side")
    with pytest.raises(InputError, match="not an ancestor"):
        SerialChainKinematics.from_model(toy_model, end_link_name="l1", root_link_name="l3")


def test_chain_without_joints_is_rejected(toy_model):
    with pytest.raises(InputError, match="no moving joint"):
        SerialChainKinematics.from_model(toy_model, end_link_name="tool", root_link_name="l5")


def test_floating_base_model_is_rejected():
    m = RobotModel.from_urdf(TOY_URDF, floating_base=True)
    with pytest.raises(InputError, match="floating_base"):
        SerialChainKinematics.from_model(m, end_link_name="tool")


def test_bad_arguments(toy_model, toy):
    with pytest.raises(InputError, match="RobotModel"):
        SerialChainKinematics(TOY_URDF, end_link_name="tool")
    with pytest.raises(InputError, match="end_link_name"):
        SerialChainKinematics.from_model(toy_model, end_link_name=3)
    with pytest.raises(InputError, match="float32 or torch.float64"):
        toy.to(dtype=torch.float16)
    with pytest.raises(backdrive.ModelError):
        SerialChainKinematics.from_urdf("<robot", end_link_name="tool")


@pytest.mark.parametrize(
    "make,match",
    [
        (lambda c: torch.zeros(3, dtype=torch.float64), r"\(\.\.\., 4\)"),
        (lambda c: torch.zeros((), dtype=torch.float64), r"\(\.\.\., 4\)"),
        (lambda c: torch.zeros(4, dtype=torch.float32), "dtype"),
        (lambda c: torch.zeros(4, dtype=torch.int64), "dtype"),
        (lambda c: [0.0, 0.0, 0.0, 0.0], "torch.Tensor"),
        (lambda c: torch.zeros(4, dtype=torch.float64, device="meta"), "is on meta"),
    ],
)
def test_input_errors(toy, make, match):
    for fn in (toy.forward_kinematics, toy.evaluate, toy.jacobian):
        with pytest.raises(InputError, match=match):
            fn(make(toy))


def test_tcp_errors(toy):
    q = torch.zeros(4, dtype=torch.float64)
    with pytest.raises(InputError, match=r"\(4, 4\)"):
        toy.forward_kinematics(q, torch.eye(3, dtype=torch.float64))
    with pytest.raises(InputError, match="dtype"):
        toy.evaluate(q, torch.eye(4))


def test_closed_form_jacobian_backward_matches_autograd(panda):
    """The revolute fast path (``_JacobianPass``): gradients of pose and
    Jacobian equal plain autograd, pass gradcheck and gradgradcheck, also
    with mimic coupling."""
    revolute_toy = SerialChainKinematics.from_urdf(
        TOY_URDF.replace('type="prismatic"', 'type="revolute"'), end_link_name="tool", dtype=torch.float64
    )
    assert not revolute_toy._identity_coupling and not revolute_toy._any_pri
    tcp = torch.eye(4, dtype=torch.float64)
    tcp[:3, 3] = torch.tensor([0.01, 0.02, 0.1], dtype=torch.float64)
    for chain in (panda, revolute_toy):
        qT = _random_q(chain, 5, seed=9).T.contiguous().requires_grad_()
        outs_fast = chain_module._JacobianPass.apply(qT, chain, tcp)
        outs_plain = chain.fast_plain(qT, tcp)
        g = torch.Generator().manual_seed(1)
        ws = [torch.randn(o.shape, generator=g, dtype=torch.float64) for o in outs_plain]
        (a,) = torch.autograd.grad(sum((o * w).sum() for o, w in zip(outs_fast, ws)), qT)
        (b,) = torch.autograd.grad(sum((o * w).sum() for o, w in zip(outs_plain, ws)), qT)
        assert (a - b).abs().max() < 1e-12
        small = qT[:, :2].detach().requires_grad_()
        assert gradcheck(lambda q: chain_module._JacobianPass.apply(q, chain, tcp), (small,))
        assert torch.autograd.gradgradcheck(lambda q: chain_module._JacobianPass.apply(q, chain, tcp), (small,))
    # evaluate() takes the fast path for a revolute chain when q needs a gradient
    def graph_names(t):
        seen, stack, names = set(), [t.grad_fn], set()
        while stack:
            fn = stack.pop()
            if fn is None or fn in seen:
                continue
            seen.add(fn)
            names.add(type(fn).__name__)
            stack.extend(f for f, _ in fn.next_functions)
        return names

    q = _random_q(panda, 3).requires_grad_()
    assert any("_JacobianPass" in n for n in graph_names(panda.evaluate(q)[1]))
    assert not any("_JacobianPass" in n for n in graph_names(panda.forward_kinematics(q)))
    toy_q = _random_q(SerialChainKinematics.from_urdf(TOY_URDF, end_link_name="tool", dtype=torch.float64), 3)
    toy = SerialChainKinematics.from_urdf(TOY_URDF, end_link_name="tool", dtype=torch.float64)
    # a prismatic joint: plain autograd
    assert not any("_JacobianPass" in n for n in graph_names(toy.evaluate(toy_q.requires_grad_())[1]))


def test_pose_is_the_reference_kernel_at_every_batch_size(panda, toy, monkeypatch):
    """Pose queries run the reference FK kernel at every batch size (no
    pose-only GEMM pass): equal to the Jacobian pass's pose at 3,000 samples,
    and the fused first round (:func:`~backdrive.kinematics._fk.jump_first`)
    equal to the local transforms and their products, values and gradients."""
    for chain in (panda, toy):
        q = _random_q(chain, 3000, seed=3)
        T_ref = chain.evaluate(q)[0]
        T = chain.forward_kinematics(q)
        assert (T - T_ref).abs().max() < 1e-14
        RT, p = chain.pose_soa(q.T.contiguous(), None)
        RT_s, p_s, _ = chain.fast_plain(q.T.contiguous(), None)
        assert (RT - RT_s).abs().max() < 1e-14 and (p - p_s).abs().max() < 1e-14
        w = torch.randn(40, 4, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
        grads = []
        for fused in (True, False):
            if not fused:
                monkeypatch.setattr(chain, "_jump_pairs", None)
            for n in (40, 600):  # batch-last 4x4, batch-last top three rows
                x = _random_q(chain, n, seed=n).requires_grad_()
                (chain.forward_kinematics(x)[:40] * w).sum().backward()
                grads.append(x.grad)
            monkeypatch.undo()
        assert all((a - b).abs().max() < 1e-13 for a, b in zip(grads[:2], grads[2:]))
