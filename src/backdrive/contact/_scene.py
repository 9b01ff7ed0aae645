"""Free objects to push: several rigid systems that touch each other.

A :class:`RobotModel` has at most one free joint (its root), so a free
object cannot hang in a robot's tree. Instead a scene holds several
*systems*, each a model with its own :class:`ContactModel` (ground and
self-collision): the robot and any number of free rigid objects, each a
one-body floating-base model (:func:`free_body`). The scene state is the
systems' states side by side, ``q = [q_0, q_1, ...]`` and
``v = [v_0, v_1, ...]``, each in its model's convention (an object's
``[p_world, quat_wxyz]`` and base-frame twist).

The systems' equations of motion are independent except for the contact
pairs between their shapes (``ShapePairs``: spheres, capsules and exact
boxes), so the step is the implicit contact step of ``_model.py`` on the
block-diagonal system:

    (blkdiag(M_s + dt J_s^T (C_s + dt K_s) J_s) + dt J_p^T (C_p + dt K_p) J_p + dt D) a
        = [tau_s + tau_joint_s - h_s + F_s] + J_p^T (f_p - pred_p)

where ``s`` runs over the systems (their ground and self contact, from
:meth:`ContactModel.implicit_terms`) and ``p`` over the pair rows, whose
Jacobian ``J_p = [.., J_a, .., -J_b, ..]`` acts on the relative velocity of
the point on the first shape's body (system of ``a``) and on the second's.
Each system then moves by :func:`integrate_world`. As every implicit
contact step, the scene's never pulls (``unilateral``: rows whose applied
normal force comes out negative leave the step, which is solved again).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

import torch

from .._errors import InputError, InvalidValueError, UnknownNameError
from ..dynamics import bias_forces, joint_forces, mass_matrix
from ..kinematics import body_transforms
from ..model import RobotModel
from ._geometry import ContactGeometry
from ._law import ContactParameters, contact_law, per_point, resolve_parameters
from ..kinematics._fk import point_jacobians, point_support
from ._model import ContactModel, _select, active_set_passes, masked_rows, masked_terms, row_matrices, spd_solve
from ._pairs import BOX_MODES, ShapePairs, _local_shape
from ._step import integrate_world
from ._terrain import GroundPlane, Terrain

__all__ = ["free_body", "Scene", "SceneResult", "PairResult", "OBJECT_KINDS"]

#: Shapes :func:`free_body` makes.
OBJECT_KINDS = ("box", "sphere", "capsule")


def _solid_inertia(kind: str, size: tuple[float, ...], mass: float) -> tuple[float, float, float]:
    """Principal moments ``(ixx, iyy, izz)`` of a uniform solid, kg m^2 (capsule: along z)."""
    if kind == "box":
        x, y, z = size
        return (mass * (y * y + z * z) / 12, mass * (x * x + z * z) / 12, mass * (x * x + y * y) / 12)
    if kind == "sphere":
        i = 0.4 * mass * size[0] ** 2
        return (i, i, i)
    # Capsule: a cylinder of length h and two hemispheres of radius r, split
    # by volume; each hemisphere's moment about the centre uses the parallel
    # axis through its own centroid (3 r / 8 from the flat face).
    r, h = size
    vc, vs = math.pi * r * r * h, 4.0 / 3.0 * math.pi * r**3
    mc, ms = mass * vc / (vc + vs), mass * vs / (vc + vs)
    izz = mc * r * r / 2 + 0.4 * ms * r * r
    ixx = mc * (3 * r * r + h * h) / 12 + ms * (0.4 * r * r + h * h / 4 + 3 * h * r / 8)
    return (ixx, ixx, izz)


def free_body(
    name: str,
    kind: str,
    size: Sequence[float],
    mass: float,
    *,
    dtype: torch.dtype = torch.float64,
    device=None,
) -> RobotModel:
    """A free rigid object: a one-link floating-base model with a collision shape.

    The link (named ``name``) carries a uniform solid of ``kind`` (its
    inertia about the centre) and the same shape as its ``<collision>``, so
    :meth:`ContactGeometry.from_model` finds it. Its state is
    ``q = [p_world (3), quat_wxyz (4)]``, ``v = [v (3), omega (3)]`` (base frame).

    Args:
        name: the link's (and the model's) name.
        kind: ``"box"`` (``size`` = full sides ``(sx, sy, sz)``), ``"sphere"``
            (``(radius,)``) or ``"capsule"`` (``(radius, length)`` along z,
            the straight part's length; its collision shape is a cylinder in
            the URDF, read as a capsule by :meth:`Scene` and the geometry).
        size: metres. mass: kg, ``> 0``.

    Raises:
        InvalidValueError: an unknown kind, a wrong number of sizes, or a
            size or mass that is not finite and positive (naming the object).
    """
    if kind not in OBJECT_KINDS:
        raise InvalidValueError(f"object {name!r} has unknown kind {kind!r}; valid: {', '.join(OBJECT_KINDS)}")
    need = {"box": 3, "sphere": 1, "capsule": 2}[kind]
    size = tuple(float(s) for s in size)
    if len(size) != need:
        raise InvalidValueError(f"object {name!r} ({kind}) needs {need} size values, got {size}")
    if not all(math.isfinite(s) and s > 0 for s in size):
        raise InvalidValueError(f"object {name!r} ({kind}) must have finite positive sizes, got {size}")
    if not (math.isfinite(float(mass)) and float(mass) > 0):
        raise InvalidValueError(f"object {name!r} must have a finite positive mass, got {mass!r}")
    ixx, iyy, izz = _solid_inertia(kind, size, float(mass))
    if kind == "box":
        geom = f'<box size="{size[0]!r} {size[1]!r} {size[2]!r}"/>'
    elif kind == "sphere":
        geom = f'<sphere radius="{size[0]!r}"/>'
    else:
        geom = f'<cylinder radius="{size[0]!r}" length="{size[1]!r}"/>'
    urdf = (
        f'<?xml version="1.0"?><robot name="{name}"><link name="{name}">'
        f'<inertial><mass value="{float(mass)!r}"/><inertia ixx="{ixx!r}" iyy="{iyy!r}" izz="{izz!r}" '
        f'ixy="0" ixz="0" iyz="0"/></inertial>'
        f"<collision><geometry>{geom}</geometry></collision></link></robot>"
    )
    model = RobotModel.from_urdf(urdf, floating_base=True)
    return model.to(device=device, dtype=dtype)


def object_geometry(model: RobotModel) -> ContactGeometry:
    """The contact geometry of a :func:`free_body` (its capsule read as a capsule)."""
    return ContactGeometry.from_model(model, cylinders="capsule")


@dataclass(frozen=True, eq=False)
class PairResult:
    """The contact rows between systems (``nr`` rows, world frame).

    Attributes:
        labels: ``(link_a, link_b)`` of each row (a box-box pair has 25 rows).
        point, normal: ``(..., nr, 3)``; the normal points from the second
            shape into the first.
        penetration: ``(..., nr)`` m. normal_velocity: ``(..., nr)`` m/s
            (first relative to second, positive separating).
        slip_velocity, friction_force, force: ``(..., nr, 3)``; ``force``
            acts on the first shape, its opposite on the second (N).
        normal_force: ``(..., nr)`` N.
    """

    labels: tuple
    point: torch.Tensor
    normal: torch.Tensor
    penetration: torch.Tensor
    normal_velocity: torch.Tensor
    slip_velocity: torch.Tensor
    normal_force: torch.Tensor
    friction_force: torch.Tensor
    force: torch.Tensor


@dataclass(frozen=True, eq=False)
class SceneResult:
    """One scene step's contacts: each system's own (:class:`ContactResult`,
    ``None`` for a system without a contact model) and the pairs between systems."""

    systems: tuple
    pairs: PairResult | None


class Scene:
    """A robot and free objects that push each other (see the module docstring).

    Args:
        systems: ``(model, contact)`` pairs, e.g. the robot and its
            :class:`ContactModel` first, then each object
            (:func:`free_body`) with a ground :class:`ContactModel`
            (``Scene.object_contact``). ``contact`` may be ``None`` (no ground).
        params: the force law of the pairs between systems (values ``()``
            or one per row).
        geometry: optional shapes per system for the pairs (a mapping
            ``system index -> ContactGeometry``); by default each system's
            contact geometry.
        exclude: link-name pairs never to test.
        boxes: ``"exact"`` or ``"capsule"`` (see :class:`SelfCollision`).
        unilateral: the switch of the pair rows (``True``, default: no
            adhesion, as :class:`ContactModel`'s ``unilateral``; ``False``:
            the pair rows' linearised forces are applied as solved). Each
            system's own rows (ground, self-collision) follow its
            :class:`ContactModel`'s ``unilateral``; the step before the 14th
            session is ``unilateral=False`` here and on every contact model.

    Every shape of one system is paired with every shape of every other
    (robot-object and object-object); link names must be unique across the
    systems.

    Raises:
        InputError: not a model, a contact model of another model, repeated
            link names, a bad ``exclude`` entry or ``boxes`` mode.
        UnknownNameError: an excluded link in no system.
    """

    def __init__(
        self,
        systems: Sequence[tuple[RobotModel, ContactModel | None]],
        *,
        params: ContactParameters | None = None,
        geometry: dict | None = None,
        exclude: Iterable[Sequence[str]] = (),
        boxes: str = "exact",
        unilateral: bool = True,
    ):
        if not isinstance(unilateral, bool):
            raise InputError(f"unilateral must be True or False, got {unilateral!r}")
        if boxes not in BOX_MODES:
            raise InputError(f"unknown boxes mode {boxes!r}; valid: {', '.join(BOX_MODES)}")
        systems = list(systems)
        if len(systems) < 1:
            raise InputError("a Scene needs at least one system")
        models, contacts = [], []
        for i, entry in enumerate(systems):
            if not isinstance(entry, (tuple, list)) or len(entry) != 2:
                raise InputError(f"system {i} must be a (model, contact) pair, got {entry!r}")
            m, c = entry
            if not isinstance(m, RobotModel):
                raise InputError(f"system {i} must have a RobotModel, got {type(m).__name__}")
            if c is not None:
                if not isinstance(c, ContactModel):
                    raise InputError(f"system {i} ({m.name!r}): contact must be a ContactModel or None, got {type(c).__name__}")
                c._check(m)
            models.append(m)
            contacts.append(c)
        dt, dev = models[0].dtype, models[0].device
        for m in models:
            if m.dtype != dt or m.device != dev:
                raise InputError(f"system {m.name!r} is {m.dtype} on {m.device}; the first system is {dt} on {dev}")
        owner = {}
        for i, m in enumerate(models):
            for link in m.link_names:
                if link in owner:
                    raise InputError(
                        f"link {link!r} is in system {owner[link]} ({models[owner[link]].name!r}) and in system {i} "
                        f"({m.name!r}): link names must be unique across a scene (name objects apart)"
                    )
                owner[link] = i
        excluded = set()
        for pair in exclude:
            if isinstance(pair, str) or len(pair) != 2:
                raise InputError(f"exclude entries must be pairs of link names, got {pair!r}")
            for name in pair:
                if name not in owner:
                    raise UnknownNameError("scene link", name, list(owner))
            excluded.add(frozenset(pair))
        geometry = dict(geometry or {})
        for k in geometry:
            if not isinstance(k, int) or not 0 <= k < len(models):
                raise InputError(f"geometry keys must be system indices 0..{len(models) - 1}, got {k!r}")
        geoms = []
        for i, (m, c) in enumerate(zip(models, contacts)):
            g = geometry.get(i, c.geometry if c is not None else object_geometry(m))
            if not isinstance(g, ContactGeometry):
                raise InputError(f"geometry of system {i} must be a ContactGeometry, got {type(g).__name__}")
            g.check_robot(m)
            geoms.append(g)
        self.models, self.contacts = tuple(models), tuple(contacts)
        self.params = ContactParameters() if params is None else params
        self._dtype, self._device = dt, dev
        self._q_off = [0]
        self._v_off = [0]
        for m in models:
            self._q_off.append(self._q_off[-1] + m.nq)
            self._v_off.append(self._v_off[-1] + m.nv)
        # One ShapePairs per ordered pair of systems (first, second): body
        # indices are each system's own. A box-sphere pair is stored box
        # second (ShapePairs' convention), so its rows go to the (j, i) set.
        self._links = []
        labels_all = []
        for i in range(len(models)):
            for j in range(i + 1, len(models)):
                li = [_local_shape(models[i], s, boxes) for s in geoms[i].shapes]
                lj = [_local_shape(models[j], s, boxes) for s in geoms[j].shapes]
                fwd, bwd = [], []
                for a, sa in enumerate(geoms[i].shapes):
                    for b, sb in enumerate(geoms[j].shapes):
                        if frozenset((sa.link, sb.link)) in excluded:
                            continue
                        ba, bb = geoms[i].shape_body[a], geoms[j].shape_body[b]
                        if li[a][0] == "box" and lj[b][0] == "seg":
                            bwd.append((bb, lj[b], ba, li[a], (sb.link, sa.link)))
                        else:
                            fwd.append((ba, li[a], bb, lj[b], (sa.link, sb.link)))
                for first, second, entries in ((i, j, fwd), (j, i, bwd)):
                    if entries:
                        sp = ShapePairs(entries, dt, dev)
                        self._links.append(
                            (first, second, sp, point_support(models[first], sp.body_a), point_support(models[second], sp.body_b))
                        )
                        labels_all += list(sp.labels)
        self.pair_labels = tuple(labels_all)
        self._pp = resolve_parameters(self.params, [f"{a}/{b}" for a, b in labels_all], dt, dev)
        self.unilateral = unilateral
        # The rows the unilateral step may drop, in the order of the step's rows:
        # each system's (that has a contact model), then the pairs'.
        parts = [[c.unilateral] * c.num_rows for c in contacts if c is not None]
        if self._links:
            parts.append([unilateral] * len(labels_all))
        flags = [x for p in parts for x in p]
        self._droppable = torch.tensor(flags, dtype=torch.bool, device=dev) if any(flags) else None

    # ------------------------------------------------------------ helpers

    @staticmethod
    def object_contact(model: RobotModel, terrain: Terrain | None = None, params: ContactParameters | None = None) -> ContactModel:
        """A ground :class:`ContactModel` for a :func:`free_body` (its shape on ``terrain``, default ``z = 0``)."""
        return ContactModel(model, object_geometry(model), GroundPlane() if terrain is None else terrain, params)

    @property
    def nq(self) -> int:
        return self._q_off[-1]

    @property
    def nv(self) -> int:
        return self._v_off[-1]

    @property
    def num_pair_rows(self) -> int:
        return len(self.pair_labels)

    def split_q(self, q: torch.Tensor) -> list[torch.Tensor]:
        """``q (..., nq)`` into each system's ``(..., nq_s)``."""
        return [q[..., a:b] for a, b in zip(self._q_off[:-1], self._q_off[1:])]

    def split_v(self, v: torch.Tensor) -> list[torch.Tensor]:
        """``v (..., nv)`` (or ``tau``, ``a``) into each system's ``(..., nv_s)``."""
        return [v[..., a:b] for a, b in zip(self._v_off[:-1], self._v_off[1:])]

    def initial(self, *states: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """The scene state from each system's ``(q_s, v_s)``, in system order."""
        if len(states) != len(self.models):
            raise InputError(f"initial needs one (q, v) per system ({len(self.models)}), got {len(states)}")
        for (q, v), m in zip(states, self.models):
            m.check_q(q)
            m.check_vector(v, m.nv, f"v of {m.name!r}")
        batch = torch.broadcast_shapes(*(s.shape[:-1] for st in states for s in st))
        q = torch.cat([q.expand(*batch, q.shape[-1]) for q, _ in states], -1)
        v = torch.cat([v.expand(*batch, v.shape[-1]) for _, v in states], -1)
        return q, v

    def _check_state(self, q, v, tau):
        for x, n, name in ((q, self.nq, "q"), (v, self.nv, "v"), (tau, self.nv, "tau")):
            if not isinstance(x, torch.Tensor):
                raise InputError(f"scene {name} must be a tensor, got {type(x).__name__}")
            if x.shape[-1:] != (n,):
                raise InputError(f"scene {name} must have shape (..., {n}), got {tuple(x.shape)}")
            if x.dtype != self._dtype or x.device != self._device:
                raise InputError(f"scene {name} is {x.dtype} on {x.device}; the scene is {self._dtype} on {self._device}")

    # ------------------------------------------------------------ the step

    def step(
        self,
        q: torch.Tensor,
        v: torch.Tensor,
        tau: torch.Tensor,
        dt: float,
        *,
        extra_damping: torch.Tensor | None = None,
        gravity: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, SceneResult]:
        """One implicit contact step of every system together.

        Args:
            q: ``(..., nq)``, v: ``(..., nv)``, tau: ``(..., nv)`` applied
                generalised forces (an object's entries: a body-frame wrench).
            dt: s, ``> 0``.
            extra_damping: optional ``(..., nv)`` diagonal damping already in
                ``tau``, treated implicitly (e.g. PD velocity gains).
            gravity: optional ``(..., 3)`` for every system (default: each
                model's own).

        Without adhesion (the rows whose switch is on: each system's
        :class:`ContactModel` ``unilateral`` for its rows, the scene's
        ``unilateral`` for the pair rows): after the solve, every row whose
        applied normal force is negative leaves the step (its force,
        friction, damping, stiffness and prediction are zero) and the step
        is solved again, at most :data:`~backdrive.contact._model.UNILATERAL_PASSES`
        more times while new rows turn negative; dropped rows stay dropped
        (``_model.unilateral_step``'s passes, :func:`~backdrive.contact._model.active_set_passes`).
        Samples without a dropped row get the single solve bit for bit; the
        gradient is that of the last solve with its dropped rows fixed.

        Returns:
            ``q1 (..., nq)``, ``v1 (..., nv)`` and the :class:`SceneResult`
            with the forces the step applied (exactly zero at dropped rows).
        """
        if not (isinstance(dt, (int, float)) and dt > 0):
            raise InputError(f"the scene step needs dt > 0, got {dt!r}")
        self._check_state(q, v, tau)
        qs, vs, taus = self.split_q(q), self.split_v(v), self.split_v(tau)
        batch = torch.broadcast_shapes(q.shape[:-1], v.shape[:-1], tau.shape[:-1])
        terms, kin, Ms, base = [], [], [], []
        for m, c, qi, vi, ti in zip(self.models, self.contacts, qs, vs, taus):
            if c is not None:
                t = c.implicit_terms(m, qi, vi, dt, gravity=gravity)
                M = t._M
            else:
                t, M = None, mass_matrix(m, qi)
            h = bias_forces(m, qi, vi, gravity=gravity)
            terms.append(t)
            Ms.append(M.expand(*batch, *M.shape[-2:]))
            base.append(ti + joint_forces(m, vi) - h)
            kin.append(body_transforms(m, qi))
        pair = None
        if self._links:
            Jf, CK, f, pred, res = self._pair_terms(qs, vs, v, kin, _block_diag(Ms), dt, batch)
            J = res["J"]
        else:
            CK = f = pred = None

        def solve(ts, CK, f, pred):
            """The step's acceleration with the systems' terms ``ts`` and the pair rows' ``CK``, ``f``, ``pred``."""
            blocks, rhs = [], []
            for m, t, M, bs in zip(self.models, ts, Ms, base):
                A, F = (t._M + dt * t.matrix, t.force) if t is not None else (M, 0.0)
                blocks.append(A.expand(*batch, *A.shape[-2:]))
                rhs.append((bs + F).expand(*batch, m.nv))
            A = _block_diag(blocks)
            b = torch.cat(rhs, -1)
            if CK is not None:
                A = A + dt * (Jf.transpose(-1, -2) @ (CK @ J).reshape(Jf.shape))
                b = b + (Jf.transpose(-1, -2) @ (f - pred).reshape(*Jf.shape[:-2], -1, 1))[..., 0]
            if extra_damping is not None:
                A = A + dt * torch.diag_embed(extra_damping)
            return spd_solve(A, b)

        def applied(ts, CK, f, pred, a):
            """``(system results, pair forces)``: the forces the step with acceleration ``a`` applied."""
            results = tuple(
                c.applied(m, t, ai, dt) if c is not None else None
                for m, c, t, ai in zip(self.models, self.contacts, ts, self.split_v(a))
            )
            if CK is None:
                return results, None
            Ja = (J @ (dt * a)[..., None, :, None])[..., 0]
            force = f - pred - (CK @ Ja[..., None])[..., 0]
            f_n = (force * res["normal"]).sum(-1)
            return results, (force, f_n)

        a = solve(terms, CK, f, pred)
        out = applied(terms, CK, f, pred, a)
        if self._droppable is not None:
            # Without adhesion: rows whose applied normal force is negative
            # leave the step, which is solved again (_model.unilateral_step's passes).
            sizes = [r.normal_force.shape[-1] for r in out[0] if r is not None] + ([f.shape[-2]] if CK is not None else [])

            def resolve(keep):
                parts = iter(keep.split(sizes, -1))
                ts = []
                for c, t in zip(self.contacts, terms):
                    k = next(parts) if t is not None else None
                    ts.append(masked_terms(t, k) if t is not None and c.unilateral else t)
                ck = (CK, f, pred) if CK is None else _mask_pairs(next(parts), CK, f, pred)
                a_k = solve(ts, *ck)
                return a_k, applied(ts, *ck, a_k)

            a, out = active_set_passes(a, out, _normal_forces, resolve, _select_scene, self._droppable)
        results, forces = out
        q1s, v1s = [], []
        for m, qi, vi, ai in zip(self.models, qs, vs, self.split_v(a)):
            qi1, vi1 = integrate_world(m, qi, vi, ai, dt)
            q1s.append(qi1.expand(*batch, m.nq))
            v1s.append(vi1.expand(*batch, m.nv))
        if forces is not None:
            force, f_n = forces
            n = res["normal"]
            pair = PairResult(
                labels=self.pair_labels,
                point=res["point"],
                normal=n,
                penetration=res["phi"],
                normal_velocity=res["v_n"],
                slip_velocity=res["v_t"],
                normal_force=f_n,
                friction_force=force - f_n[..., None] * n,
                force=force,
            )
        return torch.cat(q1s, -1), torch.cat(v1s, -1), SceneResult(systems=results, pairs=pair)

    def _pair_terms(self, qs, vs, v, kin, M, dt, batch):
        """Detection, force law and implicit terms of the rows between systems."""
        pts, ns, phis, Js, extras = [], [], [], [], []
        for i, j, sp, const_i, const_j in self._links:
            # normal from j's shape into i's; force +F on i's body, -F on j's
            pt, n, phi = sp.detect(*kin[i], *kin[j])
            J_i = point_jacobians(self.models[i], *kin[i], pt, const_i)
            J_j = point_jacobians(self.models[j], *kin[j], pt, const_j)
            rows = pt.shape[-2]
            cols = []
            for s, m in enumerate(self.models):
                if s == i:
                    cols.append(J_i.expand(*batch, rows, 3, m.nv))
                elif s == j:
                    cols.append(-J_j.expand(*batch, rows, 3, m.nv))
                else:
                    cols.append(pt.new_zeros(*batch, rows, 3, m.nv))
            Js.append(torch.cat(cols, -1))
            pts.append(pt.expand(*batch, rows, 3))
            ns.append(n.expand(*batch, rows, 3))
            phis.append(phi.expand(*batch, rows))
            extras.append(self._turning(i, kin, vs, dt) - self._turning(j, kin, vs, dt))
        point, n, phi, J = torch.cat(pts, -2), torch.cat(ns, -2), torch.cat(phis, -1), torch.cat(Js, -3)
        extra = torch.cat([e.expand(*batch, pt.shape[-2], 3) for e, pt in zip(extras, pts)], -2)
        v_c = (J @ v[..., None, :, None])[..., 0]
        v_n = (v_c * n).sum(-1)
        v_t = v_c - v_n[..., None] * n
        pp = self._pp
        idx = torch.arange(phi.shape[-1], device=phi.device)
        law = {k: per_point(pp[k], idx) for k in ("stiffness", "damping", "friction", "normal_width", "stiction_width")}
        f_n, f_t, c_n, k_n, s = contact_law(phi, v_n, v_t, clamp_normal=pp["clamp_normal"], dt=dt, **law)
        force = f_n[..., None] * n + f_t
        # Per-row damping and stiffness as in ContactModel.implicit_terms,
        # with the pair's effective mass from both systems (block-diagonal M).
        Jf = J.reshape(*J.shape[:-3], -1, J.shape[-1])
        mu = torch.broadcast_to(law["friction"], phi.shape)
        C, K = row_matrices(n, v_t, s, mu, f_n, c_n, k_n, Jf, M, dt)
        CK = C + dt * K
        Jv = v_c
        pred = (C @ extra[..., None])[..., 0] + (K @ (dt * (Jv + extra))[..., None])[..., 0]
        res = {"J": J, "point": point, "normal": n, "phi": phi, "v_n": v_n, "v_t": v_t}
        return Jf, CK, force, pred, res

    def _turning(self, s, kin, vs, dt):
        """``(..., 1, 3)``: the change of a point's velocity over the step from the
        turning base frame of system ``s`` (see :func:`integrate_world`)."""
        m = self.models[s]
        vi = vs[s]
        if not m.floating_base:
            return vi.new_zeros(*vi.shape[:-1], 1, 3)
        R0 = kin[s][0][..., 0, :, :]
        w_x_v = torch.linalg.cross(vi[..., 3:6], vi[..., :3])
        return dt * (R0 @ w_x_v[..., None]).transpose(-1, -2)

    # ------------------------------------------------------------ rollouts

    def rollout(
        self,
        q: torch.Tensor,
        v: torch.Tensor,
        steps: int,
        dt: float,
        controller: Callable | None = None,
        *,
        gravity: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, list[SceneResult]]:
        """``steps`` steps from ``(q, v)``.

        Args:
            controller: optional ``controller(t, q, v) -> tau`` or
                ``-> (tau, extra_damping)`` with ``tau (..., nv)``; zero forces
                without one.

        Returns:
            ``qs (..., steps + 1, nq)``, ``vs (..., steps + 1, nv)`` and the
            per-step :class:`SceneResult` list.
        """
        if not isinstance(steps, int) or steps < 0:
            raise InputError(f"steps must be a non-negative int, got {steps!r}")
        qs, vs, results = [q], [v], []
        for t in range(steps):
            damping = None
            if controller is None:
                tau = torch.zeros_like(v)
            else:
                out = controller(t, q, v)
                tau, damping = out if isinstance(out, tuple) else (out, None)
            q, v, res = self.step(q, v, tau, dt, extra_damping=damping, gravity=gravity)
            qs.append(q)
            vs.append(v)
            results.append(res)
        axis = q.ndim - 1
        return torch.stack(qs, axis), torch.stack(vs, axis), results

    def __repr__(self) -> str:
        extra = "" if self.unilateral else ", unilateral=False"
        return f"Scene({', '.join(m.name for m in self.models)}; {self.num_pair_rows} pair rows{extra})"


def _block_diag(blocks: list[torch.Tensor]) -> torch.Tensor:
    """Batched block-diagonal matrix of ``(..., n_i, n_i)`` blocks (same batch)."""
    n = sum(b.shape[-1] for b in blocks)
    batch = blocks[0].shape[:-2]
    rows, off = [], 0
    for b in blocks:
        k = b.shape[-1]
        left = b.new_zeros(*batch, k, off)
        right = b.new_zeros(*batch, k, n - off - k)
        rows.append(torch.cat([left, b, right], -1))
        off += k
    return torch.cat(rows, -2)


def _mask_pairs(keep, CK, f, pred):
    """The pair rows' ``(CK, f, pred)`` without the rows where ``keep`` is 0 (:func:`masked_rows`)."""
    CK, pred, f = masked_rows(keep, CK, pred, f)
    return CK, f, pred


def _normal_forces(out) -> torch.Tensor:
    """``(..., r)`` the applied normal forces of every row of a scene step: each
    system's (with a contact model), then the pairs'."""
    results, forces = out
    parts = [r.normal_force for r in results if r is not None] + ([forces[1]] if forces is not None else [])
    return torch.cat(parts, -1)


def _select_scene(mask, new, old):
    """``old`` with ``new``'s applied forces in the samples where ``mask (...)``."""
    results = tuple(None if o is None else _select(mask, n, o) for n, o in zip(new[0], old[0]))
    forces = None
    if old[1] is not None:
        m = mask[..., None]
        forces = (torch.where(m[..., None], new[1][0], old[1][0]), torch.where(m, new[1][1], old[1][1]))
    return results, forces
