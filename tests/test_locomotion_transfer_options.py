"""``benchmarks/locomotion_transfer.py --blind-actor``: a blind actor's checkpoint
(``benchmarks/locomotion.py --blind-actor``) loads as a blind actor, runs in
MuJoCo on the full observation without reading its privileged columns, and a
privileged policy is refused by name.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("mujoco")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import locomotion_transfer as lt  # noqa: E402
from locomotion import PRIVILEGED, blind_actor  # noqa: E402

from backdrive._errors import InputError  # noqa: E402
from backdrive.optim import GO1_WALK_SHAC, PolicyTrainer  # noqa: E402


def test_transfer_and_training_agree_on_the_privileged_columns():
    assert lt.PRIVILEGED == PRIVILEGED


@pytest.fixture(scope="module")
def blind_checkpoint(tmp_path_factory):
    """A Go1 blind actor's checkpoint as ``benchmarks/locomotion.py --blind-actor`` writes it,
    its first layer moved off its initial weights (the privileged columns kept at 0)."""
    torch.manual_seed(0)
    env = GO1_WALK_SHAC.make_env(num_envs=2)
    trainer = PolicyTrainer(env, config=GO1_WALK_SHAC.config, policy=blind_actor(env, GO1_WALK_SHAC))
    with torch.no_grad():
        first = trainer.policy.net[0].weight
        first.add_(0.3 * torch.randn_like(first))
        first[:, PRIVILEGED] = 0.0
    path = tmp_path_factory.mktemp("blind") / "go1_blind.pt"
    trainer.save(path)
    return path


def test_blind_checkpoint_loads_and_ignores_the_privileged_columns(blind_checkpoint):
    torch.set_num_threads(1)
    env, policy = lt.load_actor("go1", 2, str(blind_checkpoint), "go1_walk_shac", blind=True)
    assert env.privileged and env.obs_dim == 51 and env.robot_name == "go1"
    assert lt.privileged_weight(policy) == 0.0
    check = lt.BlindCheck(policy)
    mj = lt.run_mujoco(env, check, "matched", seconds=0.2, settle=0.0)
    # The privileged columns were computed from MuJoCo's state and varied; zeroing them moved no action.
    assert check.worst == 0.0 and mj["upright"] == 1.0
    # The wrapper returns the policy's own actions: the same rollout without it.
    assert lt.run_mujoco(env, policy, "matched", seconds=0.2, settle=0.0) == mj


def test_blind_check_sees_a_privileged_policy(blind_checkpoint):
    torch.set_num_threads(1)
    env, policy = lt.load_actor("go1", 2, str(blind_checkpoint), "go1_walk_shac")
    with torch.no_grad():
        policy.net[0].weight[5, 49] = 0.5  # one weight from the base's vertical velocity
    with pytest.raises(InputError, match=r"observation 49 \(base velocity z\) reach 0\.5"):
        lt.require_blind(policy, "this policy")
    check = lt.BlindCheck(policy)
    lt.run_mujoco(env, check, "matched", seconds=0.1, settle=0.0)
    assert check.worst > 0.0


def test_blind_actor_option_refuses_the_shipped_privileged_policy():
    with pytest.raises(InputError, match="the shipped go1 policy is not a blind actor"):
        lt.load_actor("go1", 2, blind=True)
