"""``benchmarks/calibration.py``: the commands sent before a window
(``history``), MuJoCo's hidden soft contact as reality, and the floor of
backdrive with MuJoCo's contact model against it."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

mujoco = pytest.importorskip("mujoco")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import calibration as CAL  # noqa: E402

from backdrive.data import load  # noqa: E402

F64 = torch.float64


def test_history_is_what_the_delayed_servo_received():
    cmd = np.arange(10.0)[:, None] * np.ones((1, 2))
    h = CAL.history(cmd, np.array([0, 2, 7]), n=3)
    assert h.shape == (3, 3, 2)
    assert h[0, :, 0].tolist() == [0, 0, 0]  # before the recording: its first command
    assert h[1, :, 0].tolist() == [0, 0, 1]
    assert h[2, :, 0].tolist() == [4, 5, 6]


def test_prediction_with_history_is_exact_on_its_own_simulator():
    """backdrive's own reality (delay drawn 1-3 steps): its true simulator
    predicts every held-out window to rounding when the windows get the
    commands sent before them, and not without them (a delayed window's
    first steps then hold its first command)."""
    torch.set_num_threads(1)
    robot = load("quadruped", floating_base=True)
    sim, truth = CAL.backdrive_reality(robot, 0)
    q, v, cmd, push = CAL.record_backdrive(sim, "quadruped", 0.3, 1, truth["delay"], 1)[0]
    a, b, c, st = CAL.segments(q, v, cmd, push, 25)
    args = [torch.as_tensor(x, dtype=F64) for x in (a, b, c)]
    with_h = CAL.prediction_error(sim, *args, truth["delay"], 25, history=torch.as_tensor(CAL.history(cmd, st)))
    without = CAL.prediction_error(sim, *args, truth["delay"], 25)
    assert truth["delay"] >= 1
    assert max(with_h) < 1e-10
    assert without[0] > 1e-6


def test_hidden_soft_contact_reality():
    """``--contact hidden``: the same draws as ``native`` for the other
    parameters, a time constant in [0.01, 0.04] s and a damping ratio in
    [0.5, 1.5] on the feet, and the mass-dependent constants recomputed for
    the scaled masses (the feet's ``body_invweight0`` moves with them)."""
    native, t0 = CAL.reality("quadruped", 3, "native")
    hidden, t1 = CAL.reality("quadruped", 3, "hidden")
    assert t1["friction"] == t0["friction"] and t1["delay"] == t0["delay"]
    assert np.array_equal(t1["mass_factor"], t0["mass_factor"])
    assert 0.01 <= t1["timeconst"] <= 0.04 and 0.5 <= t1["dampratio"] <= 1.5
    import _mujoco_contact as MC

    feet = MC._foot_geoms(hidden, MC.ROBOTS["quadruped"])
    assert np.allclose(hidden.geom_solref[feet], [t1["timeconst"], t1["dampratio"]])
    body = hidden.geom_bodyid[feet]
    assert not np.allclose(hidden.body_invweight0[body, 0], native.body_invweight0[body, 0], rtol=1e-3)


def test_soft_law_floor_against_hidden_mujoco(capsys):
    """With every hidden value at its truth, backdrive's MuJoCo contact
    model predicts MuJoCo's held-out 50 ms windows at least 1000x better than
    the nominal guess (measured: 1e4-1e5x)."""
    torch.set_num_threads(1)
    _, rows, truth = CAL.main(["--law", "soft", "--contact", "hidden", "--no-fit", "--seconds", "1",
                               "--heldout", "0.6", "--horizon", "25", "--seed", "1"])
    nominal, true = rows[0], rows[1]
    assert true[0].startswith("TRUE parameters")
    assert all(n / t > 1000 for n, t in zip(nominal[1:], true[1:]))
    assert "hidden contact" in capsys.readouterr().out


def test_a_fall_ends_a_piece_and_no_window_holds_a_fallen_robot():
    """Seed 2's calibration recording tips the robot over after its second
    push (its feet alone collide, so it used to sink through the floor and hang
    from its feet for the rest of the recording). Now each fall is reset to
    standing, the steps around it are masked, and every calibration window
    holds an upright robot with its trunk well above the floor."""
    robot = load("quadruped", floating_base=True)
    model, truth = CAL.reality("quadruped", 2, "hidden")
    q, v, cmd, mask, falls = CAL.record(model, "quadruped", robot, 20.0, 3, truth["delay"])
    assert len(falls) >= 1 and np.isfinite(q).all()
    stand = CAL.MC.ROBOTS["quadruped"].stand_height
    # the reset: the step after a fall is standing at rest
    for k in falls:
        assert mask[k] and q[k, 2] == pytest.approx(q[0, 2], abs=1e-9) and not v[k].any()
    wq, wv, wc, starts = CAL.segments(q, v, cmd, mask, 50)
    assert len(starts) > 100
    up = 1 - 2 * (wq[..., 4] ** 2 + wq[..., 5] ** 2)  # the trunk's z axis, world z component (w, x, y, z)
    assert (wq[..., 2] > 0.5 * stand).all() and (up > 0.5).all()
    # windows never straddle a reset
    for k in falls:
        assert not ((starts <= k) & (k <= starts + 50)).any()


def test_window_start_diagnostic_reports_noise_level_exact_starts(capsys):
    """``benchmarks/calibration_windows.py``: from the exact start at the
    true parameters every window's loss is the noise's (about ``m`` for
    ``m`` residuals and start-prior rows), and the fitted start never does
    worse than the recorded one (Levenberg-Marquardt only accepts
    improvements)."""
    import calibration_windows as CW

    CW.main(["--seed", "2", "--windows", "3", "--iterations", "1", "--segment", "10"])
    rows = [line.split("|")[1:-1] for line in capsys.readouterr().out.splitlines()
            if line.startswith("| ") and line[2].isdigit()]
    assert len(rows) == 3
    m = 10 * (12 + 12 + 3 + 3) + 36  # residuals of 10 steps, plus the 2 nv start-prior rows
    for window, exact, recorded, fitted, *_ in rows:
        exact, recorded, fitted = float(exact), float(recorded), float(fitted)
        assert abs(exact - m) < 6 * (2 * m) ** 0.5, (window, exact)
        assert fitted <= recorded, (window, fitted, recorded)
