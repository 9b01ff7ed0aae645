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
    "backdrive.contact",
    "backdrive.sim",
    "backdrive.layers",
    "backdrive.optim",
    "backdrive.envs",
    "backdrive.analysis",
    "backdrive.viz",
    "backdrive.data",
    "backdrive.cli",
    "backdrive.runtime",
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


def test_policy_training_names():
    import backdrive._errors as errors
    import backdrive.optim as optim

    assert {"PolicyTrainerConfig", "PolicyTrainer", "train_policy", "PolicyConfigError", "TrainingDivergedError"} <= set(
        optim.__all__
    )
    # the errors live in backdrive._errors and are re-exported unchanged
    assert optim.PolicyConfigError is errors.PolicyConfigError
    assert optim.TrainingDivergedError is errors.TrainingDivergedError
    assert issubclass(optim.PolicyConfigError, errors.BackdriveError)


def test_markdown_figures_are_committed_files():
    """Every image a README or doc shows is a file in the repository, never one under
    the git-ignored ``outputs/`` that exists only after someone ran the example."""
    import re

    root = pathlib.Path(__file__).resolve().parents[1]
    pages = [root / "README.md", *sorted((root / "docs").glob("*.md")), *sorted((root / "examples").glob("*.md"))]
    images = []
    for page in pages:
        for target in re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", page.read_text()):
            if target.startswith(("http://", "https://")):
                continue
            path = (page.parent / target.split("#")[0]).resolve()
            images.append((page.name, target, path))
            assert "outputs" not in path.relative_to(root).parts, f"{page.name} shows {target}, under outputs/"
            assert path.is_file(), f"{page.name} shows {target}, which does not exist"
    assert len(images) >= 7  # the example READMEs alone show seven figures
