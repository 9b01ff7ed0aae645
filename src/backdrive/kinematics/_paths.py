"""Which implementation runs: the batch-first reference or the batch-last fast path.

Every kinematics and dynamics algorithm has at most two implementations
(forward kinematics: the tree's pointer-jumping reference kernel, which
:class:`~backdrive.kinematics.SerialChainKinematics` runs for its pose at
every batch size, restricted to its path, and the tree's level kernel; the
chain's batch-last GEMM pass is its pose-and-Jacobian pass, never a
pose-only path; measured in ``docs/kinematics.md``, "One reference FK"):

* the **reference** path: batch-first tensors ``(..., k, c)``, plain autograd.
  It serves small batches, ``torch.func`` transforms, forward-mode AD and
  double backward, and the tests hold the fast path against it;
* the **fast** path: the batch flattened and moved last, every quantity held
  component by component (``(3, k, N)`` vectors, ``(3, 3, k, N)`` rotations),
  so that a 3x3 product or a cross product is a few elementwise operations over
  the whole batch; hand-written backward passes where they pay.

:func:`choose` decides between them, once, at the top of each public
function (``forward_kinematics``, ``frame_transforms``, ``frame_jacobian``,
``inverse_dynamics``, ``bias_forces``, ``gravity_forces``, ``mass_matrix``,
``forward_dynamics``). :func:`use_path` forces one path for tests and
benchmarks. The batch sizes at which the fast path takes over are
:data:`FAST_MIN_BATCH`; with :data:`LEVEL_SUM_MIN_BATCH` (a choice of
kernel inside the fast path) and ``_fk.JUMP_BATCH_LAST_MIN`` /
``_fk.JUMP_AFFINE_MIN`` (the reference FK kernel's layouts,
:func:`~backdrive.kinematics._fk.jump_layout`) these are the only batch-size
thresholds.
"""

from __future__ import annotations

import contextlib
import contextvars

import torch
import torch.autograd.forward_ad as fwAD

from .._errors import InputError

__all__ = ["PATHS", "FAST_MIN_BATCH", "LEVEL_SUM_MIN_BATCH", "use_path", "choose", "transforms_active", "untracked"]

#: Accepted values of :func:`use_path`.
PATHS = ("auto", "reference", "fast")

#: From this many samples on, ``"auto"`` takes the fast path. Measured
#: crossovers (fast / reference time, one thread, Panda and floating
#: quadruped, float32 and float64, ``docs/dynamics.md``): forward kinematics
#: between 100 and 192 samples; inverse dynamics, the mass matrix and
#: forward dynamics with a gradient around 100 (its analytic backward
#: already pays at 32 to 64); forward dynamics without a gradient for the
#: quadruped (tree-sparse factorisation) between 128 and 192. Keys are the
#: public functions' families.
FAST_MIN_BATCH = {
    "kinematics": 128,
    "inverse_dynamics": 96,
    "mass_matrix": 96,
    "forward_dynamics": 96,  # with a gradient
    "forward_dynamics_no_grad": 192,
    "contact_step": 128,  # ContactModel.acceleration, implicit, without a gradient (docs/contact.md)
    # The same recording a gradient (contact/_fast.py's backward): the two
    # paths cost the same between 128 and 192 samples (docs/contact.md).
    "contact_step_grad": 160,
    "energy": 96,  # kinetic and potential energy, centre of mass (fast/reference at 64: 0.8-1.15, at 128: 0.76-0.95)
}

#: Inside the fast path, without autograd: up to this many samples a tree sum
#: is one product with the ancestor matrix and CRBA forms every product
#: ``S_j . F_i`` at once (fewest operations); above it, one add per depth
#: level and only the tree's pairs (least arithmetic and memory traffic).
#: Not a choice of path: both kernels give the same numbers.
LEVEL_SUM_MIN_BATCH = 512

#: ``compile_forward_dynamics(eager_from=)``'s default: from this many
#: samples, without a gradient, the eager fast path beats inductor's kernels.
COMPILED_EAGER_MIN_BATCH = 256

_forced: contextvars.ContextVar[str] = contextvars.ContextVar("backdrive_path", default="auto")


@contextlib.contextmanager
def use_path(path: str):
    """Force the implementation that kinematics and dynamics calls use.

    ``"reference"``: the batch-first plain-autograd path at every batch size;
    ``"fast"``: the batch-last path at every batch size where the model and
    inputs allow it (it needs at least one moving joint, and external
    wrenches whose batch broadcasts into the inputs'); ``"auto"``: by batch
    size (:data:`FAST_MIN_BATCH`). ``torch.func`` transforms and forward-mode
    AD always take the reference path. For tests and benchmarks: both paths
    give the same numbers to rounding.

    Usage::

        with backdrive.dynamics.use_path("reference"):
            a = forward_dynamics(robot, q, v, tau)

    Raises:
        InputError: an unknown path.
    """
    if path not in PATHS:
        raise InputError(f"unknown path {path!r}; valid: {', '.join(PATHS)}")
    token = _forced.set(path)
    try:
        yield
    finally:
        _forced.reset(token)


def choose(function: str, batch: int, eligible: bool = True) -> bool:
    """Whether ``function`` runs its fast path for ``batch`` samples.

    ``eligible``: whether the model and inputs allow the fast path at all
    (checked by the caller). The one branch point between the two paths.
    """
    if not eligible or transforms_active():
        return False
    forced = _forced.get()
    if forced != "auto":
        return forced == "fast"
    return batch >= FAST_MIN_BATCH[function]


def transforms_active() -> bool:
    """Whether a ``torch.func`` transform or forward-mode AD is active.

    The hand-written backward passes (custom ``autograd.Function``) and the
    ``out=`` kernels of the fast path do not take part in those; the callers
    then use the reference path.
    """
    return torch._C._functorch.peek_interpreter_stack() is not None or fwAD._current_level >= 0


def untracked() -> bool:
    """Whether nothing records the current operations: grad mode off and no
    ``torch.func`` transform or forward-mode AD active. The ``out=`` and
    in-place kernels of the fast path are used only then."""
    return not (torch.is_grad_enabled() or transforms_active())
