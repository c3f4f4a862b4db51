"""The statistics the benchmarks print, and the drop-in headline built from them."""

from __future__ import annotations

import math

import pytest

from benchmarks import drop_in
from testkit.stats import compare_accuracies, diff_se, mean_std


def test_mean_std_is_the_sample_spread():
    mean, std = mean_std([0.88, 0.89, 0.90])
    assert mean == pytest.approx(0.89)
    assert std == pytest.approx(0.01)


def test_one_value_has_no_spread_rather_than_zero():
    assert mean_std([0.9]) == (0.9, None)
    assert diff_se([0.9], [0.8, 0.85]) is None


def test_diff_se_adds_the_variances_of_the_means():
    a, b = [1.0, 2.0, 3.0], [2.0, 4.0]
    assert diff_se(a, b) == pytest.approx(math.sqrt(1.0 / 3 + 2.0 / 2))


def test_compare_accuracies_names_each_side_and_judges_the_difference():
    acc = {"base": [0.80, 0.82], "new": [0.83, 0.85]}
    out = compare_accuracies(acc, "new", "base", lambda side: f"acc_{side}")
    assert list(out) == [
        "acc_base",
        "acc_base_std",
        "acc_new",
        "acc_new_std",
        "accuracy_diff",
        "accuracy_diff_se",
        "within_seed_noise",
    ]
    assert out["acc_base"] == 0.81 and out["acc_new"] == 0.84
    assert out["acc_base_std"] == out["acc_new_std"] == pytest.approx(0.0141, abs=1e-4)
    assert out["accuracy_diff"] == 0.03
    # sqrt(0.0002 / 2 + 0.0002 / 2): 0.03 is 2.1 standard errors, outside seed noise.
    assert out["accuracy_diff_se"] == pytest.approx(0.0141, abs=1e-4)
    assert out["within_seed_noise"] is False


def _run(accuracy, wall_s=10.0, trainer_s=5.0):
    return {
        "binary_accuracy": accuracy,
        "wall_s": wall_s,
        "trainer_s": trainer_s,
        "transform_s": 3.0,
        "trainer_phases_s": {"do": trainer_s},
        "transform_phases_s": {"do": 3.0},
        "signatures": "s",
    }


def test_drop_in_headline_judges_the_difference_against_its_standard_error():
    runs = {
        "stock": [_run(0.78, 10.0, 4.0), _run(0.79, 10.0, 6.0)],
        "swapped": [_run(0.785, 12.0, 5.0), _run(0.795, 12.0, 7.0)],
    }
    out = drop_in.headline(runs, 1000, "binary_accuracy")
    assert out["wall_ratio_swapped_over_stock"] == 1.2
    assert out["trainer_ratio_swapped_over_stock"] == 1.2
    assert out["binary_accuracy_stock"] == 0.785 and out["binary_accuracy_swapped"] == 0.79
    assert out["accuracy_diff"] == 0.005
    assert out["accuracy_diff_se"] == pytest.approx(0.0071, abs=1e-4)
    assert out["within_seed_noise"] is True and out["same_serving_signatures"] is True

    runs["swapped"] = [_run(0.90), _run(0.91)]
    assert drop_in.headline(runs, 1000, "binary_accuracy")["within_seed_noise"] is False


def test_drop_in_headline_of_one_repeat_has_no_spread_to_judge_by():
    out = drop_in.headline(
        {"stock": [_run(0.78)], "swapped": [_run(0.79)]}, 1000, "binary_accuracy"
    )
    assert out["binary_accuracy_stock_std"] is None
    assert out["accuracy_diff_se"] is None and out["within_seed_noise"] is None
