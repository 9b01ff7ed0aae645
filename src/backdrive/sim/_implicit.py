"""The velocity update of the Euler integrators with joint damping and friction implicit.

URDF joint damping ``D`` and Coulomb friction ``F`` are stiff at the step
sizes people use: a 0.2 N m friction smoothed over 0.01 rad/s acts like a
20 N m s/rad damper near rest, and on a joint of 5e-3 kg m^2 an explicit step
of 2 ms multiplies the velocity by ``1 - dt D / m = -7`` every step. This
module solves the step's velocity update instead of extrapolating it:

1. Damping implicitly, as MuJoCo's Euler integrator does:
   ``(M + dt D) (v_free - v) / dt = tau - b(q, v) - D v``.
2. Friction as a bounded force that acts with the damping in one backward-Euler
   step: per frictional joint ``f_j = -F_j clamp(v1_j / w, -1, 1)``, the
   saturated-linear regularisation of Coulomb friction (slope ``F / w`` near
   rest, the same as ``F tanh(v / w)`` there; width ``w`` set by
   ``Simulator(friction_width=...)``), evaluated at the *new* velocity
   ``v1 = v_free + dt M'^-1 f``. While no joint saturates this is a linear
   solve; saturated joints are found by a primal-dual active-set iteration
   (four passes; converged to 1e-9 in random states of go1 and talos where
   about half the joints stick). A joint at rest under a load below its
   friction stays at
   rest up to a creep of ``w load / F``.

Every operation is plain autograd (Cholesky, LU solves, ``clamp``, ``where``),
so gradients are those of the scheme exactly (piecewise: at the stick/slip
boundary the derivative jumps).

Contact (``J^T f`` and an implicit ``J^T K J``) enters through
:meth:`ImplicitJointForces.velocity`'s ``extra_force`` and ``extra_implicit``.
"""

from __future__ import annotations

import torch

from ..dynamics import bias_forces, forward_dynamics, mass_matrix
from ..model import RobotModel

__all__ = ["ImplicitJointForces", "FRICTION_PASSES"]

#: Active-set passes of the friction solve after the first, unclamped one.
FRICTION_PASSES = 4


class ImplicitJointForces:
    """Implicit-damping, bounded-friction velocity update for one robot and ``dt``.

    Decides once, from the model, which of three paths a step takes:

    * no damping, no friction: ``forward_dynamics`` as it is (the old step);
    * damping, no friction: ``forward_dynamics`` of the model with ``dt D``
      added to the armature (``M + dt D`` is exactly that model's mass matrix,
      and its own damping supplies ``- D v``), which keeps the fast large-batch
      kernels of :mod:`backdrive.dynamics`;
    * friction (or an ``extra_implicit`` term): the mass matrix, the bias
      forces and a Cholesky factor of ``M + dt D`` built here, with the
      friction solve on top.

    Args:
        robot: the model; its ``damping``, ``friction`` and ``armature``
            ``(nj,)`` may require grad.
        dt: step, s.
        friction_width: ``w > 0``, rad/s (m/s for prismatic joints).
    """

    def __init__(self, robot: RobotModel, dt: float, friction_width: float):
        self.robot = robot
        self.dt = float(dt)
        self.width = float(friction_width)
        nj, nv = robot.num_joints, robot.nv
        self.offset = nv - nj  # 6 for a floating base: damping and friction act on joints only
        damping, friction = robot.damping, robot.friction
        self.has_damping = damping.requires_grad or bool((damping != 0).any())
        # The frictional joints: a static index set, so the step has no
        # data-dependent shapes. A friction that requires grad keeps every
        # joint (a zero entry then contributes a zero force and its gradient).
        if friction.requires_grad:
            fj = list(range(nj))
        else:
            fj = torch.nonzero(friction > 0).flatten().tolist()
        self.friction_joints = tuple(fj)
        self.has_friction = bool(fj)
        dev = robot.device
        self._fj = torch.tensor(fj, dtype=torch.long, device=dev)
        self._fv = self._fj + self.offset  # generalised-velocity indices
        nf = len(fj)
        cols = torch.zeros(nv, nf, dtype=robot.dtype, device=dev)
        if nf:
            cols[self._fv, torch.arange(nf, device=dev)] = 1.0
        self._cols = cols  # (nv, nf) unit generalised forces on the frictional joints
        self._eye_f = torch.eye(nf, dtype=robot.dtype, device=dev)
        self._damped = None
        if self.has_damping and not (damping.requires_grad or robot.armature.requires_grad):
            self._damped = self._damped_model()

    def _damped_model(self) -> RobotModel:
        """The model whose mass matrix is ``M + dt D`` (armature plus ``dt D``)."""
        r = self.robot
        return r.replace(armature=r.armature + self.dt * r.damping)

    def _padded(self, x: torch.Tensor) -> torch.Tensor:
        """``(nj,)`` joint values -> ``(nv,)`` with zeros on a floating base."""
        return x if self.offset == 0 else torch.cat([x.new_zeros(self.offset), x])

    def velocity(
        self,
        q: torch.Tensor,
        v: torch.Tensor,
        tau: torch.Tensor,
        *,
        extra_force: torch.Tensor | None = None,
        extra_implicit: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The step's new velocity ``v1 (..., nv)``.

        Solves ``(M + dt D + dt K) (v1 - v) / dt = tau + extra_force - b(q, v)
        - D v + f_friction(v1)`` with ``|f_friction| <= F`` per joint.

        Args:
            q: ``(..., nq)``; v: ``(..., nv)``.
            tau: ``(..., nv)`` applied generalised force (actuators, limits).
            extra_force: optional ``(..., nv)`` generalised force added to
                ``tau`` (e.g. contact ``J^T f``, evaluated at ``(q, v)``).
            extra_implicit: optional ``(..., nv, nv)`` symmetric positive
                semi-definite damping ``K`` (N m s/rad) treated implicitly,
                like ``D`` (e.g. contact ``J^T K_d J``); the explicit force
                ``- K v`` must be part of ``extra_force``.
        """
        dt = self.dt
        robot = self.robot
        if extra_force is not None:
            tau = tau + extra_force
        if not self.has_friction and extra_implicit is None:
            if not self.has_damping:
                a = forward_dynamics(robot, q, v, tau)
            else:
                model = self._damped if self._damped is not None else self._damped_model()
                a = forward_dynamics(model, q, v, tau)
            return torch.add(v, a, alpha=dt)

        return self.solve(mass_matrix(robot, q), bias_forces(robot, q, v), v, tau, extra_implicit)

    def solve(self, M: torch.Tensor, h: torch.Tensor, v: torch.Tensor, tau: torch.Tensor,
              extra_implicit: torch.Tensor | None = None) -> torch.Tensor:
        """:meth:`velocity`'s solve from the mass matrix ``M (..., nv, nv)`` and
        the bias forces ``h (..., nv)`` at ``(q, v)`` (``tau`` with the extra
        force in it): for a caller that solves several steps at one state
        (the simulator's unilateral contact passes)."""
        dt = self.dt
        robot = self.robot
        rhs = tau - h
        Mi = M
        if self.has_damping:
            d = self._padded(robot.damping)
            rhs = rhs - d * v
            Mi = Mi + torch.diag_embed(dt * d)
        if extra_implicit is not None:
            Mi = Mi + dt * extra_implicit
        # cholesky_ex: no error check, so no host synchronisation; a matrix
        # that is not positive definite gives NaN, which the rollout reports.
        L, _ = torch.linalg.cholesky_ex(Mi)
        if not self.has_friction:
            return v + dt * torch.cholesky_solve(rhs[..., None], L)[..., 0]
        return self._friction_velocity(L, rhs, v, robot.friction[self._fj])

    def _friction_velocity(self, L: torch.Tensor, rhs: torch.Tensor, v: torch.Tensor, F: torch.Tensor) -> torch.Tensor:
        """``v1`` of the step whose matrix has the Cholesky factor ``L``
        ``(..., nv, nv)`` and whose right-hand side (friction left out) is
        ``rhs (..., nv)``, with the friction levels ``F (nf,)`` of the
        frictional joints."""
        dt = self.dt
        # One solve for the free acceleration and the response to a unit force
        # on each frictional joint: W = Mi^-1 E, (..., nv, nf).
        batch = torch.broadcast_shapes(L.shape[:-2], rhs.shape[:-1])
        nv, nf = self._cols.shape
        if L.shape[:-2] != batch:
            L = L.expand(*batch, nv, nv)
        B = torch.cat([rhs.expand(*batch, nv)[..., None], self._cols.expand(*batch, nv, nf)], dim=-1)
        X = torch.cholesky_solve(B, L)
        v_free = v + dt * X[..., 0]
        W = X[..., 1:]
        A = W[..., self._fv, :]  # (..., nf, nf) the joints' inverse inertia (Delassus) block
        g = self._friction_ratio(A, v_free[..., self._fv], F)
        return v_free + dt * (W @ (F * g)[..., None])[..., 0]

    def contact_acceleration(self, contact, bare: RobotModel, q, v, tau, extra_damping, F):
        """The step with contact and this friction, plain autograd: ``a (...,
        nv)`` and the applied :class:`~backdrive.contact.ContactResult`.

        ``bare``: the robot without damping and friction (the damping is in
        ``tau``, as ``-D v``, and in ``extra_damping``); ``F (nf,)`` the
        frictional joints' levels. Solves ``(M + dt diag(extra_damping) + dt
        J^T (C + dt K) J) a = tau - b + J^T (...) + E f`` with the friction
        ``f`` of :meth:`_friction_ratio`: the step of
        :meth:`velocity` with ``extra_force`` and ``extra_implicit`` the
        contact's terms, one mass matrix fewer (the contact's is reused).
        The small-batch path of the simulator, and the double backward of
        the fast one (``contact/_fast.py``, :class:`JointFriction`).
        """
        from ..contact._model import unilateral_step

        dt = self.dt
        terms = contact.implicit_terms(bare, q, v, dt)
        base = tau - bias_forces(bare, q, v)

        def solve(t):
            A = torch.add(t._M, t.matrix, alpha=dt)
            if extra_damping is not None:
                A = A + torch.diag_embed(dt * extra_damping)
            L, _ = torch.linalg.cholesky_ex(A)
            return (self._friction_velocity(L, base + t.force, v, F) - v) / dt

        # Without adhesion (contact.unilateral): points whose applied normal
        # force comes out negative leave the step, which is solved again.
        return unilateral_step(contact, bare, terms, solve, dt)

    def fast_friction(self, contact, bare: RobotModel):
        """The :class:`~backdrive.contact._fast.JointFriction` of the fast
        contact step: this friction's joints, width, active-set iteration and
        reference."""
        from ..contact._fast import JointFriction

        def reference(q, v, tau, extra_damping, F):
            return self.contact_acceleration(contact, bare, q, v, tau, extra_damping, F)

        def ratio(A, v_free, F):
            with torch.no_grad():
                return self._friction_ratio(A, v_free, F, with_set=True)

        return JointFriction(self._fv, self.width, ratio, reference)

    def _friction_ratio(self, A: torch.Tensor, v_free: torch.Tensor, F: torch.Tensor, with_set: bool = False):
        """``g = f / F`` in ``[-1, 1]`` per frictional joint, ``(..., nf)``.

        The law ``g = clamp(-v1 / w, -1, 1)`` at ``v1 = v_free + dt A F g``:
        while no joint saturates it reads ``(dt A diag(F) + w I) g = -v_free``
        (no division by ``F``, so a zero friction is harmless). Saturated
        joints are found by a primal-dual active-set iteration (the standard
        one for box-constrained quadratic programs; this is the dual of the
        step's convex minimisation): a sticking joint whose ``|g|`` exceeds 1
        starts sliding with ``g = sign(g)``; a sliding joint is released when
        its velocity ``v1`` no longer opposes its force by at least ``w``. Each
        pass solves the sticking joints with the sliding ones' forces known;
        after :data:`FRICTION_PASSES` passes ``g`` is clamped to ``[-1, 1]``.

        With ``with_set``: ``(g, stick)``, ``stick (..., nf)`` the joints
        whose force is the unsaturated ``-F v1 / w`` (the last pass's
        sticking joints that the clamp left alone); the others' ``g`` is
        ``+-1``. The sliding joints' ``g`` is ``+-1`` up to the rounding of
        the last solve (so it cannot tell them apart).
        """
        w = self.width
        K = self.dt * A * F  # (..., nf, nf): response of v1 to g
        Bm = K + w * self._eye_f
        # solve_ex: linalg.solve's error check synchronises a CUDA device with
        # the host (every substep); Bm = dt A F + w I is positive definite.
        g = torch.linalg.solve_ex(Bm, -v_free)[0]
        slide = torch.zeros_like(g, dtype=torch.bool)
        sign = torch.zeros_like(g)
        for _ in range(FRICTION_PASSES):
            with torch.no_grad():  # the active set: a discrete choice
                r = -(v_free + (K @ g[..., None])[..., 0]) / w  # the unsaturated ratio each joint asks for
                keep = slide & (sign * r > 1)
                start = ~slide & (g.abs() > 1)
                sign = torch.where(start, torch.sign(g), sign)
                slide = keep | start
            stick = ~slide
            both = stick[..., :, None] & stick[..., None, :]
            # Sliding rows and columns become identity; their known forces
            # move to the right-hand side of the sticking rows.
            Bs = torch.where(both, Bm, self._eye_f)
            held = torch.where(slide, sign, torch.zeros_like(sign))  # the sliding joints' known g
            known = (Bm @ held[..., None])[..., 0]
            rhs = torch.where(stick, -v_free - known, held)
            g = torch.linalg.solve_ex(Bs, rhs)[0]
        if with_set:
            return g.clamp(-1.0, 1.0), stick & (g.abs() <= 1.0)
        return g.clamp(-1.0, 1.0)
