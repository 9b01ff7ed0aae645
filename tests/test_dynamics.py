"""backdrive.dynamics against Pinocchio at random states, float32, shapes and errors."""

from __future__ import annotations

import math

import numpy as np
import pinocchio as pin
import pytest
import torch

import backdrive.dynamics as D
from backdrive import InputError, RobotModel
from backdrive.data import example_robot_data_dir, get_data_path

# float64 agreement with Pinocchio, relative to the size of the reference.
RTOL64 = 1e-10
# float32 agreement with the float64 result, relative to its size. Joint-space
# quantities are sums of many products of O(1) terms, and forward dynamics
# loses a further factor of the mass matrix's condition number (about 1e3
# for the robots below, with their light fingers and feet).
RTOL32 = 2e-4
RTOL32_FD = 5e-3

ERD = example_robot_data_dir()

from _robots import SMALL_URDF, SMALL_URDF_NO_MIMIC  # noqa: E402  (shared fixtures)


def _small_path(tmp_path_factory, text: str = SMALL_URDF, name: str = "small_tree") -> str:
    path = tmp_path_factory.getbasetemp() / f"{name}.urdf"
    if not path.exists():
        path.write_text(text)
    return str(path)


# name -> (path factory, floating base)
ROBOTS = {
    "panda_mimic": (lambda f: str(ERD / "panda_description/urdf/panda.urdf"), False),
    "ur5": (lambda f: str(ERD / "ur_description/urdf/ur5_robot.urdf"), False),
    "solo12": (lambda f: str(ERD / "solo_description/robots/solo12.urdf"), True),
    "double_pendulum_continuous": (
        lambda f: str(ERD / "double_pendulum_description/urdf/double_pendulum_continuous.urdf"),
        False,
    ),
    "shipped_panda": (lambda f: str(get_data_path("panda")), False),
    "shipped_cartpole": (lambda f: str(get_data_path("cartpole")), False),
    "shipped_quadruped": (lambda f: str(get_data_path("quadruped")), True),
    "small_tree": (_small_path, False),
    "small_tree_floating": (_small_path, True),
    "small_tree_no_mimic_floating": (lambda f: _small_path(f, SMALL_URDF_NO_MIMIC, "small_no_mimic"), True),
}


class PinRef:
    """A backdrive model, the matching Pinocchio model, and coordinate maps by joint name."""

    def __init__(self, path: str, floating_base: bool):
        self.robot = RobotModel.from_urdf(path, floating_base=floating_base)
        if floating_base:
            self.model = pin.buildModelFromUrdf(path, pin.JointModelFreeFlyer(), mimic=True)
        else:
            self.model = pin.buildModelFromUrdf(path, mimic=True)
        self.data = self.model.createData()
        self.mimic = any(j.shortname() == "JointModelMimic" for j in self.model.joints)
        rb, pm = self.robot, self.model
        assert pm.nv == rb.nv
        off = 6 if floating_base else 0
        self.vidx = list(range(off))  # pin v index of each backdrive v entry
        self.qjoint = []  # (backdrive q index, pin q index, pin nq) per joint coordinate
        for c, name in enumerate(rb.joint_names):
            j = pm.joints[pm.getJointId(name)]
            self.vidx.append(j.idx_v)
            self.qjoint.append((c + (7 if floating_base else 0), j.idx_q, j.nq))
        self.vidx = np.array(self.vidx)
        # Continuous joints (Pinocchio stores cos and sin): backdrive q and v indices.
        self.cont_q = [i for i, _, nq in self.qjoint if nq == 2]
        self.cont_v = [i - (1 if floating_base else 0) for i in self.cont_q]
        # Pinocchio joint of each backdrive body (for external forces).
        self.body_joint = []
        for b in range(rb.num_bodies):
            if b == 0:
                self.body_joint.append(pm.getJointId("root_joint") if floating_base else 0)
            else:
                self.body_joint.append(pm.getJointId(rb.body_joint_names[b]))

    def q(self, q: torch.Tensor) -> np.ndarray:
        q = q.detach().numpy()
        out = np.zeros(self.model.nq)
        if self.robot.floating_base:
            out[:3] = q[:3]
            out[3:7] = q[[4, 5, 6, 3]]  # wxyz -> Pinocchio's xyzw
        for i, iq, nq in self.qjoint:
            if nq == 1:
                out[iq] = q[i]
            else:  # continuous joint: (cos, sin)
                out[iq], out[iq + 1] = math.cos(q[i]), math.sin(q[i])
        return out

    def q_from_pin(self, qp: np.ndarray) -> np.ndarray:
        out = np.zeros(self.robot.nq)
        if self.robot.floating_base:
            out[:3] = qp[:3]
            out[3:7] = qp[[6, 3, 4, 5]]
        for i, iq, nq in self.qjoint:
            out[i] = qp[iq] if nq == 1 else math.atan2(qp[iq + 1], qp[iq])
        return out

    def v(self, v: torch.Tensor) -> np.ndarray:
        out = np.zeros(self.model.nv)
        out[self.vidx] = v.detach().numpy()
        return out

    def v_from_pin(self, vp: np.ndarray) -> np.ndarray:
        return vp[self.vidx]

    def M_from_pin(self, Mp: np.ndarray) -> np.ndarray:
        Mp = np.triu(Mp) + np.triu(Mp, 1).T
        return Mp[np.ix_(self.vidx, self.vidx)]

    def fext(self, f: torch.Tensor) -> list:
        out = [pin.Force.Zero() for _ in range(self.model.njoints)]
        for b, jid in enumerate(self.body_joint):
            if jid > 0:
                out[jid] = pin.Force(f[b].detach().numpy().copy())
        return out


@pytest.fixture(scope="module", params=list(ROBOTS))
def ref(request, tmp_path_factory) -> PinRef:
    factory, fb = ROBOTS[request.param]
    return PinRef(factory(tmp_path_factory), fb)


def _state(robot: RobotModel, n: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    q = robot.random_q(n, generator=g)
    v = torch.randn(n, robot.nv, generator=g, dtype=torch.float64)
    a = torch.randn(n, robot.nv, generator=g, dtype=torch.float64)
    return q, v, a, g


def assert_rel(x, ref, rtol, what=""):
    x = x.detach().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)
    ref = np.asarray(ref)
    scale = max(1.0, float(np.abs(ref).max()))
    err = float(np.abs(x - ref).max())
    assert err <= rtol * scale, f"{what}: max error {err:.3e} above {rtol:.0e} x {scale:.3e}"


N = 4  # random states per robot


def test_inverse_dynamics_matches_pinocchio(ref):
    rb, pm, pd = ref.robot, ref.model, ref.data
    q, v, a, g = _state(rb, N, 0)
    f_ext = torch.randn(N, rb.num_bodies, 6, generator=g, dtype=torch.float64)
    tau = D.inverse_dynamics(rb, q, v, a)
    tau_f = D.inverse_dynamics(rb, q, v, a, f_ext=f_ext)
    for i in range(N):
        qp, vp, ap = ref.q(q[i]), ref.v(v[i]), ref.v(a[i])
        assert_rel(tau[i], ref.v_from_pin(pin.rnea(pm, pd, qp, vp, ap)), RTOL64, "rnea")
        want = pin.rnea(pm, pd, qp, vp, ap, ref.fext(f_ext[i]))
        assert_rel(tau_f[i], ref.v_from_pin(want), RTOL64, "rnea with f_ext")


def test_mass_matrix_bias_gravity_match_pinocchio(ref):
    rb, pm, pd = ref.robot, ref.model, ref.data
    q, v, _, _ = _state(rb, N, 1)
    M = D.mass_matrix(rb, q)
    b = D.bias_forces(rb, q, v)
    grav = D.gravity_forces(rb, q)
    assert torch.equal(M, M.transpose(-1, -2))
    for i in range(N):
        qp, vp = ref.q(q[i]), ref.v(v[i])
        assert_rel(M[i], ref.M_from_pin(pin.crba(pm, pd, qp)), RTOL64, "crba")
        assert_rel(b[i], ref.v_from_pin(pin.nonLinearEffects(pm, pd, qp, vp)), RTOL64, "nle")
        assert_rel(grav[i], ref.v_from_pin(pin.computeGeneralizedGravity(pm, pd, qp)), RTOL64, "gravity")


def test_forward_dynamics_matches_pinocchio(ref):
    rb, pm, pd = ref.robot, ref.model, ref.data
    # Pinocchio's aba and crba carry no damping or friction: compare without.
    rb = rb.replace(damping=torch.zeros_like(rb.damping), friction=torch.zeros_like(rb.friction))
    q, v, tau, g = _state(rb, N, 2)
    f_ext = torch.randn(N, rb.num_bodies, 6, generator=g, dtype=torch.float64)
    methods = ["auto", "crba"] if ref.mimic else ["auto", "crba", "aba"]
    for method in methods:
        acc = D.forward_dynamics(rb, q, v, tau, method=method)
        acc_f = D.forward_dynamics(rb, q, v, tau, f_ext=f_ext, method=method)
        for i in range(N):
            qp, vp, tp = ref.q(q[i]), ref.v(v[i]), ref.v(tau[i])
            if ref.mimic:  # Pinocchio's aba rejects mimic joints; solve its CRBA system
                Mp = np.triu(pin.crba(pm, pd, qp))
                Mp = Mp + np.triu(Mp, 1).T
                want = np.linalg.solve(Mp, tp - pin.nonLinearEffects(pm, pd, qp, vp))
                want_f = np.linalg.solve(Mp, tp - pin.rnea(pm, pd, qp, vp, 0 * vp, ref.fext(f_ext[i])))
            else:
                want = pin.aba(pm, pd, qp, vp, tp)
                want_f = pin.aba(pm, pd, qp, vp, tp, ref.fext(f_ext[i]))
            assert_rel(acc[i], ref.v_from_pin(want), RTOL64, f"forward dynamics ({method})")
            assert_rel(acc_f[i], ref.v_from_pin(want_f), RTOL64, f"forward dynamics with f_ext ({method})")


def test_large_batch_path_matches_pinocchio(ref, monkeypatch):
    """The batch-last path (RNEA, sparse CRBA with the LTDL factorisation,
    bias and gravity forces) against Pinocchio, forced at a small batch."""
    rb, pm, pd = ref.robot, ref.model, ref.data
    rb = rb.replace(damping=torch.zeros_like(rb.damping), friction=torch.zeros_like(rb.friction))
    q, v, tau, g = _state(rb, N, 7)
    f_ext = torch.randn(N, rb.num_bodies, 6, generator=g, dtype=torch.float64)
    with D.use_path("fast"):
        acc = D.forward_dynamics(rb, q, v, tau)
        acc_f = D.forward_dynamics(rb, q, v, tau, f_ext=f_ext)
        tau_id = D.inverse_dynamics(rb, q, v, tau, f_ext=f_ext)
        b = D.bias_forces(rb, q, v)
        grav = D.gravity_forces(rb, q)
    for i in range(N):
        qp, vp, tp = ref.q(q[i]), ref.v(v[i]), ref.v(tau[i])
        Mp = np.triu(pin.crba(pm, pd, qp))
        Mp = Mp + np.triu(Mp, 1).T
        want = np.linalg.solve(Mp, tp - pin.nonLinearEffects(pm, pd, qp, vp))
        want_f = np.linalg.solve(Mp, tp - pin.rnea(pm, pd, qp, vp, 0 * vp, ref.fext(f_ext[i])))
        assert_rel(acc[i], ref.v_from_pin(want), RTOL64, "forward dynamics (large-batch path)")
        assert_rel(acc_f[i], ref.v_from_pin(want_f), RTOL64, "forward dynamics with f_ext (large-batch path)")
        want_id = pin.rnea(pm, pd, qp, vp, tp, ref.fext(f_ext[i]))
        assert_rel(tau_id[i], ref.v_from_pin(want_id), RTOL64, "rnea (large-batch path)")
        assert_rel(b[i], ref.v_from_pin(pin.nonLinearEffects(pm, pd, qp, vp)), RTOL64, "nle (large-batch path)")
        want_g = pin.computeGeneralizedGravity(pm, pd, qp)
        assert_rel(grav[i], ref.v_from_pin(want_g), RTOL64, "gravity (large-batch path)")


def test_energies_and_center_of_mass_match_pinocchio(ref):
    rb, pm, pd = ref.robot, ref.model, ref.data
    q, v, _, _ = _state(rb, N, 3)
    ke = D.kinetic_energy(rb, q, v)
    pe = D.potential_energy(rb, q)
    com = D.center_of_mass(rb, q)
    for i in range(N):
        qp, vp = ref.q(q[i]), ref.v(v[i])
        c = pin.centerOfMass(pm, pd, qp)
        assert_rel(com[i], c, RTOL64, "centre of mass")
        if ref.mimic:  # Pinocchio's energy functions reject mimic joints
            vi = v[i].numpy()
            want_ke = 0.5 * vi @ ref.M_from_pin(pin.crba(pm, pd, qp)) @ vi
            want_pe = -pd.mass[0] * pm.gravity.linear @ c
        else:
            want_ke = pin.computeKineticEnergy(pm, pd, qp, vp)
            want_pe = pin.computePotentialEnergy(pm, pd, qp)
        assert_rel(ke[i], want_ke, RTOL64, "kinetic energy")
        assert_rel(pe[i], want_pe, RTOL64, "potential energy")


def test_integrate_and_difference_match_pinocchio(ref):
    rb, pm = ref.robot, ref.model
    q0, v, _, g = _state(rb, N, 4)
    q1 = rb.random_q(N, generator=g)
    dt = 0.37
    qi = D.integrate(rb, q0, v, dt)
    dq = D.difference(rb, q0, q1)
    for i in range(N):
        want = ref.q_from_pin(pin.integrate(pm, ref.q(q0[i]), ref.v(v[i]) * dt))
        got = qi[i].numpy().copy()
        if rb.floating_base and got[3:7] @ want[3:7] < 0:  # q and -q are one rotation
            got[3:7] *= -1
        # Pinocchio wraps continuous joints to (-pi, pi]; backdrive keeps the angle.
        got[ref.cont_q] = np.arctan2(np.sin(got[ref.cont_q]), np.cos(got[ref.cont_q]))
        assert_rel(got, want, RTOL64, "integrate")
        want_d = ref.v_from_pin(pin.difference(pm, ref.q(q0[i]), ref.q(q1[i])))
        got_d = dq[i].numpy().copy()
        got_d[ref.cont_v] = np.arctan2(np.sin(got_d[ref.cont_v]), np.cos(got_d[ref.cont_v]))
        assert_rel(got_d, want_d, RTOL64, "difference")
    # integrate and difference are inverse to each other.
    assert_rel(D.difference(rb, q0, D.integrate(rb, q0, dq)), dq.numpy(), RTOL64, "difference(integrate)")


def test_float32_agrees_with_float64(ref):
    rb = ref.robot
    rb32 = rb.float()
    q, v, a, g = _state(rb, N, 5)
    f_ext = torch.randn(N, rb.num_bodies, 6, generator=g, dtype=torch.float64)
    args64 = (q, v, a)
    args32 = tuple(x.float() for x in args64)

    def close(x32, x64, rtol, what):
        assert x32.dtype == torch.float32
        assert_rel(x32.double(), x64.numpy(), rtol, what)

    close(D.inverse_dynamics(rb32, *args32, f_ext=f_ext.float()), D.inverse_dynamics(rb, *args64, f_ext=f_ext), RTOL32, "rnea")
    close(D.mass_matrix(rb32, args32[0]), D.mass_matrix(rb, q), RTOL32, "crba")
    close(D.center_of_mass(rb32, args32[0]), D.center_of_mass(rb, q), RTOL32, "com")
    close(D.kinetic_energy(rb32, *args32[:2]), D.kinetic_energy(rb, q, v), RTOL32, "ke")
    close(D.integrate(rb32, *args32[:2], 0.1), D.integrate(rb, q, v, 0.1), RTOL32, "integrate")
    methods = ["crba"] if ref.mimic else ["crba", "aba"]
    for m in methods:
        close(D.forward_dynamics(rb32, *args32, method=m), D.forward_dynamics(rb, *args64, method=m), RTOL32_FD, m)


# --------------------------------------------------------------------------- physics, no reference


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> RobotModel:
    return RobotModel.from_urdf(_small_path(tmp_path_factory))


@pytest.fixture(scope="module")
def small_fb(tmp_path_factory) -> RobotModel:
    return RobotModel.from_urdf(_small_path(tmp_path_factory), floating_base=True)


@pytest.mark.parametrize("fb", [False, True])
def test_equations_of_motion_are_consistent(small, small_fb, fb):
    rb = small_fb if fb else small
    rb = rb.replace(armature=torch.tensor([0.1, 0.2, 0.05, 0.3], dtype=torch.float64))
    q, v, a, _ = _state(rb, 6, 6)
    M = D.mass_matrix(rb, q)
    tau = D.inverse_dynamics(rb, q, v, a)
    b = D.bias_forces(rb, q, v)
    assert_rel(tau, ((M @ a[..., None])[..., 0] + b).numpy(), RTOL64, "M a + b")
    assert_rel(D.kinetic_energy(rb, q, v), (0.5 * (v[..., None, :] @ M @ v[..., :, None])[..., 0, 0]).numpy(), RTOL64, "KE")
    # forward dynamics inverts inverse dynamics, joint forces included.
    tj = D.joint_forces(rb, v)
    assert_rel(D.forward_dynamics(rb, q, v, tau - tj), a.numpy(), 1e-9, "forward(inverse)")
    # the generalised gravity is minus the gradient of the potential energy (fixed base)
    if not fb:
        qg = q.clone().requires_grad_(True)
        (grad,) = torch.autograd.grad(D.potential_energy(rb, qg).sum(), qg)
        assert_rel(D.gravity_forces(rb, q), grad.numpy(), RTOL64, "dV/dq")


def test_energy_balance(small):
    # d/dt (T + V) = v . (tau + tau_joint): the power of the applied and joint forces.
    rb = small.replace(armature=torch.tensor([0.1, 0.2, 0.05, 0.3], dtype=torch.float64))
    q, v, tau, _ = _state(rb, 3, 7)
    q.requires_grad_(True)
    v.requires_grad_(True)
    energy = D.kinetic_energy(rb, q, v) + D.potential_energy(rb, q)
    dq, dv = torch.autograd.grad(energy.sum(), (q, v))
    with torch.no_grad():
        a = D.forward_dynamics(rb, q, v, tau)
        de = (dq * v).sum(-1) + (dv * a).sum(-1)
        power = (v * (tau + D.joint_forces(rb, v))).sum(-1)
    assert_rel(de, power.numpy(), RTOL64, "energy balance")


def test_damping_friction_armature_in_forward_dynamics(small):
    rb = small.replace(
        damping=torch.tensor([0.3, 1.5, 0.2, 0.4], dtype=torch.float64),
        friction=torch.tensor([0.2, 0.5, 0.1, 0.3], dtype=torch.float64),
        armature=torch.tensor([0.1, 0.2, 0.05, 0.3], dtype=torch.float64),
    )
    q, v, tau, _ = _state(rb, 5, 8)
    width = 0.05
    tj = D.joint_forces(rb, v, friction_width=width)
    expected_tj = -rb.damping * v - rb.friction * torch.tanh(v / width)
    assert torch.equal(tj, expected_tj)
    acc = D.forward_dynamics(rb, q, v, tau, friction_width=width)
    M = D.mass_matrix(rb, q)
    assert torch.allclose(M.diagonal(dim1=-2, dim2=-1) - D.mass_matrix(small, q).diagonal(dim1=-2, dim2=-1), rb.armature.expand(5, 4))
    want = torch.linalg.solve(M, tau + expected_tj - D.bias_forces(rb, q, v))
    assert_rel(acc, want.numpy(), RTOL64, "with joint forces")
    # armature enters inverse dynamics as armature * a, as in Pinocchio 3+.
    a = torch.randn(5, 4, dtype=torch.float64)
    assert_rel(D.inverse_dynamics(rb, q, v, a) - D.inverse_dynamics(small, q, v, a), (rb.armature * a).numpy(), RTOL64, "armature")


def test_joint_forces_floating_base_and_bad_width(small_fb):
    v = torch.randn(3, small_fb.nv, dtype=torch.float64)
    tj = D.joint_forces(small_fb, v)
    assert tj.shape == (3, small_fb.nv)
    assert torch.equal(tj[:, :6], torch.zeros(3, 6, dtype=torch.float64))
    with pytest.raises(InputError, match="friction_width"):
        D.joint_forces(small_fb, v, friction_width=0.0)


def test_gravity_argument_overrides_model(small):
    q, _, _, _ = _state(small, 2, 9)
    g = torch.tensor([1.0, -2.0, -3.0], dtype=torch.float64)
    got = D.gravity_forces(small, q, gravity=g)
    want = D.gravity_forces(small.replace(gravity=g), q)
    assert torch.equal(got, want)
    assert torch.allclose(D.gravity_forces(small, q, gravity=torch.zeros(3, dtype=torch.float64)), torch.zeros(2, 4, dtype=torch.float64))
    # batched gravity broadcasts with q
    gb = torch.stack([g, 2 * g, 3 * g])[:, None, :]  # (3, 1, 3)
    out = D.gravity_forces(small, q, gravity=gb)
    assert out.shape == (3, 2, 4)
    assert torch.allclose(out[2], 3 * want)


# --------------------------------------------------------------------------- shapes and errors


FUNCS = {
    "inverse_dynamics": lambda r, q, v, a: D.inverse_dynamics(r, q, v, a),
    "mass_matrix": lambda r, q, v, a: D.mass_matrix(r, q),
    "bias_forces": lambda r, q, v, a: D.bias_forces(r, q, v),
    "gravity_forces": lambda r, q, v, a: D.gravity_forces(r, q),
    "forward_crba": lambda r, q, v, a: D.forward_dynamics(r, q, v, a, method="crba"),
    "forward_aba": lambda r, q, v, a: D.forward_dynamics(r.replace(), q, v, a, method="aba"),
    "kinetic_energy": lambda r, q, v, a: D.kinetic_energy(r, q, v),
    "potential_energy": lambda r, q, v, a: D.potential_energy(r, q),
    "center_of_mass": lambda r, q, v, a: D.center_of_mass(r, q),
    "integrate": lambda r, q, v, a: D.integrate(r, q, v, 0.1),
    "joint_forces": lambda r, q, v, a: D.joint_forces(r, v),
}
OUT_SHAPE = {
    "mass_matrix": lambda r: (r.nv, r.nv),
    "kinetic_energy": lambda r: (),
    "potential_energy": lambda r: (),
    "center_of_mass": lambda r: (3,),
    "integrate": lambda r: (r.nq,),
}


@pytest.fixture(scope="module")
def quad() -> RobotModel:
    return RobotModel.from_urdf(get_data_path("quadruped"), floating_base=True)


@pytest.mark.parametrize("name", list(FUNCS))
def test_batch_shapes_broadcast(name, quad):
    rb = quad
    f = FUNCS[name]
    g = torch.Generator().manual_seed(10)
    q = rb.random_q(2, 1, generator=g)
    v = torch.randn(3, rb.nv, generator=g, dtype=torch.float64)
    a = torch.randn(1, 3, rb.nv, generator=g, dtype=torch.float64)
    out_shape = OUT_SHAPE.get(name, lambda r: (r.nv,))(rb)
    uses_v = name not in ("mass_matrix", "gravity_forces", "potential_energy", "center_of_mass")
    out = f(rb, q, v, a)
    batch = (2, 3) if uses_v else (2, 1)
    if name == "joint_forces":
        batch = (3,)
    assert out.shape == batch + out_shape
    # each batch entry equals the unbatched call
    single = f(rb, q[1, 0], v[2], a[0, 2])
    idx = (1, 2) if uses_v else (1, 0)
    if name == "joint_forces":
        idx = (2,)
    assert torch.allclose(out[idx], single, rtol=1e-12, atol=1e-12)
    # and an unbatched call gives an unbatched result
    assert single.shape == out_shape


def test_dtype_device_and_shape_errors(small):
    q = small.neutral()
    v = torch.zeros(small.nv, dtype=torch.float64)
    with pytest.raises(InputError, match="dtype"):
        D.inverse_dynamics(small, q, v.float(), v)
    with pytest.raises(InputError, match="dtype"):
        D.mass_matrix(small, q.float())
    with pytest.raises(InputError, match=r"\(\.\.\., 4\)"):
        D.forward_dynamics(small, q, v[:3], v)
    with pytest.raises(InputError, match="f_ext"):
        D.inverse_dynamics(small, q, v, v, f_ext=torch.zeros(3, 6, dtype=torch.float64))
    with pytest.raises(InputError, match="f_ext"):
        D.inverse_dynamics(small, q, v, v, f_ext=torch.zeros(small.num_bodies, 6))
    with pytest.raises(InputError, match="broadcast"):
        D.inverse_dynamics(small, q.expand(2, 4), v.expand(3, 4), v)
    with pytest.raises(InputError, match="method"):
        D.forward_dynamics(small, q, v, v, method="lu")
    with pytest.raises(InputError, match="mimic"):
        D.forward_dynamics(small, q, v, v, method="aba")
    with pytest.raises(InputError, match="gravity"):
        D.gravity_forces(small, q, gravity=torch.zeros(2, dtype=torch.float64))
    with pytest.raises(InputError, match="dt"):
        D.integrate(small, q, v, torch.tensor(0.1, dtype=torch.float32))
    with pytest.raises(InputError, match="device"):
        D.inverse_dynamics(small, q, v.to("meta"), v)


def test_public_surface():
    for name in D.__all__:
        assert getattr(D, name) is not None
    assert set(D.__all__) >= {
        "inverse_dynamics", "mass_matrix", "bias_forces", "gravity_forces", "forward_dynamics",
        "kinetic_energy", "potential_energy", "center_of_mass", "integrate", "difference", "joint_forces",
    }


def test_no_joint_robot_and_float_base_only(tmp_path):
    urdf = """<robot name="brick"><link name="b"><inertial><mass value="2"/>
      <inertia ixx="0.1" ixy="0" ixz="0" iyy="0.2" iyz="0" izz="0.3"/></inertial></link></robot>"""
    rb = RobotModel.from_urdf(urdf, floating_base=True)
    q = rb.neutral()
    v = torch.tensor([0.0, 0.0, 0.0, 0.0, 0.0, 1.0], dtype=torch.float64)
    M = D.mass_matrix(rb, q)
    assert torch.allclose(M, torch.diag(torch.tensor([2.0, 2.0, 2.0, 0.1, 0.2, 0.3], dtype=torch.float64)))
    # free fall, torque-free spin about a principal axis
    for method in ("crba", "aba"):
        acc = D.forward_dynamics(rb, q, v, torch.zeros(6, dtype=torch.float64), method=method)
        assert torch.allclose(acc, torch.tensor([0, 0, -9.81, 0, 0, 0], dtype=torch.float64), atol=1e-12)
    fixed = RobotModel.from_urdf(urdf)
    assert D.mass_matrix(fixed, fixed.neutral()).shape == (0, 0)
    assert D.inverse_dynamics(fixed, fixed.neutral(), fixed.neutral(), fixed.neutral()).shape == (0,)


@pytest.mark.parametrize("name", ["panda_mimic", "shipped_quadruped", "small_tree_floating"])
def test_fast_path_equals_reference_path(name, tmp_path_factory, monkeypatch):
    # The batch-last fast path (with its tree sums as one product with the
    # ancestor matrix, and as one add per depth level) against the reference
    # path: same numbers, mimic joints included.
    from backdrive.kinematics import _paths

    factory, fb = ROBOTS[name]
    rb = RobotModel.from_urdf(factory(tmp_path_factory), floating_base=fb)
    n = 5
    q, v, a, g = _state(rb, n, 11)
    f_ext = torch.randn(n, rb.num_bodies, 6, generator=g, dtype=torch.float64)
    fns = {
        "rnea": lambda: D.inverse_dynamics(rb, q, v, a, f_ext=f_ext),
        "crba": lambda: D.mass_matrix(rb, q),
        "fd": lambda: D.forward_dynamics(rb, q, v, a, f_ext=f_ext),
        "bias": lambda: D.bias_forces(rb, q, v),
        "gravity": lambda: D.gravity_forces(rb, q),
    }
    with D.use_path("reference"):
        ref = {k: f() for k, f in fns.items()}
    for level_sums in (10**9, 0):
        monkeypatch.setattr(_paths, "LEVEL_SUM_MIN_BATCH", level_sums)
        with D.use_path("fast"), torch.no_grad():
            for k, f in fns.items():
                assert_rel(f(), ref[k].numpy(), RTOL64, k)
