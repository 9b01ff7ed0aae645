"""MuJoCo reference for backdrive's contact model: a quadruped from its URDF
standing on a floor, with MuJoCo's contact set up to behave as a linear
spring-damper (a penalty force) on spheres at the feet.

Used by ``tests/test_mujoco_contact_ref.py`` and ``benchmarks/contact.py``;
independent of backdrive's physics (backdrive only locates the URDF files),
so that it is a reference and not a copy.

Model
-----
* URDF -> MuJoCo: ``<visual>`` elements are removed (their mesh paths do not
  resolve), ``<mujoco><compiler discardvisual="true" balanceinertia="true"/>``
  is added, and a link whose inertia matrix is not positive definite (Go1's
  1e-6 kg dummy ``base`` with products of inertia equal to its moments) gets
  its products of inertia set to zero; MuJoCo refuses it otherwise. A free
  joint is added to the root link, so ``qpos = [p_world, quat_wxyz, joints]``
  and ``qvel[:6]`` are backdrive's base coordinates too, except that
  MuJoCo's free-joint linear velocity is expressed in the world frame
  (backdrive's in the base frame; the angular parts are both in the base
  frame).
* Contact geometry: every URDF collision shape is made non-colliding and one
  sphere of ``foot_radius`` is added at each foot frame (plus
  ``foot_offset``), the only geoms that touch the floor (a plane at z = 0).
  Both robots here have URDF foot spheres of radius 0.02 m at the foot frame,
  which are the defaults.
* Joints: URDF ``damping`` becomes MuJoCo ``damping``; URDF ``friction``
  (Go1: 0.2 N m) would become ``frictionloss``, a stiction constraint that
  holds a joint still up to that torque, whereas a smoothed Coulomb law has
  no force at rest. For a standing comparison that would make the rest pose
  non-unique (+-0.2 N m / kp of joint error), so ``joint_friction`` defaults
  to 0 (pass ``None`` for the URDF value). ``armature`` is added to every leg
  joint (the URDFs have none). Joint-limit constraints are off (the
  standing pose is far inside the limits).
* Actuators: one position servo per leg joint, ``tau = kp (q_ref - q) - kd
  qdot``, unclamped (standing torques are far inside the effort limits).
  ``opt.integrator`` is semi-implicit Euler (MuJoCo's ``Euler``) with its
  implicit joint damping switched off (``eulerdamp``), like backdrive's
  ``semi_implicit`` integrator; ``integrator="implicitfast"`` treats servo
  and joint damping implicitly (as backdrive's ``extra_damping``), which
  ``benchmarks/contact.py`` needs at 4 ms: with explicit servo damping
  (kd 2) the shipped quadruped is unstable at 4 ms, and Go1 with MuJoCo's
  default contact too; both are stable at 2 ms.

Matching a penalty spring-damper
--------------------------------
MuJoCo's contact is a soft constraint
(https://mujoco.readthedocs.io/en/stable/computation/index.html#soft-constraints
and .../modeling.html#solver-parameters). For a constraint row with
impedance ``d`` (``solimp``), reference stiffness ``k_r`` and damping ``b_r``
(``solref``), the force inside the friction cone is ``f = D (a_ref - a)``,
where ``a`` is the row's acceleration *after* the constraint forces (MuJoCo
solves for ``f`` and ``a`` together over all contacts),
``D = 1 / R = d / ((1 - d) A~)`` (``A~`` is MuJoCo's diagonal estimate
``efc_diagA`` of ``J M^-1 J^T``: a constant per body pair, the foot body's
translational ``body_invweight0``), and ``a_ref = -b_r v - k_r d r`` with
``r`` the signed distance (negative in penetration, ``p = -r``) and ``v``
its rate. With ``solref = (-K, -B)`` (negative: "direct" stiffness and
damping) MuJoCo takes ``k_r = K / d_max^2``, ``b_r = B / d_max``.

Over a step of semi-implicit Euler, ``a = (v' - v) / dt`` with ``v'`` the
end-of-step normal velocity, so

    f = -D k_r d r - (D b_r - D / dt) v - (D / dt) v'

a spring, a damper on the start-of-step velocity and a damper on the
end-of-step velocity, all exact (no approximation of ``A``). With a constant
impedance (``solimp = (d, d, ...)``) any law ``f = k p - b_exp v - b_imp v'``
follows from ``D = b_imp dt``, ``b_r = b_exp / D + 1 / dt``, ``k_r d = k / D``
(:func:`matched_solref`):

* ``scheme="implicit"`` (default; backdrive's implicit contact step, which
  linearises the force at the end of the step,
  ``f' = k (p - dt v') - b v'``): ``b_imp = b + k dt``, ``b_exp = 0``. For
  Go1 at 2 ms with k = 4e4 N/m, b = 1e4 N s/m this is ``d = 0.98``. It is
  stable at 4 ms.
* ``scheme="explicit"`` (``f = k p - b v``): ``d`` at MuJoCo's lower clamp
  1e-4 leaves ``b_imp = D / dt`` ~ 0.04 N s/m. Stable only while
  ``b dt < 2 m_eff`` and ``dt < 2 sqrt(m_eff / k)`` with ``m_eff`` the
  lightest effective mass at a foot (0.15 kg for Go1 standing): at 1 ms for
  k 2e4, b <= 100; not at 2 ms.

(A constant impedance near 1 with direct solref, ``solimp = "0.9999
0.9999"``, is *not* a penalty law: ``D`` becomes huge, the constraint tracks
``a_ref`` as a hard constraint and the penetration obeys the mass-normalised
``r'' = -B r' - K r - (1 - d) g``, whose rest penetration ``(1 - d) g / K``
does not depend on the load.)

``tests/test_mujoco_contact_ref.py`` checks the law per foot to 1e-3 of the
force from ``mj_contactForce`` in a state with moving, penetrating feet. The
feet get ``priority`` 1 over the floor, so their ``solref``, ``solimp`` and
friction are the contact's, unmixed. Only the elliptic cone is matched:
MuJoCo rescales the pyramidal rows' regulariser to mimic the elliptic cone.

Residual differences from backdrive's law (what the comparison cannot remove)
----------------------------------------------------------------------------
* Activation: MuJoCo's force switches on at ``r = 0``; backdrive's
  ``k w_n softplus(p / w_n)`` gives ``k w_n ln 2`` (2.8 N at 4e4 N/m and
  w_n = 0.1 mm) at zero penetration and the damping fades in with
  ``sigmoid(p / w_n)``. At rest with ~32 N per foot (p ~ 0.8 mm = 8 w_n)
  the two differ by ``k w_n softplus(-8) ~ 1e-3 N``.
* Both clamp the normal force at 0 (MuJoCo's cone apex).
* Friction: inside the elliptic cone the friction rows have
  ``D_t = impratio D`` and ``a_ref = -b_r v_t``; in the implicit mapping
  that is the viscous ``f_t = -impratio b_imp v_t'``, saturating on the
  cone ``mu f_n``. A regularised Coulomb law ``mu f_n v_t / sqrt(|v_t|^2 +
  w_t^2)`` has the slope ``mu f_n / w_t`` at rest: ``stiction_width=w_t``
  sets ``impratio`` so the slopes agree at the standing load ``W / 4``
  (0.24 for Go1 with w_t = 1 cm/s). Away from rest the two differ: MuJoCo's
  friction is linear up to the cone, Coulomb's is smooth. Both let a loaded
  foot creep (Go1 standing: the feet splay at ~0.3 mm/s, the base sinks
  ~0.1 mm/s at impratio 1).
* MuJoCo's free joint uses the world-frame linear velocity; Euler
  integrates the free joint's position with it, backdrive on SE(3) with the
  base-frame twist. Equal to first order in ``dt``.

Against backdrive (measured before merging, on the contact branch's
``backdrive.contact`` with k 4e4, b 1e4, mu 0.75, w_n 0.1 mm, w_t 1 cm/s,
implicit scheme, 2 ms, PD kp 80 / kd 2 explicit, 3 s after a 5 cm drop;
MuJoCo with ``stiction_width=0.01``): base height within 0.17 mm (Go1) and
0.02 mm (quadruped), foot positions within 1.3 mm, per-foot normal forces
within 0.5 %, both ground reactions within 0.03 % of the weight. With
``impratio = 1`` instead, the feet creep differently: 2-4.5 mm apart after
3 s, base height 0.35 mm apart.

MuJoCo's own contact (positive ``solref = (timeconst, dampratio)``, default
``(0.02, 1)``, and ``solimp = (0.9, 0.95, 0.001, 0.5, 2)``) is available
with ``native=True``: what MuJoCo users run. Measured by
:func:`height_sensitivity` (Go1, 2 ms, 2 s): default 0.2526 m; timeconst
0.005 / 0.01 s: +1.7 / +1.3 mm; dampratio 0.5: +1.3 mm; solimp (0.8, 0.9):
-1.9 mm, (0.95, 0.99): +1.3 mm, (0.99, 0.999): +1.8 mm, width 10 mm: -1.6 mm;
timeconst 0.04 s or dampratio 2: -5.9 mm. The matched law (k 4e4, b 1e4)
stands at 0.2543 m, 1.7 mm above MuJoCo's default.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

__all__ = [
    "ROBOTS",
    "RobotSpec",
    "urdf_text",
    "build_model",
    "standing_state",
    "drop_state",
    "joint_permutation",
    "settle",
    "SettleResult",
    "height_sensitivity",
    "robot_weight",
]

LEGS = ("FL", "FR", "RL", "RR")
# MuJoCo clamps impedance to [mjMINIMP, mjMAXIMP] = [1e-4, 0.9999].
PENALTY_IMPEDANCE = 1e-4
GRAVITY = 9.81


@dataclass(frozen=True)
class RobotSpec:
    """What the reference needs to know about one robot.

    Attributes:
        name: backdrive data name (``backdrive.data.get_data_path`` argument).
        root_link: the URDF root link (gets the free joint).
        feet: foot link names, order FL, FR, RL, RR.
        foot_radius: radius of the foot spheres, m (the URDF's collision
            spheres).
        stand: standing joint angles by joint-name suffix (hip, thigh, calf), rad.
        stand_height: approximate base height in that pose on the ground, m
            (only used to place the drop).
    """

    name: str
    root_link: str
    feet: tuple[str, ...]
    foot_radius: float
    stand: dict = field(default_factory=dict)
    stand_height: float = 0.3


ROBOTS = {
    # backdrive's shipped 12-dof quadruped: feet 0.4 m below the hips at q = 0;
    # the docstring's standing pose thigh 0.8, calf -1.6 rad.
    "quadruped": RobotSpec(
        "quadruped", "trunk", tuple(f"{leg}_foot" for leg in LEGS), 0.02,
        {"hip": 0.0, "thigh": 0.8, "calf": -1.6}, 0.30),
    # example-robot-data's Go1: its SRDF "standing" state (thigh 0.8,
    # calf -1.853, base 0.26 m).
    "go1": RobotSpec(
        "example-robot-data:go1", "base", tuple(f"{leg}_foot" for leg in LEGS), 0.02,
        {"hip": 0.0, "thigh": 0.8, "calf": -1.853}, 0.28),
}


def urdf_text(robot: str) -> str:
    """URDF text of ``robot`` (a key of :data:`ROBOTS`), through backdrive's resolver."""
    from backdrive.data import get_data_path

    return Path(get_data_path(ROBOTS[robot].name)).read_text()


def _mujoco_urdf(urdf: str) -> str:
    """The URDF made loadable by MuJoCo: no visuals, compiler options, PD inertias."""
    root = ET.fromstring(urdf.encode())
    for link in root.iter("link"):
        for visual in link.findall("visual"):
            link.remove(visual)
        for inertia in link.findall("inertial/inertia"):
            names = (("ixx", "ixy", "ixz"), ("ixy", "iyy", "iyz"), ("ixz", "iyz", "izz"))
            I = np.array([[float(inertia.get(a, 0.0)) for a in row] for row in names])
            if np.linalg.eigvalsh(I).min() <= 0.0:
                # MuJoCo requires positive eigenvalues; these are massless
                # dummy frames (1e-6 kg) whose products equal their moments.
                for a in ("ixy", "ixz", "iyz"):
                    inertia.set(a, "0")
    ext = ET.SubElement(root, "mujoco")
    ET.SubElement(ext, "compiler", discardvisual="true", balanceinertia="true")
    return ET.tostring(root, encoding="unicode")


def build_model(
    robot: str = "go1",
    *,
    urdf: str | None = None,
    dt: float = 1e-3,
    stiffness: float = 4e4,
    damping: float = 1e4,
    friction: float = 0.75,
    scheme: str = "implicit",
    stiction_width: float | None = None,
    cone: str = "elliptic",
    native: bool = False,
    solref: tuple[float, float] = (0.02, 1.0),
    solimp: tuple[float, ...] = (0.9, 0.95, 0.001, 0.5, 2.0),
    foot_radius: float | None = None,
    foot_offset: tuple[float, float, float] = (0.0, 0.0, 0.0),
    kp: float = 80.0,
    kd: float = 2.0,
    joint_friction: float | None = 0.0,
    armature: float = 0.0,
    integrator: str = "euler",
):
    """A ``mujoco.MjModel`` of ``robot`` on a floor, feet as spheres, PD servos.

    Args:
        robot: key of :data:`ROBOTS` (foot links, root link, standing pose).
        urdf: URDF text; ``None`` reads the robot's file.
        dt: time step, s.
        stiffness: penalty stiffness ``k`` of each foot, N/m (matched mode).
        damping: penalty damping ``b`` of each foot, N s/m (matched mode).
        friction: Coulomb coefficient ``mu`` (both modes).
        scheme: ``"implicit"``: the penalty force is evaluated at the end of
            the step, ``f = k p - (b + k dt) v_n'`` (backdrive's implicit
            contact step); ``"explicit"``: ``f = k p - b v_n`` at the start
            of the step (stable only for small ``dt``, see the module docstring).
        stiction_width: ``w_t``, m/s: if given, MuJoCo's ``impratio`` is set
            so that its friction at rest has the slope ``mu f_n / w_t`` of a
            regularised Coulomb law at the standing load ``f_n = W / 4``
            (matched mode, elliptic cone); ``None``: ``impratio = 1``.
        cone: ``"elliptic"`` or ``"pyramidal"`` friction cone (condim 3).
        native: use MuJoCo's own soft contact (``solref``, ``solimp`` as
            given) instead of the matched penalty law.
        solref, solimp: MuJoCo contact parameters for ``native=True``.
        foot_radius: sphere radius, m (``None``: the robot's URDF value).
        foot_offset: sphere centre in the foot frame, m.
        kp: servo stiffness, N m/rad. kd: servo damping, N m s/rad.
        joint_friction: joint ``frictionloss``, N m (``None``: URDF value).
        armature: added rotor inertia of every leg joint, kg m^2.
        integrator: ``"euler"`` (semi-implicit, no implicit damping),
            ``"implicitfast"`` or ``"rk4"``.

    Returns:
        The compiled model. ``model.nu == 12`` actuators in the order of the
        leg joints, whose standing targets are in :func:`standing_state`.
    """
    import mujoco

    if scheme not in ("implicit", "explicit"):
        raise ValueError(f"scheme must be 'implicit' or 'explicit', got {scheme!r}")
    if cone not in ("elliptic", "pyramidal"):
        raise ValueError(f"cone must be 'elliptic' or 'pyramidal', got {cone!r}")
    if integrator not in ("euler", "implicitfast", "rk4"):
        raise ValueError(f"integrator must be 'euler', 'implicitfast' or 'rk4', got {integrator!r}")
    rs = ROBOTS[robot]
    radius = rs.foot_radius if foot_radius is None else float(foot_radius)
    spec = mujoco.MjSpec.from_string(_mujoco_urdf(urdf_text(robot) if urdf is None else urdf))
    spec.body(rs.root_link).add_freejoint(name="root")

    # Only the foot spheres collide, and only with the floor.
    for g in spec.geoms:
        g.contype = 0
        g.conaffinity = 0
    spec.worldbody.add_geom(
        name="floor", type=mujoco.mjtGeom.mjGEOM_PLANE, size=[0, 0, 1],
        contype=2, conaffinity=1, friction=[friction, 0.005, 0.0001])
    for foot in rs.feet:
        body = spec.body(foot)
        if body is None:
            raise ValueError(f"foot link {foot!r} not in the URDF of {robot!r}")
        body.add_geom(
            name=f"{foot}_sphere", type=mujoco.mjtGeom.mjGEOM_SPHERE, size=[radius, 0, 0],
            pos=list(foot_offset), contype=1, conaffinity=2, condim=3, priority=1,
            friction=[friction, 0.005, 0.0001], mass=0.0)

    joints = [j for j in spec.joints if j.type == mujoco.mjtJoint.mjJNT_HINGE]
    for j in joints:
        if joint_friction is not None:
            j.frictionloss = float(joint_friction)
        j.armature = float(armature)
        act = spec.add_actuator(name=f"servo_{j.name}", target=j.name, trntype=mujoco.mjtTrn.mjTRN_JOINT)
        act.gaintype = mujoco.mjtGain.mjGAIN_FIXED
        act.gainprm[0] = kp
        act.biastype = mujoco.mjtBias.mjBIAS_AFFINE
        act.biasprm[:3] = [0.0, -kp, -kd]
        act.ctrllimited = mujoco.mjtLimited.mjLIMITED_FALSE
        act.forcelimited = mujoco.mjtLimited.mjLIMITED_FALSE

    spec.option.timestep = dt
    spec.option.gravity = [0.0, 0.0, -GRAVITY]
    spec.option.cone = mujoco.mjtCone.mjCONE_ELLIPTIC if cone == "elliptic" else mujoco.mjtCone.mjCONE_PYRAMIDAL
    spec.option.integrator = {
        "euler": mujoco.mjtIntegrator.mjINT_EULER,
        "implicitfast": mujoco.mjtIntegrator.mjINT_IMPLICITFAST,
        "rk4": mujoco.mjtIntegrator.mjINT_RK4,
    }[integrator]
    if integrator == "euler":
        spec.option.disableflags |= mujoco.mjtDisableBit.mjDSBL_EULERDAMP
    # Joint limits are not part of the comparison (the standing pose is far
    # inside them, and backdrive adds soft limits only on request).
    spec.option.disableflags |= mujoco.mjtDisableBit.mjDSBL_LIMIT
    model = spec.compile()

    feet = _foot_geoms(model, rs)
    if native:
        model.geom_solref[feet] = solref
        model.geom_solimp[feet] = solimp
    else:
        if not (stiffness > 0 and damping >= 0):
            raise ValueError(f"stiffness must be > 0 and damping >= 0, got {stiffness}, {damping}")
        if cone != "elliptic":
            # MuJoCo rescales the pyramidal rows' regulariser to mimic the
            # elliptic cone, so the per-row law below would not hold.
            raise ValueError("the matched penalty law needs cone='elliptic' (pyramidal only with native=True)")
        diag, rows = _probe_diag_approx(model, feet)
        imp, K, B = matched_solref(stiffness, damping, dt, diag, rows, scheme)
        model.geom_solimp[feet] = np.stack([imp, imp] + [np.full_like(imp, x) for x in (0.001, 0.5, 2.0)], -1)
        model.geom_solref[feet, 0] = -K
        model.geom_solref[feet, 1] = -B
        if stiction_width is not None:
            # Inside the elliptic cone the friction rows have D_t = impratio D
            # and a_ref = -b_r v_t, so at rest f_t = -impratio b_imp v_t'.
            b_imp = rows * imp / ((1.0 - imp) * diag) / dt
            slope = friction * robot_weight(model) / len(feet) / float(stiction_width)
            model.opt.impratio = slope / float(b_imp.mean())
    return model


def matched_solref(k: float, b: float, dt: float, diag, rows: int, scheme: str):
    """MuJoCo ``(impedance d, K, B)`` (``solimp = (d, d, ...)``,
    ``solref = (-K, -B)``) whose contact force is a penalty law.

    Per constraint row MuJoCo's force is ``f = D (a_ref - a)`` with
    ``D = d / ((1 - d) A~)``, ``a_ref = -b_r v - k_r d r`` (``k_r = K / d^2``,
    ``b_r = B / d``) and ``a = (v' - v) / dt`` the row's acceleration over
    the step, so ``f = -D k_r d r - (D b_r - D / dt) v - (D / dt) v'``: a
    spring, an explicit damper and an implicit one (on the end-of-step
    velocity ``v'``). The law ``f = k p - b_exp v - b_imp v'`` (``p = -r``)
    follows from ``D = b_imp dt / rows``, ``b_r = b_exp / (rows D) + 1 / dt``
    and ``k_r d = k / (rows D)``, where ``rows`` rows share the normal force.

    ``"implicit"``: ``b_imp = b + k dt``, ``b_exp = 0`` (the force at the end
    of the step, ``k (p - dt v') - b v'``); ``"explicit"``: ``d`` at MuJoCo's
    lower clamp 1e-4, ``b_imp = rows D / dt`` (~0.04 N s/m here) and
    ``b_exp = b - b_imp``.

    Args:
        k: N/m. b: N s/m. dt: s. diag: ``(n,)`` ``A~`` of each foot's rows
        (``efc_diagA``), 1/kg. rows: rows per contact sharing the normal force.

    Returns:
        ``(d, K, B)``, each ``(n,)``.
    """
    diag = np.asarray(diag, dtype=float)
    if scheme == "implicit":
        D = (b + k * dt) * dt / rows
        d = D * diag / (1.0 + D * diag)
    else:
        d = np.full_like(diag, PENALTY_IMPEDANCE)
    d = np.clip(d, PENALTY_IMPEDANCE, 0.9999)
    D = d / ((1.0 - d) * diag)  # after the clamp
    b_imp = rows * D / dt
    b_exp = (b + k * dt if scheme == "implicit" else b) - b_imp
    b_r = b_exp / (rows * D) + 1.0 / dt
    K = k * d / (rows * D)
    return d, K, b_r * d


def _foot_geoms(model, rs: RobotSpec) -> np.ndarray:
    import mujoco

    return np.array([mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_GEOM, f"{f}_sphere") for f in rs.feet])


def _probe_diag_approx(model, feet: np.ndarray) -> tuple[np.ndarray, int]:
    """MuJoCo's ``efc_diagApprox`` of each foot's contact rows, and the number
    of rows that share the normal force (1 elliptic, 2 (condim - 1) pyramidal).

    A probe state puts every foot sphere 1 mm into the floor; ``A~`` depends
    only on the body pair and the friction, not on the state.
    """
    import mujoco

    data = mujoco.MjData(model)
    mujoco.mj_forward(model, data)
    lowest = data.geom_xpos[feet, 2] - model.geom_size[feet, 0]
    data.qpos[2] -= lowest.max() + 1e-3  # all feet below the floor (legs straight at q = 0)
    mujoco.mj_forward(model, data)
    diag = np.zeros(len(feet))
    pyramidal = model.opt.cone == mujoco.mjtCone.mjCONE_PYRAMIDAL
    for i in range(data.ncon):
        c = data.contact[i]
        foot = c.geom1 if c.geom1 in feet else c.geom2
        k = int(np.flatnonzero(feet == foot)[0])
        diag[k] = data.efc_diagA[c.efc_address]
    if (diag <= 0).any():
        raise RuntimeError("probe did not put every foot in contact")
    rows = 2 * (3 - 1) if pyramidal else 1
    return diag, rows


def robot_weight(model) -> float:
    """Total mass times |g|, N."""
    return float(model.body_mass.sum() * np.linalg.norm(model.opt.gravity))


def standing_state(model, robot: str, height: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(qpos, ctrl)``: the standing joint angles (also the servo targets),
    base at ``height`` (default: the robot's standing height), identity orientation."""
    import mujoco

    rs = ROBOTS[robot]
    qpos = model.qpos0.copy()
    qpos[:3] = (0.0, 0.0, rs.stand_height if height is None else height)
    qpos[3:7] = (1.0, 0.0, 0.0, 0.0)
    ctrl = np.zeros(model.nu)
    for a in range(model.nu):
        j = model.actuator_trnid[a, 0]
        name = mujoco.mj_id2name(model, mujoco.mjtObj.mjOBJ_JOINT, j)
        suffix = next(s for s in rs.stand if name.endswith(f"_{s}_joint"))
        qpos[model.jnt_qposadr[j]] = rs.stand[suffix]
        ctrl[a] = rs.stand[suffix]
    return qpos, ctrl


def drop_state(model, robot: str, drop: float = 0.05) -> tuple[np.ndarray, np.ndarray]:
    """``(qpos, ctrl)`` of :func:`settle`'s start: the standing pose with the
    lowest foot sphere ``drop`` metres above the floor, zero velocity."""
    import mujoco

    rs = ROBOTS[robot]
    data = mujoco.MjData(model)
    qpos, ctrl = standing_state(model, robot)
    data.qpos[:] = qpos
    mujoco.mj_forward(model, data)
    feet = _foot_geoms(model, rs)
    qpos[2] += drop - (data.geom_xpos[feet, 2] - model.geom_size[feet, 0]).min()
    return qpos, ctrl


def quat_to_matrix(quat: np.ndarray) -> np.ndarray:
    """Rotation matrices ``(..., 3, 3)`` (base to world) of wxyz unit quaternions ``(..., 4)``."""
    w, x, y, z = (quat[..., i] for i in range(4))
    return np.stack([
        np.stack([1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)], -1),
        np.stack([2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)], -1),
        np.stack([2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)], -1),
    ], -2)


def joint_permutation(model, joint_names) -> np.ndarray:
    """Indices ``perm`` with ``mujoco_joint_values[perm]`` in the order of
    ``joint_names`` (e.g. ``robot.joint_names`` of a backdrive model): apply
    to ``qpos[7:]``, ``qvel[6:]`` and ``ctrl``."""
    import mujoco

    names = [mujoco.mj_id2name(model, mujoco.mjtObj.mjOBJ_JOINT, model.actuator_trnid[a, 0]) for a in range(model.nu)]
    missing = [n for n in joint_names if n not in names]
    if missing or len(joint_names) != len(names):
        raise ValueError(f"joint names {missing or list(joint_names)} do not match MuJoCo's {names}")
    return np.array([names.index(n) for n in joint_names])


@dataclass
class SettleResult:
    """Time series of a drop-and-settle run (``T`` recorded samples).

    Attributes:
        t: ``(T,)`` time, s.
        base_height: ``(T,)`` base (root link origin) height, m.
        feet: ``(T, 4, 3)`` world positions of the foot sphere centres, m.
        normal_force: ``(T,)`` sum of the contacts' normal forces, N.
        penetration: ``(T, 4)`` penetration of each foot sphere, m (>= 0).
        foot_normal_force: ``(T, 4)`` normal force on each foot, N.
        weight: total mass times |g|, N.
        qpos: ``(nq,)`` final configuration. qvel: ``(nv,)`` final velocity.
    """

    t: np.ndarray
    base_height: np.ndarray
    feet: np.ndarray
    normal_force: np.ndarray
    penetration: np.ndarray
    foot_normal_force: np.ndarray
    weight: float
    qpos: np.ndarray
    qvel: np.ndarray


def settle(model, robot: str, *, drop: float = 0.05, duration: float = 1.5, every: int = 1) -> SettleResult:
    """Drop the robot from ``drop`` metres above its standing height with the
    servos holding the standing pose, and record until ``duration``.

    Args:
        model: from :func:`build_model` for the same ``robot``.
        robot: key of :data:`ROBOTS`.
        drop: height of the lowest foot above the floor at ``t = 0``, m.
        duration: simulated time, s.
        every: record every ``every``-th step.

    Returns:
        :class:`SettleResult`.
    """
    import mujoco

    rs = ROBOTS[robot]
    data = mujoco.MjData(model)
    feet = _foot_geoms(model, rs)
    data.qpos[:], data.ctrl[:] = drop_state(model, robot, drop)
    mujoco.mj_forward(model, data)

    n = int(round(duration / model.opt.timestep))
    T = n // every + 1
    out = {k: [] for k in ("t", "h", "feet", "fn", "pen", "ffn")}
    f6 = np.zeros(6)

    def record():
        fn_foot = np.zeros(len(feet))
        for i in range(data.ncon):
            c = data.contact[i]
            mujoco.mj_contactForce(model, data, i, f6)
            foot = c.geom1 if c.geom1 in feet else c.geom2
            fn_foot[np.flatnonzero(feet == foot)[0]] += f6[0]
        out["t"].append(data.time)
        out["h"].append(data.qpos[2])
        out["feet"].append(data.geom_xpos[feet].copy())
        out["fn"].append(fn_foot.sum())
        out["ffn"].append(fn_foot)
        out["pen"].append(np.maximum(0.0, model.geom_size[feet, 0] - data.geom_xpos[feet, 2]))

    record()
    for k in range(1, n + 1):
        mujoco.mj_step(model, data)
        if k % every == 0:
            # mj_step leaves contacts and forces of the state before the step;
            # mj_forward makes the recorded forces belong to the recorded state.
            mujoco.mj_forward(model, data)
            record()
    if not np.isfinite(data.qpos).all():
        raise FloatingPointError(f"MuJoCo state became non-finite ({robot}, dt={model.opt.timestep})")
    return SettleResult(
        t=np.array(out["t"]), base_height=np.array(out["h"]), feet=np.array(out["feet"]),
        normal_force=np.array(out["fn"]), penetration=np.array(out["pen"]),
        foot_normal_force=np.array(out["ffn"]), weight=robot_weight(model),
        qpos=data.qpos.copy(), qvel=data.qvel.copy())


def height_sensitivity(robot: str = "go1", *, dt: float = 2e-3, duration: float = 1.5, **kw) -> dict:
    """Standing height of MuJoCo's own contact (``native=True``) across its
    settings: ``solref`` time constants 0.005-0.04 s and damping ratios
    0.5-2, and ``solimp`` ranges (d_min, d_max) from (0.8, 0.9) to
    (0.95, 0.99) and widths 0.5-10 mm.

    Returns:
        ``{label: final base height (m)}``, with ``"default"`` for MuJoCo's
        defaults ``solref (0.02, 1)``, ``solimp (0.9, 0.95, 0.001, 0.5, 2)``.
    """
    default_imp = (0.9, 0.95, 0.001, 0.5, 2.0)
    cases = {"default": ((0.02, 1.0), default_imp)}
    for tc in (0.005, 0.01, 0.04):
        cases[f"solref ({tc}, 1)"] = ((tc, 1.0), default_imp)
    for dr in (0.5, 2.0):
        cases[f"solref (0.02, {dr})"] = ((0.02, dr), default_imp)
    for lo, hi in ((0.8, 0.9), (0.95, 0.99), (0.99, 0.999)):
        cases[f"solimp ({lo}, {hi}, 0.001)"] = ((0.02, 1.0), (lo, hi, 0.001, 0.5, 2.0))
    for w in (0.0005, 0.01):
        cases[f"solimp (0.9, 0.95, {w})"] = ((0.02, 1.0), (0.9, 0.95, w, 0.5, 2.0))
    out = {}
    for label, (ref, imp) in cases.items():
        model = build_model(robot, dt=dt, native=True, solref=ref, solimp=imp, **kw)
        res = settle(model, robot, duration=duration, every=int(round(duration / dt)))
        out[label] = float(res.base_height[-1])
    return out
