"""Small constant tensors of the hot paths, made once per dtype and device."""

from __future__ import annotations

import torch

_CONSTANTS: dict = {}


def constant(values: tuple, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``torch.tensor(values, dtype=dtype, device=device)``, made once per
    ``(values, dtype, device)`` and shared: never modify it in place.

    Made at every call, a constant would be copied from the host to a GPU
    each time, and that copy is a host synchronisation. ``values``: a tuple
    of numbers (or of tuples of numbers), hashable. Under ``torch.compile``
    it is made in the traced graph instead (the compiler keeps it as a
    constant).
    """
    if torch.compiler.is_compiling():
        return torch.tensor(values, dtype=dtype, device=device)
    key = (values, dtype, torch.device(device))
    t = _CONSTANTS.get(key)
    if t is None:
        # A plain tensor even when first made under inference mode: an
        # inference tensor could never be saved for a later backward.
        with torch.inference_mode(False), torch.no_grad():
            t = torch.tensor(values, dtype=dtype, device=device)
        _CONSTANTS[key] = t
    return t
