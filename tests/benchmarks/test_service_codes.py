"""The service codes benchmark's summary, against written numbers."""

from __future__ import annotations

import pytest

from benchmarks import service_codes as bench


def _run(trainer_us, dtype="float32"):
    return {
        "image_dtype": dtype,
        "trainer_cpu_us_per_example": trainer_us,
        "examples_per_s": 1e5,
        "workers_cpu_us_per_example": 9.0,
    }


def test_the_summary_pairs_codes_with_values_and_judges_the_target_by_its_interval():
    runs = {
        "values-512": [_run(4.0), _run(3.0)],
        "codes-512": [_run(2.0, "uint8"), _run(1.5, "uint8")],
        "values-4096": [_run(3.0), _run(2.0)],
        "codes-4096": [_run(0.46, "uint8"), _run(0.50, "uint8")],
    }
    rows, headline = bench.summarize(runs, {512: 1.25, 4096: 1.0})
    assert [(r["side"], r["size"], r["image_dtype"]) for r in rows] == [
        ("values", 512, "float32"),
        ("codes", 512, "uint8"),
        ("values", 4096, "float32"),
        ("codes", 4096, "uint8"),
    ]
    # Pairs 0.5 and 0.5: the geometric mean, an interval of no width.
    assert headline["codes_over_values_trainer_cpu_512"] == pytest.approx(0.5)
    assert headline["trainer_cpu_us_per_example_codes_4096"] == pytest.approx(0.48)
    low, high = headline["trainer_cpu_us_per_example_codes_4096_ci95"]
    assert low < 0.5 < high
    assert headline["target_within_interval"] and not headline["meets_target"]
    assert headline["decode_cpu_us_per_example_512"] == 1.25
