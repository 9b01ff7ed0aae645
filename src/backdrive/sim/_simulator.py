"""The simulator: a system, an integrator, an actuator and soft joint limits."""

from __future__ import annotations

import dataclasses
import functools
import math

import torch
import torch.utils.checkpoint

from .._shapes import broadcast_shapes
from ..runtime import threads_for_batch
from .._errors import InputError
from ..contact import ContactModel, ContactResult, integrate_world
from ..contact._model import unilateral_step
from ..dynamics import DEFAULT_FRICTION_WIDTH, bias_forces, mass_matrix
from ..kinematics._paths import transforms_active
from ..model import RobotModel
from ._actuators import PDActuator, SoftJointLimits, TorqueActuator, smooth_saturation
from ._implicit import ImplicitJointForces
from ._integrators import INTEGRATORS
from ._state import NonFiniteError, State, Trajectory
from ._systems import RobotSystem, System, as_system

__all__ = ["Simulator", "JOINT_FORCE_MODES"]

#: Accepted values of ``Simulator(joint_forces=...)``.
JOINT_FORCE_MODES = ("auto", "implicit", "explicit")


def _small_batch_threads(rollout):
    """Run a rollout of a small batch on one torch thread (:func:`backdrive.runtime.adaptive_threads`)."""

    @functools.wraps(rollout)
    def wrapper(self, state0, controls, *args, **kwargs):
        batch = max(
            getattr(getattr(state0, "q", None), "shape", (0,))[:-1].numel(),
            controls.shape[:-2].numel() if isinstance(controls, torch.Tensor) and controls.ndim >= 2 else 1,
        )
        with threads_for_batch(batch):
            return rollout(self, state0, controls, *args, **kwargs)

    return wrapper


class Simulator:
    """Differentiable fixed-step simulation of a robot or a built-in system.

    Every step maps ``(q, v, u)`` to the next ``(q, v)`` with plain tensor
    operations, so gradients flow to the initial state, the controls, the
    actuator gains and the robot's physical parameters (build the robot with
    ``robot.replace(body_mass=..., damping=...)`` or call :meth:`replace`).

    Args:
        system: a :class:`~backdrive.RobotModel` or a :class:`System`
            (e.g. :class:`MassSpringDamper`).
        dt: step length, s.
        integrator: ``"semi_implicit"`` (symplectic Euler: velocity first, then
            position), ``"euler"`` or ``"rk4"``.
        actuator: :class:`TorqueActuator` (default, all joints) or
            :class:`PDActuator`; its ``joints`` are the controlled coordinates.
        limits: :class:`SoftJointLimits` to apply the model's position limits
            as spring-dampers, or ``None`` for no limit forces.
        joint_forces: how a robot's joint damping and Coulomb friction are
            integrated. ``"implicit"``: damping as MuJoCo's Euler does,
            ``(M + dt D) dv = dt f``, and friction as a force bounded by the
            URDF friction, solved together with the new velocity, so a joint
            at rest stays at rest (stable at any ``dt``; see
            ``docs/simulation.md``). ``"explicit"``: both evaluated at the
            step's start velocity, friction as ``F tanh(v / friction_width)``
            (the scheme before; unstable once ``dt D / m > 2``).
            ``"auto"`` (default): ``"implicit"`` for a robot with the Euler
            integrators, ``"explicit"`` for ``"rk4"`` (whose stages are
            explicit) and for other systems.
        friction_width: velocity scale ``w`` of the friction regularisation,
            rad/s (m/s), ``> 0``: the friction force grows with slope ``F / w``
            from rest and saturates at ``F`` (implicit), or is
            ``F tanh(v / w)`` (explicit). A joint under a load below ``F``
            creeps at about ``w load / F``.
        contact: a :class:`~backdrive.contact.ContactModel` of the robot
            (geometry, terrain, force law), or ``None``. With contact the
            step is semi-implicit Euler with the contact damping and
            stiffness (and a PD actuator's ``kd``) implicit and the floating
            base moved by :func:`~backdrive.contact.integrate_world`; stable
            at 1-10 ms (``docs/contact.md``). With implicit joint forces
            the joints' damping and friction are solved in the same step,
            which takes the contact's fast path from 128 samples (160
            recording a gradient; ``docs/contact.md``, *12th session: the
            Simulator on the fast step*). Needs a robot and the
            ``"semi_implicit"`` integrator. Each rollout keeps the contact
            result of every step in ``Trajectory.contact``.

    Attributes:
        actuated: indices of the driven joint coordinates (``nu`` of them).
        effort_limit: ``(nu,)`` saturation level of each driven joint.
    """

    #: Internal switch for tests and benchmarks: ``True`` runs the implicit
    #: contact step as before the 12th session (the contact's terms passed to
    #: :meth:`ImplicitJointForces.velocity`, never the fast contact step).
    _joint_solve_contact = False

    def __init__(
        self,
        system,
        dt: float,
        *,
        integrator: str = "semi_implicit",
        actuator: TorqueActuator | PDActuator | None = None,
        limits: SoftJointLimits | None = None,
        joint_forces: str = "auto",
        friction_width: float = DEFAULT_FRICTION_WIDTH,
        contact: ContactModel | None = None,
    ):
        if not (isinstance(friction_width, (int, float)) and math.isfinite(friction_width) and friction_width > 0):
            raise InputError(f"friction_width must be a positive finite number (rad/s), got {friction_width!r}")
        self.friction_width = float(friction_width)
        if type(system) is RobotSystem:  # rebuilt with this friction width (a subclass is kept as given)
            system = system.robot
        self.system: System = (
            RobotSystem(system, friction_width=self.friction_width)
            if isinstance(system, RobotModel)
            else as_system(system)
        )
        if not (isinstance(dt, (int, float)) and math.isfinite(dt) and dt > 0):
            raise InputError(f"dt must be a positive finite number of seconds, got {dt!r}")
        self.dt = float(dt)
        if integrator not in INTEGRATORS:
            raise InputError(f"unknown integrator {integrator!r}; choose one of {', '.join(INTEGRATORS)}")
        self.integrator = integrator
        self._integrate_step = INTEGRATORS[integrator]
        self._joint_forces_setting = joint_forces
        self.joint_forces = _joint_force_mode(joint_forces, integrator, isinstance(self.system, RobotSystem))
        # The implicit velocity update of the Euler integrators (None: every
        # force goes through the system's forward dynamics, explicitly).
        self._implicit = (
            ImplicitJointForces(self.system.robot, self.dt, self.friction_width)
            if self.joint_forces == "implicit"
            else None
        )
        self.actuator = TorqueActuator() if actuator is None else actuator
        if not isinstance(self.actuator, (TorqueActuator, PDActuator)):
            raise InputError(f"actuator must be a TorqueActuator or PDActuator, got {type(actuator).__name__}")
        if limits is not None and not isinstance(limits, SoftJointLimits):
            raise InputError(f"limits must be SoftJointLimits or None, got {type(limits).__name__}")
        self.limits = limits
        self.contact = _check_contact(contact, self.system, integrator)
        self._bare = self._friction = None
        if self.contact is not None and self._implicit is not None:
            # The contact step runs on the model without joint damping and
            # friction; _implicit_contact adds both (see there).
            r, imp = self.robot, self._implicit
            plain = not (imp.has_damping or imp.has_friction or r.damping.requires_grad or r.friction.requires_grad)
            self._bare = r if plain else r.replace(damping=torch.zeros_like(r.damping), friction=torch.zeros_like(r.friction))
            if imp.has_friction and self.contact.soft:
                raise InputError(
                    f"robot {r.name!r} has joint friction, which the implicit step solves together with the penalty "
                    "contact; MuJoCo's soft contact (SoftContactParameters) does not take it yet: set the robot's "
                    "friction to 0 (robot.replace(friction=...)), or use ContactParameters")
            if imp.has_friction:
                self._friction = imp.fast_friction(self.contact, self._bare)

        sysm = self.system
        nj = sysm.num_joints
        joints = self.actuator.joints
        idx = list(range(nj)) if joints is None else [sysm.joint_index(j) for j in joints]
        if len(set(idx)) != len(idx):
            raise InputError(f"actuator joints repeat a joint: {list(joints)}")
        self.actuated = tuple(idx)
        self._idx = torch.tensor(idx, dtype=torch.long, device=sysm.device)
        self._all_joints = idx == list(range(nj))
        # One-hot (nu, nj) map from driven-joint efforts to all joint efforts:
        # a matmul keeps batching and autograd simple.
        sel = torch.zeros(len(idx), nj, dtype=sysm.dtype, device=sysm.device)
        if idx:
            sel[torch.arange(len(idx)), self._idx] = 1.0
        self._select = sel

        lim = self.actuator.effort_limit
        if lim is None:
            lim = sysm.effort_limit[self._idx]
        elif isinstance(lim, torch.Tensor):
            if lim.dtype != sysm.dtype or lim.device != sysm.device:
                raise InputError(f"effort_limit must be {sysm.dtype} on {sysm.device}")
            lim = lim.expand(len(idx))
        else:
            lim = torch.full((len(idx),), float(lim), dtype=sysm.dtype, device=sysm.device)
        bad = [sysm.joint_names[i] for i, ok in zip(idx, (lim > 0).tolist()) if not ok]
        if bad:
            raise InputError(
                f"driven joints {bad} have effort limit <= 0 (passive in the URDF); leave them out "
                "with actuator joints=[...] or give the actuator a positive effort_limit"
            )
        self.effort_limit = lim
        # Decided once here, so the step has no data-dependent branch.
        self._saturate = bool(torch.isfinite(lim).any())
        self._has_limits = limits is not None and bool(
            (torch.isfinite(sysm.lower) | torch.isfinite(sysm.upper)).any()
        )

    # ------------------------------------------------------------------ helpers

    @property
    def robot(self):
        """The :class:`~backdrive.RobotModel` being simulated (``None`` for a built-in system)."""
        return self.system.robot if isinstance(self.system, RobotSystem) else None

    @property
    def nq(self) -> int:
        return self.system.nq

    @property
    def nv(self) -> int:
        return self.system.nv

    @property
    def nu(self) -> int:
        """Control size: one entry per driven joint."""
        return len(self.actuated)

    @property
    def dtype(self) -> torch.dtype:
        return self.system.dtype

    @property
    def device(self) -> torch.device:
        return self.system.device

    def replace(self, *, robot=None, system=None, **kwargs) -> Simulator:
        """A simulator with some settings changed, e.g. ``replace(robot=robot.replace(body_mass=m))``.

        Keyword arguments: ``robot`` or ``system``, ``dt``, ``integrator``,
        ``actuator``, ``limits``, ``joint_forces``, ``friction_width``, ``contact``.
        """
        if robot is not None and system is not None:
            raise InputError("give robot or system, not both")
        new_system = robot if robot is not None else (system if system is not None else self.system)
        settings = {
            "dt": self.dt,
            "integrator": self.integrator,
            "actuator": self.actuator,
            "limits": self.limits,
            "joint_forces": self._joint_forces_setting,
            "friction_width": self.friction_width,
            "contact": self.contact,
        }
        unknown = set(kwargs) - set(settings)
        if unknown:
            raise InputError(
                f"unknown simulator settings {sorted(unknown)}; valid: robot, system, {', '.join(settings)}"
            )
        settings.update(kwargs)
        dt = settings.pop("dt")
        return Simulator(new_system, dt, **settings)

    def initial_state(self, q: torch.Tensor | None = None, v: torch.Tensor | None = None) -> State:
        """A :class:`State`: ``q`` defaults to the neutral configuration (the
        robot's ``neutral()``, else zeros) and ``v`` to zeros."""
        sysm = self.system
        if q is None:
            q = self.robot.neutral() if self.robot is not None else torch.zeros(
                sysm.nq, dtype=sysm.dtype, device=sysm.device
            )
        if v is None:
            v = torch.zeros(*q.shape[:-1], sysm.nv, dtype=sysm.dtype, device=sysm.device)
        sysm.check_state(q, v)
        return State(q, v)

    def zero_controls(self, horizon: int, *batch: int) -> torch.Tensor:
        """``(*batch, horizon, nu)`` zeros in the simulator's dtype and device."""
        return torch.zeros(*batch, horizon, self.nu, dtype=self.dtype, device=self.device)

    # ------------------------------------------------------------------ physics

    def efforts(self, q: torch.Tensor, v: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Generalised force ``(..., nv)`` and driven-joint efforts ``(..., nu)``.

        The generalised force sums the saturated actuator efforts and the soft
        joint-limit forces; an unactuated floating base gets zero.
        """
        sysm = self.system
        qj = sysm.joint_positions(q)
        vj = sysm.joint_velocities(v)
        if self._all_joints:
            qa, va = qj, vj
        else:
            qa, va = qj[..., self._idx], vj[..., self._idx]
        effort = self.actuator.effort(qa, va, u)
        if self._saturate:
            effort = smooth_saturation(effort, self.effort_limit)
        tau_j = effort if self._all_joints else effort @ self._select
        if self._has_limits:
            tau_j = tau_j + self.limits.effort(qj, vj, sysm.lower, sysm.upper)
        return sysm.generalized_force(tau_j), effort

    def acceleration(self, q: torch.Tensor, v: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        """``(..., nv)`` acceleration under control ``u (..., nu)``.

        The continuous-time model: joint damping and ``tanh``-smoothed friction
        evaluated at ``v``. A step with ``joint_forces="implicit"`` evaluates
        them at the new velocity instead, so its ``(v1 - v) / dt`` differs by
        ``O(dt)`` (and stays bounded where this is stiff).
        """
        tau, _ = self.efforts(q, v, u)
        return self.system.forward_dynamics(q, v, tau)

    def _advance(self, q, v, u):
        tau0, effort = self.efforts(q, v, u)
        if self._implicit is not None:
            # Euler integrators with implicit joint damping and friction: the
            # new velocity comes from one solve (backdrive.sim._implicit).
            # Contact joins the same solve through extra_force= (J^T f at
            # (q, v)) and extra_implicit= (J^T K J): see _advance_contact.
            v1 = self._implicit.velocity(q, v, tau0)
            # "semi_implicit" moves q with the new velocity, "euler" with the old.
            q1 = self.system.integrate(q, v1 if self.integrator == "semi_implicit" else v, self.dt)
            return q1, v1, effort
        first = [True]

        def accel(qs, vs):
            # The first stage is at (q, v): reuse the efforts computed above.
            if first[0]:
                first[0] = False
                return self.system.forward_dynamics(qs, vs, tau0)
            return self.acceleration(qs, vs, u)

        q1, v1 = self._integrate_step(accel, self.system.integrate, q, v, self.dt, self.system.dexp_inv)
        return q1, v1, effort

    def _advance_contact(self, q, v, u):
        """One step with contact: ``(q1, v1, effort, contact result)``."""
        robot, dt = self.robot, self.dt
        tau, effort = self.efforts(q, v, u)
        damping = self._pd_damping(q)
        if self._implicit is not None and not (self._joint_solve_contact or torch.compiler.is_compiling()):
            a, res = self._implicit_contact(q, v, tau, damping)
        elif self._implicit is not None:
            # The step before the 12th session (and under torch.compile): the
            # contact's terms passed to ImplicitJointForces.velocity, a dense
            # mass matrix and Cholesky at every batch size. Kept for the tests
            # (Simulator._joint_solve_contact) and for compiled steps.
            # Without adhesion as every implicit contact step (unilateral_step).
            # The mass matrix (the contact terms' own) and the bias forces once
            # for every pass (ImplicitJointForces.solve: velocity()'s operations).
            terms = self.contact.implicit_terms(robot, q, v, dt)
            M, h = terms._M, bias_forces(robot, q, v)

            def solve(t):
                extra = t.matrix if damping is None else t.matrix + torch.diag_embed(damping)
                v_new = self._implicit.solve(M, h, v, tau + t.force, extra)
                return (v_new - v) / dt

            a, res = unilateral_step(self.contact, robot, terms, solve, dt)
        else:
            a, res = self.contact.acceleration(robot, q, v, tau, dt=dt, extra_damping=damping)
        q1, v1 = integrate_world(robot, q, v, a, dt)
        return q1, v1, effort, res

    def _implicit_contact(self, q, v, tau, kd):
        """The contact step with the joints' damping and friction implicit: ``(a, result)``.

        The joint damping ``D`` joins the PD ``kd`` as the step's implicit
        damping (``-D v`` in ``tau``), so the step is the contact's own
        (:meth:`ContactModel.acceleration`, its fast path from
        ``FAST_MIN_BATCH["contact_step"]`` samples) on the model without
        damping and friction: ``(M + dt (D + kd) + dt J^T (C + dt K) J) a =
        tau - D v - b + J^T (...)``. Joint friction is solved with it: on the
        fast path by :class:`~backdrive.contact._fast.JointFriction`, else by
        :meth:`ImplicitJointForces.contact_acceleration`.
        """
        imp, robot, dt = self._implicit, self.robot, self.dt
        bare = self._bare
        ed = kd
        if imp.has_damping:
            d = imp._padded(robot.damping)
            tau = tau - d * v
            ed = d if ed is None else ed + d
        if not imp.has_friction:
            return self.contact.acceleration(bare, q, v, tau, dt=dt, extra_damping=ed)
        from ..contact import _fast

        F = robot.friction[imp._fj]
        path = _fast.dispatch(self.contact, bare, q, v, tau)
        if path == "fast":
            return _fast.implicit_acceleration_fast(self.contact, bare, q, v, tau, dt, None, ed, self._friction, F)
        if path == "recorded":
            return _fast.implicit_acceleration_recorded(self.contact, bare, q, v, tau, dt, None, ed, self._friction, F)
        return imp.contact_acceleration(self.contact, bare, q, v, tau, ed, F)

    def _pd_damping(self, q):
        """``(nv,)`` the PD actuator's ``kd`` on its joints (treated implicitly), or ``None``."""
        if not isinstance(self.actuator, PDActuator):
            return None
        kd = self.actuator.kd
        if isinstance(kd, (int, float)):
            # A number filled in on the device (torch.as_tensor would copy it
            # there, a host synchronisation, at every step); a tensor kept.
            kd = torch.full((self.nu,), float(kd), dtype=self.dtype, device=self.device)
        else:
            kd = torch.as_tensor(kd, dtype=self.dtype, device=self.device).expand(self.nu)
        kd = kd @ self._select
        if self.robot.floating_base:
            kd = torch.cat([kd.new_zeros(6), kd])
        return kd

    def _prepare(self, q, v, controls, time_axis: bool):
        sysm = self.system
        sysm.check_state(q, v)
        ndim_u = 2 if time_axis else 1
        name = "controls" if time_axis else "control"
        if not isinstance(controls, torch.Tensor):
            raise InputError(f"{name} must be a torch.Tensor, got {type(controls).__name__}")
        shape_hint = "(..., T, nu)" if time_axis else "(..., nu)"
        if controls.ndim < ndim_u or controls.shape[-1] != self.nu:
            raise InputError(f"{name} must have shape {shape_hint} with nu={self.nu}, got {tuple(controls.shape)}")
        if controls.dtype != sysm.dtype or controls.device != sysm.device:
            raise InputError(
                f"{name} must be {sysm.dtype} on {sysm.device}, got {controls.dtype} on {controls.device}"
            )
        u_batch = controls.shape[: controls.ndim - ndim_u]
        try:
            batch = broadcast_shapes(q.shape[:-1], v.shape[:-1], u_batch)
        except RuntimeError:
            raise InputError(
                f"batch axes do not broadcast: q {tuple(q.shape)} (batch {tuple(q.shape[:-1])}), "
                f"v {tuple(v.shape)} (batch {tuple(v.shape[:-1])}), {name} {tuple(controls.shape)} "
                f"(batch {tuple(u_batch)}, the axes before {'(T, nu)' if time_axis else '(nu,)'})"
            ) from None
        q = q.expand(*batch, sysm.nq)
        v = v.expand(*batch, sysm.nv)
        controls = controls.expand(*batch, *controls.shape[controls.ndim - ndim_u :])
        return q, v, controls

    def step(self, state: State, control: torch.Tensor, *, check_finite: bool = True) -> State:
        """Advance one step.

        Args:
            state: :class:`State` with ``q (..., nq)``, ``v (..., nv)``.
            control: ``(..., nu)``, held constant over the step.
            check_finite: raise :class:`NonFiniteError` if the new state is not
                finite (one host synchronisation per call).

        Returns:
            The next :class:`State` (batch shapes broadcast).
        """
        q, v, u = self._prepare(state.q, state.v, control, time_axis=False)
        try:
            if self.contact is not None:
                q1, v1, _, _ = self._advance_contact(q, v, u)
            else:
                q1, v1, _ = self._advance(q, v, u)
        except torch.linalg.LinAlgError as exc:
            self._report_failed_step(_FailedStep(0, q, v, u, [], [], exc), [q], [v], u[..., None, :])
        if check_finite and not bool(torch.isfinite(q1).all() & torch.isfinite(v1).all()):
            culprits = _culprits(q, v, u)
            if culprits.endswith("diverged)"):
                bad = ~(torch.isfinite(q1).all(-1) & torch.isfinite(v1).all(-1))
                culprits += "." + self._diagnose(q[bad], v[bad], u[bad])
            raise NonFiniteError(
                "the simulation step produced a non-finite state" + culprits,
                step=1,
                what="q" if not bool(torch.isfinite(q1).all()) else "v",
            )
        return State(q1, v1)

    @_small_batch_threads
    def rollout(
        self,
        state0: State,
        controls: torch.Tensor,
        *,
        truncate_every: int | None = None,
        checkpoint_every: int | None = None,
        monitor_gradients: bool = False,
        check_finite: bool = True,
        contact_record=True,
    ) -> Trajectory:
        """Simulate ``T`` steps from ``state0`` under ``controls``.

        Args:
            state0: initial :class:`State` (``(..., nq)``, ``(..., nv)``).
            controls: ``(..., T, nu)``; step ``t`` holds ``controls[..., t, :]``.
            truncate_every: if ``k``, detach the state every ``k`` steps so that
                gradients flow back at most ``k`` steps (bounded memory of the
                past, no exploding products of long Jacobian chains). The
                stored states keep their graph, so a loss on state ``t``
                still reaches the controls of its own window.
            checkpoint_every: if ``k``, trade recomputation for memory: the
                forward pass keeps, of every window of ``k`` steps, only its
                first state, its controls and the stored outputs (states,
                efforts, the contact record), and the graph holds one node
                per window; ``backward`` re-runs the window's steps to get
                the intermediate values it needs. The gradients are those of
                the plain rollout (bit for bit on the CPU, also for
                parameters inside the model such as masses or a contact
                friction); the backward pass costs one more forward pass,
                and memory grows with the horizon only by the stored outputs
                (``docs/scaling.md``, *Memory*; keep less of the contact
                record with ``contact_record``). Under ``torch.func``
                transforms and forward-mode AD it falls back to
                :func:`torch.utils.checkpoint`. Without grad mode it has no
                effect.
            monitor_gradients: record the norm of the gradient reaching each
                state during ``backward``; read it with
                :meth:`Trajectory.state_gradient_norms`.
            check_finite: after the rollout, raise :class:`NonFiniteError`
                naming the first step whose state is NaN or infinite (one host
                synchronisation per rollout). Turn off inside ``torch.func``
                transforms.
            contact_record: with contact, which fields of each step's
                :class:`~backdrive.contact.ContactResult` the trajectory keeps
                in ``Trajectory.contact``: ``True`` (default) all of them;
                ``False`` none (``Trajectory.contact`` is ``None``); or a
                sequence of field names, e.g. ``("normal_force",
                "slip_velocity")``: those, the others ``None``. The full
                record is about 8x the states (the contact Jacobian alone
                ``np x 3 x nv`` numbers per step); keep what the loss needs
                for long rollouts (``docs/scaling.md``, *Memory*).

        Returns:
            :class:`Trajectory` with ``q (..., T + 1, nq)``, ``v (..., T + 1, nv)``
            and the applied efforts ``(..., T, nu)``.
        """
        q, v, controls = self._prepare(state0.q, state0.v, controls, time_axis=True)
        T = controls.shape[-2]
        for name, k in (("truncate_every", truncate_every), ("checkpoint_every", checkpoint_every)):
            if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
                raise InputError(f"{name} must be a positive int or None, got {k!r}")
        fields = self._contact_fields(contact_record)
        norms = None
        if monitor_gradients:
            norms = [[q.new_zeros(()), q.new_zeros(())] for _ in range(T + 1)]
        q, v = _watch(norms, 0, q, v)
        qs, vs, efforts, contacts = [q], [v], [], []
        steps = controls.unbind(-2)
        window = T if checkpoint_every is None or not torch.is_grad_enabled() else checkpoint_every
        leaves = self._recompute_leaves(q, v, steps[0]) if window < T else None
        slots = leaves
        for t0 in range(0, T, max(window, 1)):
            part = steps[t0 : t0 + window]
            try:
                if leaves is not None:
                    out = self._recomputed_window(q, v, part, t0, norms, truncate_every, leaves, slots, fields)
                    # The window's first state as stored: the window's own
                    # copy of its input; the parameters pass from window to
                    # window (see _RecomputedWindow).
                    qs[-1], vs[-1], slots = out[4], out[5], out[6]
                else:
                    out = self._checkpointed_window(q, v, part, t0, norms, truncate_every, window < T, fields)
            except torch.linalg.LinAlgError as exc:
                failed = getattr(exc, "_backdrive_failed_step", None)
                if failed is None:
                    raise
                self._report_failed_step(failed, qs + failed.qs, vs + failed.vs, controls)
            qs += out[0]
            vs += out[1]
            efforts += out[2]
            contacts += out[3]
            q, v = qs[-1], vs[-1]
        # One array at a time, each list emptied once stacked: the steps'
        # arrays are held nowhere else, so the stored outputs are held twice
        # only one array at a time (stacking all three before letting go of
        # the lists peaked at twice the trajectory, 0.2 kB per sample-step
        # more for the quadruped, as much as the backward pass's peak).
        q = v = out = None  # out: the last window's lists (the whole rollout's, unwindowed)
        Q = _stack_emptying(qs, -2)
        V = _stack_emptying(vs, -2)
        E = _stack_emptying(efforts, -2) if efforts else controls[..., :0, :]
        if check_finite:
            _check_trajectory(Q, V, controls, self.dt, self._diagnose)
        return Trajectory(
            q=Q, v=V, effort=E, controls=controls, dt=self.dt, _grad_norms=norms,
            contact=_stack_record(contacts, fields, Q.ndim - 2) if contacts else None,
        )

    def _contact_fields(self, record) -> tuple | None:
        """``rollout(contact_record=...)`` as the kept field names (``None``: all)."""
        if record is True:
            return None
        if record is False:
            return ()
        names = [f.name for f in dataclasses.fields(ContactResult) if not f.name.startswith("_")]
        if isinstance(record, str) or not all(isinstance(x, str) for x in _iter_or_none(record)):
            raise InputError(
                f"contact_record must be True, False or a sequence of ContactResult field names, got {record!r}"
            )
        bad = [x for x in record if x not in names]
        if bad:
            raise InputError(f"contact_record: unknown ContactResult fields {bad}; valid: {', '.join(names)}")
        return tuple(dict.fromkeys(record))

    def _recompute_leaves(self, q, v, u):
        """The tensors a checkpointed rollout differentiates besides the state
        and the controls, or ``None`` to checkpoint with
        :func:`torch.utils.checkpoint` instead.

        One step from ``(q, v, u)`` is recorded (its saved arrays dropped at
        once) and its graph walked back from the step's outputs, stopping at
        ``q``, ``v`` and ``u``, to every leaf tensor that requires grad: the
        model's parameters (masses, friction, gains, ...), however they were
        derived. ``None`` under ``torch.func`` transforms and forward-mode AD
        (which custom ``autograd.Function`` s do not take part in) and when
        the step fails (the checkpointed path reports that failure).
        """
        if transforms_active():
            return None
        try:
            with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(_drop_saved, _dropped):
                if self.contact is not None:
                    q1, v1, effort, res = self._advance_contact(q, v, u)
                    outs = [q1, v1, effort, *_result_tensors(res, None)]
                else:
                    outs = [*self._advance(q, v, u)]
        except Exception:  # noqa: BLE001 - the rollout itself reports it
            return None
        inputs = (q, v, u)
        stop = {id(x.grad_fn): x.grad_fn for x in inputs if x.grad_fn is not None}
        seen = dict(stop)
        todo = [o.grad_fn for o in outs if isinstance(o, torch.Tensor) and o.grad_fn is not None]
        leaves = {}
        while todo:
            node = todo.pop()
            if id(node) in seen:
                continue
            seen[id(node)] = node  # held, so that ids stay unique during the walk
            var = getattr(node, "variable", None)
            if isinstance(var, torch.Tensor):  # AccumulateGrad: a leaf
                if not any(var is x for x in inputs):
                    leaves.setdefault(id(var), var)
                continue
            todo.extend(n for n, _ in node.next_functions if n is not None)
        return tuple(leaves.values())

    def _recomputed_window(self, q, v, part, t0, norms, truncate_every, leaves, slots, fields):
        """A checkpointed window as one autograd node (:class:`_RecomputedWindow`):
        the lists of :meth:`_window`, the window's first state and the
        parameters' passage to the next window."""
        n, m = len(part), len(leaves)
        spec = _WindowSpec(self, t0, n, norms, truncate_every, leaves, fields)
        outs = _RecomputedWindow.apply(spec, q, v, *part, *slots)
        q_in, v_in, passed = outs[0], outs[1], outs[2 : 2 + m]
        outs = outs[2 + m :]
        qs, vs, efforts = list(outs[:n]), list(outs[n : 2 * n]), list(outs[2 * n : 3 * n])
        contacts = []
        if spec.template is not None:
            flat = outs[3 * n :]
            r = len(flat) // n
            contacts = [_result_from_tensors(spec.template, fields, flat[i * r : (i + 1) * r]) for i in range(n)]
        return qs, vs, efforts, contacts, q_in, v_in, passed

    def _checkpointed_window(self, q, v, part, t0, norms, truncate_every, checkpointed: bool, fields=None):
        if checkpointed:
            # The fallback of _recompute_leaves (torch.func transforms,
            # forward-mode AD): non-reentrant checkpointing keeps the plain
            # graph with its saved arrays dropped, and recomputes them by
            # re-running this window from (q, v). It keeps every node of the
            # graph (about 1 MB per contact step, whatever the batch).
            return torch.utils.checkpoint.checkpoint(
                self._window, q, v, part, t0, norms, truncate_every, fields,
                use_reentrant=False, determinism_check="none",
            )
        return self._window(q, v, part, t0, norms, truncate_every, fields)

    def _report_failed_step(self, failed, qs, vs, controls):
        """Raise :class:`NonFiniteError` for a step whose solve failed (a Cholesky
        factorisation of a matrix that is no longer positive definite): the one
        report of a failed solve, for :meth:`step` and :meth:`rollout`.

        ``qs``, ``vs``: the states up to the failed step's start; ``controls``
        ``(..., T, nu)``, the failed step's control included.
        """
        Q = torch.stack([x.detach() for x in qs], dim=-2)
        V = torch.stack([x.detach() for x in vs], dim=-2)
        # A non-finite state that reached the solve: report where it began.
        _check_trajectory(Q, V, controls, self.dt, self._diagnose)
        t = failed.step
        nq, nv, nu = self.nq, self.nv, self.nu
        q = failed.q.detach().reshape(-1, nq)
        v = failed.v.detach().reshape(-1, nv)
        u = failed.u.detach().reshape(-1, nu)
        reason = str(failed.error).strip().splitlines()[0] if str(failed.error).strip() else type(failed.error).__name__
        cause = _culprits(q, v, u)
        if cause.endswith("diverged)"):
            cause = ": the state and controls were finite, so the dynamics diverged." + self._diagnose(
                q, v, u, t, Q[..., 0, :].reshape(-1, nq)
            )
        raise NonFiniteError(
            f"the simulation step from state {t} (t = {t * self.dt:.6g} s) to step {t + 1} could not be solved "
            f"({reason}){cause}",
            step=t + 1,
            what="v",
        ) from failed.error

    def _window(self, q, v, controls, t0: int, norms, truncate_every, fields=None):
        """Steps ``t0, t0 + 1, ...`` of a rollout under ``controls`` (a sequence
        of ``(..., nu)``): lists of the new states, efforts and contact results
        (with only the ``fields`` of :meth:`_contact_fields`)."""
        qs, vs, efforts, contacts = [], [], [], []
        for t, u in enumerate(controls, start=t0):
            if truncate_every is not None and t > 0 and t % truncate_every == 0:
                q, v = q.detach(), v.detach()
            try:
                if self.contact is not None:
                    q1, v1, effort, res = self._advance_contact(q, v, u)
                    # The body poses only serve the step's own force report:
                    # not kept for the whole rollout.
                    if fields is not None:
                        res = dataclasses.replace(res, **{f: None for f in _all_fields(res) if f not in fields})
                    if getattr(res, "_bodies", ()):
                        res = dataclasses.replace(res, _bodies=())
                    if fields != ():
                        contacts.append(res)
                else:
                    q1, v1, effort = self._advance(q, v, u)
            except torch.linalg.LinAlgError as exc:
                # A state grown beyond what the step can integrate makes its
                # matrix indefinite before it makes the state non-finite.
                exc._backdrive_failed_step = _FailedStep(t, q, v, u, qs, vs, exc)
                raise
            q, v = _watch(norms, t + 1, q1, v1)
            qs.append(q)
            vs.append(v)
            efforts.append(effort)
        return qs, vs, efforts, contacts

    def _diagnose(
        self, q: torch.Tensor, v: torch.Tensor, u: torch.Tensor, step: int | None = None, q_start=None
    ) -> str:
        """Name the force term that drove a divergence.

        Evaluates each term of the step at ``(q, v, u)`` (``(N, .)``, the last
        finite state of the samples that went bad): actuator effort, joint-limit
        force, joint damping, joint friction and the Coriolis/gravity forces,
        per joint; reports the non-finite or largest one, and every explicit
        stiffness that exceeds the stability bound of an Euler step against the
        joint's inertia ``m_j = 1 / (M^-1)_jj`` (``dt c / m > 2`` for a damping
        ``c``, ``dt^2 k / m > 4`` for a stiffness ``k``), and coordinates
        without inertia. ``q_start`` (same samples, the rollout's first
        configuration) stands in for ``q`` where ``M(q)`` is no longer finite.
        """
        try:
            with torch.no_grad():
                text = self._diagnosis(q, v, u, step, q_start)
        except Exception as exc:  # a diagnosis must never hide the real error
            text = f" (the force terms could not be evaluated: {type(exc).__name__}: {exc})"
        if self.contact is not None and q.shape[0]:
            try:
                with torch.no_grad():
                    text += " " + self.contact.describe_largest(self.contact.forces(self.robot, q, v))
            except Exception as exc:  # noqa: BLE001 - same rule as above
                text += f" (the contact forces could not be evaluated: {type(exc).__name__}: {exc})"
        return text

    def _diagnosis(self, q, v, u, step, q_start) -> str:
        sysm, robot, dt = self.system, self.robot, self.dt
        names = sysm.joint_names
        if q.shape[0] == 0:
            return ""
        qj, vj = sysm.joint_positions(q), sysm.joint_velocities(v)
        qa, va = (qj, vj) if self._all_joints else (qj[..., self._idx], vj[..., self._idx])
        effort = self.actuator.effort(qa, va, u)
        if self._saturate:
            effort = smooth_saturation(effort, self.effort_limit)
        terms = {"actuator effort": effort if self._all_joints else effort @ self._select}
        if self._has_limits:
            terms["joint limits"] = self.limits.effort(qj, vj, sysm.lower, sysm.upper)
        m_j = None
        if robot is not None:
            terms["joint damping"] = -robot.damping * vj
            terms["joint friction"] = -robot.friction * torch.tanh(vj / self.friction_width)
            off = robot.nv - robot.num_joints
            terms["Coriolis/gravity"] = -bias_forces(robot, q, v)[..., off:]
            # The joints' inertia at the last finite state, or, where that
            # state has grown too large for finite kinematics, at the start.
            M = mass_matrix(robot, q)
            if not bool(torch.isfinite(M).all()) and q_start is not None:
                M = mass_matrix(robot, q_start)
            L, info = torch.linalg.cholesky_ex(M)
            if not bool(torch.isfinite(M).all()):
                L = None
            elif bool((info != 0).any()) or not bool(torch.isfinite(L).all()):
                d = M.diagonal(dim1=-2, dim2=-1)[..., off:]
                empty = sorted({names[j] for j in torch.nonzero(d.abs().amax(0) <= 1e-12).flatten().tolist()})
                return (
                    f" The mass matrix is not positive definite at step {step}"
                    + (f": joints {empty} have no inertia; give them armature with robot.replace(armature=...)"
                       if empty else "")
                    + "."
                )
            if L is not None:
                m_j = 1.0 / torch.cholesky_inverse(L).diagonal(dim1=-2, dim2=-1)[..., off:]  # (N, nj)
        at = f"At step {step}" if step is not None else "At the step's start"
        worst = None
        for label, x in terms.items():
            x = x.expand(q.shape[0], len(names))
            bad = ~torch.isfinite(x)
            if bool(bad.any()):
                j = int(torch.nonzero(bad.any(0))[0, 0])
                worst = (label, math.inf, j)
                break
            mag = x.abs().amax(0)
            j = int(mag.argmax())
            if worst is None or float(mag[j]) > worst[1]:
                worst = (label, float(mag[j]), j)
        label, mag, j = worst
        largest = (
            f" {at} the largest force term is the {label} ({'non-finite' if math.isinf(mag) else f'{mag:.3g}'}"
            f" on joint {names[j]!r})"
        )
        # Unstable explicit terms first: once a divergence has grown, the
        # quadratic Coriolis forces dominate whatever started it.
        parts = []
        if m_j is not None:
            stiff = self._explicit_stiffness()
            for what, kind, coeff in stiff:
                ratio = (dt * coeff if kind == "damping" else dt * dt * coeff) / m_j
                bound = 2.0 if kind == "damping" else 4.0
                ratio = torch.where(torch.isfinite(ratio), ratio, torch.zeros_like(ratio)).amax(0)
                if bool((ratio > bound).any()):
                    jj = int(ratio.argmax())
                    parts.append(
                        f"the explicit {what} is unstable at dt = {dt:g} s on joint {names[jj]!r} "
                        f"({'dt c / m' if kind == 'damping' else 'dt^2 k / m'} = {float(ratio[jj]):.3g} > {bound:g})"
                        + _REMEDY[what]
                    )
        if not parts:
            light = ""
            if m_j is not None:
                m_min = m_j.amin(0)
                jl = int(m_min.argmin())
                light = (
                    f"; the lightest joint is {names[jl]!r} (inertia 1 / (M^-1)_jj = {float(m_min[jl]):.3g}; "
                    "armature, robot.replace(armature=...), makes light joints easier to integrate)"
                )
            return largest + light + "; a smaller dt, softer limits or smaller gains may help."
        first = "; ".join(parts)
        return " Cause: " + first + "." + largest + "."

    def _explicit_stiffness(self):
        """``(what, kind, (nj,) coefficient)`` of every term the step treats explicitly."""
        sysm, robot = self.system, self.robot
        nj = sysm.num_joints
        out = []

        def joints(x):
            x = torch.as_tensor(x, dtype=sysm.dtype, device=sysm.device).expand(self.nu)
            return x if self._all_joints else x @ self._select

        if robot is not None and self._implicit is None:
            out.append(("joint damping", "damping", robot.damping))
            out.append(("joint friction", "damping", robot.friction / self.friction_width))
        if isinstance(self.actuator, PDActuator):
            out.append(("PD gain kd", "damping", joints(self.actuator.kd)))
            out.append(("PD gain kp", "stiffness", joints(self.actuator.kp)))
        if self._has_limits:
            k = torch.as_tensor(self.limits.stiffness, dtype=sysm.dtype, device=sysm.device).expand(nj)
            c = torch.as_tensor(self.limits.damping, dtype=sysm.dtype, device=sysm.device).expand(nj)
            out.append(("joint-limit stiffness", "stiffness", k))
            out.append(("joint-limit damping", "damping", c))
        return out

    def __repr__(self) -> str:
        return (
            f"Simulator({self.system!r}, dt={self.dt:g}, integrator={self.integrator!r}, "
            f"actuator={type(self.actuator).__name__}, nu={self.nu}, "
            f"limits={'on' if self.limits is not None else 'off'}, joint_forces={self.joint_forces!r}"
            + (f", contact={self.contact!r})" if self.contact is not None else ")")
        )


_REMEDY = {
    "joint damping": ": use joint_forces='implicit' with an Euler integrator, or a smaller dt",
    "joint friction": ": use joint_forces='implicit' with an Euler integrator, a wider friction_width or a smaller dt",
    "PD gain kd": ": use a smaller kd or dt",
    "PD gain kp": ": use a smaller kp or dt",
    "joint-limit stiffness": ": use softer SoftJointLimits or a smaller dt",
    "joint-limit damping": ": use a smaller SoftJointLimits damping or a smaller dt",
}


class _FailedStep:
    """Internal: what the report of a step whose solve failed needs. It rides on
    the solver's ``LinAlgError`` (every exception class of backdrive lives in
    ``backdrive._errors``; this is a record, not another exception)."""

    def __init__(self, step, q, v, u, qs, vs, error):
        self.step, self.q, self.v, self.u, self.qs, self.vs, self.error = step, q, v, u, qs, vs, error


def _joint_force_mode(mode, integrator: str, is_robot: bool) -> str:
    """Resolve ``Simulator(joint_forces=...)`` to ``"implicit"`` or ``"explicit"``."""
    if mode not in JOINT_FORCE_MODES:
        raise InputError(f"unknown joint_forces {mode!r}; choose one of {', '.join(JOINT_FORCE_MODES)}")
    if mode == "auto":
        return "implicit" if is_robot and integrator != "rk4" else "explicit"
    if mode == "implicit" and integrator == "rk4":
        raise InputError(
            "joint_forces='implicit' is for the Euler integrators ('semi_implicit', 'euler'); "
            "rk4's stages are explicit: use joint_forces='explicit' (or 'auto') with rk4"
        )
    if mode == "implicit" and not is_robot:
        raise InputError("joint_forces='implicit' needs a RobotModel (joint damping and friction come from it)")
    return mode


def _check_contact(contact, system, integrator: str):
    """``Simulator(contact=...)``: a ContactModel of the simulated robot, with semi-implicit Euler."""
    if contact is None:
        return None
    if not isinstance(contact, ContactModel):
        raise InputError(f"contact must be a backdrive.contact.ContactModel or None, got {type(contact).__name__}")
    if not isinstance(system, RobotSystem):
        raise InputError("contact needs a RobotModel to simulate, not a built-in system")
    if integrator != "semi_implicit":
        raise InputError(
            f"contact works with the 'semi_implicit' integrator (its implicit contact step), not {integrator!r}"
        )
    contact._check(system.robot)
    return contact


def _watch(norms, t: int, q: torch.Tensor, v: torch.Tensor):
    """Hook the state ``(q_t, v_t)`` to record the norm of its gradient.

    The hooks sit on fresh aliases of ``q`` and ``v``: within a step ``q_t``
    may be computed from ``v_t`` (semi-implicit Euler), and a hook on ``v_t``
    itself would add that path to the state's gradient.
    """
    if norms is None:
        return q, v
    slot = norms[t]
    out = []
    for i, x in enumerate((q, v)):
        if x.requires_grad:
            x = x.view_as(x)

            def hook(g, i=i):
                slot[i] = g.detach().norm()

            x.register_hook(hook)
        out.append(x)
    return out[0], out[1]


def _first_bad(x: torch.Tensor) -> torch.Tensor:
    """``(T + 1,)`` bool: whether any batch element is non-finite at each step."""
    bad = ~torch.isfinite(x).all(dim=-1)
    return bad.reshape(-1, bad.shape[-1]).any(dim=0)


def _check_trajectory(Q, V, controls, dt, diagnose) -> None:
    ok = torch.isfinite(Q).all() & torch.isfinite(V).all()
    if bool(ok):
        return
    bad_q, bad_v = _first_bad(Q), _first_bad(V)
    bad = bad_q | bad_v
    step = int(torch.nonzero(bad)[0, 0])
    what = "q" if bool(bad_q[step]) else "v"
    prev_u = controls[..., step - 1, :] if step > 0 else None
    if step == 0:
        cause = "; the initial state is not finite"
    elif prev_u is not None and not bool(torch.isfinite(prev_u).all()):
        cause = f"; the control of step {step - 1} is not finite"
    else:
        # Evaluate the force terms at the last finite state of the samples
        # that went bad, to name the one that drove the divergence.
        bad_now = ~(torch.isfinite(Q[..., step, :]).all(-1) & torch.isfinite(V[..., step, :]).all(-1))
        cause = "; the controls were finite, so the dynamics diverged." + diagnose(
            Q[..., step - 1, :][bad_now], V[..., step - 1, :][bad_now], controls[..., step - 1, :][bad_now],
            step - 1, Q[..., 0, :][bad_now],
        )
    raise NonFiniteError(
        f"the simulation produced a non-finite {what} at step {step} (t = {step * dt:.6g} s){cause}",
        step=step,
        what=what,
    )


def _culprits(q, v, u) -> str:
    parts = [n for n, x in (("q", q), ("v", v), ("control", u)) if not bool(torch.isfinite(x).all())]
    return f" (non-finite input: {', '.join(parts)})" if parts else " (the inputs were finite: the dynamics diverged)"


def _drop_saved(t):
    """Saved-tensor pack hook of a recording that is never differentiated."""
    return None


def _dropped(packed):
    raise RuntimeError("internal: a recording made to be discarded was differentiated")


def _iter_or_none(x):
    try:
        return list(x)
    except TypeError:
        return [None]


def _all_fields(res) -> list:
    """A contact result's tensor field names, in field order (``_bodies`` left out)."""
    return [f.name for f in dataclasses.fields(res) if f.name != "_bodies"]


def _result_tensors(res, fields) -> list:
    """The kept tensor fields of a contact result (``fields``; ``None``: all)."""
    return [getattr(res, f) for f in (_all_fields(res) if fields is None else fields)]


def _result_from_tensors(template, fields, tensors):
    names = _all_fields(template) if fields is None else fields
    return dataclasses.replace(template, **dict(zip(names, tensors)))


def _stack_emptying(xs: list, dim: int) -> torch.Tensor:
    """``torch.stack(xs, dim)``, emptying ``xs`` (so that its arrays can be freed)."""
    out = torch.stack(xs, dim=dim)
    xs.clear()
    return out


def _stack_record(contacts, fields, nbatch: int):
    """The trajectory's contact record: every step's result stacked after the
    ``nbatch`` batch axes (as :func:`~backdrive.contact.stack_results`), all
    fields or only the kept ``fields``, the others ``None``.

    Empties ``contacts`` and stacks one field at a time, dropping the steps'
    arrays of each field once stacked, so that the record is held twice only
    one field at a time (the steps' arrays are held nowhere else).
    """
    template = dataclasses.replace(contacts[0], _bodies=())
    names = _all_fields(template) if fields is None else fields
    columns = {f: [getattr(r, f) for r in contacts] for f in names}
    contacts.clear()
    kept = {}
    for f in names:
        kept[f] = torch.stack(columns.pop(f), dim=nbatch)
    return dataclasses.replace(template, **kept)


class _WindowSpec:
    """What a :class:`_RecomputedWindow` needs besides its tensor inputs."""

    def __init__(self, sim, t0, n, norms, truncate_every, leaves, fields):
        self.sim, self.t0, self.n, self.norms, self.truncate_every = sim, t0, n, norms, truncate_every
        self.fields = fields  # the contact-result fields kept (None: all)
        self.leaves = leaves  # the parameters the steps use (Simulator._recompute_leaves)
        self.template = None  # a contact result of the window (its non-tensor fields)


class _RecomputedWindow(torch.autograd.Function):
    """``n`` steps of a rollout as one autograd node that keeps nothing of the
    steps' internals: the forward pass runs them with their saved arrays
    dropped as they are made (so that every kernel choice is the one of a
    recorded step, and the values are the plain rollout's), and the backward
    pass re-runs them from the saved inputs and differentiates that.

    Inputs: ``(spec, q, v, u_0 .. u_{n-1}, *slots)``: a slot per parameter
    (``spec.leaves``), the parameter itself in the first window and the
    previous window's passage of it after. Outputs: a copy of ``(q, v)`` (the
    stored first state), the parameters' passage to the next window, the
    ``n`` new configurations, velocities and efforts, and, with contact,
    every step's contact-result tensors. The graph a rollout keeps is one
    node per window, instead of every operation of every step with a holder
    per saved array (:func:`torch.utils.checkpoint`: about 1 MB per contact
    step, whatever the batch).

    The gradients equal the plain rollout's bit for bit: back-propagation
    adds the contributions to each tensor in the order of the plain graph,
    where every window's nodes run after those of all later windows and the
    stacking's run first. So the re-run makes, after the steps, an alias of
    its first state (taking the loss's gradient of the stored copy) and of
    each parameter (taking the later windows' gradient, passed back through
    the passage): back-propagation starts with them, as the plain graph
    starts with the stacking and reaches a window after all later ones.
    """

    @staticmethod
    def forward(ctx, spec, q, v, *rest):
        n = spec.n
        us = rest[:n]
        with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(_drop_saved, _dropped):
            qs, vs, efforts, contacts = spec.sim._window(q, v, us, spec.t0, None, spec.truncate_every, spec.fields)
        flat = [*qs, *vs, *efforts]
        for res in contacts:
            flat += _result_tensors(res, spec.fields)
        if contacts:
            # Only its non-tensor fields: the node must not hold a step's arrays and graph.
            spec.template = dataclasses.replace(contacts[0], **{f: None for f in _all_fields(contacts[0])})
        # Outputs are new tensors: none may share memory with an input or
        # another output (e.g. an effort that is the control itself); the
        # parameters' passage shares theirs (never written).
        taken = {x.untyped_storage().data_ptr() for x in (q, v, *rest) if x.numel()}
        outs = [q.detach().clone(), v.detach().clone(), *(p.detach() for p in rest[n:])]
        for x in flat:
            x = x.detach()
            if x._is_view() or (x.numel() and x.untyped_storage().data_ptr() in taken):
                x = x.clone()
            if x.numel():
                taken.add(x.untyped_storage().data_ptr())
            outs.append(x)
        ctx.spec = spec
        ctx.save_for_backward(q, v, *us)
        ctx.set_materialize_grads(False)
        return tuple(outs)

    @staticmethod
    def backward(ctx, *grads):
        spec = ctx.spec
        n, leaves = spec.n, spec.leaves
        m = len(leaves)
        state = ctx.saved_tensors
        create = torch.is_grad_enabled()  # backward(create_graph=True)
        if not create:
            state = tuple(x.detach().requires_grad_(x.requires_grad) for x in state)
        q, v, us = state[0], state[1], state[2:]
        with torch.enable_grad():
            qs, vs, efforts, contacts = spec.sim._window(
                q, v, us, spec.t0, spec.norms, spec.truncate_every, spec.fields
            )
            # Made last, so back-propagation runs them first (see above).
            first = [x.view_as(x) if x.requires_grad else x for x in (q, v, *leaves)]
        flat = [*first, *qs, *vs, *efforts]
        for res in contacts:
            flat += _result_tensors(res, spec.fields)
        pairs = [(o, g) for o, g in zip(flat, grads) if g is not None and o.requires_grad]
        inputs = [*state, *leaves]
        wanted = [i for i, x in enumerate(inputs) if x.requires_grad and ctx.needs_input_grad[1 + i]]
        out = [None] * len(inputs)
        if pairs and wanted:
            got = torch.autograd.grad(
                [o for o, _ in pairs], [inputs[i] for i in wanted], [g for _, g in pairs],
                allow_unused=True, retain_graph=True, create_graph=create,
            )
            for i, g in zip(wanted, got):
                out[i] = g
        return (None, *out)
