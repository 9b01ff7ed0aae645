"""The immutable, flat robot model built once at load time."""

from __future__ import annotations

import dataclasses
import hashlib
import math
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from .._errors import InputError, InputTypeError, InvalidValueError, TopologyError, UnknownNameError
from ._urdf import Geometry, JointSpec, URDFSpec, parse_urdf

__all__ = ["RobotModel", "JointType", "FrameGeometry"]


class JointType:
    """Integer codes of the joint that moves each body (``RobotModel.joint_type``)."""

    ROOT = 0  #: the fixed root body (fixed-base model)
    FREE = 1  #: floating base: 7 coordinates (p, quat wxyz), 6 velocities
    REVOLUTE = 2  #: revolute or continuous: one angle coordinate
    PRISMATIC = 3  #: one translation coordinate

    NAMES = {0: "root", 1: "free", 2: "revolute", 3: "prismatic"}


@dataclass(frozen=True)
class FrameGeometry:
    """A shape attached to a link frame (``kind``, ``params``, pose in the link frame)."""

    link: str
    geometry: Geometry


# Fields that hold tensors, with the float64 master array of each kept for exact
# dtype changes. Physical parameters may be replaced by user tensors.
_TENSOR_FIELDS = (
    "joint_axis",
    "joint_placement",
    "joint_multiplier",
    "joint_offset",
    "frame_placement",
    "body_mass",
    "body_com",
    "body_inertia",
    "lower",
    "upper",
    "velocity_limit",
    "effort_limit",
    "damping",
    "friction",
    "armature",
    "gravity",
    "joint_is_prismatic",
)
_INT_FIELDS = ("parent", "joint_coordinate", "frame_body", "level_inverse")
PHYSICAL_PARAMETERS = ("body_mass", "body_com", "body_inertia", "damping", "friction", "armature", "gravity")


@dataclass(frozen=True, eq=False)
class RobotModel:
    """A rigid-body tree in flat tensors, in topological (depth-first) order.

    Bodies are the rigid bodies that move independently: body 0 is the root
    link (fixed to the world, or on a free joint for a floating base) and every
    moving joint (revolute, continuous, prismatic) starts a new body whose frame
    is the joint's child-link frame. Fixed joints are folded: their child links
    become frames of the body they hang from, and their inertias are merged
    into it. Every URDF link is a named frame (``link_names``).

    Coordinates: ``q = [p_world (3), quat_wxyz (4), joints]`` with a floating
    base, else ``q = joints``; ``v = [v_base (3), omega_base (3), joint rates]``
    with the base twist in the base frame. ``joints`` are the independent joint
    coordinates, in ``joint_names`` order; mimic joints are not coordinates but
    follow ``multiplier * q_leader + offset``.

    Attributes (``nb`` bodies, ``nf`` frames, ``nj`` joint coordinates):
        name: robot name from the URDF.
        floating_base: whether body 0 sits on a free joint.
        body_names: ``(nb,)`` link name of each body frame.
        parent: ``(nb,)`` long, parent body index, ``-1`` for the root.
        joint_type: tuple of :class:`JointType` codes, one per body.
        joint_names: ``(nj,)`` independent joint coordinates, in ``q`` order.
        body_joint_names: joint name that moves each body (``""`` for the root).
        joint_axis: ``(nb, 3)`` unit axis in the joint frame (zero for the root).
        joint_placement: ``(nb, 4, 4)`` parent-body-from-joint pose at ``q = 0``.
        joint_coordinate: ``(nb,)`` long, index in the joint coordinates of the
            coordinate that drives each body (``-1`` for the root).
        joint_multiplier, joint_offset: ``(nb,)`` body joint value is
            ``multiplier * joints[joint_coordinate] + offset`` (1 and 0 except
            for mimic joints).
        link_names: ``(nf,)`` every link, in depth-first order.
        frame_body: ``(nf,)`` long, body each frame belongs to.
        frame_placement: ``(nf, 4, 4)`` body-from-frame pose.
        body_mass: ``(nb,)`` kg. body_com: ``(nb, 3)`` m in the body frame.
        body_inertia: ``(nb, 3, 3)`` kg m^2 about the centre of mass, body axes.
        lower, upper: ``(nj,)`` position limits (``-inf``/``inf`` if unbounded).
        velocity_limit, effort_limit: ``(nj,)`` (``inf`` if not given).
        damping, friction, armature: ``(nj,)`` from ``<dynamics>`` (armature 0).
        gravity: ``(3,)`` m/s^2, default ``(0, 0, -9.81)``.
        joint_is_prismatic: ``(nb,)`` 1.0 for prismatic bodies, else 0.0.
        levels: tuple of long tensors, the body indices at each tree depth.
        level_parent: tuple of long tensors, for level ``d > 0`` the position of
            each body's parent inside level ``d - 1`` (level 0 holds ``[]``).
        level_inverse: ``(nb,)`` long, position of each body in the
            concatenation of ``levels`` (identity when bodies are level-sorted).
        geometries: visual shapes as :class:`FrameGeometry`; collisions likewise.
        fingerprint: hex digest of the kinematic geometry in canonical float64.
    """

    name: str
    floating_base: bool
    body_names: tuple[str, ...]
    body_joint_names: tuple[str, ...]
    joint_type: tuple[int, ...]
    joint_names: tuple[str, ...]
    link_names: tuple[str, ...]
    parent: torch.Tensor
    joint_axis: torch.Tensor
    joint_placement: torch.Tensor
    joint_coordinate: torch.Tensor
    joint_multiplier: torch.Tensor
    joint_offset: torch.Tensor
    frame_body: torch.Tensor
    frame_placement: torch.Tensor
    body_mass: torch.Tensor
    body_com: torch.Tensor
    body_inertia: torch.Tensor
    lower: torch.Tensor
    upper: torch.Tensor
    velocity_limit: torch.Tensor
    effort_limit: torch.Tensor
    damping: torch.Tensor
    friction: torch.Tensor
    armature: torch.Tensor
    gravity: torch.Tensor
    joint_is_prismatic: torch.Tensor
    level_inverse: torch.Tensor
    levels: tuple[torch.Tensor, ...]
    level_parent: tuple[torch.Tensor, ...]
    visuals: tuple[FrameGeometry, ...]
    collisions: tuple[FrameGeometry, ...]
    fingerprint: str
    levels_sorted: bool
    source_path: Path | None = None
    _master: dict = field(default_factory=dict, repr=False)
    _replaced: frozenset = field(default_factory=frozenset, repr=False)

    # ------------------------------------------------------------------ build

    @classmethod
    def from_urdf(
        cls,
        source,
        *,
        floating_base: bool = False,
        dtype: torch.dtype = torch.float64,
        device: torch.device | str = "cpu",
        mimic: bool = True,
        strict: bool = False,
    ) -> RobotModel:
        """Load a URDF (text, bytes or path) into a model.

        The file is parsed in float64 and then cast, so a float64 model is exact.

        Two things are repaired or reported with a :class:`UserWarning` (each
        an error with ``strict=True``):

        * a rotational inertia that is not positive semi-definite by a tiny
          amount (at most 1e-6 of the largest principal moment of any link,
          e.g. TIAGo's 1 mg antenna links) is replaced by the nearest physical
          inertia; the warning names the link and the change;
        * a joint coordinate that moves no mass or inertia (its mass-matrix
          diagonal is zero, so forward dynamics is undefined) is named, with
          the fix ``model.replace(armature=...)`` (not for a model without
          any mass, a kinematics-only description).

        Args:
            source: URDF text (``str`` starting with ``<``, a byte-order mark
                allowed), ``bytes`` or a path. xacro files must be expanded first.
            floating_base: put a free joint (6 degrees of freedom) at the root.
            dtype: ``torch.float32`` or ``torch.float64``.
            device: an available torch device (``"cpu"``, ``"cuda"``, ``"cuda:1"``, ...).
            mimic: model ``<mimic>`` joints as coupled to their leaders (the
                default). ``False`` ignores every ``<mimic>`` tag, so mimic
                joints become independent coordinates, as Pinocchio does
                without ``mimic=True``; the way out for a broken ``<mimic>``.
            strict: refuse, rather than repair or warn about, the two cases above.

        Raises:
            ModelError: a subclass naming the offending element.
            InputError: an unknown or unavailable ``device``, or a ``dtype``
                other than float32/float64.
        """
        dtype = _check_dtype(dtype)
        device = check_device(device)
        spec = parse_urdf(source, strict=strict)
        if not mimic:
            spec = dataclasses.replace(spec, joints=[dataclasses.replace(j, mimic=None) for j in spec.joints])
        master, meta = _build(spec, floating_base)
        model = cls._from_master(master, meta, dtype=dtype, device=device)
        notes = list(spec.notes)
        # A model without any mass is a kinematics-only description (common
        # for IK): only a massive model with massless coordinates is flagged.
        zero = model.zero_inertia_joints() if float(model.body_mass.sum()) > 0 else ()
        if zero:
            msg = _zero_inertia_message(model, zero)
            if strict:
                raise InvalidValueError(msg + "; strict=True refuses such a model")
            notes.append(msg)
        for note in notes:
            warnings.warn(f"robot {model.name!r}: {note}", UserWarning, stacklevel=_caller_stacklevel())
        return model

    @classmethod
    def _from_master(cls, master: dict, meta: dict, *, dtype, device, replaced=None) -> RobotModel:
        dtype = _check_dtype(dtype)
        device = check_device(device)
        values = {}
        for k in _TENSOR_FIELDS:
            if replaced and k in replaced:
                values[k] = replaced[k].to(device=device, dtype=dtype)
            else:
                values[k] = torch.from_numpy(master[k].copy()).to(dtype=dtype, device=device)
        for k in _INT_FIELDS:
            values[k] = torch.from_numpy(master[k].copy()).to(device=device)
        levels = tuple(torch.from_numpy(lv.copy()).to(device=device) for lv in master["levels"])
        level_parent = tuple(
            torch.from_numpy(lp.copy()).to(device=device) for lp in master["level_parent"]
        )
        return cls(
            **meta,
            **values,
            levels=levels,
            level_parent=level_parent,
            _master=master,
            _replaced=frozenset(replaced or ()),
        )

    # ------------------------------------------------------------------ sizes

    @property
    def num_bodies(self) -> int:
        return len(self.body_names)

    @property
    def num_frames(self) -> int:
        return len(self.link_names)

    @property
    def num_joints(self) -> int:
        """Independent joint coordinates (``nq`` and ``nv`` less the floating base)."""
        return len(self.joint_names)

    @property
    def nq(self) -> int:
        return self.num_joints + (7 if self.floating_base else 0)

    @property
    def nv(self) -> int:
        return self.num_joints + (6 if self.floating_base else 0)

    @property
    def dof(self) -> int:
        """Degrees of freedom, equal to ``nv`` (6 of them for a floating base)."""
        return self.nv

    @property
    def dtype(self) -> torch.dtype:
        return self.joint_placement.dtype

    @property
    def device(self) -> torch.device:
        return self.joint_placement.device

    @property
    def total_mass(self) -> torch.Tensor:
        return self.body_mass.sum()

    # ------------------------------------------------------------------ names

    def frame_index(self, name: str) -> int:
        """Index of the link frame ``name`` in ``link_names``.

        Raises:
            UnknownNameError: listing the closest link names.
        """
        try:
            return self.link_names.index(name)
        except ValueError:
            raise UnknownNameError("link", name, self.link_names) from None

    def joint_index(self, name: str) -> int:
        """Index of joint ``name`` among the independent joint coordinates."""
        try:
            return self.joint_names.index(name)
        except ValueError:
            valid = self.joint_names + tuple(n for n in self.body_joint_names if n)
            if name in valid:
                raise UnknownNameError(
                    "joint coordinate", name, self.joint_names, context="(it is a mimic joint)"
                ) from None
            raise UnknownNameError("joint", name, valid) from None

    def body_index(self, name: str) -> int:
        """Index of the body whose frame is link ``name``."""
        try:
            return self.body_names.index(name)
        except ValueError:
            raise UnknownNameError("body", name, self.body_names) from None

    # ------------------------------------------------------------------ copies

    def to(self, device=None, dtype=None) -> RobotModel:
        """A new model on ``device`` with floating tensors in ``dtype``.

        Geometry is re-cast from the float64 master copy, so float32 -> float64
        is exact. Replaced physical parameters are moved with ``Tensor.to``
        (keeping their autograd graph).
        """
        device = self.device if device is None else device
        dtype = self.dtype if dtype is None else dtype
        replaced = {k: getattr(self, k) for k in self._replaced}
        return self._from_master(self._master, self._meta(), dtype=dtype, device=device, replaced=replaced)

    def double(self) -> RobotModel:
        return self.to(dtype=torch.float64)

    def float(self) -> RobotModel:
        return self.to(dtype=torch.float32)

    def replace(self, **params: torch.Tensor) -> RobotModel:
        """A model sharing this topology with some physical parameters replaced.

        Accepts ``body_mass (nb,)``, ``body_com (nb, 3)``, ``body_inertia (nb, 3, 3)``,
        ``damping``, ``friction``, ``armature`` ``(nj,)`` and ``gravity (3,)``;
        the tensors may require grad, so gradients flow to them.

        Values that do not require grad get the loader's checks: finite,
        non-negative masses, damping, friction and armature, symmetric
        positive semi-definite inertias (to 1e-9 of the largest principal
        moment). Values that require grad are not checked: optimisers and
        finite differences (``gradcheck`` at a zero mass or friction) step
        just outside the physical set, where the dynamics stay defined. The
        check reads the values once (one host synchronisation) and is
        skipped inside ``torch.func`` transforms and ``torch.compile``, where
        values cannot be read.

        Raises:
            UnknownNameError: a name that is not a physical parameter.
            InputError: a wrong shape, dtype or device.
            InvalidValueError: a value the loader would refuse (naming the
                parameter and the offending body or joint).
        """
        for k, v in params.items():
            if k not in PHYSICAL_PARAMETERS:
                raise UnknownNameError("physical parameter", k, PHYSICAL_PARAMETERS)
            if not isinstance(v, torch.Tensor):
                v = torch.as_tensor(v, dtype=self.dtype, device=self.device)
                params[k] = v
            ref = getattr(self, k)
            if v.shape != ref.shape:
                raise InputError(f"{k} must have shape {tuple(ref.shape)}, got {tuple(v.shape)}")
            if v.dtype != self.dtype or v.device != self.device:
                raise InputError(
                    f"{k} must be {self.dtype} on {self.device}, got {v.dtype} on {v.device}"
                )
        _check_physical(self, params)
        return dataclasses.replace(self, **params, _replaced=self._replaced | frozenset(params))

    def zero_inertia_joints(self) -> tuple[str, ...]:
        """Joint coordinates that move no mass or inertia (plus no armature).

        Their diagonal entry of the joint-space mass matrix, evaluated at the
        neutral configuration, is zero (at most 1e-12 of the largest), so the
        mass matrix is singular and forward dynamics is undefined (NaN): for
        instance fingers whose links carry no ``<inertial>``. Give them
        armature with ``model.replace(armature=...)``, or give the links
        inertia.

        Returns:
            The names of those coordinates, in ``joint_names`` order (empty
            for a sound model).
        """
        if self.num_joints == 0:
            return ()
        diag = _mass_matrix_diagonal(self) + self.armature.detach().cpu().double().numpy()
        scale = max(float(diag.max()), 0.0)
        bad = diag <= 1e-12 * scale if scale > 0 else np.ones_like(diag, dtype=bool)
        return tuple(n for n, b in zip(self.joint_names, bad.tolist(), strict=True) if b)

    def _meta(self) -> dict:
        return {
            k: getattr(self, k)
            for k in (
                "name", "floating_base", "body_names", "body_joint_names", "joint_type",
                "joint_names", "link_names", "visuals", "collisions", "fingerprint", "levels_sorted",
                "source_path",
            )
        }

    # ------------------------------------------------------------------ checks

    def check_q(self, q: torch.Tensor, name: str = "q") -> None:
        """Raise :class:`InputError` unless ``q`` is ``(..., nq)`` in the model's dtype/device."""
        self.check_vector(q, self.nq, name)

    def check_vector(self, x: torch.Tensor, n: int, name: str) -> None:
        if not isinstance(x, torch.Tensor):
            raise InputError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
        if x.ndim == 0 or x.shape[-1] != n:
            raise InputError(f"{name} must have shape (..., {n}) for robot {self.name!r}, got {tuple(x.shape)}")
        if x.dtype != self.dtype:
            raise dtype_mismatch(name, x.dtype, self.dtype, "the model", "model")
        if x.device != self.device:
            raise InputError(
                f"{name} is on {x.device} but the model is on {self.device}; "
                f"move the input or use model.to(device={str(x.device)!r})"
            )

    def neutral(self) -> torch.Tensor:
        """The neutral configuration ``(nq,)``: zero joints (clamped into limits), identity base."""
        q = torch.zeros(self.nq, dtype=self.dtype, device=self.device)
        nj = self.num_joints
        joints = torch.clamp(q[-nj:] if nj else q[:0], self.lower, self.upper)
        if self.floating_base:
            q = torch.cat([q.new_tensor([0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0]), joints])
        else:
            q = joints
        return q

    def random_q(self, *batch_shape: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """Random configurations ``(*batch_shape, nq)``: joints uniform within their
        limits (in ``[-pi, pi]`` for unbounded ones), a random base pose."""
        lo = torch.where(torch.isfinite(self.lower), self.lower, torch.full_like(self.lower, -math.pi))
        hi = torch.where(torch.isfinite(self.upper), self.upper, torch.full_like(self.upper, math.pi))
        u = torch.rand(*batch_shape, self.num_joints, generator=generator, dtype=self.dtype, device=self.device)
        joints = lo + (hi - lo) * u
        if not self.floating_base:
            return joints
        p = torch.randn(*batch_shape, 3, generator=generator, dtype=self.dtype, device=self.device)
        quat = torch.randn(*batch_shape, 4, generator=generator, dtype=self.dtype, device=self.device)
        quat = quat / quat.norm(dim=-1, keepdim=True)
        quat = quat * torch.where(quat[..., :1] < 0, -1.0, 1.0)
        return torch.cat([p, quat, joints], dim=-1)

    # ------------------------------------------------------------------ text

    def describe(self) -> str:
        """A human-readable tree: joints, types, limits, masses."""
        lines = [
            f"robot {self.name!r}: {self.num_bodies} bodies, {self.num_frames} frames, "
            f"nq={self.nq}, nv={self.nv} ({'floating' if self.floating_base else 'fixed'} base), "
            f"total mass {float(self.total_mass):.4g} kg"
        ]
        children: dict[int, list[int]] = {}
        parent = self.parent.tolist()
        for b, p in enumerate(parent):
            children.setdefault(p, []).append(b)
        frames_of: dict[int, list[str]] = {}
        for f, b in enumerate(self.frame_body.tolist()):
            if self.link_names[f] != self.body_names[b]:
                frames_of.setdefault(b, []).append(self.link_names[f])
        jc = self.joint_coordinate.tolist()
        mult = self.joint_multiplier.tolist()
        off = self.joint_offset.tolist()

        def visit(b: int, depth: int) -> None:
            pad = "  " * depth
            jt = JointType.NAMES[self.joint_type[b]]
            if b == 0:
                desc = f"[{jt}]"
            else:
                jn = self.body_joint_names[b]
                c = jc[b]
                leader = self.joint_names[c]
                if leader != jn:
                    desc = f"{jn} [{jt}, mimic {mult[b]:g} * {leader} + {off[b]:g}]"
                else:
                    lo, hi = float(self.lower[c]), float(self.upper[c])
                    rng = "unbounded" if not math.isfinite(lo) else f"[{lo:.4g}, {hi:.4g}]"
                    desc = (
                        f"{jn} [{jt}, q[{c + (7 if self.floating_base else 0)}], limits {rng}, "
                        f"vel {float(self.velocity_limit[c]):.4g}, effort {float(self.effort_limit[c]):.4g}]"
                    )
            lines.append(f"{pad}{self.body_names[b]} <- {desc}  mass {float(self.body_mass[b]):.4g} kg")
            for fr in frames_of.get(b, []):
                lines.append(f"{pad}  . {fr} (fixed frame)")
            for c in children.get(b, []):
                visit(c, depth + 1)

        visit(0, 0)
        return "\n".join(lines)

    def __repr__(self) -> str:
        return (
            f"RobotModel(name={self.name!r}, nq={self.nq}, nv={self.nv}, bodies={self.num_bodies}, "
            f"frames={self.num_frames}, floating_base={self.floating_base}, dtype={self.dtype}, "
            f"device={self.device})"
        )


_DERIVED: dict = {}


def geometry_constants(model: RobotModel, kind: str, build):
    """Constant tensors derived from a model's geometry, built once per
    ``(kind, geometry, dtype, device)`` by ``build(model)``.

    The key holds the model's fingerprint, a digest of the names, tree, joint
    coupling and kinematic geometry. ``replace`` cannot change any of those (it
    replaces physical parameters only) and ``to`` re-casts from the same float64
    master, so no model can see another's stale tensors. ``build`` must read
    only what the fingerprint covers.
    """
    key = (kind, model.fingerprint, model.dtype, str(model.device))
    value = _DERIVED.get(key)
    if value is None:
        # Plain tensors even when first called under inference mode or no_grad:
        # inference tensors could never take part in a later autograd graph.
        with torch.inference_mode(False), torch.no_grad():
            value = build(model)
        _DERIVED[key] = value
    return value


def _check_dtype(dtype) -> torch.dtype:
    if dtype not in (torch.float32, torch.float64):
        raise InputError(f"dtype must be torch.float32 or torch.float64, got {dtype}")
    return dtype


_FLOAT_DTYPES = (torch.float32, torch.float64)


def dtype_mismatch(name: str, got: torch.dtype, want: torch.dtype, owner: str, var: str) -> InputError:
    """The error for an input of dtype ``got`` where ``owner`` (``var`` in code) computes in ``want``.

    Suggests moving ``owner`` only to a dtype it can hold (float32 or float64);
    for any other dtype (integers, float16, bfloat16, complex) it says to cast
    the input.
    """
    if got in _FLOAT_DTYPES:
        return InputTypeError(
            f"{name} has dtype {got} but {owner} is {want}; cast the input with "
            f"{name}.to({want}) or convert {owner} with {var}.to(dtype={got})"
        )
    return InputTypeError(
        f"{name} has dtype {got}, which backdrive does not compute in (float32 or float64 only); "
        f"cast the input with {name}.to({want}) to match {owner}"
    )


def check_device(device) -> torch.device:
    """``device`` as a :class:`torch.device` that this process can use.

    Raises:
        InputError: naming ``device``: a string torch does not parse
            (``"gpu"``), or a device this build or machine lacks (``"cuda"``
            on a CPU-only build, ``"cuda:3"`` on a machine with one GPU).
    """
    if isinstance(device, torch.device):
        dev = device
    else:
        try:
            dev = torch.device(device)
        except (RuntimeError, TypeError, ValueError) as exc:
            raise InputError(
                f"device {device!r} is not a torch device ({str(exc).splitlines()[0]}); "
                f"available here: {', '.join(_available_devices())}"
            ) from None
    if dev.type == "cpu" or dev.type == "meta":
        return dev
    try:
        torch.empty(0, device=dev)
    except (RuntimeError, AssertionError, ValueError) as exc:
        raise InputError(
            f"device {str(device)!r} is not available here ({str(exc).splitlines()[0]}); "
            f"available: {', '.join(_available_devices())}"
        ) from None
    return dev


def _available_devices() -> list[str]:
    out = ["'cpu'"]
    if torch.cuda.is_available():
        out += [f"'cuda:{i}'" for i in range(torch.cuda.device_count())]
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        out.append("'mps'")
    return out


def _check_physical(model: RobotModel, params: dict) -> None:
    """The loader's value checks for the parameters given to :meth:`RobotModel.replace`.

    Values that require grad are not checked: optimisers and finite
    differences (``gradcheck`` at a zero mass or friction) legitimately step
    just outside the physical set, and the dynamics stay defined there.
    """
    params = {k: v for k, v in params.items() if not v.requires_grad}
    if not params:
        return
    if any(_untraceable(v) for v in params.values()):
        return
    if _physical_ok(params):
        return
    # Something failed: find what, for the message (rare, so plain Python).
    for k, v in params.items():
        v = v.detach().cpu().double()
        names = model.body_names if k.startswith("body_") else model.joint_names
        where = (lambda i: f"{names[i]!r}") if k != "gravity" else (lambda i: "")
        if not torch.isfinite(v).all():
            i = int(torch.nonzero(~torch.isfinite(v.reshape(v.shape[0], -1) if v.ndim else v.reshape(1, 1)))[0, 0])
            raise InvalidValueError(f"replace({k}=...): the value of {where(i) or k} is not finite")
        if k in ("body_mass", "damping", "friction", "armature") and (v < 0).any():
            i = int(torch.nonzero(v < 0)[0, 0])
            kind = "body" if k == "body_mass" else "joint"
            raise InvalidValueError(
                f"replace({k}=...): {kind} {where(i)} has negative {k.replace('body_', '')} {float(v[i]):.6g}; "
                "the loader refuses negative values too"
            )
        if k == "body_inertia":
            sym = (v - v.transpose(-1, -2)).abs().amax(dim=(-1, -2))
            eig = torch.linalg.eigvalsh(0.5 * (v + v.transpose(-1, -2)))
            tol = 1e-9 * eig.abs().amax(dim=-1).clamp_min(1.0)
            for i in range(v.shape[0]):
                if sym[i] > tol[i]:
                    raise InvalidValueError(
                        f"replace(body_inertia=...): the inertia of body {where(i)} is not symmetric "
                        f"(largest asymmetry {float(sym[i]):.3g})"
                    )
                if eig[i].min() < -tol[i]:
                    raise InvalidValueError(
                        f"replace(body_inertia=...): the inertia of body {where(i)} is not positive "
                        f"semi-definite (eigenvalues {[round(float(e), 10) for e in eig[i]]}); "
                        "the loader refuses it too"
                    )


_NONNEGATIVE = ("body_mass", "damping", "friction", "armature")


def _physical_ok(params: dict, numpy_path: bool | None = None) -> bool:
    """Whether every replaced value passes the loader's checks (fast path, no message).

    replace() runs inside optimisation loops and backward passes. CPU tensors
    are checked through numpy views (a few microseconds); other devices by a
    few fused reductions read back once.
    """
    values = {k: v.detach() for k, v in params.items()}
    if numpy_path is None:
        numpy_path = all(v.device.type == "cpu" for v in values.values())
    if numpy_path:
        arrays = {k: v.numpy() for k, v in values.items()}
        if not math.isfinite(sum(float(a.sum()) for a in arrays.values())):  # NaN/inf poison the sum
            return False
        if any(arrays[k].size and arrays[k].min() < 0 for k in _NONNEGATIVE if k in arrays):
            return False
        I = arrays.get("body_inertia")
        if I is not None and I.size:
            eig = np.linalg.eigvalsh(I)  # reads one triangle; the other is compared below
            tol = 1e-9 * np.maximum(np.abs(eig).max(axis=-1), 1.0)
            if (eig[..., 0] < -tol).any() or np.abs(I - np.swapaxes(I, -1, -2)).max() > tol.min():
                return False
        return True
    with torch.no_grad():
        stats = [torch.cat([v.reshape(-1) for v in values.values()]).sum()]  # NaN/inf poison the sum
        nonneg = [values[k].reshape(-1) for k in _NONNEGATIVE if k in values and values[k].numel()]
        if nonneg:
            stats.append(torch.cat(nonneg).amin())
        if "body_inertia" in values and values["body_inertia"].numel():
            inertia = values["body_inertia"]
            eig = torch.linalg.eigvalsh(0.5 * (inertia + inertia.transpose(-1, -2)).nan_to_num())
            tol = 1e-9 * eig.abs().amax(dim=-1).clamp_min(1.0)
            asym = (inertia - inertia.transpose(-1, -2)).abs().amax(dim=(-1, -2))
            stats += [(eig.amin(dim=-1) + tol).amin(), (tol - asym).amin()]
        got = torch.stack([x.to(stats[0].dtype) for x in stats]).tolist()  # one synchronisation
    return math.isfinite(got[0]) and all(x >= 0 for x in got[1:])


def _untraceable(v: torch.Tensor) -> bool:
    """Whether ``v``'s values cannot be read here (torch.func transforms, torch.compile)."""
    compiling = getattr(torch.compiler, "is_compiling", None)
    if compiling is not None and compiling():
        return True
    try:
        return bool(torch._C._functorch.is_functorch_wrapped_tensor(v))
    except AttributeError:  # pragma: no cover - older torch
        return False


def _mass_matrix_diagonal(model: RobotModel) -> np.ndarray:
    """``(nj,)`` diagonal of the joint-space mass matrix at the neutral configuration,
    without armature, in float64 (numpy; a load-time check, not a hot path).

    Entry ``c`` is twice the kinetic energy at unit velocity of coordinate
    ``c`` alone: the bodies it drives (mimic followers with their multiplier)
    move with the sum of their joints' world twists, and each body adds
    ``m |v_com|^2 + w^T I_c w``.
    """
    def np64(t):
        return t.detach().cpu().double().numpy()

    parent = model.parent.tolist()
    coord = model.joint_coordinate.tolist()
    mult = np64(model.joint_multiplier)
    offset = np64(model.joint_offset)
    axis = np64(model.joint_axis)
    place = np64(model.joint_placement)
    prism = np64(model.joint_is_prismatic)
    mass, com, inertia = np64(model.body_mass), np64(model.body_com), np64(model.body_inertia)
    q0 = np.clip(np.zeros(model.num_joints), np64(model.lower), np64(model.upper))
    nb, nj = model.num_bodies, model.num_joints
    T = np.zeros((nb, 4, 4))
    twist = np.zeros((nb, 6))  # world twist of each body's joint axis, [v at origin; w]
    for b in range(nb):
        if parent[b] < 0:
            T[b] = np.eye(4)
            continue
        theta = mult[b] * q0[coord[b]] + offset[b]
        J = np.eye(4)
        a = axis[b]
        if prism[b]:
            J[:3, 3] = a * theta
        else:
            K = np.array([[0, -a[2], a[1]], [a[2], 0, -a[0]], [-a[1], a[0], 0]])
            J[:3, :3] = np.eye(3) + math.sin(theta) * K + (1 - math.cos(theta)) * K @ K
        T[b] = T[parent[b]] @ place[b] @ J
        R, p = T[b][:3, :3], T[b][:3, 3]
        w = R @ a
        twist[b] = np.concatenate([R @ a, np.zeros(3)]) if prism[b] else np.concatenate([np.cross(p, w), w])
    diag = np.zeros(nj)
    V = np.zeros((nb, nj, 6))  # world twist of each body per unit rate of each coordinate
    for b in range(nb):
        if parent[b] >= 0:
            V[b] = V[parent[b]]
            V[b, coord[b]] += mult[b] * twist[b]
        R, p = T[b][:3, :3], T[b][:3, 3]
        cw = p + R @ com[b]
        v, w = V[b, :, :3], V[b, :, 3:]
        vc = v + np.cross(w, cw)
        diag += mass[b] * np.einsum("ci,ci->c", vc, vc) + np.einsum("ci,ij,cj->c", w, R @ inertia[b] @ R.T, w)
    return diag


def _caller_stacklevel() -> int:
    """The ``stacklevel`` that makes a warning point at the first frame outside backdrive."""
    import sys

    package = str(Path(__file__).resolve().parents[1])
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_code.co_filename.startswith(package):
        frame, level = frame.f_back, level + 1
    return level


def _zero_inertia_message(model: RobotModel, names: tuple[str, ...]) -> str:
    shown = ", ".join(repr(n) for n in names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")
    return (
        f"{len(names)} joint coordinate{'s' * (len(names) > 1)} move{'s' * (len(names) == 1)} no mass or "
        f"inertia ({shown}): the mass matrix is singular and forward dynamics will be NaN; give them "
        "armature, e.g. model.replace(armature=torch.where(zero, 1e-3, model.armature)) with zero marking "
        "model.zero_inertia_joints(), or give their links <inertial>"
    )


# ---------------------------------------------------------------------- tree building


def _combine_inertia(parts):
    """Merge ``(mass, com (3,), inertia_at_com (3,3))`` parts expressed in one frame."""
    mass = sum(m for m, _, _ in parts)
    if mass <= 0.0:
        return 0.0, np.zeros(3), sum((I for _, _, I in parts), np.zeros((3, 3)))
    com = sum(m * c for m, c, _ in parts) / mass
    inertia = np.zeros((3, 3))
    for m, c, I in parts:
        d = c - com
        inertia += I + m * (np.dot(d, d) * np.eye(3) - np.outer(d, d))
    return mass, com, inertia


def _build(spec: URDFSpec, floating_base: bool):
    links, joints = spec.links, spec.joints
    parent_joint: dict[str, JointSpec] = {}
    children: dict[str, list[JointSpec]] = {name: [] for name in links}
    for j in joints:
        if j.child in parent_joint:
            raise TopologyError(
                f"link {j.child!r} has two parents: joints {parent_joint[j.child].name!r} "
                f"and {j.name!r}"
            )
        parent_joint[j.child] = j
        children[j.parent].append(j)
    roots = [n for n in links if n not in parent_joint]
    if not roots:
        raise TopologyError("the joints form a cycle: every link has a parent, so there is no root link")
    if len(roots) > 1:
        raise TopologyError(
            f"the URDF has {len(roots)} root links (links without a parent joint): "
            f"{', '.join(repr(r) for r in roots[:8])}; a robot must be one tree"
        )
    root = roots[0]

    # Depth-first traversal (children in file order), as Pinocchio orders joints.
    body_names = [root]
    body_joint = [None]
    body_parent = [-1]
    body_depth = [0]
    link_body = {root: 0}
    link_T = {root: np.eye(4)}  # body-from-link
    link_order = [root]
    stack = [(root, iter(children[root]))]
    visited = {root}
    while stack:
        link, it = stack[-1]
        j = next(it, None)
        if j is None:
            stack.pop()
            continue
        c = j.child
        if c in visited:  # pragma: no cover - excluded by the two-parents check
            raise TopologyError(f"joint {j.name!r} closes a cycle at link {c!r}")
        visited.add(c)
        pb = link_body[link]
        T = link_T[link] @ j.origin
        if j.type == "fixed":
            link_body[c] = pb
            link_T[c] = T
        else:
            body_names.append(c)
            body_joint.append(j)
            body_parent.append(pb)
            body_depth.append(body_depth[pb] + 1)
            link_body[c] = len(body_names) - 1
            link_T[c] = np.eye(4)
        link_order.append(c)
        stack.append((c, iter(children[c])))
    unreached = [n for n in links if n not in visited]
    if unreached:
        raise TopologyError(
            f"links {', '.join(repr(n) for n in unreached[:8])} are not connected to the root "
            f"{root!r}: their joints form a cycle"
        )

    nb = len(body_names)
    # Joint placements: parent-body-from-joint = body-from-parent-link @ origin.
    placement = np.tile(np.eye(4), (nb, 1, 1))
    axis = np.zeros((nb, 3))
    jtype = [JointType.FREE if floating_base else JointType.ROOT]
    for b in range(1, nb):
        j = body_joint[b]
        placement[b] = link_T[j.parent] @ j.origin
        axis[b] = j.axis
        jtype.append(JointType.PRISMATIC if j.type == "prismatic" else JointType.REVOLUTE)

    # Independent coordinates and mimic coupling.
    by_name = {body_joint[b].name: b for b in range(1, nb)}
    fixed_names = {j.name for j in joints if j.type == "fixed"}
    all_joint_names = [j.name for j in joints]
    joint_names: list[str] = []
    coord_of: dict[int, int] = {}
    for b in range(1, nb):
        if body_joint[b].mimic is None:
            coord_of[b] = len(joint_names)
            joint_names.append(body_joint[b].name)
    coordinate = np.full(nb, -1, dtype=np.int64)
    multiplier = np.ones(nb)
    offset = np.zeros(nb)
    for b in range(1, nb):
        j = body_joint[b]
        mult, off, seen, cur = 1.0, 0.0, [j.name], j
        while cur.mimic is not None:
            leader, m, o = cur.mimic
            if leader not in by_name:
                if leader in fixed_names:
                    raise InvalidValueError(
                        f"joint {cur.name!r} <mimic>: leader {leader!r} is a fixed joint; "
                        "mimic=False ignores every <mimic> tag"
                    )
                raise UnknownNameError(
                    "joint",
                    leader,
                    all_joint_names,
                    context=f"(mimic leader of joint {cur.name!r}; mimic=False ignores every <mimic> tag)",
                )
            if leader in seen:
                raise TopologyError(
                    f"mimic joints form a cycle: {' -> '.join(seen + [leader])}; mimic=False ignores every <mimic> tag"
                )
            seen.append(leader)
            mult, off = mult * m, off * m + o
            cur = body_joint[by_name[leader]]
        coordinate[b] = coord_of[by_name[cur.name]]
        multiplier[b] = mult
        offset[b] = off
        if (j.type == "prismatic") != (cur.type == "prismatic"):
            raise InvalidValueError(
                f"joint {j.name!r} ({j.type}) mimics {cur.name!r} ({cur.type}): "
                "a mimic must have the same kind of motion as its leader; mimic=False ignores every <mimic> tag"
            )

    # Inertias: fold every link into its body.
    parts: dict[int, list] = {b: [] for b in range(nb)}
    for ln in link_order:
        L = links[ln]
        T = link_T[ln]
        R, p = T[:3, :3], T[:3, 3]
        parts[link_body[ln]].append((L.mass, R @ L.com + p, R @ L.inertia @ R.T))
    mass = np.zeros(nb)
    com = np.zeros((nb, 3))
    inertia = np.zeros((nb, 3, 3))
    for b in range(nb):
        mass[b], com[b], inertia[b] = _combine_inertia(parts[b])

    # Per-coordinate limits and joint dynamics.
    nj = len(joint_names)
    lim = {k: np.zeros(nj) for k in ("lower", "upper", "velocity_limit", "effort_limit", "damping", "friction")}
    for name in joint_names:
        j = body_joint[by_name[name]]
        c = joint_names.index(name)
        lim["lower"][c], lim["upper"][c] = j.lower, j.upper
        lim["velocity_limit"][c], lim["effort_limit"][c] = j.velocity, j.effort
        lim["damping"][c], lim["friction"][c] = j.damping, j.friction

    # Frames: every link, in traversal order.
    frame_body = np.array([link_body[ln] for ln in link_order], dtype=np.int64)
    frame_placement = np.stack([link_T[ln] for ln in link_order])

    # Depth-level schedule.
    max_depth = max(body_depth)
    levels = [[b for b in range(nb) if body_depth[b] == d] for d in range(max_depth + 1)]
    level_parent = [np.zeros(0, dtype=np.int64)]
    for d in range(1, max_depth + 1):
        prev = levels[d - 1]
        level_parent.append(np.array([prev.index(body_parent[b]) for b in levels[d]], dtype=np.int64))

    def geoms(kind):
        return tuple(FrameGeometry(ln, g) for ln in link_order for g in getattr(links[ln], kind))

    order = np.concatenate(levels).astype(np.int64)
    level_inverse = np.empty(nb, dtype=np.int64)
    level_inverse[order] = np.arange(nb)

    master = {
        "parent": np.array(body_parent, dtype=np.int64),
        "joint_is_prismatic": np.array([float(t == JointType.PRISMATIC) for t in jtype]),
        "level_inverse": level_inverse,
        "joint_axis": axis,
        "joint_placement": placement,
        "joint_coordinate": coordinate,
        "joint_multiplier": multiplier,
        "joint_offset": offset,
        "frame_body": frame_body,
        "frame_placement": frame_placement,
        "body_mass": mass,
        "body_com": com,
        "body_inertia": inertia,
        **lim,
        "armature": np.zeros(nj),
        "gravity": np.array([0.0, 0.0, -9.81]),
        "levels": [np.array(lv, dtype=np.int64) for lv in levels],
        "level_parent": level_parent,
    }
    for k, v in master.items():
        if isinstance(v, np.ndarray):
            v.setflags(write=False)
    meta = {
        "name": spec.name,
        "floating_base": bool(floating_base),
        "body_names": tuple(body_names),
        "body_joint_names": tuple("" if j is None else j.name for j in body_joint),
        "joint_type": tuple(jtype),
        "joint_names": tuple(joint_names),
        "link_names": tuple(link_order),
        "visuals": geoms("visuals"),
        "collisions": geoms("collisions"),
        "source_path": spec.source_path,
        "levels_sorted": bool(np.array_equal(order, np.arange(nb))),
    }
    meta["fingerprint"] = _fingerprint(master, meta)
    return master, meta


def _fingerprint(master: dict, meta: dict) -> str:
    h = hashlib.sha256()
    for k in ("name", "floating_base", "body_names", "joint_type", "joint_names", "link_names"):
        h.update(repr(meta[k]).encode())
    for k in (
        "parent", "joint_axis", "joint_placement", "joint_coordinate", "joint_multiplier",
        "joint_offset", "frame_body", "frame_placement",
    ):
        arr = np.ascontiguousarray(master[k])
        h.update(k.encode())
        h.update(arr.astype("<i8" if arr.dtype.kind == "i" else "<f8").tobytes())
    return h.hexdigest()
