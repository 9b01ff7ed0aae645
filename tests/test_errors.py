"""One error hierarchy: every exception class lives in ``backdrive._errors``,
derives from ``BackdriveError`` and is exported from ``backdrive`` (issue 15, part 5)."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest
import torch

import backdrive
import backdrive._errors as errors_mod
from backdrive import (
    BackdriveError,
    BrowserNotFoundError,
    CheckpointMismatchError,
    CompilerUnavailableError,
    ConfigError,
    InputError,
    InputTypeError,
    MissingDependencyError,
    MissingExtraError,
    ModelError,
    NonFiniteError,
    PolicyConfigError,
    SimulationError,
    TrainingDivergedError,
    UnknownRobotError,
)


def _all_modules():
    """Every module of the package, optional-dependency ones included where they import."""
    mods = [backdrive]
    for info in pkgutil.walk_packages(backdrive.__path__, prefix="backdrive."):
        try:
            mods.append(importlib.import_module(info.name))
        except ImportError as exc:  # an optional extra that is not installed here
            if isinstance(exc, BackdriveError):
                raise
    return mods


def _exception_classes():
    found = {}
    for mod in _all_modules():
        for _, obj in inspect.getmembers(mod, inspect.isclass):
            if issubclass(obj, BaseException) and obj.__module__.startswith("backdrive"):
                found[(obj.__module__, obj.__qualname__)] = obj
    return found


def test_walk_finds_the_modules_that_used_to_define_errors():
    names = {m.__name__ for m in _all_modules()}
    # if the walk silently stopped early the next test would pass vacuously
    for expected in ("backdrive.spatial._common", "backdrive.sim._state", "backdrive.dynamics._compiled",
                     "backdrive.kinematics._ik", "backdrive.layers._fk_layer", "backdrive.data._errors",
                     "backdrive.viz._deps", "backdrive.cli._main"):
        assert expected in names


def test_every_exception_class_is_defined_in_errors_derives_and_is_exported():
    classes = _exception_classes()
    assert len(classes) >= 20
    exported = set(backdrive.__all__)
    for (module, qualname), cls in classes.items():
        assert module == "backdrive._errors", f"{module}.{qualname} is defined outside backdrive._errors"
        assert issubclass(cls, BackdriveError), f"{qualname} does not derive from BackdriveError"
        assert qualname in exported and getattr(backdrive, qualname) is cls, f"{qualname} not exported from backdrive"
        assert qualname in errors_mod.__all__


def test_every_exported_error_is_an_exception_class_of_errors():
    for name in errors_mod.__all__:
        obj = getattr(errors_mod, name)
        if inspect.isclass(obj):
            assert issubclass(obj, BackdriveError) and name in backdrive.__all__


@pytest.mark.parametrize(
    "cls, std",
    [
        (ModelError, ValueError),
        (InputError, ValueError),
        (InputTypeError, TypeError),
        (InputTypeError, InputError),
        (ConfigError, InputError),
        (PolicyConfigError, ConfigError),
        (CheckpointMismatchError, InputError),
        (UnknownRobotError, ValueError),
        (SimulationError, ValueError),
        (NonFiniteError, FloatingPointError),
        (NonFiniteError, SimulationError),
        (TrainingDivergedError, RuntimeError),
        (CompilerUnavailableError, RuntimeError),
        (MissingDependencyError, ImportError),
        (MissingExtraError, MissingDependencyError),
        (BrowserNotFoundError, FileNotFoundError),
    ],
)
def test_stdlib_compatibility(cls, std):
    assert issubclass(cls, std) and issubclass(cls, BackdriveError)


def test_missing_package_is_not_a_value_error():
    # a missing package is the environment's fault, not the argument's
    assert not issubclass(MissingDependencyError, ValueError)
    assert not issubclass(BackdriveError, ValueError)


@pytest.mark.parametrize(
    "old_module, name",
    [
        ("backdrive.kinematics", "ConfigError"),
        ("backdrive.kinematics._ik", "ConfigError"),
        ("backdrive.optim", "PolicyConfigError"),
        ("backdrive.layers", "CheckpointMismatchError"),
        ("backdrive.sim", "SimulationError"),
        ("backdrive.sim", "NonFiniteError"),
        ("backdrive.dynamics", "CompilerUnavailableError"),
        ("backdrive.data", "UnknownRobotError"),
        ("backdrive.data", "MissingDependencyError"),
        ("backdrive.viz", "MissingExtraError"),
        ("backdrive.viz", "BrowserNotFoundError"),
    ],
)
def test_old_import_locations_still_work(old_module, name):
    assert getattr(importlib.import_module(old_module), name) is getattr(backdrive, name)


def test_non_finite_error_keeps_its_simulation_attributes():
    e = NonFiniteError("x", step=3, what="q")
    assert (e.step, e.what, e.function) == (3, "q", None)


# --- backdrive.spatial raises the typed errors -------------------------------------


def test_spatial_checks_raise_typed_errors():
    sp = backdrive.spatial
    with pytest.raises(InputTypeError, match="floating"):
        sp.quat_normalize(torch.ones(4, dtype=torch.int64))
    with pytest.raises(InputTypeError, match="torch.Tensor"):
        sp.quat_normalize([1.0, 0.0, 0.0, 0.0])
    with pytest.raises(InputError, match=r"\(\.\.\., 4\)"):
        sp.quat_normalize(torch.ones(3))
    with pytest.raises(InputError, match=r"\(\.\.\., 4, 4\)"):
        sp.transform_inverse(torch.eye(3))
    with pytest.raises(InputTypeError, match="dtype"):
        sp.quat_multiply(torch.ones(4), torch.ones(4, dtype=torch.float64))
    with pytest.raises(InputError, match="batch_shape"):
        sp.quat_identity(-1)
    with pytest.raises(InputTypeError, match="floating dtype"):
        sp.quat_identity(dtype=torch.int32)
    # and the old stdlib classes still catch them
    with pytest.raises(TypeError):
        sp.so3_exp(torch.ones(3, dtype=torch.int32))
    with pytest.raises(ValueError):
        sp.so3_exp(torch.ones(2))


def test_backdrive_error_catches_every_spatial_check():
    sp = backdrive.spatial
    bad = [
        lambda: sp.rotvec_to_matrix(torch.ones(2)),
        lambda: sp.rpy_to_matrix(torch.ones(3, dtype=torch.int64)),
        lambda: sp.se3_exp(torch.ones(5)),
        lambda: sp.se3_log(torch.eye(3)),
        lambda: sp.transform_point(torch.eye(4), torch.ones(2)),
        lambda: sp.pose_error(torch.eye(4), torch.eye(4, dtype=torch.float64)),
        lambda: sp.matrix_to_quat(torch.ones(3, 4)),
        lambda: sp.quat_apply(torch.ones(4), torch.ones(4)),
        lambda: sp.skew(torch.ones(4)),
        lambda: sp.unskew(torch.ones(2, 2)),
        lambda: sp.random_quat(2.5),
    ]
    for f in bad:
        with pytest.raises(BackdriveError):
            f()
