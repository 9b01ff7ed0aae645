"""Process settings: fast large CPU batches, the thread count of backdrive's
loops (:class:`threads_for_batch`), and an opt-in check for NaN and inf.

Non-finite checking
-------------------

NaN inputs pass through the kinematics, dynamics and IK without a word, as
in torch itself: checking every output costs a host synchronisation per
call. :func:`check_finite` turns the check on, as a context manager or for
the rest of the process::

    with backdrive.runtime.check_finite():
        T = forward_kinematics(model, q)     # raises NonFiniteError if T has a NaN

    backdrive.runtime.check_finite(True)   # from now on (returns the old setting)

The first public call whose output holds a NaN or an infinity raises
:class:`~backdrive.NonFiniteError` naming the function, the output, and the
non-finite argument that caused it (or saying that every argument was finite,
so the computation itself failed, e.g. a singular mass matrix). The setting
is per thread. Functions under ``torch.func`` transforms and
``torch.compile`` are not checked (their values cannot be read there).

Fast large batches
------------------

Torch allocates every intermediate array of a CPU operation afresh, through
the C library's ``malloc``. glibc serves arrays above its mmap threshold
(128 KiB to start with) with fresh pages from the system and returns the top
of its heap to the system once more than its trim threshold (twice the mmap
threshold) is free. At 10,000 samples the intermediate arrays of the
dynamics are 40 KiB to 3 MiB each, and the memory of one call goes back to
the system at its end; the next call then faults every page in again.
Measured for forward dynamics of the Panda at 10,000 samples in float32:
about 7,400 page faults and twice the time of a call without them.

:class:`reuse_workspaces` keeps the fast path's large arrays for reuse
inside a block (backdrive's simulator and trainers open one), with no change
to the allocator. :func:`retain_freed_memory` keeps all freed memory in the
process, bounded, so that each call reuses the pages of the last one. It is
not applied on import: it changes the allocator of the whole process. ``docs/dynamics.md`` ("Large
batches on the CPU") has the measurements.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import math
import os
import sys
import time

import functools
import inspect
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import fields, is_dataclass
from typing import Any, TypeVar

import torch

from ._errors import InputError, NonFiniteError

__all__ = [
    "retain_freed_memory",
    "check_finite",
    "checking_finite",
    "finite_checked",
    "assert_finite",
    "adaptive_threads",
    "threads_for_batch",
    "SMALL_BATCH",
    "BUSY_CORE_SHARE",
    "threads_for_load",
    "other_load",
    "available_cores",
    "reuse_workspaces",
]

# glibc's mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
#: The largest block glibc serves from its heaps when it adjusts the mmap
#: threshold by itself (``DEFAULT_MMAP_THRESHOLD_MAX`` on 64-bit systems).
_MMAP_THRESHOLD = 32 << 20


def retain_freed_memory(max_bytes: int = 256 << 20) -> bool:
    """Keep freed CPU memory in the process for reuse (glibc's ``malloc`` only).

    Sets ``M_MMAP_THRESHOLD`` to 32 MiB (blocks up to that size come from the
    heap, the most glibc chooses by itself when it adjusts the threshold) and
    ``M_TRIM_THRESHOLD`` to ``max_bytes`` (free memory at the top of a heap
    goes back to the system only beyond that). Repeated large-batch calls
    then reuse the same pages instead of faulting in fresh ones: measured at
    10,000 samples, forward dynamics takes about half the time. It affects
    every allocation of the process, torch's included, for the rest of its
    life, and the process may hold up to ``max_bytes`` of free memory per
    heap. The same settings can be given without code through glibc's
    environment variables ``MALLOC_MMAP_THRESHOLD_=33554432`` and
    ``MALLOC_TRIM_THRESHOLD_=<max_bytes>``.

    Args:
        max_bytes: free memory a heap keeps before returning any to the
            system (default 256 MiB; at most ``2**31 - 1``).

    Returns:
        ``True`` when the settings were applied; ``False`` where the C
        library is not glibc (nothing is changed).

    Raises:
        InputError: ``max_bytes`` is not an integer in ``[0, 2**31 - 1]``.
    """
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or not 0 <= max_bytes < 2**31:
        raise InputError(f"max_bytes must be an integer in [0, 2**31 - 1], got {max_bytes!r}")
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.gnu_get_libc_version  # glibc only (musl has a mallopt that does nothing)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD)) and bool(mallopt(_M_TRIM_THRESHOLD, max_bytes))


# --------------------------------------------------------------------------- thread count

#: Batches below this many samples run on one torch thread inside backdrive's
#: own loops (:meth:`Simulator.rollout <backdrive.sim.Simulator.rollout>`,
#: policy training). Their operations are microseconds long: a parallel
#: region then costs more in hand-offs than it gains, and with another
#: process busy on one core every region waits for a descheduled thread.
#: Measured on 2 cores with other jobs running: 10 updates of the pendulum
#: SHAC preset took 7.6 s on one thread and 53.5 s on two.
SMALL_BATCH = 1024

#: A core counts as taken by other processes when they keep it busy more than
#: this share of the time (see :func:`threads_for_load`): a parallel region
#: waits for its slowest thread, so even a part-time competitor on a core
#: stalls every region whose thread it displaces.
BUSY_CORE_SHARE = 0.25

_adaptive = True


def adaptive_threads(enabled: bool | None = None) -> bool:
    """Whether backdrive's loops choose their torch thread count; set it with ``enabled``.

    On by default. When on, :class:`threads_for_batch` lowers torch's
    intra-op thread count for the duration of a rollout or a training run:
    to 1 when its batch is below :data:`SMALL_BATCH` samples, and for larger
    batches to the cores that other processes leave free
    (:func:`threads_for_load`); it restores the count afterwards. Turn it
    off to keep ``torch.get_num_threads()`` untouched.

    Args:
        enabled: the new setting, or ``None`` to only read it.

    Returns:
        The setting before the call.
    """
    global _adaptive
    previous = _adaptive
    if enabled is not None:
        if not isinstance(enabled, bool):
            raise InputError(f"adaptive_threads(enabled) takes a bool or None, got {enabled!r}")
        _adaptive = enabled
    return previous


def threads_for_load(threads: int, cores: int, others: float) -> int:
    """The thread count for a large batch when other processes keep ``others``
    cores busy: the free cores, at least 1 and at most ``threads``.

    A core counts as taken from a share :data:`BUSY_CORE_SHARE` of it on
    (``others = 0.3`` takes one core, ``1.2`` one, ``1.3`` two). Why: torch's
    parallel regions wait for their slowest thread, and a thread that shares
    its core with another process's is descheduled for whole time slices.
    Measured on 2 cores with other jobs running: forward dynamics of the
    quadruped at 10,000 samples took 7.5 s on 2 threads and 0.54 s on 1
    (medians; ``docs/dynamics.md``, "Large batches on the CPU").

    Args:
        threads: torch's thread count (the most to use).
        cores: the cores this process may run on.
        others: cores' worth of runnable work of other processes (see
            :func:`other_load`).
    """
    taken = max(0, math.ceil(others - BUSY_CORE_SHARE))
    return max(1, min(threads, cores - taken))


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity where the system
    tells, else ``os.cpu_count()``)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _runnable_now() -> tuple[int, int] | None:
    """``(runnable tasks system-wide, this process's runnable threads)`` at
    this instant (Linux ``/proc``), or ``None`` where the system does not tell."""
    try:
        with open("/proc/loadavg") as f:
            running = int(f.read().split()[3].split("/")[0])
        own = 0
        for tid in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{tid}/stat") as f:
                    # The state follows the command name, which is in parentheses.
                    own += f.read().rpartition(")")[2].split()[0] == "R"
            except (OSError, IndexError):  # the thread ended meanwhile
                continue
        return running, max(own, 1)  # the reading thread itself runs
    except (OSError, ValueError, IndexError):
        return None


class _LoadAverage:
    """Other processes' runnable work, averaged over this process's probes
    with a 10 s time constant (an intermittent competitor counts at its
    average; one busy now counts in full)."""

    TIME_CONSTANT = 10.0

    def __init__(self):
        self.time: float | None = None
        self.value = 0.0

    def update(self, sample: float, now: float) -> float:
        if self.time is None:
            self.value = sample
        else:
            w = math.exp(-max(now - self.time, 0.0) / self.TIME_CONSTANT)
            self.value = w * self.value + (1.0 - w) * sample
        self.time = now
        return max(sample, self.value)


_others = _LoadAverage()


def other_load() -> float:
    """Cores' worth of work that other processes keep runnable, re-read at each call.

    On Linux: the runnable tasks at this instant (``/proc/loadavg``) less this
    process's own runnable threads (``/proc/self/task``), averaged over the
    calls of the last seconds (the larger of the average and the instant
    counts), about 0.1 ms of CPU a call. Elsewhere: the 1-minute load average less
    one core (this process's own share, roughly), or ``0.0`` where the system
    tells neither. In a container ``/proc/loadavg`` counts the host's tasks,
    so the policy errs towards one thread there (``adaptive_threads(False)``
    keeps torch's count).
    """
    now = _runnable_now()
    if now is not None:
        return _others.update(float(max(now[0] - now[1], 0)), time.monotonic())
    try:
        return max(os.getloadavg()[0] - 1.0, 0.0)
    except (AttributeError, OSError):
        return 0.0


class threads_for_batch(AbstractContextManager):  # noqa: N801 - used like a function
    """backdrive's thread policy for a block of work on ``batch`` samples
    (see :func:`adaptive_threads`), and a :class:`reuse_workspaces` block.

    One torch thread when ``batch < SMALL_BATCH``; for larger batches
    :func:`threads_for_load` of torch's count, the available cores and the
    other processes' load at entry (:func:`other_load`, re-read at every
    entry). The count is only ever lowered. torch's thread count is
    process-wide: the previous count is restored on exit. Nested blocks
    are cheap (an inner block finds the count already lowered or probes
    again).

    Args:
        batch: number of samples the block works on.
    """

    def __init__(self, batch: int):
        self.batch = int(batch)
        self.previous: int | None = None
        self.workspace = reuse_workspaces()

    def __enter__(self) -> threads_for_batch:
        if _adaptive and not torch.compiler.is_compiling():
            n = torch.get_num_threads()
            if n > 1:
                want = 1 if self.batch < SMALL_BATCH else threads_for_load(n, available_cores(), other_load())
                if want < n:
                    self.previous = n
                    torch.set_num_threads(want)
        self.workspace.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.workspace.__exit__(*exc)
        if self.previous is not None:
            torch.set_num_threads(self.previous)
            self.previous = None


# --------------------------------------------------------------------------- workspaces

#: Arrays smaller than this many bytes never come from a workspace: glibc
#: serves them from memory it keeps anyway, and the bookkeeping would cost
#: more than it saves.
WORKSPACE_MIN_BYTES = 64 << 10

class _WorkspaceLocal(threading.local):
    # A class default, so that reading it in a thread that never opened a
    # block costs no AttributeError (getattr with a default raises and
    # catches one: measured 20 % of forward dynamics at 256 samples).
    current = None


_ws = _WorkspaceLocal()


class _Workspace:
    """Arrays of the fast path kept for reuse, by shape, dtype and device.

    An array is free again when nothing but the workspace holds it: no
    Python reference to the tensor (``sys.getrefcount``) and no other tensor
    on its storage (a view, a saved tensor; the storage's use count). So a
    result handed to the caller, or an array a later step still reads, is
    never given out twice.
    """

    __slots__ = ("arrays", "bytes", "max_bytes")

    def __init__(self, max_bytes: int):
        self.arrays: dict = {}
        self.bytes = 0
        self.max_bytes = max_bytes

    def empty(self, shape: tuple, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        key = (shape, dtype, device)
        kept = self.arrays.get(key)
        if kept is None:
            kept = self.arrays[key] = []
        for entry in kept:
            # Free: no Python reference beyond the workspace's own (the count
            # an unshared entry gives, measured once at import: interpreters
            # differ in how many references a call adds); nothing in C++ holds
            # the tensor (a view's base, a tensor saved for a backward pass:
            # ``_use_count``); its storage is held by the tensor and the kept
            # storage object alone.
            if _python_refs(entry) != _FREE_REFS:
                continue
            t = entry[0]
            if t._use_count() == 1 and _storage_use_count(entry[1]._cdata) == 2:
                return t
        t = torch.empty(shape, dtype=dtype, device=device)
        size = t.numel() * t.element_size()
        if self.bytes + size <= self.max_bytes:
            kept.append((t, t.untyped_storage()))
            self.bytes += size
        return t


def _python_refs(entry: tuple) -> int:
    """Python references to ``entry[0]``, counted the same way for every entry."""
    t = entry[0]
    return sys.getrefcount(t)


# What an entry nobody else refers to counts (3 on CPython 3.10-3.13; an
# interpreter that borrows references counts fewer, so measure, never assume).
_FREE_REFS = _python_refs((torch.empty(0), None))

# Private torch counters; without either, reuse_workspaces keeps nothing.
_storage_use_count = getattr(torch._C, "_storage_Use_Count", None)
if not hasattr(torch.Tensor, "_use_count"):
    _storage_use_count = None


def active_workspace() -> _Workspace | None:
    """The :class:`reuse_workspaces` block active in this thread (``None``
    outside one and in code that ``torch.compile`` traces)."""
    ws = _ws.current
    if ws is None or torch.compiler.is_compiling():
        return None
    return ws


def workspace_empty(shape: tuple, like: torch.Tensor) -> torch.Tensor:
    """An uninitialised array for an ``out=`` kernel of the fast path: from
    the active :class:`reuse_workspaces` block when there is one and the
    array is large, else ``torch.empty``. Only for code that nothing records
    (no autograd): the array's old contents are overwritten."""
    ws = active_workspace()
    if ws is not None:
        n = like.element_size()
        for d in shape:
            n *= d
        if n >= WORKSPACE_MIN_BYTES:
            return ws.empty(tuple(shape), like.dtype, like.device)
    return torch.empty(shape, dtype=like.dtype, device=like.device)


class reuse_workspaces(AbstractContextManager):  # noqa: N801 - used like a function
    """Reuse the fast path's large arrays from call to call inside the block.

    Large-batch calls of the dynamics without a gradient (``forward_dynamics``,
    ``inverse_dynamics``, ``mass_matrix`` on the fast path) allocate a few
    hundred arrays of up to several megabytes. Outside a block, each call
    gets them from the C library afresh, and with glibc's default settings
    the pages of one call go back to the system at its end, so the next call
    faults them in again (about 10,000 page faults per call for the G1
    humanoid at 10,000 samples in float32). Inside a block, the arrays the
    kernels write into with ``out=`` are kept by shape and handed out again
    once nothing else refers to them, so repeated calls touch the same
    pages. Nothing changes for the process's allocator, and the memory goes
    back when the block ends. backdrive's own loops
    (:meth:`Simulator.rollout <backdrive.sim.Simulator.rollout>`, policy
    training, the benchmarks) run inside one (:class:`threads_for_batch`
    opens it). Nested blocks share the outermost one's arrays. Per thread.

    Args:
        max_bytes: the most memory the block keeps (default 1 GiB); arrays
            beyond it are allocated as usual.
    """

    def __init__(self, max_bytes: int = 1 << 30):
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 0:
            raise InputError(f"max_bytes must be a non-negative integer, got {max_bytes!r}")
        self.max_bytes = max_bytes
        self.opened = False

    def __enter__(self) -> reuse_workspaces:
        if _ws.current is None and _storage_use_count is not None:
            _ws.current = _Workspace(self.max_bytes)
            self.opened = True
        return self

    def __exit__(self, *exc) -> None:
        if self.opened:
            _ws.current = None
            self.opened = False


# --------------------------------------------------------------------------- non-finite checking

_state = threading.local()
# Set once any thread turns the check on: until then the wrappers skip even
# the thread-local read (measured: the wrapper then costs ~0.2 us a call).
_ever_enabled = False
F = TypeVar("F", bound=Callable[..., Any])


def checking_finite() -> bool:
    """Whether :func:`check_finite` is on in this thread."""
    return getattr(_state, "enabled", False)


class check_finite(AbstractContextManager):  # noqa: N801 - used like a function
    """Raise :class:`~backdrive.NonFiniteError` at the first non-finite output.

    ``with check_finite():`` turns the check on inside the block (``with
    check_finite(False):`` turns it off) and restores the previous setting
    after it. Called without ``with``, ``check_finite(True)`` sets it for the
    rest of the thread; ``bool(check_finite(...))`` is then the setting
    before the call.

    Checked: :mod:`backdrive.kinematics` (``forward_kinematics``,
    ``frame_transforms``, ``body_transforms``, ``frame_jacobian``,
    :class:`~backdrive.kinematics.SerialChainKinematics` ``forward_kinematics``,
    ``evaluate`` and ``jacobian``), ``solve_dls_ik``, the layers
    (``DifferentiableFKLayer``, ``DifferentiableIKLayer``) and the public
    functions of :mod:`backdrive.dynamics` (``forward_dynamics``,
    ``inverse_dynamics``, ``mass_matrix``, ``bias_forces``, ...).

    Args:
        enabled: turn the check on (default) or off.
    """

    def __init__(self, enabled: bool = True):
        if not isinstance(enabled, bool):
            raise InputError(f"check_finite(enabled) takes a bool, got {enabled!r}")
        global _ever_enabled
        self.previous = checking_finite()
        _state.enabled = enabled
        _ever_enabled = _ever_enabled or enabled

    def __enter__(self) -> check_finite:
        return self

    def __exit__(self, *exc) -> None:
        _state.enabled = self.previous

    def __bool__(self) -> bool:
        return self.previous


def _tensors(value, name: str, records: bool = True):
    """``(name, tensor)`` for every tensor in a value: a tensor, tuple/list, dict, or
    (``records``) a dataclass such as an IK result. Arguments are scanned without
    ``records``: a model's infinite joint limits are legitimate."""
    if isinstance(value, torch.Tensor):
        yield name, value
    elif isinstance(value, (tuple, list)):
        for i, v in enumerate(value):
            yield from _tensors(v, f"{name}[{i}]", records)
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _tensors(v, f"{name}[{k!r}]", records)
    elif records and is_dataclass(value) and not isinstance(value, type):
        for f in fields(value):
            yield from _tensors(getattr(value, f.name), f"{name}.{f.name}", records)


def _readable(t: torch.Tensor) -> bool:
    compiling = getattr(torch.compiler, "is_compiling", None)
    if compiling is not None and compiling():
        return False
    try:
        return not torch._C._functorch.is_functorch_wrapped_tensor(t)
    except AttributeError:  # pragma: no cover - older torch
        return True


def _first_bad(t: torch.Tensor) -> tuple[int, ...] | None:
    """Index of the first non-finite entry of ``t``, or ``None`` if all are finite."""
    if not (t.is_floating_point() or t.is_complex()) or not _readable(t):
        return None
    with torch.no_grad():
        bad = ~torch.isfinite(t.detach())
        if not bool(bad.any()):
            return None
        return tuple(int(i) for i in torch.nonzero(bad)[0].tolist())


def assert_finite(function: str, output: Any, arguments: dict | None = None, output_name: str = "output") -> None:
    """Raise :class:`~backdrive.NonFiniteError` if ``output`` holds a NaN or infinity.

    The message names ``function``, the output entry and the first non-finite
    argument among ``arguments`` (``name -> value``), which is usually the cause.

    Args:
        function: the public name, e.g. ``"forward_kinematics"``.
        output: a tensor, or a tuple/list/dict/dataclass of tensors.
        arguments: the call's arguments by name (non-tensors are ignored).
        output_name: how to call the output in the message.
    """
    for out_name, t in _tensors(output, output_name):
        at = _first_bad(t)
        if at is None:
            continue
        cause = None
        for arg_name, value in (arguments or {}).items():
            for name, a in _tensors(value, arg_name, records=False):
                where = _first_bad(a)
                if where is not None:
                    cause = (name, where, a)
                    break
            if cause:
                break
        value = t.detach()[at].item()
        msg = f"{function}: {out_name} is {value} at index {list(at)}"
        if cause is not None:
            name, where, a = cause
            msg += f"; the argument {name} is not finite ({a.detach()[where].item()} at index {list(where)})"
            what = name
        else:
            msg += "; every tensor argument is finite, so the computation itself produced it"
            what = out_name
        raise NonFiniteError(msg, what=what, function=function)


def finite_checked(function: F | None = None, *, name: str | None = None) -> F:
    """Decorate a public function so that :func:`check_finite` mode checks its output.

    When the mode is off the wrapper costs a global and a thread-local read. Usable as
    ``@finite_checked``, ``@finite_checked(name="forward_dynamics")`` or
    ``forward_dynamics = finite_checked(_forward_dynamics, name="forward_dynamics")``.
    """

    def decorate(f: F) -> F:
        label = name or f.__qualname__
        signature = inspect.signature(f)

        @functools.wraps(f)
        def wrapper(*args, **kwargs):
            if not _ever_enabled or not getattr(_state, "enabled", False):
                return f(*args, **kwargs)
            # Only the outermost checked call checks, so the error names the
            # function the user called (jacobian, not the evaluate inside it).
            depth = getattr(_state, "depth", 0)
            _state.depth = depth + 1
            try:
                out = f(*args, **kwargs)
            finally:
                _state.depth = depth
            if depth == 0:
                try:
                    bound = signature.bind(*args, **kwargs).arguments
                except TypeError:  # pragma: no cover - f accepted what bind refuses
                    bound = dict(enumerate(args))
                bound = {str(k): v for k, v in bound.items() if k != "self"}
                assert_finite(label, out, bound)
            return out

        return wrapper  # type: ignore[return-value]

    return decorate if function is None else decorate(function)
