"""DifferentiableFKLayer / DifferentiableIKLayer: the nn.Module contract and checkpoints."""

from __future__ import annotations

import io
import math

import numpy as np
import pytest
import torch
from torch import nn

import backdrive.kinematics as kin
import backdrive.layers as layers
from backdrive import InputError
from backdrive.data import get_data_path
from backdrive.kinematics import (
    ConfigError,
    DifferentiableIKCfg,
    SerialChainKinematics,
    pose_error,
    solve_dls_ik,
)
from backdrive.layers import CheckpointMismatchError, DifferentiableFKLayer, DifferentiableIKLayer
from _robots import TOY_URDF


@pytest.fixture(scope="module")
def panda32():
    return SerialChainKinematics.from_urdf(get_data_path("panda"), end_link_name="panda_hand_tcp")


@pytest.fixture(scope="module")
def panda64(panda32):
    return panda32.double()


@pytest.fixture(scope="module")
def toy():
    return SerialChainKinematics.from_urdf(TOY_URDF, end_link_name="tool", dtype=torch.float64)


def _tcp(dtype=torch.float64, z=0.05, yaw=0.3):
    T = torch.eye(4, dtype=dtype)
    c, s = math.cos(yaw), math.sin(yaw)
    T[:2, :2] = torch.tensor([[c, -s], [s, c]], dtype=dtype)
    T[2, 3] = z
    return T


def _q(layer, *shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    lo, hi = layer.lower, layer.upper
    lo = torch.where(torch.isfinite(lo), lo, torch.full_like(lo, -3.0))
    hi = torch.where(torch.isfinite(hi), hi, torch.full_like(hi, 3.0))
    return lo + (hi - lo) * torch.rand(*shape, layer.dof, generator=g, dtype=torch.float64).to(layer.dtype)


def test_public_names_resolve():
    for mod in (kin, layers):
        for name in mod.__all__:
            assert getattr(mod, name) is not None
    assert kin.pose_error is pose_error


# ---------------------------------------------------------------------- FK layer


def test_fk_layer_buffers_and_copy(panda32):
    fk = DifferentiableFKLayer(panda32)
    assert fk.chain is not panda32 and fk.chain.fingerprint == panda32.fingerprint
    assert dict(fk.named_buffers()).keys() == {"tcp", "lower", "upper", "geometry_fingerprint"}
    assert list(fk.parameters()) == []
    assert torch.equal(fk.tcp, torch.eye(4))
    assert torch.equal(fk.lower, panda32.lower) and torch.equal(fk.upper, panda32.upper)
    assert fk.lower is not panda32.lower
    assert bytes(fk.geometry_fingerprint.tolist()).hex() == panda32.fingerprint
    assert fk.dof == 7 and fk.joint_names == panda32.joint_names
    assert fk.dtype == torch.float32 and fk.fingerprint == panda32.fingerprint


def test_fk_layer_computes_what_the_chain_computes(panda64):
    tcp = _tcp()
    fk = DifferentiableFKLayer(panda64, tcp=tcp)
    q = _q(fk, 2, 5)
    T, J = fk.evaluate(q)
    T_ref, J_ref = panda64.evaluate(q, tcp)
    assert torch.equal(T, T_ref) and torch.equal(J, J_ref)
    assert (fk(q) - T).abs().max() < 1e-14
    assert (fk.forward(q[0, 0]) - T[0, 0]).abs().max() < 1e-14
    assert torch.equal(fk.jacobian(q), J)
    assert fk(q).shape == (2, 5, 4, 4) and J.shape == (2, 5, 6, 7)


def test_fk_does_not_clip(panda64):
    fk = DifferentiableFKLayer(panda64)
    q = fk.upper + 0.5
    assert (fk(q) - panda64.forward_kinematics(q)).abs().max() < 1e-14
    assert not torch.allclose(fk(q), fk(fk.upper))


@pytest.mark.parametrize(
    "tcp,match",
    [
        (torch.eye(4) * 2.0, "rigid"),
        (torch.diag(torch.tensor([1.0, 1.0, -1.0, 1.0])), "det"),
        (torch.tensor([[1.0, 0.1, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]]), "rigid"),
        (torch.tensor([[1.0, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0.5, 1]]), "bottom row"),
        (torch.full((4, 4), math.nan), "finite"),
        (torch.eye(3), r"\(4, 4\)"),
        ("identity", "tensor"),
    ],
)
def test_tcp_validation(panda32, tcp, match):
    with pytest.raises(InputError, match=match):
        DifferentiableFKLayer(panda32, tcp=tcp)


def test_tcp_accepts_arrays_and_casts(panda32):
    tcp = _tcp().numpy()
    fk = DifferentiableFKLayer(panda32, tcp=tcp)
    assert fk.tcp.dtype == torch.float32 and torch.allclose(fk.tcp, torch.from_numpy(tcp).float())
    fk2 = DifferentiableFKLayer(panda32, tcp=tcp.tolist())
    assert torch.equal(fk.tcp, fk2.tcp)
    src = _tcp(torch.float32).requires_grad_()
    fk3 = DifferentiableFKLayer(panda32, tcp=src)
    assert not fk3.tcp.requires_grad and fk3.tcp is not src


def test_limit_validation(panda32):
    with pytest.raises(InputError, match=r"\(7,\)"):
        DifferentiableFKLayer(panda32, lower=torch.zeros(6))
    with pytest.raises(InputError, match="NaN"):
        DifferentiableFKLayer(panda32, upper=torch.full((7,), math.nan))
    with pytest.raises(InputError, match="exceed"):
        DifferentiableFKLayer(panda32, lower=torch.ones(7), upper=torch.zeros(7))
    fk = DifferentiableFKLayer(panda32, lower=[-math.inf] * 7, upper=np.ones(7))
    assert torch.isinf(fk.lower).all() and torch.equal(fk.upper, torch.ones(7))


def test_default_seed(toy):
    fk = DifferentiableFKLayer(toy)
    seed = fk.default_seed()
    assert seed.tolist() == [0.0, 0.0, 0.15000000000000002, 0.0]  # j2 unbounded -> 0
    lo = torch.tensor([0.5, -math.inf, -0.1, -math.inf], dtype=torch.float64)
    hi = torch.tensor([2.0, -1.0, 0.4, math.inf], dtype=torch.float64)
    seed = DifferentiableFKLayer(toy, lower=lo, upper=hi).default_seed()
    assert seed.tolist() == [1.25, -1.0, 0.15000000000000002, 0.0]


def test_input_dtype_and_device_must_match(panda32):
    fk = DifferentiableFKLayer(panda32)
    for fn in (fk, fk.evaluate, fk.jacobian):
        with pytest.raises(InputError, match="dtype"):
            fn(torch.zeros(7, dtype=torch.float64))
        with pytest.raises(InputError, match="is on meta"):
            fn(torch.zeros(7, device="meta"))
        with pytest.raises(InputError, match=r"\(\.\.\., 7\)"):
            fn(torch.zeros(6))


def test_to_migrates_geometry(panda32, panda64):
    fk = DifferentiableFKLayer(panda32, tcp=_tcp(torch.float32))
    q = _q(fk, 4).double()
    assert fk.double() is fk
    assert fk.chain.dtype == torch.float64 and fk.tcp.dtype == torch.float64
    assert fk.lower.dtype == torch.float64 and fk.geometry_fingerprint.dtype == torch.uint8
    # geometry re-cast from float64: identical to a float64 chain
    ref = DifferentiableFKLayer(panda64, tcp=fk.tcp)
    assert torch.equal(fk.evaluate(q)[1], ref.evaluate(q)[1])
    fk.float()
    assert fk.chain.dtype == torch.float32
    fk.to(torch.float64)
    assert fk.chain.dtype == torch.float64
    fk.to("meta")
    assert fk.chain.device.type == "meta" and fk.chain.lower.device.type == "meta"
    assert fk.geometry_fingerprint.device.type == "meta"


def test_unsupported_dtypes_are_refused(panda32):
    fk = DifferentiableFKLayer(panda32)
    for convert in (fk.half, fk.bfloat16, lambda: fk.to(torch.float16)):
        with pytest.raises(InputError, match="float32 and float64"):
            convert()
    assert fk.tcp.dtype == torch.float32 and fk.chain.dtype == torch.float32  # unchanged


def test_eval_mode_keeps_input_gradients(panda64):
    fk = DifferentiableFKLayer(panda64).eval()
    ik = DifferentiableIKLayer(fk, DifferentiableIKCfg(max_iterations=2)).eval()
    q = _q(fk, 3).requires_grad_()
    T, J = fk.evaluate(q)
    (gq,) = torch.autograd.grad(T.sum() + J.sum(), q)
    assert gq.abs().sum() > 0
    target = fk(q.detach()).requires_grad_()
    (gt,) = torch.autograd.grad(ik(target).sum(), target)
    assert gt.abs().sum() > 0


def test_calls_are_stateless_and_independent(panda64):
    fk = DifferentiableFKLayer(panda64)
    q = _q(fk, 3).requires_grad_()
    a, b = fk.evaluate(q), fk.evaluate(q)
    (ga,) = torch.autograd.grad(a[1].sum(), q)
    (gb,) = torch.autograd.grad(b[1].sum(), q)
    assert torch.equal(ga, gb)
    assert torch.equal(fk.evaluate(q)[0], a[0])


def test_fk_layer_gradcheck(toy):
    fk = DifferentiableFKLayer(toy, tcp=_tcp())
    q = _q(fk, 2, seed=3).requires_grad_()
    assert torch.autograd.gradcheck(lambda x: fk.evaluate(x), (q,))
    assert torch.autograd.gradcheck(fk, (q,))


def test_rejects_non_chain_model():
    with pytest.raises(InputError, match="SerialChainKinematics"):
        DifferentiableFKLayer("panda")


# ---------------------------------------------------------------------- IK layer


def test_ik_layer_solves_and_matches_the_functional_solver(panda64):
    tcp = _tcp()
    lo = panda64.lower.clone()
    lo[0] = -0.5
    fk = DifferentiableFKLayer(panda64, tcp=tcp, lower=lo)
    cfg = DifferentiableIKCfg(max_iterations=20)
    ik = DifferentiableIKLayer(fk, cfg)
    q_true = (fk.default_seed() + 0.15 * torch.randn(2, 3, 7, dtype=torch.float64, generator=torch.Generator().manual_seed(1))).clamp(fk.lower, fk.upper)
    T = fk(q_true)
    res = ik.solve(T)
    ref = solve_dls_ik(panda64, T, None, cfg, tcp=tcp, lower=lo, upper=panda64.upper)
    assert torch.equal(res.qpos, ref.qpos) and torch.equal(res.success, ref.success)
    assert res.success.all() and res.qpos.shape == (2, 3, 7)
    assert (res.qpos[..., 0] >= -0.5).all()
    assert torch.equal(ik(T), res.qpos)
    seed = q_true[0, 0]
    assert torch.equal(ik(T, seed), ik.solve(T, seed).qpos)
    assert ik.dof == 7 and list(ik.parameters()) == []


def test_ik_layer_gradients_reach_target_and_seed(panda64):
    fk = DifferentiableFKLayer(panda64)
    ik = DifferentiableIKLayer(fk, DifferentiableIKCfg(max_iterations=3))
    g = torch.Generator().manual_seed(2)
    T = fk(fk.default_seed() + 0.3 * torch.randn(2, 7, generator=g, dtype=torch.float64)).requires_grad_()
    seed = (fk.default_seed() + 0.05 * torch.randn(2, 7, generator=g, dtype=torch.float64)).requires_grad_()
    assert torch.autograd.gradcheck(lambda t, s: ik.solve(t, s).qpos, (T, seed))


def test_ik_layer_argument_errors(panda64):
    with pytest.raises(InputError, match="DifferentiableFKLayer"):
        DifferentiableIKLayer(panda64)
    with pytest.raises(ConfigError, match="DifferentiableIKCfg"):
        DifferentiableIKLayer(DifferentiableFKLayer(panda64), {"max_iterations": 3})
    ik = DifferentiableIKLayer(DifferentiableFKLayer(panda64))
    with pytest.raises(InputError, match="dtype"):
        ik(torch.eye(4))
    with pytest.raises(InputError, match="qpos_seed"):
        ik(torch.eye(4, dtype=torch.float64).expand(3, 4, 4), torch.zeros(2, 7, dtype=torch.float64))


def test_ik_layer_follows_dtype_moves(panda32):
    ik = DifferentiableIKLayer(DifferentiableFKLayer(panda32), DifferentiableIKCfg(max_iterations=4))
    ik.double()
    assert ik.fk.chain.dtype == torch.float64
    T = ik.fk(ik.fk.default_seed() + 0.1)
    assert ik(T).dtype == torch.float64


# ---------------------------------------------------------------------- checkpoints


def _trained_ik(chain, dtype=None):
    lo = chain.lower.clone()
    lo[1] = -1.0
    fk = DifferentiableFKLayer(chain, tcp=_tcp(chain.dtype), lower=lo)
    return DifferentiableIKLayer(fk, DifferentiableIKCfg(max_iterations=7, damping=0.1, num_seeds=2))


def test_state_dict_contents(panda32):
    ik = _trained_ik(panda32)
    sd = ik.state_dict()
    # the seed contract's child name: keys under "kinematics."
    assert set(sd) == {
        "kinematics.tcp", "kinematics.lower", "kinematics.upper", "kinematics.geometry_fingerprint", "_extra_state"
    }
    assert sd["_extra_state"]["ik_cfg"]["max_iterations"] == 7
    assert sd["_extra_state"]["ik_cfg"]["num_seeds"] == 2
    assert sd["kinematics.geometry_fingerprint"].dtype == torch.uint8
    assert ik.fk is ik.kinematics


def test_round_trip_same_dtype(panda32):
    src = _trained_ik(panda32)
    buf = io.BytesIO()
    torch.save(src.state_dict(), buf)
    buf.seek(0)
    sd = torch.load(buf, weights_only=True)
    dst = DifferentiableIKLayer(DifferentiableFKLayer(panda32))
    dst.load_state_dict(sd)
    assert torch.equal(dst.fk.tcp, src.fk.tcp) and torch.equal(dst.fk.lower, src.fk.lower)
    assert dst.cfg == src.cfg
    T = src.fk(src.fk.default_seed() + 0.2)
    assert torch.equal(dst(T), src(T))


def test_round_trip_dtype_change(panda32, panda64):
    src = _trained_ik(panda32)
    sd = src.state_dict()
    # copy semantics: values are cast into the existing float64 buffers
    dst = DifferentiableIKLayer(DifferentiableFKLayer(panda64))
    dst.load_state_dict(sd)
    assert dst.fk.tcp.dtype == torch.float64 and dst.fk.chain.dtype == torch.float64
    assert torch.equal(dst.fk.tcp, src.fk.tcp.double())
    # assign semantics: the checkpoint's dtype is adopted, geometry included
    dst = DifferentiableIKLayer(DifferentiableFKLayer(panda64))
    dst.load_state_dict(sd, assign=True)
    assert dst.fk.tcp.dtype == torch.float32 and dst.fk.lower.dtype == torch.float32
    assert dst.fk.chain.dtype == torch.float32 and dst.fk.chain.lower.dtype == torch.float32
    q = _q(src.fk, 5)
    assert torch.equal(dst.fk.evaluate(q)[1], src.fk.evaluate(q)[1])
    assert dst.cfg == src.cfg


def test_assign_load_nested_in_a_larger_module(panda32, panda64):
    class Policy(nn.Module):
        def __init__(self, chain):
            super().__init__()
            self.head = nn.Linear(3, 7, dtype=chain.dtype)
            self.ik = _trained_ik(chain)

        def forward(self, x):
            return self.ik.fk(self.head(x))

    src = Policy(panda32)
    dst = Policy(panda64)
    dst.load_state_dict(src.state_dict(), assign=True)
    assert dst.head.weight.dtype == torch.float32
    assert dst.ik.fk.chain.dtype == torch.float32 and dst.ik.fk.tcp.dtype == torch.float32
    x = torch.randn(4, 3)
    assert torch.equal(dst(x), src(x))


def test_mismatched_geometry_is_refused_before_copying(panda32, toy):
    other = SerialChainKinematics.from_urdf(get_data_path("panda"), end_link_name="panda_link8")
    for wrong in (other, toy.float()):
        src = DifferentiableFKLayer(wrong, tcp=_tcp(torch.float32, z=0.3))
        dst = DifferentiableFKLayer(panda32)
        before = {k: v.clone() for k, v in dst.state_dict().items()}
        sd = src.state_dict()
        with pytest.raises(CheckpointMismatchError, match="other kinematic geometry"):
            dst.load_state_dict(sd)
        with pytest.raises(ValueError):
            dst.load_state_dict(sd, assign=True)
        for k, v in dst.state_dict().items():
            assert torch.equal(v, before[k]), k
    # nested: the IK layer's prefix is reported
    ik_src = DifferentiableIKLayer(DifferentiableFKLayer(other))
    ik_dst = DifferentiableIKLayer(DifferentiableFKLayer(panda32))
    with pytest.raises(CheckpointMismatchError, match="kinematics."):
        ik_dst.load_state_dict(ik_src.state_dict())


@pytest.mark.parametrize("strict", [True, False])
def test_checkpoint_without_fingerprint_is_refused_strict_or_not(panda32, strict):
    """Issue 14 part 5: the docs say a checkpoint that cannot be checked is refused;
    strict=False used to skip the check and copy the buffers."""
    src = DifferentiableFKLayer(panda32, tcp=_tcp(torch.float32, z=0.3))
    sd = src.state_dict()
    del sd["geometry_fingerprint"]
    dst = DifferentiableFKLayer(panda32)
    before = {k: v.clone() for k, v in dst.state_dict().items()}
    with pytest.raises(CheckpointMismatchError, match="no 'geometry_fingerprint'"):
        dst.load_state_dict(sd, strict=strict)
    for k, v in dst.state_dict().items():
        assert torch.equal(v, before[k]), k
    # nested, under strict=False: still refused, naming the prefix
    ik_sd = DifferentiableIKLayer(src).state_dict()
    del ik_sd["kinematics.geometry_fingerprint"]
    with pytest.raises(CheckpointMismatchError, match="kinematics."):
        DifferentiableIKLayer(DifferentiableFKLayer(panda32)).load_state_dict(ik_sd, strict=False)


def test_strict_false_checkpoint_without_this_layer_leaves_it_unchanged(panda32):
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.head = nn.Linear(2, 7)
            self.fk = DifferentiableFKLayer(panda32, tcp=_tcp(torch.float32, z=0.2))

    net = Net()
    head_only = {k: v for k, v in Net().state_dict().items() if k.startswith("head.")}
    result = net.load_state_dict(head_only, strict=False)
    assert set(result.missing_keys) == {"fk.tcp", "fk.lower", "fk.upper", "fk.geometry_fingerprint"}
    assert torch.equal(net.fk.tcp, _tcp(torch.float32, z=0.2))
    assert torch.equal(net.head.weight, head_only["head.weight"])


def test_ik_layer_kinematics_argument_and_old_checkpoints(panda32):
    """Issue 14 part 5: DifferentiableIKLayer(kinematics=fk), keys under kinematics.,
    and state dicts saved with the earlier fk. keys still load."""
    src = _trained_ik(panda32)
    by_kw = DifferentiableIKLayer(kinematics=DifferentiableFKLayer(panda32))
    by_old_kw = DifferentiableIKLayer(fk=DifferentiableFKLayer(panda32), cfg=src.cfg)
    assert isinstance(by_kw.kinematics, DifferentiableFKLayer) and by_old_kw.cfg == src.cfg
    with pytest.raises(InputError, match="not both"):
        DifferentiableIKLayer(kinematics=DifferentiableFKLayer(panda32), fk=DifferentiableFKLayer(panda32))
    with pytest.raises(InputError, match="kinematics must be a DifferentiableFKLayer"):
        DifferentiableIKLayer()
    old = {("fk." + k[len("kinematics."):] if k.startswith("kinematics.") else k): v for k, v in src.state_dict().items()}
    assert "fk.tcp" in old and not any(k.startswith("kinematics.") for k in old)
    for strict in (True, False):
        dst = DifferentiableIKLayer(kinematics=DifferentiableFKLayer(panda32))
        result = dst.load_state_dict(old, strict=strict)
        assert not result.missing_keys and not result.unexpected_keys
        assert torch.equal(dst.kinematics.tcp, src.kinematics.tcp) and dst.cfg == src.cfg
        assert torch.equal(dst.kinematics.lower, src.kinematics.lower)
    # an old checkpoint of other geometry is still refused
    other = SerialChainKinematics.from_urdf(get_data_path("panda"), "panda_link8")
    old_other = {"fk." + k: v for k, v in DifferentiableFKLayer(other).state_dict().items()}
    with pytest.raises(CheckpointMismatchError):
        DifferentiableIKLayer(DifferentiableFKLayer(panda32)).load_state_dict(old_other, strict=False)


def test_chain_from_urdf_accepts_positional_link_names():
    """Issue 14 part 5: from_urdf(text, end_link_name, root_link_name) positionally."""
    a = SerialChainKinematics.from_urdf(get_data_path("panda"), "panda_hand_tcp", "panda_link0")
    b = SerialChainKinematics.from_urdf(get_data_path("panda"), end_link_name="panda_hand_tcp")
    assert a.fingerprint == b.fingerprint and a.root_link_name == "panda_link0"
    c = SerialChainKinematics.from_urdf(TOY_URDF, "tool", "l1", dtype=torch.float64)
    assert c.root_link_name == "l1" and c.joint_names[0] == "j2"


def test_corrupt_checkpoints_are_refused(panda32):
    sd = DifferentiableFKLayer(panda32).state_dict()
    bad = dict(sd, tcp=torch.eye(4) * 2)
    with pytest.raises(InputError, match="rigid"):
        DifferentiableFKLayer(panda32).load_state_dict(bad)
    bad = dict(sd, lower=sd["upper"] + 1)
    with pytest.raises(InputError, match="exceed"):
        DifferentiableFKLayer(panda32).load_state_dict(bad)
    bad = dict(sd, tcp=sd["tcp"].double())
    with pytest.raises(InputError, match="share one dtype"):
        DifferentiableFKLayer(panda32).load_state_dict(bad, assign=True)
    ik_sd = DifferentiableIKLayer(DifferentiableFKLayer(panda32)).state_dict()
    ik_sd["_extra_state"] = {"ik_cfg": dict(ik_sd["_extra_state"]["ik_cfg"], damping=-1.0)}
    with pytest.raises(ConfigError, match="damping"):
        DifferentiableIKLayer(DifferentiableFKLayer(panda32)).load_state_dict(ik_sd)


def test_in_place_tcp_changes_are_seen(panda64):
    fk = DifferentiableFKLayer(panda64)
    q = _q(fk, seed=4)
    T0 = fk(q)  # caches the end-frame-from-tool product
    new = _tcp(z=0.2)
    fk.load_state_dict(dict(fk.state_dict(), tcp=new))  # copies in place
    assert (fk(q) - T0 @ new).abs().max() < 1e-14
    assert (fk.evaluate(q[None])[0][0] - T0 @ new).abs().max() < 1e-14
    with torch.no_grad():
        fk.tcp.copy_(torch.eye(4, dtype=torch.float64))
    assert (fk(q) - T0).abs().max() < 1e-14


@pytest.mark.parametrize("device", ["gpu", "cuda:x"])
def test_layers_name_a_bad_device(panda32, device):
    fk = DifferentiableFKLayer(panda32)
    for layer in (fk, DifferentiableIKLayer(fk)):
        with pytest.raises(InputError, match=f"device '{device}'"):
            layer.to(device)
        with pytest.raises(InputError, match=f"device '{device}'"):
            layer.to(device=device, dtype=torch.float64)
    assert fk.tcp.dtype == torch.float32  # nothing changed


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_layers_cuda_on_a_cpu_machine(panda32):
    fk = DifferentiableFKLayer(panda32)
    with pytest.raises(InputError, match="device 'cuda' is not available here"):
        fk.to("cuda")
    with pytest.raises(InputError, match="not available here"):
        fk.cuda()
