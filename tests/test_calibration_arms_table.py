"""The paired comparison of ``benchmarks/calibration_arms_table.py``: sign test and one-sided t-test."""

import importlib.util
import json
import math
from pathlib import Path

import pytest

_path = Path(__file__).resolve().parents[1] / "benchmarks" / "calibration_arms_table.py"
_spec = importlib.util.spec_from_file_location("calibration_arms_table", _path)
T = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(T)


def _tail_by_quadrature(t: float, df: int) -> float:
    """P(T >= t) for Student's t with ``df`` degrees of freedom, from its
    density: 1/2 minus the composite Simpson integral over [0, |t|]."""
    c = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(df * math.pi)
    a, n = abs(t), 20000
    h = a / n
    f = [c * (1 + (k * h) ** 2 / df) ** (-(df + 1) / 2) for k in range(n + 1)]
    area = h / 3 * (f[0] + f[-1] + 4 * sum(f[1:-1:2]) + 2 * sum(f[2:-1:2]))
    upper = 0.5 - area
    return upper if t >= 0 else 1.0 - upper


@pytest.mark.parametrize("df", [1, 2, 3, 4, 5, 8, 13])
@pytest.mark.parametrize("t", [-2.5, -0.3, 0.0, 0.7, 2.015, 3.48, 9.0])
def test_t_upper_tail_matches_the_integrated_density(t, df):
    assert T.t_upper_tail(t, df) == pytest.approx(_tail_by_quadrature(t, df), rel=1e-9, abs=1e-13)


def test_t_upper_tail_known_values():
    # Cauchy (df 1): P(T >= 1) = 1/4; df 2: P(T >= t) = (1 - t / sqrt(2 + t^2)) / 2.
    assert T.t_upper_tail(1.0, 1) == pytest.approx(0.25, rel=1e-12)
    assert T.t_upper_tail(1.5, 2) == pytest.approx((1 - 1.5 / math.sqrt(2 + 1.5**2)) / 2, rel=1e-12)
    # The 5 % one-sided critical value for 5 degrees of freedom is 2.015.
    assert T.t_upper_tail(2.0150, 5) == pytest.approx(0.05, abs=2e-5)


def test_paired_reports_the_t_test_and_the_sign_test():
    a = {str(s): {"real_error": e} for s, e in enumerate([0.10, 0.12, 0.08, 0.20, 0.05, 0.09])}
    b = {str(s): {"real_error": e} for s, e in enumerate([0.05, 0.10, 0.09, 0.10, 0.02, 0.04])}
    c = T.paired(a, b)
    d = [0.05, 0.02, -0.01, 0.10, 0.03, 0.05]
    mean = sum(d) / 6
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / 5)
    assert c["b_wins"] == 5 and c["b_losses"] == 1
    assert c["sign_test_p"] == pytest.approx(2 * 7 / 64)
    assert c["t"] == pytest.approx(mean / (sd / math.sqrt(6)))
    assert c["df"] == 5
    assert c["t_test_p_one_sided"] == pytest.approx(T.t_upper_tail(c["t"], 5))
    assert c["t_test_met"] is (c["t_test_p_one_sided"] < 0.05)
    # Swapping the arms flips the sign of t and puts the p-value on the other side.
    r = T.paired(b, a)
    assert r["t"] == pytest.approx(-c["t"])
    assert r["t_test_p_one_sided"] == pytest.approx(1 - c["t_test_p_one_sided"])
    assert not r["t_test_met"]


def test_paired_with_identical_arms_has_no_t_statistic_and_fails_the_criterion():
    a = {str(s): {"real_error": 0.058} for s in range(6)}
    c = T.paired(a, dict(a))
    assert c["mean"] == 0.0 and c["se"] == 0.0 and c["ties"] == 6
    assert c["t"] is None and c["t_test_p_one_sided"] is None
    assert c["sign_test_p"] == 1.0
    assert not c["t_test_met"] and not c["measurably_better"]


def test_candidates_pairs_each_saved_candidate_with_its_deployment(tmp_path):
    rows = [{"update": 0, "forward_speed": 0.53, "speed_error": 0.03},
            {"update": 5, "forward_speed": 0.58, "speed_error": 0.08},
            {"update": 10, "forward_speed": 0.61, "speed_error": 0.11}]
    (tmp_path / "nominal_s0.json").write_text(json.dumps({"branches": {"recipe": rows}}))
    for k, v in ((5, 0.62), (10, 0.66)):  # update 0 not deployed: left out
        (tmp_path / f"deploy_nominal_s0_u{k}.json").write_text(json.dumps(
            {"rows": {"nominal": {"forward_speed": v, "speed_error": v - 0.5, "upright": 1.0}}}))
    out = T.candidates(tmp_path, ["nominal", "calibrated"], ["0", "1"])
    assert set(out) == {"nominal"} and set(out["nominal"]["0"]) == {"5", "10"}
    assert out["nominal"]["0"]["10"]["real_minus_own_sim"] == pytest.approx(0.05)
    assert out["nominal"]["mean_real_minus_own_sim"] == pytest.approx((0.04 + 0.05) / 2)
