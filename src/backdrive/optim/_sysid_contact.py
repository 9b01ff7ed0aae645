"""Calibration through the contact simulator: the ``ContactFit`` route of :func:`identify`.

A legged robot's motion depends on more than its links: the ground's
stiffness, damping and friction, the motors' strength, the PD gains and the
delay between a command and its effect. This route fits all of them, with
the masses, inertias and joint damping, friction and armature, by rolling the
contact :class:`~backdrive.sim.Simulator` out over short windows of the
recording (multiple shooting: each window starts from the recorded state, or
with ``estimate_starts`` from a fitted offset on it, so a long recording
never back-propagates through more than ``segment`` steps)
and comparing what the robot's own sensors would have seen: joint encoders
(positions and rates) and an IMU (base orientation and angular velocity).

The extra parameters are positive and fitted in log coordinates as factors
on the simulator's values (``k = k0 exp(xi)``), so they stay positive and the
confidence intervals of :func:`identify` apply to them unchanged.

From encoders and an IMU alone the masses, the motor strength and the
contact law share one force scale (every force of the model can grow
together with little change of the motion); ``ContactFit.total_mass`` (the
robot weighed) anchors it: with one prior residual on the sum of the masses
(``total_mass_std > 0``), or exactly (``total_mass_std=0``: the fitted masses
are parametrised so that every body's mass sums to the weighed total).

The control delay is a whole number of steps and is fitted by trying each
candidate (``ContactFit.delays``): a short fit of every candidate from the
same start, the full fit at the best, then short refits of its neighbours
from the full fit's result (moving there, once, if one does better). A fractional, differentiable delay (controls interpolated between
steps) was not chosen: a zero-order-hold controller's true delay is a whole
number of control periods, and the loss of an interpolated delay is
piecewise smooth with kinks at every integer, where a Gauss-Newton step
stalls. The delay counts as identified when every refitted neighbour's loss
is worse by more than the 95 % quantile of a chi-square with one degree of
freedom (a likelihood-ratio test at the fit's residual variance).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field, fields

import torch

from .._errors import ConfigError, InputError, InvalidValueError, NonFiniteError, UnknownNameError
from ..contact import ContactModel
from ..dynamics import difference, integrate
from ..model import RobotModel
from ..sim import PDActuator, Simulator, State, TorqueActuator
from ._solvers import BlockJacobian

__all__ = ["ContactFit", "CONTACT_PARAMETERS", "SENSOR_CHANNELS", "DEFAULT_NOISE"]

#: Parameters only the contact route fits (besides the robot's own, see
#: :data:`~backdrive.optim.IDENTIFIABLE_PARAMETERS`).
CONTACT_PARAMETERS = (
    "contact_stiffness",
    "contact_damping",
    "contact_friction",
    "contact_timeconst",
    "contact_dampratio",
    "motor_strength",
    "kp",
    "kd",
)

#: What a window's prediction is compared with: joint encoders, an IMU
#: (orientation and angular velocity of the base), and, where a state
#: estimator or motion capture gives them, the base position and velocity.
SENSOR_CHANNELS = (
    "joint_position",
    "joint_velocity",
    "base_orientation",
    "base_angular_velocity",
    "base_position",
    "base_linear_velocity",
)

#: Default standard deviation of each channel's measurement noise (rad,
#: rad/s, rad, rad/s, m, m/s): each residual is divided by it.
DEFAULT_NOISE = {
    "joint_position": 1e-3,
    "joint_velocity": 1e-2,
    "base_orientation": 1e-3,
    "base_angular_velocity": 1e-2,
    "base_position": 1e-3,
    "base_linear_velocity": 1e-2,
}

_CONTACT_FIELDS = {
    "contact_stiffness": "stiffness",
    "contact_damping": "damping",
    "contact_friction": "friction",
    "contact_timeconst": "timeconst",
    "contact_dampratio": "dampratio",
}
# Which contact parameters belong to which law.
_PENALTY_ONLY = ("contact_stiffness", "contact_damping")
_SOFT_ONLY = ("contact_timeconst", "contact_dampratio")
# Step of the central differences (coordinates are log-factors, metres or
# Cholesky entries of order 1e-2..1: the truncation error ~ h^2 and the
# rounding error ~ 1e-16 / h balance near 1e-5..1e-6).
_FD_STEP = 1e-6
# A positive parameter whose standard error exceeds this share of its value
# (95 % interval wider than a factor 2.7 either way) is reported as not
# identified: the data leave it free within a range, they do not give it.
_WEAK_RELATIVE_STD = 0.5
# A chi-square with one degree of freedom exceeds this with probability 5 %.
_CHI2_95 = 3.841458820694124
# estimate_starts='linear' sets a window aside when its linearised start
# offset is beyond this many noise levels in some coordinate (for 2 nv = 36
# Gaussian coordinates the chance is about 0.2 %): its start error is then
# not what the linearisation says.
_LINEAR_START_SIGMAS = 4.0
# ... and when its loss exceeds the typical window's (the median of those
# linear and plausible, per residual, at least the noise's 1) by more than
# this many of a chi-square's standard deviations (sqrt(2 m) for m
# residuals): a window that converged, linear, into a wrong basin (a stance
# foot's touch-down a step off) fits no parameters well and would pull them.
_LINEAR_WINDOW_SIGMAS = 4.0
# Levenberg-Marquardt iterations of the rolled-out polish after a
# linearised fit (``ContactFit.polish=None``). Measured on the MuJoCo
# benchmark (docs/simulation.md, *Results*): seed 1's linearised minimum sat
# 469 loss units off the rolled-out one and 12 iterations took the
# parameters within 5 % from 19 to 28 of 29 (at the iteration limit); on
# seed 0 the two minima agreed and the polish stopped after 3 iterations.
DEFAULT_POLISH = 12
# At most this many rounds of centring, screening and refitting: each round
# moves the centres to the last fit's parameters, where the linearisation is
# taken next; the rounds stop when the kept windows stay the same and the
# loss drops by less than its own noise.
_LINEAR_ROUNDS = 4
# A log-coordinate (a mass, damping, contact or strength factor) more than
# this far below its starting value (a factor 1000) has collapsed towards 0:
# its gradient, d exp(x) / dx = exp(x), has gone with it, so the solver cannot
# bring it back when the other parameters' later moves call for it. It is
# set back to the starting value and the fit rerun, at most this many times.
_COLLAPSE = math.log(1e3)
_RESTARTS = 2


@dataclass(frozen=True)
class ContactFit:
    """Settings of the contact route of :func:`identify`: fit through a
    :class:`~backdrive.sim.Simulator` with contact, on sensor channels, over
    short windows, with the control delay tried step by step.

    Attributes:
        simulator: the simulator with a :class:`~backdrive.contact.ContactModel`
            (geometry, terrain, force law), its actuator and ``dt`` (the
            data's sample period). Its contact parameters, PD gains and
            motor strength 1 are the starting guess; the robot comes from
            :func:`identify`'s ``robot``.
        controls: ``(..., T, nu)`` commands as sent (PD targets or efforts),
            one row per sample interval, before any delay.
        segment: steps per window (multiple shooting).
        stride: steps between window starts (default ``segment``: windows
            tile the recording; larger values use every ``stride``-th window,
            for speed on long recordings).
        observe: the channels compared (:data:`SENSOR_CHANNELS`); default
            joint encoders and IMU (``joint_position``, ``joint_velocity``,
            ``base_orientation``, ``base_angular_velocity``) on a floating
            base with joints, all base channels on a floating base without
            joints, the joint channels on a fixed base.
        noise: standard deviation of each channel's noise (default
            :data:`DEFAULT_NOISE`); every residual is divided by its
            channel's value, which weighs the channels and makes the
            confidence intervals those of the stated noise model.
        delays: candidate control delays, whole steps (``(0,)``: no delay fit).
            The sent command ``u[t]`` acts over step ``t + d`` (the first
            ``d`` steps of a recording take ``history``, or hold ``u[0]``
            without it).
        delay_iterations: Gauss-Newton iterations of each candidate's short fit.
        history: optional ``(..., H, nu)`` commands sent before each
            recording's first sample (oldest first, the same columns as
            ``controls``): what acts over a recording's first steps under a
            delay of up to ``H`` steps. Recordings cut from a longer log
            have them; without them a delayed recording's first ``d`` steps
            hold ``u[0]``, an error at every window that starts a recording.
        per_joint_strength: fit one motor strength per actuated joint
            instead of one for all motors.
        joint_names: the joint order of the recording's joint columns (of
            ``q``, ``v``, and of ``controls`` when it has one column per
            name), if it differs from the model's.
        jacobian: how the Gauss-Newton Jacobian of the residuals is made:
            ``"forward_mode"`` (exact, ``torch.func.jacfwd``) or
            ``"differences"`` (central differences of step ``1e-6`` in the
            log or raw coordinates, one batch of rollouts per parameter;
            measured about 2x faster than forward mode for a handful of
            parameters on the quadruped, where the per-step cost is mostly
            fixed overhead, and within about 1e-8 of it).
        total_mass: the robot's weighed total mass, kg (the sum of all its
            bodies' masses, fitted or not): an anchor for ``body_mass``. From
            encoders and an IMU alone every force of the model (gravity on
            each link, the motors, the contact law, joint damping) can grow
            or shrink together with little change of the motion; the weight
            fixes that common scale. It enters the fit as one more residual,
            ``(sum(m) - total_mass) / total_mass_std``, a Gaussian prior
            that the Cramer-Rao intervals include, or, with
            ``total_mass_std=0``, as an equality. Needs ``body_mass`` in
            ``params``.
        total_mass_std: standard deviation of the weighing, kg (default
            0.1 % of ``total_mass``: a tight prior, close to an equality
            constraint without the stiffness of one). ``0`` makes the total
            exact: the fitted masses are ``m_i = S exp(x_i) / sum_j
            exp(x_j)`` with ``S`` the weighed total less the unfitted
            bodies' masses, so every trial of the solver, and the Jacobian,
            has the right total (the largest start mass's coordinate is held,
            the others are free: one coordinate fewer). Recommended when the
            data come from another engine or from hardware: there the
            model's mismatch leaves a residual many noise levels wide, and
            thousands of such residuals outweigh the one prior residual (on
            Go1 against MuJoCo the soft anchor let the total drift +17.5 %).
            The intervals are then conditional on the total: the sum of the
            masses has no variance (a single fitted body's mass is the
            remainder, with the interval ``[m, m]``), and the fit's
            ``message`` says so.
        estimate_starts: fit each window's start state too, instead of
            starting it from the recorded one. A recorded start carries the
            sensors' noise, and a wrong start velocity leaves an offset over
            the whole window that the physical parameters then absorb (on the
            quadruped against MuJoCo this noise, not the model, limited the
            parameter errors). With this setting every window has ``2 nv``
            more unknowns, an offset ``ds = (dq, dv)`` on its recorded start
            (``q = integrate(q_rec, dq)``, ``v = v_rec + dv``) with the
            recording as a Gaussian prior: one residual ``ds / noise`` per
            coordinate, weighted by the ``noise`` of its channel (base
            position and linear velocity included when they are not
            observed: there the noise is the state estimator's). The fit
            runs from the recorded starts first (delay search included),
            then fits the offsets with those parameters held (each window
            its own Levenberg-Marquardt damping), then both together
            (``iterations`` each): from a far start the offsets would absorb
            the model's error, and one damping for all windows lets the
            hardest window hold the others back.
            With Gauss-Newton each step eliminates the offsets window by
            window (a Schur complement, :class:`~backdrive.optim.BlockJacobian`),
            so a step's linear algebra stays about the size of the
            parameters'; the Jacobian has ``2 nv`` more columns (forward
            mode: about ``(p + 2 nv) / p`` times the time). The confidence
            intervals are marginal over the offsets.
            ``'linear'``: the offsets are not rolled out during the fit. At
            every value of the parameters each window's offset is solved in
            closed form from the residuals' linearisation in its start (the
            forward-mode Jacobian at the window's centre) with the same
            prior, and the fit minimises what is left (the linearised errors-in-variables
            loss; its Gauss-Newton Jacobian holds the offsets at their
            optimum). Where the rollout is only piecewise smooth in its start
            (MuJoCo's soft contact switches at touch-down) this keeps the
            loss as smooth in the parameters as the recorded-start fit's, at
            the price of a linearisation error when the start errors are
            large. The centres: at the recorded-start fit's parameters each
            window's offset is first fitted through rolled-out steps (its
            own Levenberg-Marquardt, parameters held, as for ``True``); near
            its own optimum a window is often linear in its start where at
            the recorded start it is not (a stance foot whose penetration is
            as large as the noise on its height). Windows whose start error
            the linearisation still does not explain are set aside: each
            window's linear offset from its centre is rolled out, and the
            window is kept if that loss equals the linear prediction within
            the loss's own noise (``sqrt(2 m)`` for ``m`` residuals) and the
            whole offset is within 4 noise levels in every coordinate;
            a window whose loss is an outlier among the windows' is set
            aside too; then rounds of centring at the last fit, screening and
            refitting until the set stays and the loss stops dropping (at
            most 4); the delay's neighbours get full fits, not short ones. The
            ``message`` names the windows set aside. Each loss costs a
            ``2 nv``-column forward-mode Jacobian. Runs after the
            recorded-start fit, like ``True``.
        polish: with ``estimate_starts='linear'``, this many
            Levenberg-Marquardt iterations at the end on the rolled-out
            problem of the kept windows: the parameters and each window's
            start offset together (as ``True`` does, from the centres, with
            the same prior), starting at the linear fit and its offsets, the
            delay kept. The linear loss approximates the rolled-out one
            within the screen's tolerance per window (``sqrt(2 m)``, many
            times the loss change of one standard error of a parameter), so
            its minimum can sit off the rolled-out one; the polish removes
            that approximation. ``None`` (the default): :data:`DEFAULT_POLISH`
            iterations with ``estimate_starts='linear'``, none otherwise; 0:
            none. The ``message`` gives the rolled-out loss before and
            after.
        polish_windows: the windows the polish rolls out. ``'kept'`` (the
            default): those the linear screen kept, each from its linear
            offset. ``'plausible'``: every window whose rolled-out loss at
            the fit, from the better of its centre and its linear offset, is
            no outlier (the screen's rule, with the kept windows' median as
            the typical loss) and whose whole offset is within 4 noise
            levels in every coordinate. The rolled-out problem needs no
            linearity, so windows the screen set aside for their
            non-linear start can count again; the ``message`` says how many.
        select_windows: use only this many of the windows (``None``, the
            default: all): those whose rollout with the starting guess, from
            its recorded start, has the fewest contact switches (a contact
            point entering or leaving the terrain, counted over every
            candidate delay; ties go to the earlier window). A foot that
            hovers at the threshold of contact makes a window's rollout jump
            with its start: each touch-down a step earlier or later changes
            the contact force at once, so no local fit of the start offset
            finds the recorded motion, and ``estimate_starts='linear'`` sets
            such a window aside after paying for its Jacobians. Measured on
            the MuJoCo benchmark's stiff-contact draw (docs/simulation.md,
            *Window start states*): at the true parameters the windows whose start
            offset could not be fitted had a median of 15 switches, the
            others 2. Long recordings can thus be cut into many windows, and
            the fit spends its time on those it can use. Counted in one
            rollout per delay (no Jacobian); the ``message`` says how many
            windows were used and names set-aside windows by their number
            among all of them.

    Raises:
        ConfigError: a setting out of range or of the wrong type.
    """

    simulator: Simulator | None = field(default=None, compare=False)
    controls: torch.Tensor | None = field(default=None, compare=False, repr=False)
    segment: int = 20
    stride: int | None = None
    observe: tuple[str, ...] | None = None
    noise: dict | None = None
    delays: tuple[int, ...] = (0,)
    delay_iterations: int = 3
    history: torch.Tensor | None = field(default=None, compare=False, repr=False)
    per_joint_strength: bool = False
    joint_names: tuple[str, ...] | None = None
    jacobian: str = "forward_mode"
    total_mass: float | None = None
    total_mass_std: float | None = None
    estimate_starts: bool | str = False
    polish: int | None = None
    polish_windows: str = "kept"
    select_windows: int | None = None

    def __post_init__(self):
        if self.jacobian not in ("forward_mode", "differences"):
            raise ConfigError(f"ContactFit.jacobian must be 'forward_mode' or 'differences', got {self.jacobian!r}")
        if not isinstance(self.simulator, Simulator) or self.simulator.contact is None:
            raise ConfigError(
                "ContactFit.simulator must be a Simulator with contact (Simulator(robot, dt, contact=ContactModel(...)))"
                f", got {type(self.simulator).__name__ if not isinstance(self.simulator, Simulator) else 'one without'}"
            )
        if not isinstance(self.controls, torch.Tensor):
            raise ConfigError(f"ContactFit.controls must be a (..., T, nu) tensor, got {type(self.controls).__name__}")
        h = self.history
        if h is not None and not (isinstance(h, torch.Tensor) and h.ndim == self.controls.ndim
                                  and h.shape[:-2] == self.controls.shape[:-2] and h.shape[-1] == self.controls.shape[-1]
                                  and h.dtype == self.controls.dtype and h.device == self.controls.device):
            raise ConfigError(
                "ContactFit.history must be a (..., H, nu) tensor with the recordings' batch axes and columns, and "
                f"the dtype and device of controls {tuple(self.controls.shape)}, got "
                f"{tuple(h.shape) if isinstance(h, torch.Tensor) else type(h).__name__}")
        for name in ("segment", "delay_iterations"):
            x = getattr(self, name)
            if not (isinstance(x, int) and not isinstance(x, bool) and x >= 1):
                raise ConfigError(f"ContactFit.{name} must be a positive int, got {x!r}")
        if self.stride is not None and not (isinstance(self.stride, int) and not isinstance(self.stride, bool)
                                            and self.stride >= 1):
            raise ConfigError(f"ContactFit.stride must be a positive int or None, got {self.stride!r}")
        d = self.delays
        if (not isinstance(d, (tuple, list)) or not d
                or any(not isinstance(x, int) or isinstance(x, bool) or x < 0 for x in d) or len(set(d)) != len(d)):
            raise ConfigError(f"ContactFit.delays must be distinct whole numbers of steps >= 0, got {d!r}")
        if self.observe is not None:
            bad = [c for c in self.observe if c not in SENSOR_CHANNELS]
            if bad or not self.observe or isinstance(self.observe, str):
                raise ConfigError(f"ContactFit.observe must name some of {', '.join(SENSOR_CHANNELS)}; got "
                                  f"{self.observe!r}")
        x = self.total_mass
        if x is not None and not (isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
                                  and x > 0):
            raise ConfigError(f"ContactFit.total_mass must be a positive number of kg or None, got {x!r}")
        x = self.total_mass_std
        if x is not None and not (isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
                                  and x >= 0):
            raise ConfigError(f"ContactFit.total_mass_std must be a positive number of kg, 0 (the total is exact) "
                              f"or None, got {x!r}")
        e = self.estimate_starts
        if not (isinstance(e, bool) or e in ("fit", "linear")):
            raise ConfigError(f"ContactFit.estimate_starts must be False, True (= 'fit') or 'linear', got {e!r}")
        if e == "linear" and self.jacobian != "forward_mode":
            raise ConfigError("ContactFit.estimate_starts='linear' needs jacobian='forward_mode' (its residual "
                              f"holds the start-state Jacobian), got jacobian={self.jacobian!r}")
        x = self.polish
        if x is None:
            x = self.polish_iterations
        if not (isinstance(x, int) and not isinstance(x, bool) and x >= 0):
            raise ConfigError(f"ContactFit.polish must be a whole number of iterations >= 0 or None, got {x!r}")
        if x and e != "linear":
            raise ConfigError(f"ContactFit.polish={x} refines the estimate_starts='linear' fit, but estimate_starts is "
                              f"{e!r}; set estimate_starts='linear', or polish=0")
        if self.polish_windows not in ("kept", "plausible"):
            raise ConfigError(f"ContactFit.polish_windows must be 'kept' or 'plausible', got {self.polish_windows!r}")
        if self.polish_windows != "kept" and not x:
            raise ConfigError(f"ContactFit.polish_windows={self.polish_windows!r} chooses the windows of the polish, "
                              "but no polish runs (polish=0, or estimate_starts is not 'linear'); set "
                              "estimate_starts='linear' and polish to a number of iterations (or None)")
        x = self.select_windows
        if x is not None and not (isinstance(x, int) and not isinstance(x, bool) and x >= 1):
            raise ConfigError(f"ContactFit.select_windows must be a positive number of windows or None, got {x!r}")
        if self.total_mass_std is not None and self.total_mass is None:
            raise ConfigError("ContactFit.total_mass_std is given without total_mass (the weighed mass, kg)")
        if self.noise is not None:
            if not isinstance(self.noise, dict):
                raise ConfigError(f"ContactFit.noise must be a dict of channel -> standard deviation, got "
                                  f"{type(self.noise).__name__}")
            for k, s in self.noise.items():
                if k not in SENSOR_CHANNELS:
                    raise ConfigError(f"ContactFit.noise: unknown channel {k!r}; valid: {', '.join(SENSOR_CHANNELS)}")
                if not (isinstance(s, (int, float)) and not isinstance(s, bool) and math.isfinite(s) and s > 0):
                    raise ConfigError(f"ContactFit.noise[{k!r}] must be a positive number, got {s!r}")

    @property
    def polish_iterations(self) -> int:
        """The polish's iterations: ``polish``, or with ``None`` its default
        (:data:`DEFAULT_POLISH` after ``estimate_starts='linear'``, else 0)."""
        if self.polish is not None:
            return self.polish
        return DEFAULT_POLISH if self.estimate_starts == "linear" else 0

    @property
    def name(self) -> str:
        return "contact"


# ---------------------------------------------------------------------- parameters


class _ContactParametrisation:
    """The robot's parametrisation (:class:`~backdrive.optim._sysid._Parametrisation`)
    followed by log-factors on the contact law, motor strength and PD gains."""

    positive = CONTACT_PARAMETERS

    def __init__(self, base, sim: Simulator, robot: RobotModel, params: Sequence[str], per_joint_strength: bool,
                 fitted_mass: float | None = None):
        self.base = base
        self.robot = robot
        self.sim = sim
        # An exact total (``fitted_mass``: what the fitted bodies' masses sum
        # to): the base's log-masses are normalised to that sum, and the one
        # of the largest start mass is held (the normalisation leaves a
        # common shift of them free; holding one removes that null
        # direction), so the solver sees one coordinate fewer.
        self.fitted_mass = fitted_mass
        self.ref = None
        nbase = base.xi0.numel() if base is not None else 0
        if fitted_mass is not None:
            self.nm = len(base.bodies)
            self.ref = int(torch.argmax(base.m0))
            self.ref_value = base.xi0[self.ref].detach()
            keep = [i for i in range(nbase) if i != self.ref]
            self.nr = nbase - 1
            base_xi0 = base.xi0[keep]
        else:
            self.nr = nbase
            base_xi0 = base.xi0 if base is not None else None
        dtype, device = robot.dtype, robot.device
        act = sim.actuator
        nu = sim.nu
        names = [robot.joint_names[j] for j in sim.actuated]
        cp = sim.contact.params
        shapes = [s.link for s in sim.contact.geometry.shapes]
        self.extras = []  # (name, nominal (n,) or (), free size, labels)
        for p in CONTACT_PARAMETERS:
            if p not in params:
                continue
            if p in _CONTACT_FIELDS:
                if sim.contact.soft and p in _PENALTY_ONLY:
                    raise InputError(f"{p} is a parameter of the penalty law; this simulator's contact is MuJoCo's "
                                     "soft constraint (SoftContactParameters): fit contact_timeconst and "
                                     "contact_dampratio instead")
                if not sim.contact.soft and p in _SOFT_ONLY:
                    raise InputError(f"{p} is a parameter of the soft-constraint contact (SoftContactParameters); "
                                     "this simulator's contact is the penalty law: fit contact_stiffness and "
                                     "contact_damping instead")
                if p == "contact_friction" and sim.contact.terrain.friction is not None:
                    raise InputError("contact_friction cannot be fitted while the terrain sets its own friction "
                                     "(GroundPlane(friction=...)); give the friction in ContactParameters instead")
                nom = torch.as_tensor(getattr(cp, _CONTACT_FIELDS[p]), dtype=dtype, device=device).detach()
                if nom.ndim > 1:
                    raise InputError(f"{p}: the simulator's value has batch axes {tuple(nom.shape)}; give one value "
                                     "or one per shape")
                labels = [p] if nom.ndim == 0 else [f"{p}[{s}]" for s in shapes]
                free = 1
            elif p == "motor_strength":
                nom = torch.ones(nu, dtype=dtype, device=device) if per_joint_strength else torch.ones(
                    (), dtype=dtype, device=device)
                labels = [f"motor_strength[{n}]" for n in names] if per_joint_strength else ["motor_strength"]
                free = nu if per_joint_strength else 1
            else:
                if not isinstance(act, PDActuator):
                    raise InputError(f"{p} is a gain of a PDActuator; the simulator has a {type(act).__name__}")
                nom = torch.as_tensor(getattr(act, p), dtype=dtype, device=device).detach().expand(nu).clone()
                labels = [f"{p}[{n}]" for n in names]
                free = 1
            if bool((nom <= 0).any()):
                raise InputError(f"{p} starts at {nom.tolist()}; a fitted {p} needs a positive starting value")
            self.extras.append((p, nom, free, labels))
        self.xi0 = torch.cat([base_xi0 if base is not None else robot.body_mass.new_zeros(0)]
                             + [nom.new_zeros(free) for _, nom, free, _ in self.extras])
        self.params = tuple(base.params if base is not None else ()) + tuple(e[0] for e in self.extras)

    def extra_values(self, xi: torch.Tensor) -> dict:
        out, k = {}, self.nr
        for name, nom, free, _ in self.extras:
            out[name] = nom * torch.exp(xi[k: k + free] if free > 1 else xi[k])
            k += free
        return out

    def robot_xi(self, xi: torch.Tensor) -> torch.Tensor:
        """The base parametrisation's coordinates for the solver's ``xi``
        (the log-masses normalised to the exact total, if one is set)."""
        x = xi[: self.nr]
        if self.fitted_mass is None:
            return x
        r, nm = self.ref, self.nm
        x = torch.cat([x[:r], self.ref_value.to(x.dtype).reshape(1), x[r:]])
        lm = x[:nm]
        lm = lm - torch.logsumexp(lm, 0) + math.log(self.fitted_mass)
        return torch.cat([lm, x[nm:]])

    def robot_model(self, xi: torch.Tensor) -> RobotModel:
        return self.base.model(self.robot_xi(xi)) if self.base is not None else self.robot

    def physical(self, xi: torch.Tensor) -> torch.Tensor:
        parts = [self.base.physical(self.robot_xi(xi))] if self.base is not None else []
        parts += [v.reshape(-1) for v in self.extra_values(xi).values()]
        return torch.cat(parts)

    def log_coordinates(self) -> list[tuple[int, str]]:
        """``(index into xi, readable name)`` of each coordinate that is the
        logarithm of a positive parameter: the base's (less the held mass of
        an exact total) and every contact, strength and gain factor."""
        out = []
        for i, lab in self.base.log_coordinates() if self.base is not None else ():
            if self.fitted_mass is None or i < self.ref:
                out.append((i, lab))
            elif i > self.ref:
                out.append((i - 1, lab))
        k = self.nr
        for name, _, free, labels in self.extras:
            out += [(k + i, labels[i] if free > 1 else name) for i in range(free)]
            k += free
        return out

    def labels(self) -> list:
        out = list(self.base.labels()) if self.base is not None else []
        for name, nom, _, labels in self.extras:
            out += [(name, (i,) if nom.ndim else (), lab) for i, lab in enumerate(labels)]
        return out

    def build(self, xi: torch.Tensor) -> tuple[Simulator, torch.Tensor | None]:
        """The simulator with the parameters ``xi`` and the factor on the
        controls (a torque actuator's motor strength), or ``None``."""
        robot = self.robot_model(xi)
        ex = self.extra_values(xi)
        sim, c = self.sim, self.sim.contact
        changes = {field_: ex[p] for p, field_ in _CONTACT_FIELDS.items() if p in ex}
        cp = c.params.replace(**changes) if changes else c.params
        contact = ContactModel(robot, c.geometry, c.terrain, cp, c.self_collision, unilateral=c.unilateral)
        act, scale = sim.actuator, None
        strength = ex.get("motor_strength")
        if isinstance(act, PDActuator):
            if strength is not None or "kp" in ex or "kd" in ex:
                kp = ex.get("kp", act.kp)
                kd = ex.get("kd", act.kd)
                if strength is not None:
                    kp, kd = strength * _gain(kp, robot), strength * _gain(kd, robot)
                act = PDActuator(kp=kp, kd=kd, joints=act.joints, effort_limit=act.effort_limit)
        elif strength is not None:
            scale = strength
        return sim.replace(robot=robot, contact=contact, actuator=act), scale

    def output(self, xi: torch.Tensor) -> tuple[dict, dict]:
        """Fitted and initial extra values, detached."""
        return ({k: v.detach() for k, v in self.extra_values(xi).items()},
                {k: v.detach() for k, v in self.extra_values(self.xi0).items()})


def _gain(x, robot):
    return x if isinstance(x, torch.Tensor) else torch.as_tensor(float(x), dtype=robot.dtype, device=robot.device)


# ---------------------------------------------------------------------- data


def _check_finite(x: torch.Tensor, name: str) -> None:
    """A typed error naming the first recording and sample holding a NaN or inf."""
    bad = ~torch.isfinite(x)
    if bool(bad.any()):
        where = torch.nonzero(bad.reshape(-1, *x.shape[-2:]).any(-1))[0].tolist()
        rec = f"recording {where[0]}, " if x.ndim > 2 else ""
        raise InputError(f"{name} has a non-finite value ({rec}sample {where[1]}); drop or repair that sample "
                         "before identifying (a NaN would poison every gradient)")


def _reorder(robot: RobotModel, sim: Simulator, q, v, controls, names):
    """Columns of the recording in the model's joint order."""
    if names is None:
        return q, v, controls
    names = list(names)
    for n in names:
        if n not in robot.joint_names:
            raise UnknownNameError("joint", n, robot.joint_names, context="in ContactFit.joint_names")
    if len(set(names)) != len(names):
        raise InputError(f"ContactFit.joint_names repeats a name: {names}")
    missing = [n for n in robot.joint_names if n not in names]
    if missing:
        raise InputError(f"the recording has no column for joints {missing} of robot {robot.name!r}")
    nj = robot.num_joints
    if q.shape[-1] != robot.nq - nj + len(names) or v.shape[-1] != robot.nv - nj + len(names):
        raise InputError(f"ContactFit.joint_names names {len(names)} joints; q and v have "
                         f"{q.shape[-1] - (robot.nq - nj)} and {v.shape[-1] - (robot.nv - nj)} joint columns")
    perm = torch.tensor([names.index(n) for n in robot.joint_names], dtype=torch.long, device=q.device)
    oq, ov = robot.nq - nj, robot.nv - nj
    q = torch.cat([q[..., :oq], q[..., oq:].index_select(-1, perm)], -1)
    v = torch.cat([v[..., :ov], v[..., ov:].index_select(-1, perm)], -1)
    if controls.shape[-1] == len(names) and controls.shape[-1] == sim.nu:
        cols = torch.tensor([names.index(robot.joint_names[j]) for j in sim.actuated], dtype=torch.long,
                            device=q.device)
        controls = controls.index_select(-1, cols)
    return q, v, controls


def _channels(robot: RobotModel, observe, q_sim, v_sim, q_rec, v_rec, noise) -> torch.Tensor:
    """Residuals of the observed channels, each divided by its noise:
    ``(W, m)``, one row per window (of ``(..., K, n)`` samples)."""
    nj = robot.num_joints
    oq, ov = robot.nq - nj, robot.nv - nj
    parts = []
    base_diff = None
    if robot.floating_base and ("base_orientation" in observe):
        base_diff = difference(robot, q_rec, q_sim)
    for c in observe:
        if c == "joint_position":
            x = q_sim[..., oq:] - q_rec[..., oq:]
        elif c == "joint_velocity":
            x = v_sim[..., ov:] - v_rec[..., ov:]
        elif c == "base_orientation":
            x = base_diff[..., 3:6]
        elif c == "base_angular_velocity":
            x = v_sim[..., 3:6] - v_rec[..., 3:6]
        elif c == "base_position":
            x = q_sim[..., :3] - q_rec[..., :3]
        else:
            x = v_sim[..., :3] - v_rec[..., :3]
        parts.append((x / noise[c]).flatten(-2).flatten(0, -2))
    return torch.cat(parts, -1)


def _start_noise(robot: RobotModel, noise: dict) -> torch.Tensor:
    """``(2 nv,)``: the noise of each coordinate of a start-state offset
    ``(dq, dv)`` (tangent of the configuration, then the velocity)."""
    nj = robot.num_joints
    if robot.floating_base:
        names = (["base_position"] * 3 + ["base_orientation"] * 3 + ["joint_position"] * nj
                 + ["base_linear_velocity"] * 3 + ["base_angular_velocity"] * 3 + ["joint_velocity"] * nj)
    else:
        names = ["joint_position"] * nj + ["joint_velocity"] * nj
    return torch.tensor([noise[c] for c in names], dtype=robot.dtype, device=robot.device)


def _channel_size(robot: RobotModel, channel: str) -> int:
    return robot.num_joints if channel.startswith("joint_") else 3


def _default_observe(robot: RobotModel) -> tuple[str, ...]:
    if not robot.floating_base:
        return ("joint_position", "joint_velocity")
    if robot.num_joints == 0:
        return ("base_orientation", "base_angular_velocity", "base_position", "base_linear_velocity")
    return ("joint_position", "joint_velocity", "base_orientation", "base_angular_velocity")


# ---------------------------------------------------------------------- the route


def identify_contact(robot, q, v, dt, params, bodies, joints, fit: ContactFit, opts, helpers):
    """The contact route of :func:`identify` (``helpers`` carries the shared
    pieces of :mod:`._sysid` to avoid a circular import)."""
    sim = fit.simulator
    observe = tuple(fit.observe) if fit.observe is not None else _default_observe(robot)
    if not robot.floating_base and any(c.startswith("base_") for c in observe):
        raise ConfigError(f"observe={observe!r}: robot {robot.name!r} has a fixed base, so no base channels")
    if robot.floating_base and robot.num_joints == 0 and any(c.startswith("joint_") for c in observe):
        raise ConfigError(f"observe={observe!r}: robot {robot.name!r} has no joints")
    noise = {**DEFAULT_NOISE, **(fit.noise or {})}
    if sim.robot is None or sim.robot.nq != robot.nq or sim.robot.joint_names != robot.joint_names:
        raise InputError(f"ContactFit.simulator simulates {getattr(sim.robot, 'name', None)!r}, not robot {robot.name!r}")
    if abs(sim.dt - dt) > 1e-12 * dt:
        raise InputError(f"the simulator's dt {sim.dt} differs from the data's dt {dt}")
    controls = fit.controls
    if controls.ndim < 2:
        raise InputError(f"ContactFit.controls must be (..., T, nu), got {tuple(controls.shape)}")
    hist = fit.history
    lead = 0 if hist is None else hist.shape[-2]
    # The history's columns are the controls': reordered with them.
    q, v, both = _reorder(robot, sim, q, v, controls if hist is None else torch.cat([hist, controls], -2),
                          fit.joint_names)
    hist, controls = (None, both) if hist is None else (both[..., :lead, :], both[..., lead:, :])
    robot.check_vector(q, robot.nq, "q")
    robot.check_vector(v, robot.nv, "v")
    if q.shape[-2] != v.shape[-2]:
        raise InputError(f"q has {q.shape[-2]} samples but v has {v.shape[-2]}: the recordings must have the same "
                         "length (one row per sample time)")
    if q.shape[:-2] != v.shape[:-2]:
        raise InputError(f"q and v hold different numbers of recordings: {tuple(q.shape[:-2])} and "
                         f"{tuple(v.shape[:-2])}")
    steps = q.shape[-2] - 1
    if controls.shape[:-2] != q.shape[:-2] or controls.shape[-2] not in (steps, steps + 1) or \
            controls.shape[-1] != sim.nu:
        raise InputError(f"controls must be (..., T, nu) = {(*q.shape[:-2], steps, sim.nu)} for recordings of "
                         f"{steps + 1} samples (T = {steps} intervals), got {tuple(controls.shape)}")
    if controls.dtype != robot.dtype or controls.device != robot.device:
        raise InputError(f"controls must be {robot.dtype} on {robot.device}, got {controls.dtype} on {controls.device}")
    for x, name in ((q, "q"), (v, "v"), (controls, "controls"), (hist, "history")):
        if x is not None:
            _check_finite(x, name)
    controls = controls[..., :steps, :].detach()
    if hist is not None:  # the commands before each recording lead its controls
        controls = torch.cat([hist.detach(), controls], -2)
    q, v = q.detach(), v.detach()
    K = fit.segment
    if steps < K:
        raise InputError(f"recordings of {steps} intervals are shorter than one window (segment={K})")
    stride = fit.stride or K
    starts = torch.arange(0, steps - K + 1, stride, device=q.device)
    idx = starts[:, None] + torch.arange(K + 1, device=q.device)  # (S, K + 1)
    # Every window of every recording, flat (recording-major), with the
    # commands of its steps under any candidate delay: window w's step j
    # takes sent command ``start + j - delay`` (the history's before 0).
    qseg, vseg = q[..., idx, :].reshape(-1, K + 1, robot.nq), v[..., idx, :].reshape(-1, K + 1, robot.nv)
    most = max(fit.delays)
    sent = controls[..., (starts[:, None] + lead - most + torch.arange(K + most, device=q.device)).clamp_min(0), :]
    sent = sent.reshape(-1, K + most, sent.shape[-1])

    robot_params = [p for p in params if p not in CONTACT_PARAMETERS]
    base = None
    if robot_params:
        fixed_default = list(range(0 if robot.floating_base else 1, robot.num_bodies))
        body_idx = helpers["resolve"](robot, bodies, "body", fixed_default)
        joint_idx = helpers["resolve"](robot, joints, "joint", list(range(robot.num_joints)))
        base = helpers["Parametrisation"](robot, robot_params, body_idx, joint_idx)
    anchor, fitted_mass = None, None
    if fit.total_mass is not None:
        if "body_mass" not in robot_params:
            raise InputError(f"ContactFit.total_mass anchors the fitted masses, but params {list(params)} has no "
                             "'body_mass'; add it, or drop total_mass")
        m_std = fit.total_mass_std if fit.total_mass_std is not None else 1e-3 * fit.total_mass
        if m_std == 0:
            # Exact: the fitted bodies take what the unfitted ones leave.
            m_all = robot.body_mass.detach()
            fixed = float(m_all.sum() - m_all[base.b_idx].sum())
            fitted_mass = float(fit.total_mass) - fixed
            if not fitted_mass > 0:
                raise InputError(f"ContactFit.total_mass = {fit.total_mass:g} kg is not more than the "
                                 f"{fixed:g} kg of the bodies whose mass is not fitted; an exact total needs a "
                                 "positive remainder for the fitted ones (fit more bodies, or check the weighing)")
        else:
            anchor = (float(fit.total_mass), float(m_std))
    par = _ContactParametrisation(base, sim, robot, params, fit.per_joint_strength, fitted_mass)

    def commands(delay: int) -> torch.Tensor:
        """(windows, K, nu): the commands acting at each step of each window."""
        return sent[:, most - delay: most - delay + K]

    # The windows used: all, or the ``select_windows`` whose rollout at the
    # starting guess switches contact least (``origin``: their numbers).
    origin = torch.arange(qseg.shape[0], device=q.device)
    cut = len(origin)
    if fit.select_windows is not None and fit.select_windows < cut:
        switches = _contact_switches(par, qseg[:, 0], vseg[:, 0], [commands(d) for d in fit.delays])
        origin = torch.sort(torch.argsort(switches, stable=True)[: fit.select_windows]).values
        qseg, vseg, sent = qseg[origin], vseg[origin], sent[origin]
    state0 = State(qseg[:, 0], vseg[:, 0])
    q_rec, v_rec = qseg[:, 1:], vseg[:, 1:]

    n_res = sum(int(q_rec[..., 0].numel()) * _channel_size(robot, c) for c in observe) + (anchor is not None)
    P = par.xi0.numel()
    # Estimated starts: per window an offset (dq, dv) on its recorded start.
    windows = int(state0.q[..., 0].numel())
    start_mode = {False: None, True: "fit"}.get(fit.estimate_starts, fit.estimate_starts)
    ns = 2 * robot.nv if start_mode else 0
    start_sigma = _start_noise(robot, noise) if ns else None
    # Levenberg-Marquardt's first steps start cautious here: a wild trial step
    # through stiff contact costs a rollout and is refused anyway.
    opts = opts.with_defaults(damping=1.0)

    nq, nv, m_w = robot.nq, robot.nv, (n_res - int(anchor is not None)) // max(windows, 1)

    def residuals(xi, u, q0, v0, qr, vr, ds=None):
        """The simulator at ``xi`` and its windows' normalised residuals,
        rolled out from ``(q0, v0)``, moved by the offsets ``ds`` if given."""
        s, scale = par.build(xi)
        start = State(q0, v0) if ds is None else State(integrate(robot, q0, ds[..., :nv]), v0 + ds[..., nv:])
        traj = s.rollout(start, u if scale is None else u * scale, check_finite=False)
        return s, _channels(robot, observe, traj.q[..., 1:, :], traj.v[..., 1:, :], qr, vr, noise)

    def anchor_row(model: RobotModel) -> torch.Tensor:
        """(1,) the weighed total's residual of ``model``'s masses."""
        return ((model.body_mass.sum() - anchor[0]) / anchor[1]).reshape(1)

    def problem(delay: int, starts: bool, held: torch.Tensor | None = None, keep: torch.Tensor | None = None):
        """The rolled-out problem: the parameters (unless ``held``) and, with
        ``starts``, every window's start offset. ``keep``: only these
        windows, each rolled out from its centre (``centre[keep]``, the
        prior on the whole offset ``centre + ds`` as in ``'linear'``)."""
        useg = commands(delay)
        q0, v0, qr, vr, w = state0.q, state0.v, q_rec, v_rec, windows
        about = None
        if keep is not None:
            useg = useg[keep]
            q0, v0, qr, vr = (x[keep] for x in (q0, v0, qr, vr))
            about, w = centre[keep], len(keep)
            q0, v0 = integrate(robot, q0, about[..., :nv]), v0 + about[..., nv:]
        n_own = ns if starts else 0  # unknowns of each window's own (its start offset), or none
        rows = w * (m_w + n_own) + (anchor is not None)

        def fun(x):
            xi = x[:P]
            ds = x[P:].reshape(*q0.shape[:-1], n_own) if n_own else None
            try:
                s, r = residuals(xi, useg, q0, v0, qr, vr, ds)
            except (torch.linalg.LinAlgError, InvalidValueError, NonFiniteError):
                # A trial step of the solver so far off that a parameter
                # overflowed or a mass matrix lost definiteness (in the
                # parameters or in a step of the rollout): an infinite loss,
                # so the step is refused.
                return torch.full((rows,), math.inf, dtype=x.dtype, device=x.device)
            if n_own:  # window-major: each window's prior rows, then its samples
                whole = ds.reshape(w, n_own) if about is None else about + ds.reshape(w, n_own)
                r = torch.cat([whole / start_sigma, r], -1)
            r = r.reshape(-1)
            if anchor is not None:
                r = torch.cat([r, anchor_row(s.robot)])
            return r

        def jac(x, shared=True):
            x = x.detach()
            xi, e0 = x[:P], x.new_zeros(n_own)
            p = P if shared else 0  # the parameters' columns, or none (offsets only)

            def both(xi, e):
                # d r / d s_w of every window at once: window w's rows depend
                # on its own offset only, so moving every window's k-th
                # coordinate together gives each window's k-th column.
                return fun(torch.cat([xi, (x[P:].reshape(w, n_own) + e).reshape(-1)]))

            with torch.no_grad():
                r = fun(x)
                if fit.jacobian == "differences":
                    cols = []
                    for arg in range(P - p, P + n_own):
                        d = torch.zeros(P + n_own, dtype=x.dtype, device=x.device)
                        d[arg] = _FD_STEP
                        cols.append((both(xi + d[:P], e0 + d[P:]) - both(xi - d[:P], e0 - d[P:])) / (2 * _FD_STEP))
                    J = torch.stack(cols, -1)
            if fit.jacobian != "differences":
                if not n_own:
                    J = torch.func.jacfwd(fun)(xi)
                elif shared:
                    J = torch.cat(torch.func.jacfwd(both, argnums=(0, 1))(xi, e0), -1)
                else:
                    J = torch.func.jacfwd(lambda e: both(xi, e))(e0)
            if not n_own:
                return r, J
            wm = rows - int(anchor is not None)  # the windows' rows (the anchor's last)
            m = wm // w
            return r, BlockJacobian(J[:wm, :p].reshape(w, m, p), J[:wm, p:].reshape(w, m, n_own),
                                    J[wm:, :p])

        if held is None:
            return fun, jac
        # The parameters held at ``held``: the offsets are the only unknowns.
        return (lambda s: fun(torch.cat([held, s]))), (lambda s: jac(torch.cat([held, s]), shared=False))

    def linear_parts(delay: int, keep: torch.Tensor):
        """``estimate_starts='linear'`` on the windows ``keep``: the start
        residuals ``r`` and Jacobians ``(dr/dxi, dr/ds)`` at each window's
        centre (its recorded start moved by ``centre``, the offset its own
        rolled-out fit found), and the closed-form offsets of the
        linearisation there (``offsets(r, Js)``; ``solved(xi)`` gives them
        at the parameters ``xi``)."""
        useg = commands(delay)[keep]
        q0, v0, qr, vr = (x[keep] for x in (state0.q, state0.v, q_rec, v_rec))
        c = centre[keep]
        q0, v0 = integrate(robot, q0, c[..., :nv]), v0 + c[..., nv:]

        def channels(xi, e, ds=None):
            # Every window's start moved by the same ``e`` (window w's rows
            # depend on its own start only, so d/de is each window's block),
            # or each by its own ``ds``.
            r = residuals(xi, useg, q0, v0, qr, vr, e.expand(len(q0), -1) if ds is None else ds)[1]
            return r, r

        def offsets(r, Js):
            # Per window: min over d of |r + Js d|^2 + |(c + d) / sigma|^2
            # (the prior on the whole offset from the recorded start).
            A = Js.transpose(-1, -2) @ Js + torch.diag(start_sigma.pow(-2))
            d = -torch.linalg.solve(A, torch.einsum("wmn,wm->wn", Js, r) + c / start_sigma.pow(2))
            return A, d, torch.cat([(c + d) / start_sigma, r + torch.einsum("wmn,wn->wm", Js, d)], -1)

        e0 = state0.v.new_zeros(ns)

        def solved(xi):
            # ``offsets`` at ``xi``, from the start Jacobian at the centres.
            Js, r = torch.func.jacfwd(lambda e: channels(xi, e), has_aux=True)(e0)
            return offsets(r, Js)

        return channels, offsets, solved, e0

    def linear_problem(delay: int, keep: torch.Tensor):
        """The parameters' problem of ``estimate_starts='linear'``: at each of
        their values every kept window's start offset is solved from the
        residuals' linearisation in it (a Gauss-Newton step from the
        window's centre, with the prior), not rolled out."""
        channels, offsets, solved, e0 = linear_parts(delay, keep)
        n_rows = len(keep) * (ns + m_w)

        def anchored(xi):
            return anchor_row(par.build(xi)[0].robot)

        def fun(xi):
            xi = xi.detach()
            try:
                out = solved(xi)[2].reshape(-1)
            except (torch.linalg.LinAlgError, InvalidValueError, NonFiniteError):
                return torch.full((n_rows + (anchor is not None),), math.inf, dtype=xi.dtype, device=xi.device)
            return out if anchor is None else torch.cat([out, anchored(xi)])

        def jac(xi):
            xi = xi.detach()
            (Jt, Js), r = torch.func.jacfwd(channels, argnums=(0, 1), has_aux=True)(xi, e0)
            A, _, out = offsets(r, Js)
            # Gauss-Newton's Jacobian with the offsets held at their optimum
            # (d offsets / d xi = -C; the change of dr/ds itself left out).
            C = torch.linalg.solve(A, Js.transpose(-1, -2) @ Jt)
            J = torch.cat([-C / start_sigma[:, None], Jt - Js @ C], 1).reshape(-1, P)
            out = out.reshape(-1)
            if anchor is not None:
                out = torch.cat([out, anchored(xi)])
                J = torch.cat([J, torch.func.jacfwd(anchored)(xi)])
            return out, J

        return fun, jac

    def rolled_loss(channels, xi: torch.Tensor, e0: torch.Tensor, ds: torch.Tensor) -> torch.Tensor:
        """(windows,) each window's rolled-out loss from its centre moved by
        ``ds`` (``channels`` of :func:`linear_parts` on every window), the
        prior on the whole offset ``centre + ds`` included."""
        return channels(xi, e0, ds)[0].pow(2).sum(-1) + ((centre + ds) / start_sigma).pow(2).sum(-1)

    def plausible_offset(ds: torch.Tensor) -> torch.Tensor:
        """Whether each whole offset ``centre + ds`` is within
        :data:`_LINEAR_START_SIGMAS` noise levels in every coordinate."""
        return ((centre + ds) / start_sigma).abs().amax(-1) <= _LINEAR_START_SIGMAS

    def no_outlier(loss: torch.Tensor, typical: torch.Tensor) -> torch.Tensor:
        """Whether each window's ``loss`` is within
        :data:`_LINEAR_WINDOW_SIGMAS` chi-square standard deviations of the
        typical window's (the median of ``typical``, per residual at least
        the noise's 1)."""
        scale = max(float(typical.median()) / m_w, 1.0)
        return loss <= scale * (m_w + _LINEAR_WINDOW_SIGMAS * math.sqrt(2 * m_w))

    def screen(xi: torch.Tensor, delay: int) -> torch.Tensor:
        """The windows whose start error the linearisation at their centre
        explains: the whole offset plausible under the prior (every
        coordinate within :data:`_LINEAR_START_SIGMAS` noise levels), the
        rolled-out loss at the linear offset equal to the linear prediction
        within the loss's own noise (``sqrt(2 m)``, a chi-square's standard
        deviation for ``m`` residuals), and that loss no outlier among the
        windows' (:data:`_LINEAR_WINDOW_SIGMAS`)."""
        every = torch.arange(windows, device=q.device)
        channels, _, solved, e0 = linear_parts(delay, every)
        xi = xi.detach()
        with torch.no_grad():
            _, d, rows = solved(xi)
            rolled = rolled_loss(channels, xi, e0, d)
        ok = ((rolled - rows.pow(2).sum(-1)).abs() <= math.sqrt(2 * m_w)) & plausible_offset(d)
        if bool(ok.any()):
            ok &= no_outlier(rolled, rolled[ok])
        if not bool(ok.any()):
            warnings.warn("identify: estimate_starts='linear': no window's start error is linear within the noise "
                          "at these parameters, so every window is used (the recorded starts' bias then stays in "
                          "part; longer data or a closer start may help)", UserWarning, stacklevel=4)
            return every
        return every[ok]

    def plausible(xi: torch.Tensor, delay: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The windows of ``polish_windows='plausible'`` and their start
        offsets from the centres: every window from the better (by rolled-out
        loss at ``xi``) of its centre and its linear offset, kept when that
        whole offset is plausible under the prior and its loss no outlier
        (the typical loss taken from the screen's kept windows)."""
        every = torch.arange(windows, device=q.device)
        channels, _, solved, e0 = linear_parts(delay, every)
        xi = xi.detach()
        with torch.no_grad():
            zero = torch.zeros_like(centre)
            d = solved(xi)[1]
            d = torch.where(torch.isfinite(d).all(-1, keepdim=True), d, zero)
            loss = [rolled_loss(channels, xi, e0, x) for x in (zero, d)]
            loss = [torch.where(torch.isfinite(l), l, torch.full_like(l, math.inf)) for l in loss]
            linear = loss[1] < loss[0]
            best, start = torch.where(linear, loss[1], loss[0]), torch.where(linear[:, None], d, zero)
        typical = best[kept][torch.isfinite(best[kept])]
        if not typical.numel():  # no kept window's loss to go by: the noise's own
            typical = best.new_full((1,), float(m_w))
        ok = torch.isfinite(best) & plausible_offset(start) & no_outlier(best, typical)
        if not bool(ok.any()):  # the screen's windows, each from its linear offset
            return kept, d[kept]
        return every[ok], start[ok]

    def centred(xi: torch.Tensor, delay: int, s: torch.Tensor, iterations: int) -> torch.Tensor:
        """Every window's start offset fitted through rolled-out steps with
        the parameters held at ``xi`` (from ``s``), flat: the offsets'
        first stage of ``estimate_starts=True`` and the centres the
        linearisation of ``'linear'`` starts from. Near its own optimum a
        window's residuals are often linear in the start where at the
        recorded start they are not (a stance foot's penetration as large
        as the noise on its height)."""
        fun, jac = problem(delay, True, held=xi.detach())
        return _fit_windows(fun, jac, s.reshape(-1), windows, iterations)

    def recentred(xi: torch.Tensor, delay: int, c: torch.Tensor, iterations: int) -> torch.Tensor:
        """(windows, ns) the centres at ``xi``: each window's offset fitted
        from its last centre ``c`` and from its recorded start, the better
        kept (a window may have followed earlier parameters into a basin
        that the recorded start's fit leaves)."""
        fresh = centred(xi, delay, torch.zeros_like(c), iterations).reshape(windows, ns)
        if not bool(c.any()):
            return fresh
        moved = centred(xi, delay, c, iterations).reshape(windows, ns)
        fun = problem(delay, True, held=xi.detach())[0]
        with torch.no_grad():
            loss = [_window_losses(fun(x.reshape(-1)), windows, ns + m_w) for x in (fresh, moved)]
        return torch.where((loss[1] < loss[0])[:, None], moved, fresh)

    minimize, restarts, coords = helpers["minimize"], [], par.log_coordinates()

    def fitted(fun, jac, start, options, label):
        """``minimize``, with collapsed log-coordinates restarted (:func:`_restarted`)."""
        res = minimize(fun, start.clone(), options, jacobian_fun=jac, label=label)
        res, log = _restarted(minimize, fun, jac, res, options, label, coords, par.xi0)
        restarts.extend(log)
        return res

    def solve(d, start, options, starts):
        if starts == "linear":
            fun, jac = linear_problem(d, kept)
            return fitted(fun, jac, start, options, f"identify[contact, delay {d}]"), jac
        if starts:
            # The offsets first, with the parameters held, every window with
            # its own damping: from the first stage's parameters a joint step
            # is often poor, and Levenberg-Marquardt's one damping would then
            # hold every window's offsets back.
            start = torch.cat([start[:P], centred(start[:P], d, start[P:], options.get("iterations"))])
        fun, jac = problem(d, starts)
        return fitted(fun, jac, start, options, f"identify[contact, delay {d}]"), jac

    def search(start, starts, delay=None):
        """The fit with the delay search: every candidate's short fit (unless
        ``delay`` is given), the full fit at the best, the neighbours' refits."""
        if len(fit.delays) == 1:
            res, jac = solve(fit.delays[0], start, opts, starts)
            return res, jac, fit.delays[0], {}, {}
        # Every candidate gets the same short fit from the same start, so
        # that none wins by having had more iterations; the full fit runs at
        # the best, then the others are refitted briefly from its result (a
        # fair comparison near the optimum, and the losses of the
        # likelihood-ratio test). Should one of them do better, the full fit
        # moves there, once.
        short = opts.replace(iterations=min(fit.delay_iterations, opts.get("iterations")))
        first = {}
        if delay is None:
            first = {d: solve(d, start, short, starts)[0].losses[-1] for d in fit.delays}
            delay = min(first, key=first.get)
        res, jac = solve(delay, start, opts, starts)
        for attempt in range(2):
            compared = {delay: res.losses[-1]}
            # The loss of a zero-order-hold delay is close to convex in the
            # delay: the neighbours of the best candidate decide whether it is.
            near = [d for d in fit.delays if d != delay and abs(d - delay) <= 1] or [
                d for d in fit.delays if d != delay]
            # (Linearised starts: the neighbours get full fits. A short refit
            # from the chosen delay's optimum favours that delay, where the
            # joint dampings can stand in for a step of delay; measured on
            # the stiff-contact MuJoCo draw, whose delay it missed.)
            others = {d: solve(d, res.x, opts if starts == "linear" else short, starts)[0] for d in near}
            compared.update({d: r.losses[-1] for d, r in others.items()})
            better = min(compared, key=compared.get)
            if better == delay or attempt == 1:
                break
            delay = better
            res, jac = solve(delay, others[better].x, opts, starts)
        # Reported: the short fits from the start, replaced by the refits
        # near the optimum where there are some.
        return res, jac, delay, {**first, **compared}, compared

    res, jac, delay, delay_losses, compared = search(par.xi0, False)
    kept, centre, polished = None, None, ""
    if start_mode == "linear":
        # From the first fit's result: every window's offset fitted rolled
        # out, then the fit (with the delay's neighbours) on the windows
        # whose start error the linearisation at that offset explains; then
        # rounds of centring at the last fit, screening and refitting at
        # that delay until the windows stay and the loss stops dropping, the
        # neighbours compared again at the end. (A fit linearised around
        # earlier parameters' centres stops short of the profile's minimum:
        # measured on the stiff MuJoCo draws, the rolled-out loss kept
        # falling from the one-round fit towards the truth.)
        centre = state0.v.new_zeros(windows, ns)
        rounds = 0
        for rounds in range(1, _LINEAR_ROUNDS + 1):
            centre = recentred(res.x, delay, centre, opts.get("iterations"))
            again = screen(res.x, delay)
            same = kept is not None and torch.equal(again, kept)
            kept, before = again, res.losses[-1]
            if rounds == 1:
                res, jac, delay, delay_losses, compared = search(res.x, "linear", delay)
                continue
            res, jac = solve(delay, res.x, opts, "linear")
            if same and before - res.losses[-1] <= math.sqrt(2 * len(kept) * m_w):
                break
        if rounds > 1:
            res, jac, delay, delay_losses, compared = search(res.x, "linear", delay)
        if fit.polish_iterations:
            # Each kept window from its centre moved by its linear offset at
            # the fit: the rolled-out problem's loss there is the screen's.
            if fit.polish_windows == "plausible":
                screened, (kept, d) = kept, plausible(res.x, delay)
                which = (f"{len(kept)} plausible windows (the screen kept {len(screened)}; "
                         f"{int((~torch.isin(kept, screened)).sum())} more)")
            else:
                with torch.no_grad():
                    d = linear_parts(delay, kept)[2](res.x.detach())[1]
                which = f"{len(kept)} kept windows"
            fun, jac = problem(delay, True, keep=kept)
            res = fitted(fun, jac, torch.cat([res.x[:P], d.reshape(-1)]), opts.replace(iterations=fit.polish_iterations),
                         f"identify[contact, delay {delay}, rolled out]")
            polished = (f"; rolled out on the {which}: loss {res.losses[0]:.8g} -> "
                        f"{res.losses[-1]:.8g} in {res.iterations} iterations ({res.message})")
    elif ns:
        # The start offsets join from the first fit's result: from a far
        # start they would absorb the model's error (a window's offsets can
        # mimic much of a wrong parameter over its short span) and the fit
        # would settle there.
        res, jac, delay, delay_losses, compared = search(torch.cat([res.x, res.x.new_zeros(windows * ns)]), True, delay)
    J = res.jacobian if res.jacobian is not None else jac(res.x)[1]
    count = J.shape[0]
    xi = res.x[:P]
    if isinstance(J, BlockJacobian):  # the information on the parameters, the start offsets marginalised
        J = J.reduced()
    names = [p for p in helpers["IDENTIFIABLE_PARAMETERS"] if p in robot_params]
    fitted_robot = par.robot_model(xi)
    out = {p: getattr(fitted_robot, p).detach() for p in names}
    initial = {p: getattr(robot, p).detach() for p in names}
    ex_out, ex_init = par.output(xi)
    out.update(ex_out)
    initial.update(ex_init)
    fitted_robot = robot.replace(**{p: out[p] for p in names}) if names else robot
    # (The residual variance's degrees of freedom discount the offsets too.)
    used = windows if kept is None else len(kept)
    stats = helpers["uncertainty"](par, xi, J, res.losses[-1], count - used * ns, out, initial)
    _flag_weak(stats, par.labels(), out, ("body_mass", "damping", "friction", "armature") + CONTACT_PARAMETERS)
    with torch.no_grad():
        sim_fit, _ = par.build(xi)
    delay_identified = True
    if len(fit.delays) > 1:
        rank_dof = max(count - int(res.x.numel()), 1)
        # Noise-free data fit exactly: any worse candidate is then rejected.
        sigma2 = max(res.losses[-1] / rank_dof, torch.finfo(res.x.dtype).tiny)
        others = [l for d, l in compared.items() if d != delay]
        delay_identified = all((l - compared[delay]) / sigma2 > _CHI2_95 for l in others)
        if not delay_identified:
            stats["not_identified"].append("delay")
    labels = {(name, idx_): lab for name, idx_, lab in par.labels()}
    result = helpers["Result"](
        robot=fitted_robot,
        params=out,
        initial=initial,
        losses=[f / count for f in res.losses],
        rms_residual=math.sqrt(res.losses[-1] / count),
        iterations=res.iterations,
        evaluations=res.evaluations,
        wall_time=res.wall_time,
        message=res.message + ("" if kept is None or len(kept) == windows else
                               f"; {windows - len(kept)} of {windows} windows set aside ("
                               + ("their rolled-out loss is an outlier or their start offset implausible"
                                  if fit.polish_windows == "plausible" else
                                  "their start's effect is not linear within the noise, or their loss is an "
                                  "outlier") + "): "
                               f"{_listed([int(origin[i]) for i in sorted(set(range(windows)) - set(kept.tolist()))])}")
        + ("" if windows == cut else
           f"; {windows} of {cut} windows used (the fewest contact switches at the starting guess)")
        + polished
        + _restart_note(restarts)
        + ("" if fitted_mass is None else
                               f"; body masses summed to total_mass {fit.total_mass:g} kg exactly (their sum has "
                               "no variance: the intervals are given that total)"),
        method="contact",
        options=opts,
        simulator=sim_fit.replace(robot=fitted_robot, contact=ContactModel(
            fitted_robot, sim_fit.contact.geometry, sim_fit.contact.terrain,
            _detached(sim_fit.contact.params), sim_fit.contact.self_collision, unilateral=sim_fit.contact.unilateral),
            actuator=_detached_actuator(sim_fit.actuator)),
        delay=delay,
        delay_losses={d: l / count for d, l in delay_losses.items()},
        entry_labels=labels,
        **stats,
    )
    if result.not_identified:
        warnings.warn(
            f"identify: the data do not determine {_listed(result.not_identified, 8)}"
            + ": other values fit the data equally well; see IdentificationResult.identified and .summary()",
            UserWarning,
            stacklevel=3,
        )
    return result


def _contact_switches(par, q0: torch.Tensor, v0: torch.Tensor, commands: list) -> torch.Tensor:
    """(windows,) how often a contact point enters or leaves the terrain in
    each window's rollout at the starting guess ``par.xi0`` from its recorded
    start, summed over the candidate delays' ``commands``; a rollout that
    fails or leaves the finite counts as infinitely many."""
    s, scale = par.build(par.xi0)
    total = q0.new_zeros(q0.shape[0])
    with torch.no_grad():
        for u in commands:
            try:
                tr = s.rollout(State(q0, v0), u if scale is None else u * scale, check_finite=False,
                               contact_record=("penetration",))
            except (torch.linalg.LinAlgError, InvalidValueError, NonFiniteError):
                return total.fill_(math.inf)
            inside = tr.contact.penetration > 0  # (windows, K, points)
            count = (inside[:, 1:] != inside[:, :-1]).flatten(1).sum(1).to(total.dtype)
            finite = torch.isfinite(tr.q).flatten(1).all(1) & torch.isfinite(tr.v).flatten(1).all(1)
            total = total + torch.where(finite, count, torch.full_like(count, math.inf))
    return total


def _restarted(minimize, fun, jac, res, options, label: str, coords: list, reference: torch.Tensor):
    """``res``, or a better fit of ``fun``: each of the log-coordinates
    ``coords`` (``(index, name)``) that fell more than :data:`_COLLAPSE`
    below its ``reference`` (the starting guess) is set back to it and the
    fit rerun from there; the rerun is kept when its loss is lower.

    Measured on the MuJoCo benchmark's seed 2: two joint dampings ran to 0
    (1e-31 and below) early in the fit, where the other parameters were
    still far off, and the front right leg's masses then settled around
    them 31 % and 17 % off. Set back to their starting value, the same fit
    went to the truth in 8 iterations; left to climb back from 1e-6, the
    dampings did, but the masses stayed where they were.

    Returns the fit and, per restart, ``(names, loss before, loss after,
    kept)``.
    """
    log = []
    for _ in range(_RESTARTS):
        x = res.x.detach().clone()
        low = [(i, name) for i, name in coords if float(x[i]) < float(reference[i]) - _COLLAPSE]
        if not low:
            break
        idx = torch.tensor([i for i, _ in low], device=x.device)
        x[idx] = reference.to(x)[idx]
        try:
            again = minimize(fun, x, options, jacobian_fun=jac, label=f"{label}, restarted")
        except NonFiniteError:  # the loss is not finite there: no restart
            again = None
        kept = again is not None and again.losses[-1] < res.losses[-1]
        log.append(([name for _, name in low], res.losses[-1], again.losses[-1] if again else math.inf, kept))
        if not kept:
            break
        # One history: the restart's iterations follow the first fit's.
        again.losses = res.losses + again.losses[1:]
        again.iterations += res.iterations
        again.evaluations += res.evaluations
        again.wall_time += res.wall_time
        res = again
    return res, log


def _restart_note(log: list) -> str:
    """The result message's account of :func:`_restarted`'s restarts."""
    if not log:
        return ""
    kept = [entry for entry in log if entry[3]]
    names = sorted({n for entry in log for n in entry[0]})
    return (f"; {_listed(names, 6)} collapsed (over {math.exp(_COLLAPSE):.0f}x below the starting guess) and "
            f"{'was' if len(names) == 1 else 'were'} restarted from it {len(log)} time(s), "
            f"{len(kept)} kept (a lower loss)"
            + (f": loss {kept[-1][1]:.8g} -> {kept[-1][2]:.8g} at the last" if kept else ""))


def _listed(items: list, most: int = 12) -> str:
    shown = ", ".join(str(i) for i in items[:most])
    return shown + (f" and {len(items) - most} more" if len(items) > most else "")


def _window_losses(r: torch.Tensor, windows: int, m: int) -> torch.Tensor:
    """(windows,) each window's loss from window-major residuals ``r``
    (``m`` rows per window, then any shared rows, left out)."""
    return r[: windows * m].reshape(windows, m).pow(2).sum(1)


def _fit_windows(fun, jac, s: torch.Tensor, windows: int, iterations: int) -> torch.Tensor:
    """Levenberg-Marquardt on unknowns of each window's own only (``jac``
    gives a :class:`BlockJacobian` without shared columns): the windows are
    independent problems, so each gets its own damping and accepts or
    refuses its own step (one damping for all would let the hardest window,
    say one through a contact switch, hold every other one back)."""
    n = s.numel() // windows
    s = s.reshape(windows, n)
    lam = torch.ones(windows, dtype=s.dtype, device=s.device)
    eye = torch.eye(n, dtype=s.dtype, device=s.device)

    for _ in range(iterations):
        # (The Jacobian at the top of each iteration: none after the last.)
        r, J = jac(s.reshape(-1))
        m = J.local.shape[1]
        f = _window_losses(r, windows, m)
        rw = r[: windows * m].reshape(windows, m)
        g = torch.einsum("wmn,wm->wn", J.local, rw)
        A = J.local.transpose(-1, -2) @ J.local
        d = torch.diagonal(A, dim1=-2, dim2=-1)
        d = d.clamp_min(1e-12 * d.amax(-1, keepdim=True).clamp_min(1e-300))
        new, done = s.clone(), torch.zeros(windows, dtype=torch.bool, device=s.device)
        for _ in range(20):
            try:
                step = -torch.linalg.solve(A + torch.diag_embed(lam[:, None] * d) + 1e-15 * eye, g)
            except RuntimeError:
                lam = torch.where(done, lam, lam * 4)
                continue
            trial = torch.where(done[:, None], new, s + step)
            with torch.no_grad():
                f_t = _window_losses(fun(trial.reshape(-1)), windows, m)
            ok = torch.isfinite(f_t) & (f_t < f) & ~done
            new = torch.where(ok[:, None], trial, new)
            lam = torch.where(ok, (lam / 10).clamp_min(1e-12), torch.where(done, lam, lam * 4))
            done |= ok
            if bool(done.all()):
                break
        if not bool(done.any()):
            break
        s = new
    return s.reshape(-1)


def _flag_weak(stats: dict, labels: list, out: dict, positive: tuple) -> None:
    """Report a positive entry the data determine only within a wide range
    (relative standard error above :data:`_WEAK_RELATIVE_STD`) as not
    identified, with the interval ``[0, inf]``: the Jacobian has no exact
    null direction there, but a value with an interval of, say, ``[1e-300,
    1e300]`` is not a measurement (modifies ``stats`` in place)."""
    for name, idx, label in labels:
        if name not in positive or not bool(stats["identified"][name][idx]):
            continue
        val, s = float(out[name][idx]), float(stats["std"][name][idx])
        if not (val > 0 and s / val <= _WEAK_RELATIVE_STD):
            stats["identified"][name][idx] = False
            stats["lower"][name][idx], stats["upper"][name][idx] = 0.0, math.inf
            stats["not_identified"].append(label)


def _detached(cp):
    """Contact parameters (either law) with every tensor detached."""
    return cp.replace(**{f.name: getattr(cp, f.name).detach() for f in fields(cp)
                         if isinstance(getattr(cp, f.name), torch.Tensor)})


def _detached_actuator(act):
    if isinstance(act, PDActuator):
        d = (lambda x: x.detach() if isinstance(x, torch.Tensor) else x)
        return PDActuator(kp=d(act.kp), kd=d(act.kd), joints=act.joints, effort_limit=act.effort_limit)
    return act
