"""One error hierarchy: every exception class lives in ``backdrive._errors``,
derives from ``BackdriveError`` and is exported from ``backdrive`` (issue 15, part 5)."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re

import pytest
import torch

import backdrive
import backdrive._errors as errors_mod
from backdrive import (
    BackdriveError,
    BackdriveWarning,
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
        base = BackdriveWarning if issubclass(cls, Warning) else BackdriveError
        assert issubclass(cls, base), f"{qualname} does not derive from {base.__name__}"
        assert qualname in exported and getattr(backdrive, qualname) is cls, f"{qualname} not exported from backdrive"
        assert qualname in errors_mod.__all__


def test_every_exported_error_is_an_exception_class_of_errors():
    for name in errors_mod.__all__:
        obj = getattr(errors_mod, name)
        if inspect.isclass(obj):
            assert issubclass(obj, (BackdriveError, BackdriveWarning)) and name in backdrive.__all__


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


# --- opt-in non-finite checking (issue 14 part 4) ----------------------------------------

import math  # noqa: E402

from backdrive import runtime  # noqa: E402
from backdrive.data import get_data_path, load  # noqa: E402
from backdrive.kinematics import (  # noqa: E402
    SerialChainKinematics,
    forward_kinematics,
    frame_jacobian,
    solve_dls_ik,
)


@pytest.fixture(scope="module")
def panda():
    return load("panda")


@pytest.fixture(scope="module")
def chain():
    return SerialChainKinematics.from_urdf(get_data_path("panda"), "panda_hand_tcp", dtype=torch.float64)


def test_nan_passes_silently_by_default(panda):
    q = panda.neutral().clone()
    q[3] = math.nan
    assert not runtime.checking_finite()
    assert not torch.isfinite(forward_kinematics(panda, q)).all()


def test_check_finite_context_names_function_and_argument(panda):
    q = panda.neutral().repeat(3, 1)
    q[1, 3] = math.nan
    with runtime.check_finite():
        assert runtime.checking_finite()
        forward_kinematics(panda, panda.neutral())  # finite: no error
        with pytest.raises(NonFiniteError, match=r"forward_kinematics: output is nan.*argument q is not finite \(nan at index \[1, 3\]\)") as info:
            forward_kinematics(panda, q)
        assert info.value.function == "forward_kinematics" and info.value.what == "q"
        with pytest.raises(NonFiniteError, match="frame_jacobian"):
            frame_jacobian(panda, q, "panda_hand_tcp")
    assert not runtime.checking_finite()  # restored
    forward_kinematics(panda, q)  # unchecked again


def test_check_finite_setting_and_nesting(panda):
    q = panda.neutral().clone()
    q[0] = math.inf
    previous = runtime.check_finite(True)
    try:
        assert bool(previous) is False and runtime.checking_finite()
        with pytest.raises(NonFiniteError):
            forward_kinematics(panda, q)
        with runtime.check_finite(False):
            forward_kinematics(panda, q)
        assert runtime.checking_finite()
    finally:
        runtime.check_finite(False)
    with pytest.raises(InputError, match="takes a bool"):
        runtime.check_finite("yes")


def test_check_finite_covers_chain_ik_and_layers(chain):
    from backdrive.layers import DifferentiableFKLayer, DifferentiableIKLayer

    q = torch.zeros(2, chain.dof, dtype=torch.float64)
    q[0, 1] = math.nan
    fk = DifferentiableFKLayer(chain)
    ik = DifferentiableIKLayer(kinematics=fk)
    T = chain.forward_kinematics(torch.zeros(2, chain.dof, dtype=torch.float64))
    T[1, 0, 3] = math.nan  # the IK contract: a NaN target fails per sample, silently unless checked
    assert not bool(solve_dls_ik(chain, T).success[1])
    with runtime.check_finite():
        for f, name in (
            (chain.forward_kinematics, "SerialChainKinematics.forward_kinematics"),
            (chain.evaluate, "SerialChainKinematics.evaluate"),
            (chain.jacobian, "SerialChainKinematics.jacobian"),
            (fk, "DifferentiableFKLayer.forward"),
            (fk.evaluate, "DifferentiableFKLayer.evaluate"),
            (fk.jacobian, "DifferentiableFKLayer.jacobian"),
        ):
            with pytest.raises(NonFiniteError, match=re.escape(name) + r".*argument qpos") as info:
                f(q)
            assert info.value.function == name
        with pytest.raises(NonFiniteError, match=r"solve_dls_ik: .*argument target_xpos .*index \[1, 0, 3\]"):
            solve_dls_ik(chain, T)
        with pytest.raises(NonFiniteError, match=r"DifferentiableIKLayer.forward: .*target_xpos"):
            ik(T)
        res = ik.solve(T[:1])  # finite: fine
        assert bool(res.success[0]) in (True, False)


def test_check_finite_reports_a_computation_that_fails_on_finite_inputs(panda):
    import backdrive.dynamics as D

    nan_model = panda.replace  # parameters that are NaN are refused by replace() ...
    with pytest.raises(backdrive.InvalidValueError):
        nan_model(body_mass=torch.full_like(panda.body_mass, math.nan))
    # ... and a computation that produces NaN from finite inputs is reported as such
    fd = runtime.finite_checked(D.forward_dynamics, name="forward_dynamics")
    m = backdrive.RobotModel.from_urdf(
        '<robot name="k"><link name="a"/><link name="b"/>'
        '<joint name="j" type="continuous"><parent link="a"/><child link="b"/></joint></robot>'
    )  # a coordinate that moves no inertia: a singular mass matrix
    q = m.neutral()
    with runtime.check_finite(), pytest.raises(NonFiniteError, match="every tensor argument is finite"):
        fd(m, q, torch.zeros_like(q), torch.zeros_like(q))
    assert not torch.isfinite(fd(m, q, torch.zeros_like(q), torch.zeros_like(q))).all()  # off: silent


def test_finite_checked_wrapper_is_transparent():
    def f(x, *, scale=1.0):
        """doc"""
        return x * scale

    g = runtime.finite_checked(f, name="f")
    assert g.__doc__ == "doc" and g.__wrapped__ is f
    x = torch.tensor([1.0, math.nan])
    assert torch.equal(g(x, scale=2.0)[:1], torch.tensor([2.0]))
    with runtime.check_finite(), pytest.raises(NonFiniteError, match=r"f: output\[1\]|f: output is nan at index \[1\]"):
        g(x)
    # inside torch.func transforms values cannot be read: not checked, no error
    from torch.func import vmap

    with runtime.check_finite():
        out = vmap(g)(x[:, None])
    assert torch.isnan(out[1, 0])


def test_check_finite_covers_the_dynamics(panda):
    from backdrive.dynamics import forward_dynamics, inverse_dynamics, mass_matrix

    q = panda.neutral().repeat(2, 1)
    v = torch.zeros_like(q)
    tau = torch.zeros_like(q)
    tau[0, 2] = math.nan
    assert not torch.isfinite(forward_dynamics(panda, q, v, tau)).all()  # unchecked: silent
    with runtime.check_finite():
        with pytest.raises(NonFiniteError, match=r"forward_dynamics: .*argument tau is not finite") as info:
            forward_dynamics(panda, q, v, tau)
        assert info.value.function == "forward_dynamics" and info.value.what == "tau"
        q_bad = q.clone()
        q_bad[1, 0] = math.inf
        with pytest.raises(NonFiniteError, match="mass_matrix"):
            mass_matrix(panda, q_bad)
        with pytest.raises(NonFiniteError, match="inverse_dynamics"):
            inverse_dynamics(panda, q_bad, v, v)
        assert torch.isfinite(forward_dynamics(panda, q, v, torch.zeros_like(q))).all()
