"""The PPO-against-SHAC comparison table of ``benchmarks/locomotion.py`` (``reach_table``): per seed,
PPO's final and best evaluation returns and the env steps and CPU seconds each method spends to first
evaluate at or above them, on hand-made curves whose answers are known.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

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
    log = tmp_path / "shac2.log"
    log.write_text("\n".join(["some warning", *(json.dumps(c) for c in SHAC[:3])]) + "\n")
    curves = loco.load_shac_curves([out, log])
    assert sorted(curves) == [0, 2]
    assert curves[0] == SHAC and curves[2] == SHAC[:3]


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
