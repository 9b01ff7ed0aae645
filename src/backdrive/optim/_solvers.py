"""Minimisers over one flat parameter vector: Adam, L-BFGS, Levenberg-Marquardt.

They are kept apart from the problems (trajectory optimisation, system
identification): a problem hands over ``x0``, a function of ``x`` and one
:class:`SolverOptions`, and :func:`minimize` returns the minimiser and the
loss history. The loss of a residual vector ``r`` is ``sum(r ** 2)``.

:class:`SolverOptions` is the only place where the solver settings
(iteration limit, tolerances, learning rate, progress bar, callback, time
limit) are declared, validated and given their defaults; :func:`minimize` is
the only name-to-solver dispatch.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from .._errors import ConfigError, closest_names
from ..sim import NonFiniteError
from ._progress import ProgressBar

__all__ = [
    "SolverOptions",
    "SolverResult",
    "OPTIMIZERS",
    "DEFAULT_ITERATIONS",
    "minimize",
    "adam",
    "lbfgs",
    "levenberg_marquardt",
    "jacobian",
    "loss_of",
    "options_from_keywords",
]

Objective = Callable[[torch.Tensor], torch.Tensor]

#: The solver names :func:`minimize` dispatches on.
OPTIMIZERS = ("lbfgs", "adam", "gauss_newton")

#: Iteration limit of each solver when :attr:`SolverOptions.iterations` is ``None``.
DEFAULT_ITERATIONS = {"lbfgs": 100, "adam": 100, "gauss_newton": 50}

# Settings that only some solvers read, with their defaults there. A setting
# given for a solver that does not read it is reported, never dropped quietly.
_METHOD_DEFAULTS = {
    "lr": {"adam": 0.1},
    "betas": {"adam": (0.9, 0.999)},
    "history": {"lbfgs": 50},
    "damping": {"gauss_newton": 1e-3},
    "tolerance": {"lbfgs": 1e-12, "gauss_newton": 1e-12},
    "gradient_tolerance": {"adam": 0.0, "lbfgs": 1e-10, "gauss_newton": 1e-12},
}


def _is_real(x) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isfinite(float(x))


@dataclass(frozen=True)
class SolverOptions:
    """Settings of :func:`minimize`, validated at construction.

    Every field but ``method`` may be left ``None``: the solver's default (or
    the problem's, e.g. :func:`~backdrive.optim.identify` starts Adam at a
    learning rate of 0.01 in log-parameter units) is used. A setting that the
    chosen solver does not read (``damping`` with ``method="adam"``) raises a
    ``UserWarning`` naming it.

    Attributes:
        method: ``"lbfgs"`` (L-BFGS with a strong-Wolfe line search),
            ``"adam"`` (``torch.optim.Adam``) or ``"gauss_newton"``
            (Levenberg-Marquardt on a residual vector).
        iterations: iteration limit (default :data:`DEFAULT_ITERATIONS`:
            100 for L-BFGS and Adam, 50 for Gauss-Newton).
        tolerance: L-BFGS and Gauss-Newton stop when the loss changes by less
            than this, relative (default 1e-12).
        gradient_tolerance: stop when the largest gradient entry is at most
            this (default 0 for Adam, 1e-10 for L-BFGS, 1e-12 for
            Gauss-Newton; for Gauss-Newton the gradient is ``J^T r``).
        lr: Adam's learning rate (default 0.1), in the units of ``x``.
        betas: Adam's moment decay rates (default ``(0.9, 0.999)``).
        history: step pairs L-BFGS keeps (default 50).
        damping: Levenberg-Marquardt's initial ``lambda`` (default 1e-3).
        progress: show a one-line progress bar; ``None`` (default) shows it
            when standard error is a terminal.
        callback: ``callback(iteration, x, loss)`` after each iteration
            (``x`` is the flat parameter vector, detached).
        max_time: stop after about this many seconds (``None``: no limit).

    Raises:
        ConfigError: a setting of the wrong type or out of range, or an
            unknown ``method`` (the message names the valid ones).
    """

    method: str = "lbfgs"
    iterations: int | None = None
    tolerance: float | None = None
    gradient_tolerance: float | None = None
    lr: float | None = None
    betas: tuple[float, float] | None = None
    history: int | None = None
    damping: float | None = None
    progress: bool | None = None
    callback: Callable[[int, torch.Tensor, float], None] | None = None
    max_time: float | None = None

    def __post_init__(self):
        m = self.method
        if not isinstance(m, str) or m not in OPTIMIZERS:
            close = closest_names(m, OPTIMIZERS) if isinstance(m, str) else []
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"SolverOptions.method must be one of {', '.join(map(repr, OPTIMIZERS))}; "
                              f"got {m!r}{hint}")
        it = self.iterations
        if it is not None and not (isinstance(it, numbers.Integral) and not isinstance(it, bool) and it >= 0):
            raise ConfigError(f"SolverOptions.iterations must be a non-negative int or None, got {it!r}")
        for name in ("tolerance", "gradient_tolerance"):
            x = getattr(self, name)
            if x is not None and not (_is_real(x) and x >= 0):
                raise ConfigError(f"SolverOptions.{name} must be a finite number >= 0 or None, got {x!r}")
        for name in ("lr", "damping"):
            x = getattr(self, name)
            if x is not None and not (_is_real(x) and x > 0):
                raise ConfigError(f"SolverOptions.{name} must be a finite number > 0 or None, got {x!r}")
        b = self.betas
        if b is not None and not (
            isinstance(b, (tuple, list)) and len(b) == 2 and all(_is_real(x) and 0 <= x < 1 for x in b)
        ):
            raise ConfigError(f"SolverOptions.betas must be two numbers in [0, 1) or None, got {b!r}")
        if b is not None:
            object.__setattr__(self, "betas", (float(b[0]), float(b[1])))
        h = self.history
        if h is not None and not (isinstance(h, numbers.Integral) and not isinstance(h, bool) and h >= 1):
            raise ConfigError(f"SolverOptions.history must be a positive int or None, got {h!r}")
        if self.progress is not None and not isinstance(self.progress, bool):
            raise ConfigError(f"SolverOptions.progress must be True, False or None, got {self.progress!r}")
        if self.callback is not None and not callable(self.callback):
            raise ConfigError(f"SolverOptions.callback must be callable or None, got {self.callback!r}")
        t = self.max_time
        if t is not None and not (isinstance(t, numbers.Real) and not isinstance(t, bool) and t > 0):
            raise ConfigError(f"SolverOptions.max_time must be a number of seconds > 0 or None, got {t!r}")
        ignored = [n for n in self.ignored()]
        if ignored:
            warnings.warn(
                f"SolverOptions: {', '.join(ignored)} "
                f"{'does' if len(ignored) == 1 else 'do'} not apply to method={m!r} and "
                f"{'is' if len(ignored) == 1 else 'are'} ignored ("
                + "; ".join(f"{n} is read by {', '.join(_METHOD_DEFAULTS[n])}" for n in ignored) + ")",
                UserWarning,
                stacklevel=3,
            )

    def ignored(self) -> list[str]:
        """Names of the settings that are set but not read by :attr:`method`."""
        return [n for n, by in _METHOD_DEFAULTS.items() if getattr(self, n) is not None and self.method not in by]

    def get(self, name: str):
        """The value of setting ``name`` for :attr:`method`: the given one or the solver's default."""
        value = getattr(self, name)
        if value is not None:
            return value
        if name == "iterations":
            return DEFAULT_ITERATIONS[self.method]
        return _METHOD_DEFAULTS.get(name, {}).get(self.method)

    def replace(self, **changes) -> SolverOptions:
        """A copy with some settings changed (validated again)."""
        return dataclasses.replace(self, **changes)

    def with_defaults(self, **defaults) -> SolverOptions:
        """A copy in which the settings still ``None`` take ``defaults``, for
        the ones :attr:`method` reads (a problem's own defaults)."""
        fill = {k: v for k, v in defaults.items()
                if getattr(self, k) is None and (k not in _METHOD_DEFAULTS or self.method in _METHOD_DEFAULTS[k])}
        return dataclasses.replace(self, **fill) if fill else self


@dataclass
class SolverResult:
    """What :func:`minimize` returns.

    Attributes:
        x: the best parameter vector found (detached).
        losses: ``losses[k]`` is the loss after ``k`` iterations (``losses[0]``
            at ``x0``; the last entry is the loss at ``x``; Adam: the loss at
            the start of epoch ``k``).
        evaluations: objective evaluations (each with its gradient or Jacobian).
        iterations: iterations done.
        converged: whether a tolerance (not the iteration limit) stopped it.
        message: why it stopped.
        wall_time: seconds.
        method: the solver that ran.
        jacobian: ``(m, n)`` residual Jacobian at ``x`` where the solver
            computed it (Gauss-Newton; a :class:`BlockJacobian` where the
            ``jacobian_fun`` gave one), else ``None``.
    """

    x: torch.Tensor
    losses: list[float] = field(default_factory=list)
    evaluations: int = 0
    iterations: int = 0
    converged: bool = False
    message: str = ""
    wall_time: float = 0.0
    method: str = ""
    jacobian: torch.Tensor | None = None


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


class _Report:
    """Progress bar and callback of one solve."""

    def __init__(self, opts: SolverOptions, bar: ProgressBar | None):
        self.bar = bar
        self.callback = opts.callback

    def __call__(self, k: int, x: torch.Tensor, f: float) -> None:
        if self.bar is not None:
            self.bar.update(k, f)
        if self.callback is not None:
            self.callback(k, x, f)


# ---------------------------------------------------------------------- dispatch


def minimize(fun: Objective, x0: torch.Tensor, options: SolverOptions | None = None, *,
             jacobian_fun: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]] | None = None,
             label: str = "minimize") -> SolverResult:
    """Minimise ``fun`` over the flat vector ``x`` with the solver ``options.method``.

    Args:
        fun: ``x (n,) ->`` a 0-d loss or a residual vector ``r (m,)`` whose
            sum of squares is the loss (``"gauss_newton"`` needs the vector).
        x0: ``(n,)`` start.
        options: :class:`SolverOptions` (default: L-BFGS with its defaults).
        jacobian_fun: ``x -> (r (m,), J (m, n))`` for Gauss-Newton, to replace
            :func:`jacobian` (e.g. an exact or cheaper Jacobian).
        label: text before the progress bar.

    Returns:
        :class:`SolverResult`.
    """
    opts = SolverOptions() if options is None else options
    if not isinstance(opts, SolverOptions):
        raise ConfigError(f"options must be a SolverOptions, got {type(opts).__name__}")
    bar = ProgressBar(opts.get("iterations"), f"{label}[{opts.method}]", enabled=opts.progress)
    res = _run(fun, x0, opts, jacobian_fun, bar)
    bar.close(res.iterations, res.losses[-1])
    return res


def _run(fun, x0, opts: SolverOptions, jacobian_fun, bar) -> SolverResult:
    report = _Report(opts, bar)
    if opts.method == "adam":
        res = _adam(fun, x0, opts, report)
    elif opts.method == "lbfgs":
        res = _lbfgs(fun, x0, opts, report)
    else:
        res = _levenberg_marquardt(fun, x0, opts, report, jacobian_fun)
    res.method = opts.method
    return res


# Renamed keywords of the per-solver functions, kept working for a release.
_LEGACY = {
    "adam": {"tolerance": "gradient_tolerance"},
    "lbfgs": {"tolerance_grad": "gradient_tolerance", "tolerance_change": "tolerance"},
    "gauss_newton": {"tolerance_grad": "gradient_tolerance"},
}


def _solve_with(method: str, fun, x0, kwargs: dict, jacobian_fun=None) -> SolverResult:
    """The per-solver functions: keywords become :class:`SolverOptions`; a
    :class:`ProgressBar` object (the old ``progress``) is drawn but not closed."""
    for old, new in _LEGACY[method].items():
        if old in kwargs:
            kwargs[new] = kwargs.pop(old)
    bar = kwargs.get("progress")
    if isinstance(bar, ProgressBar):
        del kwargs["progress"]
    else:
        bar = None
    valid = {f.name for f in dataclasses.fields(SolverOptions)} - {"method"}
    unknown = sorted(set(kwargs) - valid)
    if unknown:
        raise ConfigError(f"unknown setting(s) {', '.join(map(repr, unknown))} for {method}; "
                          f"valid: {', '.join(sorted(valid))}")
    return _run(fun, x0, SolverOptions(method=method, **kwargs), jacobian_fun, bar)


def adam(fun: Objective, x0: torch.Tensor, **options) -> SolverResult:
    """:func:`minimize` with ``method="adam"``; keywords are :class:`SolverOptions` fields."""
    return _solve_with("adam", fun, x0, options)


def lbfgs(fun: Objective, x0: torch.Tensor, **options) -> SolverResult:
    """:func:`minimize` with ``method="lbfgs"``; keywords are :class:`SolverOptions` fields."""
    return _solve_with("lbfgs", fun, x0, options)


def levenberg_marquardt(fun: Objective, x0: torch.Tensor, *, jacobian_fun=None, **options) -> SolverResult:
    """:func:`minimize` with ``method="gauss_newton"``; keywords are
    :class:`SolverOptions` fields, ``jacobian_fun`` as in :func:`minimize`."""
    return _solve_with("gauss_newton", fun, x0, options, jacobian_fun)


# Keywords that optimize_trajectory and identify took before SolverOptions,
# kept working for a release: old name -> SolverOptions field.
_OLD_KEYWORDS = {"optimizer": "method", "iterations": "iterations", "lr": "lr", "tolerance": "tolerance",
                 "progress": "progress", "callback": "callback", "max_time": "max_time"}


def options_from_keywords(where: str, options: SolverOptions | None, legacy: dict, *,
                          default_method: str) -> SolverOptions:
    """The :class:`SolverOptions` of a problem function: ``options``, or one
    built from the old keywords in ``legacy`` (removed from it) with a
    ``DeprecationWarning``; both at once is a :class:`ConfigError`."""
    old = {k: legacy.pop(k) for k in list(legacy) if k in _OLD_KEYWORDS}
    old = {k: v for k, v in old.items() if not (k == "optimizer" and v is None)}
    if options is not None and not isinstance(options, SolverOptions):
        raise ConfigError(f"{where}: options must be a SolverOptions, got {type(options).__name__}")
    if not old:
        return SolverOptions(method=default_method) if options is None else options
    if options is not None:
        raise ConfigError(f"{where}: give the solver settings either in options= or as the old keywords "
                          f"({', '.join(old)}), not both")
    new = {_OLD_KEYWORDS[k]: v for k, v in old.items()}
    new.setdefault("method", default_method)
    warnings.warn(
        f"{where}({', '.join(f'{k}=...' for k in old)}) is deprecated and will be removed in the next "
        f"release; pass options=SolverOptions({', '.join(f'{k}=...' for k in new)})",
        DeprecationWarning,
        stacklevel=3,
    )
    return SolverOptions(**new)


# ---------------------------------------------------------------------- Adam


def _adam(fun: Objective, x0: torch.Tensor, opts: SolverOptions, report: _Report) -> SolverResult:
    """Plain Adam (``torch.optim.Adam``) on ``x``; ``losses[k]`` is the loss at
    the start of epoch ``k``, the last entry the loss of the returned ``x``.
    Stops early when the gradient's largest entry is at most
    ``gradient_tolerance``."""
    iterations, tolerance, max_time = opts.get("iterations"), opts.get("gradient_tolerance"), opts.max_time
    start = time.perf_counter()
    x = x0.detach().clone().requires_grad_(True)
    opt = torch.optim.Adam([x], lr=opts.get("lr"), betas=opts.get("betas"))
    res = SolverResult(x=x0)
    for k in range(iterations + 1):
        loss, g = _value_and_grad(fun, x)
        res.evaluations += 1
        f = _check(loss, g, k)
        res.losses.append(f)
        report(k, x.detach(), f)
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


def _lbfgs(fun: Objective, x0: torch.Tensor, opts: SolverOptions, report: _Report) -> SolverResult:
    """Limited-memory BFGS with a strong-Wolfe line search.

    The search direction is the two-loop recursion over the last ``history``
    step pairs with the initial Hessian ``(s.y / y.y) I``; the first step is
    scaled to unit length at most. Stops when the largest gradient entry is
    at most ``gradient_tolerance``, when the loss changes by less than
    ``tolerance`` (relative), when the line search finds no decrease, or
    after ``iterations``.
    """
    iterations, history, max_time = opts.get("iterations"), opts.get("history"), opts.max_time
    tolerance_grad, tolerance_change = opts.get("gradient_tolerance"), opts.get("tolerance")
    start = time.perf_counter()
    x = x0.detach().clone()
    res = SolverResult(x=x)
    f_t, g = _value_and_grad(fun, x)
    res.evaluations = 1
    f = _check(f_t, g, 0)
    res.losses.append(f)
    report(0, x, f)
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
        report(k + 1, x, f)
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
    if r0.ndim == 0:
        raise ConfigError("gauss_newton needs the objective to return a vector of residuals, not a scalar loss")
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


def _levenberg_marquardt(fun: Objective, x0: torch.Tensor, opts: SolverOptions, report: _Report,
                         jacobian_fun=None) -> SolverResult:
    """Levenberg-Marquardt on a residual function ``fun(x) -> r (m,)``.

    Each iteration solves ``(J^T J + lam * diag(J^T J)) dx = -J^T r`` (the
    diagonal floored so that unexcited parameters stay put) and accepts the
    step if the loss ``sum(r ** 2)`` decreases, shrinking ``lam`` by 10;
    otherwise ``lam`` grows by 4 and the step is retried.

    ``fun(x)`` must be a vector (not a scalar); ``damping`` is the initial
    ``lam``; ``jacobian_fun`` (``x -> (r, J)``) replaces :func:`jacobian`
    and may give ``J`` as a :class:`BlockJacobian` (per-window unknowns,
    eliminated by a Schur complement).
    """
    iterations, damping, max_time = opts.get("iterations"), opts.get("damping"), opts.max_time
    tolerance, tolerance_grad = opts.get("tolerance"), opts.get("gradient_tolerance")
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
    report(0, x, f)
    lam = damping
    for k in range(iterations):
        g, solve = _normal_equations(J, r)
        if float(g.abs().max()) <= tolerance_grad:
            res.converged, res.message = True, "gradient below tolerance"
            break
        if max_time is not None and time.perf_counter() - start > max_time:
            res.message = "time limit"
            break
        accepted = False
        for _ in range(30):
            try:
                step = solve(lam)
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
        report(k + 1, x, f)
        if change <= tolerance * max(f, 1e-300):
            res.converged, res.message = True, "loss change below tolerance"
            break
    else:
        res.message = "iteration limit"
    res.x = x
    res.jacobian = J
    res.wall_time = time.perf_counter() - start
    return res


def _floored(d: torch.Tensor, top: torch.Tensor) -> torch.Tensor:
    """Levenberg-Marquardt's scaling diagonal, floored at ``1e-12`` of its
    largest entry so that an unexcited coordinate stays put."""
    return d.clamp_min(1e-12 * float(top.clamp_min(1e-300)))


def _normal_equations(J, r: torch.Tensor):
    """The gradient ``J^T r`` and ``lam -> step``, the solution of
    ``(J^T J + lam diag(J^T J)) step = -J^T r``, for a dense ``J`` or a
    :class:`BlockJacobian`."""
    if isinstance(J, BlockJacobian):
        return J.normal_equations(r)
    g = J.T @ r
    A = J.T @ J
    diag = _floored(torch.diagonal(A), torch.diagonal(A).max())
    eye = torch.eye(A.shape[0], dtype=A.dtype, device=A.device)
    return g, lambda lam: torch.linalg.solve(A + lam * torch.diag(diag) + 1e-15 * eye, -g)


@dataclass(frozen=True)
class BlockJacobian:
    """A residual Jacobian with the arrow structure of multiple shooting with
    unknowns of each window's own (e.g. its start state).

    The unknowns are ``x = [theta (p), s_1 (n), ..., s_W (n)]`` and the
    residuals ``r = [r_1 (m), ..., r_W (m), r_extra (e)]``: window ``w``'s
    rows depend on the shared ``theta`` and on its own ``s_w`` only, the
    extra rows (priors on ``theta``) on ``theta`` only. Stored are the
    non-zero blocks; a Gauss-Newton step then costs ``W`` small ``(n, n)``
    solves and one ``(p, p)`` solve (the Schur complement of the local
    blocks), not a solve with ``p + W n`` unknowns.

    Attributes:
        shared: ``(W, m, p)`` d r_w / d theta.
        local: ``(W, m, n)`` d r_w / d s_w.
        extra: ``(e, p)`` d r_extra / d theta (``e`` may be 0).
    """

    shared: torch.Tensor
    local: torch.Tensor
    extra: torch.Tensor

    @property
    def shape(self) -> tuple[int, int]:
        W, m, p = self.shared.shape
        return W * m + self.extra.shape[0], p + W * self.local.shape[-1]

    def normal_equations(self, r: torch.Tensor):
        """``(g, solve)`` as :func:`_normal_equations`, by block elimination."""
        Js, Jl, Je = self.shared, self.local, self.extra
        W, m, p = Js.shape
        n = Jl.shape[-1]
        rw, re = r[: W * m].reshape(W, m), r[W * m:]
        g_t = torch.einsum("wmp,wm->p", Js, rw) + Je.T @ re
        g_s = torch.einsum("wmn,wm->wn", Jl, rw)
        A_tt = torch.einsum("wmp,wmq->pq", Js, Js) + Je.T @ Je
        A_ts = torch.einsum("wmp,wmn->wpn", Js, Jl)
        A_ss = torch.einsum("wmn,wmk->wnk", Jl, Jl)
        d_t, d_s = torch.diagonal(A_tt), torch.diagonal(A_ss, dim1=-2, dim2=-1)
        top = torch.maximum(d_t.max() if p else d_t.new_zeros(()), d_s.max())
        d_t, d_s = _floored(d_t, top), _floored(d_s, top)
        eye_t = torch.eye(p, dtype=r.dtype, device=r.device)
        eye_s = torch.eye(n, dtype=r.dtype, device=r.device)

        def solve(lam):
            B = A_ss + torch.diag_embed(lam * d_s) + 1e-15 * eye_s
            X = torch.linalg.solve(B, A_ts.transpose(-1, -2))  # (W, n, p)
            y = torch.linalg.solve(B, g_s.unsqueeze(-1)).squeeze(-1)  # (W, n)
            S = A_tt + torch.diag(lam * d_t) + 1e-15 * eye_t - torch.einsum("wpn,wnq->pq", A_ts, X)
            rhs = -g_t + torch.einsum("wpn,wn->p", A_ts, y)
            step_t = torch.linalg.solve(S, rhs) if p else rhs
            step_s = -(y + torch.einsum("wnp,p->wn", X, step_t))
            return torch.cat([step_t, step_s.reshape(-1)])

        return torch.cat([g_t, g_s.reshape(-1)]), solve

    def reduced(self) -> torch.Tensor:
        """``(W m + e, p)``: the shared columns with each window's local
        directions projected out, whose ``J^T J`` is the Schur complement:
        the information on ``theta`` with the local unknowns marginalised
        (what Cramer-Rao intervals of ``theta`` need)."""
        Q = torch.linalg.qr(self.local, mode="reduced").Q  # (W, m, n)
        proj = self.shared - Q @ (Q.transpose(-1, -2) @ self.shared)
        W, m, p = self.shared.shape
        return torch.cat([proj.reshape(W * m, p), self.extra])
