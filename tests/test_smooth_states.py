"""``smooth_states``: a local-quadratic (Savitzky-Golay) smoother of recorded
states on the configuration manifold: exact on polynomial motions, the
expected noise reduction, the ends of a recording, bad input."""

from __future__ import annotations

import pytest
import torch

from backdrive import InputError
from backdrive.data import load
from backdrive.optim import smooth_states
from backdrive.spatial import quat_multiply, rotvec_to_quat

F64 = torch.float64
DT = 0.002


@pytest.fixture(scope="module")
def robot():
    return load("quadruped", floating_base=True, dtype=F64)


def _quadratic_motion(robot, T=120):
    """Joints and base height quadratic in time, the base turning about a
    fixed axis by a quadratic angle; the velocities linear."""
    t = torch.arange(T, dtype=F64) * DT
    q = robot.neutral().expand(T, -1).clone()
    q[:, 7:] = 0.4 + 0.5 * t[:, None] - 3.0 * t[:, None] ** 2 * torch.linspace(0.5, 1.5, 12, dtype=F64)
    axis = torch.tensor([0.3, -0.5, 0.8], dtype=F64) / torch.tensor([0.3, -0.5, 0.8], dtype=F64).norm()
    q[:, 3:7] = rotvec_to_quat((0.2 * t + 4.0 * t**2)[:, None] * axis)
    v = torch.zeros(T, robot.nv, dtype=F64)
    v[:, 6:] = 0.5 - 6.0 * t[:, None] * torch.linspace(0.5, 1.5, 12, dtype=F64)
    v[:, 3:6] = (0.2 + 8.0 * t)[:, None] * axis
    return q, v


def test_polynomial_motion_passes_unchanged(robot):
    """A motion quadratic in the tangent coordinates (joints, a turn about a
    fixed axis) and linear velocities come back to 1e-12, at the ends of
    the recording too (fewer samples fitted there)."""
    q, v = _quadratic_motion(robot)
    qs, vs = smooth_states(robot, q, v, 8)
    assert (qs - q).abs().max() < 1e-12
    assert (vs - v).abs().max() < 1e-12


def test_white_noise_shrinks_as_the_weights_say(robot):
    """White joint noise of 1e-3 rad: at interior samples about 0.32 of it
    is left with half-width 10 (the weights' norm, sqrt(sum w^2) = 0.328),
    the base orientation likewise; the polynomial under it is kept."""
    q, v = _quadratic_motion(robot, T=600)
    g = torch.Generator().manual_seed(0)
    qn = q.clone()
    qn[:, 7:] += 1e-3 * torch.randn(600, 12, generator=g, dtype=F64)
    qn[:, 3:7] = quat_multiply(qn[:, 3:7], rotvec_to_quat(2e-3 * torch.randn(600, 3, generator=g, dtype=F64)))
    qs, _ = smooth_states(robot, qn, v, 10)
    left = (qs[20:-20, 7:] - q[20:-20, 7:]).std() / 1e-3
    assert 0.28 < float(left) < 0.37
    from backdrive.dynamics import difference

    turn = difference(robot, q[20:-20], qs[20:-20])[:, 3:6].std() / 2e-3
    assert 0.28 < float(turn) < 0.37


def test_batches_of_recordings(robot):
    """Leading batch axes: each recording is smoothed on its own."""
    q, v = _quadratic_motion(robot, T=50)
    qb = torch.stack([q, q.flip(0)])
    vb = torch.stack([v, v.flip(0)])
    qs, vs = smooth_states(robot, qb, vb, 5)
    one, _ = smooth_states(robot, q.flip(0), v.flip(0), 5)
    assert torch.allclose(qs[1], one, atol=1e-14)
    assert qs.shape == qb.shape and vs.shape == vb.shape


def test_bad_settings_give_typed_errors(robot):
    q, v = _quadratic_motion(robot, T=20)
    for hw in (0, -1, 1.5, True):
        with pytest.raises(InputError, match="half_width"):
            smooth_states(robot, q, v, hw)
    with pytest.raises(InputError, match="degree"):
        smooth_states(robot, q, v, 2, degree=5)
    with pytest.raises(InputError, match="same T"):
        smooth_states(robot, q, v[:-1], 2)
    with pytest.raises(InputError):
        smooth_states(robot, q[:, :-1], v, 2)
