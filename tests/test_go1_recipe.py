"""GO1_WALK_SHAC_LONG (16th session, issue 12): the Go1 recipe that follows the command.

No training here: the preset's settings, the env it builds and where it is registered
(``PRESETS``, ``examples/quadruped_walk.py --preset``, ``benchmarks/locomotion.py --preset``).
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import torch

from _robots import go1_robot  # shared fixture

ROOT = Path(__file__).resolve().parents[1]


def test_long_preset_is_the_slip_recipe_run_longer_with_the_decay_ending_at_its_last_update():
    from backdrive.optim import GO1_WALK_SHAC_SLIP
    from backdrive.optim._policy import presets as P

    long = P.GO1_WALK_SHAC_LONG
    assert "GO1_WALK_SHAC_LONG" in P.__all__
    assert P.PRESETS["go1_walk_shac_long"] is long and P.get_preset("GO1_WALK_SHAC_LONG") is long
    assert long.updates == 300 and long.config.lr_decay_updates == 300
    # Only the run length and the decay differ from the shipped Go1 recipe (which decays to 0 at 167
    # and stops at 150, i.e. at 0.1x).
    assert GO1_WALK_SHAC_SLIP.updates == 150 and GO1_WALK_SHAC_SLIP.config.lr_decay_updates == 167
    assert long.config == GO1_WALK_SHAC_SLIP.config.replace(lr_decay_updates=300)
    assert dataclasses.replace(long.config, lr_decay_updates=167) == GO1_WALK_SHAC_SLIP.config
    assert dict(long.env_kwargs) == dict(GO1_WALK_SHAC_SLIP.env_kwargs)
    assert long.config.algo == "shac" and long.config.lr == 1e-3 and long.config.critic_lr == 1e-3
    assert long.env_steps == 300 * 64 * 8
    assert long.summary  # the measured numbers


def test_long_preset_builds_its_go1_env():
    from backdrive.envs import QuadrupedWalk
    from backdrive.envs._quadruped import REWARD_WEIGHTS
    from backdrive.optim import GO1_WALK_SHAC_SLIP, QUADRUPED_WALK_SHAC
    from backdrive.optim._policy.presets import GO1_WALK_SHAC_LONG as long

    go1_robot()
    env = long.make_env(num_envs=2)
    assert isinstance(env, QuadrupedWalk) and env.num_envs == 2
    assert env.robot_name == "go1" and env.privileged and env.gait_frequency == 3.0
    assert env.randomization is None
    assert env.reward_weights == {**REWARD_WEIGHTS, "foot_slip": 0.5}
    # Forward commands drawn per episode over 0.2-0.8 m/s and observed (the command part of the observation).
    assert env.command_ranges["vx"] == (0.2, 0.8) and env.command_ranges["yaw"] == (0.0, 0.0)
    obs = env.reset(seed=3)
    assert obs.shape == (2, 51)
    cmd = env.split(env.state)["command"]
    assert torch.all((cmd[:, 0] >= 0.2) & (cmd[:, 0] <= 0.8)) and torch.equal(obs[:, 42:45], cmd)
    assert long.mismatches(long.make_env()) == [] and long.mismatches(GO1_WALK_SHAC_SLIP.make_env()) == []
    assert long.mismatches(QUADRUPED_WALK_SHAC.make_env()) != []


def test_long_preset_is_a_choice_of_the_example_and_of_the_benchmark():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import locomotion as loco
    finally:
        sys.path.pop(0)
    from backdrive.optim._policy.presets import GO1_WALK_SHAC_LONG

    assert loco.SHAC_PRESETS["go1_walk_shac_long"] is GO1_WALK_SHAC_LONG
    assert loco.shac_preset("go1_walk_shac_long") is GO1_WALK_SHAC_LONG
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "quadruped_walk.py"), "--help"],
                         capture_output=True, text=True, check=True, timeout=300).stdout
    assert "go1_walk_shac_long" in out
