"""The simulation step fused by ``torch.compile`` (opt in), with an eager fallback."""

from __future__ import annotations

import warnings
from typing import Callable

import torch

from .._errors import CompilerUnavailableError, InputError, NonFiniteError
from ..dynamics._compiled import _check_compiler
from ._simulator import Simulator
from ._state import State

__all__ = ["CompiledStep", "compile_step"]


class CompiledStep:
    """``Simulator.step`` as one ``torch.compile`` graph; built by :func:`compile_step`.

    Call it as ``step(state, control)``: the same arguments and result as
    ``sim.step(state, control)``; :meth:`advance` also gives the effort and
    contact fields, without checks (for an env's hot loop). Attributes:
    ``simulator``, ``backend``, ``mode``, ``fallback``, ``contact_record``;
    :attr:`eager_reason` says why calls run eagerly (``None`` while they run
    compiled).
    """

    def __init__(self, sim: Simulator, backend, mode: str | None, fallback: bool, contact_record=()) -> None:
        self.simulator = sim
        self.backend = backend
        self.mode = mode
        self.fallback = fallback
        #: The contact-result fields :meth:`advance` returns besides the state and effort.
        self.contact_record: tuple[str, ...] = tuple(contact_record)
        #: Why this step runs eagerly (``None``: compiled). Set by the first failure.
        self.eager_reason: str | None = None
        try:
            if isinstance(backend, str):
                _check_compiler(sim.device, backend)
        except CompilerUnavailableError as exc:
            if not fallback:
                raise
            self._give_up(str(exc))

        record = self.contact_record

        def traced(q, v, u):
            if sim.contact is not None:
                q1, v1, effort, res = sim._advance_contact(q, v, u)
                return (q1, v1, effort, *(getattr(res, f) for f in record))
            q1, v1, effort = sim._advance(q, v, u)
            return q1, v1, effort

        self._eager = traced
        # A copy of the code object per compiled step: torch.compile keeps
        # its cache of graphs (and the recompile limit) per code object, so
        # steps of different simulators do not share one limit.
        traced_copy = _copy_function(traced)
        self._compiled = (
            None
            if self.eager_reason is not None
            else torch.compile(traced_copy, fullgraph=True, dynamic=False, backend=backend, mode=mode)
        )
        self._ready: set = set()

    @property
    def compiled(self) -> bool:
        """Whether calls run the compiled graph (``False`` after a fallback)."""
        return self.eager_reason is None

    def _give_up(self, reason: str) -> None:
        self.eager_reason = reason
        warnings.warn(
            f"compile_step: torch.compile cannot build this simulation step ({reason}); "
            "it runs eagerly (Simulator.step's code, the same results)",
            RuntimeWarning,
            stacklevel=3,
        )

    def __call__(self, state: State, control: torch.Tensor, *, check_finite: bool = True) -> State:
        """Advance one step: as :meth:`Simulator.step` (same arguments, same ``State``).

        Raises:
            InputError: as :meth:`Simulator.step`.
            NonFiniteError: ``check_finite`` and the new state is not finite
                (call :meth:`Simulator.step` on the same state for its
                diagnosis), or the step's solve failed.
        """
        sim = self.simulator
        q, v, u = sim._prepare(state.q, state.v, control, time_axis=False)
        try:
            q1, v1 = self._run(q, v, u)
        except torch.linalg.LinAlgError as exc:
            raise NonFiniteError(
                f"the simulation step could not be solved ({str(exc).strip().splitlines()[0]}); "
                "Simulator.step on the same state names the cause",
                step=1,
                what="v",
            ) from exc
        if check_finite and not bool(torch.isfinite(q1).all() & torch.isfinite(v1).all()):
            raise NonFiniteError(
                "the compiled simulation step produced a non-finite state; Simulator.step on the same state "
                "names the cause",
                step=1,
                what="q" if not bool(torch.isfinite(q1).all()) else "v",
            )
        return State(q1, v1)

    def advance(self, q: torch.Tensor, v: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """One step of batched arrays without checks: ``(q1, v1, effort, *record)``.

        ``q (..., nq)``, ``v (..., nv)``, ``u (..., nu)`` of one batch shape;
        ``record`` the contact-result fields named by ``contact_record`` (with
        contact), as :meth:`Simulator.rollout` would store them for this step.
        No finiteness check and no host synchronisation: what an env's hot
        loop calls (``QuadrupedWalk(compile=True)``).
        """
        q, v, u = self.simulator._prepare(q, v, u, time_axis=False)
        return self._run(q, v, u, full=True)

    def _run(self, q: torch.Tensor, v: torch.Tensor, u: torch.Tensor, full: bool = False):
        n = None if full else 2
        if self._compiled is None:
            return tuple(self._eager(q, v, u)[:n])
        if torch.is_grad_enabled() and any(x.requires_grad for x in (q, v, u)):
            # One graph for every grad pattern of the state: an input that
            # needs no gradient enters as a new leaf that asks for one (the
            # same values; its gradient, computed by the backward graph, is
            # dropped). Otherwise the first step of every window (a detached
            # state, controls with a graph) would compile a graph of its own.
            q, v, u = (x if x.requires_grad else x.detach().requires_grad_() for x in (q, v, u))
        params = _parameters(self.simulator)
        key = (torch.is_grad_enabled(),) + tuple((x.shape, x.dtype, x.device, x.requires_grad) for x in (q, v, u))
        key += tuple(p.requires_grad for p in params)
        if key in self._ready:
            return tuple(self._compiled(q, v, u)[:n])
        # First call with this layout: one eager pass builds the model's
        # cached constants (topology, level plans: Python code with .tolist())
        # outside the traced region, and shows that the inputs can be
        # stepped; so a failure of the compiled call that follows is the
        # compiler's, and falls back.
        eager = self._eager(q, v, u)
        try:
            out = self._compiled(q, v, u)
        except Exception as exc:  # noqa: BLE001 - any compiler failure falls back (or is re-raised)
            if not self.fallback:
                raise CompilerUnavailableError(f"torch.compile failed on the simulation step: {_describe(exc)}") from exc
            self._give_up(_describe(exc))
            self._compiled = None
            return tuple(eager[:n])
        self._ready.add(key)
        return tuple(out[:n])

    def __repr__(self) -> str:
        state = "compiled" if self.compiled else f"eager ({self.eager_reason})"
        return f"CompiledStep({self.simulator!r}, backend={self.backend!r}, {state})"


def _describe(exc: BaseException) -> str:
    """``Type: first line`` of an exception and of the error inside it (dynamo wraps the backend's)."""
    parts = []
    seen = 0
    while exc is not None and seen < 3:
        text = str(exc).strip()
        parts.append(f"{type(exc).__name__}: {text.splitlines()[0][:200] if text else ''}".rstrip(": "))
        exc = getattr(exc, "inner_exception", None) or exc.__cause__
        seen += 1
    return " <- ".join(parts)


def _parameters(sim: Simulator) -> tuple[torch.Tensor, ...]:
    """The tensors a step reads that may require grad (a new grad pattern needs a new graph)."""
    out = []
    robot = sim.robot
    if robot is not None:
        out += [robot.body_mass, robot.body_com, robot.body_inertia, robot.armature, robot.damping, robot.friction]
    if sim.contact is not None:
        p = sim.contact.params
        out += [x for x in vars(p).values() if isinstance(x, torch.Tensor)]
    for name in ("kp", "kd"):
        x = getattr(sim.actuator, name, None)
        if isinstance(x, torch.Tensor):
            out.append(x)
    return tuple(out)


def _copy_function(fn: Callable) -> Callable:
    import types

    return types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)


def compile_step(
    sim: Simulator,
    *,
    backend: str | Callable = "inductor",
    mode: str | None = None,
    fallback: bool = True,
    contact_record=(),
) -> CompiledStep:
    """``sim.step`` compiled by ``torch.compile``, falling back to eager code when it cannot be.

    The returned :class:`CompiledStep` takes ``(state, control)`` as
    :meth:`Simulator.step` does and gives the same next state, with the
    step's few hundred tensor operations (kinematics, mass matrix, contact
    detection, the force law, the implicit solve, the integration) traced
    into one graph. Gradients flow through it as through the eager step
    (``torch.compile`` traces the backward pass too). The results equal the
    eager step's to rounding (tested one step at a time, relative to the
    largest entry: 1e-12 in float64, states and gradients; 1e-5 in float32,
    where the contact force, a stiffness times a millimetre-sized
    difference of two heights, keeps few bits in either path: measured
    2.1e-6, and no further from the float64 step than eager float32 is).

    Compilation happens on the first call with each new batch shape, dtype,
    device or grad pattern (``dynamic=False``) and is slow on the CPU:
    69-158 CPU seconds for the quadruped's contact step (forward, or forward
    and backward). It removes per-operation overhead, which dominates small
    batches: measured on the CPU in float32 (docs/scaling.md), the
    quadruped's step with its backward pass took 0.34 of the eager time at
    batch 64 and 0.81 at batch 1024. Not measured on CUDA. Envs:
    ``QuadrupedWalk(compile=True)`` steps its contact substeps through it
    (:meth:`CompiledStep.advance`).

    Fallback: when ``torch.compile`` is unavailable (no dynamo for this
    Python, no C++ compiler for inductor's CPU kernels) or fails on the step,
    a ``RuntimeWarning`` says why and every call runs the eager step
    (:attr:`CompiledStep.eager_reason`); ``fallback=False`` raises
    :class:`~backdrive.CompilerUnavailableError` instead. A simulator
    changed afterwards (``sim.replace``, another robot) needs a new call.

    Args:
        sim: the simulator whose step to compile.
        backend, mode: passed to ``torch.compile`` (``backend`` may be a
            callable backend).
        fallback: run eagerly, with a warning, when compilation fails.
        contact_record: with contact, the :class:`~backdrive.contact.ContactResult`
            fields (e.g. ``("normal_force", "slip_velocity")``) that
            :meth:`CompiledStep.advance` returns after the state and the
            effort, computed inside the same graph. ``()`` (default): none.

    Returns:
        A :class:`CompiledStep`.

    Raises:
        InputError: ``sim`` is not a :class:`Simulator` or ``fallback`` not a bool.
        CompilerUnavailableError: ``fallback=False`` and the step cannot be compiled.
    """
    if not isinstance(sim, Simulator):
        raise InputError(f"compile_step needs a backdrive.sim.Simulator, got {type(sim).__name__}")
    if not isinstance(fallback, bool):
        raise InputError(f"fallback must be True or False, got {fallback!r}")
    if not (isinstance(backend, str) or callable(backend)):
        raise InputError(f"backend must be a torch.compile backend name or callable, got {backend!r}")
    if isinstance(contact_record, str) or not isinstance(contact_record, (tuple, list)):
        raise InputError(f"contact_record must be a tuple of ContactResult field names, got {contact_record!r}")
    if contact_record:
        if sim.contact is None:
            raise InputError("contact_record needs a simulator with contact (sim.contact is None)")
        sim._contact_fields(tuple(contact_record))  # names each unknown field
    return CompiledStep(sim, backend, mode, fallback, tuple(contact_record))
