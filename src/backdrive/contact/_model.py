"""Detection, forces and contact dynamics for one robot on a terrain."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch

from .._errors import InputError
from .._shapes import broadcast_shapes
from ..dynamics import bias_forces, forward_dynamics, joint_forces, mass_matrix
from ..dynamics._crba import crba_core
from ..dynamics._forward import _has_joint_forces
from ..dynamics._rnea import rnea_core
from ..dynamics._tree import broadcast_batch, gravity_vector, kinematics, topology
from ..kinematics import body_transforms
from ..kinematics._fk import point_jacobians, point_support
from ..kinematics._paths import choose, transforms_active
from ..model import RobotModel
from ._geometry import ContactGeometry
from ._law import ContactParameters, contact_law, per_point, resolve_parameters
from ._pairs import SelfCollision
from ._soft import SoftContactParameters, invweight, resolve_soft, soft_acceleration
from ._terrain import GroundPlane, Terrain

__all__ = ["ContactModel", "ContactResult", "ImplicitContact", "CONTACT_SCHEMES", "stack_results"]

#: ``ContactModel.acceleration(..., scheme=)`` values.
CONTACT_SCHEMES = ("explicit", "implicit")


class _Deferred:
    """A field whose value may be given as a function of no arguments: it is
    called on the first read, and its tensor kept (the fast step's dense
    Jacobian and body wrenches, which a rollout without gradient rarely
    reads). Pickling and :func:`dataclasses.replace` read it, so they see
    the tensor."""

    def __set_name__(self, owner, name):
        self.key = "_deferred_" + name

    def __get__(self, obj, owner=None):
        if obj is None:  # no class-level default (dataclasses asks)
            raise AttributeError(self.key)
        value = obj.__dict__[self.key]
        if callable(value) and not isinstance(value, torch.Tensor):
            value = obj.__dict__[self.key] = value()
        return value

    def __set__(self, obj, value):
        obj.__dict__[self.key] = value


@dataclass(frozen=True, eq=False)
class ContactResult:
    """Every contact point's state and force (``np`` points, world frame).

    Attributes:
        point: ``(..., np, 3)`` where the force acts: the deepest point of
            the shape, ``centre - radius * normal``, m.
        normal: ``(..., np, 3)`` terrain's outward unit normal.
        penetration: ``(..., np)`` m, positive inside the terrain (points far
            from the ground have large negative values and zero force).
        normal_velocity: ``(..., np)`` m/s, positive separating.
        slip_velocity: ``(..., np, 3)`` tangential velocity of the point, m/s.
        normal_force: ``(..., np)`` N, magnitude along ``normal``.
        friction_force: ``(..., np, 3)`` N, tangential.
        force: ``(..., np, 3)`` N, total force on the robot at ``point``.
        f_ext: ``(..., nb, 6)`` the same forces as body wrenches, body frame at
            the body origin, ``[force; torque]`` (the ``f_ext`` of
            :func:`backdrive.dynamics.forward_dynamics`). The fast step
            without gradient builds it on its first read, as ``jacobian``.
        jacobian: ``(..., np, 3, nv)`` linear velocity Jacobian of each point
            (``v_point = J v``, world frame; floating base: base twist in the
            base frame). The fast step without gradient builds this dense
            array on its first read (most rollouts never read it).
    """

    point: torch.Tensor
    normal: torch.Tensor
    penetration: torch.Tensor
    normal_velocity: torch.Tensor
    slip_velocity: torch.Tensor
    normal_force: torch.Tensor
    friction_force: torch.Tensor
    force: torch.Tensor
    f_ext: torch.Tensor = _Deferred()
    jacobian: torch.Tensor = _Deferred()
    _c_n: torch.Tensor
    _k_n: torch.Tensor
    _mu_fn_over_s: torch.Tensor
    _s: torch.Tensor
    _mu: torch.Tensor
    _bodies: tuple = ()

    def __getstate__(self):
        self.f_ext, self.jacobian  # deferred fields are built: the state holds tensors only
        return self.__dict__

    @property
    def total_force(self) -> torch.Tensor:
        """``(..., 3)`` sum of all contact forces on the robot, N (the ground reaction)."""
        return self.force.sum(-2)

    def generalized_force(self) -> torch.Tensor:
        """``(..., nv)`` the contact forces as generalised forces ``sum_c J_c^T f_c``."""
        return torch.einsum("...pin,...pi->...n", self.jacobian, self.force)


@dataclass(frozen=True, eq=False)
class ImplicitContact:
    """The contact terms of one implicit step (:meth:`ContactModel.implicit_terms`).

    Attributes:
        result: :class:`ContactResult` at the start of the step.
        force: ``(..., nv)`` generalised force to add to the right-hand side.
        matrix: ``(..., nv, nv)`` symmetric positive semi-definite
            ``J^T (C + dt K) J``; the step's matrix is ``M + dt matrix``.
    """

    result: ContactResult
    force: torch.Tensor
    matrix: torch.Tensor
    _CK: torch.Tensor
    _pred: torch.Tensor
    _M: torch.Tensor


class ContactModel:
    """Contact between a robot's geometry and a terrain under one force law.

    Args:
        robot: the robot the geometry was built for.
        geometry: :class:`ContactGeometry`; by default the URDF's collision
            shapes (:meth:`ContactGeometry.from_model`).
        terrain: :class:`GroundPlane` (default: ``z = 0``) or :class:`Heightfield`.
        params: :class:`ContactParameters` (the penalty law, checked here,
            once) or :class:`SoftContactParameters` (MuJoCo's soft-constraint
            contact, solved per step: :meth:`acceleration` only, no
            self-collision pairs).
        self_collision: optional :class:`SelfCollision` pairs; their contacts
            follow the ground contacts in every result (``geometry.num_points``
            ground rows, then one row per pair; a pair row's normal points
            from its second shape to its first, its force acts on the first
            body and the opposite force on the second).
        unilateral: ``True`` (default): the implicit step never pulls a
            point onto the terrain. Where the step's linearised normal force
            comes out negative (a loaded foot lifting off, its damping
            extrapolated past zero), the point is taken out of the step and
            the step solved again (:meth:`acceleration`). ``False``: the
            linearised force is applied as solved, negative or not (the step
            before the 13th session, for comparison and for old results).

    Raises:
        InvalidValueError: a NaN, infinite or negative parameter (naming it
            and the shape's link).
        InputError: a geometry of another robot, wrong shapes or dtypes.
    """

    def __init__(
        self,
        robot: RobotModel,
        geometry: ContactGeometry | None = None,
        terrain: Terrain | None = None,
        params: ContactParameters | None = None,
        self_collision: SelfCollision | None = None,
        *,
        unilateral: bool = True,
    ):
        if not isinstance(robot, RobotModel):
            raise InputError(f"robot must be a RobotModel, got {type(robot).__name__}")
        geometry = ContactGeometry.from_model(robot) if geometry is None else geometry
        if not isinstance(geometry, ContactGeometry):
            raise InputError(f"geometry must be a ContactGeometry, got {type(geometry).__name__}")
        geometry.check_robot(robot)
        if geometry.point_local.dtype != robot.dtype or geometry.point_local.device != robot.device:
            geometry = geometry.to(device=robot.device, dtype=robot.dtype)
        terrain = GroundPlane() if terrain is None else terrain
        if not isinstance(terrain, Terrain):
            raise InputError(f"terrain must be a GroundPlane or Heightfield, got {type(terrain).__name__}")
        params = ContactParameters() if params is None else params
        if not isinstance(unilateral, bool):
            raise InputError(f"unilateral must be True or False, got {unilateral!r}")
        self.unilateral = unilateral
        self.geometry = geometry
        self.terrain = terrain
        self.params = params
        self._soft = None
        if isinstance(params, SoftContactParameters):
            if self_collision is not None:
                raise InputError("SoftContactParameters cover ground contact only; self-collision pairs need "
                                 "the penalty law (ContactParameters)")
            self._soft = resolve_soft(params, geometry.shape_links, robot.dtype, robot.device)
            self._p = {"friction": self._soft["friction"]}
        else:
            self._p = resolve_parameters(params, geometry.shape_links, robot.dtype, robot.device)
        if terrain.friction is not None:
            mu = terrain.friction
            if isinstance(mu, torch.Tensor):
                if mu.dtype != robot.dtype or mu.device != robot.device or mu.ndim > 0 and mu.shape[-1] != 1:
                    raise InputError(
                        f"terrain friction must be a {robot.dtype} tensor on {robot.device} of shape () or (..., 1), "
                        f"got {mu.dtype} on {mu.device} with shape {tuple(mu.shape)}"
                    )
            else:
                mu = torch.as_tensor(float(mu), dtype=robot.dtype, device=robot.device)
            self._p["friction"] = mu
        self._fingerprint = robot.fingerprint
        self._dtype, self._device = robot.dtype, robot.device
        self._support = point_support(robot, geometry.point_body)
        if self._soft is not None:
            # MuJoCo's constant inverse inertia of each point's link, from this robot.
            self._invweight0 = invweight(robot, geometry) if geometry.num_points else robot.body_mass.new_zeros(0)
        if self_collision is not None:
            if not isinstance(self_collision, SelfCollision):
                raise InputError(f"self_collision must be a SelfCollision, got {type(self_collision).__name__}")
            if self_collision.fingerprint != robot.fingerprint:
                raise InputError(f"self_collision was built for robot {self_collision.robot_name!r}, not {robot.name!r}")
            self._pair_p = self_collision.resolved(robot)
            self._support_a = point_support(robot, self_collision.body_a)
            self._support_b = point_support(robot, self_collision.body_b)
        self.self_collision = self_collision


    #: The default of :attr:`unilateral` for a model pickled before the switch existed.
    unilateral = True
    #: The penalty law, for a model pickled before the soft contact existed.
    _soft = None

    def replace(
        self, *, geometry=None, terrain=None, params=None, unilateral: bool | None = None, robot: RobotModel
    ) -> ContactModel:
        """A model with some parts changed (``robot`` is needed to check them).

        The self-collision pairs and :attr:`unilateral` are kept unless given.
        """
        return ContactModel(
            robot,
            self.geometry if geometry is None else geometry,
            self.terrain if terrain is None else terrain,
            self.params if params is None else params,
            self.self_collision,
            unilateral=self.unilateral if unilateral is None else unilateral,
        )

    @property
    def num_points(self) -> int:
        return self.geometry.num_points

    @property
    def num_rows(self) -> int:
        """Rows of every result: the ground contact points, then the self-collision pairs."""
        sc = self.self_collision
        return self.geometry.num_points + (sc.num_pairs if sc is not None else 0)

    def row_label(self, row: int) -> str:
        """What a result row is, e.g. ``"FL_foot (sphere) on the ground"`` or ``"FL_calf/FR_calf (self-collision)"``."""
        npg = self.geometry.num_points
        if 0 <= row < npg:
            shape = self.geometry.shapes[int(self.geometry.point_shape[row])]
            return f"{shape.link} ({shape.kind}) on the ground"
        sc = self.self_collision
        if sc is not None and 0 <= row - npg < sc.num_pairs:
            a, b = sc.pairs[row - npg]
            return f"{a}/{b} (self-collision)"
        raise InputError(f"contact row {row} out of range: this model has {self.num_rows} rows")

    def describe_largest(self, res: ContactResult) -> str:
        """A sentence naming the contact with the largest (or a non-finite) force in ``res``.

        Looks at every batch sample; one host synchronisation. For error
        messages (the simulator's divergence report).
        """
        mag = res.force.detach().norm(dim=-1).reshape(-1, res.force.shape[-2])  # (N, rows)
        if mag.numel() == 0:
            return ""
        bad = ~torch.isfinite(mag)
        if bool(bad.any()):
            sample, row = (int(i) for i in torch.nonzero(bad)[0])
            return f"The contact force at {self.row_label(row)} (row {row}, sample {sample}) is not finite."
        flat = int(mag.argmax())
        sample, row = divmod(flat, mag.shape[-1])
        pen = float(res.penetration.detach().reshape(-1, mag.shape[-1])[sample, row])
        return (
            f"The largest contact force, {float(mag[sample, row]):.4g} N, acts at {self.row_label(row)} "
            f"(row {row}, sample {sample}, penetration {pen * 1e3:.3g} mm)."
        )

    @property
    def soft(self) -> bool:
        """Whether the contact is MuJoCo's soft constraint (:class:`SoftContactParameters`)."""
        return self._soft is not None

    def _not_soft(self, what: str) -> None:
        if self._soft is not None:
            raise InputError(
                f"ContactModel.{what} evaluates the penalty law; this model's contact is MuJoCo's soft constraint "
                "(SoftContactParameters), whose forces come from the step's solve: use acceleration(..., dt=...) "
                "or a Simulator")

    def _check(self, robot: RobotModel) -> None:
        if robot.fingerprint != self._fingerprint or robot.dtype != self._dtype or robot.device != self._device:
            raise InputError(
                f"this ContactModel was built for robot {self.geometry.robot_name!r} in {self._dtype} on "
                f"{self._device}; got {robot.name!r} in {robot.dtype} on {robot.device}"
            )

    # ------------------------------------------------------------ forces

    def forces(
        self, robot: RobotModel, q: torch.Tensor, v: torch.Tensor, *, _dt: float | None = None, _kin=None
    ) -> ContactResult:
        """Detect contacts at ``(q, v)`` and evaluate the force law.

        Args:
            robot: the model (physical parameters may be replaced).
            q: ``(..., nq)``. v: ``(..., nv)``.

        Returns:
            :class:`ContactResult` with batch shape ``broadcast(q, v)``.
        """
        self._check(robot)
        self._not_soft("forces")
        robot.check_q(q)
        robot.check_vector(v, robot.nv, "v")
        g = self.geometry
        Rb, pb = body_transforms(robot, q) if _kin is None else (_kin.R, _kin.p)
        centre = self._centres(Rb, pb)
        dist, n = self.terrain.query(centre)
        radius = g.point_radius
        phi = radius - dist
        point = centre - radius[:, None] * n
        J = point_jacobians(robot, Rb, pb, point, self._support)
        p, ps = self._p, g.point_shape
        law = {k: per_point(p[k], ps) for k in ("stiffness", "damping", "friction", "normal_width", "stiction_width")}
        sc = self.self_collision
        if sc is not None and sc.num_pairs:
            pp, n_, phi_ = sc.detect(Rb, pb)
            J_ = point_jacobians(robot, Rb, pb, pp, self._support_a) - point_jacobians(robot, Rb, pb, pp, self._support_b)
            batch = broadcast_shapes(point.shape[:-2], pp.shape[:-2])
            point = torch.cat([point.expand(*batch, *point.shape[-2:]), pp.expand(*batch, *pp.shape[-2:])], -2)
            n = torch.cat([n.expand(*batch, *n.shape[-2:]), n_.expand(*batch, *n_.shape[-2:])], -2)
            phi = torch.cat([phi.expand(*batch, phi.shape[-1]), phi_.expand(*batch, phi_.shape[-1])], -1)
            J = torch.cat([J.expand(*batch, *J.shape[-3:]), J_.expand(*batch, *J_.shape[-3:])], -3)
            idx = torch.arange(sc.num_pairs, device=point.device)
            for k in law:
                A, B = _rows(law[k], g.num_points), _rows(per_point(self._pair_p[k], idx), sc.num_pairs)
                lb = broadcast_shapes(A.shape[:-1], B.shape[:-1])
                law[k] = torch.cat([A.expand(*lb, g.num_points), B.expand(*lb, sc.num_pairs)], -1)
        v_c = (J * v.view(*v.shape[:-1], 1, 1, v.shape[-1])).sum(-1)
        v_n = (v_c * n).sum(-1)
        v_t = v_c - v_n[..., None] * n
        f_n, f_t, c_n, k_n, s = contact_law(phi, v_n, v_t, clamp_normal=p["clamp_normal"], dt=_dt, **law)
        force = f_n[..., None] * n + f_t
        f_ext = self._wrenches(robot, Rb, pb, point, force)
        return ContactResult(
            point=point,
            normal=n,
            penetration=phi,
            normal_velocity=v_n,
            slip_velocity=v_t,
            normal_force=f_n,
            friction_force=f_t,
            force=force,
            f_ext=f_ext,
            jacobian=J,
            _c_n=c_n,
            _k_n=k_n,
            _mu_fn_over_s=law["friction"] * torch.clamp_min(f_n, 0.0) / s,
            _s=s,
            _mu=torch.broadcast_to(law["friction"], phi.shape),
            _bodies=(Rb, pb),
        )

    def _centres(self, Rb: torch.Tensor, pb: torch.Tensor) -> torch.Tensor:
        """``(..., np, 3)`` world centres of the geometry's points from the body poses."""
        g = self.geometry
        Rp = Rb.index_select(-3, g.point_body)  # (..., np, 3, 3)
        return (Rp * g.point_local[:, None, :]).sum(-1) + pb.index_select(-2, g.point_body)

    def place_on_terrain(self, robot: RobotModel, q: torch.Tensor, *, clearance: float = 0.0) -> torch.Tensor:
        """``q`` with the floating base moved vertically so that the contact
        shapes nearest the terrain are ``clearance`` above it.

        The set-up of a drop or a stance: the lowest shape touches the terrain
        at ``clearance = 0``, is ``clearance`` m clear of it (along the terrain
        normal) when positive and sunk in when negative; every other shape is
        at least as far. Exact on the ground plane and on the heightfield: a
        vertical shift ``dz`` changes a point's signed distance by
        ``dz n_z``. Self-collision pairs play no part.

        Args:
            robot: the model (floating base).
            q: ``(..., nq)`` configuration; its base height is replaced.
            clearance: m.

        Returns:
            ``(..., nq)``, a new tensor (differentiable in ``q``).

        Raises:
            InputError: a fixed-base robot, a geometry without points, or a
                clearance that is not a finite number.
        """
        self._check(robot)
        robot.check_q(q)
        if not robot.floating_base:
            raise InputError(f"place_on_terrain moves the floating base; robot {robot.name!r} has a fixed base")
        if self.geometry.num_points == 0:
            raise InputError("place_on_terrain needs contact shapes; this ContactModel's geometry has none")
        if isinstance(clearance, bool) or not isinstance(clearance, (int, float)) or not math.isfinite(clearance):
            raise InputError(f"clearance must be a finite number of metres, got {clearance!r}")
        dist, n = self.terrain.query(self._centres(*body_transforms(robot, q)))
        lift = ((clearance + self.geometry.point_radius - dist) / n[..., 2]).amax(-1)  # (...)
        return torch.cat([q[..., :2], q[..., 2:3] + lift[..., None], q[..., 3:]], -1)

    def _wrenches(self, robot, Rb, pb, point, force) -> torch.Tensor:
        """Body wrenches ``(..., nb, 6)`` of the ground rows and the pair rows."""
        npg = self.geometry.num_points
        f_ext = _body_wrenches(robot, Rb, pb, point[..., :npg, :], force[..., :npg, :], self.geometry.point_body)
        sc = self.self_collision
        if sc is not None and sc.num_pairs:
            pp, fp = point[..., npg:, :], force[..., npg:, :]
            f_ext = f_ext + _body_wrenches(robot, Rb, pb, pp, fp, sc.body_a) - _body_wrenches(robot, Rb, pb, pp, fp, sc.body_b)
        return f_ext

    # ------------------------------------------------------------ dynamics

    def acceleration(
        self,
        robot: RobotModel,
        q: torch.Tensor,
        v: torch.Tensor,
        tau: torch.Tensor,
        *,
        dt: float | None = None,
        scheme: str = "implicit",
        gravity: torch.Tensor | None = None,
        extra_damping: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, ContactResult]:
        """Accelerations ``(..., nv)`` under ``tau`` and the contact forces.

        ``"explicit"``: ``M a = tau + tau_joint - h + J^T f(q, v)`` (needs
        small steps: stable for ``dt < 2 m / d`` and ``dt < 2 sqrt(m / k)``).

        ``"implicit"`` (needs ``dt``; for a semi-implicit Euler step
        ``v' = v + dt a``, ``q' = q (+) dt v'``): the contact force is
        linearised in the new velocity and position,
        ``f' = f - C J dt a - K J dt (v + dt a)`` with ``C = -df/dv_c`` (normal
        damping and the exact Jacobian of the regularised friction) and
        ``K = k n n^T`` (normal stiffness), so that

            (M + dt J^T C J + dt^2 J^T K J) a = tau + tau_joint - h + J^T (f - dt K J v - (C + dt K) b)

        where ``b = dt J_base (omega x v_base)`` is the change of the point
        velocities that the turning base frame adds in :func:`integrate_world`
        (zero without a floating base).

        ``C`` and ``K`` are positive semi-definite, so the matrix is
        symmetric positive definite and the step stays stable for stiff
        contact and small stiction widths (see ``docs/contact.md``).

        At lift-off the linearised normal force ``f'_n`` of a loaded point
        can come out negative (its damping extrapolated past zero: the
        point would be pulled onto the terrain). With :attr:`unilateral`
        (the default) such points are taken out of the step (no force, no
        ``C``, ``K`` or prediction) and the step solved again, at most
        :data:`UNILATERAL_PASSES` more times while new points turn negative
        (:func:`unilateral_step`); every applied ``f'_n`` is then ``>= 0``.
        Samples where no point dropped get the single solve bit for bit; the
        gradient is that of the last solve with the dropped points fixed.

        Args:
            robot, q, v: as :meth:`forces`. tau: ``(..., nv)`` applied forces.
            dt: the step the acceleration will be used for (s).
            scheme: ``"implicit"`` (default) or ``"explicit"``.
            gravity: optional ``(..., 3)``.
            extra_damping: optional ``(..., nv)`` non-negative diagonal damping
                ``D`` of other forces already in ``tau`` (``tau`` holds
                ``-D v``) to treat implicitly too (adds ``dt diag(D)`` to the
                matrix), e.g. PD velocity gains.

        Returns:
            ``a (..., nv)`` and the :class:`ContactResult` at ``(q, v)``; with
            the implicit scheme its forces (``force``, ``normal_force``,
            ``friction_force``, ``f_ext``) are the ones the step applies, the
            linearised end-of-step forces, and the kinematic fields
            (penetration, velocities) are those at the start of the step.
        """
        if scheme not in CONTACT_SCHEMES:
            raise InputError(f"unknown contact scheme {scheme!r}; valid: {', '.join(CONTACT_SCHEMES)}")
        if self._soft is not None:
            if dt is None or not dt > 0:
                raise InputError(f"the soft-constraint contact needs the step dt > 0, got {dt!r}")
            self._check(robot)
            return soft_acceleration(self, robot, q, v, tau, float(dt), gravity, extra_damping)
        if scheme == "explicit":
            res = self.forces(robot, q, v)
            return forward_dynamics(robot, q, v, tau, f_ext=res.f_ext, gravity=gravity), res
        if dt is not None and dt > 0 and not transforms_active():
            self._check(robot)
            from . import _fast

            # One decision for this step and the Simulator's (_fast.dispatch).
            path = _fast.dispatch(self, robot, q, v, tau, gravity)
            if path == "fast":
                return _fast.implicit_acceleration_fast(self, robot, q, v, tau, dt, gravity, extra_damping)
            if path == "recorded":
                # Recording: the fast step as one autograd node with its
                # backward by the implicit function theorem (_fast.py).
                return _fast.implicit_acceleration_recorded(self, robot, q, v, tau, dt, gravity, extra_damping)
        kin = self._shared_kinematics(robot, q, v, tau, gravity)
        terms = self.implicit_terms(robot, q, v, dt, gravity=gravity, _kin=kin)
        if kin is None:
            h = bias_forces(robot, q, v, gravity=gravity)
        elif kin.bias is not None:
            h = kin.bias
        else:
            g = gravity_vector(robot, gravity)
            _, (qb, vb, g) = broadcast_batch(robot, q, (v, robot.nv, "v"), (g, 3, "gravity"))
            h = rnea_core(robot, topology(robot), kin if qb.shape == q.shape else kinematics(robot, topology(robot), qb), vb, None, g)
        base = tau - h
        jf = joint_forces(robot, v) if _has_joint_forces(robot) else None  # all zero (and no gradient) on the CPU: skipped

        def solve(t: ImplicitContact) -> torch.Tensor:
            A = torch.add(t._M, t.matrix, alpha=dt)
            if extra_damping is not None:
                A = A + dt * torch.diag_embed(extra_damping)
            rhs = base + t.force
            if jf is not None:
                rhs = rhs + jf
            return spd_solve(A, rhs)

        return unilateral_step(self, robot, terms, solve, dt)

    def _shared_kinematics(self, robot: RobotModel, q, v, tau, gravity=None):
        """The dynamics' reference kinematics at ``q``, computed once for the
        contact points, the mass matrix and the bias forces, where all three
        would take the reference path; else ``None`` (each computes its own).
        Where autograd records, the mass matrix and the bias forces are
        formed in the kinematics' one node (``kinematics(..., mass=True,
        bias=...)``: their backward written out)."""
        topo = topology(robot)
        n = _batch_size(q, v, tau)
        if choose("mass_matrix", n, topo.nm > 0) or choose("inverse_dynamics", n, topo.nm > 0) or choose(
            "kinematics", n, robot.num_bodies > 1
        ):
            return None
        robot.check_q(q)
        robot.check_vector(v, robot.nv, "v")
        return kinematics(robot, topo, q, mass=True, bias=(v, gravity_vector(robot, gravity)))

    def implicit_terms(
        self,
        robot: RobotModel,
        q: torch.Tensor,
        v: torch.Tensor,
        dt: float,
        *,
        gravity: torch.Tensor | None = None,
        _kin=None,
    ) -> ImplicitContact:
        """The contact's part of the implicit step: ``force`` and ``matrix`` such that

            (M + dt D + dt matrix) a = tau - h + ... + force

        is the step of :meth:`acceleration` (``matrix = J^T (C + dt K) J``,
        ``force = J^T (f - dt K J v - (C + dt K) b)``). For a caller that builds
        its own solve (the simulator's implicit joint friction); then
        :meth:`applied` gives the forces the step applied.

        Raises:
            InputError: ``dt`` not positive.
        """
        if dt is None or not dt > 0:
            raise InputError(f"the implicit contact scheme needs the step dt > 0, got {dt!r}")
        self._not_soft("implicit_terms")
        res = self.forces(robot, q, v, _dt=dt, _kin=_kin)
        J = res.jacobian
        n = res.normal
        # Per-point 3x3 damping C and stiffness K (world frame).
        vt = res.slip_velocity
        M = mass_matrix(robot, q) if _kin is None else crba_core(robot, topology(robot), _kin)
        batch = J.shape[:-3]
        if M.shape[:-2] != batch:
            M = M.expand(*batch, *M.shape[-2:])
        Jf = J.reshape(*batch, -1, J.shape[-1])  # (..., 3 np, nv)
        # At batch 1 every operation, and every autograd node, costs a few
        # microseconds whatever its size: the products below are written for
        # few of them (broadcast products and sums rather than batched
        # matrix-vector products, whose unsqueezes, expands and views are
        # nodes of their own).
        CK = row_matrices(n, vt, res._s, res._mu, res.normal_force, res._c_n, res._k_n, Jf, M, dt, combined=True)
        # J^T CK J: the rows' CK J by a broadcast product, then one (nv, 3 np) x (3 np, nv) product.
        CKJ = (CK.unsqueeze(-1) * J.unsqueeze(-3)).sum(-2).reshape(Jf.shape)
        matrix = Jf.transpose(-1, -2) @ CKJ
        # Predicted change of each contact point's force over the step,
        # beyond -CK J dt a: the spring over dt v, K dt J v = dt k_n v_n n
        # (K = k_n n n^T, |n| = 1, n . J v = v_n), and the turning of the
        # base frame, CK dt b (see integrate_world, which moves the base
        # with its classical acceleration a_lin + w x v).
        pred = (res._k_n * res.normal_velocity).unsqueeze(-1) * (dt * n)
        if robot.floating_base:
            # The base's linear columns of every point's J are R0.
            R0 = res._bodies[0][..., 0, :, :] if res._bodies else J[..., 0, :, :3]
            v_lin, w, _ = v.split_with_sizes([3, 3, v.shape[-1] - 6], -1)
            extra = (R0 * torch.linalg.cross(w, v_lin).unsqueeze(-2)).sum(-1)  # (..., 3): the same at every point
            pred = pred + (CK * (dt * extra).view(*extra.shape[:-1], 1, 1, 3)).sum(-1)
        force = (Jf * (res.force - pred).reshape(*batch, -1, 1)).sum(-2)
        return ImplicitContact(result=res, force=force, matrix=matrix, _CK=CK, _pred=pred, _M=M)

    def applied(self, robot: RobotModel, terms: ImplicitContact, a: torch.Tensor, dt: float) -> ContactResult:
        """The :class:`ContactResult` with the forces an implicit step with acceleration ``a`` applied.

        The linearised end-of-step force ``f - pred - (C + dt K) J dt a`` of
        every row of ``terms`` (zero at the rows that :func:`masked_terms`
        took out). It is not clamped: a negative normal force here is what
        the unilateral step (:func:`unilateral_step`) drops rows for.
        """
        res = terms.result
        J, n = res.jacobian, res.normal
        Ja = (J @ (dt * a)[..., None, :, None])[..., 0]
        force = res.force - terms._pred - (terms._CK @ Ja[..., None])[..., 0]
        f_n = (force * n).sum(-1)
        return dataclasses.replace(
            res,
            force=force,
            normal_force=f_n,
            friction_force=force - f_n[..., None] * n,
            f_ext=self._wrenches(robot, *res._bodies, res.point, force),
        )

    def __repr__(self) -> str:
        extra = "" if self.unilateral else ", unilateral=False"
        return f"ContactModel({self.geometry!r}, terrain={self.terrain!r}{extra})"


#: Extra solves of a unilateral implicit step at most (:func:`unilateral_step`).
UNILATERAL_PASSES = 3


def masked_terms(terms: ImplicitContact, keep: torch.Tensor) -> ImplicitContact:
    """``terms`` with the rows where ``keep (..., r)`` is 0 taken out of the step.

    A dropped row applies nothing: its force (normal and friction), its
    damping and stiffness ``C + dt K`` and its prediction are zero, so it
    adds nothing to ``matrix`` or ``force`` and :meth:`ContactModel.applied`
    gives it a zero force. ``keep`` is a 0/1 tensor of the model's dtype.
    """
    res = terms.result
    J = res.jacobian  # (..., r, 3, nv)
    batch = broadcast_shapes(J.shape[:-3], keep.shape[:-1])
    if J.shape[:-3] != batch:
        J = J.expand(*batch, *J.shape[-3:])
    Jf = J.reshape(*batch, -1, J.shape[-1])
    CK, pred, f0 = masked_rows(keep, terms._CK, terms._pred, res.force)
    CKJ = (CK.unsqueeze(-1) * J.unsqueeze(-3)).sum(-2).reshape(Jf.shape)
    force = (Jf * (f0 - pred).reshape(*batch, -1, 1)).sum(-2)
    return dataclasses.replace(
        terms, result=dataclasses.replace(res, force=f0), force=force, matrix=Jf.transpose(-1, -2) @ CKJ, _CK=CK, _pred=pred
    )


def masked_rows(keep: torch.Tensor, CK: torch.Tensor, pred: torch.Tensor, force: torch.Tensor):
    """The rows' ``C + dt K`` ``(..., r, 3, 3)``, prediction and force ``(..., r, 3)``
    with the rows where ``keep (..., r)`` is 0 zeroed (:func:`masked_terms`,
    the pair rows of ``Scene.step``)."""
    return CK * keep[..., None, None], pred * keep[..., None], force * keep[..., None]


def unilateral_step(contact, robot: RobotModel, terms: ImplicitContact, solve, dt: float):
    """Solve an implicit contact step; without adhesion if ``contact.unilateral``.

    ``solve(terms) -> a (..., nv)`` solves the step with the contact's terms
    (each caller's own matrix and right-hand side around them). The first
    solve is the linearised step. Its applied normal force ``f'_n = f_n -
    n . ((C + dt K) J dt a + pred)`` is negative where a loaded point
    separates within the step (the normal damping, extrapolated linearly,
    pulls). With ``contact.unilateral`` such rows are taken out of the step
    (:func:`masked_terms`) and the step solved again, up to
    :data:`UNILATERAL_PASSES` times while new rows turn negative; a dropped
    row stays dropped for the step. This is an active-set pass on the
    linearised step's complementarity ``f'_n >= 0``, ``f'_n = 0`` where
    dropped (Signorini's condition on the force rather than the gap).

    Samples without a dropped row keep the first solve bit for bit (the
    re-solve runs on the whole batch, its result is taken only where a row
    dropped). The active set is a constant for the gradient: the gradient
    is that of the final solve with its rows fixed (a piecewise-smooth step).
    One host synchronisation per pass (whether any row is negative); under
    ``torch.compile`` every pass runs instead, with the same result.

    Returns:
        ``a (..., nv)`` and the applied :class:`ContactResult`.
    """
    a = solve(terms)
    res = contact.applied(robot, terms, a, dt)
    if not contact.unilateral or terms.result.penetration.shape[-1] == 0:
        return a, res

    def resolve(keep):
        t = masked_terms(terms, keep)
        a_k = solve(t)
        return a_k, contact.applied(robot, t, a_k, dt)

    return active_set_passes(a, res, lambda r: r.normal_force, resolve, _select)


def active_set_passes(a, out, normal_force, resolve, select, droppable=None):
    """The passes of a unilateral step after its first solve (:func:`unilateral_step`, ``Scene.step``).

    Args:
        a: ``(..., nv)`` the first solve's acceleration; out: its applied
            forces (any object ``normal_force`` and ``select`` read).
        normal_force: ``normal_force(out) -> (..., r)`` every row's applied
            normal force.
        resolve: ``resolve(keep) -> (a, out)``: the step solved again
            without the rows where ``keep (..., r)`` (0/1, ``a``'s dtype) is 0.
        select: ``select(mask, new, old) -> out``: ``old`` with ``new``'s
            forces in the samples where ``mask (...)``.
        droppable: optional ``(r,)`` bool, the rows that may leave the step
            (default: all).

    A row whose applied normal force is negative is dropped, and the step
    solved again, at most :data:`UNILATERAL_PASSES` times while new rows
    turn negative; dropped rows stay dropped. Samples without a dropped row
    keep ``a`` and ``out`` bit for bit; the others take the last re-solve
    (whose gradient has the dropped rows fixed). One host synchronisation
    per pass; under ``torch.compile`` and ``torch.func`` transforms every
    pass runs (no data-dependent branch), with the same result.
    """
    compiling = torch.compiler.is_compiling() or transforms_active()
    keep = None
    for _ in range(UNILATERAL_PASSES):
        with torch.no_grad():
            neg = normal_force(out).detach() < 0
            if droppable is not None:
                neg = neg & droppable
            if keep is not None:
                neg = neg & keep
            if not compiling and not bool(neg.any()):
                break
            keep = ~neg if keep is None else keep & ~neg
        a_k, out_k = resolve(keep.to(a.dtype))
        dropped = (~keep).any(-1)  # (...) samples with a dropped row: they take the re-solve
        a = torch.where(dropped[..., None], a_k, a)
        out = select(dropped, out_k, out)
    return a, out


def _select(mask: torch.Tensor, new: ContactResult, old: ContactResult) -> ContactResult:
    """``old`` with its applied forces replaced by ``new``'s in the samples where ``mask (...)``."""
    m = mask[..., None]
    return dataclasses.replace(
        old,
        force=torch.where(m[..., None], new.force, old.force),
        normal_force=torch.where(m, new.normal_force, old.normal_force),
        friction_force=torch.where(m[..., None], new.friction_force, old.friction_force),
        f_ext=torch.where(m[..., None], new.f_ext, old.f_ext),
    )


def row_matrices(n, v_t, s, mu, f_n, c_n, k_n, Jf, M, dt, *, combined: bool = False):
    """Per-row damping ``C`` and stiffness ``K`` ``(..., r, 3, 3)`` of the implicit step.

    ``C = c_n n n^T + friction damping``, ``K = k_n n n^T``. The friction
    damping is the exact Jacobian ``mu f_n (P_t / s - v_t v_t^T / s^3)``
    along the slip only where one step cannot reverse the slip. Below the
    one-step stopping speed ``v* = dt mu f_n / m_eff`` (``m_eff``: the row's
    effective mass, ``1 / (J M^-1 J^T)`` averaged over its three directions)
    the linearised step would overshoot (period-2 chatter of the slip sign:
    measured on a rolling sphere and on a standing quadruped's foot), so
    there the slip direction gets the lagged coefficient ``mu f_n / s``,
    which never overshoots; ``gamma = |v_t|^2 / (|v_t|^2 + v*^2)`` blends the
    two. Shared by :meth:`ContactModel.implicit_terms` and the scenes of
    ``_scene.py`` (whose ``M`` is block-diagonal over their systems).

    With ``a = mu f_n+ / s`` and ``b = a gamma / s^2``,
    ``C = (c_n - a) n n^T + a I - b v_t v_t^T`` (``P_t = I - n n^T``): the
    three matrices weighted in one broadcast product.

    Args:
        n: ``(..., r, 3)`` normals. v_t: ``(..., r, 3)`` slip. s, mu, f_n,
            c_n, k_n: ``(..., r)`` (``s`` and the derivatives from
            :func:`contact_law`). Jf: ``(..., 3 r, nv)`` the rows' stacked
            Jacobians. M: ``(..., nv, nv)`` mass matrix. dt: s.
        combined: return ``C + dt K`` alone (the step's matrix), formed in
            the same product.
    """
    nnT = n[..., :, None] * n[..., None, :]
    inv_mass = _inverse_masses(M, Jf, n.shape[:-1])
    fn_pos, _, _, _, gamma = friction_blend(mu, f_n, v_t, inv_mass, dt)
    a = mu * fn_pos / s
    coef = torch.stack([(c_n + dt * k_n if combined else c_n) - a, a, -a * gamma / (s * s)], -1)
    vvT = v_t.unsqueeze(-1) * v_t.unsqueeze(-2)
    shape = broadcast_shapes(nnT.shape, vvT.shape)
    eye = torch.eye(3, dtype=n.dtype, device=n.device).expand(shape)
    basis = torch.stack([x if x.shape == shape else x.expand(shape) for x in (nnT, eye, vvT)], -3)  # (..., r, 3, 3, 3)
    C = (coef.view(*coef.shape, 1, 1) * basis).sum(-3)
    if combined:
        return C
    return C, k_n[..., None, None] * nnT


def friction_blend(mu, f_n, v_t, inv_mass, dt: float, vt2=None):
    """The friction blend's weight per row, in one place for the reference
    step (:func:`row_matrices`) and the fast step (``_fast._blend_scalars``
    and its written-out backward ``_fast._contact_vjp``).

    Args:
        mu, f_n: ``(..., r)`` friction coefficient and normal force.
        v_t: ``(..., r, 3)`` slip. inv_mass: ``(..., r)`` ``1 / m_eff``. dt: s.
        vt2: ``(..., r)`` ``|v_t|^2`` where the caller has it (``None``: from ``v_t``).

    Returns:
        ``(fn_plus, vstar, vt2, den, gamma)``: ``f_n+ = max(f_n, 0)``, the
        one-step stopping speed ``v* = dt mu f_n+ / m_eff``, ``|v_t|^2``,
        ``den = |v_t|^2 + v*^2`` (plus the smallest normal number, so that
        ``gamma`` is 0, not NaN, at rest) and ``gamma = |v_t|^2 / den``.
    """
    fn_plus = torch.clamp_min(f_n, 0.0)
    vstar = dt * mu * fn_plus * inv_mass
    if vt2 is None:
        vt2 = (v_t * v_t).sum(-1)
    den = vt2 + vstar * vstar + torch.finfo(v_t.dtype).tiny
    return fn_plus, vstar, vt2, den, vt2 / den


def _inverse_masses(M: torch.Tensor, Jf: torch.Tensor, rows: torch.Size) -> torch.Tensor:
    """``(..., r)`` each row's mean of ``diag(J M^-1 J^T)`` over its three directions.

    ``diag(J M^-1 J^T)`` = column sums of ``Y^2`` with ``L Y = J^T``, ``M = L
    L^T``. ``cholesky_ex``: no error check, so no host synchronisation on a
    GPU; a mass matrix that is not positive definite makes the step's own
    solve (and so the state) non-finite, which the rollout reports. Where
    autograd records, one node with its backward written out
    (:class:`_InverseMasses`).
    """
    if torch.is_grad_enabled() and (M.requires_grad or Jf.requires_grad) and not transforms_active():
        return _InverseMasses.apply(M, Jf)
    return _inverse_masses_plain(M, Jf)


def _inverse_masses_plain(M, Jf):
    Y = torch.linalg.solve_triangular(torch.linalg.cholesky_ex(M)[0], Jf.transpose(-1, -2), upper=False)
    return (Y * Y).sum(-2).reshape(*Jf.shape[:-2], -1, 3).mean(-1)


class _InverseMasses(torch.autograd.Function):
    """:func:`_inverse_masses` with the backward written out.

    With ``z_c = M^-1 J_c^T`` (``c`` a row of ``Jf``), ``d(J_c M^-1 J_c^T) =
    2 dJ_c . z_c - z_c^T dM z_c``: for incoming ``g`` (each row's weight over
    its three directions ``g_c = g_row / 3``), ``g_J = 2 g_c z_c^T`` and
    ``g_M = -Z diag(g_c) Z^T`` (symmetric). Three operations and one more
    triangular solve instead of autograd's backward through ``cholesky_ex``
    and ``solve_triangular`` (about twenty). Under ``create_graph`` the
    backward differentiates the plain operations."""

    @staticmethod
    def forward(ctx, M, Jf):
        L = torch.linalg.cholesky_ex(M)[0]
        Y = torch.linalg.solve_triangular(L, Jf.transpose(-1, -2), upper=False)
        ctx.save_for_backward(M, Jf, L, Y)
        return (Y * Y).sum(-2).reshape(*Jf.shape[:-2], -1, 3).mean(-1)

    @staticmethod
    def backward(ctx, g):
        M, Jf, L, Y = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph: plain autograd, differentiable again
            with torch.enable_grad():
                ins = [x if x.requires_grad else x.detach().requires_grad_(True) for x in (M, Jf)]
                gM, gJ = torch.autograd.grad(_inverse_masses_plain(*ins), ins, g, create_graph=True, allow_unused=True)
            return gM, gJ
        Z = torch.linalg.solve_triangular(L.transpose(-1, -2), Y, upper=True)  # M^-1 J^T, (..., nv, 3 r)
        gc = (g / 3.0).repeat_interleave(3, -1)[..., None, :]  # (..., 1, 3 r)
        gZ = Z * gc
        gM = -(gZ @ Z.transpose(-1, -2)) if ctx.needs_input_grad[0] else None
        gJ = 2.0 * gZ.transpose(-1, -2) if ctx.needs_input_grad[1] else None
        return (gM.sum_to_size(M.shape) if gM is not None else None,
                gJ.sum_to_size(Jf.shape) if gJ is not None else None)


# ---------------------------------------------------------------- the solve


def _spd_factor(A: torch.Tensor, check: bool | None = None) -> torch.Tensor:
    """The Cholesky factor ``L (..., n, n)`` of ``A`` (:func:`spd_solve`).

    On the CPU ``torch.linalg.cholesky``: a matrix that is not positive
    definite raises ``LinAlgError``, which the simulator reports as the step
    that could not be solved. On a GPU that error check would read the
    factorisation's status on the host, a synchronisation at every solve;
    there ``cholesky_ex`` (no check, the same factor) instead, with the factor
    of a matrix that is not positive definite made NaN: that sample's state
    turns non-finite, which the rollout reports (``check_finite``) and an env
    resets. ``check`` overrides the choice (``True``: raise; ``False``: NaN).
    """
    if (A.device.type == "cpu") if check is None else check:
        return torch.linalg.cholesky(A)
    L, info = torch.linalg.cholesky_ex(A)
    return torch.where((info == 0)[..., None, None], L, math.nan)


class _SPDSolve(torch.autograd.Function):
    """``x = A^-1 b`` for symmetric positive definite ``A`` by a Cholesky
    factorisation, with the backward written out: ``g_b = A^-1 g_x`` (one
    more solve with the same factor) and ``g_A = -g_b x^T``, exact for any
    perturbation of a symmetric ``A``. Autograd's own backward through
    ``cholesky`` and ``cholesky_solve`` costs about twenty operations per step,
    this one three. Under ``create_graph`` (double backward) the backward
    refactorises ``A`` with differentiable operations."""

    @staticmethod
    def forward(ctx, A, b):
        L = _spd_factor(A)
        x = torch.cholesky_solve(b[..., None], L)[..., 0]
        ctx.save_for_backward(A, b, L, x)
        return x

    @staticmethod
    def backward(ctx, gx):
        A, b, L, x = ctx.saved_tensors
        if torch.is_grad_enabled():
            L = _spd_factor(A)
        y = torch.cholesky_solve(gx[..., None], L)[..., 0]
        gA = -y[..., :, None] * x[..., None, :]
        return gA.sum_to_size(A.shape), y.sum_to_size(b.shape)


def spd_solve(A: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``A^-1 b`` for ``A (..., n, n)`` symmetric positive definite, ``b (..., n)``.

    The hand-written backward (:class:`_SPDSolve`) where autograd records;
    plain ``cholesky`` and ``cholesky_solve`` under ``torch.func`` transforms
    and forward-mode AD (which a custom ``Function`` without ``jvp`` does
    not take part in) and without autograd.
    """
    if transforms_active() or not (A.requires_grad or b.requires_grad) or not torch.is_grad_enabled():
        return torch.cholesky_solve(b[..., None], _spd_factor(A))[..., 0]
    shape = torch.broadcast_shapes(A.shape[:-2], b.shape[:-1])
    if A.shape[:-2] != shape:
        A = A.expand(*shape, *A.shape[-2:])
    if b.shape[:-1] != shape:
        b = b.expand(*shape, b.shape[-1])
    return _SPDSolve.apply(A, b)


# ---------------------------------------------------------------- kinematics


def _batch_size(*xs: torch.Tensor) -> int:
    """The number of samples in the broadcast batch of ``xs`` (vectors ``(..., k)``)."""
    shape = broadcast_shapes(*(x.shape[:-1] for x in xs))
    n = 1
    for d in shape:
        n *= d
    return n


def _rows(t: torch.Tensor, n: int) -> torch.Tensor:
    """A per-row parameter ``()``, ``(..., 1)`` or ``(..., n)`` as ``(..., n)``."""
    return t.expand(n) if t.ndim == 0 else t.expand(*t.shape[:-1], n)


def _body_wrenches(robot: RobotModel, Rb, pb, point, force, point_body) -> torch.Tensor:
    """Sum point forces into ``(..., nb, 6)`` body-frame wrenches at the body origins."""
    Rp = Rb.index_select(-3, point_body)
    r = point - pb.index_select(-2, point_body)
    if r.shape != force.shape:  # e.g. an unbatched state with batched forces (torch.cross does not broadcast)
        r, force = torch.broadcast_tensors(r, force)
    torque = torch.cross(r, force, dim=-1)
    RT = Rp.transpose(-1, -2)
    w = torch.cat([(RT @ force[..., None])[..., 0], (RT @ torque[..., None])[..., 0]], -1)
    out = w.new_zeros(*w.shape[:-2], robot.num_bodies, 6)
    return out.index_add(-2, point_body, w)


def stack_results(results: list[ContactResult]) -> ContactResult:
    """Stack per-step results along a time axis placed after the batch axes.

    Each field goes from ``(..., np, ...)`` to ``(..., T, np, ...)`` (``f_ext``
    to ``(..., T, nb, 6)``, ``jacobian`` to ``(..., T, np, 3, nv)``).
    """
    first = results[0]
    axis = first.penetration.ndim - 1  # the number of batch axes
    fields = {}
    for f in dataclasses.fields(ContactResult):
        if f.name == "_bodies":
            fields[f.name] = ()
            continue
        fields[f.name] = torch.stack([getattr(r, f.name) for r in results], dim=axis)
    return ContactResult(**fields)
