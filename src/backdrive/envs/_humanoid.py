"""A humanoid that keeps its balance through backdrive's contact simulator: ``HumanoidBalance``.

The robot is the Unitree G1 (29 dof) of example-robot-data, on a floating
base, with contact spheres and capsules on its feet and body
(:func:`g1_contact_geometry`). ``docs/locomotion.md`` (*HumanoidBalance*)
gives the measurements behind the settings.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping

import torch

from .._errors import InputError
from ..spatial import quat_apply, quat_conjugate
from ._base import DiffEnv
from ._quadruped import COMMAND_RANGES, QuadrupedWalk, gravity_in_base, load_shipped, parse_command_ranges, parse_reward_weights

__all__ = ["HumanoidBalance", "g1_contact_geometry", "HUMANOID_REWARD_WEIGHTS", "G1_JOINTS", "BALANCE_FEEDBACK_KEYS",
           "G1_BALANCE_FEEDBACK", "G1_CAPTURE_FEEDBACK", "G1_SOLE_POINTS", "FOOT_MODELS", "GAIT_KEYS"]

#: The G1's joints in example-robot-data's order (legs, waist, arms).
G1_JOINTS: tuple[str, ...] = tuple(
    [f"{s}_{j}_joint" for s in ("left", "right")
     for j in ("hip_pitch", "hip_roll", "hip_yaw", "knee", "ankle_pitch", "ankle_roll")]
    + [f"waist_{j}_joint" for j in ("yaw", "roll", "pitch")]
    + [f"{s}_{j}_joint" for s in ("left", "right")
       for j in ("shoulder_pitch", "shoulder_roll", "shoulder_yaw", "elbow", "wrist_roll", "wrist_pitch", "wrist_yaw")]
)

#: The joints the policy drives (legs and waist, the first 15); the arms are held at the standing pose.
NUM_ACTUATED = 15

# Standing pose: knees bent so that the PD servos alone hold the robot up
# (with straight knees, hip -0.1 / knee 0.3 / ankle -0.2 rad, it tips
# forward under the same gains), feet flat (hip + knee + ankle pitch = 0),
# elbows bent. Radians; joints not named are 0.
_STAND = {"hip_pitch": -0.3, "knee": 0.6, "ankle_pitch": -0.3, "elbow": 0.9}

# PD gains (kp N m/rad, kd N m s/rad) by joint-name fragment, first match wins.
# The legs and waist are stiffer than Unitree's RL gains (100-150 N m/rad):
# the lean of a 33 kg body 0.7 m above the ankles needs a stiffness above
# m g h = 227 N m/rad through hips, knees and ankles in series, and at 100-200
# N m/rad the robot falls over under zero action (measured, docs/locomotion.md).
_GAINS = (
    ("wrist_pitch", 10.0, 0.5), ("wrist_yaw", 10.0, 0.5),
    ("ankle", 300.0, 7.5),
    ("hip", 500.0, 12.5), ("knee", 500.0, 12.5), ("waist", 500.0, 12.5),
    ("", 40.0, 1.0),  # shoulders, elbows, wrist roll
)

#: Factors on the observation's parts (joint velocity, base angular and linear
#: velocity, and the pelvis height's offset from standing): about unit size.
OBS_SCALES: dict[str, float] = {"joint_vel": 0.05, "ang_vel": 0.25, "lin_vel": 2.0, "height": 10.0}

#: Default reward weights (see :class:`HumanoidBalance` for each term).
HUMANOID_REWARD_WEIGHTS: dict[str, float] = {
    "tracking_lin": 1.0,
    "tracking_yaw": 0.5,
    "lin_vel_z": 1.0,
    "ang_vel_xy": 0.2,
    "orientation": 5.0,
    "height": 20.0,
    "pose": 0.1,
    "torque": 1e-5,
    "action_rate": 0.1,
}


#: The balance-feedback gains (``balance_feedback=``): joint group x signal.
#: Groups: ``ankle`` (ankle pitch and roll of both legs), ``hip`` (hip pitch
#: and roll), ``waist`` (waist pitch and roll). Signals, per lean axis (about
#: the pelvis's x for roll, y for pitch): ``tilt`` (rad, from gravity's
#: direction in the pelvis frame), ``rate`` (the pelvis's angular velocity,
#: rad/s), ``vel`` (the pelvis's horizontal velocity turned into the lean
#: it would cause: ``(-v_y, v_x)``, m/s), ``com`` and ``comvel`` (the centre
#: of mass's horizontal offset from the middle of the two soles and its
#: velocity, in the pelvis's heading frame, as ``(-y, x)``: m and m/s; see
#: :meth:`HumanoidBalance.com_signals`). Units: rad of target per rad, per
#: rad/s, per m and per m/s.
BALANCE_FEEDBACK_KEYS: tuple[str, ...] = tuple(
    f"{g}_{s}" for g in ("ankle", "hip", "waist") for s in ("tilt", "rate", "vel", "com", "comvel"))
_FB_SIGNALS = 5

#: Hand-tuned gains of the balance prior for the G1 (ankle stiffening on the
#: pelvis's lean and lean rate; the hip and waist terms tried did not help,
#: docs/locomotion.md). Tuned on 4-s screening runs with a push every second,
#: not on the evaluation's episodes.
G1_BALANCE_FEEDBACK: dict[str, float] = {"ankle_tilt": 0.5, "ankle_rate": 0.15}

#: The capture-point balance prior for the G1: the ankles on the pelvis's lean
#: and the centre of mass's velocity (the ankle torque moves the centre of
#: pressure toward the capture point), the hips against the centre of mass's
#: velocity (a forward velocity flexes the hips: the torso pitches forward
#: and the hips push the legs back). Tuned by hand on screening runs (seeds
#: 1, 2, 3 and 5, never the evaluation's seed 999) with the sole-outline feet
#: (``feet="sole"``); docs/locomotion.md gives the tables.
G1_CAPTURE_FEEDBACK: dict[str, float] = {"ankle_tilt": 0.5, "ankle_comvel": 0.5, "hip_comvel": -0.6}

#: The stepping prior's settings (``gait=``): ``frequency`` (Hz of the gait
#: clock; each foot is lifted once per period, the left in the first half),
#: ``lift`` (rad: the swing leg's hip pitch flexes by ``lift s``, its knee by
#: ``2 lift s`` and its ankle pitch by ``-lift s``, ``s = max(+-sin(phase),
#: 0)^2``, which lifts the foot about straight up, flat), ``sway`` (rad: both
#: hip rolls turn by ``sway sin(phase)`` and both ankle rolls back by as much,
#: which moves the pelvis over the stance foot), ``stride`` (rad of hip
#: pitch per m/s of commanded forward speed: the left hip pitch gets ``stride
#: vx_cmd cos(phase)`` and the right the opposite, each ankle pitch the
#: negative of its hip's, so the swing foot travels forward and the stance
#: foot back, feet flat), ``placement`` (rad of the swing leg's hip flexion
#: per m/s of the pelvis's forward velocity above the command, times the
#: swing's ``s``, the ankle pitch the opposite: a foot placement that lands
#: the swing foot further forward when the body runs ahead of the command;
#: measured to shorten the walks, docs/locomotion.md) and ``reference`` (the
#: fraction of the command that the balance prior's velocity signals are taken
#: relative to: 1, the default, leaves the commanded velocity alone; 0 fights
#: every velocity as a push).
#: Three more keys act on the pelvis's lean and the centre of mass's velocity:
#: ``torso`` (rad of the stance leg's hip pitch per rad of the pelvis's
#: forward lean ``g_x``, weighted by the stance weight ``(1 -+ sin(phase)) /
#: 2``: a forward lean extends the stance hip, which pitches the torso back),
#: ``level`` (the fraction of that lean taken off the swing leg's hip pitch,
#: weighted by the swing weight, one minus the stance weight: 1 lands the
#: swing foot where it would land under an upright pelvis) and ``capture``
#: (rad of stride amplitude per m/s of the centre of mass's forward velocity
#: above the command, :meth:`HumanoidBalance.com_signals`: the swing foot lands
#: further ahead, toward the capture point, when the body runs ahead); and
#: ``turn`` (rad of the stance leg's hip yaw per rad/s of the pelvis's yaw rate
#: above the command's, times the stance weight: the stance hip turns the
#: pelvis back against a turn, the heading damped while the feet slip);
#: ``roll`` (the fraction of the ``torso`` and ``level`` terms also applied
#: sideways: the hip roll joints on the pelvis's sideways lean ``-g_y``, the
#: stance hip against it, the swing hip taking it off).
#: Heading and arms (docs/locomotion.md, *10th session*): ``steer`` (rad of
#: stride amplitude per rad of heading error, the pelvis's heading minus the
#: commanded heading, :meth:`HumanoidBalance.heading_error`: turned left of it,
#: the right leg's stride lengthens and the left's shortens by ``steer`` times
#: the error; the sign measured to straighten the walk), ``steer_rate`` (the
#: same per rad/s of the pelvis's yaw rate above the command's), ``smoothing``
#: (s: the time constant of a low-pass filter on the heading error that
#: ``steer`` then acts on, a state column; 0, the default: the error itself)
#: and ``arms`` (each shoulder pitch swings by ``arms`` times the other side's
#: hip stride offset: the right arm forward with the left leg, against the
#: legs' twist of the body about the vertical, :meth:`HumanoidBalance.arm_offsets`).
#: The yaw wobble (docs/locomotion.md, *11th session*): ``counter`` (rad of waist yaw per rad of
#: heading error, the same error ``steer`` uses: the torso turns with the pelvis's turn, and the
#: waist servo's reaction turns the pelvis back, the torso a reaction wheel that adds its yaw inertia
#: to the pelvis's), ``twist`` (the same per rad/s of the pelvis's yaw rate above the command's),
#: ``support`` (a double support: the swing's lift ``s`` becomes ``max((+-sin(phase) - support) /
#: (1 - support), 0)^2``, so both feet stand while ``|sin(phase)| <= support``; in ``[0, 1)``) and
#: ``profile`` (in ``[0, 1]``: the stride's waveform, 0 the cosine, 1 a constant-rate sweep of the
#: stance hip with a swing that lands the foot moving back under the pelvis,
#: :meth:`HumanoidBalance._stride_waves`; in between a blend).
GAIT_KEYS: tuple[str, ...] = ("frequency", "lift", "sway", "stride", "placement", "reference",
                              "torso", "level", "capture", "turn", "roll", "steer", "steer_rate",
                              "smoothing", "arms", "profile", "twist", "counter", "support")

# Indices (into the 15 actuated joints) of the pitch and roll joints each group drives.
_FB_PITCH = {"ankle": (4, 10), "hip": (0, 6), "waist": (14,)}
_FB_ROLL = {"ankle": (5, 11), "hip": (1, 7), "waist": (13,)}


#: Contact points of each sole (``feet="sole"``): ``(x, y)`` in the ankle roll
#: link's frame, m, at ``z = -0.03`` (spheres of 5 mm radius, so their bottom
#: is the sole's plane, 0.4 mm above the visual mesh's lowest point). Read off
#: example-robot-data's foot mesh ``g1_description/meshes/left_ankle_roll_link.STL``,
#: whose flat sole runs from x = -0.066 (a rounded heel, 3 cm wide 2 mm from its
#: tip) to +0.142 m (a rounded toe) and is 7.6 cm wide at the ball: a heel pair,
#: a pair at the ball's widest part and a toe pair, each inside the outline.
#: The URDF's own four spheres (``feet="urdf"``) span x = -0.05 to +0.12 m,
#: 3.7 cm short of the sole.
G1_SOLE_POINTS: tuple[tuple[float, float], ...] = (
    (-0.060, 0.015), (-0.060, -0.015), (0.060, 0.035), (0.060, -0.035), (0.135, 0.020), (0.135, -0.020))

#: Foot contact models of :func:`g1_contact_geometry` (``feet=``).
FOOT_MODELS: tuple[str, ...] = ("sole", "urdf")


def g1_contact_geometry(robot, feet: str = "sole"):
    """Contact geometry for example-robot-data's G1, whose URDF collision shapes are meshes.

    The feet (``feet="sole"``, the default): six spheres per foot on the
    outline of the foot mesh's flat sole (:data:`G1_SOLE_POINTS`, 20 cm
    long); ``feet="urdf"``: the URDF's four foot spheres per foot (its only
    primitive collision shapes, 17 cm apart, 3.7 cm short of the sole). Plus
    spheres and capsules (radii and offsets read off its neutral pose) on the
    pelvis, torso, head, shoulders, elbows, hands, thighs and shins, so that
    a fall lands on the body, not through it.

    Args:
        robot: the G1 RobotModel (``load("example-robot-data:g1", ...)``).
        feet: ``"sole"`` or ``"urdf"``.

    Returns:
        A :class:`~backdrive.contact.ContactGeometry` (25 shapes with the sole, 21 with the URDF's feet).

    Raises:
        InputError: an unknown ``feet``.
    """
    from ..contact import ContactGeometry, ContactShape

    if feet not in FOOT_MODELS:
        raise InputError(f"feet must be one of {FOOT_MODELS}, got {feet!r}")

    def at(x, y, z):
        T = torch.eye(4, dtype=torch.float64)
        T[:3, 3] = torch.tensor([x, y, z], dtype=torch.float64)
        return T.numpy()

    shapes = [
        ContactShape("pelvis", "sphere", (0.1,)),
        ContactShape("torso_link", "capsule", (0.1, 0.2), at(0.0, 0.0, 0.2)),
        ContactShape("torso_link", "sphere", (0.08,), at(0.0, 0.0, 0.43)),
    ]
    for side in ("left", "right"):
        shapes += [
            ContactShape(f"{side}_hip_roll_link", "capsule", (0.06, 0.2), at(0.0, 0.0, -0.15)),
            ContactShape(f"{side}_knee_link", "capsule", (0.05, 0.22), at(0.0, 0.0, -0.15)),
            ContactShape(f"{side}_shoulder_roll_link", "sphere", (0.05,)),
            ContactShape(f"{side}_elbow_link", "sphere", (0.045,)),
            ContactShape(f"{side}_rubber_hand", "sphere", (0.04,)),
        ]
    if feet == "urdf":
        foot = ContactGeometry.from_model(robot, links=["left_ankle_roll_link", "right_ankle_roll_link"])
        return foot + ContactGeometry.from_shapes(robot, shapes)
    soles = [ContactShape(f"{side}_ankle_roll_link", "sphere", (0.005,), at(x, y, -0.03))
             for side in ("left", "right") for x, y in G1_SOLE_POINTS]
    return ContactGeometry.from_shapes(robot, soles + shapes)


def _wrap(angle: torch.Tensor) -> torch.Tensor:
    """``angle`` wrapped into ``[-pi, pi)``."""
    return torch.remainder(angle + math.pi, 2 * math.pi) - math.pi


def _heading_error(q: torch.Tensor, heading: torch.Tensor) -> torch.Tensor:
    """The yaw of the pelvis's x axis (from the base pose ``q[:, :7]``) minus ``heading``, wrapped."""
    qw, qx, qy, qz = q[:, 3], q[:, 4], q[:, 5], q[:, 6]
    return _wrap(torch.atan2(2 * (qx * qy + qw * qz), 1 - 2 * (qy * qy + qz * qz)) - heading)


def _load_g1(dtype: torch.dtype, device: torch.device):
    from ..data import load

    with warnings.catch_warnings():
        # The G1's collision meshes are not used (g1_contact_geometry replaces them).
        warnings.simplefilter("ignore")
        return load("example-robot-data:g1", floating_base=True, dtype=dtype, device=device)


class HumanoidBalance(DiffEnv):
    r"""The Unitree G1 humanoid standing and recovering from pushes, differentiable through contact.

    The G1 of example-robot-data (29 dof, 33.3 kg) on a floating base, with
    :func:`g1_contact_geometry` on a flat ground (the default contact law:
    4e4 N/m, 1e4 N s/m, friction 0.75), simulated by
    :class:`backdrive.sim.Simulator` with ``contact=`` (the implicit contact
    step, ``docs/contact.md``).

    Control at ``1 / dt`` Hz (default 50 Hz) with ``substeps`` physics steps
    (default 2 of 10 ms: standing and planted pushes agree with 2 ms steps
    within 1.4 mm of base position after 1 s, pushes that make the feet slide
    within 6.5 mm; ``docs/locomotion.md``). The policy drives the 12 leg joints and the 3
    waist joints: the action ``a`` in ``[-1, 1]^15`` sets their PD targets
    ``q_stand + action_scale * a``; the 14 arm joints are held at the
    standing pose by the same kind of servo (a smaller action space; the arms
    of the G1 carry 15 % of its mass). Servos ``tau = kp (target - q) - kd
    qdot`` with the URDF's effort limits (smoothly saturated), ``kd``
    treated implicitly; gains in ``docs/locomotion.md``.

    State ``(N, 89)`` (:meth:`split`): ``q (36)``, ``v (35)`` (base twist in
    the base frame), the last action (15) and the command ``(vx, vy, yaw)``
    (3); with a stepping prior (``gait=``) three more columns, the gait
    clock's phase (rad), the commanded heading (rad: the reset's heading,
    turning at the commanded yaw rate) and the low-passed heading error (rad,
    for the ``smoothing`` key).

    Observation ``(N, 82)``, what the robot measures: joint positions
    relative to the standing pose (29, rad), joint velocities (29, times
    0.05 s/rad), base angular velocity in the base frame (3, times 0.25),
    gravity's direction in the base frame (3), the last action (15) and the
    command (3). ``privileged=True`` appends the base linear velocity (base
    frame, 3, times 2 s/m) and the pelvis height's offset from
    :attr:`STAND_HEIGHT` (1, times 10 /m), as a state estimator would give
    them. The factors (:data:`OBS_SCALES`) make every part about unit size.

    Pushes (``push_velocity > 0``): at each control step, with probability
    ``dt / push_interval`` (random times, on average every
    ``push_interval`` s), the base's horizontal world velocity changes by a
    vector of uniform direction and of magnitude uniform in
    ``[0, push_velocity]`` (the whole body moves with it: joint rates are
    unchanged). :attr:`last_push` holds the change of the last step.

    Command: standing still by default (every range ``(0, 0)``); a forward
    velocity command (``command_ranges={"vx": (0.0, 0.3)}``) turns it into
    the next level, walking, for which ``gait=`` adds a stepping prior. The
    checks are :class:`QuadrupedWalk`'s.

    Reward per step (weights :data:`HUMANOID_REWARD_WEIGHTS`, all smooth):

    * ``tracking_lin * exp(-|v_xy - cmd_xy|^2 / 0.25)``: base-frame
      velocity (standing: a small base velocity);
    * ``tracking_yaw * exp(-(w_z - cmd_yaw)^2 / 0.25)``;
    * ``- lin_vel_z * v_z^2 - ang_vel_xy * |w_xy|^2``;
    * ``- orientation * |g_xy|^2`` (gravity's tilt in the base frame);
    * ``- height * (z - z_stand)^2``;
    * ``- pose * |q_legs,waist - q_stand|^2``;
    * ``- torque * |tau|^2`` (mean over the substeps);
    * ``- action_rate * |a - a_prev|^2``.

    Episodes end by a fall (gravity more than 60 degrees from the pelvis's
    -z axis, or the pelvis below ``0.6 z_stand``) or after
    ``max_episode_steps`` (default 500, 10 s). There is no fall penalty or
    bonus: a fall ends the stream of (mostly positive) rewards.

    Args:
        num_envs: copies N.
        robot: ``None`` (example-robot-data's G1, which needs that package)
            or a floating-base RobotModel with the joints :data:`G1_JOINTS`
            and the G1's link names.
        dt: control period, s. substeps: physics steps per control period.
        action_scale: rad of target offset per unit of action.
        push_velocity: largest push, m/s (0: no pushes).
        push_interval: mean time between pushes, s.
        command_ranges: ``{"vx": (lo, hi), "vy": ..., "yaw": ...}``, missing
            keys ``(0, 0)``.
        reward_weights: overrides of :data:`HUMANOID_REWARD_WEIGHTS`.
        privileged: also observe the base linear velocity and height.
        init_noise: half-width of the uniform joint-angle noise at reset, rad.
        balance_feedback: ``None`` (off) or gains ``{key: gain}`` with keys
            in :data:`BALANCE_FEEDBACK_KEYS` (missing keys 0): a
            hand-designed balance prior added to the servo targets of the
            ankle, hip and waist pitch and roll joints, linear in the
            pelvis's lean, lean rate and horizontal velocity (see
            :meth:`feedback_offsets`). The velocity signals are taken
            relative to the command (zero when standing), so a walking
            command is not fought as a push. The policy's action is added on
            top (a residual policy).
        feet: the feet's contact model, ``"sole"`` (the foot mesh's sole
            outline, 20 cm long) or ``"urdf"`` (the URDF's foot spheres, 17
            cm); see :func:`g1_contact_geometry`.
        gait: ``None`` (off, standing) or a stepping prior ``{key: value}``
            with keys in :data:`GAIT_KEYS` (``frequency`` > 0 Hz required,
            at most half the control rate; the others default to 0): a
            clock, three more state columns (its phase, rad, drawn uniformly
            at reset, the commanded heading and the low-passed heading error)
            and two more observations (the phase's cos and sin, after the
            privileged ones), whose :meth:`gait_offsets` (and
            :meth:`arm_offsets`) are added to the servo targets under the
            policy's action, as the balance prior is.
        max_episode_steps: truncation length.
        dtype, device, autoreset: see :class:`DiffEnv`.
    """

    action_dim = NUM_ACTUATED
    state_dim = 36 + 35 + NUM_ACTUATED + 3

    #: Standing pelvis height, m: the settled height of the standing pose
    #: under zero action (0.7604 m at 2, 5 and 10 ms steps).
    STAND_HEIGHT = 0.760

    def __init__(
        self,
        num_envs: int = 1,
        *,
        robot=None,
        dt: float = 0.02,
        substeps: int = 2,
        action_scale: float = 0.25,
        push_velocity: float = 0.5,
        push_interval: float = 4.0,
        command_ranges: Mapping[str, tuple[float, float]] | None = None,
        reward_weights: Mapping[str, float] | None = None,
        privileged: bool = False,
        init_noise: float = 0.05,
        balance_feedback: Mapping[str, float] | None = None,
        feet: str = "sole",
        gait: Mapping[str, float] | None = None,
        max_episode_steps: int = 500,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
        autoreset: bool = True,
    ) -> None:
        super().__init__(num_envs, dtype=dtype, device=device, autoreset=autoreset)
        from ..contact import ContactModel, ContactParameters
        from ..model import RobotModel
        from ..sim import PDActuator, Simulator

        if robot is None:
            robot = _load_g1(self.dtype, self.device)
        elif isinstance(robot, RobotModel):
            if robot.dtype != self.dtype or robot.device != self.device:
                raise InputError(f"robot is {robot.dtype} on {robot.device}, the env {self.dtype} on {self.device}")
        else:
            raise InputError(f"robot must be None (example-robot-data's G1) or a RobotModel, got {type(robot).__name__}")
        if not robot.floating_base:
            raise InputError("HumanoidBalance needs a floating-base robot (load(..., floating_base=True))")
        if tuple(robot.joint_names) != G1_JOINTS:
            raise InputError(f"HumanoidBalance needs the G1's 29 joints in this order: {G1_JOINTS}, "
                             f"got {tuple(robot.joint_names)}")
        if feet not in FOOT_MODELS:
            raise InputError(f"feet must be one of {FOOT_MODELS}, got {feet!r}")
        for k, (x, what) in {"dt": (dt, "s"), "action_scale": (action_scale, "rad"),
                             "push_interval": (push_interval, "s")}.items():
            if isinstance(x, bool) or not (isinstance(x, (int, float)) and math.isfinite(x) and x > 0):
                raise InputError(f"{k} must be a positive number ({what}), got {x!r}")
        for k, x in (("push_velocity", push_velocity), ("init_noise", init_noise)):
            if isinstance(x, bool) or not (isinstance(x, (int, float)) and math.isfinite(x) and x >= 0):
                raise InputError(f"{k} must be a number >= 0, got {x!r}")
        for k, x in (("substeps", substeps), ("max_episode_steps", max_episode_steps)):
            if isinstance(x, bool) or not isinstance(x, int) or x < 1:
                raise InputError(f"{k} must be a positive int, got {x!r}")
        gait_cfg = None
        if gait is not None:
            if not isinstance(gait, Mapping):
                raise InputError(f"gait must be None or a mapping with keys {GAIT_KEYS}, got {type(gait).__name__}")
            gait_cfg = {**dict.fromkeys(GAIT_KEYS, 0.0), "reference": 1.0}
            for k, w in gait.items():
                if k not in GAIT_KEYS:
                    raise InputError(f"unknown gait setting {k!r}; valid: {', '.join(map(repr, GAIT_KEYS))}")
                if isinstance(w, bool) or not (isinstance(w, (int, float)) and math.isfinite(w)):
                    raise InputError(f"gait setting {k} must be a finite number, got {w!r}")
                gait_cfg[k] = float(w)
            if not gait_cfg["frequency"] > 0:
                raise InputError(f"gait frequency must be > 0 Hz (gait=None: no stepping prior), "
                                 f"got {gait_cfg['frequency']!r}")
            if gait_cfg["frequency"] * dt > 0.5:
                raise InputError(f"gait frequency {gait_cfg['frequency']} Hz is above half the control rate "
                                 f"({0.5 / dt:g} Hz)")
            if not 0.0 <= gait_cfg["profile"] <= 1.0:
                raise InputError(f"gait profile must be in [0, 1] (0: a cosine stride, 1: a constant-rate stance "
                                 f"sweep with a swing-leg retraction), got {gait_cfg['profile']!r}")
            if not 0.0 <= gait_cfg["support"] < 1.0:
                raise InputError(f"gait support must be in [0, 1) (the double support's |sin(phase)|), "
                                 f"got {gait_cfg['support']!r}")
            if gait_cfg["smoothing"] < 0:
                raise InputError(f"gait smoothing must be >= 0 s (a time constant), got {gait_cfg['smoothing']!r}")
        ranges = parse_command_ranges(command_ranges, {k: (0.0, 0.0) for k in COMMAND_RANGES})
        weights = parse_reward_weights(reward_weights, HUMANOID_REWARD_WEIGHTS)

        gains = {k: 0.0 for k in BALANCE_FEEDBACK_KEYS}
        for k, w in dict(balance_feedback or {}).items():
            if k not in BALANCE_FEEDBACK_KEYS:
                raise InputError(f"unknown balance feedback gain {k!r}; "
                                 f"valid: {', '.join(map(repr, BALANCE_FEEDBACK_KEYS))}")
            if isinstance(w, bool) or not (isinstance(w, (int, float)) and math.isfinite(w)):
                raise InputError(f"balance feedback gain {k} must be a finite number, got {w!r}")
            gains[k] = float(w)

        self.robot = robot
        # The gains as given (missing keys are 0), so that a preset's keywords match the env's.
        self.balance_feedback = (None if balance_feedback is None
                                 else {k: float(w) for k, w in dict(balance_feedback).items()})
        self.dt = float(dt)
        self.substeps = substeps
        self.physics_dt = self.dt / substeps
        self.action_scale = float(action_scale)
        self.push_velocity = float(push_velocity)
        self.push_interval = float(push_interval)
        self.command_ranges = ranges
        self.reward_weights = weights
        self.privileged = bool(privileged)
        self.init_noise = float(init_noise)
        self.max_episode_steps = max_episode_steps
        # The stepping prior (gait=): its clock's phase, the commanded heading and the
        # low-passed heading error are three more state columns and (cos, sin) of the
        # phase two more observations (at the end: without a gait the layouts are the
        # standing env's).
        self.gait = gait_cfg
        self.state_dim = 89 + (3 if gait_cfg else 0)
        self.obs_dim = 82 + (4 if self.privileged else 0) + (2 if gait_cfg else 0)
        self.stand_height = self.STAND_HEIGHT
        kw = {"dtype": self.dtype, "device": self.device}
        self.q_stand = torch.tensor(
            [next((v for k, v in _STAND.items() if k in n), 0.0) for n in G1_JOINTS], **kw)
        self.kp = torch.tensor([next(kp for k, kp, _ in _GAINS if k in n) for n in G1_JOINTS], **kw)
        self.kd = torch.tensor([next(kd for k, _, kd in _GAINS if k in n) for n in G1_JOINTS], **kw)
        # (3 groups, 3 signals); may be broadcast to (N, 3, 3) to compare gains across copies.
        self._fb_gains = torch.tensor([gains[k] for k in BALANCE_FEEDBACK_KEYS], **kw).reshape(3, _FB_SIGNALS)
        self._cmd_low = torch.tensor([ranges[k][0] for k in COMMAND_RANGES], **kw)
        self._cmd_high = torch.tensor([ranges[k][1] for k in COMMAND_RANGES], **kw)
        self.feet = feet
        self.geometry = g1_contact_geometry(robot, feet)
        self.contact = ContactModel(robot, self.geometry, params=ContactParameters())
        self.sim = Simulator(robot, self.physics_dt, actuator=PDActuator(kp=self.kp, kd=self.kd),
                             contact=self.contact)
        self.last_push = torch.zeros(num_envs, 3, **kw)
        self._aux = None
        self._foot_frames = [robot.frame_index(f"{s}_ankle_roll_link") for s in ("left", "right")]
        self._sole_centre = torch.tensor([0.038, 0.0, -0.035], **kw)

    # ------------------------------------------------------------- layout
    @staticmethod
    def split(state: torch.Tensor) -> dict[str, torch.Tensor]:
        """The named parts of a state ``(..., 89)`` (views; ``(..., 92)`` with a gait: also ``phase``, ``heading``
        and ``heading_lag``)."""
        names = (("q", 36), ("v", 35), ("last_action", NUM_ACTUATED), ("command", 3))
        out, i = {}, 0
        for k, n in names:
            out[k] = state[..., i:i + n]
            i += n
        if state.shape[-1] > i:  # the stepping prior's clock and commanded heading (gait=)
            out["phase"] = state[..., i:i + 1]
            out["heading"] = state[..., i + 1:i + 2]
            out["heading_lag"] = state[..., i + 2:i + 3]
        return out

    @property
    def action_low(self) -> torch.Tensor:
        return torch.full((NUM_ACTUATED,), -1.0, dtype=self.dtype, device=self.device)

    @property
    def action_high(self) -> torch.Tensor:
        return torch.full((NUM_ACTUATED,), 1.0, dtype=self.dtype, device=self.device)

    # The command checks are the quadruped's (same (vx, vy, yaw) layout and messages).
    check_command = QuadrupedWalk.check_command
    set_command = QuadrupedWalk.set_command

    # ------------------------------------------------------------ dynamics
    def initial_state(self, n: int, generator: torch.Generator) -> torch.Tensor:
        kw = {"dtype": self.dtype, "device": self.device}
        yaw = self._uniform(-math.pi, math.pi, (n,), generator)
        zero = torch.zeros_like(yaw)
        quat = torch.stack([torch.cos(yaw / 2), zero, zero, torch.sin(yaw / 2)], -1)
        pos = torch.zeros(n, 3, **kw)
        pos[:, 2] = self.stand_height + 0.005
        joints = self.q_stand + self._uniform(-self.init_noise, self.init_noise, (n, 29), generator)
        # Feet flat: the ankle pitch takes up the hip and knee noise (a foot on its
        # toe or heel at reset would be a push of its own).
        for leg in (0, 6):
            joints[:, leg + 4] = -(joints[:, leg] + joints[:, leg + 3])
        v = torch.zeros(n, 35, **kw)
        v[:, :2] = self._uniform(-0.05, 0.05, (n, 2), generator)
        cmd = self._uniform(self._cmd_low, self._cmd_high, (n, 3), generator)
        parts = [pos, quat, joints, v, torch.zeros(n, NUM_ACTUATED, **kw), cmd]
        if self.gait is not None:  # drawn last: the draws above are those of an env without a gait
            # The clock's phase, and the commanded heading: the start heading (not a draw).
            # The smoothed heading error starts at 0 (the pelvis on the commanded heading).
            parts += [self._uniform(0.0, 2 * math.pi, (n, 1), generator), yaw[:, None], zero[:, None]]
        return torch.cat(parts, -1)

    def draw_push(self, n: int) -> torch.Tensor:
        """This step's pushes: world-frame base velocity changes ``(n, 3)``, m/s (rows of zeros: no push)."""
        g, kw = self._generator, {"dtype": self.dtype, "device": self.device}
        hit = torch.rand(n, generator=g, **kw) < min(self.dt / self.push_interval, 1.0)
        angle = self._uniform(0.0, 2 * math.pi, (n,), g)
        size = self._uniform(0.0, self.push_velocity, (n,), g) * hit
        return torch.stack([size * torch.cos(angle), size * torch.sin(angle), torch.zeros_like(size)], -1)

    @staticmethod
    def push(state: torch.Tensor, dv_world: torch.Tensor) -> torch.Tensor:
        """``state`` ``(N, 89)`` with the base's world velocity changed by ``dv_world`` ``(N, 3)``, m/s."""
        q, v = state[..., :36], state[..., 36:71]
        dv_base = quat_apply(quat_conjugate(q[..., 3:7]), dv_world)
        return torch.cat([q, v[..., :3] + dv_base, state[..., 39:]], -1)

    def feedback_offsets(self, state: torch.Tensor,
                         com: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """The balance prior's servo-target offsets ``(N, 15)``, rad (zeros when ``balance_feedback`` is off).

        Per lean axis, ``signal = (lean, lean rate, horizontal velocity, centre
        of mass offset, centre of mass velocity)``: pitch (forward lean, about
        the pelvis's y) ``(g_x, w_y, v_x, c_x, cdot_x)`` and roll (about its x)
        ``(-g_y, w_x, -v_y, -c_y, -cdot_y)``, with ``g`` gravity's direction,
        ``w`` the angular and ``v`` the linear velocity in the pelvis frame, and
        ``c``, ``cdot`` from :meth:`com_signals` (heading frame). Each group's
        pitch joints get ``gains[group] . signal_pitch``
        and its roll joints ``gains[group] . signal_roll`` (both legs alike).
        The joints' axes point along the pelvis's when standing, so a
        positive ankle gain turns a forward lean into a larger ankle pitch
        target, the torque that pushes the body back. Each offset is
        smoothly saturated at ``action_scale`` (``a tanh(x / a)``). ``com``:
        :meth:`com_signals` of ``state`` when already computed.
        """
        out = state.new_zeros(state.shape[0], NUM_ACTUATED)
        if self.balance_feedback is None:
            return out
        p = self.split(state)
        v = p["v"]
        g = self.projected_gravity(state)
        k = self._fb_gains.expand(state.shape[0], 3, _FB_SIGNALS)
        if com is not None:
            c, cdot = com
        elif k.requires_grad or bool((k[..., 3:] != 0).any()):
            c, cdot = self.com_signals(state)
        else:  # the centre of mass is not needed (it costs two kinematics passes)
            c = cdot = g.new_zeros(g.shape[0], 2)
        # Velocities relative to the commanded one (standing: the command is 0), so
        # that a walking command is not fought as a push.
        cmd = p["command"][:, :2]
        if self.gait is not None and self.gait["reference"] != 1.0:
            cmd = self.gait["reference"] * cmd
        vrel, cdot = v[:, :2] - cmd, cdot - cmd
        pitch = torch.stack([g[:, 0], v[:, 4], vrel[:, 0], c[:, 0], cdot[:, 0]], -1)
        roll = torch.stack([-g[:, 1], v[:, 3], -vrel[:, 1], -c[:, 1], -cdot[:, 1]], -1)
        dp = (k * pitch[:, None, :]).sum(-1)  # (N, 3 groups)
        dr = (k * roll[:, None, :]).sum(-1)
        cols_p = torch.zeros(3, NUM_ACTUATED, dtype=state.dtype, device=state.device)
        cols_r = torch.zeros_like(cols_p)
        for i, grp in enumerate(("ankle", "hip", "waist")):
            cols_p[i, list(_FB_PITCH[grp])] = 1.0
            cols_r[i, list(_FB_ROLL[grp])] = 1.0
        # Smoothly saturated at action_scale: the prior moves the targets no further
        # than the policy can (unbounded, a fallen robot's rates drive the targets,
        # and the simulation, off to infinity).
        lim = self.action_scale
        return lim * torch.tanh((dp @ cols_p + dr @ cols_r) / lim)

    def com_signals(self, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The centre of mass relative to the feet, in the pelvis's heading frame: ``(offset, velocity)``, ``(N, 2)`` each.

        ``offset``: the horizontal position of the centre of mass minus the
        middle of the two soles' centres (``(0.038, 0, -0.035)`` m in each
        ankle roll link, the middle of the sole's outline), m; ``velocity``:
        the centre of mass's horizontal velocity, m/s (a central difference
        of :func:`~backdrive.dynamics.center_of_mass` along the state's
        velocity, 1 ms each way). Both rotated into the frame turned by the
        pelvis's heading (x forward, y left). The instantaneous capture point
        is ``offset + velocity / sqrt(g / h)`` (``h`` about 0.67 m here).
        """
        # Unchecked versions: a diverged copy's NaN rows are reset after the transition.
        from ..dynamics._configuration import integrate
        from ..dynamics._energy import center_of_mass
        from ..kinematics._fk import forward_kinematics

        q, v = state[:, :36], state[:, 36:71]
        h = 1e-3
        c_plus = center_of_mass(self.robot, integrate(self.robot, q, v, h))
        c_minus = center_of_mass(self.robot, integrate(self.robot, q, v, -h))
        c = center_of_mass(self.robot, q)
        cdot = (c_plus - c_minus) / (2 * h)
        T = forward_kinematics(self.robot, q)[:, self._foot_frames]  # (N, 2, 4, 4)
        sole = (T[..., :3, :3] @ self._sole_centre + T[..., :3, 3]).mean(1)
        # Heading: the pelvis's x axis projected on the ground.
        qw, qx, qy, qz = q[:, 3], q[:, 4], q[:, 5], q[:, 6]
        hx = 1 - 2 * (qy * qy + qz * qz)
        hy = 2 * (qx * qy + qw * qz)
        norm = torch.sqrt(hx * hx + hy * hy + 1e-12)
        cos, sin = hx / norm, hy / norm

        def rot(d):
            return torch.stack([cos * d[:, 0] + sin * d[:, 1], -sin * d[:, 0] + cos * d[:, 1]], -1)

        return rot(c[:, :2] - sole[:, :2]), rot(cdot[:, :2])

    def transition(self, state: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        from ..sim import State

        action = action.clamp(-1.0, 1.0)
        if self.push_velocity > 0:
            dv = self.draw_push(state.shape[0])
            self.last_push = dv
            state = self.push(state, dv)
        p = self.split(state)
        q, v = p["q"], p["v"]
        com = None
        if self.gait is not None and self.gait["capture"] != 0.0:
            com = self.com_signals(state)  # shared by both priors (two kinematics passes each)
        offsets = self.action_scale * action + self.feedback_offsets(state, com)
        if self.gait is not None:
            phase, heading = state[:, 89:90], state[:, 90]
            g = self.projected_gravity(state)
            offsets = offsets + self.gait_offsets(
                phase, p["command"], v[:, 0], lean=torch.stack([g[:, 0], -g[:, 1]], -1),
                com_velocity=None if com is None else com[1][:, 0], yaw_rate=v[:, 5],
                heading_error=self.heading_error(state) if self.gait["smoothing"] == 0.0 else state[:, 91])
        arms = self.q_stand[NUM_ACTUATED:].expand(action.shape[0], -1)
        if self.gait is not None and self.gait["arms"] != 0.0:
            arms = arms + self.arm_offsets(phase, p["command"])
        target = torch.cat([self.q_stand[:NUM_ACTUATED] + offsets, arms], -1)
        # A non-finite copy would stop the whole batch (the contact step's
        # factorisation raises), so between substeps its rows are the standing
        # pose; at the end they are NaN again, and DiffEnv.step resets them and
        # keeps them out of the gradient (as QuadrupedWalk does).
        bad = ~(torch.isfinite(q).all(-1) & torch.isfinite(v).all(-1) & torch.isfinite(target).all(-1))
        safe_q = torch.cat([q.new_tensor([0.0, 0.0, self.stand_height, 1.0, 0.0, 0.0, 0.0]), self.q_stand])
        safe_q = safe_q.expand_as(q)
        effort2 = q.new_zeros(q.shape[0])
        for _ in range(self.substeps):
            q = torch.where(bad[:, None], safe_q, q)
            v = torch.where(bad[:, None], torch.zeros_like(v), v)
            u = torch.where(bad[:, None], self.q_stand.expand_as(target), target)
            traj = self.sim.rollout(State(q, v), u[:, None, :], check_finite=False)
            q, v = traj.q[:, -1], traj.v[:, -1]
            effort2 = effort2 + (traj.effort[:, -1, :NUM_ACTUATED] ** 2).sum(-1) / self.substeps
            bad = bad | ~(torch.isfinite(q).all(-1) & torch.isfinite(v).all(-1))
        nan = torch.full_like(q, math.nan)
        q1 = torch.where(bad[:, None], nan, q)
        v1 = torch.where(bad[:, None], nan[:, :35], v)
        parts = [q1, v1, action, p["command"]]
        if self.gait is not None:
            heading1 = _wrap(heading + p["command"][:, 2] * self.dt)
            # The smoothed heading error: a first-order low-pass (time constant `smoothing`) of the error.
            alpha = self.dt / (self.gait["smoothing"] + self.dt)
            lag = state[:, 91] + alpha * (_heading_error(q1, heading1) - state[:, 91])
            parts += [torch.remainder(phase + 2 * math.pi * self.gait["frequency"] * self.dt, 2 * math.pi),
                      heading1[:, None], lag[:, None]]
        out = torch.cat(parts, -1)
        self._aux = {"effort2": effort2, "next": out}
        return out

    def reward_terms(
        self, state: torch.Tensor, action: torch.Tensor, next_state: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        """Each reward term ``(N,)`` before weighting (signs as added), for logging and plots."""
        aux = self._aux
        if aux is None or aux["next"] is not next_state:
            raise InputError(
                "HumanoidBalance.reward needs the transition it scores: call it right after transition() "
                "with that call's result (the effort is taken from the physics substeps)"
            )
        p = self.split(next_state)
        q, v, cmd = p["q"], p["v"], p["command"]
        g = self.projected_gravity(next_state)
        world_vz = quat_apply(q[:, 3:7], v[:, :3])[:, 2]
        return {
            "tracking_lin": torch.exp(-((v[:, :2] - cmd[:, :2]) ** 2).sum(-1) / 0.25),
            "tracking_yaw": torch.exp(-((v[:, 5] - cmd[:, 2]) ** 2) / 0.25),
            "lin_vel_z": -world_vz ** 2,
            "ang_vel_xy": -(v[:, 3:5] ** 2).sum(-1),
            "orientation": -(g[:, :2] ** 2).sum(-1),
            "height": -(q[:, 2] - self.stand_height) ** 2,
            "pose": -((q[:, 7:7 + NUM_ACTUATED] - self.q_stand[:NUM_ACTUATED]) ** 2).sum(-1),
            "torque": -aux["effort2"],
            "action_rate": -((action.clamp(-1.0, 1.0) - self.split(state)["last_action"]) ** 2).sum(-1),
        }

    def reward(self, state: torch.Tensor, action: torch.Tensor, next_state: torch.Tensor) -> torch.Tensor:
        terms = self.reward_terms(state, action, next_state)
        w = self.reward_weights
        return sum(w[k] * t for k, t in terms.items())

    def projected_gravity(self, state: torch.Tensor) -> torch.Tensor:
        """Gravity's direction in the pelvis frame ``(..., 3)`` (``(0, 0, -1)`` upright)."""
        return gravity_in_base(state)

    def observe(self, state: torch.Tensor) -> torch.Tensor:
        p = self.split(state)
        q, v = p["q"], p["v"]
        # Fixed scales bring every part to about unit size, so a policy needs no
        # running normaliser (whose statistics blow up parts that barely vary
        # while standing, such as the held arm joints, into large inputs).
        parts = [q[..., 7:] - self.q_stand, OBS_SCALES["joint_vel"] * v[..., 6:],
                 OBS_SCALES["ang_vel"] * v[..., 3:6], self.projected_gravity(state), p["last_action"], p["command"]]
        if self.privileged:
            parts += [OBS_SCALES["lin_vel"] * v[..., :3], OBS_SCALES["height"] * (q[..., 2:3] - self.stand_height)]
        if self.gait is not None:
            parts += [torch.cos(state[..., 89:90]), torch.sin(state[..., 89:90])]
        return torch.cat(parts, -1)

    def gait_offsets(self, phase: torch.Tensor, command: torch.Tensor,
                     forward_velocity: torch.Tensor | None = None, *, lean: torch.Tensor | None = None,
                     com_velocity: torch.Tensor | None = None, yaw_rate: torch.Tensor | None = None,
                     heading_error: torch.Tensor | None = None) -> torch.Tensor:
        """The stepping prior's servo-target offsets ``(N, 15)``, rad, at the clock's ``phase`` ``(N, 1)``.

        See :data:`GAIT_KEYS`: the left foot swings while ``sin(phase) > 0``,
        the right while it is negative; ``command`` ``(N, 3)`` scales the
        stride, ``forward_velocity`` ``(N,)`` (the pelvis's, base frame, m/s;
        ``None``: the command's) drives the foot placement, ``lean`` ``(N,)``
        (the pelvis's forward lean ``g_x``, or ``(N, 2)``: ``(g_x, -g_y)``,
        forward and sideways, for the ``roll`` part; ``None``: upright) the
        ``torso`` and ``level`` terms and ``com_velocity`` ``(N,)`` (the centre of
        mass's forward velocity in the heading frame, m/s; ``None``: the
        command's) the ``capture`` term and ``yaw_rate`` ``(N,)`` (the
        pelvis's, rad/s; ``None``: the command's) the ``turn`` and ``steer_rate``
        terms and ``heading_error`` ``(N,)`` (rad, :meth:`heading_error` or, with
        ``smoothing``, its low-passed state column; ``None``: 0) the ``steer``
        term. Zeros when ``gait`` is off.
        """
        out = phase.new_zeros(phase.shape[0], NUM_ACTUATED)
        if self.gait is None:
            return out
        g = self.gait
        sin = torch.sin(phase[:, 0])
        ahead = torch.zeros_like(sin) if forward_velocity is None else forward_velocity - command[:, 0]
        amplitude = g["stride"] * command[:, 0]
        if com_velocity is not None and g["capture"] != 0.0:
            amplitude = amplitude + g["capture"] * (com_velocity - command[:, 0])
        sway = g["sway"] * sin
        err = torch.zeros_like(sin) if heading_error is None else heading_error
        tilt = side = torch.zeros_like(sin)
        if lean is not None:
            tilt, side = (lean, side) if lean.dim() == 1 else (lean[:, 0], lean[:, 1])
        spin = torch.zeros_like(sin) if yaw_rate is None else yaw_rate - command[:, 2]
        cols = []
        waves = self._stride_waves(phase[:, 0])
        # The swing's lift, 0 within the double support (|sin(phase)| <= support) around phases 0 and pi.
        d = g["support"]
        for leg, s in ((0, torch.clamp_min((sin - d) / (1.0 - d), 0.0) ** 2),
                       (6, torch.clamp_min((-sin - d) / (1.0 - d), 0.0) ** 2)):
            lift = g["lift"] * s
            place = g["placement"] * ahead * s
            sign = 1.0 if leg == 0 else -1.0
            stance = 0.5 * (1.0 - sign * sin)  # 1 at mid-stance, 0 at mid-swing
            weight = g["torso"] * stance - g["level"] * (1.0 - stance)
            upright, upright_side = tilt * weight, g["roll"] * side * weight
            # Differential stride: turned left of the commanded heading, the right leg strides further (the
            # sign measured to straighten the walk; the other one turned the robots faster).
            stride = (amplitude - sign * (g["steer"] * err + g["steer_rate"] * spin)) * waves[leg // 6]
            yaw = g["turn"] * spin * stance
            # hip pitch, hip roll, hip yaw, knee, ankle pitch, ankle roll
            cols += [-lift + stride - place + upright, sway + upright_side, yaw,
                     2.0 * lift, -lift - stride + place, -sway]
        out[:, :12] = torch.stack(cols, -1)
        if g["twist"] != 0.0 or g["counter"] != 0.0:
            # The torso as a reaction wheel: the waist yaw turns the torso with the pelvis's yaw rate
            # (twist) and its heading error (counter); the servo's reaction turns the pelvis back.
            out[:, 12] = g["twist"] * spin + g["counter"] * err
        return out

    def _stride_waves(self, phase: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The left and right hip's stride waveforms ``(N,)`` each, in ``[-1.09, 1.09]`` (key ``profile``).

        ``profile`` 0: ``cos(phase)`` and ``-cos(phase)``. ``profile`` 1: the stance leg's hip sweeps
        back at a constant rate (``-1 + 2u`` over the stance's fraction ``u``) and the swing leg's
        forward along the cubic ``8u^3 - 12u^2 + 2u + 1`` over the swing's fraction ``u``, which
        starts and ends at the stance's rate: the foot leaves the ground and lands moving back under
        the pelvis (a swing-leg retraction), not forward. In between: a blend of the two.
        """
        p = self.gait["profile"]
        left = torch.cos(phase)
        if p == 0.0:
            return left, -left
        out = []
        for shift in (0.0, math.pi):
            x = torch.remainder(phase + shift, 2 * math.pi) / math.pi  # [0, 1): swing, [1, 2): stance
            u = torch.where(x < 1.0, x, x - 1.0)
            hermite = torch.where(x < 1.0, ((8.0 * u - 12.0) * u + 2.0) * u + 1.0, 2.0 * u - 1.0)
            out.append((1.0 - p) * (left if shift == 0.0 else -left) + p * hermite)
        return out[0], out[1]

    def heading_error(self, state: torch.Tensor) -> torch.Tensor:
        """The pelvis's heading minus the commanded heading ``(N,)``, rad in ``[-pi, pi)`` (needs ``gait=``).

        The heading is the yaw of the pelvis's x axis projected on the ground;
        the commanded heading (state column 90, ``split(state)['heading']``) starts at the reset's
        heading and turns at the commanded yaw rate. Positive: the pelvis has
        turned left of it.
        """
        if self.gait is None:
            raise InputError("heading_error needs the stepping prior's state (gait=...): the commanded heading "
                             "is state column 90")
        return _heading_error(state[:, :7], state[:, 90])

    def arm_offsets(self, phase: torch.Tensor, command: torch.Tensor) -> torch.Tensor:
        """The arm swing's servo-target offsets ``(N, 14)`` of the arm joints, rad (``gait`` key ``arms``).

        Each shoulder pitch swings with the other side's hip stride (``arms``
        times its stride offset, the part of :meth:`gait_offsets` that scales with
        the command): the right arm forward as the left leg swings forward, as
        in human walking, against the legs' twist of the body about the vertical.
        """
        out = phase.new_zeros(phase.shape[0], len(G1_JOINTS) - NUM_ACTUATED)
        if self.gait is None or self.gait["arms"] == 0.0:
            return out
        g = self.gait
        left_hip = g["stride"] * command[:, 0] * self._stride_waves(phase[:, 0])[0]
        out[:, 0] = -g["arms"] * left_hip  # left shoulder pitch: with the right hip's stride (-left_hip)
        out[:, 7] = g["arms"] * left_hip  # right shoulder pitch: with the left hip's
        return out

    def is_terminal(self, state: torch.Tensor) -> torch.Tensor:
        tilted = self.projected_gravity(state)[..., 2] > -0.5
        low = state[..., 2] < 0.6 * self.stand_height
        return tilted | low

    # ------------------------------------------------------ shipped policy
    #: The policy file ``examples/humanoid_balance.py --ship`` writes.
    SHIPPED_POLICY = "policies/humanoid_balance.pt"

    @classmethod
    def pretrained(cls, num_envs: int = 1, **overrides):
        """The shipped balancing policy and an env built as it was trained.

        The file (``backdrive/data/policies/humanoid_balance.pt``) holds the
        policy's weights, its training settings and the env keywords, read
        with ``torch.load(weights_only=True)``; ``examples/humanoid_balance.py
        --ship`` reproduces it. The shipped policy is a SHAC-trained residual
        on top of the capture-point balance prior (the env keywords carry
        ``balance_feedback=G1_CAPTURE_FEEDBACK`` and ``feet="sole"``): 32 of 32
        robots upright over 10 s with pushes of up to 0.5 m/s every 4 s on
        average, as the prior alone (``docs/locomotion.md``). Needs
        example-robot-data (the G1 model).

        Args:
            num_envs: copies of the env.
            **overrides: env keywords to change (e.g. ``dtype``, ``push_velocity``).

        Returns:
            ``(env, policy)``; ``policy(obs)`` gives the actions.

        Raises:
            FileNotFoundError: the policy file is missing (a source tree without it).
        """
        from importlib.resources import files

        resource = files("backdrive.data").joinpath(cls.SHIPPED_POLICY)
        if not resource.is_file():
            raise FileNotFoundError(
                f"no shipped humanoid policy ({cls.SHIPPED_POLICY} in backdrive.data): this source tree lacks "
                "the file the package ships (docs/locomotion.md, HumanoidBalance); "
                "`python examples/humanoid_balance.py --ship` writes one"
            )
        return load_shipped(cls, num_envs, overrides)

    # ---------------------------------------------------------- evaluation
    @torch.no_grad()
    def evaluate(self, policy=None, command=(0.0, 0.0, 0.0), *, seconds: float = 10.0, seed: int = 0) -> dict:
        """Run ``policy`` (``None``: zero action, the PD servos alone) in every copy and measure the balance.

        The env is reset (``seed``) and autoreset is off for the run (restored
        after); a copy that falls stays fallen.

        Args:
            policy: ``obs (N, obs_dim) -> action (N, 15)``, or ``None``.
            command: ``(vx, vy, yaw)`` within :attr:`command_ranges`.
            seconds: episode length, s.
            seed: the reset's and the pushes' seed.

        Returns:
            dict with ``upright`` (fraction of copies that never fell),
            ``fell`` (how many fell), ``pushes`` (mean pushes per copy),
            ``pushes_survived`` (fraction of pushes after which the copy did
            not fall within 2 s), ``forward_speed`` (mean base-frame ``vx`` of
            the upright copies, m/s), ``base_speed`` (mean horizontal
            base-frame speed of the upright copies, m/s), ``height`` (mean
            pelvis height of the upright copies, m), ``q`` ``(T + 1, N, 36)``,
            ``push`` ``(T, N)`` (push magnitudes, m/s), ``fall_step`` ``(N,)``
            (-1: never) and ``rewards`` ``(T, N)`` (zero after a copy's fall).

        Raises:
            InputError: a command outside :attr:`command_ranges`.
        """
        autoreset = self.autoreset
        self.autoreset = False
        try:
            self.reset(seed=seed)
            obs = self.set_command(torch.as_tensor(command, dtype=self.dtype, device=self.device))
            steps = int(round(seconds / self.dt))
            alive = torch.ones(self.num_envs, dtype=torch.bool, device=self.device)
            fall_step = torch.full((self.num_envs,), -1, dtype=torch.long, device=self.device)
            zero = torch.zeros(self.num_envs, NUM_ACTUATED, dtype=self.dtype, device=self.device)
            qs, vel, pushes, rewards = [self.state[:, :36].clone()], [], [], []
            for t in range(steps):
                obs, r, term, _, _ = self.step(zero if policy is None else policy(obs))
                # The episode ends at a fall: later rewards (of a robot lying down) do not count.
                rewards.append(torch.where(alive, r, torch.zeros_like(r)))
                fall_step = torch.where(alive & term, torch.full_like(fall_step, t), fall_step)
                alive &= ~term
                pushes.append(torch.linalg.vector_norm(self.last_push, dim=-1) * alive
                              if self.push_velocity > 0 else torch.zeros_like(r))
                qs.append(self.state[:, :36].clone())
                vel.append(torch.where(alive[:, None], self.state[:, 36:39], torch.nan))
        finally:
            self.autoreset = autoreset
        q = torch.stack(qs)
        V = torch.stack(vel)
        P = torch.stack(pushes)
        hit = P > 0
        # A push is survived when its copy does not fall within 2 s of it.
        t_idx = torch.arange(P.shape[0], device=P.device)[:, None].expand_as(P)
        window = int(round(2.0 / self.dt))
        fell_after = (fall_step[None, :] >= 0) & (fall_step[None, :] - t_idx <= window)
        n_push = int(hit.sum())
        z = torch.where(torch.isfinite(V[..., 0]), q[1:, :, 2], torch.nan)
        return {
            "upright": float(alive.double().mean()),
            "fell": int((~alive).sum()),
            "pushes": n_push / self.num_envs,
            "pushes_survived": float((hit & ~fell_after).sum()) / n_push if n_push else math.nan,
            "forward_speed": float(torch.nanmean(V[..., 0])),
            "base_speed": float(torch.nanmean(torch.linalg.vector_norm(V[..., :2], dim=-1))),
            "height": float(torch.nanmean(z)),
            "q": q,
            "push": P,
            "fall_step": fall_step,
            "rewards": torch.stack(rewards),
        }

    def __repr__(self) -> str:
        return (f"HumanoidBalance(num_envs={self.num_envs}, dt={self.dt}, substeps={self.substeps}, "
                f"push_velocity={self.push_velocity}, dtype={self.dtype})")
