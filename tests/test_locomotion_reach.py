"""The PPO-against-SHAC comparison table of ``benchmarks/locomotion.py`` (``reach_table``): per seed,
PPO's final and best evaluation returns and the env steps and CPU seconds each method spends to first
evaluate at or above them, on hand-made curves whose answers are known.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
import torch

from backdrive._errors import InputError

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import locomotion as loco  # noqa: E402


def _pt(steps, cpu, ret, **extra):
    return {"env_steps": steps, "train_cpu_s": cpu, "return": ret, **extra}


def _ppo(seed):
    # Rises to +500, collapses, ends at +250 (the final evaluation is the last curve point).
    curve = [_pt(0, 0.0, 96.0), _pt(100_000, 30.0, 200.0), _pt(200_000, 60.0, 500.0),
             _pt(300_000, 90.0, -1_700.0), _pt(400_000, 120.0, 250.0)]
    return {"method": "ppo", "seed": seed, "return": 250.0, "env_steps": 400_000, "train_cpu_s": 120.0,
            "curve": curve}


SHAC = [_pt(0, 2.0, -257.0, update=0), _pt(5_120, 20.0, 170.0, update=10), _pt(10_240, 40.0, 380.0, update=20),
        _pt(20_480, 80.0, 540.0, update=40)]


def test_reach_table_final_and_best():
    text, (row,) = loco.reach_table([_ppo(0)], {0: SHAC})
    assert row["ppo_final"] == 250.0 and row["ppo_best"] == 500.0
    # PPO first evaluates at or above its final +250 at 200,000 steps (its +500 point), after the +200 one.
    assert row["ppo_to_final"] == {"env_steps": 200_000, "cpu_s": 60.0,
                                   "after": {"env_steps": 100_000, "cpu_s": 30.0}}
    assert row["shac_to_final"]["env_steps"] == 10_240 and row["shac_to_final"]["after"]["env_steps"] == 5_120
    assert row["steps_ratio_final"] == pytest.approx(200_000 / 10_240)
    assert row["cpu_ratio_final"] == pytest.approx(60.0 / 40.0)
    assert row["shac_to_best"]["env_steps"] == 20_480
    assert row["steps_ratio_best"] == pytest.approx(200_000 / 20_480)
    assert row["cpu_ratio_best"] == pytest.approx(60.0 / 80.0)
    assert "| 0 | +250 (400,000 / 120 s) | +500 |" in text
    assert "| mean (1 seeds) | | | best | | | 9.8x | 0.8x |" in text


def test_reach_table_compiled_shac():
    # SHAC on the compiled env: every point's CPU includes a 30 s compile, reported on its own.
    compiled = [dict(c, train_cpu_s=c["train_cpu_s"] + 30.0, compile_cpu_s=30.0) for c in SHAC]
    text, (row,) = loco.reach_table([_ppo(0)], {0: compiled})
    assert row["shac_to_best"]["cpu_s"] == 110.0 and row["shac_to_best"]["compile_cpu_s"] == 30.0
    assert row["cpu_ratio_best"] == pytest.approx(60.0 / 110.0)
    assert row["cpu_ratio_best_excl_compile"] == pytest.approx(60.0 / 80.0)
    assert "20,480 / 110 s (incl. 30 s compile)" in text and "| 0.5x (0.8x without compile) |" in text
    _, (eager,) = loco.reach_table([_ppo(0)], {0: SHAC})
    assert eager["cpu_ratio_best_excl_compile"] is None


def test_reach_table_not_reached_and_start():
    ppo = _ppo(1)
    ppo["curve"][-1]["return"] = ppo["return"] = 50.0  # collapsed below its own untrained +96
    short = SHAC[:2]  # SHAC stopped at +170 (below PPO's best)
    _, (row,) = loco.reach_table([ppo], {1: short})
    assert row["ppo_to_final"]["env_steps"] == 0 and row["steps_ratio_final"] is None
    assert row["shac_to_best"] is None and row["steps_ratio_best"] is None
    _, (row,) = loco.reach_table([ppo], {})  # no SHAC curve for that seed
    assert row["shac_last"] is None and row["shac_to_final"] is None


def test_shac_curves_from_output_and_log(tmp_path):
    out = tmp_path / "shac0.json"
    out.write_text(json.dumps({"shac": [{"method": "shac", "seed": 0, "curve": SHAC}]}))
    # A log's seed comes from its points, not its name (this name's last digits read as 200 before).
    log = tmp_path / "r2_24dec200.log"
    points = [dict(c, seed=2) for c in SHAC[:3]]
    log.write_text("\n".join(["some warning", *(json.dumps(c) for c in points)]) + "\n")
    curves = loco.load_shac_curves([out, log])
    assert sorted(curves) == [0, 2]
    assert curves[0] == SHAC and curves[2] == points
    # A log whose points name no seed, or two, is refused with the file named.
    for bad, found in ((SHAC[:3], "no seed"), ([dict(SHAC[0], seed=1), dict(SHAC[1], seed=2)], "seeds [1, 2]")):
        old = tmp_path / "shac1.log"
        old.write_text("\n".join(json.dumps(c) for c in bad) + "\n")
        with pytest.raises(InputError, match=f"shac1.log.*{re.escape(found)}"):
            loco.load_shac_curves([old])


def test_ppo_rows_from_a_stopped_run_log(tmp_path):
    log = tmp_path / "ppo1.log"
    curve = [{"seed": 1, "train_wall_s": 3.0 * c["train_cpu_s"], **c} for c in _ppo(1)["curve"][:4]]
    log.write_text("\n".join(["a warning", *(json.dumps(c) for c in curve)]) + "\n")
    (row,) = loco.load_ppo_rows([log])
    # Stopped after its collapse: the last evaluation is its final one.
    assert row["stopped_early"] and row["seed"] == 1 and row["return"] == -1_700.0
    assert row["env_steps"] == 300_000 and row["curve"] == curve
    _, (t,) = loco.reach_table([row], {1: SHAC})
    assert t["ppo_best"] == 500.0 and t["ppo_to_final"]["env_steps"] == 0 and t["shac_to_best"]["env_steps"] == 20_480


def _fake_evaluate(act):
    # A deterministic function of the actor (its weights and VecNormalize's statistics): its
    # actions on a fixed batch of observations, in place of the 16 ten-second episodes.
    obs = torch.linspace(-1.0, 1.0, 4 * 51).reshape(4, 51)
    r = float(act(obs).sum())
    return {"forward_speed": r, "speed_error": 0.0, "distance": 0.0, "upright": 1.0, "return": r}


_TINY_PPO = {"n_envs": 4, "n_steps": 8, "batch_size": 16, "n_epochs": 2, "learning_rate": 3e-2, "gamma": 0.99,
             "gae_lambda": 0.95, "ent_coef": 0.0, "net_arch": [16], "log_std_init": -1.0}


def test_best_policy_keeps_and_restores_the_best():
    model, venv = loco.make_ppo(_TINY_PPO, seed=0)
    best = loco.BestPolicy(model, venv)
    w = model.policy.action_net.weight

    def evaluate_now():
        return {"env_steps": 0, "train_cpu_s": 0.0, **_fake_evaluate(loco.ppo_actor(model, venv))}

    first = evaluate_now()
    assert best.offer(first)
    with torch.no_grad():
        w.add_(0.5)
    venv.obs_rms.mean += 0.3
    second = evaluate_now()
    hi, lo = (second, first) if second["return"] > first["return"] else (first, second)
    kept_w = w.detach().clone() if hi is second else None
    assert best.offer(second) == (hi is second)
    assert not best.offer(dict(lo))  # lower: not kept
    assert not best.offer(dict(hi))  # equal: the first of equal ones stays
    with torch.no_grad():
        w.mul_(-3.0)
    venv.obs_rms.mean -= 1.0
    best.restore()
    assert best.point["return"] == hi["return"]
    assert evaluate_now()["return"] == hi["return"]
    if kept_w is not None:
        assert torch.equal(w, kept_w)


def test_run_ppo_reports_final_and_best(monkeypatch):
    monkeypatch.setattr(loco, "evaluate", _fake_evaluate)
    row = loco.run_ppo(0, 0.03, dict(_TINY_PPO, lr_linear=True), eval_every=0.005, budget="cpu")
    returns = [c["return"] for c in row["curve"]]
    assert len(returns) >= 3 and len(set(returns)) >= 2  # the policy changed between evaluations
    assert row["return"] == returns[-1]
    at = returns.index(max(returns))
    assert row["best"]["return"] == max(returns) and row["best"]["env_steps"] == row["curve"][at]["env_steps"]
    # The kept policy, restored after training, evaluates as it did when it was kept.
    assert row["best_check"]["return"] == row["best"]["return"]
    assert loco.ppo_best_return(row) == max(returns)
    assert loco.ppo_best_return({"return": 5.0, "curve": [{"return": 7.0}]}) == 7.0


def test_shac_preset_options(monkeypatch):
    # --preset, --updates and --lr-decay-updates: SHAC rows only, positive counts; checked before any training.
    from backdrive._errors import PolicyConfigError

    p = loco.shac_preset("go1_walk_shac")
    assert p is loco.GO1_WALK_SHAC and p.env_kwargs["robot"] == "go1"
    assert loco.env_kwargs(p)["robot"] == "go1" and "num_envs" not in loco.env_kwargs(p)
    decayed = loco.shac_preset("quadruped_walk_shac", 333)
    assert decayed.config.lr_decay_updates == 333 and loco.QUADRUPED_WALK_SHAC.config.lr_decay_updates is None
    assert decayed.config.replace(lr_decay_updates=None) == loco.QUADRUPED_WALK_SHAC.config
    with pytest.raises(PolicyConfigError, match="anymal"):
        loco.shac_preset("anymal")
    with pytest.raises(PolicyConfigError, match="lr_decay_updates"):
        loco.shac_preset("go1_walk_shac", 0)
    for argv in (["--preset", "go1_walk_shac"],  # default --methods includes ppo
                 ["--methods", "shac", "ppo", "--updates", "10"],
                 ["--methods", "shac", "--reach", "--lr-decay-updates", "100"],
                 ["--methods", "shac", "--updates", "0"],
                 ["--methods", "shac", "--lr-decay-updates", "-5"],
                 ["--methods", "shac", "--preset", "anymal"]):
        monkeypatch.setattr(sys, "argv", ["locomotion.py", *argv])
        with pytest.raises(SystemExit) as e:
            loco.main()
        assert e.value.code == 2, argv


def test_blind_actor_on_go1_ignores_privileged_inputs():
    env = loco.GO1_WALK_SHAC.make_env(num_envs=2)
    policy = loco.blind_actor(env, loco.GO1_WALK_SHAC)
    obs = torch.randn(4, env.obs_dim)
    loss = policy(obs).square().sum()
    loss.backward()
    first = policy.net[0].weight
    assert env.obs_dim == 51 and torch.all(first[:, loco.PRIVILEGED] == 0)
    assert torch.all(first.grad[:, loco.PRIVILEGED] == 0) and first.grad[:, :47].abs().sum() > 0
    obs2 = obs.clone()
    obs2[:, loco.PRIVILEGED] += 1.0
    assert torch.equal(policy(obs), policy(obs2))


def test_shac_variant_settings(monkeypatch):
    # --shac-set: num_envs goes to the env, config fields to the config; the shipped preset is untouched.
    from backdrive._errors import InputTypeError, PolicyConfigError

    base = loco.QUADRUPED_WALK_SHAC
    assert loco.shac_variant(base, {}) is base
    v = loco.shac_variant(base, loco.parse_settings(["num_envs=16", "lr_decay_updates=120", "critic_replay=4"]))
    assert v.env_kwargs["num_envs"] == 16 and base.env_kwargs["num_envs"] == 64
    assert v.config.lr_decay_updates == 120 and v.config.critic_replay == 4 and base.config.lr_decay_updates is None
    assert v.config.replace(lr_decay_updates=None, critic_replay=1) == base.config
    assert v.name == "quadruped_walk_shac+num_envs=16,lr_decay_updates=120,critic_replay=4"
    assert v.env_steps == base.updates * 16 * 8
    assert loco.env_kwargs(v) == loco.env_kwargs(base)  # same evaluation env
    # Any keyword of the env type goes to the env, e.g. the training episodes' length.
    short = loco.shac_variant(base, {"max_episode_steps": 200, "random_episode_start": True})
    assert short.env_kwargs["max_episode_steps"] == 200 and short.make_env(num_envs=2).max_episode_steps == 200
    assert short.config.random_episode_start and short.config.replace(random_episode_start=False) == base.config
    with pytest.raises(PolicyConfigError, match="num_envs"):
        loco.shac_variant(base, {"num_envs": 0})
    with pytest.raises(PolicyConfigError, match="horizon"):
        loco.shac_variant(base, {"horizon": -1})
    with pytest.raises(InputTypeError, match="bogus"):
        loco.shac_variant(base, {"bogus": 1})
    for argv in (["--reach", "--shac-set", "num_envs=0"], ["--methods", "shac", "--shac-set", "bogus=1"]):
        monkeypatch.setattr(sys, "argv", ["locomotion.py", *argv])
        with pytest.raises(SystemExit) as e:
            loco.main()
        assert e.value.code == 2, argv


def test_reach_runs_the_variant(monkeypatch):
    # run_shac_reach trains with the given preset (its num_envs) and records it; a stand-in evaluation.
    monkeypatch.setattr(loco, "evaluate", lambda act, preset=None: {"return": 1.0})
    v = loco.shac_variant(loco.QUADRUPED_WALK_SHAC, {"num_envs": 2, "horizon": 2})
    row = loco.run_shac_reach(0, 1e9, updates=(1, 3), preset=v)
    assert row["num_envs"] == 2 and row["horizon"] == 2 and row["preset"] == v.name
    assert [c["update"] for c in row["curve"]] == [0, 1, 3]
    assert [c["env_steps"] for c in row["curve"]] == [0, 4, 12]
    assert all(c["seed"] == 0 for c in row["curve"])  # each point names its seed (logs are read by it)
    assert row["reached_at_update"] is None


def test_reach_table_leaves_shac_setup_out():
    # SHAC points that record their env and trainer build (setup_cpu_s): the table's CPU is the training's.
    timed = [dict(c, setup_cpu_s=2.0) for c in SHAC]
    text, (row,) = loco.reach_table([_ppo(0)], {0: timed})
    assert row["shac_setup_cpu_s"] == 2.0
    assert row["shac_to_best"]["cpu_s"] == 78.0 and row["shac_to_best"]["after"]["cpu_s"] == 38.0
    assert row["cpu_ratio_best"] == pytest.approx(60.0 / 78.0)
    assert row["shac_last"]["train_cpu_s"] == 78.0
    assert row["ppo_to_best"]["cpu_s"] == 60.0  # PPO's clock already starts after its env is built
    assert "20,480 / 78 s" in text
    _, (old,) = loco.reach_table([_ppo(0)], {0: SHAC})  # curves without it: unchanged
    assert old["shac_setup_cpu_s"] is None and old["shac_to_best"]["cpu_s"] == 80.0


def test_evaluate_reports_the_yaw_rate(monkeypatch):
    # evaluate() passes the env's mean yaw rate through (it dropped it before); a stand-in env.
    class Env:
        def __init__(self, n, **kwargs):
            self.n = n

        def evaluate(self, act, command, seconds, seed):
            assert command == loco.COMMAND and seconds == loco.EVAL_SECONDS and seed == loco.EVAL_SEED
            return {"forward_speed": 0.4, "speed_error": 0.1, "distance": 4.0, "upright": 1.0, "yaw_rate": -0.13,
                    "q": None, "rewards": torch.ones(5, self.n)}

    monkeypatch.setattr(loco, "QuadrupedWalk", Env)
    m = loco.evaluate(None)
    assert m["yaw_rate"] == -0.13 and m["return"] == 5.0 and m["forward_speed"] == 0.4


#: The 13th session's QUADRUPED_WALK_SHAC_FEW config (its runs: docs/locomotion.md, 13th session).
QUADRUPED_WALK_SHAC_13TH_CONFIG = loco.QUADRUPED_WALK_SHAC.config.replace(
    lr=2e-3, lr_decay_updates=200, max_action_change=0.015
)


def test_few_copy_preset_is_the_reach_setting():
    # QUADRUPED_WALK_SHAC_FEW is exactly the --shac-set variant of the 14th session's reach runs (2-s training
    # episodes started at random steps); the 13th session's is it with 10-s episodes started together.
    from backdrive.optim._policy.presets import get_preset

    few = loco.SHAC_PRESETS["quadruped_walk_shac_few"]
    assert get_preset("quadruped_walk_shac_few") is few
    v = loco.shac_variant(loco.QUADRUPED_WALK_SHAC, loco.parse_settings(
        ["num_envs=32", "lr=0.002", "lr_decay_updates=200", "max_action_change=0.015", "random_episode_start=true",
         "max_episode_steps=100"]))
    assert few.config == v.config and dict(few.env_kwargs) == dict(v.env_kwargs)
    assert few.env_kwargs["num_envs"] == 32 and few.config.critic_lr == loco.QUADRUPED_WALK_SHAC.config.critic_lr
    assert few.make_env(num_envs=2).max_episode_steps == 100 and few.config.random_episode_start
    old = loco.shac_variant(few, loco.parse_settings(["max_episode_steps=500", "random_episode_start=false"]))
    assert old.config == QUADRUPED_WALK_SHAC_13TH_CONFIG and old.make_env(num_envs=2).max_episode_steps == 500
    # the training env differs from the shipped preset's in the episode length only (the evaluation runs its
    # EVAL_SECONDS with autoreset off, whatever the episode length)
    assert loco.env_kwargs(few) == {**loco.env_kwargs(loco.QUADRUPED_WALK_SHAC), "max_episode_steps": 100}


def test_decay_preset_is_the_15th_session_table_setting():
    # QUADRUPED_WALK_SHAC_DECAY is what the 15th session's 3-seed table ran: the shipped recipe with
    # `--lr-decay-updates 420` (its last update); nothing else differs.
    import dataclasses

    from backdrive.optim import QUADRUPED_WALK_SHAC_DECAY
    from backdrive.optim._policy.presets import get_preset

    dec = loco.SHAC_PRESETS["quadruped_walk_shac_decay"]
    assert dec is QUADRUPED_WALK_SHAC_DECAY and get_preset("quadruped_walk_shac_decay") is dec
    ran = loco.shac_preset(loco.QUADRUPED_WALK_SHAC.name, 420)
    assert dec.config == ran.config and dec.updates == ran.updates == 420
    assert dec.config.lr_decay_updates == 420 and loco.QUADRUPED_WALK_SHAC.config.lr_decay_updates != 420
    assert dataclasses.replace(dec.config, lr_decay_updates=loco.QUADRUPED_WALK_SHAC.config.lr_decay_updates) == \
        loco.QUADRUPED_WALK_SHAC.config
    assert dict(dec.env_kwargs) == dict(loco.QUADRUPED_WALK_SHAC.env_kwargs)


def test_decay_dr_preset_is_the_decayed_recipe_under_randomization():
    # QUADRUPED_WALK_SHAC_DECAY_DR differs from the decayed recipe by the env's default randomisation only,
    # and the example (which lists the quadruped presets) can train it.
    from backdrive.envs import Randomization
    from backdrive.optim import QUADRUPED_WALK_SHAC_DECAY, QUADRUPED_WALK_SHAC_DECAY_DR
    from backdrive.optim._policy.presets import get_preset

    dr = get_preset("quadruped_walk_shac_decay_dr")
    assert dr is QUADRUPED_WALK_SHAC_DECAY_DR
    assert dr.config == QUADRUPED_WALK_SHAC_DECAY.config and dr.updates == QUADRUPED_WALK_SHAC_DECAY.updates
    assert dr.env_kwargs["randomization"] == Randomization()
    assert {k: v for k, v in dr.env_kwargs.items() if k != "randomization"} == dict(QUADRUPED_WALK_SHAC_DECAY.env_kwargs)
    env = dr.make_env(num_envs=2)
    assert env.randomization == Randomization() and dr.mismatches(dr.make_env()) == []
    assert dr.env_type is QUADRUPED_WALK_SHAC_DECAY.env_type and dr.env_steps == QUADRUPED_WALK_SHAC_DECAY.env_steps
