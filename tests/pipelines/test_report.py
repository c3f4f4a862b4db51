"""The distillation report's verdict: whether the distilled student beat the student trained alone."""

from __future__ import annotations

import pytest

from components.distillation import verdict as verdict_lib
from pipelines.report import calibration, verdict


def _rows(teacher: float, student: float, scratch: float | None = None) -> list[dict]:
    rows = [{"role": "teacher", "node": "Trainer", "accuracy": teacher}]
    if scratch is not None:
        rows.append({"role": "scratch", "node": "StudentBaseline", "accuracy": scratch})
    return rows + [{"role": "student", "node": "Distiller", "accuracy": student}]


def test_a_student_that_beat_the_scratch_baseline_is_credited_with_its_share_of_the_gap():
    result = verdict(_rows(teacher=0.88, student=0.86, scratch=0.83))
    assert result["improved"] is True
    assert result["gain_over_scratch"] == pytest.approx(0.03)
    assert result["gap_recovered"] == pytest.approx(0.6)
    assert "beat the same student trained alone by +0.0300" in result["message"]
    assert "60%" in result["message"]


@pytest.mark.parametrize("student", [0.876, 0.880])
def test_a_student_no_better_than_the_scratch_baseline_is_called_out(student):
    result = verdict(_rows(teacher=0.893, student=student, scratch=0.880))
    assert result["improved"] is False
    assert result["message"].startswith(
        "The distilled student did NOT improve on the same student trained alone"
    )
    assert f"{student:.4f} vs 0.8800" in result["message"]


def test_a_teacher_no_better_than_the_scratch_baseline_has_no_lead_but_the_gain_is_still_told():
    result = verdict(_rows(teacher=0.873, student=0.891, scratch=0.892))
    assert result["gap_recovered"] is None and result["improved"] is False
    assert result["message"] == (
        "The teacher (0.8730) is no better than the student trained alone (0.8920), so it "
        "has no lead to recover. Its soft targets can still act as a regulariser, by a "
        "margin one run cannot tell from noise: here the distilled student scored 0.8910 "
        "against 0.8920 alone (-0.0010). benchmarks/distillation.py --scenario kd measures "
        "the seed spread."
    )
    # Every label, make run's models: the soft targets regularised (+0.0035 over 5 seeds).
    better = verdict(_rows(teacher=0.9183, student=0.9190, scratch=0.9186))
    assert better["gap_recovered"] is None and better["improved"] is True
    assert "scored 0.9190 against 0.9186 alone (+0.0004)" in better["message"]


def test_without_a_scratch_baseline_the_report_says_it_cannot_judge():
    result = verdict(_rows(teacher=0.9, student=0.85))
    assert result["improved"] is None and "scratch_acc" not in result
    assert "distillation.scratch_baseline: false" in result["message"]


def test_an_m_on_m_verdict_compares_the_ensemble_with_its_mean_student_and_one_student():
    result = verdict_lib.m_on_m_verdict(0.93, 0.92, [0.90, 0.91, 0.92], 0.915)
    assert result["mean_member_acc"] == pytest.approx(0.91)
    assert result["gain_over_mean_member"] == pytest.approx(0.01)
    assert result["gain_over_one_student"] == pytest.approx(0.005)
    assert result["improved"] is True
    assert result["message"].startswith(
        "The ensemble of 3 students scored 0.9200: +0.0100 over its mean student (0.9100), "
        "+0.0050 over one student of all the teachers (0.9150)"
    )
    worse = verdict_lib.m_on_m_verdict(0.93, 0.92, [0.90, 0.91], 0.925)
    assert worse["improved"] is False
    # Without a model trained alone at its cost, the verdict says what it lacks.
    assert result["same_cost_alone"] is None and result["beat_same_cost_alone"] is None
    assert (
        "This verdict has no same-cost yardstick: the ensemble's parameter count is unknown."
        in (result["message"])
    )


def test_an_m_on_m_verdict_says_which_teacher_did_not_beat_its_own_student():
    ahead = verdict_lib.m_on_m_verdict(0.93, 0.92, [0.90, 0.91], 0.915, teacher_accs=[0.925, 0.93])
    assert ahead["teachers_beat_students"] is True and ahead["teacher_accs"] == [0.925, 0.93]
    assert "did not beat its student" not in ahead["message"]
    # Teacher 1 (0.9100) ties its student: it has nothing better to teach.
    behind = verdict_lib.m_on_m_verdict(0.93, 0.92, [0.90, 0.91], 0.915, teacher_accs=[0.92, 0.91])
    assert behind["teachers_beat_students"] is False
    assert (
        "Teacher 1 (0.9100) did not beat its student (0.9100): a teacher no better than its "
        "student has little to teach; train the teachers longer or larger" in behind["message"]
    )
    # Without one accuracy per student's teacher, nothing is paired or said.
    unpaired = verdict_lib.m_on_m_verdict(0.93, 0.92, [0.90, 0.91], 0.915, teacher_accs=[0.8])
    assert "teachers_beat_students" not in unpaired


# The shipped fashion_mnist_m_on_m: three students of 15,522 parameters, and
# Baseline_wide, the network trained alone at their cost.
ENSEMBLE_PARAMS = 3 * 15_522
WIDE_PARAMS = 46_898


def _m_on_m_rows(wide: float, bigger: float = 0.95) -> list[dict]:
    """An M-on-M run's report rows: the ensemble scores 0.92 (its students 0.90-0.92, one
    student 0.915); `wide` trained alone at its cost, `bigger` alone at twice it."""
    return [
        {"role": "teacher", "node": "Trainer", "accuracy": 0.93, "params": 390_634},
        {"role": "teachers", "node": "3 teachers", "accuracy": 0.935, "params": 3 * 390_634},
        {"role": "scratch", "node": "StudentBaseline", "accuracy": 0.89, "params": 15_522},
        {"role": "baseline", "node": "Baseline_wide", "accuracy": wide, "params": WIDE_PARAMS},
        {"role": "baseline", "node": "Baseline_big", "accuracy": bigger, "params": 2 * WIDE_PARAMS},
        {"role": "one_student", "node": "EnsembleStudent", "accuracy": 0.915, "params": 15_522},
        *(
            {"role": "member", "node": f"Distiller/student_{i}", "accuracy": a, "params": 15_522}
            for i, a in enumerate([0.90, 0.91, 0.92])
        ),
        {"role": "student", "node": "Distiller", "accuracy": 0.92, "params": ENSEMBLE_PARAMS},
    ]


def test_an_m_on_m_ensemble_below_a_same_cost_model_alone_is_not_improved():
    result = verdict(_m_on_m_rows(wide=0.925), method="m_on_m")
    # It beat its mean student and the one student, and still is not improved.
    assert result["gain_over_mean_member"] > 0 and result["gain_over_one_student"] > 0
    assert result["improved"] is False and result["beat_same_cost_alone"] is False
    # Baseline_big scored more, at twice the cost: not the yardstick.
    assert result["same_cost_alone"] == "Baseline_wide"
    assert result["gain_over_same_cost_alone"] == pytest.approx(-0.005)
    assert result["ensemble_params"] == ENSEMBLE_PARAMS
    assert (
        "At the same serving cost (at most its parameters, within 5%) the ensemble did NOT beat "
        "the best model trained alone here: Baseline_wide (46,898 parameters) scored 0.9250, the "
        "ensemble (46,566 parameters) 0.9200 (-0.0050)." in result["message"]
    )


def test_an_m_on_m_ensemble_above_every_same_cost_model_alone_is_improved():
    result = verdict(_m_on_m_rows(wide=0.91), method="m_on_m")
    assert result["improved"] is True and result["beat_same_cost_alone"] is True
    assert result["same_cost_alone"] == "Baseline_wide"
    assert (
        "the ensemble beat the best model trained alone here: Baseline_wide (46,898 parameters) "
        "scored 0.9100, the ensemble (46,566 parameters) 0.9200 (+0.0100)." in result["message"]
    )
    # The scratch baseline is a model trained alone at no more than the cost too.
    rows = [r for r in _m_on_m_rows(wide=0.91) if r["node"] != "Baseline_wide"]
    assert verdict(rows, method="m_on_m")["same_cost_alone"] == "StudentBaseline"


def test_an_m_on_m_verdict_without_a_same_cost_model_alone_says_so():
    rows = [r for r in _m_on_m_rows(wide=0.99) if r["role"] not in ("baseline", "scratch")]
    rows.append({"role": "baseline", "node": "Baseline_big", "accuracy": 0.99, "params": 48_895})
    result = verdict(rows, method="m_on_m")
    # 48,895 parameters is one more than 5% over the ensemble's 46,566.
    assert result["same_cost_alone"] is None and result["improved"] is True
    assert (
        "This verdict has no same-cost yardstick: no model trained alone here has at most the "
        "ensemble's 46,566 parameters (within 5%); add one to distillation.baselines."
    ) in result["message"]
    rows[-1]["params"] = 48_894  # within 5%: the yardstick, and it beat the ensemble
    within = verdict(rows, method="m_on_m")
    assert within["same_cost_alone"] == "Baseline_big" and within["improved"] is False


def test_a_noisy_student_verdict_judges_the_last_round_against_the_network_alone():
    result = verdict_lib.noisy_student_verdict(0.80, [0.83, 0.85], 0.82)
    assert result["improved"] is True
    assert result["gain_over_scratch"] == pytest.approx(0.03)
    assert result["gain_over_teacher"] == pytest.approx(0.05)
    assert result["message"].startswith(
        "Noisy Student, teacher then rounds: 0.8000 -> 0.8300 -> 0.8500; the last round +0.0500 "
        "over its first teacher, +0.0300 over the same network trained alone on the labels (0.8200)"
    )
    worse = verdict_lib.noisy_student_verdict(0.80, [0.81], 0.82)
    assert worse["improved"] is False
    assert "did NOT beat the same network trained alone on the labels: -0.0100" in worse["message"]
    assert verdict_lib.noisy_student_verdict(0.8, [0.81], None)["improved"] is None


def _with_baselines(student: float, conv: float) -> list[dict]:
    return [
        {"role": "teacher", "node": "Trainer", "accuracy": 0.93, "params": 1_000_000},
        {"role": "scratch", "node": "StudentBaseline", "accuracy": 0.90, "params": 50_000},
        {"role": "baseline", "node": "Baseline_conv", "accuracy": conv, "params": 40_000},
        {"role": "student", "node": "Distiller", "accuracy": student, "params": 50_000},
    ]


def test_the_verdict_names_the_best_model_trained_alone_and_whether_the_student_beat_it():
    result = verdict(_with_baselines(student=0.915, conv=0.910))
    # Against its own network alone, as before; the conv baseline is the best alone.
    assert result["scratch_acc"] == 0.90 and result["improved"] is True
    assert result["best_alone"] == "Baseline_conv"
    assert result["gain_over_best_alone"] == pytest.approx(0.005)
    assert result["beat_best_alone"] is True
    assert result["message"].endswith(
        "The best model trained alone here, Baseline_conv (40,000 parameters), scored "
        "0.9100: +0.0050 behind the distilled student (50,000 parameters)."
    )


def test_a_student_below_the_best_model_alone_is_told_so_in_one_sentence():
    result = verdict(_with_baselines(student=0.905, conv=0.912))
    assert result["improved"] is True and result["beat_best_alone"] is False
    assert result["message"].endswith(
        "Distillation did NOT beat the best model trained alone here: Baseline_conv "
        "(40,000 parameters) scored 0.9120, the distilled student (50,000 parameters) 0.9050 "
        "(-0.0070)."
    )


def test_without_the_scratch_baseline_the_baselines_alone_are_the_yardstick():
    rows = [r for r in _with_baselines(student=0.915, conv=0.910) if r["node"] != "StudentBaseline"]
    result = verdict(rows)
    assert result["improved"] is None
    assert result["best_alone"] == "Baseline_conv" and result["beat_best_alone"] is True


def test_when_the_students_network_alone_is_best_the_verdict_names_its_node():
    result = verdict(_with_baselines(student=0.899, conv=0.880))
    assert result["best_alone"] == "StudentBaseline" and result["best_alone_acc"] == 0.90
    assert (
        "Distillation did NOT beat the best model trained alone here: the student's network alone "
        "(50,000 parameters) scored 0.9000" in result["message"]
    )


def test_a_student_worse_calibrated_than_its_network_alone_is_told_so_in_one_line():
    # The Noisy Student figures of issue 60: log-loss 1.17 against 0.53 alone.
    rows = [
        {"role": "teacher", "log_loss": 0.40},
        {"role": "scratch", "log_loss": 0.53},
        {"role": "student", "log_loss": 1.17},
    ]
    assert calibration(rows) == (
        "The student's log-loss 1.1700 is worse than its network trained alone (0.5300): "
        "its probabilities are less calibrated."
    )
    rows[2]["log_loss"] = 0.50
    assert calibration(rows) == ""
    assert calibration([rows[0], rows[2]]) == ""  # no network alone to compare with
