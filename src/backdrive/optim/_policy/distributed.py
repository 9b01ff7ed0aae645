"""Data-parallel policy training over ``torch.distributed``.

Under ``torchrun --nproc_per_node N`` (or any launcher that sets ``RANK``,
``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT``) every process builds the
same env, with ``num_envs`` the *global* batch B, and calls ``train_policy``
with the same settings. Each rank then:

- steps its own slice of B / N copies (:func:`shard_env`), with its own seed
  stream (:func:`rank_seed`; rank 0 keeps the single-process seeds, so a
  one-process run is unchanged);
- averages the actor's and the critic's gradients over the ranks after every
  backward pass, with one all-reduce of the flattened gradients
  (:meth:`DataParallel.average_gradients`), so every rank takes the same
  optimiser step and the parameters stay identical;
- merges the observation statistics of every rank's batch
  (:meth:`DataParallel.moments`);
- agrees with the others on the log row (returns, losses) and on stopping.

Rank 0 alone writes the CSV log and checkpoints; a checkpoint holds the whole
batch (every rank's env state, replayed windows and random generators), so it
resumes under any world size (exactly under the same one).

Why an explicit all-reduce and not ``DistributedDataParallel``: the policy is
applied at every step of the window, so back-propagation through time
produces its gradient only when the backward pass reaches the first step,
at the very end; DDP's overlap of communication with the backward pass has
nothing to overlap, and its bucketing only adds hooks to a gradient of a few
thousand numbers. The trainer also calls parts of the policy (``preact``,
``squash_preact``) outside ``forward`` and takes many critic steps per
update, which DDP's forward-hook bookkeeping does not follow.
``benchmarks/scaling.py`` measures both (docs/scaling.md).

A rank that dies must not leave the others waiting forever: the process
group is created with a timeout (:data:`DEFAULT_TIMEOUT_S`, ``timeout_s=``),
after which a collective raises instead of blocking. With gloo a peer that
exits usually fails the others' next collective at once (the connection
closes); the timeout covers a rank that hangs. With NCCL the timeout is
enforced by ProcessGroupNCCL's watchdog, which by default
(``TORCH_NCCL_ASYNC_ERROR_HANDLING=3``, PyTorch's "ProcessGroupNCCL
environment variables" page) tears the process down. ``torchrun`` itself
also stops the remaining workers when one exits with an error.
"""

from __future__ import annotations

import atexit
import copy
import datetime
import hashlib
import json
import os
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from ..._errors import PolicyConfigError
from ...envs._base import DiffEnv


def _import_group_defaults() -> None:
    """Import the torch modules that capture the default process group at import.

    ``torch.distributed.nn.functional`` gives ten functions the default
    argument ``group=group.WORLD``, evaluated when the module is first
    imported. Imported while a group exists (torch's optimisers import it
    the first time one is built, through ``torch._dynamo``), those defaults
    keep that group alive after ``destroy_process_group()``: a gloo group's
    threads then run on into interpreter shutdown, and a worker thread
    freeing a finished collective's tensors there aborts the process
    ("terminate called without an active exception"). Imported before any
    group exists, the defaults are ``None``. Measured with torch 2.13: a
    torchrun worker's group kept 10 extra references after training and
    aborted 4 of 40 two-process runs; with this import first, 0 of 60.
    """
    if not dist.is_available():
        return
    try:
        import torch.distributed.nn.functional  # noqa: F401
    except ImportError:  # a torch build without it has nothing to capture the group
        pass


_import_group_defaults()

__all__ = [
    "BACKENDS",
    "DEFAULT_TIMEOUT_S",
    "DataParallel",
    "default_backend",
    "local_device",
    "rank_seed",
    "shard_env",
]

#: The process-group backends ``train_policy(backend=...)`` accepts.
BACKENDS = ("gloo", "nccl")
#: Seconds a collective waits for the other ranks before it raises (a dead or hung rank).
DEFAULT_TIMEOUT_S = 600.0


def rank_seed(seed: int, rank: int, restart: int = 0) -> int:
    """The seed of ``rank``'s random streams for a run seeded with ``seed``.

    Rank 0 of the first start keeps ``seed`` itself, so a one-process run is
    the same as before data parallelism existed. Every other ``(rank,
    restart)`` gets an independent stream from numpy's ``SeedSequence``
    (spawn keys, the construction numpy recommends for parallel streams).
    ``restart`` counts resumes under a different world size, whose streams
    cannot continue the saved ones.

    Returns:
        A seed in ``[0, 2**63)``.
    """
    if rank == 0 and restart == 0:
        return int(seed)
    state = np.random.SeedSequence(int(seed), spawn_key=(int(rank), int(restart))).generate_state(1, np.uint64)
    return int(state[0] >> np.uint64(1))


def default_backend(device: torch.device | str) -> str:
    """``"nccl"`` for CUDA tensors, ``"gloo"`` otherwise."""
    return "nccl" if torch.device(device).type == "cuda" else "gloo"


def local_device() -> torch.device:
    """The device this process should put its env on: ``cuda:LOCAL_RANK`` when CUDA exists, else the CPU.

    ``torchrun`` sets ``LOCAL_RANK`` (the process's index on its node); build
    the env with ``device=local_device()`` so each process on a GPU node owns
    one GPU.
    """
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
    return torch.device("cpu")


def _destroy_default_group() -> None:
    """Destroy the default process group if it is still open.

    The exit hook of a group that :meth:`DataParallel.setup` created."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def _launched() -> bool:
    """Whether a launcher (torchrun) started this process as one of several."""
    try:
        return int(os.environ.get("WORLD_SIZE", "1")) > 1
    except ValueError:
        return False


def shard_env(env: DiffEnv, rank: int, world_size: int) -> DiffEnv:
    """A copy of ``env`` that steps rank ``rank``'s slice of its ``num_envs`` copies.

    The copy shares everything that is the same for every copy (the robot
    model, physical constants, action bounds) and gets fresh batch
    bookkeeping from :class:`DiffEnv`'s own constructor: ``num_envs //
    world_size`` copies, its own generator, no state until it is reset.
    Copies ``rank * n .. (rank + 1) * n - 1`` of the global batch are this
    rank's (the order of :meth:`DataParallel.gather`). This relies on the
    :class:`DiffEnv` contract that everything per copy lives in the env's
    state (subclasses supply pure functions of it), which every shipped env
    keeps.

    Raises:
        PolicyConfigError: ``world_size`` does not divide ``env.num_envs``.
    """
    n = env.num_envs
    if n % world_size:
        divisors = [d for d in range(1, n + 1) if n % d == 0]
        raise PolicyConfigError(
            f"data-parallel training splits the env batch evenly over the processes, but "
            f"num_envs = {n} is not divisible by the world size {world_size}; use num_envs a multiple "
            f"of {world_size} (e.g. {n + world_size - n % world_size}) or a world size in {divisors}"
        )
    if world_size == 1:
        return env
    local = copy.copy(env)
    # The base class's bookkeeping (batch size, generator, state, counters)
    # made anew for the slice; the subclass's attributes stay shared.
    DiffEnv.__init__(local, n // world_size, dtype=env.dtype, device=env.device, autoreset=env.autoreset)
    return local


def _digest(value: Any) -> int:
    """A 63-bit hash of a JSON-able value, equal on every machine (unlike ``hash``)."""
    text = json.dumps(value, sort_keys=True, default=repr)
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little") >> 1


class DataParallel:
    """The process group of a data-parallel run, and the few collectives training needs.

    A one-process run has ``world_size == 1`` and every method is a no-op
    (no process group is needed), so the trainer calls them unconditionally.

    Build it with :meth:`setup`. Attributes: ``rank``, ``world_size``,
    ``backend``, ``device`` (where the collectives' tensors live: the env's
    device) and the property ``group``.

    It trains in torch's default (world) process group and holds no
    reference to it: the group is looked up at each collective. A reference
    kept by a trainer that outlives ``destroy_process_group()`` would free
    the gloo group only during interpreter shutdown, which aborts the
    process ("terminate called without an active exception") about every
    other run with torch 2.13.
    """

    def __init__(
        self,
        rank: int = 0,
        world_size: int = 1,
        backend: str | None = None,
        device: torch.device | str = "cpu",
    ) -> None:
        self.rank = rank
        self.world_size = world_size
        self.backend = backend
        self.device = torch.device(device)

    @property
    def group(self):
        """The default process group (``None`` in one process or once it was destroyed)."""
        return dist.group.WORLD if self.active and dist.is_initialized() else None

    # ---------------------------------------------------------------- setup
    @classmethod
    def setup(
        cls,
        device: torch.device | str,
        distributed: bool | None = None,
        backend: str | None = None,
        timeout_s: float | None = None,
    ) -> DataParallel:
        """Join (or create) the process group this process trains in.

        Args:
            device: the env's device; picks the default backend.
            distributed: ``None``: data-parallel when a process group is
                initialised already or a launcher set ``WORLD_SIZE > 1``;
                ``False``: one process, whatever the environment says;
                ``True``: data-parallel (a process group is created from the
                launcher's environment variables when none exists).
            backend: ``"gloo"`` or ``"nccl"`` (default: nccl on CUDA, gloo otherwise).
            timeout_s: how long a collective waits for the other ranks before
                raising (default :data:`DEFAULT_TIMEOUT_S`). Applies to a
                group created here; a group the caller initialised keeps its own.

        Raises:
            PolicyConfigError: a bad ``backend``, ``timeout_s`` or
                ``distributed``, or the backend does not fit the device.
        """
        device = torch.device(device)
        if distributed not in (None, True, False):
            raise PolicyConfigError(f"distributed must be None, True or False, got {distributed!r}")
        if backend is not None and backend not in BACKENDS:
            raise PolicyConfigError(f"unknown backend {backend!r}; valid: {', '.join(map(repr, BACKENDS))}")
        if timeout_s is not None and (isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float))
                                      or not timeout_s > 0 or timeout_s == float("inf")):
            raise PolicyConfigError(f"timeout_s must be a positive finite number of seconds, got {timeout_s!r}")
        if backend == "nccl" and device.type != "cuda":
            raise PolicyConfigError(f"backend 'nccl' needs CUDA tensors, but the env is on {device}; use 'gloo'")
        ready = dist.is_available() and dist.is_initialized()
        if distributed is False or (distributed is None and not ready and not _launched()):
            return cls(device=device)
        if not dist.is_available():
            raise PolicyConfigError("torch.distributed is not available in this torch build")
        if not ready:
            for var in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
                if var not in os.environ:
                    raise PolicyConfigError(
                        f"distributed training needs the environment variable {var} (torchrun sets it), "
                        "or a process group initialised with torch.distributed.init_process_group"
                    )
            backend = backend or default_backend(device)
            if backend == "nccl" and device.index is not None:
                torch.cuda.set_device(device)
            timeout = datetime.timedelta(seconds=float(timeout_s if timeout_s is not None else DEFAULT_TIMEOUT_S))
            dist.init_process_group(backend=backend, timeout=timeout)
            # Closed at exit while the interpreter is whole: a gloo group
            # still open when the interpreter shuts down aborts the process
            # about every other run (torch 2.13). Closing frees it because
            # nothing else holds it (_import_group_defaults).
            atexit.register(_destroy_default_group)
        actual = dist.get_backend()
        if backend is not None and actual != backend:
            raise PolicyConfigError(f"backend {backend!r} asked for, but the process group uses {actual!r}")
        if actual == "nccl" and device.type != "cuda":
            raise PolicyConfigError(f"the process group uses nccl, which needs CUDA tensors; the env is on {device}")
        return cls(dist.get_rank(), dist.get_world_size(), actual, device)

    @property
    def active(self) -> bool:
        """More than one process."""
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        """Rank 0: the process that writes logs and checkpoints."""
        return self.rank == 0

    def __repr__(self) -> str:
        return f"DataParallel(rank={self.rank}, world_size={self.world_size}, backend={self.backend!r})"

    # ---------------------------------------------------------- collectives
    def check_same(self, what: str, value: Any) -> None:
        """Raise on every rank unless every rank passes an equal ``value`` (compared by hash).

        Raises:
            PolicyConfigError: the ranks disagree; names the ranks and, for
                dicts, the entries that differ.
        """
        if not self.active:
            return
        mine = torch.tensor([_digest(value)], dtype=torch.int64, device=self.device)
        every = [torch.empty_like(mine) for _ in range(self.world_size)]
        dist.all_gather(every, mine, group=self.group)
        digests = [int(t.item()) for t in every]
        if len(set(digests)) == 1:
            return
        values: list[Any] = [None] * self.world_size
        dist.all_gather_object(values, value, group=self.group)
        odd = [r for r, d in enumerate(digests) if d != digests[0]]
        detail = ""
        if all(isinstance(v, dict) for v in values):
            keys = sorted({k for v in values for k in v}, key=str)
            diffs = [f"{k}: rank 0 {values[0].get(k)!r} vs rank {r} {values[r].get(k)!r}"
                     for r in odd for k in keys if values[0].get(k) != values[r].get(k)]
            detail = "; " + "; ".join(diffs)
        raise PolicyConfigError(
            f"the processes of a data-parallel run must train with the same {what}, but rank(s) "
            f"{odd} differ from rank 0{detail}"
        )

    def broadcast_modules(self, modules: Iterable[nn.Module]) -> None:
        """Copy rank 0's parameters and buffers to every rank (one broadcast of them flattened)."""
        if not self.active:
            return
        tensors = [t for m in modules for t in list(m.parameters()) + list(m.buffers())]
        for dtype in sorted({t.dtype for t in tensors}, key=str):
            group = [t for t in tensors if t.dtype == dtype]
            flat = torch.cat([t.detach().reshape(-1) for t in group])
            dist.broadcast(flat, src=0, group=self.group)
            self._unflatten_into(flat, [t.data for t in group])

    def average_gradients(
        self, params: Sequence[nn.Parameter], extra: torch.Tensor | None = None
    ) -> torch.Tensor | None:
        """Average ``params``' gradients over the ranks in place, with one all-reduce.

        A parameter without a gradient counts as a zero gradient (and gets
        one), so every rank reduces the same layout.

        Args:
            params: parameters of one dtype and device.
            extra: a scalar (e.g. the local loss) averaged in the same all-reduce.

        Returns:
            The averaged ``extra`` (``None`` without one).
        """
        if not self.active:
            return extra
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        parts = [p.grad.reshape(-1) for p in params]
        if extra is not None:
            parts.append(extra.detach().reshape(1).to(parts[0].dtype))
        flat = torch.cat(parts)
        dist.all_reduce(flat, group=self.group)
        flat /= self.world_size
        self._unflatten_into(flat, [p.grad for p in params])
        return flat[-1] if extra is not None else None

    def barrier(self) -> None:
        """Wait until every rank gets here."""
        if self.active:
            dist.barrier(group=self.group)

    def sum_(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum ``tensor`` over the ranks, in place; returns it."""
        if self.active:
            dist.all_reduce(tensor, group=self.group)
        return tensor

    def mean_(self, tensor: torch.Tensor) -> torch.Tensor:
        """Average ``tensor`` over the ranks, in place; returns it."""
        if self.active:
            dist.all_reduce(tensor, group=self.group)
            tensor /= self.world_size
        return tensor

    def any(self, flag: bool) -> bool:
        """Whether ``flag`` is true on any rank (every rank gets the same answer)."""
        if not self.active:
            return bool(flag)
        t = torch.tensor([1.0 if flag else 0.0], device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.group)
        return bool(t.item() > 0)

    def broadcast_float(self, value: float) -> float:
        """Rank 0's ``value`` on every rank."""
        if not self.active:
            return value
        t = torch.tensor([value], dtype=torch.float64, device=self.device)
        dist.broadcast(t, src=0, group=self.group)
        return float(t.item())

    def moments(self, obs: torch.Tensor) -> tuple[int, torch.Tensor, torch.Tensor]:
        """Count, mean and biased variance (float64, ``(obs_dim,)``) of every rank's ``obs`` together.

        Two all-reduces (the sum, then the squared deviations from the
        global mean), so the variance is as accurate as one process's.
        """
        x = obs.detach().reshape(-1, obs.shape[-1]).to(torch.float64)
        n = x.shape[0] * self.world_size
        total = self.sum_(x.sum(0))
        mean = total / n
        var = self.sum_((x - mean).pow(2).sum(0)) / n
        return n, mean, var

    def gather(self, tensor: torch.Tensor, dim: int) -> torch.Tensor:
        """Every rank's ``tensor`` concatenated along ``dim`` in rank order (the global batch)."""
        if not self.active:
            return tensor
        tensor = tensor.contiguous()
        parts = [torch.empty_like(tensor) for _ in range(self.world_size)]
        dist.all_gather(parts, tensor, group=self.group)
        return torch.cat(parts, dim=dim)

    def gather_objects(self, value: Any) -> list[Any]:
        """Every rank's ``value`` (picklable), in rank order."""
        if not self.active:
            return [value]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, value, group=self.group)
        return out

    def local_slice(self, tensor: torch.Tensor, dim: int) -> torch.Tensor:
        """This rank's slice of a global-batch ``tensor`` along ``dim``."""
        n = tensor.shape[dim]
        if n % self.world_size:
            raise PolicyConfigError(
                f"a checkpoint with {n} env copies cannot be split over {self.world_size} processes; "
                f"use a world size that divides {n}"
            )
        k = n // self.world_size
        return tensor.narrow(dim, self.rank * k, k).clone()

    @staticmethod
    def _unflatten_into(flat: torch.Tensor, tensors: Sequence[torch.Tensor]) -> None:
        offset = 0
        for t in tensors:
            k = t.numel()
            t.copy_(flat[offset : offset + k].view_as(t))
            offset += k
