"""`benchmarks/gradient_checkpointing.py`: its paired ratios and their intervals (no training)."""

from __future__ import annotations

import sys

import pytest

from benchmarks import gradient_checkpointing as bench


def _run(peak_mb, step_ms, step_cpu_ms):
    return {
        "device": "CPU",
        "params": 1_283_818,
        "peak_mb": peak_mb,
        "step_ms": step_ms,
        "step_cpu_ms": step_cpu_ms,
    }


def test_each_ratio_is_the_geometric_mean_of_the_pairs_with_a_t_interval():
    # on / off: memory 0.8, 0.9, 0.85; step time 1.3, 1.4, 1.35; CPU time 1.2 each.
    pairs = [
        {"off": _run(1000, 100, 200), "on": _run(800, 130, 240)},
        {"off": _run(1000, 100, 200), "on": _run(900, 140, 240)},
        {"off": _run(2000, 200, 100), "on": _run(1700, 270, 120)},
    ]
    out = bench.summarize(pairs, 4096)
    # By hand, on the logs, t(0.975, 2) = 4.3027.
    assert out["memory_ratio"] == pytest.approx(0.849)
    assert out["memory_ratio_ci95"] == pytest.approx([0.733, 0.983])
    assert out["step_time_ratio"] == pytest.approx(1.349)
    assert out["step_time_ratio_ci95"] == pytest.approx([1.231, 1.479])
    assert out["step_cpu_time_ratio"] == pytest.approx(1.2)
    assert out["step_cpu_time_ratio_ci95"] == pytest.approx([1.2, 1.2])
    assert (out["pairs"], out["batch"], out["device"]) == (3, 4096, "CPU")
    assert (out["peak_mb_off"], out["peak_mb_on"]) == (1000, 900)


def test_one_pair_gives_its_ratio_and_no_interval():
    out = bench.summarize([{"off": _run(1000, 100, 200), "on": _run(800, 130, 240)}], 1024)
    assert out["memory_ratio"] == pytest.approx(0.8)
    assert out["memory_ratio_ci95"] is None


def test_fewer_than_2_pairs_is_refused_before_anything_runs(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["gradient_checkpointing.py", "--pairs", "1"])
    with pytest.raises(SystemExit):
        bench.main()
    assert "--pairs: at least 2" in capsys.readouterr().err
