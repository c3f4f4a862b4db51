"""`benchmarks/taxi_teachers.py`: its splits, its rules, its candidates and its paired
headline (no training)."""

from __future__ import annotations

import csv
import os

import pytest

from benchmarks import taxi_teachers as bench
from components.data.sources import taxi_csv_path
from pipelines.configs import load_config


def _rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_the_splits_hold_every_row_once_by_a_fixed_permutation(tmp_path):
    data = bench.write_splits(str(tmp_path / "a"))
    again = bench.write_splits(str(tmp_path / "b"))
    assert data.splits == bench.SPLITS and data.format == "csv"
    parts = {
        split: _rows(os.path.join(data.input_base, split, "data.csv"))
        for split in ("train", "eval", "test")
    }
    assert [len(parts[s]) for s in ("train", "eval", "test")] == [10002, 2000, 3000]

    # Every row of the shipped CSV in exactly one split.
    def key(row):
        return tuple(sorted(row.items()))

    every = sorted(key(r) for r in _rows(taxi_csv_path()))
    assert sorted(key(r) for part in parts.values() for r in part) == every
    for split in parts:
        assert _rows(os.path.join(again.input_base, split, "data.csv")) == parts[split]


def test_the_rules_score_the_test_rows(tmp_path):
    path = tmp_path / "test.csv"
    rows = [
        ("Credit Card", "1"),
        ("Credit Card", "0"),
        ("Cash", "0"),
        ("Cash", "1"),
        ("Cash", "0"),
        ("No Charge", ""),  # no label: not scored
    ]
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["payment_type", "big_tipper"])
        writer.writerows(rows)
    # Card rule right on rows 1, 3, 5 (3 of 5); "never" right on rows 2, 3, 5.
    assert bench.rule_accuracies(str(path), "big_tipper") == {
        "credit_card_rule_acc": 0.6,
        "majority_acc": 0.6,
    }


def test_the_shipped_teacher_and_student_are_among_the_candidates():
    config = load_config("taxi")
    shapes = {
        (tuple(s["hidden_units"]), s["embedding_dim"], s.get("dropout", 0.0))
        for _, s, _ in bench.TEACHERS
    }
    teacher = config.teacher
    assert (tuple(teacher.hidden_units), teacher.embedding_dim, teacher.dropout) in shapes
    student = config.student
    assert any(
        (tuple(s["hidden_units"]), s["embedding_dim"])
        == (tuple(student.hidden_units), student.embedding_dim)
        for _, s, _ in bench.SMALL
    )
    assert len({name for name, _, _ in bench.TEACHERS}) == len(bench.TEACHERS) == 8
    assert len({name for name, _, _ in bench.SMALL}) == len(bench.SMALL) == 4


def _row(seed, teacher, alone, distilled):
    return {
        "seed": seed,
        "teacher_acc": teacher,
        "alone_acc": alone,
        "distilled_acc": distilled,
        "teacher_params": 200_000,
        "alone_params": 900,
        "distilled_params": 900,
    }


CHOICE = {"teacher": "wide_d0.5_1000", "small": "mlp16_1000", "alpha": 0.5, "temperature": 1.0}


def test_the_headline_pairs_each_seed_and_gives_t_intervals():
    rows = [
        _row(0, 0.90, 0.89, 0.89),
        _row(1, 0.91, 0.89, 0.88),
        _row(2, 0.93, 0.90, 0.91),
    ]
    out = bench.headline(rows, {**CHOICE, "teachers": []}, {"credit_card_rule_acc": 0.891})
    assert (out["teacher_acc"], out["alone_acc"], out["distilled_acc"]) == (0.9133, 0.8933, 0.8933)
    # By hand: differences 0.01, 0.02, 0.03 (sd 0.01) and 0, -0.01, 0.01 (sd 0.01);
    # half width t(0.975, 2) * 0.01 / sqrt(3) = 4.3027 * 0.005774 = 0.0248.
    assert out["teacher_minus_alone"] == 0.02
    assert out["teacher_minus_alone_ci95"] == pytest.approx([-0.0048, 0.0448])
    assert out["distilled_minus_alone"] == 0.0
    assert out["distilled_minus_alone_ci95"] == pytest.approx([-0.0248, 0.0248])
    assert (out["teacher_minus_alone_wins"], out["distilled_minus_alone_wins"]) == (3, 1)
    assert out["credit_card_rule_acc"] == 0.891 and out["choice"] == CHOICE
    assert (out["teacher_params"], out["alone_params"]) == (200_000, 900)


def test_one_seed_gives_no_interval():
    out = bench.headline([_row(0, 0.90, 0.89, 0.89)], CHOICE, {})
    assert out["teacher_minus_alone"] == 0.01 and out["teacher_minus_alone_ci95"] is None


def test_fewer_than_two_seeds_are_refused(capsys):
    with pytest.raises(SystemExit):
        bench.main(["--seeds", "1", "--no-results"])
    assert "--seeds: at least 2" in capsys.readouterr().err


def test_a_shape_and_its_steps_go_to_the_role_and_a_cap_bounds_the_steps():
    config = bench.base_config("/data/splits")
    assert config.data.path == "/data/splits" and not config.data.builtin
    teacher = bench.shaped(config, "teacher", bench.NARROW_TEACHER, 3000)
    assert teacher.teacher.hidden_units == (128, 64) and teacher.train.train_steps == 3000
    student = bench.shaped(config, "student", {"hidden_units": [32]}, 3000, 150, alpha=0.9)
    assert student.student.hidden_units == (32,) and student.student_train_steps() == 150
    assert student.distillation.alpha == 0.9 and student.train.train_steps == 1000


def test_a_teacher_trains_for_its_candidates_steps_not_the_benchmark_configs(tmp_path):
    """What a bench trains a role for (`Bench.train_classifier`): the inputs of
    `Bench.role_steps` under the config it is given, whatever the bench's own."""

    class Splits:  # a bench without the splits its constructor reads
        config = bench.base_config("/data/splits")
        paths = {"train": "t", "eval": "e", "transform_graph": "g"}
        workdir = str(tmp_path)
        inputs = bench.bench_lib.Bench.inputs

    assert Splits.config.train.train_steps == 1000
    for steps in (1000, 3000):
        teacher = bench.shaped(Splits.config, "teacher", bench.SHIPPED_TEACHER, steps)
        role_steps = bench.bench_lib.Bench.role_steps(teacher, "teacher")
        assert Splits().inputs("teacher", role_steps).train_steps == steps
    student = bench.shaped(Splits.config, "student", {"hidden_units": [16]}, 3000)
    assert bench.bench_lib.Bench.role_steps(student, "student") == 3000


def test_a_saved_stage_is_made_once_with_its_provenance_and_read_back(tmp_path):
    made = []
    first = bench.saved(str(tmp_path), "choice", lambda: made.append(1) or {"acc": 0.9})
    assert first["acc"] == 0.9 and made == [1]
    assert {"commit", "commit_start", "date", "machine"} <= set(first["provenance"])

    def refuse():
        raise AssertionError("a saved stage was made again")

    assert bench.saved(str(tmp_path), "choice", refuse) == first
