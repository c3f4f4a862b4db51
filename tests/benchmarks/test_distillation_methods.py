"""The M-on-M benchmark's summary: paired intervals over trials and its targets."""

from __future__ import annotations

import pytest

from benchmarks.distillation_methods import summarize_m_on_m


def _row(trial, singles, ensemble, one, params=(300, 100)):
    return {
        "trial": trial,
        "teacher_accs": [0.9, 0.9, 0.9],
        "teacher_ensemble_acc": 0.91,
        "single_accs": singles,
        "mean_single_acc": sum(singles) / len(singles),
        "student_ensemble_acc": ensemble,
        "student_of_teacher_ensemble_acc": one,
        "teacher_params": params[0],
        "ensemble_params": params[1],
    }


def test_the_interval_is_paired_over_trials_and_judges_the_target():
    # The ensemble leads its mean student by 0.010, 0.012 and 0.011: the trials
    # differ far more from each other than the lead does, which pairing removes.
    rows = [
        _row(0, [0.80, 0.80, 0.80], 0.810, 0.805),
        _row(1, [0.85, 0.85, 0.85], 0.862, 0.860),
        _row(2, [0.90, 0.90, 0.90], 0.911, 0.915),
    ]
    out = summarize_m_on_m(rows, 1.0, {"alpha": 0.5, "temperature": 1.0})
    assert out["ensemble_minus_mean_single"] == pytest.approx(0.011)
    low, high = out["ensemble_minus_mean_single_ci95"]
    assert 0.007 < low < 0.011 < high < 0.015
    assert out["targets"] == {
        "ensemble_beats_mean_single_ci_excludes_0": True,
        "param_ratio_le_1/3": True,
    }
    # Against the one student the differences change sign: no claim.
    low, high = out["ensemble_minus_student_of_teacher_ensemble_ci95"]
    assert low < 0 < high


def test_one_trial_gives_no_interval_and_meets_no_target():
    out = summarize_m_on_m([_row(0, [0.8, 0.8, 0.8], 0.9, 0.8, params=(100, 50))], 0.1, {})
    assert out["ensemble_minus_mean_single_ci95"] is None
    assert out["targets"] == {
        "ensemble_beats_mean_single_ci_excludes_0": False,
        "param_ratio_le_1/3": False,
    }
