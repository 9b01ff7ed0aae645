"""URDF text to a plain, validated float64 description (no torch here).

The parser is strict where a silent guess would give a wrong robot (numbers,
tree structure, joint types) and lenient where the URDF specification gives a
default (missing ``<origin>``, ``<axis>``, ``<inertial>``, ``<dynamics>``).
Everything is parsed in float64; casting happens later in :class:`RobotModel`.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .._errors import (
    InvalidValueError,
    TopologyError,
    UnknownNameError,
    UnsupportedJointError,
    URDFParseError,
)

__all__ = ["Geometry", "LinkSpec", "JointSpec", "URDFSpec", "parse_urdf", "read_source"]

SUPPORTED_JOINTS = ("revolute", "continuous", "prismatic", "fixed")
REJECTED_JOINTS = ("planar", "floating")


@dataclass(frozen=True)
class Geometry:
    """One visual or collision shape of a link.

    Attributes:
        kind: ``"box"``, ``"sphere"``, ``"cylinder"`` or ``"mesh"``.
        params: box ``(sx, sy, sz)``; sphere ``(r,)``; cylinder ``(r, length)``
            along the local z axis; mesh ``(scale_x, scale_y, scale_z)``.
        origin: ``(4, 4)`` float64 pose of the shape in its link frame.
        filename: mesh file name as written in the URDF (``None`` otherwise).
        rgba: colour from ``<material>`` if given, else ``None``.
        material: the material name, if any.
    """

    kind: str
    params: tuple[float, ...]
    origin: np.ndarray = field(repr=False)
    filename: str | None = None
    rgba: tuple[float, float, float, float] | None = None
    material: str | None = None


@dataclass(frozen=True)
class LinkSpec:
    name: str
    mass: float
    com: np.ndarray  # (3,) in the link frame
    inertia: np.ndarray  # (3, 3) about the COM, axes of the link frame
    visuals: tuple[Geometry, ...]
    collisions: tuple[Geometry, ...]


@dataclass(frozen=True)
class JointSpec:
    name: str
    type: str
    parent: str
    child: str
    origin: np.ndarray  # (4, 4) parent-link-from-joint
    axis: np.ndarray  # (3,) unit, joint frame
    lower: float
    upper: float
    velocity: float
    effort: float
    damping: float
    friction: float
    mimic: tuple[str, float, float] | None  # (leader, multiplier, offset)


@dataclass(frozen=True)
class URDFSpec:
    name: str
    links: dict[str, LinkSpec]
    joints: list[JointSpec]
    source_path: Path | None


# --------------------------------------------------------------------------- reading


_XML_DECL = re.compile(r"^\s*<\?xml[^>]*\?>", re.S)


def read_source(source) -> tuple[str | bytes, Path | None]:
    """Return ``(xml, path)`` for URDF text, bytes or a file path."""
    if isinstance(source, bytes | bytearray):
        return bytes(source), None
    if isinstance(source, os.PathLike):
        path = Path(source)
    elif isinstance(source, str):
        if source.lstrip().startswith("<"):
            # A str is already decoded: drop the declaration so that its
            # encoding="..." cannot disagree with the text we hold.
            return _XML_DECL.sub("", source, count=1), None
        path = Path(source)
    else:
        raise URDFParseError(
            f"URDF source must be text, bytes or a path, got {type(source).__name__}"
        )
    if not path.is_file():
        raise URDFParseError(f"URDF file not found: {str(path)!r}")
    return path.read_bytes(), path


def _parse_xml(xml: str | bytes):
    import xml.etree.ElementTree as ET

    import defusedxml
    import defusedxml.ElementTree as DET

    try:
        return DET.fromstring(xml, forbid_dtd=False, forbid_entities=True, forbid_external=True)
    except defusedxml.DefusedXmlException as exc:
        raise URDFParseError(
            f"forbidden XML feature in URDF ({type(exc).__name__}: {exc}); "
            "entity declarations and external references are not accepted"
        ) from None
    except ET.ParseError as exc:
        raise URDFParseError(f"malformed URDF XML: {exc}") from None
    except (ValueError, UnicodeError) as exc:
        raise URDFParseError(f"malformed URDF XML: {exc}") from None


# --------------------------------------------------------------------------- numbers


def _floats(text: str | None, n: int, where: str, attr: str, default=None) -> np.ndarray:
    if text is None:
        if default is None:
            raise InvalidValueError(f"{where}: missing attribute {attr!r}")
        return np.asarray(default, dtype=np.float64)
    parts = text.split()
    if len(parts) != n:
        raise InvalidValueError(
            f"{where}: attribute {attr}={text!r} must hold {n} number{'s' * (n > 1)}, got {len(parts)}"
        )
    try:
        values = np.array([float(p) for p in parts], dtype=np.float64)
    except ValueError:
        raise InvalidValueError(f"{where}: attribute {attr}={text!r} is not a number list") from None
    if not np.all(np.isfinite(values)):
        raise InvalidValueError(f"{where}: attribute {attr}={text!r} is not finite")
    return values


def _float(elem, attr: str, where: str, default: float | None = None, allow_inf=False) -> float:
    text = elem.get(attr) if elem is not None else None
    if text is None:
        if default is None:
            raise InvalidValueError(f"{where}: missing attribute {attr!r}")
        return float(default)
    try:
        value = float(text)
    except ValueError:
        raise InvalidValueError(f"{where}: attribute {attr}={text!r} is not a number") from None
    if math.isnan(value) or (math.isinf(value) and not allow_inf):
        raise InvalidValueError(f"{where}: attribute {attr}={text!r} is not finite")
    return value


def rpy_matrix(rpy: np.ndarray) -> np.ndarray:
    """URDF roll-pitch-yaw (fixed axes X, Y, Z): ``Rz(yaw) @ Ry(pitch) @ Rx(roll)``."""
    r, p, y = rpy
    cr, sr, cp, sp, cy, sy = math.cos(r), math.sin(r), math.cos(p), math.sin(p), math.cos(y), math.sin(y)
    return np.array(
        [
            [cy * cp, cy * sp * sr - sy * cr, cy * sp * cr + sy * sr],
            [sy * cp, sy * sp * sr + cy * cr, sy * sp * cr - cy * sr],
            [-sp, cp * sr, cp * cr],
        ],
        dtype=np.float64,
    )


def _origin(elem, where: str) -> np.ndarray:
    T = np.eye(4)
    o = elem.find("origin") if elem is not None else None
    if o is None:
        return T
    where = f"{where} <origin>"
    T[:3, 3] = _floats(o.get("xyz"), 3, where, "xyz", default=(0.0, 0.0, 0.0))
    T[:3, :3] = rpy_matrix(_floats(o.get("rpy"), 3, where, "rpy", default=(0.0, 0.0, 0.0)))
    return T


# --------------------------------------------------------------------------- links


def _geometry(elem, where: str, materials: dict) -> Geometry | None:
    g = elem.find("geometry")
    if g is None or len(g) == 0:
        raise InvalidValueError(f"{where}: missing <geometry> shape")
    shape = g[0]
    kind = shape.tag
    origin = _origin(elem, where)
    w = f"{where} <{kind}>"
    if kind == "box":
        params = tuple(_floats(shape.get("size"), 3, w, "size"))
    elif kind == "sphere":
        params = (_float(shape, "radius", w),)
    elif kind == "cylinder" or kind == "capsule":
        params = (_float(shape, "radius", w), _float(shape, "length", w))
        kind = "cylinder"
    elif kind == "mesh":
        fn = shape.get("filename")
        if not fn:
            raise InvalidValueError(f"{w}: missing attribute 'filename'")
        params = tuple(_floats(shape.get("scale"), 3, w, "scale", default=(1.0, 1.0, 1.0)))
        rgba, mat = _material(elem, where, materials)
        return Geometry("mesh", params, origin, fn, rgba, mat)
    else:
        raise InvalidValueError(
            f"{where}: unknown geometry <{kind}>; valid: box, sphere, cylinder, mesh"
        )
    if any(v < 0 for v in params):
        raise InvalidValueError(f"{w}: negative size {params}")
    rgba, mat = _material(elem, where, materials)
    return Geometry(kind, params, origin, None, rgba, mat)


def _material(elem, where: str, materials: dict):
    m = elem.find("material")
    if m is None:
        return None, None
    name = m.get("name")
    c = m.find("color")
    if c is not None:
        rgba = tuple(float(x) for x in _floats(c.get("rgba"), 4, f"{where} <color>", "rgba"))
        return rgba, name
    return materials.get(name), name


def _link(elem, materials: dict) -> LinkSpec:
    name = elem.get("name")
    where = f"link {name!r}"
    mass, com, inertia = 0.0, np.zeros(3), np.zeros((3, 3))
    inertial = elem.find("inertial")
    if inertial is not None:
        m = inertial.find("mass")
        if m is None:
            raise InvalidValueError(f"{where} <inertial>: missing <mass>")
        mass = _float(m, "value", f"{where} <mass>")
        if mass < 0:
            raise InvalidValueError(f"{where} <mass>: negative mass {mass}")
        T = _origin(inertial, f"{where} <inertial>")
        com = T[:3, 3].copy()
        i = inertial.find("inertia")
        if i is None:
            raise InvalidValueError(f"{where} <inertial>: missing <inertia>")
        wi = f"{where} <inertia>"
        ixx, ixy, ixz, iyy, iyz, izz = (_float(i, a, wi) for a in ("ixx", "ixy", "ixz", "iyy", "iyz", "izz"))
        I_local = np.array([[ixx, ixy, ixz], [ixy, iyy, iyz], [ixz, iyz, izz]])
        R = T[:3, :3]
        inertia = R @ I_local @ R.T
        eig = np.linalg.eigvalsh(I_local)
        tol = 1e-9 * max(1.0, float(np.abs(eig).max()))
        if eig.min() < -tol:
            raise InvalidValueError(
                f"{wi}: rotational inertia is not positive semi-definite "
                f"(eigenvalues {np.array2string(eig, precision=4)})"
            )
    visuals = tuple(_geometry(v, f"{where} <visual>", materials) for v in elem.findall("visual"))
    collisions = tuple(
        _geometry(c, f"{where} <collision>", materials) for c in elem.findall("collision")
    )
    return LinkSpec(name, mass, com, inertia, visuals, collisions)


# --------------------------------------------------------------------------- joints


def _joint(elem, links: dict[str, LinkSpec]) -> JointSpec:
    name = elem.get("name")
    where = f"joint {name!r}"
    jtype = elem.get("type")
    if jtype is None:
        raise UnsupportedJointError(f"{where}: missing attribute 'type'; valid: {', '.join(SUPPORTED_JOINTS)}")
    if jtype in REJECTED_JOINTS:
        raise UnsupportedJointError(
            f"{where}: joint type {jtype!r} is not supported inside the tree "
            f"(supported: {', '.join(SUPPORTED_JOINTS)}; a free root joint comes from "
            "RobotModel.from_urdf(..., floating_base=True))"
        )
    if jtype not in SUPPORTED_JOINTS:
        raise UnsupportedJointError(
            f"{where}: unknown joint type {jtype!r}; valid: {', '.join(SUPPORTED_JOINTS)}"
        )
    ends = {}
    for tag in ("parent", "child"):
        e = elem.find(tag)
        if e is None or not e.get("link"):
            raise TopologyError(f"{where}: missing <{tag} link=...>")
        ln = e.get("link")
        if ln not in links:
            raise UnknownNameError("link", ln, links, context=f"({where} <{tag}>)")
        ends[tag] = ln
    if ends["parent"] == ends["child"]:
        raise TopologyError(f"{where}: parent and child are the same link {ends['parent']!r}")
    origin = _origin(elem, where)
    axis = np.array([1.0, 0.0, 0.0])
    a = elem.find("axis")
    if a is not None and jtype != "fixed":
        axis = _floats(a.get("xyz"), 3, f"{where} <axis>", "xyz", default=(1.0, 0.0, 0.0))
        norm = float(np.linalg.norm(axis))
        if norm < 1e-12:
            raise InvalidValueError(f"{where} <axis>: zero-length axis {a.get('xyz')!r}")
        axis = axis / norm
    lower, upper, velocity, effort = -math.inf, math.inf, math.inf, math.inf
    lim = elem.find("limit")
    wl = f"{where} <limit>"
    if jtype in ("revolute", "prismatic"):
        if lim is None:
            raise InvalidValueError(f"{where}: a {jtype} joint needs a <limit> element")
        lower = _float(lim, "lower", wl, default=0.0)
        upper = _float(lim, "upper", wl, default=0.0)
        if lower > upper:
            raise InvalidValueError(f"{wl}: lower={lower} is above upper={upper}")
    if lim is not None and jtype != "fixed":
        velocity = _float(lim, "velocity", wl, default=math.inf, allow_inf=True)
        effort = _float(lim, "effort", wl, default=math.inf, allow_inf=True)
        if velocity < 0 or effort < 0:
            raise InvalidValueError(f"{wl}: negative velocity or effort limit")
    dyn = elem.find("dynamics")
    wd = f"{where} <dynamics>"
    damping = _float(dyn, "damping", wd, default=0.0)
    friction = _float(dyn, "friction", wd, default=0.0)
    if damping < 0 or friction < 0:
        raise InvalidValueError(f"{wd}: damping and friction must be non-negative")
    mimic = None
    m = elem.find("mimic")
    if m is not None and jtype != "fixed":
        leader = m.get("joint")
        if not leader:
            raise InvalidValueError(f"{where} <mimic>: missing attribute 'joint'")
        mimic = (
            leader,
            _float(m, "multiplier", f"{where} <mimic>", default=1.0),
            _float(m, "offset", f"{where} <mimic>", default=0.0),
        )
    return JointSpec(
        name, jtype, ends["parent"], ends["child"], origin, axis,
        lower, upper, velocity, effort, damping, friction, mimic,
    )


# --------------------------------------------------------------------------- robot


def parse_urdf(source) -> URDFSpec:
    """Parse URDF text, bytes or a path into a validated :class:`URDFSpec`.

    Raises:
        URDFParseError, TopologyError, UnsupportedJointError, InvalidValueError,
        UnknownNameError: each naming the offending element.
    """
    xml, path = read_source(source)
    root = _parse_xml(xml)
    if root.tag != "robot":
        raise URDFParseError(f"URDF root element must be <robot>, got <{root.tag}>")
    materials = {}
    for m in root.findall("material"):
        c = m.find("color")
        if m.get("name") and c is not None:
            materials[m.get("name")] = tuple(
                float(x) for x in _floats(c.get("rgba"), 4, f"material {m.get('name')!r}", "rgba")
            )
    links: dict[str, LinkSpec] = {}
    for e in root.findall("link"):
        name = e.get("name")
        if not name:
            raise TopologyError("a <link> has no name attribute")
        if name in links:
            raise TopologyError(f"link {name!r} is defined twice")
        links[name] = _link(e, materials)
    if not links:
        raise TopologyError("URDF has no <link>")
    joints: list[JointSpec] = []
    seen: set[str] = set()
    for e in root.findall("joint"):
        name = e.get("name")
        if not name:
            raise TopologyError("a <joint> has no name attribute")
        if name in seen:
            raise TopologyError(f"joint {name!r} is defined twice")
        seen.add(name)
        joints.append(_joint(e, links))
    return URDFSpec(root.get("name") or "robot", links, joints, path)
