"""Saved previews rendered in real headless Chromium (software WebGL).

The pages are opened from disk (``file://``) with every network request
blocked, so they prove that a preview works offline. Shots are taken after
scrubbing the loaded page with ``window.backdriveSeek``, which types the time
into viser's own timeline box, as a user would.

Chromium: Debian's ``chromium`` package (``make test`` installs it through the
Makefile's ``browser`` target); set ``BACKDRIVE_CHROMIUM`` to use another.
"""

from __future__ import annotations

import os
import shutil
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

import backdrive
import backdrive.viz as viz
from backdrive import RobotModel

pytestmark = pytest.mark.browser

PANDA = Path(backdrive.__file__).parent / "data" / "robots" / "panda.urdf"
SIZE = (800, 600)
#: Rows at the top (the caption) and at the bottom (the timeline) that are
#: page furniture, not the 3-D view. Screenshots hide viser's pop-up notices.
TOP, BOTTOM = 40, 60

# Saturated link colours that nothing else on the page uses.
COLOURS = {"red": (0.85, 0.1, 0.1), "green": (0.1, 0.7, 0.15), "blue": (0.1, 0.2, 0.9), "yellow": (0.95, 0.8, 0.05)}


def _rgb(png: Path) -> np.ndarray:
    from PIL import Image  # matplotlib (in [viz]) depends on pillow

    with Image.open(png) as im:
        assert im.size == SIZE
        return np.asarray(im.convert("RGB")).astype(np.int16)


def _mask(img: np.ndarray, colour: str) -> np.ndarray:
    """Pixels of a shaded link of ``colour``: its hue dominates by a wide margin."""
    r, g, b = img[..., 0], img[..., 1], img[..., 2]
    view = np.zeros(img.shape[:2], dtype=bool)
    view[TOP : SIZE[1] - BOTTOM] = True
    m = {
        "red": (r > 90) & (r > g + 60) & (r > b + 60),
        "green": (g > 70) & (g > r + 40) & (g > b + 40),
        "blue": (b > 90) & (b > r + 60) & (b > g + 40),
        "yellow": (r > 120) & (g > 100) & (r > b + 80) & (g > b + 70),
    }[colour]
    return m & view


def _centroid(mask: np.ndarray) -> np.ndarray:
    ys, xs = np.nonzero(mask)
    return np.array([xs.mean(), ys.mean()])


@pytest.fixture(scope="module")
def chromium() -> str:
    # Not skipped when missing: the browser test is part of the suite.
    return viz.find_chromium()


def _colour_arm(tmp_path: Path) -> Path:
    """An arm whose links have one saturated colour each, and one STL mesh."""
    import trimesh

    (tmp_path / "meshes").mkdir(exist_ok=True)
    trimesh.creation.icosphere(subdivisions=2, radius=1.0).export(tmp_path / "meshes" / "ball.stl")
    mat = "".join(
        f'<material name="{k}"><color rgba="{r} {g} {b} 1"/></material>' for k, (r, g, b) in COLOURS.items()
    )
    urdf = tmp_path / "colour_arm.urdf"
    urdf.write_text(textwrap.dedent(
        f"""<robot name="colour_arm">{mat}
          <link name="base"><visual><origin xyz="0 0 0.05"/><geometry><box size="0.3 0.3 0.1"/></geometry>
            <material name="grey"><color rgba="0.5 0.5 0.5 1"/></material></visual></link>
          <link name="column"><visual><origin xyz="0 0 0.2"/><geometry><cylinder radius="0.05" length="0.4"/>
            </geometry><material name="red"/></visual></link>
          <link name="arm"><visual><origin xyz="0.25 0 0"/><geometry><box size="0.5 0.08 0.08"/></geometry>
            <material name="green"/></visual></link>
          <link name="tip"><visual><geometry><sphere radius="0.08"/></geometry><material name="blue"/></visual>
            <visual><origin xyz="0 0 0.12"/><geometry><mesh filename="meshes/ball.stl" scale="0.05 0.05 0.05"/>
            </geometry><material name="yellow"/></visual></link>
          <joint name="yaw" type="revolute"><parent link="base"/><child link="column"/><origin xyz="0 0 0.1"/>
            <axis xyz="0 0 1"/><limit lower="-3" upper="3" effort="1" velocity="1"/></joint>
          <joint name="pitch" type="revolute"><parent link="column"/><child link="arm"/><origin xyz="0 0 0.4"/>
            <axis xyz="0 1 0"/><limit lower="-2" upper="2" effort="1" velocity="1"/></joint>
          <joint name="tip_fixed" type="fixed"><parent link="arm"/><child link="tip"/><origin xyz="0.5 0 0"/></joint>
        </robot>"""
    ))
    return urdf


def test_preview_draws_the_robot_and_scrubbing_moves_it(tmp_path, chromium):
    robot = RobotModel.from_urdf(_colour_arm(tmp_path))
    T, fps = 30, 15.0
    q = torch.zeros(T, robot.nq, dtype=torch.float64)
    q[:, 0] = torch.linspace(-1.3, 1.3, T, dtype=torch.float64)  # yaw sweeps the arm across the view
    q[:, 1] = -0.3
    page = viz.preview(robot, q, path=tmp_path / "arm", fps=fps)

    panda = RobotModel.from_urdf(PANDA)
    qp = torch.tensor([0.0, -0.3, 0.0, -2.2, 0.0, 2.0, 0.785, 0.02], dtype=torch.float64).repeat(10, 1)
    qp[:, 0] = torch.linspace(-1.0, 1.0, 10, dtype=torch.float64)
    targets = np.array([[0.45, -0.3, 0.45], [0.45, 0.3, 0.45]])
    panda_page = viz.preview(panda, qp, targets=targets, paths=["panda_hand_tcp"], path=tmp_path / "panda")

    end = (T - 1) / fps
    # One page load, scrubbed twice in place (as a user drags the timeline).
    shots = viz.screenshots(page, [(0.0, tmp_path / "arm_start.png"), (end, tmp_path / "arm_end.png")],
                            size=SIZE, browser=chromium)
    shots += [viz.screenshot(panda_page, tmp_path / "panda.png", t=0.0, size=SIZE, browser=chromium)]
    keep = os.environ.get("BACKDRIVE_KEEP_SCREENSHOTS")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        for s in shots:
            shutil.copy(s, Path(keep) / s.name)
    start, stop, pshot = (_rgb(s) for s in shots)

    # Every link is drawn, at both ends of the timeline.
    for img in (start, stop):
        counts = {c: int(_mask(img, c).sum()) for c in COLOURS}
        assert counts["red"] > 400 and counts["green"] > 400 and counts["blue"] > 200, counts
        assert counts["yellow"] > 150, counts  # the STL mesh
    # Scrubbing to the end moved the arm (yaw turned 2.6 rad) but not the
    # column it turns about: the scene changed because the pose did.
    arm_shift = np.linalg.norm(_centroid(_mask(start, "green")) - _centroid(_mask(stop, "green")))
    column_shift = np.linalg.norm(_centroid(_mask(start, "red")) - _centroid(_mask(stop, "red")))
    assert arm_shift > 40, arm_shift
    assert column_shift < 0.4 * arm_shift, (column_shift, arm_shift)
    changed = np.abs(start - stop).max(-1) > 40
    assert changed[TOP : SIZE[1] - BOTTOM].mean() > 0.01

    # The shipped Panda: its dark joint rings, the red targets and the blue TCP path.
    view = np.zeros(pshot.shape[:2], dtype=bool)
    view[TOP : SIZE[1] - BOTTOM] = True
    dark = (pshot.max(-1) < 70) & view
    assert dark.sum() > 500, dark.sum()
    assert _mask(pshot, "red").sum() > 100
    assert _mask(pshot, "blue").sum() > 100
    ys, xs = np.nonzero(dark)
    # The robot stands in the middle of the view, where the camera aims.
    assert SIZE[0] * 0.2 < xs.mean() < SIZE[0] * 0.8 and SIZE[1] * 0.2 < ys.mean() < SIZE[1] * 0.85
