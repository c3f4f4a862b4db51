"""`benchmarks/scale.py`: its fits and ratios on written numbers, and its taxi-like rows."""

from __future__ import annotations

import csv
import math

import pytest

from benchmarks import scale


def _run(side, runner, rows, wall, rss=1000.0):
    return {"side": side, "runner": runner, "rows": rows, "wall_s": wall, "peak_rss_mb": rss}


def test_the_exponent_is_the_log_log_slope_of_time_on_rows():
    # wall = 2 * rows^0.8 exactly: the slope is 0.8 whatever the constant.
    rows = [10**4, 10**5, 10**6]
    assert scale.slope(rows, [2 * r**0.8 for r in rows]) == pytest.approx(0.8)
    # Fixed cost plus linear: the fit over all sizes is below 1, the top pair nearer 1.
    walls = [30 + r / 10**4 for r in rows]
    runs = [_run("product", "in_process", r, w) for r, w in zip(rows, walls, strict=True)]
    whole = scale.summarize(runs)["exponents"]["product/in_process"]
    top = scale.marginal_exponents(runs)["product/in_process"]
    assert whole < top < 1.0
    assert top == pytest.approx(math.log(130 / 40) / math.log(10), abs=1e-3)


def test_the_headline_ratios():
    runs = [
        _run("product", "in_process", 10**5, 10.0, rss=800.0),
        _run("product", "in_process", 10**6, 80.0, rss=1200.0),
        _run("stock", "in_process", 10**5, 12.0, rss=900.0),
        _run("stock", "in_process", 10**6, 100.0, rss=2700.0),
        _run("product", "prism", 10**5, 30.0),
    ]
    headline = scale.summarize(runs)
    assert list(headline) == list(scale.HEADLINE_KEYS)
    assert headline["peak_memory_ratio_1e6_over_1e5"] == {
        "product/in_process": 1.5,
        "stock/in_process": 3.0,
    }
    assert headline["total_ratio_product_over_stock_1e6"] == {"in_process": 0.8}
    # One size is no fit.
    assert "product/prism" not in headline["exponents"]


def test_the_rows_are_the_taxi_columns_with_jittered_floats(tmp_path):
    path = tmp_path / "data.csv"
    scale.write_rows(str(path), 300, seed=1)
    with open(path) as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 300
    assert {"fare", "trip_miles", "company", "tips"} <= set(rows[0])
    fares = [float(r["fare"]) for r in rows if r["fare"]]
    # Jittered: almost no two fares are equal, unlike the source's rounded cents.
    assert len(set(fares)) > 0.9 * len(fares)


def test_each_stage_peak_is_the_largest_sample_inside_its_window():
    mb = 2**20
    samples = [(0.5, 100 * mb), (1.0, 300 * mb), (2.0, 200 * mb), (3.5, 900 * mb), (4.0, 50 * mb)]
    windows = {"Transform": (3.0, 4.0), "CsvExampleGen": (0.0, 1.2), "SchemaGen": (2.5, 2.9)}
    peaks = scale.stage_peaks(samples, windows)
    assert peaks == {"CsvExampleGen": 300.0, "SchemaGen": None, "Transform": 900.0}
    # In the order the stages ran.
    assert list(peaks) == ["CsvExampleGen", "SchemaGen", "Transform"]


def test_repeated_pairs_give_the_ratio_its_interval_and_leave_the_sweep_alone():
    runs = [
        _run("product", "in_process", 10**5, 10.0, rss=800.0),
        _run("stock", "in_process", 10**5, 10.0, rss=800.0),
        _run("product", "in_process", 10**6, 90.0, rss=1200.0),
        _run("stock", "in_process", 10**6, 100.0, rss=1600.0),
    ]
    for pair, (product, stock) in enumerate([(95.0, 100.0), (99.0, 100.0)], start=1):
        runs.append({**_run("product", "in_process", 10**6, product, rss=5000.0), "pair": pair})
        runs.append({**_run("stock", "in_process", 10**6, stock, rss=5000.0), "pair": pair})
    ratio = scale.product_over_stock(runs)["in_process"]
    assert ratio["pairs"] == 3
    assert ratio["gmean"] == pytest.approx((0.90 * 0.95 * 0.99) ** (1 / 3), abs=1e-3)
    low, high = ratio["ci95"]
    assert low < ratio["gmean"] < high < 1.1
    headline = scale.summarize(runs)
    assert headline["total_ratio_product_over_stock_1e6"] == {"in_process": ratio["gmean"]}
    # Exponents and memory come from the sweep's own runs, not the repeats.
    assert headline["peak_memory_ratio_1e6_over_1e5"]["product/in_process"] == 1.5
    assert scale.marginal_exponents(runs)["stock/in_process"] == pytest.approx(1.0)
