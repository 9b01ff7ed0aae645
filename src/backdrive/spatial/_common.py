"""Shared helpers for ``backdrive.spatial``: validation, epsilons, batch shapes.

Everything here is private. Thresholds depend on the dtype, never on a
hard-coded constant, so float32 and float64 each get the branch switch that
keeps them at machine precision.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .._errors import InputError, InputTypeError

BatchShape = int | Sequence[int] | torch.Size


def small_angle_threshold(dtype: torch.dtype) -> float:
    """Angle below which the Taylor branches are used.

    ``eps ** (1/8)`` (about 1.1e-2 in float64, 0.14 in float32). The series we
    use keep terms up to ``theta**6`` or ``theta**8``, so their truncation
    error at this angle is far below ``eps``; above it, the closed forms lose
    at most ``eps / theta**2`` relative accuracy in their derivatives (about
    2e-12 in float64), which is where their cancellation starts to bite.

    Args:
        dtype: Floating dtype of the computation.

    Returns:
        The threshold angle in radians.
    """
    return torch.finfo(dtype).eps ** 0.125


def default_tolerance(dtype: torch.dtype) -> float:
    """A loose "is this valid" tolerance: ``sqrt(eps)`` of ``dtype``."""
    return torch.finfo(dtype).eps ** 0.5


def check_floating(x: torch.Tensor, name: str) -> None:
    """Raise :class:`~backdrive.InputTypeError` (a ``TypeError``) unless ``x`` is a floating-point tensor."""
    if not isinstance(x, torch.Tensor):
        raise InputTypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise InputTypeError(
            f"{name} must be a floating-point tensor (float32 or float64), got {x.dtype}"
        )


def check_vector(x: torch.Tensor, size: int, name: str) -> None:
    """Raise unless ``x`` is a floating tensor of shape ``(..., size)``."""
    check_floating(x, name)
    if x.ndim < 1 or x.shape[-1] != size:
        raise InputError(f"{name} must have shape (..., {size}), got {tuple(x.shape)}")


def check_matrix(x: torch.Tensor, rows: int, cols: int, name: str) -> None:
    """Raise unless ``x`` is a floating tensor of shape ``(..., rows, cols)``."""
    check_floating(x, name)
    if x.ndim < 2 or x.shape[-2:] != (rows, cols):
        raise InputError(
            f"{name} must have shape (..., {rows}, {cols}), got {tuple(x.shape)}"
        )


def check_same_dtype_device(a: torch.Tensor, b: torch.Tensor, name_a: str, name_b: str) -> None:
    """Raise :class:`~backdrive.InputTypeError` when two inputs disagree in dtype or device.

    Arithmetic would silently promote or fail with an opaque message; the
    project's convention is a clear error, never a silent copy.
    """
    if a.dtype != b.dtype:
        raise InputTypeError(f"{name_a} and {name_b} must share a dtype, got {a.dtype} and {b.dtype}")
    if a.device != b.device:
        raise InputTypeError(
            f"{name_a} and {name_b} must be on the same device, got {a.device} and {b.device}"
        )


def parse_batch_shape(batch_shape: tuple) -> tuple[int, ...]:
    """Normalise ``*batch_shape`` varargs: ``f(2, 3)``, ``f((2, 3))`` and ``f()``."""
    if len(batch_shape) == 1 and isinstance(batch_shape[0], (tuple, list, torch.Size)):
        batch_shape = tuple(batch_shape[0])
    return as_batch_shape(batch_shape)


def as_batch_shape(batch_shape: BatchShape) -> tuple[int, ...]:
    """Turn an int or a sequence of ints into a validated shape tuple."""
    if isinstance(batch_shape, int):
        batch_shape = (batch_shape,)
    shape = tuple(batch_shape)
    for n in shape:
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise InputError(f"batch_shape must be non-negative ints, got {shape}")
    return shape


def resolve_dtype(dtype: torch.dtype | None) -> torch.dtype:
    """``dtype`` or torch's default floating dtype."""
    dtype = torch.get_default_dtype() if dtype is None else dtype
    if not dtype.is_floating_point:
        raise InputTypeError(f"dtype must be a floating dtype, got {dtype}")
    return dtype
