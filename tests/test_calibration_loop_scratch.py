"""``benchmarks/calibration_loop_scratch.py``: the from-scratch arms train in GO1_WALK_SHAC_LONG's env with only
the physics changed, and the check refuses an env that differs in anything else."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("mujoco")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import calibration_loop_scratch as S  # noqa: E402

from backdrive.optim import GO1_WALK_SHAC_LONG  # noqa: E402

NOMINAL = ROOT / "benchmarks/results/go1_soft_nominal_s0_13th.json"
CALIBRATED = ROOT / "benchmarks/results/calibration_loop_go1_soft_s3_14th.json"


@pytest.mark.parametrize("sim", [NOMINAL, CALIBRATED])
def test_arm_env_is_the_preset_env_with_the_arm_physics(sim):
    params = S.sim_params(str(sim))
    env = S.arm_env(params, 2)
    checked = S.check_env(env, params)
    assert checked["settings_equal_to_preset"] and checked["physics_equal_to_calibration_loop"]
    phys = checked["physics"]
    assert phys["contact"]["stiffness"] == pytest.approx(params["stiffness"])
    assert phys["contact"]["damping"] == pytest.approx(params["contact_damping"])
    assert phys["kp"] == pytest.approx(40.0 * params["motor_strength"])
    assert phys["delay"] == params.get("delay", 0)
    assert phys["simulator"] == ("NoAdhesionSimulator" if params.get("no_adhesion") else "Simulator")
    assert "contact.stiffness" in checked["physics_changed_from_preset"]
    # The settings that define the task are the preset's.
    ref = GO1_WALK_SHAC_LONG.make_env(num_envs=2)
    assert env.reward_weights == ref.reward_weights and env.reward_weights["foot_slip"] == 0.5
    assert env.command_ranges == ref.command_ranges


def test_truth_sim_is_the_hidden_draw_under_the_nominal_law():
    out = S.truth_sim()
    params, truth = out["calibrated"], json.loads(CALIBRATED.read_text())["truth"]
    nominal = S.sim_params(str(NOMINAL))
    assert params["body_mass"] == truth["mass"] and params["damping"] == truth["damping"]
    assert (params["motor_strength"], params["friction"], params["delay"]) == (
        truth["strength"], truth["friction"], truth["delay"])
    assert (params["stiffness"], params["contact_damping"], params["no_adhesion"]) == (
        nominal["stiffness"], nominal["contact_damping"], nominal["no_adhesion"])
    env = S.arm_env(params, 2)
    checked = S.check_env(env, params)
    assert checked["physics"]["simulator"] == "NoAdhesionSimulator" and checked["physics"]["delay"] == 2
    assert checked["physics"]["contact"]["friction"] == pytest.approx(truth["friction"])


def test_stiction_width_is_a_physical_setting_of_both_builders():
    params = {**S.truth_sim()["calibrated"], "stiction_width": 0.002}
    env = S.arm_env(params, 2)
    checked = S.check_env(env, params)  # the same sim as calibration_loop.make_env builds from params
    assert env.nominal_contact.stiction_width == 0.002 and checked["physics"]["contact"]["stiction_width"] == 0.002
    assert "contact.stiction_width" in checked["physics_changed_from_preset"]
    plain = S.arm_env(S.truth_sim()["calibrated"], 2)
    assert plain.nominal_contact.stiction_width == S.STICTION
    with pytest.raises(ValueError, match="stiction_width"):
        S.check_env(plain, params)


def test_nominal_keyword_is_the_preset_physics():
    env = S.arm_env(None, 2)
    checked = S.check_env(env, None)
    assert checked["physics_changed_from_preset"] == []


def test_check_refuses_changed_settings():
    params = S.sim_params(str(CALIBRATED))
    env = S.arm_env(params, 2)
    env.reward_weights = {**env.reward_weights, "foot_slip": 0.05}
    with pytest.raises(ValueError, match="reward_weights"):
        S.check_env(env, params)
    env = S.arm_env(params, 2)
    env.command_ranges = {**env.command_ranges, "vx": (0.5, 0.5)}
    with pytest.raises(ValueError, match="command_ranges"):
        S.check_env(env, params)


def test_check_refuses_other_physics():
    params = S.sim_params(str(CALIBRATED))
    env = S.arm_env(params, 2)
    env.delay = 0
    with pytest.raises(ValueError, match="delay"):
        S.check_env(env, params)
    env = S.arm_env({**params, "motor_strength": 1.0}, 2)
    with pytest.raises(ValueError, match="kp"):
        S.check_env(env, params)


def _write_run(d: Path, arm: str, seed, err: float, **record) -> None:
    """A finished run in ``d``: its training record (with ``record`` added) and its deployment, ``err`` off 0.5."""
    rec = {"sim": arm, "updates": 300, "own_sim": {"forward_speed": 0.5, "speed_error": 0.0, "upright": 1.0},
           "train_cpu_minutes": 4.0, "wall_minutes": 5.0, "validation": [], **record}
    dep = {"args": {"episodes": 16}, "rows": {"nominal": {"forward_speed": 0.5 - err, "speed_error": err,
                                                          "upright": 1.0}}}
    (d / f"{arm}_s{seed}.pt.json").write_text(json.dumps(rec))
    (d / f"deploy_{arm}_s{seed}.json").write_text(json.dumps(dep))


def test_collect_evaluates_the_criterion_only_with_every_seed(tmp_path):
    for s in range(5):
        _write_run(tmp_path, "nominal", s, 0.10 + 0.01 * s)
        _write_run(tmp_path, "calibrated", s, 0.05)
    part = S.collect(tmp_path)
    assert part["missing"] == ["nominal_s5", "calibrated_s5"] and "paired" not in part
    assert part["arms"]["nominal"]["2"]["real_error"] == pytest.approx(0.12)
    assert part["arms"]["nominal"]["2"]["real_upright"] == "16/16"
    _write_run(tmp_path, "nominal", 5, 0.06)
    _write_run(tmp_path, "calibrated", 5, 0.05)
    full = S.collect(tmp_path)
    assert full["missing"] == [] and full["paired"]["seeds"] == ["0", "1", "2", "3", "4", "5"]
    assert full["paired"]["t_test_met"] and full["paired"]["mean"] > 0
    assert "diagnostic" not in full["criterion"]
    # Another pairing is reported as a diagnostic, never as the pre-registered criterion.
    swapped = S.collect(tmp_path, arms=("calibrated", "nominal"))
    assert swapped["paired"]["mean"] == pytest.approx(-full["paired"]["mean"]) and "diagnostic" in swapped["criterion"]

    # Across sessions: runs missing from the directory come from the earlier record, as recorded.
    later = tmp_path / "later"
    later.mkdir()
    for name in ("nominal_s5.pt.json", "deploy_nominal_s5.json", "calibrated_s5.pt.json", "deploy_calibrated_s5.json"):
        (later / name).write_text((tmp_path / name).read_text())
    merged = S.collect(later, previous=part)
    assert merged["missing"] == [] and len(merged["from_previous"]) == 10
    assert merged["paired"] == full["paired"] and list(merged["arms"]["nominal"]) == list(S.SEEDS)
    # A run in both places with another result is a repeated run, and is refused.
    _write_run(tmp_path, "nominal", 2, 0.5)
    with pytest.raises(ValueError, match="nominal seed 2 .* repeated run"):
        S.collect(tmp_path, previous=part)


def test_cross_walks_each_deployed_policy_in_both_sims(tmp_path):
    from backdrive.envs import QuadrupedWalk

    _, shipped = QuadrupedWalk.pretrained(1, robot="go1")
    torch.save(shipped.state_dict(), tmp_path / "calibrated_s4.pt")
    (tmp_path / "calibrated_s4.pt.json").write_text(json.dumps({"robot": "go1"}))
    (tmp_path / "nominal_s4.pt").write_bytes(b"")  # not deployed: left out
    (tmp_path / "deploy_calibrated_s4.json").write_text(json.dumps({"rows": {"nominal": {"forward_speed": 0.55}}}))
    res = S.cross(tmp_path, episodes=2, seconds=2.5)
    (row,) = res["rows"]
    assert (row["arm"], row["seed"], row["real_speed"]) == ("calibrated", "4", 0.55)
    for sim in ("nominal", "calibrated"):
        assert row[f"{sim}_sim_miss"] == pytest.approx(abs(0.55 - row[f"{sim}_sim_speed"]))
        assert 0.0 <= row[f"{sim}_sim_upright"] <= 1.0
    # The two sims differ in physics, so the same policy walks at other speeds in them.
    assert row["nominal_sim_speed"] != row["calibrated_sim_speed"]
    summary = res["summary"]["calibrated"]
    assert summary["policies"] == 1 and summary["mean_miss"] == pytest.approx(row["calibrated_sim_miss"])
    assert summary["reality_faster"] == int(0.55 > row["calibrated_sim_speed"])

    # A run deployed by --trim: its deployment at 0.5 m/s is the real speed; --seeds picks other seeds.
    torch.save(shipped.state_dict(), tmp_path / "nopush_s7.pt")
    (tmp_path / "nopush_s7.pt.json").write_text(json.dumps({"robot": "go1"}))
    (tmp_path / "nopush_s7_trim.json").write_text(json.dumps({"untrimmed": {"real_speed": 0.47}}))
    later = S.cross(tmp_path, seeds=("7",), sims={"nominal": S.SIMS["nominal"]}, episodes=2, seconds=2.5)
    (row7,) = later["rows"]
    assert (row7["arm"], row7["seed"], row7["real_speed"]) == ("nopush", "7", 0.47)
    assert row7["nominal_sim_speed"] == pytest.approx(row["nominal_sim_speed"])  # the same policy and sim


def test_saved_policy_loads_into_the_shipped_network(tmp_path):
    # The deployment (calibration_loop.load_nominal) loads the state dict into a copy of the shipped policy.
    import copy

    from backdrive.envs import QuadrupedWalk
    from backdrive.optim import PolicyTrainer, load_policy

    env = GO1_WALK_SHAC_LONG.make_env(num_envs=2)
    trainer = PolicyTrainer(env, config=GO1_WALK_SHAC_LONG.config)
    trainer.save(tmp_path / "ckpt.pt")
    _, shipped = QuadrupedWalk.pretrained(1, robot="go1")
    policy = copy.deepcopy(shipped)
    state = load_policy(tmp_path / "ckpt.pt").state_dict()
    policy.load_state_dict(state)  # strict: the same keys and shapes
    for k, v in state.items():
        assert torch.equal(policy.state_dict()[k], v)


def test_trim_command_finds_the_command_that_walks_the_target():
    # A policy that walks 0.6 c + 0.15: c = 0.5833 gives 0.5; the secant on a line lands on it.
    res = S.trim_command(lambda c: 0.6 * c + 0.15)
    assert [w["command"] for w in res["walks"]] == pytest.approx([0.5, 0.55, 0.35 / 0.6])  # slope 1, then secant
    assert res["command"] == pytest.approx(0.35 / 0.6) and res["own_sim_speed"] == pytest.approx(0.5)
    # Already within tolerance: one walk.
    assert len(S.trim_command(lambda c: c + 0.001)["walks"]) == 1
    # A policy that cannot reach the target within the training range stops at the range, after 6 walks,
    # and keeps the closest walk.
    slow = S.trim_command(lambda c: 0.3 * c)
    assert len(slow["walks"]) == S.TRIM["max_walks"]
    assert slow["command"] == S.TRIM["high"] and slow["own_sim_speed"] == pytest.approx(0.24)
    assert all(S.TRIM["low"] <= w["command"] <= S.TRIM["high"] for w in slow["walks"])
    # A flat or falling response takes slope 1 instead of a wild secant step.
    flat = S.trim_command(lambda c: 0.45)
    assert [w["command"] for w in flat["walks"][:3]] == pytest.approx([0.5, 0.55, 0.6])
    # A walk where every robot fell (NaN) stops the search; the closest finite walk is kept.
    fall = S.trim_command(lambda c: 0.55 if c == 0.5 else float("nan"))
    assert len(fall["walks"]) == 2 and fall["command"] == 0.5


def test_collect_trim_evaluates_the_criterion_only_with_every_seed(tmp_path):
    def write(arm, seed, err, plain):
        rec = {"trimmed_command": 0.48, "trim": {"own_sim_speed": 0.5}, "real_speed": 0.5 + err,
               "real_error": err, "real_upright": "16/16",
               "untrimmed": {"real_speed": 0.5 + plain, "real_error": plain, "real_upright": 1.0}}
        (tmp_path / f"{arm}_s{seed}_trim.json").write_text(json.dumps(rec))

    for s in S.TRIM_SEEDS[:-1]:
        write("nominal", s, 0.03 + 0.001 * int(s), 0.02)
        write("nopush", s, 0.01, 0.02)
    part = S.collect_trim(tmp_path)
    assert part["missing"] == ["nominal_s11", "nopush_s11"] and "paired" not in part
    write("nominal", "11", 0.02, 0.02)
    write("nopush", "11", 0.01, 0.03)
    full = S.collect_trim(tmp_path)
    assert full["paired"]["seeds"] == list(S.TRIM_SEEDS) and full["paired"]["t_test_met"]
    assert "diagnostic" not in full["criterion"]
    assert full["paired_untrimmed"]["mean"] == pytest.approx(-0.01 / 6)
    swapped = S.collect_trim(tmp_path, arms=("nopush", "nominal"))
    assert "diagnostic" in swapped["criterion"]


def test_mujoco_walk_takes_a_command_and_a_target_speed():
    import locomotion_transfer as lt

    from backdrive.envs import QuadrupedWalk

    torch.set_num_threads(1)
    env, policy = QuadrupedWalk.pretrained(2)
    kw = {"seconds": 0.6, "settle": 0.2}
    plain = lt.run_mujoco(env, policy, "matched", **kw)
    same = lt.run_mujoco(env, policy, "matched", command=lt.COMMAND, target_speed=lt.COMMAND[0], **kw)
    assert same == plain
    other = lt.run_mujoco(env, policy, "matched", command=(0.3, 0.0, 0.0), target_speed=0.5, **kw)
    assert other["forward_speed"] != plain["forward_speed"]  # the policy sees the command
    own = lt.run_mujoco(env, policy, "matched", command=(0.3, 0.0, 0.0), **kw)
    assert own["forward_speed"] == other["forward_speed"]
    assert other["speed_error"] != own["speed_error"]  # measured against 0.5, not against 0.3


def test_nominal_gap_deploys_each_policy_in_each_draw(tmp_path):
    from backdrive.envs import QuadrupedWalk

    torch.set_num_threads(1)
    _, shipped = QuadrupedWalk.pretrained(1, robot="go1")
    torch.save(shipped.state_dict(), tmp_path / "nominal_s6.pt")
    (tmp_path / "nominal_s6.pt.json").write_text(json.dumps({"robot": "go1"}))
    res = S.nominal_gap(tmp_path, [1, 4], seeds=("6", "7"), episodes=2)
    (row,) = res["rows"]  # seed 7 has no policy: left out
    assert row["seed"] == "6"
    for g in (1, 4):
        x = row[f"draw_{g}"]
        assert x["reality_minus_sim"] == pytest.approx(x["speed"] - row["nominal_sim_speed"])
        assert res["draws"][str(g)]["mean_reality_minus_sim"] == pytest.approx(x["reality_minus_sim"])
        assert res["draws"][str(g)]["policies"] == 1
    # The draws hide other masses, friction and strength: the same policy walks at another speed.
    assert row["draw_1"]["speed"] != row["draw_4"]["speed"]


def test_a_pairing_is_preregistered_only_with_its_own_seeds(tmp_path):
    for s in range(12):
        _write_run(tmp_path, "nominal", s, 0.07)
        _write_run(tmp_path, "nopush4", s, 0.03 + 0.001 * s)
    d4 = ("6", "7", "8", "9", "10", "11")
    test = S.collect(tmp_path, seeds=d4, arms=("nominal", "nopush4"))
    assert test["paired"]["seeds"] == list(d4) and "diagnostic" not in test["criterion"]
    other = S.collect(tmp_path, seeds=S.SEEDS, arms=("nominal", "nopush4"))
    assert "diagnostic" in other["criterion"]


def test_selection_prefers_upright_then_the_smaller_speed_error():
    due = [k for k in range(1, 301) if S.selection_due(k)]
    assert due == list(range(200, 301, 10))
    fell = {"forward_speed": 0.5, "speed_error": 0.001, "upright": 15 / 16}
    slow = {"forward_speed": 0.45, "speed_error": 0.05, "upright": 1.0}
    close = {"forward_speed": 0.49, "speed_error": 0.012, "upright": 1.0}
    every_fell = {"forward_speed": float("nan"), "speed_error": float("nan"), "upright": 0.0}
    scores = [S.selection_score(m) for m in (every_fell, fell, slow, close)]
    assert scores == sorted(scores) and len(set(scores)) == 4


def test_selection_keeps_the_best_tracking_candidate(tmp_path, monkeypatch):
    """A short run with --select: the kept policy is the candidate with the best own-sim score, and it is
    the policy saved and walked for the record."""
    monkeypatch.setitem(S.SELECT, "from", 2)
    monkeypatch.setitem(S.SELECT, "every", 2)
    monkeypatch.setitem(S.SELECT, "episodes", 2)
    monkeypatch.setitem(S.SELECT, "seconds", 0.5)
    monkeypatch.setitem(S.SELECT, "settle", 0.2)
    monkeypatch.setattr(S, "VALIDATE", {**S.VALIDATE, "episodes": 2, "seconds": 0.5, "settle": 0.2})
    monkeypatch.setattr(S.LT, "SEED", 5)
    stem = tmp_path / "nominalsel_s0"

    def short_walk(env, policy, command=S.LT.COMMAND, **kw):  # the record's own-sim walk, shortened
        m = env.evaluate(policy, command, **{**kw, "seconds": 0.5, "settle": 0.2})
        return {"forward_speed": float(m["forward_speed"]), "speed_error": float(m["speed_error"]),
                "upright": float(m["upright"])}

    monkeypatch.setattr(S, "walk", short_walk)
    rec = S.main(["--sim", "nominal", "--seed", "0", "--updates", "6", "--validate-every", "4", "--select",
                  "--out", str(stem)])
    sel = rec["selection"]
    assert [c["update"] for c in sel["candidates"]] == [2, 4, 6]
    with pytest.raises(SystemExit):  # a run too short for any candidate is refused before it trains
        S.main(["--sim", "nominal", "--updates", "1", "--validate-every", "4", "--select", "--out", str(stem) + "x"])
    assert not Path(f"{stem}x.csv").exists()
    best = max(sel["candidates"], key=S.selection_score)
    assert sel["kept"] == best["update"]
    assert [v["update"] for v in rec["validation"]] == [4, 6]
    # The saved policy is the kept one: walked again with the selection's settings it scores the same.
    from backdrive.envs import QuadrupedWalk

    _, shipped = QuadrupedWalk.pretrained(1, robot="go1")
    policy, _ = S.CL.load_nominal(shipped, Path(f"{stem}.pt"), robot="go1")
    again = short_walk(S.arm_env(None, 2), policy, seed=S.SELECT["seed"], settle=S.SELECT["settle"])
    assert again["forward_speed"] == pytest.approx(best["forward_speed"], abs=1e-5)


def test_a_select_arm_needs_selected_runs(tmp_path):
    arms = ("nominalsel", "nopush4sel")
    for arm in arms:
        _write_run(tmp_path, arm, 12, 0.05)
    with pytest.raises(ValueError, match="no selection"):
        S.collect(tmp_path, seeds=("12",), arms=arms)
    for arm in arms:
        _write_run(tmp_path, arm, 12, 0.05, selection={"kept": 250})
    out = S.collect(tmp_path, seeds=("12",), arms=arms)
    assert out["arms"]["nopush4sel"]["12"]["selected_update"] == 250
    assert "diagnostic" in out["criterion"]  # one seed is not the pre-registered eight
    assert S.PREREGISTERED[arms] == S.PREREGISTERED[("nominalsel", "nopush9sel")] == S.SELECT_SEEDS


def test_seeds_option_is_parsed_once_with_clear_errors():
    assert S._seeds(None, S.SEEDS) == S.SEEDS
    assert S._seeds("12, 13,14", S.SEEDS) == ("12", "13", "14")
    with pytest.raises(SystemExit, match="not 'x'"):
        S._seeds("12,x", S.SEEDS)
    with pytest.raises(SystemExit, match="repeated"):
        S._seeds("12,12", S.SEEDS)
