"""backdrive.viz without a browser: plots, mesh lookup, recordings, the live viewer."""

from __future__ import annotations

import base64
import re
import subprocess
import sys
import textwrap
import urllib.request
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

import backdrive
import backdrive.viz as viz
from backdrive import InputError, RobotModel
from backdrive.kinematics import forward_kinematics
from backdrive.viz._scene import matrix_to_wxyz, robot_shapes

PANDA = Path(backdrive.__file__).parent / "data" / "robots" / "panda.urdf"


def _png_size(path: Path) -> tuple[int, int]:
    """Width and height from the PNG header (no image library needed)."""
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")


def _recording(html: str) -> dict:
    """Decode the viser recording embedded in a preview page."""
    import zstandard
    import msgspec
    data = re.search(r'window\.__VISER_EMBED_DATA__="([^"]*)"', html)
    assert data, "no embedded recording in the page"
    raw = base64.b64decode(data.group(1))
    inner = zstandard.ZstdDecompressor().decompress(raw[8:], max_output_size=int.from_bytes(raw[:8], "little"))
    n = int.from_bytes(inner[:8], "little")
    return msgspec.msgpack.decode(inner[8 : 8 + n])


@pytest.fixture(scope="module")
def panda() -> RobotModel:
    return RobotModel.from_urdf(PANDA)


def test_all_resolves():
    assert len(set(viz.__all__)) == len(viz.__all__)
    for name in viz.__all__:
        assert getattr(viz, name) is not None, name


def test_imports_without_viz_extra_and_names_it():
    code = textwrap.dedent(
        """
        import sys
        for mod in ("viser", "matplotlib", "trimesh"):
            sys.modules[mod] = None  # makes `import mod` fail
        import backdrive.viz as viz
        assert not any(m.split(".")[0] in ("viser", "matplotlib", "trimesh")
                       for m, v in sys.modules.items() if v is not None)
        for call in (lambda: viz.plot_losses({"a": [1.0]}, "x.png"),
                     lambda: viz.preview("robot.urdf", path="x")):
            try:
                call()
            except viz.MissingExtraError as exc:
                assert "backdrive[viz]" in str(exc), exc
                assert isinstance(exc, ImportError)
            else:
                raise AssertionError("no MissingExtraError")
        print("ok")
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


# --------------------------------------------------------------------------- plots


def test_plots_write_pngs_of_the_requested_size(tmp_path):
    rng = np.random.default_rng(0)
    t = np.linspace(0.0, 2.0, 50)
    written = [
        viz.plot_losses({"Adam": np.exp(-t), "backdrive": torch.exp(-3 * torch.as_tensor(t))}, tmp_path / "loss"),
        viz.plot_joint_trajectories(t, np.sin(t[:, None] * np.arange(1, 4)), ["a", "b", "c"], tmp_path / "q.png",
                                    lower=[-1, -1, -np.inf], upper=[1, 1, np.inf]),
        viz.plot_ik_errors(np.abs(rng.normal(0, 1e-3, 200)), np.abs(rng.normal(0, 1e-2, 200)), tmp_path / "ik.png"),
        viz.plot_parameters([1.0, 2.0, 3.0], [1.1, 1.9, 3.0], ["m1", "m2", "d"], tmp_path / "p.png", initial=[2, 2, 2]),
    ]
    assert [p.name for p in written] == ["loss.png", "q.png", "ik.png", "p.png"]
    for p in written:
        assert p.stat().st_size > 5000, p
        assert _png_size(p) == viz._plots.DEFAULT_SIZE
    small = viz.plot_losses({"x": [3.0, 2.0, 1.0]}, tmp_path / "deep" / "small.png", log=False, size=(320, 240))
    assert _png_size(small) == (320, 240)


def test_plots_reject_bad_shapes(tmp_path):
    with pytest.raises(InputError):
        viz.plot_joint_trajectories([0, 1, 2], np.zeros((4, 2)), None, tmp_path / "x.png")
    with pytest.raises(InputError):
        viz.plot_parameters([1, 2], [1, 2, 3], None, tmp_path / "x.png")
    with pytest.raises(InputError):
        viz.plot_losses({}, tmp_path / "x.png")


# --------------------------------------------------------------------------- geometry


def test_matrix_to_wxyz_round_trip_including_half_turns():
    g = torch.Generator().manual_seed(0)
    q = torch.randn(500, 4, generator=g, dtype=torch.float64)
    axes = torch.eye(3, dtype=torch.float64)
    q = torch.cat([q, torch.cat([torch.zeros(3, 1, dtype=torch.float64), axes], 1)])  # 180 degree turns
    q = q / q.norm(dim=-1, keepdim=True)
    q = torch.where(q[:, :1] < 0, -q, q)
    w, x, y, z = q.unbind(-1)
    R = torch.stack([
        torch.stack([1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)], -1),
        torch.stack([2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)], -1),
        torch.stack([2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)], -1),
    ], -2).numpy()
    got = matrix_to_wxyz(R)
    ref = q.numpy()
    # q and -q are the same rotation; at w = 0 either sign is correct.
    err = np.minimum(np.abs(got - ref).max(-1), np.abs(got + ref).max(-1))
    assert err.max() < 1e-12


def test_resolve_mesh_path(tmp_path):
    pkg = tmp_path / "ws" / "my_robot"
    (pkg / "meshes").mkdir(parents=True)
    (pkg / "urdf").mkdir()
    mesh = pkg / "meshes" / "a.stl"
    mesh.write_bytes(b"solid x\nendsolid x\n")
    urdf_dir = pkg / "urdf"
    r = viz.resolve_mesh_path
    assert r("package://my_robot/meshes/a.stl", urdf_dir=urdf_dir) == mesh  # an ancestor named like the package
    assert r("../meshes/a.stl", urdf_dir=urdf_dir).resolve() == mesh
    assert r(f"file://{mesh}", urdf_dir=None) == mesh
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    assert r("package://my_robot/meshes/a.stl", urdf_dir=elsewhere) is None
    assert r("package://my_robot/meshes/a.stl", urdf_dir=elsewhere, package_dirs=[tmp_path / "ws"]) == mesh
    assert r("package://my_robot/meshes/missing.stl", urdf_dir=urdf_dir) is None


def _mesh_urdf(tmp_path: Path) -> Path:
    """A two-link robot: a real STL mesh, a missing mesh, an unreadable mesh."""
    import trimesh
    (tmp_path / "meshes").mkdir()
    trimesh.creation.box(extents=(0.1, 0.2, 0.3)).export(tmp_path / "meshes" / "box.stl")
    (tmp_path / "meshes" / "garbage.stl").write_bytes(b"\x00not a mesh")
    urdf = tmp_path / "two.urdf"
    urdf.write_text(textwrap.dedent(
        """<robot name="two">
          <link name="base">
            <visual><geometry><mesh filename="meshes/box.stl" scale="2 1 1"/></geometry>
              <material name="y"><color rgba="0.9 0.8 0.1 1"/></material></visual>
            <visual><geometry><mesh filename="meshes/nowhere.dae"/></geometry></visual>
            <collision><geometry><box size="0.3 0.3 0.1"/></geometry></collision>
          </link>
          <link name="arm">
            <visual><geometry><mesh filename="meshes/garbage.stl"/></geometry></visual>
          </link>
          <joint name="j" type="revolute"><parent link="base"/><child link="arm"/>
            <origin xyz="0 0 0.2"/><axis xyz="0 0 1"/><limit lower="-2" upper="2" effort="1" velocity="1"/></joint>
        </robot>"""
    ))
    return urdf


def test_meshes_load_and_missing_ones_get_placeholders(tmp_path):
    model = RobotModel.from_urdf(_mesh_urdf(tmp_path))
    shapes, notes = robot_shapes(model)
    real = [s for s in shapes if not s.placeholder]
    assert len(real) == 1 and real[0].kind == "mesh"
    extent = real[0].vertices.max(0) - real[0].vertices.min(0)
    np.testing.assert_allclose(extent, [0.2, 0.2, 0.3], atol=1e-9)  # URDF scale applied
    assert real[0].rgba == (0.9, 0.8, 0.1, 1.0)
    assert len(notes) == 2
    assert any("nowhere.dae" in n and "not found" in n for n in notes)
    assert any("garbage.stl" in n and "unreadable" in n for n in notes)
    stand_ins = [s for s in shapes if s.placeholder]
    # base: its collision box, translucent; arm: no collision, a small box.
    assert {(s.frame, s.kind) for s in stand_ins} == {(0, "box"), (1, "box")}
    assert all(s.rgba[3] < 1 for s in stand_ins)


def test_robot_without_visuals_is_drawn_from_collisions_or_frames():
    bare = """<robot name="bare">
      <link name="a"><collision><geometry><sphere radius="0.1"/></geometry></collision></link>
      <link name="b"/>
      <joint name="j" type="continuous"><parent link="a"/><child link="b"/><axis xyz="0 0 1"/></joint>
    </robot>"""
    shapes, notes = robot_shapes(RobotModel.from_urdf(bare))
    assert [(s.kind, s.placeholder) for s in shapes] == [("sphere", False)] and not notes
    nothing = bare.replace('<collision><geometry><sphere radius="0.1"/></geometry></collision>', "")
    shapes, notes = robot_shapes(RobotModel.from_urdf(nothing))
    assert [s.frame for s in shapes] == [0, 1] and len(notes) == 1


# --------------------------------------------------------------------------- previews


def test_preview_is_one_offline_file_with_the_trajectory(panda, tmp_path):
    T = 12
    q = torch.zeros(T, panda.nq, dtype=torch.float64)
    q[:, 0] = torch.linspace(-1, 1, T, dtype=torch.float64)
    q[:, 3] = -1.5
    targets = torch.tensor([[0.4, 0.1, 0.5], [0.3, -0.2, 0.4]], dtype=torch.float64)
    out = viz.preview(panda, q, targets=targets, paths=["panda_hand_tcp"], path=tmp_path / "sub" / "p", fps=6,
                      title="Panda <test>")
    assert out == tmp_path / "sub" / "p.html"
    html = out.read_text(encoding="utf-8")
    # Self-contained: nothing referenced by URL.
    assert not re.search(r"<(script|link|img)[^>]+(src|href)=\"https?:", html)
    assert "<title>Panda &lt;test&gt;</title>" in html
    rec = _recording(html)
    assert rec["durationSeconds"] == pytest.approx(T / 6)
    msgs = [m for _, m in rec["messages"]]
    types = [m["type"] for m in msgs]
    assert types.count("CylinderMessage") + types.count("BoxMessage") == len(panda.visuals)
    assert types.count("IcosphereMessage") == 2  # the targets
    assert types.count("LineSegmentsMessage") == 1  # the TCP path
    # Link 1 turns with joint 1 in every frame: one orientation update per frame.
    link1 = "/robot/001_panda_link1"
    times = [t for t, m in rec["messages"] if m["type"] == "SetOrientationMessage" and m["name"] == link1]
    assert len(times) == T
    np.testing.assert_allclose(times, np.arange(T) / 6, atol=1e-9)
    # The last recorded pose of the hand is the FK pose at the last frame.
    hand = panda.frame_index("panda_hand")
    name = f"/robot/{hand:03d}_panda_hand"
    last = [m for m in msgs if m["type"] == "SetPositionMessage" and m["name"] == name][-1]
    ref = forward_kinematics(panda, q[-1])[hand, :3, 3].numpy()
    np.testing.assert_allclose(last["position"], ref, atol=1e-6)


def test_preview_static_pose_and_mesh_fallback_warning(tmp_path):
    model = RobotModel.from_urdf(_mesh_urdf(tmp_path))
    with pytest.warns(UserWarning, match="2 mesh"):
        out = viz.preview(model, path=tmp_path / "static.html")
    rec = _recording(out.read_text(encoding="utf-8"))
    assert rec["durationSeconds"] == 0.0  # one pose: no timeline
    with pytest.warns(UserWarning):
        assert viz.preview(model, path=tmp_path) == tmp_path / "two.html"  # a folder: named after the robot
    assert "translucent stand-ins" in out.read_text(encoding="utf-8")


def test_preview_rejects_bad_inputs(panda, tmp_path):
    with pytest.raises(InputError, match=r"\(T, nq\)"):
        viz.preview(panda, torch.zeros(5, panda.nq + 1, dtype=torch.float64), path=tmp_path / "x")
    with pytest.raises(InputError, match="NaN"):
        viz.preview(panda, np.full((2, panda.nq), np.nan), path=tmp_path / "x")
    with pytest.raises(InputError, match="targets"):
        viz.preview(panda, targets=np.zeros((2, 5)), path=tmp_path / "x")
    with pytest.raises(backdrive.UnknownNameError):
        viz.preview(panda, paths=["panda_hnd"], path=tmp_path / "x")


def test_floating_base_preview(tmp_path):
    from backdrive.data import load

    robot = load("quadruped", floating_base=True)
    q = torch.zeros(3, robot.nq, dtype=robot.dtype)
    q[:, 3] = 1.0
    q[:, 2] = torch.tensor([0.3, 0.4, 0.5], dtype=robot.dtype)
    rec = _recording(viz.preview(robot, q, path=tmp_path / "quad", fps=3).read_text(encoding="utf-8"))
    root = f"/robot/000_{robot.link_names[0]}"
    z = [m["position"][2] for _, m in rec["messages"] if m["type"] == "SetPositionMessage" and m["name"] == root]
    assert z == pytest.approx([0.3, 0.4, 0.5])


# --------------------------------------------------------------------------- live


def test_live_viewer_serves_and_moves_the_robot(panda):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        viewer = viz.LiveViewer(panda, port=0, verbose=False)
    with viewer:
        assert viewer.url.startswith("http://127.0.0.1:")
        with urllib.request.urlopen(viewer.url, timeout=30) as r:
            assert r.status == 200 and b"<html" in r.read(2000).lower()
        q = torch.linspace(-0.5, 0.5, panda.nq, dtype=torch.float64)
        viewer.update(q)
        T = forward_kinematics(panda, q).numpy()
        f = panda.frame_index("panda_link7")
        np.testing.assert_allclose(viewer._handles[f].position, T[f, :3, 3], atol=1e-9)
        viewer.show_markers(targets=[[0.3, 0.0, 0.5]], paths=[np.zeros((4, 3))])
        traj = torch.zeros(3, panda.nq, dtype=torch.float64)
        traj[:, 0] = torch.tensor([0.1, 0.2, 0.3], dtype=torch.float64)
        viewer.play(traj, fps=200)
        T = forward_kinematics(panda, traj[-1]).numpy()
        np.testing.assert_allclose(viewer._handles[f].position, T[f, :3, 3], atol=1e-9)
        with pytest.raises(InputError):
            viewer.update(torch.zeros(3, dtype=torch.float64))
        with pytest.raises(InputError):
            viewer.update(traj)
