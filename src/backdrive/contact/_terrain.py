"""Environment geometry: a ground plane and a heightfield.

A terrain answers one question for a batch of world points: the signed
distance above the surface (positive outside) and the outward unit normal.
"""

from __future__ import annotations

import math

import torch

from .._constants import constant
from .._errors import InputError, InvalidValueError

__all__ = ["GroundPlane", "Heightfield", "Terrain"]


def _param(value, name: str, owner: str, *, positive: bool = False, allow_none: bool = False):
    """A float or a tensor, checked finite (and >= 0 / > 0) once, at construction."""
    if value is None:
        if allow_none:
            return None
        raise InvalidValueError(f"{owner} {name} must be given")
    t = value.detach() if isinstance(value, torch.Tensor) else torch.as_tensor(float(value), dtype=torch.float64)
    if not bool(torch.isfinite(t).all()):
        raise InvalidValueError(f"{owner} {name} must be finite, got {value!r}")
    if positive and not bool((t > 0).all()):
        raise InvalidValueError(f"{owner} {name} must be positive, got {value!r}")
    return value


class Terrain:
    """Base class: ``query(points) -> (distance, normal)``; ``friction`` (or ``None``)."""

    friction = None

    def query(self, points: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # pragma: no cover - abstract
        raise NotImplementedError


class GroundPlane(Terrain):
    """An infinite plane through ``(0, 0, height)`` with outward normal ``normal``.

    Args:
        height: m, the plane's height at the world origin (float or a tensor
            that may require grad).
        normal: ``(3,)`` outward direction (normalised here); tilt it to make
            an incline.
        friction: optional Coulomb coefficient of the ground; when given it
            replaces the geometry's (``ContactParameters.friction``) for every
            contact with this plane. Float or tensor, ``>= 0``.
    """

    def __init__(self, height=0.0, normal=(0.0, 0.0, 1.0), friction=None):
        self.height = _param(height, "height", "ground plane")
        n = normal.detach() if isinstance(normal, torch.Tensor) else torch.as_tensor(normal, dtype=torch.float64)
        if n.shape != (3,) or not bool(torch.isfinite(n).all()) or float(n.norm()) < 1e-9:
            raise InvalidValueError(f"ground plane normal must be a finite nonzero (3,) vector, got {normal!r}")
        self._normal = normal
        # A normal given as numbers: its values, for a constant made once per
        # dtype and device (not copied to a GPU at every query).
        self._normal_values = None if isinstance(normal, torch.Tensor) else tuple(float(x) for x in n.tolist())
        if friction is not None:
            _param(friction, "friction", "ground plane")
            if not bool((torch.as_tensor(friction).detach() >= 0).all()):
                raise InvalidValueError(f"ground plane friction must be >= 0, got {friction!r}")
        self.friction = friction

    @classmethod
    def incline(cls, angle: float, *, height=0.0, friction=None) -> GroundPlane:
        """A plane tilted by ``angle`` rad about the world y axis (downhill towards +x)."""
        if not math.isfinite(angle) or abs(angle) >= math.pi / 2:
            raise InvalidValueError(f"incline angle must be finite and below pi/2 in magnitude, got {angle!r}")
        return cls(height, (math.sin(angle), 0.0, math.cos(angle)), friction)

    def normal(self, like: torch.Tensor) -> torch.Tensor:
        """``(3,)`` unit normal in ``like``'s dtype and device."""
        if self._normal_values is None:  # a tensor (it may require grad)
            n = torch.as_tensor(self._normal, dtype=like.dtype, device=like.device)
        else:
            n = constant(self._normal_values, like.dtype, like.device)
        return n / n.norm()

    def query(self, points: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Signed distance ``(...)`` and normal ``(..., 3)`` of world points ``(..., 3)``."""
        n = self.normal(points)
        h = self.height
        # A number stays a Python float (made a tensor it would be copied to a
        # GPU at every query); either way the product is taken in points' dtype.
        h = torch.as_tensor(h, dtype=points.dtype, device=points.device) if isinstance(h, torch.Tensor) else float(h)
        dist = points @ n - h * n[2]
        return dist, n.expand(points.shape)

    def __repr__(self) -> str:
        return f"GroundPlane(height={self.height!r}, normal={tuple(float(x) for x in torch.as_tensor(self._normal))})"


class Heightfield(Terrain):
    """A grid of heights, interpolated bilinearly.

    ``heights[i, j]`` is the ground height at ``(x0 + i dx, y0 + j dy)``.
    Between samples the surface is the bilinear interpolant; its normal is
    ``(-dh/dx, -dh/dy, 1)`` normalised, and the signed distance of a point is
    its height above the surface times the normal's z component (exact on
    planar patches, first order on curved ones). Outside the grid the edge
    heights continue flat. The interpolant is continuous, its slope is not
    across cell edges, so a step in ``heights`` is a ramp one cell wide:
    make the cells smaller than the feet for sharp steps.

    Args:
        heights: ``(nx, ny)`` tensor, m, finite, ``nx, ny >= 2`` (may require grad).
        spacing: ``dx`` or ``(dx, dy)``, m, positive.
        origin: ``(x0, y0)`` of ``heights[0, 0]``; by default the grid is
            centred on the world origin.
        friction: as :class:`GroundPlane`.
    """

    def __init__(self, heights: torch.Tensor, spacing=0.1, origin=None, friction=None):
        if not isinstance(heights, torch.Tensor):
            raise InputError(f"heightfield heights must be a torch.Tensor, got {type(heights).__name__}")
        if heights.ndim != 2 or heights.shape[0] < 2 or heights.shape[1] < 2:
            raise InputError(f"heightfield heights must have shape (nx, ny) with nx, ny >= 2, got {tuple(heights.shape)}")
        if not heights.is_floating_point():
            raise InputError(f"heightfield heights must be a floating tensor, got {heights.dtype}")
        bad = ~torch.isfinite(heights.detach())
        if bool(bad.any()):
            i, j = (int(x) for x in torch.nonzero(bad)[0])
            raise InvalidValueError(
                f"heightfield heights must be finite; heights[{i}, {j}] is {float(heights[i, j])} "
                f"({int(bad.sum())} bad entries)"
            )
        sp = (float(spacing), float(spacing)) if not isinstance(spacing, (tuple, list)) else tuple(float(s) for s in spacing)
        if len(sp) != 2 or not all(math.isfinite(s) and s > 0 for s in sp):
            raise InvalidValueError(f"heightfield spacing must be positive (dx or (dx, dy)), got {spacing!r}")
        self.heights = heights
        self.spacing = sp
        nx, ny = heights.shape
        if origin is None:
            origin = (-0.5 * (nx - 1) * sp[0], -0.5 * (ny - 1) * sp[1])
        origin = tuple(float(o) for o in origin)
        if len(origin) != 2 or not all(math.isfinite(o) for o in origin):
            raise InvalidValueError(f"heightfield origin must be two finite numbers, got {origin!r}")
        self.origin = origin
        if friction is not None:
            _param(friction, "friction", "heightfield")
            if not bool((torch.as_tensor(friction).detach() >= 0).all()):
                raise InvalidValueError(f"heightfield friction must be >= 0, got {friction!r}")
        self.friction = friction

    def height(self, xy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Height ``(...)`` and slopes ``dh/dx``, ``dh/dy`` at world ``xy (..., 2)``."""
        H = self.heights
        if H.dtype != xy.dtype or H.device != xy.device:
            raise InputError(f"heightfield heights are {H.dtype} on {H.device}, the points {xy.dtype} on {xy.device}")
        nx, ny = H.shape
        dx, dy = self.spacing
        u = ((xy[..., 0] - self.origin[0]) / dx).clamp(0.0, nx - 1.0)
        w = ((xy[..., 1] - self.origin[1]) / dy).clamp(0.0, ny - 1.0)
        # The cell index is piecewise constant (no gradient); the fractions carry it.
        i0 = u.detach().floor().clamp(max=nx - 2).long()
        j0 = w.detach().floor().clamp(max=ny - 2).long()
        s, t = u - i0, w - j0
        h00, h10 = H[i0, j0], H[i0 + 1, j0]
        h01, h11 = H[i0, j0 + 1], H[i0 + 1, j0 + 1]
        a = h00 + s * (h10 - h00)
        b = h01 + s * (h11 - h01)
        h = a + t * (b - a)
        inside_x = ((xy[..., 0] - self.origin[0]) / dx > 0) & ((xy[..., 0] - self.origin[0]) / dx < nx - 1)
        inside_y = ((xy[..., 1] - self.origin[1]) / dy > 0) & ((xy[..., 1] - self.origin[1]) / dy < ny - 1)
        hx = ((1 - t) * (h10 - h00) + t * (h11 - h01)) / dx
        hy = (b - a) / dy
        zero = torch.zeros_like(h)
        return h, torch.where(inside_x, hx, zero), torch.where(inside_y, hy, zero)

    def query(self, points: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Signed distance ``(...)`` and normal ``(..., 3)`` of world points ``(..., 3)``."""
        h, hx, hy = self.height(points[..., :2])
        inv = torch.rsqrt(1.0 + hx * hx + hy * hy)
        n = torch.stack([-hx * inv, -hy * inv, inv], -1)
        return (points[..., 2] - h) * inv, n

    def __repr__(self) -> str:
        nx, ny = self.heights.shape
        return f"Heightfield({nx}x{ny}, spacing={self.spacing}, origin={self.origin})"
