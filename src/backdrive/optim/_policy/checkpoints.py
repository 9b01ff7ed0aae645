"""Policy checkpoints: tensors and plain containers, read without running code.

A checkpoint is a dict of tensors, numbers, strings, ``None`` and lists,
tuples and dicts of those (the trainer's :meth:`~PolicyTrainer.state_dict`),
written by ``torch.save``. It is read with ``torch.load(weights_only=True)``,
whose unpickler builds only those types: a file that names any other Python
object (a class, a function, an object with ``__reduce__``) is refused before
anything in it runs. Unpickling with ``weights_only=False`` would call such
objects, so a shared policy file could run arbitrary code on the machine that
opens it.

Format ``backdrive.policy/1`` (every backdrive version so far): the keys of
:meth:`PolicyTrainer.state_dict`, with ``config`` the settings as a plain
dict plus ``obs_dim`` and ``action_dim``. Settings added since a checkpoint
was written were at their defaults then, and are filled in as such.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import re
import tempfile
from pathlib import Path
from typing import Any

import torch

from ..._errors import PolicyConfigError
from .config import PolicyTrainerConfig
from .networks import MLPPolicy

__all__ = ["FORMAT", "read_checkpoint", "write_checkpoint", "checkpoint_config", "load_policy", "provenance"]

FORMAT = "backdrive.policy/1"

# The process umask, read once (reading it means setting it).
_UMASK = os.umask(0o022)
os.umask(_UMASK)


def read_checkpoint(path: str | os.PathLike, device: torch.device | str | None = None) -> dict[str, Any]:
    """The contents of a policy checkpoint, loaded with ``weights_only=True``.

    Args:
        path: a file written by :meth:`PolicyTrainer.save`.
        device: where to put the tensors (``None``: where they were saved).

    Raises:
        PolicyConfigError: the file holds pickled Python objects other than
            tensors and plain containers (refused before any of them is
            built: unpickling them could run code), is not a torch file, or
            is not a backdrive policy checkpoint.
        FileNotFoundError: no such file.
    """
    try:
        ckpt = torch.load(path, map_location=device, weights_only=True)
    except pickle.UnpicklingError as exc:
        names = re.findall(r"Unsupported global: GLOBAL ([\w.]+)", str(exc))
        if names:
            raise PolicyConfigError(
                f"refusing to load {os.fspath(path)!r}: it holds pickled Python objects "
                f"({', '.join(sorted(set(names)))}), not only tensors and plain containers. backdrive "
                "reads checkpoints with torch.load(weights_only=True) because unpickling an object can "
                "run arbitrary code; checkpoints written by backdrive never contain such objects, so "
                "this file was written by something else or altered. Open it with "
                "torch.load(weights_only=False) only if you trust where it came from."
            ) from None
        raise PolicyConfigError(
            f"{os.fspath(path)!r} is not a checkpoint torch can read safely ({str(exc).splitlines()[0]})"
        ) from None
    except (EOFError, RuntimeError) as exc:
        raise PolicyConfigError(
            f"{os.fspath(path)!r} is not a torch checkpoint, or is truncated ({type(exc).__name__}: {exc})"
        ) from None
    if not isinstance(ckpt, dict) or ckpt.get("format") != FORMAT:
        raise PolicyConfigError(f"{os.fspath(path)!r} is not a backdrive policy checkpoint (format {FORMAT!r})")
    return ckpt


def write_checkpoint(state: dict[str, Any], path: str | os.PathLike) -> None:
    """Write ``state`` atomically: a crash never leaves half a file at ``path``.

    The state goes to a uniquely named temporary file in the same directory
    (so the rename never crosses file systems and two writers never share
    it), is flushed to disk, and then replaces ``path`` with ``os.replace``,
    which is atomic on POSIX and Windows: a reader sees the old checkpoint
    or the new one, never a mixture. On any error the temporary file is
    removed and the old checkpoint is left as it was.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        if hasattr(os, "fchmod"):
            # mkstemp makes the file private (0600); a checkpoint gets the
            # permissions an ordinary new file would.
            os.fchmod(fd, 0o666 & ~_UMASK)
        with os.fdopen(fd, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def checkpoint_config(ckpt: dict[str, Any], path: str | os.PathLike) -> tuple[PolicyTrainerConfig, int, int]:
    """The settings a checkpoint was trained with, and its observation and action sizes.

    Raises:
        PolicyConfigError: the stored settings are not valid today (the
            message names the file).
    """
    saved = dict(ckpt["config"])
    obs_dim, action_dim = saved.pop("obs_dim"), saved.pop("action_dim")
    try:
        config = PolicyTrainerConfig.from_dict(saved)
    except PolicyConfigError as exc:
        raise PolicyConfigError(f"checkpoint {os.fspath(path)!r} has settings backdrive cannot use: {exc}") from None
    return config, int(obs_dim), int(action_dim)


def load_policy(path: str | os.PathLike, *, device: torch.device | str | None = None) -> MLPPolicy:
    """The policy (with its observation normaliser) stored in a training checkpoint.

    The file is read with ``torch.load(weights_only=True)``: no code in it
    runs (see :func:`read_checkpoint`).

    Args:
        path: a checkpoint written by ``train_policy(checkpoint=...)`` or
            :meth:`PolicyTrainer.save`, with the default :class:`MLPPolicy`.
        device: where to put the policy.

    Returns:
        The policy in eval mode, mapping raw observations to actions.

    Raises:
        PolicyConfigError: see :func:`read_checkpoint`.
    """
    ckpt = read_checkpoint(path, device)
    config, obs_dim, action_dim = checkpoint_config(ckpt, path)
    weights = ckpt["policy"]
    centre, half = weights["action_centre"], weights["action_half_range"]
    policy = MLPPolicy(
        obs_dim, action_dim, centre - half, centre + half, config.hidden, config.activation, config.squash
    ).to(dtype=centre.dtype, device=centre.device)
    policy.load_state_dict(weights)
    return policy.eval()


def provenance(paths: tuple[str, ...] = ("src",)) -> dict[str, Any]:
    """Where a trained policy (or a training curve) came from, besides its settings and seed.

    Returns the git commit of the source checkout backdrive runs from, whether
    the files under ``paths`` (relative to the checkout) differed from it,
    torch's version, the CPU kernels torch picked
    (``torch.backends.cpu.get_cpu_capability()``, e.g. ``AVX2``), the machine
    and the thread count. Training through contact is deterministic on one
    machine and one source tree, but chaotic: a change of rounding anywhere (a
    reassociated product, other vector kernels) acts like a new seed
    (docs/locomotion.md, *15th session*), so runs only compare bit for bit
    when these agree. ``git_commit`` and ``src_modified`` are ``None`` when
    backdrive is not run from a git checkout (an installed wheel)."""
    import platform
    import subprocess

    here = Path(__file__).resolve()
    root = here.parents[4]  # <root>/src/backdrive/optim/_policy/checkpoints.py
    from_checkout = (root / "src" / "backdrive").is_dir() and (root / ".git").exists()

    def git(*cmd: str) -> str | None:
        if not from_checkout:
            return None
        try:
            r = subprocess.run(["git", *cmd], cwd=root, capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            return None
        return r.stdout.strip() if r.returncode == 0 else None

    status = git("status", "--porcelain", "--untracked-files=no", "--", *paths)
    # Plain str: torch.__version__ is a TorchVersion, which weights_only loading refuses.
    return {"git_commit": git("rev-parse", "HEAD"), "src_modified": None if status is None else bool(status),
            "torch": str(torch.__version__), "cpu_capability": str(torch.backends.cpu.get_cpu_capability()),
            "machine": platform.machine(), "threads": int(torch.get_num_threads())}
