"""The distillation report's verdict: whether the distilled student beat the student trained alone."""

from __future__ import annotations

import pytest

from pipelines.report import verdict


def _rows(teacher: float, student: float, scratch: float | None = None) -> list[dict]:
    rows = [{"role": "teacher", "accuracy": teacher}]
    if scratch is not None:
        rows.append({"role": "scratch", "accuracy": scratch})
    return rows + [{"role": "student", "accuracy": student}]


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


def test_a_teacher_no_better_than_the_scratch_baseline_means_nothing_to_distil():
    result = verdict(_rows(teacher=0.873, student=0.891, scratch=0.892))
    assert result["gap_recovered"] is None and result["improved"] is False
    assert "nothing to distil" in result["message"]


def test_without_a_scratch_baseline_the_report_says_it_cannot_judge():
    result = verdict(_rows(teacher=0.9, student=0.85))
    assert result["improved"] is None and "scratch_acc" not in result
    assert "distillation.scratch_baseline: false" in result["message"]
