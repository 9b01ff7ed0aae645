"""Forward dynamics fused by ``torch.compile`` (opt in)."""

from __future__ import annotations

import shutil
from typing import Callable

import torch

from .._errors import CompilerUnavailableError, InputError
from ..model import RobotModel
from ._forward import DEFAULT_FRICTION_WIDTH, FORWARD_METHODS, _forward_dynamics
from ..kinematics._paths import COMPILED_EAGER_MIN_BATCH

__all__ = ["compile_forward_dynamics", "CompilerUnavailableError"]


def _check_compiler(device: torch.device, backend: str) -> None:
    if not hasattr(torch, "compile"):
        raise CompilerUnavailableError(f"torch {torch.__version__} has no torch.compile")
    try:
        from torch._dynamo import is_dynamo_supported

        supported = is_dynamo_supported()
    except Exception as e:  # noqa: BLE001 - any failure to import means no compiler
        raise CompilerUnavailableError(f"torch.compile is unavailable: {e}") from e
    if not supported:
        raise CompilerUnavailableError(
            f"torch.compile (dynamo) is not supported with this Python/torch ({torch.__version__}); "
            "use backdrive.dynamics.forward_dynamics"
        )
    if backend == "inductor" and device.type == "cpu":
        cxx = None
        try:
            from torch._inductor import config

            cxx = config.cpp.cxx[-1] if isinstance(config.cpp.cxx, tuple) else config.cpp.cxx
        except Exception:  # noqa: BLE001
            pass
        candidates = [c for c in (cxx, "g++", "c++", "clang++") if c]
        if not any(shutil.which(c) for c in candidates):
            raise CompilerUnavailableError(
                "torch.compile's inductor backend needs a C++ compiler for CPU kernels and none was found "
                f"(looked for {', '.join(candidates)}); install g++ or clang++, or use "
                "backdrive.dynamics.forward_dynamics"
            )


def compile_forward_dynamics(
    robot: RobotModel,
    *,
    method: str = "auto",
    friction_width: float = DEFAULT_FRICTION_WIDTH,
    backend: str = "inductor",
    mode: str | None = None,
    eager_from: int | None = COMPILED_EAGER_MIN_BATCH,
) -> Callable[..., torch.Tensor]:
    """:func:`forward_dynamics` for one robot, compiled by ``torch.compile``.

    Returns ``fd(q, v, tau, *, f_ext=None, gravity=None)``, which gives the
    same accelerations as ``forward_dynamics(robot, q, v, tau, f_ext=f_ext,
    gravity=gravity, method=method, friction_width=friction_width)`` (to
    rounding: in float32 about 1e-5 of the largest acceleration, a few 1e-5
    for the quadruped's poorly conditioned mass matrix; 1e-12 in float64)
    with the whole pass traced
    into one graph and, with the default inductor backend on the CPU, fused
    into a few C++ loops, so that the Python and dispatch overhead of its few
    hundred tensor operations goes away.

    Compilation happens on the first call with each new batch shape, dtype,
    device or ``requires_grad`` pattern (``dynamic=False``: shapes are
    specialised), and takes tens of seconds to a few minutes on the CPU
    (measured on a 2-core machine: about 25 s for the Panda at a small batch,
    80 to 110 s at batch 10000 for the Panda and the floating-base
    quadruped; inductor's on-disk cache makes a repeated compilation in a new
    process take a few seconds). Changing the robot (another model, ``.to()``,
    ``replace``) needs a new call of this function. ``torch.compile``'s
    recompile limit (``torch._dynamo.config.recompile_limit``, 8 by default)
    bounds how many batch shapes and grad modes one returned function
    compiles; beyond it dynamo runs the function eagerly (still correct,
    no longer fused).

    Without gradients (``torch.no_grad()`` or inputs that do not require
    grad) the compiled graph is ``method="auto"``'s no-graph path (the
    reference path's CRBA and Cholesky solve below 192 samples, the fast
    path's sparse factorisation from 192, up to ``eager_from``). With inputs, or the
    robot's masses, inertias or armature, requiring grad it compiles plain
    autograd through CRBA, RNEA and the Cholesky solve (the hand-written
    backward of the eager ``"auto"`` path cannot be traced); gradients match
    the eager ones.

    Measured speed (one torch thread, CPU time, ``benchmarks/dynamics.py``
    on a 2-core machine, float32, freed memory retained with
    :func:`backdrive.runtime.retain_freed_memory`): the Panda at batch 1
    0.35 ms against 1.5 ms eager, the quadruped 0.70 against 2.2 ms; at
    batch 100 0.89 against 2.7 ms and 1.1 against 3.1 ms. At batch 10000
    the compiled kernels were slower than the eager batch-last path (31
    against 19 ms for the Panda, 31 against 29 ms for the quadruped, and
    slower still in float64), so by default such batches run the eager
    :func:`forward_dynamics` (see ``eager_from``).

    Args:
        robot: the robot model (its dtype and device are the inputs').
        method: as :func:`forward_dynamics`.
        friction_width: as :func:`forward_dynamics`.
        backend, mode: passed to ``torch.compile``.
        eager_from: batches of at least this many samples, without a
            gradient, run the eager :func:`forward_dynamics` instead of a
            compiled graph (256 by default: from there the eager fast path
            beat inductor's kernels); ``None`` compiles every batch size.

    Raises:
        InputError: an unknown ``method`` or a bad ``friction_width``.
        CompilerUnavailableError: ``torch.compile`` cannot run here (no
            dynamo support for this Python, or no C++ compiler for inductor's
            CPU kernels).
    """
    if method not in FORWARD_METHODS:
        raise InputError(f"unknown forward dynamics method {method!r}; valid: {', '.join(FORWARD_METHODS)}")
    if not friction_width > 0:
        raise InputError(f"friction_width must be positive, got {friction_width!r}")
    if eager_from is not None and not (isinstance(eager_from, int) and eager_from > 0):
        raise InputError(f"eager_from must be a positive int or None, got {eager_from!r}")
    _check_compiler(robot.device, backend)

    def traced(q, v, tau, f_ext, gravity):
        return _forward_dynamics(robot, q, v, tau, f_ext, gravity, method, friction_width, traced=True)

    # torch.compile keeps its cache of compiled graphs (and the recompile
    # limit) per code object: a copy per returned function keeps robots,
    # dtypes and batch shapes of different functions from sharing one limit.
    traced.__code__ = traced.__code__.replace()
    compiled = torch.compile(traced, fullgraph=True, dynamic=False, backend=backend, mode=mode)
    warmed: set = set()

    def fd(q: torch.Tensor, v: torch.Tensor, tau: torch.Tensor, *, f_ext=None, gravity=None) -> torch.Tensor:
        if eager_from is not None and q.shape[:-1].numel() >= eager_from:
            params = (robot.body_mass, robot.body_com, robot.body_inertia, robot.armature)
            needs_grad = torch.is_grad_enabled() and any(
                x is not None and x.requires_grad for x in (q, v, tau, f_ext, gravity) + params
            )
            if not needs_grad:
                return _forward_dynamics(robot, q, v, tau, f_ext, gravity, method, friction_width)
        # The model's cached constants (topology, level plans, sparsity
        # schedule) are built by Python code with .tolist(): one eager pass of
        # the same path (same grad mode) per new input layout builds them
        # outside the traced region; its result is discarded.
        key = (torch.is_grad_enabled(),) + tuple(
            None if x is None else (x.shape, x.dtype, x.device, x.requires_grad) for x in (q, v, tau, f_ext, gravity)
        )
        if key not in warmed:
            traced(q, v, tau, f_ext, gravity)
            warmed.add(key)
        return compiled(q, v, tau, f_ext, gravity)

    fd.robot = robot  # type: ignore[attr-defined]
    return fd
