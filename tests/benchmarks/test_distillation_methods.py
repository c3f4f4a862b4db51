"""The distillation methods benchmark: its summaries' paired intervals and targets, and the
construction of the baselines it compares with (sizes, noise)."""

from __future__ import annotations

import json
import subprocess

import numpy as np
import pytest

from benchmarks import distillation_methods as methods
from components.config import from_dict, to_dict
from components.training.models import build_classifier

# A config whose data section is the Fashion-MNIST image (the benchmark's own).
BASE = methods.base_config("/nonexistent", 2000, 3000)
# Noisy Student learns from unlabeled examples: 1% of the labels, as it runs.
SCARCE = methods.with_fraction(BASE, 0.01)


def _row(trial, singles, ensemble, equal_cost, alone, params=(300, 100)):
    return {
        "trial": trial,
        "teacher_accs": [0.9, 0.9, 0.9],
        "teacher_ensemble_acc": 0.91,
        "single_accs": singles,
        "mean_single_acc": sum(singles) / len(singles),
        "student_ensemble_acc": ensemble,
        "equal_cost_single_acc": equal_cost,
        "alone_ensemble_acc": alone,
        "teacher_params": params[0],
        "ensemble_params": params[1],
        "equal_cost_single_params": params[1],
    }


def test_m_on_m_intervals_are_paired_over_trials_and_judge_the_targets():
    # The ensemble leads its mean student by 0.010, 0.012 and 0.011: the trials
    # differ far more from each other than the lead does, which pairing removes.
    rows = [
        _row(0, [0.80, 0.80, 0.80], 0.810, 0.805, 0.812),
        _row(1, [0.85, 0.85, 0.85], 0.862, 0.860, 0.858),
        _row(2, [0.90, 0.90, 0.90], 0.911, 0.915, 0.915),
    ]
    out = methods.summarize_m_on_m(rows, 1.0, {"alpha": 0.5, "temperature": 1.0})
    assert out["ensemble_minus_mean_single"] == pytest.approx(0.011)
    low, high = out["ensemble_minus_mean_single_ci95"]
    assert 0.007 < low < 0.011 < high < 0.015
    # Against both alternatives the differences change sign: no claim.
    assert out["ensemble_minus_equal_cost_single"] == pytest.approx(0.001)
    assert out["ensemble_minus_alone_ensemble"] == pytest.approx(-0.0007, abs=1e-4)
    for key in ("ensemble_minus_equal_cost_single_ci95", "ensemble_minus_alone_ensemble_ci95"):
        low, high = out[key]
        assert low < 0 < high
    assert out["targets"] == {
        "ensemble_beats_mean_single_ci_excludes_0": True,
        "ensemble_beats_equal_cost_single_ci_excludes_0": False,
        "ensemble_beats_alone_ensemble_ci_excludes_0": False,
        "param_ratio_le_1/3": True,
    }


def test_one_trial_gives_no_interval_and_meets_no_target():
    out = methods.summarize_m_on_m(
        [_row(0, [0.8, 0.8, 0.8], 0.9, 0.8, 0.8, params=(100, 50))], 0.1, {}
    )
    assert out["ensemble_minus_mean_single_ci95"] is None
    assert not any(out["targets"].values())


def _trainable_params(student: dict) -> int:
    data = to_dict(BASE)
    data["student"] = student
    config = from_dict(data)
    model = build_classifier(config.data, config.student, {}, "student")
    return int(sum(np.prod(w.shape) for w in model.trainable_weights))


def test_the_equal_cost_student_is_as_large_as_the_ensemble_within_5_percent():
    one = _trainable_params(methods.STUDENT)
    big = _trainable_params(methods.EQUAL_COST_STUDENT)
    # Counted by hand: conv 9*8 + 9*8*16 + 9*16*32, batch-norm shifts and scales
    # 2*(8 + 16 + 32), head 288*32 + 32 and logits 32*10 + 10.
    assert one == 72 + 1152 + 4608 + 112 + 9248 + 330
    ensemble = methods.NUM_TEACHERS * one
    assert abs(big / ensemble - 1) <= 0.05, (big, ensemble)


def test_the_served_ensemble_is_the_members_mean_logits():
    first = np.array([[0.7, 0.2, 0.1]])
    second = np.array([[0.1, 0.6, 0.3]])
    logits = (np.log(first) + np.log(second)) / 2
    expected = np.exp(logits) / np.exp(logits).sum()
    out = methods.mean_logit_probabilities([first, second])
    np.testing.assert_allclose(out, expected, rtol=1e-6)
    # Not the mean of the probabilities (0.4, 0.4, 0.2): about (0.337, 0.442, 0.221).
    np.testing.assert_allclose(out, [[0.337, 0.442, 0.221]], atol=1e-3)


@pytest.mark.parametrize(
    "arm,dropout,views,mixup",
    [("paper", 0.3, True, 0.2), ("none", 0.0, False, 0.0), ("mixup", 0.0, False, 0.2)],
)
def test_noisy_student_arms_noise_the_students_as_named(arm, dropout, views, mixup):
    config = methods.noisy_config(SCARCE, arm)
    assert config.student.dropout == dropout
    assert config.student.conv.dropout == (0.25 if dropout else 0.0)
    augmentation = config.train.augmentation
    assert (augmentation.translate > 0, augmentation.flip) == (views, views)
    assert augmentation.mixup == mixup
    # Every arm learns from the same teacher: NS_MODEL with its dropout.
    assert config.teacher.dropout == 0.3
    assert config.distillation.noisy_student.confidence == 0.7


def test_the_teacher_trains_with_dropout_views_and_mixup():
    teacher = methods.teacher_config(SCARCE)
    assert teacher.teacher.dropout == 0.3
    augmentation = teacher.train.augmentation
    assert (augmentation.translate, augmentation.flip, augmentation.mixup) == (2, True, 0.2)


def _ns_row(seed, final, unnoised, chosen, teacher=0.82):
    return {
        "seed": seed,
        "arm": "mixup",
        "teacher_acc": teacher,
        "round_accs": [final - 0.01, final],
        "unnoised_alone_acc": unnoised,
        "chosen_alone_acc": chosen,
        "params": 60986,
    }


def test_noisy_student_summary_pairs_the_last_round_with_each_baseline():
    rows = [
        _ns_row(0, 0.850, 0.830, 0.845),
        _ns_row(1, 0.860, 0.842, 0.858),
        _ns_row(2, 0.855, 0.836, 0.856),
    ]
    out = methods.summarize_noisy(rows, 0.01, {"arm": "mixup", "alone_arm": "mixup"})
    assert out["round_accs"] == [pytest.approx(0.845), pytest.approx(0.855)]
    assert out["final_minus_unnoised_alone"] == pytest.approx(0.019)
    low, high = out["final_minus_unnoised_alone_ci95"]
    assert 0.014 < low < 0.019 < high < 0.024
    assert out["final_minus_chosen_alone"] == pytest.approx(0.002)
    assert out["targets"] == {
        "final_beats_unnoised_alone_ci_excludes_0": True,
        "final_beats_chosen_alone_ci_excludes_0": False,
    }
    assert out["noise"] == methods.NS_ARMS["mixup"]


def _git_out(*args) -> str:
    return subprocess.run(
        ["git", "-C", methods.REPO, *args], capture_output=True, text=True, check=True
    ).stdout.strip()


def _saved_trial(commit: str, dirty: bool = False, started: str | None = None) -> dict:
    made = {"commit": commit, "dirty": dirty, "dirty_files": []}
    return {
        "acc": 0.9,
        "provenance": {**made, "commit_start": {**made, "commit": started or commit}},
    }


def test_saved_trials_are_reused_only_while_they_describe_head(tmp_path, monkeypatch):
    """A trial saved on committed HEAD is read back, not rerun; one measured on uncommitted
    code, on a checkout that moved while it trained, or on a commit outside this history
    is rerun and saved over."""
    monkeypatch.setattr(methods, "TRIALS_DIR", str(tmp_path))
    head = _git_out("rev-parse", "HEAD")
    saved = {
        0: _saved_trial(head),
        1: _saved_trial(head, dirty=True),
        2: _saved_trial(head, started=_git_out("rev-parse", "HEAD~1")),
        3: _saved_trial("0" * 40),
    }
    for i, record in saved.items():
        methods._save(methods._saved_file("k", f"trial{i}"), record)
    ran = []

    def run_one(i):
        ran.append(i)
        return {"acc": 0.5}

    rows = methods._resumable("k", 5, run_one, lambda i, r: f"trial {i}")
    assert ran == [1, 2, 3, 4]
    assert [r["acc"] for r in rows] == [0.9, 0.5, 0.5, 0.5, 0.5]
    # Rerun rows replace the ones not reused, with this run's provenance.
    with open(methods._saved_file("k", "trial3")) as f:
        assert json.load(f)["provenance"]["commit"] == head


def test_saved_only_reads_back_and_trains_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(methods, "TRIALS_DIR", str(tmp_path))
    monkeypatch.setattr(methods, "SAVED_ONLY", True)
    head = _git_out("rev-parse", "HEAD")
    methods._save(methods._saved_file("k", "trial0"), _saved_trial(head))
    methods._save(methods._saved_file("k", "choice"), {"alpha": 0.5, **_saved_trial(head)})

    def train(*_):
        raise AssertionError("--saved-only trains nothing")

    assert [r["acc"] for r in methods._resumable("k", 3, train, str)] == [0.9]
    assert methods._saved_choice("k", train)["alpha"] == 0.5
    assert methods._saved_choice("other", train) is None
