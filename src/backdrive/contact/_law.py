"""The contact force law: compliant normal force and regularised Coulomb friction.

Per contact point, with penetration ``phi`` (m, positive inside), outward
normal ``n``, contact-point velocity ``v_c`` split into ``v_n = n . v_c`` and
the slip ``v_t = v_c - v_n n``:

    a    = sigmoid(phi / w_n)                      smooth contact indicator
    phi+ = w_n * softplus(phi / w_n)                smooth penetration
    f_n  = k phi+ - d v_n a                         (clamped at 0 by default)
    f_t  = -mu f_n v_t / sqrt(|v_t|^2 + w_t^2)      regularised Coulomb

As ``w_n -> 0`` the normal law is the linear spring-damper ``k phi - d v_n``
inside and 0 outside; as ``w_t -> 0`` friction is Coulomb's ``-mu f_n v_t/|v_t|``.
``w_t`` is the stiction width: below it the friction acts as a viscous
damper of coefficient ``mu f_n / w_t`` (a body on a slope creeps at a speed
of about ``w_t`` instead of sticking).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import torch
import torch.nn.functional as F

from .._errors import InputError, InvalidValueError

__all__ = ["ContactParameters", "contact_law", "DEFAULT_CONTACT"]


@dataclass(frozen=True)
class ContactParameters:
    """Parameters of the force law, per shape or shared.

    Each value is a float or a tensor (which may require grad, for system
    identification) of shape ``()`` (shared), ``(ns,)`` (one per shape of the
    geometry, in ``geometry.shapes`` order) or ``(..., ns)`` / ``(..., 1)``
    with leading batch axes that broadcast with the state.

    Defaults are DiffRL's Ant contact (Xu et al., ICLR 2022: ``ke = 4e4``,
    ``kd = 1e4``, ``mu = 0.75``, run at 1 ms substeps) and the stiction
    width of the Tiny Differentiable Simulator (0.01 m/s). See
    ``docs/contact.md`` for how to choose them.

    Attributes:
        stiffness: ``k``, N/m, ``>= 0``.
        damping: ``d``, N s/m, ``>= 0``.
        friction: ``mu``, Coulomb coefficient, ``>= 0`` (a terrain's own
            ``friction``, when given, replaces it).
        normal_width: ``w_n``, m, ``> 0``: penetration scale of the smooth
            contact onset (force ``k w_n ln 2`` at zero penetration).
        stiction_width: ``w_t``, m/s, ``> 0``: slip speed scale of the
            regularised friction.
        clamp_normal: if ``True`` (default) the normal force is
            ``max(f_n, 0)``: the damper never pulls the body back at
            separation. ``False`` gives the textbook linear spring-damper,
            whose coefficient of restitution is ``exp(-zeta pi / sqrt(1 - zeta^2))``.
    """

    stiffness: object = 4.0e4
    damping: object = 1.0e4
    friction: object = 0.75
    normal_width: object = 1.0e-4
    stiction_width: object = 1.0e-2
    clamp_normal: bool = True

    def replace(self, **changes) -> ContactParameters:
        """A copy with some values changed."""
        valid = [f.name for f in fields(self)]
        for k in changes:
            if k not in valid:
                from .._errors import UnknownNameError

                raise UnknownNameError("contact parameter", k, valid)
        return ContactParameters(**{**{f.name: getattr(self, f.name) for f in fields(self)}, **changes})


#: The default parameters (DiffRL's Ant values, 1 cm/s stiction width).
DEFAULT_CONTACT = ContactParameters()

_POSITIVE = ("normal_width", "stiction_width")
_NONNEGATIVE = ("stiffness", "damping", "friction")


def resolve_value(kind: str, name: str, value, positive: bool, shape_links, dtype, device) -> torch.Tensor:
    """One parameter as a checked tensor of the model's dtype: a float, or a
    tensor of shape ``()``, ``(ns,)`` or ``(..., ns)`` / ``(..., 1)``.

    Raises:
        InvalidValueError: not a number, NaN, infinite, negative (or not
            positive, with ``positive``), naming ``kind``, ``name`` and the
            shape's link.
        InputError: a wrong shape, dtype or device.
    """
    ns = len(shape_links)
    if isinstance(value, torch.Tensor):
        if value.dtype != dtype or value.device != torch.device(device):
            raise InputError(f"{kind} {name} is {value.dtype} on {value.device}; the model is {dtype} on {device}")
        t = value
    else:
        try:
            if isinstance(value, bool):
                raise TypeError
            t = torch.as_tensor(float(value), dtype=dtype, device=device)
        except (TypeError, ValueError):
            raise InvalidValueError(f"{kind} {name} must be a number or a tensor, got {value!r}") from None
    if t.ndim > 0 and t.shape[-1] not in (1, ns):
        raise InputError(
            f"{kind} {name} must have shape (), ({ns},) or (..., {ns}) for {ns} shapes, got {tuple(t.shape)}"
        )
    d = t.detach()
    bad = ~torch.isfinite(d) | ((d <= 0) if positive else (d < 0))
    if bool(bad.any()):
        idx = torch.nonzero(bad.reshape(-1, d.shape[-1]) if d.ndim else bad.reshape(1, 1))[0]
        where = ""
        if d.ndim and d.shape[-1] == ns and ns:
            k = int(idx[-1])
            where = f" for shape {k} on link {shape_links[k]!r}"
        rule = "positive" if positive else "non-negative"
        bad_value = float(d.reshape(-1)[int(torch.nonzero(bad.reshape(-1))[0])])
        raise InvalidValueError(f"{kind} {name} must be finite and {rule}{where}; got {bad_value}")
    return t


def resolve_parameters(params: ContactParameters, shape_links, dtype, device) -> dict:
    """Check every value once and turn it into a tensor of the model's dtype.

    Raises:
        InvalidValueError: NaN, infinite or negative values (naming the
            parameter and the shape's link).
        InputError: a wrong shape, dtype or device.
    """
    if not isinstance(params, ContactParameters):
        raise InputError(f"params must be ContactParameters, got {type(params).__name__}")
    out = {}
    for name in _NONNEGATIVE + _POSITIVE:
        out[name] = resolve_value("contact parameter", name, getattr(params, name), name in _POSITIVE, shape_links,
                                  dtype, device)
    out["clamp_normal"] = bool(params.clamp_normal)
    return out


def per_point(t: torch.Tensor, point_shape: torch.Tensor) -> torch.Tensor:
    """A resolved parameter as ``()`` or ``(..., np)``."""
    if t.ndim == 0:
        return t
    if t.shape[-1] == 1:
        return t
    return t.index_select(-1, point_shape)


def contact_law(
    phi: torch.Tensor,
    v_n: torch.Tensor,
    v_t: torch.Tensor,
    *,
    stiffness,
    damping,
    friction,
    normal_width,
    stiction_width,
    clamp_normal: bool = True,
    dt: float | None = None,
    slip2: torch.Tensor | None = None,
):
    """Forces of the law in the module docstring.

    Args:
        phi: ``(..., np)`` penetration, m (positive inside).
        v_n: ``(..., np)`` normal velocity, m/s (positive separating).
        v_t: ``(..., np, 3)`` slip velocity (tangential), m/s.
        stiffness, damping, friction, normal_width, stiction_width:
            ``()`` or ``(..., np)`` tensors.
        dt: the implicit step's length, for the secant in ``k_n`` (see the
            comment there); ``None`` gives the derivative.
        slip2: ``(..., np)`` ``|v_t|^2`` where the caller has it (the fast
            step sums it in its batch-last layout, the same values); ``None``:
            from ``v_t``.

    Returns:
        ``f_n (..., np)`` normal force magnitude (N), ``f_t (..., np, 3)``
        friction force (N), and the derivatives the implicit step needs:
        ``c_n (..., np)`` = ``-d f_n / d v_n``, ``k_n (..., np)`` =
        ``d f_n / d phi`` (its stiffening part), ``s (..., np)`` = ``sqrt(|v_t|^2 + w_t^2)``.
    """
    z = phi / normal_width
    act = torch.sigmoid(z)
    f_n = stiffness * normal_width * F.softplus(z) - damping * v_n * act
    c_n = damping * act
    # d f_n / d phi for the implicit step: the spring, plus the damper
    # switching on while the body approaches. Without the second term a
    # landing foot diverged (the damping force rose from 0 to d |v_n| within
    # one step). Its derivative -d v_n a' / w_n is far too large over a step
    # that travels many widths (an impact then injected energy), so with
    # ``dt`` it is the secant over the step's travel delta = dt |v_n|:
    # d |v_n| (sigmoid(z + delta / w_n) - a) / delta, at most d / dt. Only
    # approach counts, as a smooth positive part of -v_n over the stiction
    # width (no kink at v_n = 0, where resting contacts sit), so K stays
    # positive semi-definite.
    approach = 0.5 * (torch.sqrt(v_n * v_n + stiction_width * stiction_width) - v_n)
    if dt is None:
        onset = approach * act * (1.0 - act) / normal_width
    else:
        onset = (torch.sigmoid(torch.addcmul(z, approach, dt / normal_width)) - act) / dt
    k_n = torch.addcmul(stiffness * act, damping, onset)
    if clamp_normal:
        on = f_n > 0
        f_n = torch.clamp_min(f_n, 0.0)
        c_n = torch.where(on, c_n, torch.zeros_like(c_n))
        k_n = torch.where(on, k_n, torch.zeros_like(k_n))
    # sqrt(|v_t|^2 + w^2) >= w > 0: finite value and gradient at zero slip.
    s = torch.sqrt(((v_t * v_t).sum(-1) if slip2 is None else slip2) + stiction_width * stiction_width)
    # Friction is bounded by the compressive part only (also when unclamped).
    f_t = (-friction * torch.clamp_min(f_n, 0.0) / s).unsqueeze(-1) * v_t
    return f_n, f_t, c_n, k_n, s


def restitution(zeta: float) -> float:
    """Coefficient of restitution of a linear spring-damper with damping ratio ``zeta < 1``."""
    return math.exp(-zeta * math.pi / math.sqrt(1.0 - zeta * zeta))
