"""An evaluation between SHAC updates never changes the training (issue 12, 15th session).

A learning curve must not depend on where it is sampled: ``benchmarks/locomotion.py --reach``
evaluates after some updates, the instrumented scripts after others, and both must train the
same policy. The trainer draws every random number from its own generator and the env's
(``PolicyTrainer.generator``, ``DiffEnv._generator``), so neither an evaluation nor anything
else that uses torch's global generator between updates can change it.
"""

from __future__ import annotations

import pytest
import torch

from backdrive.envs import Pendulum, QuadrupedWalk
from backdrive.optim import QUADRUPED_WALK_SHAC, train_policy


def _snapshot(trainer) -> list[torch.Tensor]:
    """Everything an update changes: policy, critic, target critic, the normaliser, both Adam
    states' tensors, the env state and both generators' states."""
    out = [t.detach().clone() for m in (trainer.policy, trainer.critic, trainer.target_critic)
           for t in m.state_dict().values()]
    for opt in (trainer.actor_opt, trainer.critic_opt):
        for state in opt.state.values():
            out += [v.detach().clone() for v in state.values() if isinstance(v, torch.Tensor)]
    return out + [trainer.env.state.detach().clone(), trainer.generator.get_state(),
                  trainer.env._generator.get_state()]


def _identical(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(x.dtype == y.dtype and torch.equal(x, y) for x, y in zip(a, b))


def _pendulum_trainer(**kw):
    return train_policy(Pendulum(8, max_episode_steps=20), "shac", updates=0, horizon=4, seed=3,
                        action_noise=0.2, critic_batch_size=16, **kw)


def test_evaluations_that_draw_from_the_global_generator_leave_training_unchanged():
    plain = _pendulum_trainer().train(6)

    def eval_fn(policy):
        # An evaluation of its own: a fresh env rolled out, and the global generator consumed
        # and reseeded, as a careless evaluation (or a user's code between updates) might do.
        env = Pendulum(4)
        obs = env.reset(seed=int(torch.randint(1000, ())))
        total = 0.0
        for _ in range(5):
            obs, reward, *_ = env.step(policy(obs) + 0.1 * torch.randn(4, 1, dtype=obs.dtype))
            total += float(reward.sum())
        torch.manual_seed(12345)
        return total

    evaluated = _pendulum_trainer().train(6, eval_fn=eval_fn, eval_every=1)
    assert all(r["eval_return"] == r["eval_return"] for r in evaluated.history)  # every update was evaluated
    assert _identical(_snapshot(plain), _snapshot(evaluated))
    assert [r["actor_loss"] for r in plain.history] == [r["actor_loss"] for r in evaluated.history]


def test_update_by_update_with_global_draws_between_equals_one_call():
    # The instrumented scripts' loop (train(k) for k = 1, 2, ...) against --reach's (train to each
    # evaluation point), with the global generator disturbed between the calls.
    one = _pendulum_trainer(random_episode_start=True).train(5)
    step = _pendulum_trainer(random_episode_start=True)
    for k in range(1, 6):
        step.train(k)
        torch.rand(100)
        torch.manual_seed(k)
    assert _identical(_snapshot(one), _snapshot(step))


def test_the_snapshot_sees_a_change():
    # The comparison above could not pass by accident: another seed, or one more update, differs.
    a = _pendulum_trainer().train(3)
    assert not _identical(_snapshot(a), _snapshot(train_policy(
        Pendulum(8, max_episode_steps=20), "shac", updates=3, horizon=4, seed=4, action_noise=0.2,
        critic_batch_size=16)))
    assert not _identical(_snapshot(a), _snapshot(_pendulum_trainer().train(4)))


@pytest.mark.parametrize("evaluate_after", [(1,), (1, 2)])
def test_quadruped_few_copy_setting_is_independent_of_evaluations(evaluate_after):
    # The reach setting's code paths (capped actor step, staggered 2-s episodes, action noise) on a
    # small quadruped batch, with QuadrupedWalk.evaluate (its own env, 0.2 s) between updates.
    kw = dict(updates=0, seed=0, num_threads=1, horizon=4, lr=2e-3, lr_decay_updates=200,
              max_action_change=0.015, random_episode_start=True, hidden=(32, 32))
    env_kw = {k: v for k, v in QUADRUPED_WALK_SHAC.env_kwargs.items() if k != "num_envs"}

    def trainer():
        return train_policy(QuadrupedWalk(4, max_episode_steps=6, **env_kw), "shac", **kw)

    plain = trainer().train(3)
    evaluated = trainer()
    for k in range(1, 4):
        evaluated.train(k)
        if k in evaluate_after:
            env = QuadrupedWalk(2, **env_kw)
            with torch.no_grad():
                m = env.evaluate(evaluated.policy.eval(), seconds=0.2, seed=999)
            evaluated.policy.train()
            assert m["rewards"].shape == (10, 2)
    assert _identical(_snapshot(plain), _snapshot(evaluated))


def test_reach_curves_record_their_provenance():
    # --reach writes the source commit, torch version and CPU kernels beside each curve: the
    # training is reproducible only when they agree (a rounding change alters the curve).
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import locomotion as loco

    p = loco.provenance()
    assert p["torch"] == torch.__version__
    assert p["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert p["threads"] == torch.get_num_threads()
    # In a git checkout: a 40-hex commit and a bool; outside one both are None.
    assert (p["git_commit"] is None and p["src_modified"] is None) or (
        len(p["git_commit"]) == 40 and int(p["git_commit"], 16) >= 0 and isinstance(p["src_modified"], bool))
