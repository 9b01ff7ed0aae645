"""``DifferentiableFKLayer``: a serial chain's FK and Jacobians as an ``nn.Module``."""

from __future__ import annotations

import torch
from torch import nn

from .._errors import CheckpointMismatchError, InputError
from ..kinematics._chain import SerialChainKinematics
from ..kinematics._ik import default_seed
from ..model._model import check_device
from ..runtime import finite_checked

__all__ = ["DifferentiableFKLayer", "CheckpointMismatchError"]

_FLOATS = (torch.float32, torch.float64)


def _digest(fingerprint: str) -> torch.Tensor:
    return torch.tensor(list(bytes.fromhex(fingerprint)), dtype=torch.uint8)


def _as_float_tensor(x, name: str, shape: tuple, dtype, device) -> torch.Tensor:
    try:
        t = torch.as_tensor(x)
    except (TypeError, ValueError, RuntimeError) as exc:
        raise InputError(f"{name} must be a tensor of shape {shape}, got {type(x).__name__}") from exc
    if tuple(t.shape) != shape:
        raise InputError(f"{name} must have shape {shape}, got {tuple(t.shape)}")
    if not (t.is_floating_point() or t.dtype in (torch.int32, torch.int64)):
        raise InputError(f"{name} must hold real numbers, got {t.dtype}")
    return t.detach().to(dtype=dtype, device=device).clone()


def check_to_arguments(args: tuple, kwargs: dict) -> None:
    """Raise :class:`InputError` naming the device of ``Module.to(*args, **kwargs)`` when it is
    not a torch device (``"gpu"``) or not available here (``"cuda"`` on a CPU build)."""
    for a in (*args, kwargs.get("device")):
        if isinstance(a, (str, torch.device)):
            check_device(a)
        elif isinstance(a, int) and not isinstance(a, bool):
            check_device(torch.device("cuda", a) if a >= 0 else a)


def check_rigid(T: torch.Tensor, name: str = "tcp") -> None:
    """Raise :class:`InputError` unless ``T (4, 4)`` is a finite rigid transform.

    Orthonormality and ``det R = 1`` are checked to ``1e-5`` (a tolerance
    that catches wrong matrices, not rounding of valid ones); the bottom row
    must be ``[0, 0, 0, 1]``.
    """
    if not bool(torch.isfinite(T).all()):
        raise InputError(f"{name} must be finite, got {T.tolist()}")
    R = T[:3, :3].to(torch.float64)
    eye = torch.eye(3, dtype=torch.float64, device=R.device)
    ortho = float((R.T @ R - eye).abs().max())
    det = float(torch.linalg.det(R))
    bottom = T[3].to(torch.float64) - torch.tensor([0.0, 0.0, 0.0, 1.0], dtype=torch.float64, device=R.device)
    if ortho > 1e-5 or abs(det - 1.0) > 1e-5 or float(bottom.abs().max()) > 1e-12:
        raise InputError(
            f"{name} must be a rigid transform (orthonormal rotation with det +1, bottom row "
            f"[0, 0, 0, 1]); got |R^T R - I| = {ortho:.3g}, det R = {det:.6g}, bottom row "
            f"{T[3].tolist()}"
        )


class DifferentiableFKLayer(nn.Module):
    """Tool poses and geometric Jacobians of a serial chain, as a network layer.

    The layer owns a copy of the chain and three buffers: ``tcp`` (end frame
    from tool, ``(4, 4)``, a validated rigid transform, identity by default)
    and the physical limits ``lower``/``upper`` ``(dof,)``, plus the geometry
    fingerprint ``geometry_fingerprint`` (32 ``uint8``, the SHA-256 of
    :attr:`SerialChainKinematics.fingerprint`).

    Contract:

    * FK evaluates the joints it is given, without clipping. Poses are
      ``T_root_tool`` in the chain root frame; Jacobians ``(..., 6, dof)`` are
      geometric, ``[linear; angular]`` rows in the root frame, at the tool
      point.
    * Inputs keep their leading batch axes and must already be in the
      layer's dtype and device (a mismatch is an :class:`InputError`, never a
      silent copy). float32 and float64.
    * ``.to()``, ``.double()``, ``.float()``, ``.cuda()`` move the geometry
      with the buffers (re-cast from float64 constants, so exact);
      ``.half()`` and other dtypes are refused.
    * ``eval()`` changes nothing: input gradients flow in both modes. No
      optimiser or recurrent state is kept; every call builds its own graph.
    * Checkpoints: ``state_dict`` holds ``tcp``, ``lower``, ``upper`` and
      ``geometry_fingerprint``; loading a checkpoint of other geometry raises
      :class:`CheckpointMismatchError` before anything is copied, and so does
      one that carries the buffers without the fingerprint (with
      ``strict=False`` too: it cannot be checked); one that carries none of
      this layer's keys leaves it unchanged under ``strict=False``.
      ``load_state_dict(..., assign=True)`` adopts the checkpoint's dtype and
      device for the buffers and the geometry (also when nested).

    Args:
        model: the :class:`~backdrive.kinematics.SerialChainKinematics` (copied).
        tcp: optional ``(4, 4)`` end-frame-from-tool transform.
        lower, upper: optional ``(dof,)`` limits; default the chain's physical
            limits. ``lower <= upper``, no NaN (infinite means unbounded).
    """

    def __init__(self, model: SerialChainKinematics, tcp=None, lower=None, upper=None):
        super().__init__()
        if not isinstance(model, SerialChainKinematics):
            raise InputError(
                f"model must be a backdrive.kinematics.SerialChainKinematics, got {type(model).__name__}"
            )
        dtype, device = model.dtype, model.device
        self._chain = model.to(device=device, dtype=dtype)
        dof = model.dof
        tcp_t = (
            torch.eye(4, dtype=dtype, device=device)
            if tcp is None
            else _as_float_tensor(tcp, "tcp", (4, 4), dtype, device)
        )
        check_rigid(tcp_t)
        lo = model.lower.clone() if lower is None else _as_float_tensor(lower, "lower", (dof,), dtype, device)
        hi = model.upper.clone() if upper is None else _as_float_tensor(upper, "upper", (dof,), dtype, device)
        _check_limits(lo, hi)
        self.register_buffer("tcp", tcp_t)
        self.register_buffer("lower", lo)
        self.register_buffer("upper", hi)
        self.register_buffer("geometry_fingerprint", _digest(model.fingerprint).to(device))

    # ------------------------------------------------------------------ properties

    @property
    def chain(self) -> SerialChainKinematics:
        """The layer's copy of the kinematics (in the layer's dtype and device)."""
        return self._chain

    @property
    def dof(self) -> int:
        return self._chain.dof

    @property
    def joint_names(self) -> tuple[str, ...]:
        return self._chain.joint_names

    @property
    def fingerprint(self) -> str:
        return self._chain.fingerprint

    @property
    def dtype(self) -> torch.dtype:
        return self._chain.dtype

    @property
    def device(self) -> torch.device:
        return self._chain.device

    # ------------------------------------------------------------------ compute

    @finite_checked(name="DifferentiableFKLayer.forward")
    def forward(self, qpos: torch.Tensor) -> torch.Tensor:
        """Tool poses ``(..., 4, 4)`` for joints ``(..., dof)`` (no Jacobian is built)."""
        return self._chain.forward_kinematics(qpos, self.tcp)

    @finite_checked(name="DifferentiableFKLayer.evaluate")
    def evaluate(self, qpos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Tool poses ``(..., 4, 4)`` and Jacobians ``(..., 6, dof)`` from one FK pass."""
        return self._chain.evaluate(qpos, self.tcp)

    @finite_checked(name="DifferentiableFKLayer.jacobian")
    def jacobian(self, qpos: torch.Tensor) -> torch.Tensor:
        """Geometric tool Jacobians ``(..., 6, dof)``, root frame, linear rows first."""
        return self._chain.evaluate(qpos, self.tcp)[1]

    def default_seed(self) -> torch.Tensor:
        """``(dof,)``: bounded joints' midpoints, zero for unbounded ones, projected into the limits."""
        return default_seed(self.lower, self.upper)

    def extra_repr(self) -> str:
        return (
            f"robot={self._chain.model.name!r}, root={self._chain.root_link_name!r}, "
            f"end={self._chain.end_link_name!r}, dof={self.dof}, dtype={self.dtype}, device={self.device}"
        )

    # ------------------------------------------------------------------ device / dtype

    def to(self, *args, **kwargs):
        """``nn.Module.to``, with an :class:`InputError` for an unknown or unavailable device."""
        check_to_arguments(args, kwargs)
        return super().to(*args, **kwargs)

    def _apply(self, fn, recurse: bool = True):
        try:
            probe = fn(torch.zeros((), dtype=self.tcp.dtype, device=self.tcp.device))
        except (RuntimeError, AssertionError) as exc:  # e.g. .cuda() on a CPU-only build
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            hint = "; device 'cuda' is not available here" if "CUDA" in reason else ""
            raise InputError(f"{type(self).__name__} cannot be moved: {reason}{hint}") from None
        if probe.dtype not in _FLOATS:
            raise InputError(
                f"{type(self).__name__} supports float32 and float64, not {probe.dtype}"
            )
        out = super()._apply(fn, recurse)
        self._sync_geometry()
        return out

    def _sync_geometry(self) -> None:
        dtype, device = self.tcp.dtype, self.tcp.device
        for name in ("lower", "upper"):
            b = getattr(self, name)
            if b.dtype != dtype or b.device != device:
                raise InputError(
                    f"buffer {name!r} is {b.dtype} on {b.device} but 'tcp' is {dtype} on {device}; "
                    "a layer's buffers must share one dtype and device"
                )
        if dtype not in _FLOATS:
            raise InputError(f"{type(self).__name__} supports float32 and float64, not {dtype}")
        if self._chain.dtype != dtype or self._chain.device != device:
            self._chain = self._chain.to(device=device, dtype=dtype)
        if self.geometry_fingerprint.device != device:
            self.geometry_fingerprint = self.geometry_fingerprint.to(device)

    # ------------------------------------------------------------------ checkpoints

    def _load_from_state_dict(
        self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
    ):
        key = prefix + "geometry_fingerprint"
        carried = [prefix + k for k in ("tcp", "lower", "upper") if prefix + k in state_dict]
        if key not in state_dict and carried:
            # Without the fingerprint nothing says these buffers belong to this
            # geometry: refused whether strict or not, before anything is copied.
            raise CheckpointMismatchError(
                f"checkpoint {prefix or '<root>'!s} carries {', '.join(repr(k) for k in carried)} but no "
                f"{key!r}, so it cannot be checked against this layer's geometry (chain "
                f"{self._chain.root_link_name!r} -> {self._chain.end_link_name!r} of robot "
                f"{self._chain.model.name!r}); save it again from a DifferentiableFKLayer, or copy the "
                "buffers by hand if you know they match"
            )
        if key in state_dict:
            stored = state_dict[key]
            ok = (
                isinstance(stored, torch.Tensor)
                and stored.dtype == torch.uint8
                and tuple(stored.shape) == (32,)
                and bytes(stored.cpu().tolist()).hex() == self._chain.fingerprint
            )
            if not ok:
                got = (
                    bytes(stored.cpu().tolist()).hex()[:16] + "..."
                    if isinstance(stored, torch.Tensor) and stored.dtype == torch.uint8
                    else repr(stored)[:40]
                )
                raise CheckpointMismatchError(
                    f"checkpoint {prefix or '<root>'!s} was saved from other kinematic geometry: its "
                    f"fingerprint {got} differs from this layer's {self._chain.fingerprint[:16]}... "
                    f"(chain {self._chain.root_link_name!r} -> {self._chain.end_link_name!r} of "
                    f"robot {self._chain.model.name!r}); build the layer from the URDF the "
                    "checkpoint was trained with"
                )
        super()._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
        )
        self._sync_geometry()
        check_rigid(self.tcp)
        _check_limits(self.lower, self.upper)


def _check_limits(lo: torch.Tensor, hi: torch.Tensor) -> None:
    if bool(torch.isnan(lo).any() | torch.isnan(hi).any()):
        raise InputError("joint limits must not be NaN (use -inf/inf for unbounded joints)")
    if bool((lo > hi).any()):
        bad = torch.nonzero(lo > hi).flatten().tolist()
        raise InputError(f"lower limits exceed upper limits at joints {bad}")
