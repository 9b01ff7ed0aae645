"""Every package's explicit public surface resolves, and nothing is star-exported."""

import importlib
import pathlib

import pytest

PACKAGES = [
    "backdrive",
    "backdrive.spatial",
    "backdrive.model",
    "backdrive.kinematics",
    "backdrive.dynamics",
    "backdrive.sim",
    "backdrive.layers",
    "backdrive.optim",
    "backdrive.envs",
    "backdrive.viz",
    "backdrive.data",
    "backdrive.cli",
]


@pytest.mark.parametrize("name", PACKAGES)
def test_all_resolves(name):
    mod = importlib.import_module(name)
    assert isinstance(mod.__all__, list) and mod.__all__, name
    assert len(set(mod.__all__)) == len(mod.__all__), f"{name}.__all__ has duplicates"
    for attr in mod.__all__:
        assert getattr(mod, attr, None) is not None, f"{name}.{attr}"


def test_no_star_imports():
    src = pathlib.Path(importlib.import_module("backdrive").__file__).parent
    offenders = [str(p) for p in src.rglob("*.py") if "import *" in p.read_text()]
    assert offenders == []
