"""The tree FK's two paths (pointer-jumping reference, level-by-level fast
kernel) on random trees against a plain body-by-body composition of the
local poses.

Random trees (deep chains with branches, unsorted depth levels, revolute,
continuous, prismatic and fixed joints, fixed and floating base) stress the
pointer jumping's round schedule (the unfinished bodies must be a suffix of
the level order) and the level kernel's one-parent and gathered-parent
levels; Pinocchio agreement of both paths is in ``test_fk_reference.py`` and
``test_wide_batch_paths.py``.
"""

from __future__ import annotations

import math
import random
import sys
from pathlib import Path

import pytest
import torch

from backdrive import RobotModel
from backdrive.kinematics import _fk, use_path

sys.path.insert(0, str(Path(__file__).parent))
from _robots import SMALL_URDF, TOY_URDF, body_urdf  # noqa: E402


def random_tree_urdf(seed: int, n: int = 16) -> str:
    """A random tree of ``n`` links: each link's parent is one of the last
    few links (long chains) or, now and then, any earlier one (branches)."""
    rng = random.Random(seed)
    links, joints = ['<link name="l0"/>'], []
    kinds = ["revolute", "revolute", "continuous", "prismatic", "fixed"]
    for i in range(1, n):
        parent = rng.randrange(max(0, i - 2), i) if rng.random() < 0.7 else rng.randrange(i)
        kind = rng.choice(kinds)
        xyz = " ".join(f"{rng.uniform(-0.3, 0.3):.4f}" for _ in range(3))
        rpy = " ".join(f"{rng.uniform(-math.pi, math.pi):.4f}" for _ in range(3))
        ax = [rng.gauss(0, 1) for _ in range(3)]
        norm = math.sqrt(sum(a * a for a in ax))
        axis = " ".join(f"{a / norm:.6f}" for a in ax)
        limit = '<limit lower="-2" upper="2" effort="1" velocity="1"/>' if kind in ("revolute", "prismatic") else ""
        links.append(f'<link name="l{i}"/>')
        joints.append(
            f'<joint name="j{i}" type="{kind}"><parent link="l{parent}"/><child link="l{i}"/>'
            f'<origin xyz="{xyz}" rpy="{rpy}"/><axis xyz="{axis}"/>{limit}</joint>'
        )
    return '<?xml version="1.0"?><robot name="random_tree">' + "".join(links + joints) + "</robot>"


def composed(model: RobotModel, q: torch.Tensor):
    """World body poses by composing the local poses body by body (no levels,
    no jumping): ``T_b = T_parent(b) T_local(b)``."""
    Rl, pl = _fk.local_transforms(model, q)
    parent = model.parent.tolist()
    R, p = [None] * model.num_bodies, [None] * model.num_bodies

    def pose(b):
        if R[b] is None:
            if parent[b] < 0:
                R[b], p[b] = Rl[..., b, :, :], pl[..., b, :]
            else:
                Rp, pp = pose(parent[b])
                R[b] = Rp @ Rl[..., b, :, :]
                p[b] = (Rp @ pl[..., b, :, None])[..., 0] + pp
        return R[b], p[b]

    for b in range(model.num_bodies):
        pose(b)
    return torch.stack(R, -3), torch.stack(p, -2)


def _models():
    out = [(f"random{seed}{'-floating' if fb else ''}", random_tree_urdf(seed), fb) for seed in range(4) for fb in (False, True)]
    out += [("small", SMALL_URDF, False), ("small-floating", SMALL_URDF, True), ("toy", TOY_URDF, False)]
    return out


@pytest.mark.parametrize("name,urdf,floating", _models(), ids=[m[0] for m in _models()])
def test_both_paths_equal_body_by_body_composition(name, urdf, floating):
    model = RobotModel.from_urdf(urdf, floating_base=floating).to(dtype=torch.float64)
    g = torch.Generator().manual_seed(3)
    q = model.random_q(6, generator=g).reshape(2, 3, -1)
    R_ref, p_ref = composed(model, q)
    if not floating:
        assert len(model.levels) >= 4  # deep enough for several jumping rounds
    for path in ("reference", "fast"):
        for grad in (False, True):
            with use_path(path), torch.set_grad_enabled(grad):
                R, p = _fk.body_transforms(model, q.clone().requires_grad_(grad))
            assert R.shape == R_ref.shape and p.shape == p_ref.shape
            assert (R - R_ref).abs().max() < 1e-12, (path, grad)
            assert (p - p_ref).abs().max() < 1e-12, (path, grad)
    # One sample without a batch axis.
    R, p = _fk.body_transforms_reference(model, q[0, 0])
    assert (R - R_ref[0, 0]).abs().max() < 1e-12 and (p - p_ref[0, 0]).abs().max() < 1e-12


@pytest.mark.parametrize("name,urdf,floating", _models()[::2], ids=[m[0] for m in _models()[::2]])
def test_reference_layouts_and_output_subsets(name, urdf, floating, monkeypatch):
    """The reference kernel in each of its layouts (batch-first 4x4, one
    ``multi_dot`` for one sample and one output, batch-last 4x4, batch-last
    top three rows), on all bodies and on output subsets (only what they need
    composed), against the body-by-body composition; gradients equal across
    layouts."""
    model = RobotModel.from_urdf(urdf, floating_base=floating).to(dtype=torch.float64)
    nb = model.num_bodies
    g = torch.Generator().manual_seed(5)
    subsets = [(nb - 1,), (nb - 1, 0, nb // 2), tuple(range(nb))[::-1], (1,)]
    sizes = (1, 5, 40, 600)
    plan = _fk._cache(model)["jump_plan"]
    assert [_fk.jump_layout(plan, N) for N in sizes] == ["first", "first", "last", "affine"]
    for N in sizes:
        q = model.random_q(N, generator=g)
        R_ref, p_ref = composed(model, q)
        R, p = _fk.body_transforms_reference(model, q)
        assert (R - R_ref).abs().max() < 1e-12 and (p - p_ref).abs().max() < 1e-12, N
        for bodies in subsets:
            R, p = _fk.body_transforms_reference(model, q, bodies)
            idx = list(bodies)
            assert R.shape == (N, len(idx), 3, 3) and p.shape == (N, len(idx), 3)
            assert (R - R_ref[:, idx]).abs().max() < 1e-12 and (p - p_ref[:, idx]).abs().max() < 1e-12, (N, bodies)
    # Gradients: each layout against the batch-last 4x4 one; in the batch-last
    # layouts the first round fused with the local transforms (a fixed base)
    # against the local transforms and their products.
    assert (_fk._cache(model)["jump_pairs"] is None) == floating
    for N, key in ((5, "first"), (600, "affine"), (600, "unfused")):
        q = model.random_q(N, generator=g)
        wR = torch.randn(N, nb, 3, 3, generator=g, dtype=torch.float64)
        grads = []
        for force in (False, True):
            if key == "unfused" and not force:
                monkeypatch.setitem(_fk._cache(model), "jump_pairs", None)
            if force:
                monkeypatch.setitem(_fk.JUMP_BATCH_LAST_MIN, "tree", 0)
                monkeypatch.setattr(_fk, "JUMP_AFFINE_MIN", 10**9)
            assert _fk.jump_layout(plan, N) == ("last" if force else "affine" if key == "unfused" else key)
            x = q.clone().requires_grad_(True)
            R, p = _fk.body_transforms_reference(model, x)
            if key == "unfused" and not force:
                R_ref, p_ref = composed(model, q)
                assert (R - R_ref).abs().max() < 1e-12 and (p - p_ref).abs().max() < 1e-12
            ((R * wR).sum() + p.sum()).backward()
            grads.append(x.grad)
            monkeypatch.undo()
        assert (grads[0] - grads[1]).abs().max() < 1e-10, key


def test_jump_plan_on_a_path_is_the_pairwise_product_tree():
    """Pointer jumping restricted to the end of a path of ``n`` entries:
    ``ceil(log2(n))`` rounds and ``n - 1`` products in all (the pairwise
    product tree); unrestricted, every unfinished entry composes each round."""
    for n in range(1, 20):
        plan = _fk.jump_plan(list(range(-1, n - 1)), [n - 1], "cpu")
        sizes = [len(range(n)[a]) if isinstance(a, slice) else len(a) for _, a, _ in plan.rounds]
        assert plan.path and len(plan.rounds) == math.ceil(math.log2(n)) and sum(sizes) == n - 1, n
        full = _fk.jump_plan(list(range(-1, n - 1)), None, "cpu")
        sizes = [len(range(n)[a]) if isinstance(a, slice) else len(a) for _, a, _ in full.rounds]
        assert sizes == [n - 2**r for r in range(len(full.rounds))], n


def test_reference_gradients_forward_mode_and_double_backward():
    """The reference path stays plain autograd: gradcheck, gradgradcheck and
    forward-mode (jacfwd) equal reverse mode (jacrev). (The fast path's
    backward and double backward: ``test_wide_batch_paths.py``.)"""
    model = RobotModel.from_urdf(random_tree_urdf(1, n=7), floating_base=True).to(dtype=torch.float64)
    q = model.random_q(1, generator=torch.Generator().manual_seed(0)).requires_grad_(True)
    g = torch.Generator().manual_seed(1)
    wR = torch.randn(model.num_bodies, 3, 3, generator=g, dtype=torch.float64)
    wp = torch.randn(model.num_bodies, 3, generator=g, dtype=torch.float64)

    def f(x):  # weighted sums per body: every derivative enters, few outputs
        R, p = _fk.body_transforms_reference(model, x)
        return (R * wR).sum((-1, -2)), (p * wp).sum(-1)

    assert torch.autograd.gradcheck(f, (q,))
    assert torch.autograd.gradgradcheck(f, (q,))
    x = q[0].detach()
    jr = torch.func.jacrev(lambda x: _fk.body_transforms(model, x)[1])(x)
    jf = torch.func.jacfwd(lambda x: _fk.body_transforms(model, x)[1])(x)
    assert (jr - jf).abs().max() < 1e-12


@pytest.mark.parametrize("floating", [False, True])
def test_reference_single_body_and_empty_batches(floating):
    """No moving joint (``nq`` 0 for a fixed base), and empty batches."""
    model = RobotModel.from_urdf(body_urdf('<box size="0.1 0.1 0.1"/>', 1.0, (0.1, 0.1, 0.1)), floating_base=floating)
    model = model.to(dtype=torch.float64)
    q = model.random_q(3, generator=torch.Generator().manual_seed(0))
    R, p = _fk.body_transforms_reference(model, q)
    R_ref, p_ref = composed(model, q)
    assert R.shape == (3, 1, 3, 3) and (R - R_ref).abs().max() < 1e-12 and (p - p_ref).abs().max() < 1e-12
    assert _fk.body_transforms_reference(model, q[:0])[0].shape == (0, 1, 3, 3)
    tree = RobotModel.from_urdf(random_tree_urdf(0), floating_base=floating)
    qt = tree.random_q(2).reshape(2, 1, -1)[:, :0]
    assert _fk.body_transforms_reference(tree, qt)[1].shape == (2, 0, tree.num_bodies, 3)


@pytest.mark.parametrize("path", ["reference", "fast"])
def test_wound_up_joint_angles_keep_their_sine_and_cosine(path):
    """A revolute joint wound up to 1e6 and 1e30 rad: each path's rotation has
    the sine and cosine of the angle itself (a cosine taken as sin(a + pi/2)
    would be off by ulp(a): the whole cosine at 1e30)."""
    from backdrive.data import load

    robot = load("pendulum")
    q = torch.tensor([[1e6], [1e30], [0.5]], dtype=torch.float64)
    with use_path(path):
        R, _ = _fk.body_transforms(robot, q)
    c = torch.cos(q[:, 0])
    R1 = R[:, -1]
    # The pendulum's hinge turns about one axis: the rotation's trace is 1 + 2 cos.
    torch.testing.assert_close(R1.diagonal(dim1=-2, dim2=-1).sum(-1), 1 + 2 * c, atol=1e-12, rtol=0)
