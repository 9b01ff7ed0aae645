"""Minimisers over one flat parameter vector: Adam, L-BFGS, Levenberg-Marquardt.

They are kept apart from the problems (trajectory optimisation, system
identification): a problem hands over ``x0`` and a function of ``x`` and gets
back the minimiser and the loss history. The loss of a residual vector ``r``
is ``sum(r ** 2)``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ..sim import NonFiniteError
from ._progress import ProgressBar

__all__ = ["SolverResult", "adam", "lbfgs", "levenberg_marquardt", "jacobian", "loss_of"]

Objective = Callable[[torch.Tensor], torch.Tensor]


@dataclass
class SolverResult:
    """What a solver returns.

    Attributes:
        x: the best parameter vector found (detached).
        losses: ``losses[k]`` is the loss after ``k`` iterations (``losses[0]``
            at ``x0``; the last entry is the loss at ``x``).
        evaluations: objective evaluations (each with its gradient or Jacobian).
        iterations: iterations done.
        converged: whether a tolerance (not the iteration limit) stopped it.
        message: why it stopped.
        wall_time: seconds.
    """

    x: torch.Tensor
    losses: list[float] = field(default_factory=list)
    evaluations: int = 0
    iterations: int = 0
    converged: bool = False
    message: str = ""
    wall_time: float = 0.0


def loss_of(out: torch.Tensor) -> torch.Tensor:
    """The scalar loss of an objective output: itself if 0-d, else the sum of
    squares of the residual vector."""
    return out if out.ndim == 0 else (out * out).sum()


def _value_and_grad(fun: Objective, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    x = x.detach().requires_grad_(True)
    with torch.enable_grad():
        loss = loss_of(fun(x))
        (g,) = torch.autograd.grad(loss, x, allow_unused=True)
    if g is None:
        g = torch.zeros_like(x)
    return loss.detach(), g


def _check(loss: torch.Tensor, g: torch.Tensor, it: int) -> float:
    f = float(loss)
    if not math.isfinite(f):
        raise NonFiniteError(f"the loss is {f} at iteration {it}", step=it, what="loss")
    if not bool(torch.isfinite(g).all()):
        raise NonFiniteError(f"the gradient is not finite at iteration {it} (loss {f:.6g})", step=it,
                             what="gradient")
    return f


# ---------------------------------------------------------------------- Adam


def adam(fun: Objective, x0: torch.Tensor, *, iterations: int = 100, lr: float = 0.1,
         betas=(0.9, 0.999), tolerance: float = 0.0, progress: ProgressBar | None = None,
         callback=None, max_time: float | None = None) -> SolverResult:
    """Plain Adam (``torch.optim.Adam``) on ``x``; ``losses[k]`` is the loss at
    the start of epoch ``k``, the last entry the loss of the returned ``x``.
    Stops early when the gradient's largest entry is below ``tolerance``."""
    start = time.perf_counter()
    x = x0.detach().clone().requires_grad_(True)
    opt = torch.optim.Adam([x], lr=lr, betas=betas)
    res = SolverResult(x=x0)
    for k in range(iterations + 1):
        loss, g = _value_and_grad(fun, x)
        res.evaluations += 1
        f = _check(loss, g, k)
        res.losses.append(f)
        if progress is not None:
            progress.update(k, f)
        if callback is not None:
            callback(k, x.detach(), f)
        if k == iterations:
            res.message = "iteration limit"
            break
        if float(g.abs().max()) <= tolerance:
            res.converged, res.message = True, "gradient below tolerance"
            break
        if max_time is not None and time.perf_counter() - start > max_time:
            res.message = "time limit"
            break
        opt.zero_grad(set_to_none=False)
        x.grad = g
        opt.step()
        res.iterations = k + 1
    res.x = x.detach()
    res.wall_time = time.perf_counter() - start
    return res


# ---------------------------------------------------------------------- L-BFGS


def _cubic_step(t1, f1, d1, t2, f2, d2, lo, hi):
    """Minimiser of the cubic through ``(t1, f1, d1)`` and ``(t2, f2, d2)``
    (values and slopes), clipped to ``[lo, hi]``; the midpoint if the cubic has
    no minimum (Nocedal and Wright, eq. 3.59)."""
    if t1 == t2:
        return 0.5 * (lo + hi)
    e1 = d1 + d2 - 3.0 * (f1 - f2) / (t1 - t2)
    disc = e1 * e1 - d1 * d2
    if disc < 0.0 or not math.isfinite(disc):
        return 0.5 * (lo + hi)
    e2 = math.copysign(math.sqrt(disc), t2 - t1)
    denom = d2 - d1 + 2.0 * e2
    if denom == 0.0:
        return 0.5 * (lo + hi)
    t = t2 - (t2 - t1) * (d2 + e2 - e1) / denom
    if not math.isfinite(t):
        return 0.5 * (lo + hi)
    return min(max(t, lo), hi)


def _strong_wolfe(phi, f0: float, d0: float, t: float, *, c1=1e-4, c2=0.9, max_evals=25):
    """Line search for a step meeting the strong Wolfe conditions.

    ``phi(t) -> (f, slope, payload)``. Bracketing then zoom with safeguarded
    cubic interpolation (Nocedal and Wright, algorithms 3.5 and 3.6).

    Returns:
        ``(t, f, payload, evaluations)`` of the best point found (``t = 0`` and
        payload ``None`` if no point decreased the loss).
    """
    evals = 0
    t_prev, f_prev, d_prev, p_prev = 0.0, f0, d0, None
    best = (0.0, f0, None)
    lo = hi = None
    while evals < max_evals:
        f, d, p = phi(t)
        evals += 1
        if math.isfinite(f) and f < best[1]:
            best = (t, f, p)
        if not math.isfinite(f) or f > f0 + c1 * t * d0 or (evals > 1 and f >= f_prev):
            lo, hi = (t_prev, f_prev, d_prev, p_prev), (t, f, d, p)
            break
        if abs(d) <= -c2 * d0:
            return t, f, p, evals
        if d >= 0.0:
            lo, hi = (t, f, d, p), (t_prev, f_prev, d_prev, p_prev)
            break
        t_new = _cubic_step(t_prev, f_prev, d_prev, t, f, d, t + 0.01 * (t - t_prev), 10.0 * t)
        t_prev, f_prev, d_prev, p_prev = t, f, d, p
        t = t_new
    else:
        return (*best, evals)
    # Zoom: lo has the lowest loss meeting sufficient decrease; the minimiser
    # lies between lo and hi.
    while evals < max_evals:
        tl, fl, dl, _ = lo
        th, fh, dh, _ = hi
        a, b = min(tl, th), max(tl, th)
        width = b - a
        if width <= 1e-12 * max(1.0, b):
            break
        if math.isfinite(fh):
            t = _cubic_step(tl, fl, dl, th, fh, dh, a + 0.1 * width, b - 0.1 * width)
        else:
            t = 0.5 * (a + b)
        f, d, p = phi(t)
        evals += 1
        if math.isfinite(f) and f < best[1]:
            best = (t, f, p)
        if not math.isfinite(f) or f > f0 + c1 * t * d0 or f >= fl:
            hi = (t, f, d, p)
        else:
            if abs(d) <= -c2 * d0:
                return t, f, p, evals
            if d * (th - tl) >= 0.0:
                hi = lo
            lo = (t, f, d, p)
    return (*best, evals)


def lbfgs(fun: Objective, x0: torch.Tensor, *, iterations: int = 100, history: int = 50,
          tolerance_grad: float = 1e-10, tolerance_change: float = 1e-12,
          progress: ProgressBar | None = None, callback=None,
          max_time: float | None = None) -> SolverResult:
    """Limited-memory BFGS with a strong-Wolfe line search.

    The search direction is the two-loop recursion over the last ``history``
    step pairs with the initial Hessian ``(s.y / y.y) I``; the first step is
    scaled to unit length at most. Stops when the largest gradient entry is
    below ``tolerance_grad``, when the loss changes by less than
    ``tolerance_change`` (relative), when the line search finds no decrease,
    or after ``iterations``.
    """
    start = time.perf_counter()
    x = x0.detach().clone()
    res = SolverResult(x=x)
    f_t, g = _value_and_grad(fun, x)
    res.evaluations = 1
    f = _check(f_t, g, 0)
    res.losses.append(f)
    if progress is not None:
        progress.update(0, f)
    if callback is not None:
        callback(0, x, f)
    S: list[torch.Tensor] = []
    Y: list[torch.Tensor] = []
    rho: list[float] = []
    for k in range(iterations):
        if float(g.abs().max()) <= tolerance_grad:
            res.converged, res.message = True, "gradient below tolerance"
            break
        if max_time is not None and time.perf_counter() - start > max_time:
            res.message = "time limit"
            break
        # Two-loop recursion: d = -H g.
        qv = g.clone()
        alphas = []
        for s, y, r in zip(reversed(S), reversed(Y), reversed(rho)):
            a = r * float(s @ qv)
            alphas.append(a)
            qv = qv - a * y
        if S:
            gamma = float(S[-1] @ Y[-1]) / float(Y[-1] @ Y[-1])
            qv = qv * gamma
        for (s, y, r), a in zip(zip(S, Y, rho), reversed(alphas)):
            b = r * float(y @ qv)
            qv = qv + (a - b) * s
        d = -qv
        slope = float(g @ d)
        if not slope < 0.0:  # not a descent direction: restart from steepest descent
            S.clear(), Y.clear(), rho.clear()
            d = -g
            slope = float(g @ d)
        t0 = 1.0 if S else min(1.0, 1.0 / max(float(g.abs().sum()), 1e-300))

        def phi(t, x=x, d=d):
            xt = x + t * d
            ft, gt = _value_and_grad(fun, xt)
            fv = float(ft)
            return fv, float(gt @ d) if math.isfinite(fv) else math.nan, (xt, gt)

        t, f_new, payload, evals = _strong_wolfe(phi, f, slope, t0)
        res.evaluations += evals
        if payload is None:
            res.message = "line search found no decrease"
            res.converged = True
            break
        x_new, g_new = payload
        _check(torch.tensor(f_new), g_new, k + 1)
        s = x_new - x
        y = g_new - g
        sy = float(s @ y)
        if sy > 1e-10 * float(y @ y):
            S.append(s)
            Y.append(y)
            rho.append(1.0 / sy)
            if len(S) > history:
                S.pop(0), Y.pop(0), rho.pop(0)
        change = abs(f - f_new)
        x, g, f = x_new, g_new, f_new
        res.losses.append(f)
        res.iterations = k + 1
        if progress is not None:
            progress.update(k + 1, f)
        if callback is not None:
            callback(k + 1, x, f)
        if change <= tolerance_change * max(abs(f), 1e-300):
            res.converged, res.message = True, "loss change below tolerance"
            break
    else:
        res.message = "iteration limit"
    res.x = x
    res.wall_time = time.perf_counter() - start
    return res


# ---------------------------------------------------------------------- Gauss-Newton


def jacobian(fun: Objective, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Residuals ``r (m,)`` and their Jacobian ``J (m, n)`` at ``x (n,)``.

    Uses ``torch.func.jacrev`` (reverse mode vectorised over the residuals;
    measured several times faster than forward mode through a rollout); if
    the function uses an operation ``torch.func`` cannot batch, falls back to
    one reverse pass per residual.
    """
    x = x.detach()
    with torch.enable_grad():
        r0 = fun(x.clone().requires_grad_(True))
    m, n = r0.numel(), x.numel()
    try:
        J = torch.func.jacrev(fun)(x).reshape(m, n)
        return r0.detach().reshape(-1), J.detach()
    except (RuntimeError, NotImplementedError, TypeError):
        pass
    xr = x.clone().requires_grad_(True)
    with torch.enable_grad():
        r = fun(xr).reshape(-1)
        rows = []
        for i in range(m):
            (gi,) = torch.autograd.grad(r[i], xr, retain_graph=i < m - 1, allow_unused=True)
            rows.append(torch.zeros_like(x) if gi is None else gi)
    return r.detach(), torch.stack(rows)


def levenberg_marquardt(fun: Objective, x0: torch.Tensor, *, iterations: int = 50,
                        damping: float = 1e-3, tolerance: float = 1e-12,
                        tolerance_grad: float = 1e-12, jacobian_fun=None,
                        progress: ProgressBar | None = None, callback=None,
                        max_time: float | None = None) -> SolverResult:
    """Levenberg-Marquardt on a residual function ``fun(x) -> r (m,)``.

    Each iteration solves ``(J^T J + lam * diag(J^T J)) dx = -J^T r`` (the
    diagonal floored so that unexcited parameters stay put) and accepts the
    step if the loss ``sum(r ** 2)`` decreases, shrinking ``lam`` by 10;
    otherwise ``lam`` grows by 4 and the step is retried.

    Args:
        fun: residuals of ``x``; ``fun(x)`` must be a vector (not a scalar).
        damping: initial ``lam``.
        jacobian_fun: ``x -> (r, J)`` to replace :func:`jacobian`.
    """
    start = time.perf_counter()
    jac = jacobian if jacobian_fun is None else jacobian_fun
    x = x0.detach().clone()
    res = SolverResult(x=x)
    r, J = jac(fun, x) if jacobian_fun is None else jac(x)
    res.evaluations = 1
    f = float(r @ r)
    if not math.isfinite(f):
        raise NonFiniteError(f"the loss is {f} at iteration 0", step=0, what="loss")
    res.losses.append(f)
    if progress is not None:
        progress.update(0, f)
    if callback is not None:
        callback(0, x, f)
    lam = damping
    eye = torch.eye(x.numel(), dtype=x.dtype, device=x.device)
    for k in range(iterations):
        g = J.T @ r
        if float(g.abs().max()) <= tolerance_grad:
            res.converged, res.message = True, "gradient below tolerance"
            break
        if max_time is not None and time.perf_counter() - start > max_time:
            res.message = "time limit"
            break
        A = J.T @ J
        diag = torch.diagonal(A).clamp_min(1e-12 * float(torch.diagonal(A).max().clamp_min(1e-300)))
        accepted = False
        for _ in range(30):
            try:
                step = torch.linalg.solve(A + lam * torch.diag(diag) + 1e-15 * eye, -g)
            except RuntimeError:
                lam *= 4.0
                continue
            x_new = x + step
            with torch.no_grad():
                r_new = fun(x_new).reshape(-1)
            res.evaluations += 1
            f_new = float(r_new @ r_new)
            if math.isfinite(f_new) and f_new < f:
                accepted = True
                break
            lam *= 4.0
        if not accepted:
            res.converged, res.message = True, "no decrease along the damped Gauss-Newton step"
            break
        lam = max(lam / 10.0, 1e-12)
        change = f - f_new
        x = x_new
        r, J = jac(fun, x) if jacobian_fun is None else jac(x)
        res.evaluations += 1
        f = float(r @ r)
        res.losses.append(f)
        res.iterations = k + 1
        if progress is not None:
            progress.update(k + 1, f)
        if callback is not None:
            callback(k + 1, x, f)
        if change <= tolerance * max(f, 1e-300):
            res.converged, res.message = True, "loss change below tolerance"
            break
    else:
        res.message = "iteration limit"
    res.x = x
    res.wall_time = time.perf_counter() - start
    return res
