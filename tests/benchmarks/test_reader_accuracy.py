"""`benchmarks/reader_accuracy.py`: its headline from recorded runs, and one short run of each side."""

from __future__ import annotations

import math
import os
import statistics
import sys

import pytest

from benchmarks import drop_in, reader_accuracy
from components.data import fashion_mnist
from tests.conftest import write_fashion_idx


def test_headline_compares_the_two_readers():
    # Pair 1 ran tfxkit first; fit ratios (tfxkit / stock) 0.5 and 0.6.
    runs = [
        {"pair": 0, "side": "stock", "accuracy": 0.86, "fit_s": 80.0},
        {"pair": 0, "side": "tfxkit", "accuracy": 0.85, "fit_s": 40.0},
        {"pair": 1, "side": "tfxkit", "accuracy": 0.87, "fit_s": 36.0},
        {"pair": 1, "side": "stock", "accuracy": 0.87, "fit_s": 60.0},
    ]
    out = reader_accuracy.headline(runs, batch_size=256, train_steps=5000)
    assert out["batch_size"] == 256 and out["train_steps"] == 5000 and out["repeats"] == 2
    assert out["stock_accuracy"] == 0.865 and out["tfxkit_accuracy"] == 0.86
    assert out["stock_accuracy_std"] == round(statistics.stdev([0.86, 0.87]), 4)
    assert out["tfxkit_accuracy_std"] == round(statistics.stdev([0.85, 0.87]), 4)
    assert out["accuracy_diff"] == -0.005
    se = math.sqrt(statistics.variance([0.86, 0.87]) / 2 + statistics.variance([0.85, 0.87]) / 2)
    assert out["accuracy_diff_se"] == round(se, 4)
    assert "within_seed_noise" not in out  # the equivalence test is the verdict
    # By hand: SE 0.01118, Welch df 1.47 taken as 1, t(0.95, 1) = 6.3138: -0.005 +- 0.0706,
    # wider than the 0.01 margin, so not shown equivalent.
    assert out["accuracy_margin"] == 0.01
    assert out["accuracy_diff_ci90"] == pytest.approx([-0.0756, 0.0656])
    assert out["accuracy_equivalent_within_margin"] is False
    # Geometric mean sqrt(0.3), its interval on the logs with t(0.975, 1) = 12.706.
    assert out["fit_ratio_tfxkit_over_stock"] == pytest.approx(0.548)
    assert out["fit_ratio_ci95"] == pytest.approx([0.172, 1.744])


def test_close_accuracies_over_three_pairs_are_equivalent():
    accs = {"stock": (0.860, 0.862, 0.861), "tfxkit": (0.861, 0.860, 0.862)}
    runs = [
        {"pair": i, "side": side, "accuracy": accs[side][i], "fit_s": 10.0}
        for i in range(3)
        for side in reader_accuracy.SIDES
    ]
    out = reader_accuracy.headline(runs, batch_size=256, train_steps=5000)
    # By hand: SE 0.000816, df 4, t(0.95, 4) = 2.1318: 0 +- 0.0017.
    assert out["accuracy_diff_ci90"] == pytest.approx([-0.0017, 0.0017])
    assert out["accuracy_equivalent_within_margin"] is True
    assert out["fit_ratio_tfxkit_over_stock"] == 1.0


def test_one_pair_gives_no_standard_error_test_or_interval():
    runs = [
        {"pair": 0, "side": "stock", "accuracy": 0.9, "fit_s": 2.0},
        {"pair": 0, "side": "tfxkit", "accuracy": 0.8, "fit_s": 1.0},
    ]
    out = reader_accuracy.headline(runs, batch_size=64, train_steps=10)
    assert out["accuracy_diff"] == -0.1
    assert out["stock_accuracy_std"] is None and out["accuracy_diff_se"] is None
    assert out["accuracy_equivalent_within_margin"] is None and out["fit_ratio_ci95"] is None
    assert out["fit_ratio_tfxkit_over_stock"] == 0.5


def test_fit_ratios_are_over_complete_pairs_only():
    runs = [
        {"pair": 0, "side": "stock", "accuracy": 0.86, "fit_s": 80.0},
        {"pair": 0, "side": "tfxkit", "accuracy": 0.85, "fit_s": 40.0},
        {"pair": 1, "side": "stock", "accuracy": 0.87, "fit_s": 60.0},
    ]
    out = reader_accuracy.headline(runs, batch_size=256, train_steps=5000)
    assert out["repeats"] == 1 and out["fit_ratio_tfxkit_over_stock"] == 0.5


def test_taxi_trains_the_model_its_run_fn_builds_at_its_pipeline_steps():
    input_fn, build_model, label_key = reader_accuracy._taxi_model()
    assert label_key == "tips_xf" and callable(input_fn)
    # Its run_fn's DNN (first 100, decay 0.7, 4 layers), then the wide-and-deep logit.
    dense = [layer.units for layer in build_model().layers if type(layer).__name__ == "Dense"]
    assert dense == [100, 70, 48, 34, 1]
    # The steps drop_in.py runs the example's pipeline at, and its run_fn's batch.
    assert reader_accuracy.EXAMPLES["taxi"] == {
        "batch_size": 40,
        "train_steps": drop_in.DEFAULT_STEPS["taxi"],
    }


def _nothing_may_run(*args, **kwargs):
    raise AssertionError("the benchmark ran although its arguments should be refused")


def test_fewer_than_2_pairs_is_refused_before_anything_runs(monkeypatch, capsys):
    monkeypatch.setattr(reader_accuracy.fresh_process, "run", _nothing_may_run)
    monkeypatch.setattr(sys, "argv", ["reader_accuracy.py", "--repeats", "1", "--no-results"])
    with pytest.raises(SystemExit):
        reader_accuracy.main()
    assert "--repeats: at least 2" in capsys.readouterr().err


@pytest.mark.e2e
def test_both_readers_train_the_example_on_one_transform_output(tmp_path, monkeypatch):
    idx = tmp_path / "idx"
    idx.mkdir()
    write_fashion_idx(str(idx), {"train": 600, "eval": 2}, learnable=True)
    monkeypatch.setenv(fashion_mnist.ENV_DIR, str(idx))

    pipeline_root = reader_accuracy.transform_once(str(tmp_path / "work"))

    # The partial run ran the Transform and what it reads, nothing else.
    assert sorted(os.listdir(pipeline_root)) == [
        "ImportExampleGen",
        "SchemaGen",
        "StatisticsGen",
        "Transform",
        "_wheels",
    ]
    for side in reader_accuracy.SIDES:
        result = reader_accuracy.train_once(side, pipeline_root, batch_size=32, train_steps=200)
        assert result["side"] == side and result["fit_s"] > 0
        # The band gives the class away: either reader teaches it (chance is 0.1).
        assert result["accuracy"] >= 0.8
