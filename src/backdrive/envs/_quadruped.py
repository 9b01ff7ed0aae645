"""Quadruped locomotion through backdrive's contact simulator: ``QuadrupedWalk``."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

import torch

from .._constants import constant
from .._errors import InputError, InvalidValueError, PolicyConfigError
from ..spatial import quat_apply, quat_conjugate
from ._base import DiffEnv

__all__ = ["QuadrupedWalk", "Randomization", "REWARD_WEIGHTS", "COMMAND_RANGES"]

#: The env's leg order: observations, actions, contact indicators and air
#: times come in this order whatever order the robot's URDF gives its legs.
LEGS = ("FL", "FR", "RL", "RR")

#: Default command ranges: forward ``vx`` (m/s), lateral ``vy`` (m/s) and
#: yaw rate ``yaw`` (rad/s), each sampled uniformly per episode.
COMMAND_RANGES: dict[str, tuple[float, float]] = {"vx": (-1.0, 1.0), "vy": (-0.5, 0.5), "yaw": (-1.0, 1.0)}

#: Default reward weights (see :class:`QuadrupedWalk` for each term).
REWARD_WEIGHTS: dict[str, float] = {
    "tracking_lin": 1.0,
    "tracking_yaw": 0.5,
    "lin_vel_z": 1.0,
    "ang_vel_xy": 0.05,
    "orientation": 2.0,
    "height": 20.0,
    "torque": 2e-4,
    "action_rate": 0.01,
    "foot_slip": 0.05,
    "air_time": 0.5,
}

#: The joints of one leg, in the env's order within a leg.
LEG_JOINTS = ("hip", "thigh", "calf")

# Per-robot settings: what ``backdrive.data.load`` calls it, the foot
# sphere radius (the URDF's foot collision sphere), the standing joint
# angles (hip, thigh, calf) and the standing base height (measured: the
# settled height of the nominal pose under the default PD and contact after
# 2 s, tests/test_locomotion.py checks it within 2 cm). Joints are
# ``{leg}_{hip,thigh,calf}_joint`` and feet ``{leg}_foot`` on both robots.
_ROBOTS = {
    "quadruped": {"load": "quadruped", "radius": 0.02, "stand": (0.0, 0.8, -1.6), "height": 0.277},
    # Go1 (example-robot-data, 13.1 kg): the URDF's 2 cm foot spheres, the
    # standing pose of tests/test_contact_robots.py.
    "go1": {"load": "example-robot-data:go1", "radius": 0.02, "stand": (0.0, 0.8, -1.5), "height": 0.311},
}


def parse_command_ranges(given, base: Mapping[str, tuple[float, float]]) -> dict[str, tuple[float, float]]:
    """``base`` updated by the user's ``command_ranges``; each must be a key of
    :data:`COMMAND_RANGES` with a finite ``(low, high)``, ``low <= high``."""
    ranges = dict(base)
    for k, r in dict(given or {}).items():
        if k not in COMMAND_RANGES:
            raise InputError(f"unknown command {k!r}; valid: {', '.join(map(repr, COMMAND_RANGES))}")
        lo, hi = (float(x) for x in r)
        if not (math.isfinite(lo) and math.isfinite(hi) and lo <= hi):
            raise InputError(f"command range {k} must be (low, high) with low <= high, got {r!r}")
        ranges[k] = (lo, hi)
    return ranges


def parse_reward_weights(given, defaults: Mapping[str, float]) -> dict[str, float]:
    """``defaults`` updated by the user's ``reward_weights`` (known terms, finite numbers)."""
    weights = dict(defaults)
    for k, w in dict(given or {}).items():
        if k not in defaults:
            raise InputError(f"unknown reward term {k!r}; valid: {', '.join(map(repr, defaults))}")
        if isinstance(w, bool) or not (isinstance(w, (int, float)) and math.isfinite(w)):
            raise InputError(f"reward weight {k} must be a finite number, got {w!r}")
        weights[k] = float(w)
    return weights


def gravity_in_base(state: torch.Tensor) -> torch.Tensor:
    """Gravity's direction in the floating base's frame ``(..., 3)`` from a
    state whose ``[..., 3:7]`` is the base quaternion (``(0, 0, -1)`` upright)."""
    quat = state[..., 3:7]
    # Made once per dtype and device (a constant made here would be copied to a GPU at every step).
    down = constant((0.0, 0.0, -1.0), state.dtype, state.device).expand(quat.shape[:-1] + (3,))
    return quat_apply(quat_conjugate(quat), down)


def read_shipped(policy_file: str, with_policy: bool = False):
    """The checkpoint dict of the policy file ``policy_file`` in
    ``backdrive.data`` (read with ``weights_only=True``); with
    ``with_policy``, ``(checkpoint, policy)``."""
    from importlib.resources import as_file, files

    from ..optim._policy.checkpoints import load_policy, read_checkpoint

    with as_file(files("backdrive.data").joinpath(policy_file)) as path:
        ckpt = read_checkpoint(path)
        return (ckpt, load_policy(path)) if with_policy else ckpt


def load_shipped(cls, num_envs: int, overrides: dict, policy_file: str | None = None):
    """``(env, policy)`` from the policy file ``policy_file`` (default
    ``cls.SHIPPED_POLICY``) in ``backdrive.data``, the env built with the
    checkpoint's keywords and ``overrides``."""
    ckpt, policy = read_shipped(policy_file or cls.SHIPPED_POLICY, with_policy=True)
    kwargs = {k: (tuple(v) if isinstance(v, list) else v) for k, v in ckpt.get("env_kwargs", {}).items()}
    if "command_ranges" in kwargs:
        kwargs["command_ranges"] = {k: tuple(v) for k, v in kwargs["command_ranges"].items()}
    env = cls(num_envs, **{**kwargs, **overrides})
    return env, policy.to(dtype=env.dtype, device=env.device)


@dataclasses.dataclass(frozen=True)
class Randomization:
    """Domain randomisation of :class:`QuadrupedWalk`, drawn per episode (pushes per step).

    Each range is ``(low, high)`` for a uniform draw; ``None`` keeps the
    nominal value.

    Attributes:
        friction: Coulomb coefficient of the feet on the ground (nominal 0.75).
        stiffness_scale: factor on the contact stiffness (nominal 4e4 N/m).
        motor_strength: factor on the PD servos' stiffness ``kp`` (the
            position error's torque; the damping ``kd`` is unchanged).
        push_velocity: a push changes the base's horizontal velocity by up to
            this much per axis (m/s, uniform in ``[-p, p]``); 0: no pushes.
        push_interval: mean time between pushes, s (each control step pushes
            with probability ``dt / push_interval``).
        base_mass: factors on the base (trunk) body's mass and rotational
            inertia, one drawn per episode uniformly from this finite set
            (e.g. ``(0.8, 1.0, 1.2)``), or ``None`` (nominal; the default).
            A finite set because backdrive's dynamics take one mass per link
            for the whole batch: the env keeps one simulator per factor and
            steps each group of copies with its own, so every extra factor
            adds one simulator call per physics substep.
    """

    friction: tuple[float, float] | None = (0.5, 1.25)
    stiffness_scale: tuple[float, float] | None = (0.5, 2.0)
    motor_strength: tuple[float, float] | None = (0.9, 1.1)
    push_velocity: float = 0.5
    push_interval: float = 4.0
    base_mass: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        for name in ("friction", "stiffness_scale", "motor_strength"):
            r = getattr(self, name)
            if r is None:
                continue
            if not (isinstance(r, (tuple, list)) and len(r) == 2 and 0 < float(r[0]) <= float(r[1]) < math.inf):
                raise InvalidValueError(f"Randomization.{name} must be (low, high) with 0 < low <= high, got {r!r}")
        if not (math.isfinite(self.push_velocity) and self.push_velocity >= 0):
            raise InvalidValueError(f"Randomization.push_velocity must be >= 0 m/s, got {self.push_velocity!r}")
        if not (math.isfinite(self.push_interval) and self.push_interval > 0):
            raise InvalidValueError(f"Randomization.push_interval must be > 0 s, got {self.push_interval!r}")
        if self.base_mass is not None:
            m = self.base_mass
            if not (isinstance(m, (tuple, list)) and len(m) >= 1
                    and all(isinstance(x, (int, float)) and math.isfinite(x) and x > 0 for x in m)):
                raise InvalidValueError(f"Randomization.base_mass must be a tuple of factors > 0, got {m!r}")
            object.__setattr__(self, "base_mass", tuple(sorted({float(x) for x in m})))


class QuadrupedWalk(DiffEnv):
    r"""A quadruped that tracks a velocity command, differentiable through contact.

    The robot is the shipped 12-dof ``"quadruped"`` (12.4 kg, legs FL, FR,
    RL, RR of hip, thigh and calf joints), ``"go1"`` (example-robot-data's
    Unitree Go1, 13.1 kg, legs in the URDF order FR, FL, RR, RL) or a
    floating-base robot with joints ``{leg}_{hip,thigh,calf}_joint`` and feet
    ``{leg}_foot`` in any order, with a floating
    base and one contact sphere per foot on a flat ground, simulated by
    :class:`backdrive.sim.Simulator` with ``contact=`` (the implicit contact
    step, ``docs/contact.md``).

    Control at ``1 / dt`` Hz (default 50 Hz) with ``substeps`` physics steps
    per control step (default 4 of 5 ms: at 10 ms a robot that lands
    unevenly slides and collapses where 5 ms and 2 ms agree within 1 mm;
    ``docs/locomotion.md`` gives the measurements). The action ``a`` in ``[-1, 1]^12`` sets
    the PD servo targets ``q_stand + action_scale * a`` around the standing
    pose; the servos are ``tau = kp (target - q) - kd qdot`` with the URDF's
    effort limits (smoothly saturated), ``kd`` treated implicitly.

    Leg order: legs are found by joint name, and the action, the joint parts
    of the observation, the last action, the foot air times and contact
    indicators all come in the env's fixed order :data:`LEGS` (FL, FR, RL,
    RR), each leg (hip, thigh, calf), whatever order the robot has, so one
    policy layout fits every robot. Only ``q`` and ``v`` of the state are in
    the robot's own joint order (the simulator's); :attr:`joint_index` maps
    the env's order to the robot's joint coordinates.

    State ``(N, 65)`` (named parts: :meth:`split`): ``q (19)``, ``v (18)``
    (base twist in the base frame), the last action (12), the command
    ``(vx, vy, yaw)`` (3), each foot's time in the air (4, s) and contact
    indicator (4), the episode's friction, contact-stiffness factor and
    motor strength (3), the gait clock's phase (1, rad) and the episode's
    base-mass factor (1).

    Observation ``(N, 47)``, what a real robot measures: joint positions
    relative to the standing pose (12), joint velocities (12), base angular
    velocity in the base frame (3), gravity's direction in the base frame
    (3), the last action (12), the command (3) and the gait clock
    ``(cos, sin)`` of the phase (2). ``privileged=True`` appends the base
    linear velocity (base frame, 3) and height (1), as a state estimator
    would give them.

    Gait prior (off by default): with ``gait_frequency > 0`` the clock
    advances at that frequency and :meth:`gait_offsets` (a trot that lifts
    diagonal feet in turn) is added to the servo targets, so the policy
    learns a correction of a stepping pattern (Iscen et al. 2018, "Policies
    Modulating Trajectory Generators").

    Reward per step (weights :data:`REWARD_WEIGHTS`, all smooth):

    * ``tracking_lin * exp(-|v_xy - cmd_xy|^2 / 0.25)``: base-frame velocity;
    * ``tracking_yaw * exp(-(w_z - cmd_yaw)^2 / 0.25)``;
    * ``- lin_vel_z * v_z^2 - ang_vel_xy * |w_xy|^2``;
    * ``- orientation * |g_xy|^2`` (gravity's tilt in the base frame);
    * ``- height * (z - z_stand)^2``;
    * ``- torque * |tau|^2`` (mean over the substeps);
    * ``- action_rate * |a - a_prev|^2``;
    * ``- foot_slip * sum_f c_f |v_f,xy|^2`` with the contact indicator
      ``c_f = 1 - exp(-f_n / 10 N)``;
    * ``+ air_time * sum_f (t_air,f - 0.25 s) * c_f (1 - c_f,prev)`` (a
      reward for steps of more than 0.25 s in the air, paid at touch-down),
      only while the command asks for motion (``|cmd| > 0.1``).

    Episodes end by a fall (gravity more than 60 degrees from the base's
    -z axis, or the base below ``0.5 z_stand``) or after
    ``max_episode_steps`` (default 500, 10 s). There is no fall penalty or
    bonus: a fall just ends the stream of (mostly positive) rewards.

    Args:
        num_envs: copies N.
        robot: ``None`` or ``"quadruped"`` (shipped), ``"go1"`` (needs
            example-robot-data), or a floating-base RobotModel with the
            joints and feet named as above (the settings of the robot of
            that name, else the shipped quadruped's).
        dt: control period, s. substeps: physics steps per control period.
        kp, kd: PD servo gains, N m/rad and N m s/rad.
        action_scale: rad of target offset per unit of action.
        command_ranges: ``{"vx": (lo, hi), "vy": ..., "yaw": ...}`` (missing
            keys keep :data:`COMMAND_RANGES`); ``lo == hi`` fixes a value.
        reward_weights: overrides of :data:`REWARD_WEIGHTS`.
        randomization: a :class:`Randomization` or ``None`` (nominal physics).
        privileged: also observe the base linear velocity and height.
        init_noise: half-width of the uniform joint-angle noise at reset, rad.
        gait_frequency: Hz of the trot generator (0: off).
        gait_amplitude: rad of thigh lift of the trot generator.
        max_episode_steps: truncation length.
        compile: step the physics through :func:`backdrive.sim.compile_step`
            (``torch.compile`` of the contact step, with its eager fallback):
            ``False`` (default), ``True`` (inductor) or a ``torch.compile``
            backend name. Compiled once per batch size, dtype and grad mode
            (minutes on a CPU); applies to nominal physics (with
            randomised friction, stiffness or base mass those steps run
            eagerly). ``docs/scaling.md``, *The per-step cost*, has its cost.
        contact: the ground's :class:`~backdrive.contact.ContactParameters`
            (default ``ContactParameters()``; tensor values, such as a
            fit's float64 ones, are converted to the env's dtype and
            device); with ``randomization``, the randomised friction and
            stiffness scale are drawn around it.
            A calibrated contact law goes here (docs/simulation.md,
            *Training in the calibrated sim*).
        action_delay: physics substeps (0 to ``substeps``) into each control
            period before the new servo target acts; until then the
            previous period's target holds, as on a robot whose commands
            arrive late (``ContactFit``'s ``fit.delay``).
        dtype, device, autoreset: see :class:`DiffEnv`.
    """

    action_dim = 12
    state_dim = 65

    def __init__(
        self,
        num_envs: int = 1,
        *,
        robot=None,
        dt: float = 0.02,
        substeps: int = 4,
        kp: float = 40.0,
        kd: float = 1.0,
        action_scale: float = 0.5,
        command_ranges: Mapping[str, tuple[float, float]] | None = None,
        reward_weights: Mapping[str, float] | None = None,
        randomization: Randomization | None = None,
        privileged: bool = False,
        init_noise: float = 0.1,
        gait_frequency: float = 0.0,
        gait_amplitude: float = 0.25,
        max_episode_steps: int = 500,
        compile: bool | str = False,
        contact=None,
        action_delay: int = 0,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
        autoreset: bool = True,
    ) -> None:
        super().__init__(num_envs, dtype=dtype, device=device, autoreset=autoreset)
        from ..contact import ContactGeometry, ContactModel, ContactParameters
        from ..data import load
        from ..model import RobotModel
        from ..sim import PDActuator, Simulator

        name = "quadruped" if robot is None else robot
        if isinstance(name, str):
            if name not in _ROBOTS:
                raise InputError(f"unknown robot {name!r}; valid: {', '.join(map(repr, _ROBOTS))} or a RobotModel")
            spec = _ROBOTS[name]
            robot = load(spec["load"], floating_base=True, dtype=self.dtype, device=self.device)
        elif isinstance(robot, RobotModel):
            spec = _ROBOTS.get(robot.name, _ROBOTS["quadruped"])
            if robot.dtype != self.dtype or robot.device != self.device:
                raise InputError(f"robot is {robot.dtype} on {robot.device}, the env {self.dtype} on {self.device}")
        else:
            raise InputError(f"robot must be None, a name or a RobotModel, got {type(robot).__name__}")
        if not robot.floating_base:
            raise InputError("QuadrupedWalk needs a floating-base robot (load(..., floating_base=True))")
        joints = tuple(f"{leg}_{j}_joint" for leg in LEGS for j in LEG_JOINTS)
        missing = [j for j in joints if j not in robot.joint_names]
        if missing or len(robot.joint_names) != len(joints):
            raise InputError(f"QuadrupedWalk needs the 12 joints {joints} (any order), got "
                             f"{tuple(robot.joint_names)}" + (f"; missing {missing}" if missing else ""))
        feet = tuple(f"{leg}_foot" for leg in LEGS)
        missing = [f for f in feet if f not in robot.link_names]
        if missing:
            raise InputError(f"QuadrupedWalk needs the foot links {feet}; missing {missing}")
        for k, (x, what) in {
            "dt": (dt, "s"), "kp": (kp, "N m/rad"), "kd": (kd, "N m s/rad"), "action_scale": (action_scale, "rad"),
        }.items():
            if not (isinstance(x, (int, float)) and math.isfinite(x) and x > 0):
                raise InputError(f"{k} must be a positive number ({what}), got {x!r}")
        for k, x in (("substeps", substeps), ("max_episode_steps", max_episode_steps)):
            if isinstance(x, bool) or not isinstance(x, int) or x < 1:
                raise InputError(f"{k} must be a positive int, got {x!r}")
        if isinstance(action_delay, bool) or not isinstance(action_delay, int) or not 0 <= action_delay <= substeps:
            raise InputError(f"action_delay must be an int of physics substeps from 0 to substeps ({substeps}), "
                             f"got {action_delay!r}")
        if contact is not None and not isinstance(contact, ContactParameters):
            raise InputError(f"contact must be a ContactParameters or None, got {type(contact).__name__}")
        #: Physics substeps into each control period before a new target acts (the previous one holds).
        self.action_delay = action_delay
        if randomization is not None and not isinstance(randomization, Randomization):
            raise InputError(f"randomization must be a Randomization or None, got {type(randomization).__name__}")
        if not isinstance(compile, (bool, str)) or compile == "":
            raise InputError(f"compile must be True, False or a torch.compile backend name, got {compile!r}")

        ranges = parse_command_ranges(command_ranges, COMMAND_RANGES)
        weights = parse_reward_weights(reward_weights, REWARD_WEIGHTS)

        self.robot = robot
        self.robot_name = name if isinstance(name, str) else robot.name
        self.dt = float(dt)
        self.substeps = substeps
        self.physics_dt = self.dt / substeps
        self.kp, self.kd = float(kp), float(kd)
        self.action_scale = float(action_scale)
        self.command_ranges = ranges
        self.reward_weights = weights
        self.randomization = randomization
        self.privileged = bool(privileged)
        self.init_noise = float(init_noise)
        self.max_episode_steps = max_episode_steps
        for k, x in (("gait_frequency", gait_frequency), ("gait_amplitude", gait_amplitude)):
            if not (isinstance(x, (int, float)) and math.isfinite(x) and x >= 0):
                raise InputError(f"{k} must be a number >= 0, got {x!r}")
        self.gait_frequency = float(gait_frequency)
        self.gait_amplitude = float(gait_amplitude)
        self.obs_dim = 47 + (4 if self.privileged else 0)
        self.feet = feet
        kw = {"dtype": self.dtype, "device": self.device}
        #: ``(12,)`` int64: the robot's joint coordinate of each env joint
        #: (env order: :data:`LEGS` x (hip, thigh, calf)).
        self.joint_index = torch.tensor([robot.joint_names.index(j) for j in joints], device=self.device)
        identity = bool((self.joint_index == torch.arange(12, device=self.device)).all())
        # None when the robot's order is the env's (the shipped quadruped): no gathers.
        self._to_env = None if identity else self.joint_index
        self._to_robot = None if identity else torch.argsort(self.joint_index)
        #: Standing joint angles ``(12,)``, rad, in the env's joint order.
        self.q_stand = torch.tensor(spec["stand"] * 4, **kw)
        self._q_stand_robot = self.to_robot_order(self.q_stand)
        self.stand_height = float(spec["height"])
        # The standing pose a non-finite copy is stepped from (made once: not a host-to-device copy per step).
        self._safe_q = torch.cat([torch.tensor([0.0, 0.0, self.stand_height, 1.0, 0.0, 0.0, 0.0], **kw), self._q_stand_robot])
        self._cmd_low = torch.tensor([ranges[k][0] for k in COMMAND_RANGES], **kw)
        self._cmd_high = torch.tensor([ranges[k][1] for k in COMMAND_RANGES], **kw)
        if contact is None:
            contact = ContactParameters()
        else:  # tensor values (a fit's, often float64) in the env's dtype and device
            contact = contact.replace(**{f.name: getattr(contact, f.name).to(**kw) for f in dataclasses.fields(contact)
                                         if isinstance(getattr(contact, f.name), torch.Tensor)})
        self.nominal_contact = contact
        self.geometry = ContactGeometry.spheres(robot, {f: spec["radius"] for f in self.feet})
        self._ContactModel, self._ContactParameters = ContactModel, ContactParameters
        self._actuator = PDActuator(kp=self.kp, kd=self.kd)
        self._Simulator = Simulator
        self.contact = ContactModel(robot, self.geometry, params=self.nominal_contact)
        self.sim = Simulator(robot, self.physics_dt, actuator=self._actuator, contact=self.contact)
        #: The compiled step of :attr:`sim` (``compile=``), or ``None``.
        self.compiled_step = None
        if compile:
            from ..sim import compile_step

            self.compiled_step = compile_step(self.sim, backend="inductor" if compile is True else compile,
                                              contact_record=("normal_force", "slip_velocity"))
        # One robot per base-mass factor (Randomization.base_mass): the
        # dynamics take one mass per link for the whole batch.
        levels = (1.0,) if randomization is None or randomization.base_mass is None else randomization.base_mass
        self.mass_levels = torch.tensor(levels, **kw)
        # Whether initial_state draws a base-mass factor (decided here: reading
        # mass_levels there would be a host synchronisation at every step on a GPU).
        self._draws_mass = len(levels) > 1 or float(levels[0]) != 1.0
        self._robots = [self._with_base_mass(f) for f in levels]

    def _with_base_mass(self, factor: float):
        """The robot with its base body's mass and rotational inertia scaled by ``factor``."""
        if factor == 1.0:
            return self.robot
        mass, inertia = self.robot.body_mass.clone(), self.robot.body_inertia.clone()
        mass[0] = mass[0] * factor  # body 0: the floating base
        inertia[0] = inertia[0] * factor
        return self.robot.replace(body_mass=mass, body_inertia=inertia)

    def to_robot_order(self, x: torch.Tensor) -> torch.Tensor:
        """Joint values ``(..., 12)`` in the env's order, rearranged into the robot's joint order."""
        return x if self._to_robot is None else x[..., self._to_robot]

    def to_env_order(self, x: torch.Tensor) -> torch.Tensor:
        """Joint values ``(..., 12)`` in the robot's joint order, rearranged into the env's order."""
        return x if self._to_env is None else x[..., self._to_env]

    # ------------------------------------------------------------- layout
    @staticmethod
    def split(state: torch.Tensor) -> dict[str, torch.Tensor]:
        """The named parts of a state ``(..., 65)`` (views)."""
        names = (("q", 19), ("v", 18), ("last_action", 12), ("command", 3), ("air_time", 4), ("contact", 4),
                 ("friction", 1), ("stiffness_scale", 1), ("motor_strength", 1), ("phase", 1), ("mass_scale", 1))
        out, i = {}, 0
        for k, n in names:
            out[k] = state[..., i:i + n]
            i += n
        return out

    @property
    def action_low(self) -> torch.Tensor:
        return torch.full((12,), -1.0, dtype=self.dtype, device=self.device)

    @property
    def action_high(self) -> torch.Tensor:
        return torch.full((12,), 1.0, dtype=self.dtype, device=self.device)

    # ------------------------------------------------------------ commands
    def check_command(self, command: torch.Tensor) -> torch.Tensor:
        """``command`` ``(3,)`` or ``(N, 3)`` as ``(N, 3)``, checked against the ranges.

        Raises:
            InputError: wrong shape, dtype or device, or a value outside
                :attr:`command_ranges` (naming the component and its range).
        """
        command = torch.as_tensor(command, dtype=self.dtype, device=self.device)
        if command.shape not in ((3,), (self.num_envs, 3)):
            raise InputError(f"command must have shape (3,) or ({self.num_envs}, 3) as (vx, vy, yaw), "
                             f"got {tuple(command.shape)}")
        command = command.expand(self.num_envs, 3)
        for i, k in enumerate(COMMAND_RANGES):
            lo, hi = self.command_ranges[k]
            c = command[:, i]
            bad = ~((c >= lo - 1e-6) & (c <= hi + 1e-6))
            if bool(bad.any()):
                j = int(torch.nonzero(bad)[0])
                raise InputError(f"command {k} = {float(c[j]):.4g} (env {j}) is outside its range [{lo}, {hi}]; "
                                 "build the env with command_ranges= to widen it")
        return command

    def set_command(self, command: torch.Tensor) -> torch.Tensor:
        """Replace the current command of every copy (``(3,)`` or ``(N, 3)``); returns the observations.

        Raises:
            InputError: see :meth:`check_command`.
        """
        command = self.check_command(command)
        state = self.state.clone()
        self.split(state)["command"].copy_(command)
        self._state = state
        return self.observe(state)

    # ------------------------------------------------------------ dynamics
    def initial_state(self, n: int, generator: torch.Generator) -> torch.Tensor:
        kw = {"dtype": self.dtype, "device": self.device}
        yaw = self._uniform(-math.pi, math.pi, (n,), generator)
        quat = torch.stack([torch.cos(yaw / 2), torch.zeros_like(yaw), torch.zeros_like(yaw), torch.sin(yaw / 2)], -1)
        pos = torch.zeros(n, 3, **kw)
        pos[:, 2] = self.stand_height + 0.005
        joints = self._q_stand_robot + self._uniform(-self.init_noise, self.init_noise, (n, 12), generator)
        v = torch.zeros(n, 18, **kw)
        v[:, :3] = self._uniform(-0.1, 0.1, (n, 3), generator)
        cmd = self._uniform(self._cmd_low, self._cmd_high, (n, 3), generator)
        air = torch.zeros(n, 4, **kw)
        contact = torch.ones(n, 4, **kw)
        r = self.randomization
        dr = torch.ones(n, 3, **kw)
        friction = self.nominal_contact.friction  # a tensor (a fit's) copied on the device, not read on the host
        dr[:, 0] = friction.detach().reshape(()) if isinstance(friction, torch.Tensor) else float(friction)
        if r is not None:
            for i, rng in enumerate((r.friction, r.stiffness_scale, r.motor_strength)):
                if rng is not None:
                    dr[:, i] = self._uniform(rng[0], rng[1], (n,), generator)
        phase = self._uniform(0.0, 2 * math.pi, (n, 1), generator)
        mass = torch.ones(n, 1, **kw)
        if self._draws_mass:
            # Drawn last, so the draws above are those of an env without it.
            pick = torch.randint(len(self.mass_levels), (n,), generator=generator, device=generator.device)
            mass = self.mass_levels[pick.to(self.device)][:, None]
        return torch.cat([pos, quat, joints, v, torch.zeros(n, 12, **kw), cmd, air, contact, dr, phase, mass], -1)

    def _simulators(self, parts: dict[str, torch.Tensor]) -> list:
        """``[(rows, simulator)]`` of this step: which copies (``None``: all) each simulator steps.

        One simulator for the whole batch (the shared one, or one with the
        batch's contact parameters), or one per base-mass factor present.
        """
        r = self.randomization
        per_copy_contact = r is not None and (r.friction is not None or r.stiffness_scale is not None)
        if len(self._robots) == 1:
            groups = [(None, self._robots[0])]
        else:
            m = parts["mass_scale"][:, 0]
            groups = []
            for level, robot in zip(self.mass_levels, self._robots, strict=True):
                rows = torch.nonzero((m - level).abs() < 1e-4 * level).flatten()
                if rows.numel():
                    groups.append((rows, robot))
        out = []
        for rows, robot in groups:
            if not per_copy_contact and robot is self.robot:
                # The compiled step for the whole batch (one shape: one graph).
                compiled = rows is None and self.compiled_step is not None
                out.append((rows, self.compiled_step if compiled else self.sim))
                continue
            params = self.nominal_contact
            if per_copy_contact:
                fr, ks = parts["friction"], parts["stiffness_scale"]
                if rows is not None:
                    fr, ks = fr[rows], ks[rows]
                params = params.replace(friction=fr, stiffness=float(self.nominal_contact.stiffness) * ks)
            cm = self._ContactModel(robot, self.geometry, params=params, unilateral=self.contact.unilateral)
            out.append((rows, self._Simulator(robot, self.physics_dt, actuator=self._actuator, contact=cm)))
        return out

    @staticmethod
    def _substep(groups, q: torch.Tensor, v: torch.Tensor, u: torch.Tensor):
        """One physics step of every copy: ``(q, v, effort, normal force, slip velocity)``."""
        from ..sim import Simulator, State

        outs = []
        for rows, sim in groups:
            qs, vs, us = (q, v, u) if rows is None else (q[rows], v[rows], u[rows])
            if not isinstance(sim, Simulator):  # a CompiledStep (QuadrupedWalk(compile=...))
                outs.append(sim.advance(qs, vs, us))
                continue
            traj = sim.rollout(State(qs, vs), us[:, None, :], check_finite=False)
            outs.append((traj.q[:, -1], traj.v[:, -1], traj.effort[:, -1], traj.contact.normal_force[:, -1],
                         traj.contact.slip_velocity[:, -1]))
        if len(groups) == 1 and groups[0][0] is None:
            return outs[0]
        # Back into the batch's row order (differentiable gathers).
        inverse = torch.argsort(torch.cat([rows for rows, _ in groups]))
        return tuple(torch.cat(xs)[inverse] for xs in zip(*outs, strict=True))

    def transition(self, state: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        p = self.split(state)
        action = action.clamp(-1.0, 1.0)
        q, v = p["q"], p["v"]
        r = self.randomization
        if r is not None and r.push_velocity > 0:
            n, g = v.shape[0], self._generator
            hit = torch.rand(n, generator=g, dtype=self.dtype, device=self.device) < self.dt / r.push_interval
            dv = torch.zeros(n, 3, dtype=self.dtype, device=self.device)
            dv[:, :2] = self._uniform(-r.push_velocity, r.push_velocity, (n, 2), g) * hit[:, None]
            dv_base = quat_apply(quat_conjugate(q[:, 3:7]), dv)
            v = torch.cat([v[:, :3] + dv_base, v[:, 3:]], -1)
        def servo_target(a, phase):
            t = self.to_robot_order(self.q_stand + self.action_scale * a + self.gait_offsets(phase))
            if r is not None and r.motor_strength is not None:
                # kp scaled by the motor strength s: kp (q + s (t - q) - q) = s kp (t - q).
                qj = q[:, 7:]
                t = qj + p["motor_strength"] * (t - qj)
            return t

        target = servo_target(action, p["phase"])
        held = None
        if self.action_delay:
            # The previous control period's target (its action, at its phase) acts for the first substeps.
            held = servo_target(p["last_action"], p["phase"] - 2 * math.pi * self.gait_frequency * self.dt)
            held = torch.where(torch.isfinite(held), held, target)
        groups = self._simulators(p)
        # A non-finite copy would stop the whole batch (the mass matrix's
        # Cholesky factorisation raises), so between substeps its rows are
        # replaced by the standing pose and marked; at the end they are NaN
        # again, and DiffEnv.step resets them and keeps them out of the gradient.
        bad = ~(torch.isfinite(q).all(-1) & torch.isfinite(v).all(-1) & torch.isfinite(target).all(-1))
        safe_q = self._safe_q.expand_as(q)
        effort2 = q.new_zeros(q.shape[0])
        for i in range(self.substeps):
            q = torch.where(bad[:, None], safe_q, q)
            v = torch.where(bad[:, None], torch.zeros_like(v), v)
            acting = held if i < self.action_delay else target
            u = torch.where(bad[:, None], self._q_stand_robot.expand_as(target), acting)
            q, v, effort, fn, slip = self._substep(groups, q, v, u)
            effort2 = effort2 + (effort ** 2).sum(-1) / self.substeps
            bad = bad | ~(torch.isfinite(q).all(-1) & torch.isfinite(v).all(-1))
        nan = torch.full_like(q, math.nan)
        q1 = torch.where(bad[:, None], nan, q)
        v1 = torch.where(bad[:, None], nan[:, :18], v)
        # fn (N, 4): applied in the last substep, feet in the env's order (self.feet).
        c = 1.0 - torch.exp(-torch.clamp_min(fn, 0.0) / 10.0)
        air = (p["air_time"] + self.dt) * (1.0 - c)
        # Kept for the reward: the mean squared effort and the slip of the last substep.
        self._aux = {
            "effort2": effort2,
            "slip2": (slip[..., :2] ** 2).sum(-1),
            "air_before": p["air_time"] + self.dt,
            "contact_before": p["contact"],
            "next": None,
        }
        phase = torch.remainder(p["phase"] + 2 * math.pi * self.gait_frequency * self.dt, 2 * math.pi)
        out = torch.cat([q1, v1, action, p["command"], air, c, p["friction"], p["stiffness_scale"],
                         p["motor_strength"], phase, p["mass_scale"]], -1)
        self._aux["next"] = out
        return out

    def _aux_for(self, next_state: torch.Tensor) -> dict[str, torch.Tensor]:
        aux = getattr(self, "_aux", None)
        if aux is None or aux["next"] is not next_state:
            raise InputError(
                "QuadrupedWalk.reward needs the transition it scores: call it right after transition() "
                "with that call's result (the effort and foot slip are taken from the physics substeps)"
            )
        return aux

    def reward_terms(
        self, state: torch.Tensor, action: torch.Tensor, next_state: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        """Each reward term ``(N,)`` before weighting (signs as added), for logging and plots."""
        aux = self._aux_for(next_state)
        p = self.split(next_state)
        q, v, cmd = p["q"], p["v"], p["command"]
        quat = q[:, 3:7]
        g = quat_apply(quat_conjugate(quat), constant((0.0, 0.0, -1.0), q.dtype, q.device))
        world_v = quat_apply(quat, v[:, :3])
        c = p["contact"]
        moving = (torch.linalg.vector_norm(cmd, dim=-1) > 0.1).to(q.dtype)
        first = c * (1.0 - aux["contact_before"])
        return {
            "tracking_lin": torch.exp(-((v[:, :2] - cmd[:, :2]) ** 2).sum(-1) / 0.25),
            "tracking_yaw": torch.exp(-((v[:, 5] - cmd[:, 2]) ** 2) / 0.25),
            "lin_vel_z": -world_v[:, 2] ** 2,
            "ang_vel_xy": -(v[:, 3:5] ** 2).sum(-1),
            "orientation": -(g[:, :2] ** 2).sum(-1),
            "height": -(q[:, 2] - self.stand_height) ** 2,
            "torque": -aux["effort2"],
            "action_rate": -((action.clamp(-1.0, 1.0) - self.split(state)["last_action"]) ** 2).sum(-1),
            "foot_slip": -(c * aux["slip2"]).sum(-1),
            "air_time": ((aux["air_before"] - 0.25) * first).sum(-1) * moving,
        }

    def reward(self, state: torch.Tensor, action: torch.Tensor, next_state: torch.Tensor) -> torch.Tensor:
        terms = self.reward_terms(state, action, next_state)
        w = self.reward_weights
        return sum(w[k] * t for k, t in terms.items())

    def projected_gravity(self, state: torch.Tensor) -> torch.Tensor:
        """Gravity's direction in the base frame ``(..., 3)`` (``(0, 0, -1)`` upright)."""
        return gravity_in_base(state)

    def observe(self, state: torch.Tensor) -> torch.Tensor:
        p = self.split(state)
        q, v = p["q"], p["v"]
        parts = [self.to_env_order(q[..., 7:]) - self.q_stand, self.to_env_order(v[..., 6:]), v[..., 3:6],
                 self.projected_gravity(state),
                 p["last_action"], p["command"], torch.cos(p["phase"]), torch.sin(p["phase"])]
        if self.privileged:
            parts += [v[..., :3], q[..., 2:3]]
        return torch.cat(parts, -1)

    def is_terminal(self, state: torch.Tensor) -> torch.Tensor:
        g = self.projected_gravity(state)
        tilted = g[..., 2] > -0.5
        low = state[..., 2] < 0.5 * self.stand_height
        return tilted | low

    def gait_offsets(self, phase: torch.Tensor) -> torch.Tensor:
        """Joint-target offsets ``(..., 12)`` of the trot generator at ``phase`` ``(..., 1)``.

        Diagonal pairs (FL, RR) and (FR, RL) alternate: in its swing half a
        leg's thigh turns by ``A s`` and its calf by ``-2 A s``, with
        ``s = max(sin(phase + offset), 0)^2``, which lifts the foot straight
        up under the hip (equal thigh and calf lengths). Zero when
        ``gait_frequency`` is 0.
        """
        if self.gait_frequency == 0.0:
            return torch.zeros(phase.shape[:-1] + (12,), dtype=phase.dtype, device=phase.device)
        # Legs FL, FR, RL, RR at phase offsets 0, pi, pi, 0 (built from
        # ``phase`` itself: a constant tensor would be copied to a GPU, a
        # host synchronisation, at every step).
        shifted = phase + math.pi
        s = torch.clamp_min(torch.sin(torch.cat([phase, shifted, shifted, phase], -1)), 0.0) ** 2  # (..., 4)
        a = self.gait_amplitude * s
        return torch.stack([torch.zeros_like(a), a, -2.0 * a], -1).flatten(-2)

    # ------------------------------------------------------ shipped policy
    #: The policy file ``backdrive demo`` plays (``examples/quadruped_walk.py --ship`` writes it).
    SHIPPED_POLICY = "policies/quadruped_walk.pt"
    #: The shipped policy file of each named robot (``examples/quadruped_walk.py --ship`` writes them).
    SHIPPED_POLICIES = {"quadruped": SHIPPED_POLICY, "go1": "policies/go1_walk.pt"}

    @classmethod
    def pretrained(cls, num_envs: int = 1, robot: str = "quadruped", **overrides):
        """The shipped walking policy of ``robot`` and an env built as it was trained.

        The file (in ``backdrive/data/policies``) holds the policy's weights,
        its training settings and the env keywords, read with
        ``torch.load(weights_only=True)``; ``examples/quadruped_walk.py
        --ship`` (``--preset go1_walk_shac_slip --ship`` for Go1) reproduces it
        on the machine that made it (the file's ``provenance``).

        Args:
            num_envs: copies of the env.
            robot: ``"quadruped"`` (the shipped robot, ``QUADRUPED_WALK_SHAC_DECAY``)
                or ``"go1"`` (example-robot-data's Unitree Go1, ``GO1_WALK_SHAC_SLIP``);
                or a ``RobotModel`` of one of them (e.g. with calibrated
                parameters), which picks the policy by the model's name and
                replaces the env's robot.
            **overrides: env keywords to change (e.g. ``dtype``, ``randomization``).

        Returns:
            ``(env, policy)``; ``policy(obs)`` gives the actions.

        Raises:
            InputError: ``robot`` has no shipped policy.
        """
        from ..model import RobotModel

        if isinstance(robot, RobotModel):
            overrides = {**overrides, "robot": robot}
        return load_shipped(cls, num_envs, overrides, cls._shipped_file(robot))

    @classmethod
    def _shipped_file(cls, robot) -> str:
        from ..model import RobotModel

        name = robot.name if isinstance(robot, RobotModel) else robot
        if not isinstance(name, str) or name not in cls.SHIPPED_POLICIES:
            raise InputError(f"no shipped policy for robot {name!r}; valid: "
                             f"{', '.join(map(repr, cls.SHIPPED_POLICIES))}")
        return cls.SHIPPED_POLICIES[name]

    @classmethod
    def shipped_checkpoint(cls, robot: str = "quadruped") -> dict:
        """The shipped policy file of ``robot`` as a dict: besides the weights and
        settings, ``env_kwargs``, ``metrics`` (its test numbers when it was made),
        ``preset`` (the training preset's name) and ``provenance`` (commit, torch,
        CPU kernels), where the file has them.

        Raises:
            InputError: ``robot`` has no shipped policy.
        """
        return read_shipped(cls._shipped_file(robot))

    @classmethod
    def shipped_preset(cls, robot: str = "quadruped"):
        """The training preset (:data:`backdrive.optim.PRESETS`) that made the shipped policy of ``robot``:
        ``examples/quadruped_walk.py --preset NAME --ship`` (seed 0) writes the file.

        Raises:
            InputError: ``robot`` has no shipped policy.
            PolicyConfigError: the file does not name a known preset.
        """
        from ..optim._policy.presets import PRESETS

        name = cls.shipped_checkpoint(robot).get("preset")
        if name not in PRESETS:
            raise PolicyConfigError(f"the shipped policy of {robot!r} names no known training preset ({name!r})")
        return PRESETS[name]

    # ---------------------------------------------------------- evaluation
    @torch.no_grad()
    def evaluate(self, policy, command=(0.5, 0.0, 0.0), *, seconds: float = 10.0, seed: int = 0,
                 settle: float = 2.0) -> dict:
        """Run ``policy`` in every copy under a fixed ``command`` and measure the gait.

        The env is reset (``seed``), autoreset is off for the run and
        restored after; a copy that falls stays fallen (its later speeds are
        not counted).

        Args:
            policy: ``obs (N, obs_dim) -> action (N, 12)``.
            command: ``(vx, vy, yaw)`` within :attr:`command_ranges`.
            seconds: episode length, s.
            settle: speeds before this time (s) are left out of the average.

        Returns:
            dict with ``forward_speed`` (mean base-frame ``vx`` of the upright
            copies after ``settle``, m/s), ``speed_error`` (mean ``|vx - cmd|``
            per copy, averaged, m/s), ``distance`` (mean world-frame
            displacement along the start heading, m), ``upright`` (fraction of
            copies that never fell), ``yaw_rate`` (mean base yaw rate of the
            upright copies after ``settle``, rad/s), ``q`` ``(T + 1, N, 19)``
            and ``rewards`` ``(T, N)``.

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
            qs, vx, wz, rewards = [self.state[:, :19].clone()], [], [], []
            for _ in range(steps):
                obs, r, term, _, _ = self.step(policy(obs))
                alive &= ~term
                qs.append(self.state[:, :19].clone())
                vx.append(torch.where(alive, self.state[:, 19], torch.nan))
                wz.append(torch.where(alive, self.state[:, 24], torch.nan))
                rewards.append(r)
        finally:
            self.autoreset = autoreset
        q = torch.stack(qs)
        skip = int(round(settle / self.dt))
        V = torch.stack(vx)[skip:]
        W = torch.stack(wz)[skip:]
        per_env = torch.nanmean(V, 0)
        cmd = float(torch.as_tensor(command)[0])
        # Displacement along the initial heading (the base x axis at t = 0).
        heading = quat_apply(q[0, :, 3:7], q.new_tensor([1.0, 0.0, 0.0]).expand(self.num_envs, 3))
        dist = ((q[-1, :, :3] - q[0, :, :3]) * heading).sum(-1)
        return {
            "forward_speed": float(torch.nanmean(V)),
            "speed_error": float(torch.nanmean((per_env - cmd).abs())),
            "distance": float(dist[alive].mean()) if bool(alive.any()) else math.nan,
            "upright": float(alive.double().mean()),
            "yaw_rate": float(torch.nanmean(W)),
            "q": q,
            "rewards": torch.stack(rewards),
        }

    # ------------------------------------------------------------ helpers
    def base_velocity(self, state: torch.Tensor | None = None) -> torch.Tensor:
        """Base linear velocity in the base frame ``(N, 3)``, m/s."""
        state = self.state if state is None else state
        return state[..., 19:22]

    def __repr__(self) -> str:
        return (f"QuadrupedWalk(num_envs={self.num_envs}, robot={self.robot_name!r}, dt={self.dt}, "
                f"substeps={self.substeps}, dtype={self.dtype})")
