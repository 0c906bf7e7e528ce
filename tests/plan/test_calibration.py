"""`ibpo_lit.plan.calibration`: the update's two free constants fitted to measured peaks, by hand."""
import pytest

from ibpo_lit.plan.calibration import UpdateCase, fit, predict
from ibpo_lit.plan.memory import GIB


def case(name, state, backward, step, measured=None):
    return UpdateCase(name, state * GIB, backward * GIB, step * GIB, None if measured is None else measured * GIB)


def test_the_fit_recovers_the_constants_that_made_the_peaks():
    # measured = state + max(1.5 * backward, step) + 0.5 GiB:
    #   10 + 1.5 * 2 + 0.5 = 13.5; 10 + 1.5 * 4 + 0.5 = 16.5; 20 + max(9, 1) + 0.5 = 29.5
    cases = [case("a", 10, 2, 1, 13.5), case("b", 10, 4, 1, 16.5), case("c", 20, 6, 1, 29.5)]
    calibration = fit(cases)
    assert calibration.activation_factor == pytest.approx(1.5)
    assert calibration.reserve_bytes == pytest.approx(0.5 * GIB)
    assert calibration.worst_error < 1e-9 and calibration.cases == ("a", "b", "c")
    # a case its step dominates: 30 + max(1.5 * 2, 8) + 0.5 = 38.5 GiB
    assert calibration.predict(case("4b", 30, 2, 8)) == pytest.approx(38.5 * GIB)
    assert calibration.as_dict()["reserve_gib"] == pytest.approx(0.5)


def test_a_factor_no_case_can_show_stays_one():
    # every step outweighs 4 x the backward: the peaks say nothing of the factor; reserve = mean residual
    # residuals: 13 - (10 + 2) = 1 and 25 - (20 + 4) = 1
    cases = [case("a", 10, 0.1, 2, 13), case("b", 20, 0.2, 4, 25)]
    calibration = fit(cases)
    assert calibration.activation_factor == 1.0
    assert calibration.reserve_bytes == pytest.approx(1.0 * GIB)


def test_one_case_fits_the_reserve_only():
    calibration = fit([case("a", 10, 2, 1, 12.75), case("unmeasured", 50, 9, 9)])
    assert calibration.activation_factor == 1.0 and calibration.cases == ("a",)
    assert calibration.reserve_bytes == pytest.approx(0.75 * GIB)  # 12.75 - (10 + 2)


def test_the_uncalibrated_prediction_is_the_plans_update_peak():
    assert predict(case("x", 10, 3, 5)) == 15 * GIB and predict(case("y", 10, 6, 5)) == 16 * GIB


def test_nothing_measured_is_an_error():
    with pytest.raises(ValueError, match="at least one case"):
        fit([case("a", 1, 1, 1)])
