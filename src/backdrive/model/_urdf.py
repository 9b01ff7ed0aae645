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
import dataclasses
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

__all__ = ["Geometry", "LinkSpec", "JointSpec", "URDFSpec", "parse_urdf", "read_source", "nearest_physical_inertia"]

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
    notes: tuple[str, ...] = ()  # repairs made while parsing, one message each


# --------------------------------------------------------------------------- reading


_XML_DECL = re.compile(r"^\s*<\?xml[^>]*\?>", re.S)
_BOM = "\ufeff"
_XACRO_NAMESPACES = ("{http://www.ros.org/wiki/xacro}", "{http://ros.org/wiki/xacro}")
_XACRO_HINT = (
    "xacro must be expanded to plain URDF first: run `xacro {name} > robot.urdf` "
    "(ROS's xacro package, also on PyPI as `xacro`) and load the result"
)


def read_source(source) -> tuple[str | bytes, Path | None]:
    """Return ``(xml, path)`` for URDF text, bytes or a file path.

    A ``str`` is URDF text when it starts with ``<`` (after a byte-order mark
    and white space) or contains ``<robot``; any other ``str`` is a path.

    Raises:
        URDFParseError: an empty source, a directory, a path that does not
            exist (naming the robot to ``load`` when the text is a robot
            name), or a source of another type.
    """
    if isinstance(source, bytes | bytearray):
        if not bytes(source).strip():
            raise URDFParseError("URDF source is empty bytes (no XML)")
        return bytes(source), None
    if isinstance(source, os.PathLike):
        path = Path(source)
    elif isinstance(source, str):
        text = source.lstrip(_BOM + " \t\r\n")
        if text.startswith("<") or "<robot" in text:
            # A str is already decoded: drop the declaration so that its
            # encoding="..." cannot disagree with the text we hold.
            return _XML_DECL.sub("", text, count=1), None
        if not text:
            raise URDFParseError(
                "URDF source is an empty string; pass URDF text, bytes or the path of a .urdf file"
            )
        path = Path(source).expanduser()  # "~/robot.urdf" as a shell would
    else:
        raise URDFParseError(
            f"URDF source must be text, bytes or a path, got {type(source).__name__}"
        )
    try:
        if path.is_dir():
            found = sorted(p.name for p in path.glob("*.urdf"))[:8]
            inside = f"; URDF files in it: {', '.join(found)}" if found else ""
            raise URDFParseError(f"{str(path)!r} is a directory, not a URDF file{inside}")
        if not path.is_file():
            raise URDFParseError(_not_found(path))
        return path.read_bytes(), path
    except OSError as exc:
        # e.g. a name too long for the file system, or no permission to read
        raise URDFParseError(f"cannot read URDF file {str(path)[:200]!r}: {exc.strerror or exc}") from None


def _not_found(path: Path) -> str:
    """The message for a path that does not exist, with the likely intent."""
    name = str(path)
    msg = f"URDF file not found: {name!r}"
    if not path.is_absolute():
        msg += f" (relative to the working directory {os.getcwd()!r})"
    if path.suffix == ".xacro" or name.endswith(".urdf.xacro"):
        return msg
    if len(path.parts) == 1:
        # A bare robot name: say how to load it by name (imported here because
        # backdrive.data sits above the model in the layer list).
        from ..data._example_robot_data import EXAMPLE_ROBOTS
        from ..data._shipped import SHIPPED_ROBOTS

        short = path.name.removesuffix(".urdf")
        if short in SHIPPED_ROBOTS:
            return msg + f"; {short!r} is a robot shipped with backdrive: backdrive.data.load({short!r})"
        if short in EXAMPLE_ROBOTS:
            return (
                msg + f"; {short!r} is a model of the example-robot-data package: "
                f"backdrive.data.load('example-robot-data:{short}')"
            )
    return msg


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
        hint = ""
        if "unbound prefix" in str(exc) and ("xacro" in xml if isinstance(xml, str) else b"xacro" in xml):
            hint = "; the file uses xacro: " + _XACRO_HINT.format(name="robot.urdf.xacro")
        raise URDFParseError(f"malformed URDF XML: {exc}{hint}") from None
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
        # Positive semi-definiteness is checked in parse_urdf, which knows the
        # robot's scale: a tiny violation is repaired with a warning.
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


def _psd_violation(I: np.ndarray) -> float:
    """How far the smallest principal moment is below zero, beyond rounding (0 if none)."""
    eig = np.linalg.eigvalsh(I)
    tol = 1e-9 * max(1.0, float(np.abs(eig).max()))
    return float(-eig.min()) if eig.min() < -tol else 0.0


#: A violation is "tiny", and repaired, when the most negative principal moment
#: is at most this fraction of the largest principal moment of any link.
INERTIA_REPAIR_RATIO = 1e-6


def nearest_physical_inertia(I: np.ndarray) -> np.ndarray:
    """The physical rotational inertia closest to ``I (3, 3)`` in the Frobenius norm
    among those with the same principal axes.

    A rigid body's principal moments are ``lambda_i = d_j + d_k`` with
    ``d_i = integral of x_i^2 dm >= 0`` (so they are non-negative and obey the
    triangle inequality). The moments are projected onto that cone: a
    non-negative least-squares problem in the three ``d``, solved exactly by
    trying every set of active constraints.
    """
    lam, V = np.linalg.eigh(I)
    A = np.array([[0.0, 1.0, 1.0], [1.0, 0.0, 1.0], [1.0, 1.0, 0.0]])
    best, best_err = np.zeros(3), float(np.sum(lam**2))
    for mask in range(1, 8):
        free = [i for i in range(3) if mask >> i & 1]
        d = np.zeros(3)
        d[free] = np.linalg.lstsq(A[:, free], lam, rcond=None)[0]
        if d.min() < 0:
            continue
        err = float(np.sum((A @ d - lam) ** 2))
        if err < best_err:
            best, best_err = d, err
    moments = A @ best
    return (V * moments) @ V.T


def parse_urdf(source, *, strict: bool = False) -> URDFSpec:
    """Parse URDF text, bytes or a path into a validated :class:`URDFSpec`.

    Args:
        source: URDF text, bytes or a path (see :func:`read_source`).
        strict: refuse a rotational inertia that is not positive
            semi-definite even when the violation is tiny.

    Returns:
        The spec. ``spec.notes`` lists the repairs made (one message each),
        for the caller to warn about.

    Raises:
        URDFParseError, TopologyError, UnsupportedJointError, InvalidValueError,
        UnknownNameError: each naming the offending element.
    """
    xml, path = read_source(source)
    root = _parse_xml(xml)
    _refuse_xacro(root, path)
    if root.tag != "robot":
        hint = {
            "mujoco": " (an MJCF file: backdrive reads URDF only)",
            "sdf": " (an SDF file: backdrive reads URDF only)",
        }.get(root.tag, "")
        raise URDFParseError(f"URDF root element must be <robot>, got <{root.tag}>{hint}")
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
    notes = _repair_inertias(links, strict)
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
    return URDFSpec(root.get("name") or "robot", links, joints, path, tuple(notes))


def _refuse_xacro(root, path: Path | None) -> None:
    """Raise :class:`URDFParseError` if the document still holds xacro markup."""
    name = path.name if path is not None else "robot.urdf.xacro"
    for e in root.iter():
        tag = e.tag if isinstance(e.tag, str) else ""
        if tag.startswith(_XACRO_NAMESPACES):
            raise URDFParseError(
                f"the URDF holds xacro markup (<xacro:{tag.split('}', 1)[1]}>): " + _XACRO_HINT.format(name=name)
            )
        for k, v in e.attrib.items():
            if "${" in v or "$(" in v:
                raise URDFParseError(
                    f"<{tag} {k}={v!r}> is an unexpanded xacro expression: " + _XACRO_HINT.format(name=name)
                )


def _repair_inertias(links: dict[str, LinkSpec], strict: bool) -> list[str]:
    """Replace tiny violations of positive semi-definiteness by the nearest physical
    inertia (returning one note per link), refuse the others."""
    bad = [n for n, L in links.items() if _psd_violation(L.inertia) > 0]
    if not bad:
        return []
    scale = max(float(np.abs(np.linalg.eigvalsh(L.inertia)).max()) for L in links.values())
    notes = []
    for name in bad:
        L = links[name]
        # Eigenvalues and the projection commute with the rotation into the
        # link frame, so the link-frame inertia is checked and repaired as is.
        eig = np.linalg.eigvalsh(L.inertia)
        violation = _psd_violation(L.inertia)
        what = (
            f"link {name!r} <inertia>: rotational inertia is not positive semi-definite "
            f"(eigenvalues {np.array2string(eig, precision=4)})"
        )
        if strict or violation > INERTIA_REPAIR_RATIO * scale:
            reason = (
                "strict=True refuses any repair"
                if strict
                else f"more than {INERTIA_REPAIR_RATIO:g} of the robot's largest principal moment "
                f"{scale:.3g} kg m^2, too large to repair"
            )
            raise InvalidValueError(f"{what}; {reason}")
        fixed = nearest_physical_inertia(L.inertia)
        change = float(np.abs(fixed - L.inertia).max())
        notes.append(
            f"{what}; repaired to the nearest physical inertia, eigenvalues "
            f"{np.array2string(np.linalg.eigvalsh(fixed), precision=4)} (largest entry change "
            f"{change:.3g} kg m^2); load with strict=True to refuse instead"
        )
        links[name] = dataclasses.replace(L, inertia=fixed)
    return notes
