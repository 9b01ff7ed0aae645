"""The fine-tuning recipe of ``benchmarks/calibration_loop.py``: the critic
warm-up leaves the shipped actor untouched, the actor moves after it, and the
proximal anchor pulls it back to the shipped weights."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("mujoco")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import calibration_loop as cl  # noqa: E402

from backdrive.envs import QuadrupedWalk  # noqa: E402


def _weights(module):
    return [p.detach().clone() for p in module.parameters()]


def test_critic_warmup_freezes_the_actor_and_anchor_pulls_back():
    torch.set_num_threads(1)
    _, shipped = QuadrupedWalk.pretrained(1)
    w0 = _weights(shipped)
    stats = shipped.normalizer.mean.clone()

    # Two critic-only updates: the actor (and its observation statistics) is the shipped one.
    policy, trainer, drift = cl.fine_tune_policy(cl.make_env(None, 2), shipped, updates=2, warmup=2, lr=1e-3)
    assert drift == 0.0 and trainer.updates_done == 2
    assert all(torch.equal(a, b) for a, b in zip(_weights(policy), w0))
    assert torch.equal(policy.normalizer.mean, stats)
    assert all(torch.isfinite(torch.tensor(r["critic_loss"])) for r in trainer.history)

    # One warm-up update, then one actor step: the actor moves.
    policy, _, drift = cl.fine_tune_policy(cl.make_env(None, 2), shipped, updates=2, warmup=1, lr=1e-3)
    assert drift > 1e-5
    assert not all(torch.equal(a, b) for a, b in zip(_weights(policy), w0))

    # anchor = 1 returns every weight to the shipped one after each actor step.
    policy, _, drift = cl.fine_tune_policy(cl.make_env(None, 2), shipped, updates=2, warmup=1, lr=1e-3, anchor=1.0)
    assert drift < 1e-9  # float32 rounding of w - (w - w0)
    # The shipped policy itself is never modified.
    assert all(torch.equal(a, b) for a, b in zip(_weights(shipped), w0))
