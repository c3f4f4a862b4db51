"""The service wire benchmark: its cost fit, its cells and its summary, against written numbers."""

from __future__ import annotations

import pytest

from benchmarks import service_wire as wire


def test_the_fit_recovers_a_fixed_cost_and_a_cost_per_byte():
    # 400 µs an element and 0.5 ns a byte, exactly.
    points = [(b, 400 + 0.0005 * b) for b in (100_000, 400_000, 1_600_000)]
    fixed_us, per_byte_ns = wire.fit_cost(points)
    assert fixed_us == pytest.approx(400)
    assert per_byte_ns == pytest.approx(0.5)


def test_an_example_is_its_image_in_the_dtype_and_an_int64_label():
    assert [wire.bytes_per_example(d) for d in wire.DTYPES] == [3144, 1576, 792]


def test_every_layout_is_measured_busy_both_ways_and_against_its_floor():
    names = [wire._name(c) for c in wire.cells()]
    assert len(names) == len(set(names))
    grid = len(wire.SIZES) * len(wire.DTYPES)
    assert sum(n.startswith("busy-") for n in names) == grid * len(wire.COMPRESSION)
    assert sum(n.startswith("floor-") for n in names) == grid
    assert sum(n.startswith("waiting-") for n in names) == len(wire.DTYPES)


def _busy(us_per_example, size, dtype):
    return {
        "cpu_us_per_example": us_per_example,
        "cpu_us_per_element": us_per_example * size,
        "examples_per_s": 1e5,
        "cpu_share": 0.9,
    }


def test_the_summary_takes_the_cheapest_cell_and_judges_it_by_its_interval():
    rounds = {
        "busy-float32-512-none": [_busy(2.4, 512, "float32"), _busy(2.2, 512, "float32")],
        "busy-uint8-4096-none": [_busy(0.46, 4096, "uint8"), _busy(0.50, 4096, "uint8")],
        "busy-uint8-4096-auto": [_busy(1.3, 4096, "uint8"), _busy(1.5, 4096, "uint8")],
        "waiting-uint8-512-none": [{"cpu_share_waiting": 0.08}, {"cpu_share_waiting": 0.09}],
    }
    rows, headline = wire.summarize(rounds)
    assert headline["best_cell"] == {"dtype": "uint8", "size": 4096, "compression": "none"}
    assert headline["best_trainer_cpu_us_per_example"] == pytest.approx(0.48)
    # Two rounds 0.04 apart: the 95% interval straddles 0.5, so the target is not shown.
    low, high = headline["best_trainer_cpu_us_per_example_ci95"]
    assert low < 0.5 < high
    assert headline["target_within_interval"] and not headline["meets_target"]
    assert headline["best_compressed_cpu_us_per_example"] == pytest.approx(1.4)
    assert headline["float32_512_cpu_us_per_example"] == pytest.approx(2.3)
    assert headline["waiting_cpu_share"] == {"uint8": pytest.approx(0.085)}
    assert {r["kind"] for r in rows} == {"busy", "waiting"}
