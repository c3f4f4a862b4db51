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
