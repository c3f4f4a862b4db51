"""The headline of `benchmarks/drop_in.py`, from recorded run figures (no pipeline runs)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from benchmarks import drop_in
from testkit.stats import diff_se


def _run(
    side,
    wall,
    trainer,
    transform,
    acc,
    steps,
    signatures="sig",
    metric="binary_accuracy",
    alone=1.5,
):
    return {
        "side": side,
        "wall_s": wall,
        "trainer_s": trainer,
        "transform_s": transform,
        "trainer_phases_s": {"do": trainer, "steps": steps, "export": 1.0},
        "transform_phases_s": {"do": transform, "beam": transform - 1.0},
        "input_alone_s": alone,
        metric: acc,
        "signatures": signatures,
    }


def test_ratios_phases_and_accuracy_of_one_example():
    runs = {
        "stock": [_run("stock", 100, 20, 30, 0.77, 10), _run("stock", 110, 22, 32, 0.78, 12)],
        "swapped": [
            _run("swapped", 90, 15, 27, 0.79, 8, alone=0.5),
            _run("swapped", 95, 17, 29, 0.76, 10, alone=0.7),
        ],
    }
    out = drop_in.headline(runs, 1000, "binary_accuracy")
    assert out["train_steps"] == 1000 and out["repeats"] == 2
    assert out["wall_ratio_swapped_over_stock"] == pytest.approx(92.5 / 105, abs=1e-3)
    assert out["trainer_ratio_swapped_over_stock"] == pytest.approx(16 / 21, abs=1e-3)
    assert out["transform_ratio_swapped_over_stock"] == pytest.approx(28 / 31, abs=1e-3)
    assert out["trainer_phases_s"]["stock"] == {"do": 21.0, "steps": 11.0, "export": 1.0}
    assert out["transform_phases_s"]["swapped"] == {"do": 28.0, "beam": 27.0}
    assert out["input_alone_s"] == {"stock": 1.5, "swapped": 0.6}
    assert out["binary_accuracy_stock"] == pytest.approx(0.775)
    assert out["accuracy_diff"] == pytest.approx(0.0, abs=1e-9)
    assert out["accuracy_diff_se"] == pytest.approx(diff_se([0.79, 0.76], [0.77, 0.78]), abs=1e-4)
    assert out["within_seed_noise"] is True
    assert out["same_serving_signatures"] is True


def test_each_example_reads_its_own_metric_and_differing_signatures_show():
    metric = drop_in.METRICS["penguin"]
    runs = {
        "stock": [_run("stock", 50, 20, 10, 0.9, 15, "a", metric)],
        "swapped": [_run("swapped", 45, 14, 10, 0.95, 9, "b", metric)],
    }
    runs["stock"][0]["input_alone_s"] = None  # a run_fn that built no training dataset
    out = drop_in.headline(runs, 5000, metric)
    assert out["input_alone_s"] == {"stock": None, "swapped": 1.5}
    assert out[f"{metric}_swapped"] == pytest.approx(0.95)
    assert out[f"{metric}_stock_std"] is None
    assert out["within_seed_noise"] is None
    assert out["same_serving_signatures"] is False
    # The last line nests one such object per example; it must be plain JSON.
    json.dumps({"examples": {"penguin": out}})


def test_pair_ratios_give_a_geometric_mean_with_an_interval_and_accuracy_an_equivalence_test():
    runs = {
        "stock": [_run("stock", 100, 20, 30, 0.80, 10), _run("stock", 100, 20, 30, 0.81, 10)],
        "swapped": [
            _run("swapped", 50, 10, 30, 0.80, 8),
            _run("swapped", 200, 40, 30, 0.81, 8),
        ],
    }
    out = drop_in.headline(runs, 1000, "binary_accuracy")
    # Pair ratios 0.5 and 2: geometric mean 1, interval exp(+-12.706205 * 0.693147).
    assert out["wall_pair_ratio_gmean"] == pytest.approx(1.0)
    assert out["wall_pair_ratio_ci95"] == [
        pytest.approx(0.0, abs=1e-3),
        pytest.approx(6682.651, rel=1e-4),
    ]
    assert out["transform_pair_ratio_ci95"] == [1.0, 1.0]
    # Equal means, but two runs a side spread 0.01 apart: variances 5e-5, se 0.0070711,
    # Welch df 2, t(0.95, 2) = 2.919986: the 90% interval +-0.0206 is wider than the margin.
    assert out["accuracy_diff_ci90"] == [-0.0206, 0.0206]
    assert out["accuracy_equivalent_within_margin"] is False
    assert out["accuracy_margin"] == 0.01


def test_every_example_has_its_accuracy_margin_penguin_two_of_its_100_eval_rows():
    assert drop_in.ACCURACY_MARGINS == {"taxi": 0.01, "penguin": 0.02, "mnist": 0.01}
    assert set(drop_in.ACCURACY_MARGINS) == set(drop_in.METRICS)


def test_the_margin_given_judges_the_accuracy_difference():
    metric = drop_in.METRICS["penguin"]
    runs = {
        "stock": [
            _run("stock", 50, 20, 10, a, 15, metric=metric) for a in (0.97, 0.98, 0.97, 0.98)
        ],
        "swapped": [
            _run("swapped", 45, 14, 10, a, 9, metric=metric) for a in (0.96, 0.97, 0.97, 0.96)
        ],
    }
    # Difference -0.01 (one eval row), se 0.0040825, Welch df 6, t(0.95, 6) = 1.943180:
    # the 90% interval [-0.0179, -0.0021] lies within +-0.02 but not within +-0.01.
    penguin = drop_in.headline(runs, 5000, metric, drop_in.ACCURACY_MARGINS["penguin"])
    assert penguin["accuracy_diff_ci90"] == [-0.0179, -0.0021]
    assert penguin["accuracy_margin"] == 0.02
    assert penguin["accuracy_equivalent_within_margin"] is True
    one_row = drop_in.headline(runs, 5000, metric, drop_in.ACCURACY_MARGINS["taxi"])
    assert one_row["accuracy_margin"] == 0.01
    assert one_row["accuracy_equivalent_within_margin"] is False


def test_one_pair_gets_no_interval():
    runs = {
        "stock": [_run("stock", 100, 20, 30, 0.8, 10)],
        "swapped": [_run("swapped", 90, 15, 27, 0.8, 8)],
    }
    out = drop_in.headline(runs, 1000, "binary_accuracy")
    assert out["wall_pair_ratio_ci95"] is None and out["accuracy_equivalent_within_margin"] is None


@pytest.mark.multiprocess
def test_the_stock_side_loads_its_helpers_without_importing_the_product():
    code = (
        "import sys\n"
        "from benchmarks import drop_in, phase_timing\n"
        "examples = drop_in._helper('tfx_examples')\n"
        "drop_in._helper('fresh_process')\n"
        "assert examples.BY_KEY['taxi'].name == 'taxi_native_keras'\n"
        "print(sorted(m for m in sys.modules if m == 'components' or m.startswith('components.')))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=drop_in.REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": drop_in.REPO_ROOT, "TF_CPP_MIN_LOG_LEVEL": "3"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"


def test_a_time_budget_stops_at_a_whole_abba_block():
    orders = [("stock", "swapped"), ("swapped", "stock")] * 5
    assert list(drop_in.within_budget(orders, None, lambda: 0.0)) == list(enumerate(orders))
    # A clock read once at the start and once before each later block: 0, then 100 s
    # per block. A 150 s budget lets blocks start at 100 s, not at 200 s.
    ticks = iter(range(0, 1000, 100))
    ran = list(drop_in.within_budget(orders, 150.0, lambda: next(ticks)))
    assert ran == list(enumerate(orders))[:4]
    # However short the budget, the first block runs whole: its pairs both ways round.
    ticks = iter(range(0, 1000, 100))
    assert [o for _, o in drop_in.within_budget(orders, 0.0, lambda: next(ticks))] == orders[:2]
