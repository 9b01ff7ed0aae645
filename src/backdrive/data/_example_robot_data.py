"""Resolver for the URDF files of the ``example-robot-data`` package.

``pip install example-robot-data`` (a cmeel wheel) installs no Python module,
only data, under ``<site-packages>/cmeel.prefix/share/example-robot-data/robots``;
conda and robotpkg install the same tree under ``<prefix>/share``. This module
finds that tree without importing anything from the package and maps short
names (``"ur5"``, ``"solo12"``) to URDF files in it.
"""

from __future__ import annotations

import importlib.metadata
import site
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path

from ._errors import MissingDependencyError, UnknownRobotError

__all__ = [
    "EXAMPLE_ROBOT_DATA_PREFIX",
    "EXAMPLE_ROBOTS",
    "example_robot_data_dir",
    "list_example_robots",
    "example_robot_path",
]

EXAMPLE_ROBOT_DATA_PREFIX = "example-robot-data:"

_DIST_NAME = "example-robot-data"
_SHARE = Path("share", "example-robot-data", "robots")
_CMEEL_SHARE = Path("cmeel.prefix") / _SHARE
_INSTALL_HINT = (
    "the example-robot-data package is not installed; "
    "run `pip install example-robot-data` (or `make test`, which installs it)"
)

# Short name -> path under the robots root. Names follow the package's own
# Python loader (example_robot_data.robots_loader) where it has one; every
# entry is a file that exists in example-robot-data 6.0.0. Entries missing
# from the installed version are left out of list_example_robots().
EXAMPLE_ROBOTS: dict[str, str] = {
    # arms
    "panda": "panda_description/urdf/panda.urdf",
    "panda_collision": "panda_description/urdf/panda_collision.urdf",
    "ur3": "ur_description/urdf/ur3_robot.urdf",
    "ur3_gripper": "ur_description/urdf/ur3_gripper.urdf",
    "ur3_limited": "ur_description/urdf/ur3_joint_limited_robot.urdf",
    "ur5": "ur_description/urdf/ur5_robot.urdf",
    "ur5_gripper": "ur_description/urdf/ur5_gripper.urdf",
    "ur5_limited": "ur_description/urdf/ur5_joint_limited_robot.urdf",
    "ur10": "ur_description/urdf/ur10_robot.urdf",
    "ur10_limited": "ur_description/urdf/ur10_joint_limited_robot.urdf",
    "z1": "z1_description/urdf/z1.urdf",
    "kinova": "kinova_description/robots/kinova.urdf",
    "xarm7": "xarm_description/urdf/xarm7.urdf",
    "xarm": "xarm_description/urdf/xarm7.urdf",
    "so100": "so_arm_description/urdf/so100.urdf",
    "so101": "so_arm_description/urdf/so101.urdf",
    "baxter": "baxter_description/urdf/baxter.urdf",
    "finger_edu": "finger_edu_description/robots/finger_edu.urdf",
    "asr_twodof": "asr_twodof_description/urdf/TwoDofs.urdf",
    "double_pendulum": "double_pendulum_description/urdf/double_pendulum.urdf",
    "double_pendulum_continuous": "double_pendulum_description/urdf/double_pendulum_continuous.urdf",
    "double_pendulum_simple": "double_pendulum_description/urdf/double_pendulum_simple.urdf",
    # hands
    "allegro_left_hand": "allegro_hand_description/urdf/allegro_left_hand.urdf",
    "allegro_right_hand": "allegro_hand_description/urdf/allegro_right_hand.urdf",
    # legged
    "solo8": "solo_description/robots/solo.urdf",
    "solo12": "solo_description/robots/solo12.urdf",
    "bolt": "bolt_description/robots/bolt.urdf",
    "go1": "go1_description/urdf/go1.urdf",
    "go2": "go2_description/urdf/go2.urdf",
    "a1": "a1_description/urdf/a1.urdf",
    "b1": "b1_description/urdf/b1.urdf",
    "b1_z1": "b1_description/urdf/b1-z1.urdf",
    "laikago": "laikago_description/urdf/laikago.urdf",
    "anymal": "anymal_b_simple_description/robots/anymal.urdf",
    "anymal_kinova": "anymal_b_simple_description/robots/anymal-kinova.urdf",
    "anymal_c": "anymal_c_simple_description/urdf/anymal.urdf",
    "hyq": "hyq_description/robots/hyq_no_sensors.urdf",
    "quadruped": "quadruped_description/urdf/quadruped.urdf",
    # humanoids and mobile manipulators
    "talos": "talos_data/robots/talos_reduced.urdf",
    "talos_box": "talos_data/robots/talos_reduced_box.urdf",
    "talos_full": "talos_data/robots/talos_full_v2.urdf",
    "talos_full_box": "talos_data/robots/talos_full_v2_box.urdf",
    "talos_arm": "talos_data/robots/talos_left_arm.urdf",
    "g1": "g1_description/urdf/g1_29dof_rev_1_0.urdf",
    "g1_with_hand": "g1_description/urdf/g1_29dof_with_hand_rev_1_0.urdf",
    "icub": "icub_description/robots/icub.urdf",
    "icub_reduced": "icub_description/robots/icub_reduced.urdf",
    "romeo": "romeo_description/urdf/romeo.urdf",
    "romeo_small": "romeo_description/urdf/romeo_small.urdf",
    "simple_humanoid": "simple_humanoid_description/urdf/simple_humanoid.urdf",
    "simple_humanoid_classical": "simple_humanoid_description/urdf/simple_humanoid_classical.urdf",
    "human": "human_description/robots/human.urdf",
    "alex_nub_hands": "alex_description/urdf/alex_nub_hands.urdf",
    "alex_psyonic_hands": "alex_description/urdf/alex_psyonic_hands.urdf",
    "alex_sake_hands": "alex_description/urdf/alex_sake_hands.urdf",
    "alexander": "alexander_description/urdf/alexander_v1.lowerBodyOnly.urdf",
    "centauro": "centauro_description/urdf/centauro.urdf",
    "pr2": "pr2_description/urdf/pr2.urdf",
    "tiago": "tiago_description/robots/tiago.urdf",
    "tiago_dual": "tiago_description/robots/tiago_dual.urdf",
    "tiago_no_hand": "tiago_description/robots/tiago_no_hand.urdf",
    "tiago_pro": "tiago_pro_description/robots/tiago_pro.urdf",
    # aerial
    "hector": "hector_description/robots/quadrotor_base.urdf",
    "iris": "iris_description/robots/iris.urdf",
    "iris_simple": "iris_description/robots/iris_simple.urdf",
    "borinot": "borinot_description/urdf/borinot_flying_arm_2.urdf",
    "hextilt": "hextilt_description/urdf/hextilt_flying_arm_5.urdf",
}


def _site_dirs() -> Iterator[Path]:
    """Every directory an installed wheel may live in, most specific first."""
    for key in ("purelib", "platlib"):
        yield Path(sysconfig.get_paths()[key])
    # site.getsitepackages is missing in some embedded interpreters.
    if hasattr(site, "getsitepackages"):
        yield from map(Path, site.getsitepackages())
    if site.ENABLE_USER_SITE:
        yield Path(site.getusersitepackages())
    for entry in sys.path:
        if entry:
            yield Path(entry)


def _candidate_roots() -> Iterator[Path]:
    """Places the robots tree may be, in the order they are tried."""
    # The installed distribution's own record is exact when pip installed it.
    try:
        dist = importlib.metadata.distribution(_DIST_NAME)
    except importlib.metadata.PackageNotFoundError:
        pass
    else:
        yield Path(dist.locate_file(_CMEEL_SHARE))
    for site_dir in _site_dirs():
        yield site_dir / _CMEEL_SHARE
    # conda, robotpkg and ROS install to <prefix>/share.
    for prefix in (sys.prefix, sys.base_prefix):
        yield Path(prefix) / _SHARE


def example_robot_data_dir() -> Path:
    """The root of the installed example-robot-data ``robots`` tree.

    Looked up in the installed distribution's metadata, then in every
    site-packages directory (the cmeel wheel puts it under
    ``cmeel.prefix/share/example-robot-data/robots``), then under
    ``sys.prefix/share`` (conda, robotpkg). Nothing is imported from the package.

    Returns:
        An absolute path to an existing directory.

    Raises:
        MissingDependencyError: the package is not installed (an ImportError);
            the message says to ``pip install example-robot-data``.
    """
    for root in _candidate_roots():
        if root.is_dir():
            return root.resolve()
    raise MissingDependencyError(_INSTALL_HINT, name=_DIST_NAME)


def _installed_version() -> str:
    try:
        return importlib.metadata.version(_DIST_NAME)
    except importlib.metadata.PackageNotFoundError:
        return "of unknown version"


def list_example_robots() -> tuple[str, ...]:
    """Short names accepted after ``"example-robot-data:"``, sorted.

    Only names whose URDF file exists in the installed package are listed.

    Raises:
        MissingDependencyError: the package is not installed.
    """
    root = example_robot_data_dir()
    return tuple(sorted(n for n, rel in EXAMPLE_ROBOTS.items() if (root / rel).is_file()))


def example_robot_path(name: str) -> Path:
    """The URDF file of an example-robot-data robot.

    Args:
        name: a short name from :func:`list_example_robots` (``"ur5"``,
            ``"solo12"``; a trailing ``".urdf"`` is ignored), or a path
            relative to the robots root that contains a ``/``
            (``"ur_description/urdf/ur5_gripper.urdf"``).

    Raises:
        MissingDependencyError: the package is not installed.
        UnknownRobotError: no such robot in the installed package.
    """
    root = example_robot_data_dir()
    if "/" in name:
        path = (root / name).resolve()
        # A relative path must stay inside the tree ("../../etc" is refused).
        if path.suffix == ".urdf" and path.is_file() and path.is_relative_to(root):
            return path
        raise UnknownRobotError(
            name,
            list_example_robots(),
            kind="example-robot-data file",
            hint=f"no such URDF file under {root}",
        )
    short = name.removesuffix(".urdf")
    rel = EXAMPLE_ROBOTS.get(short)
    if rel is not None and (root / rel).is_file():
        return root / rel
    hint = (
        f"{short!r} is not in the installed example-robot-data {_installed_version()}"
        if rel is not None
        else "a path relative to the robots root (with '/') is accepted too"
    )
    raise UnknownRobotError(short, list_example_robots(), kind="example-robot-data robot", hint=hint)
