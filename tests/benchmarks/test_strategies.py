"""`benchmarks/strategies.py`: its per-round ratios and their intervals (no training)."""

from __future__ import annotations

import sys

import pytest

from benchmarks import strategies as bench


def _figures(examples_per_s, step_s):
    return {"replicas": 1, "is_chief": True, "examples_per_s": examples_per_s, "step_s": step_s}


# Per round, over one_device in the same round: mirrored 1.5, 1.6, 1.55 (examples/s),
# multi_worker 0.8, 0.9, 0.85 (examples/s), accumulation 1.3, 1.4, 1.35 (step time).
ROUNDS = [
    {
        "one_device": _figures(1000.0, 0.256),
        "mirrored": _figures(1500.0, 0.1707),
        "multi_worker": _figures(800.0, 0.32),
        "grad_accum_4x64": _figures(769.2, 0.3328),
    },
    {
        "one_device": _figures(1000.0, 0.256),
        "mirrored": _figures(1600.0, 0.16),
        "multi_worker": _figures(900.0, 0.2844),
        "grad_accum_4x64": _figures(714.3, 0.3584),
    },
    {
        "one_device": _figures(2000.0, 0.128),
        "mirrored": _figures(3100.0, 0.0826),
        "multi_worker": _figures(1700.0, 0.1506),
        "grad_accum_4x64": _figures(1481.5, 0.1728),
    },
]


def test_each_ratio_is_the_geometric_mean_of_the_rounds_with_a_t_interval():
    out = bench.summarize(ROUNDS)
    # By hand, on the logs, t(0.975, 2) = 4.3027.
    assert out["mirrored_speedup"] == pytest.approx(1.549)
    assert out["mirrored_speedup_ci95"] == pytest.approx([1.43, 1.679])
    assert out["multi_worker_speedup"] == pytest.approx(0.849)
    assert out["multi_worker_speedup_ci95"] == pytest.approx([0.733, 0.983])
    assert out["grad_accum_overhead"] == pytest.approx(1.349)
    assert out["grad_accum_overhead_ci95"] == pytest.approx([1.231, 1.479])
    assert out["rounds"] == 3
    assert out["examples_per_s"] == {
        "one_device": 1000.0,
        "mirrored": 1600.0,
        "multi_worker": 900.0,
        "grad_accum_4x64": 769.2,
    }


def test_a_ratio_whose_modes_did_not_run_is_left_out():
    # No GPU: no mixed-precision ratio, rather than one against the CPU.
    assert "mixed_float16_speedup" not in bench.summarize(ROUNDS)


def test_one_round_gives_its_ratios_and_no_interval():
    out = bench.summarize(ROUNDS[:1])
    assert out["mirrored_speedup"] == pytest.approx(1.5)
    assert out["mirrored_speedup_ci95"] is None


def test_fewer_than_2_repeats_is_refused_before_anything_runs(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["strategies.py", "--repeats", "1"])
    with pytest.raises(SystemExit):
        bench.main()
    assert "--repeats: at least 2" in capsys.readouterr().err


def test_a_run_never_reuses_a_directory(tmp_path):
    # An earlier run's backup there would be resumed instead of trained.
    with pytest.raises(FileExistsError):
        bench.run_mode("one_device", None, {}, str(tmp_path))
