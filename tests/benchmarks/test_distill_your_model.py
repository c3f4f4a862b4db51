"""The headline of `benchmarks/distill_your_model.py`, from measured models (no training)."""

from __future__ import annotations

import pytest

from benchmarks import distill_your_model as bench
from components.testing.stats import diff_se


def _model(accuracy, params=61_000, model_ms=1.0, serving_ms=3.0):
    return {
        "accuracy": accuracy,
        "params": params,
        "model_ms_b256": model_ms,
        "serving_ms_b256": serving_ms,
    }


def test_the_better_alone_variant_is_the_baseline_and_the_gap_is_the_teachers_lead():
    seeds = [0, 1, 2]
    accs = {
        "alone": [0.89, 0.88, 0.90],
        "alone_aug": [0.895, 0.90, 0.905],
        "distilled": [0.91, 0.905, 0.915],
    }
    models = {"Teacher": _model(0.92, params=585_000, model_ms=10.0, serving_ms=12.0)}
    for key, values in accs.items():
        for seed, acc in zip(seeds, values, strict=True):
            models[bench.student_ids(seed)[key]] = _model(acc)
    out = bench.summarize("scarce", 0.1, seeds, models)
    assert out["best_alone"] == "alone_aug"
    assert out["distilled_minus_best_alone"] == pytest.approx(0.91 - 0.90)
    assert out["distilled_minus_best_alone_se"] == pytest.approx(
        diff_se(accs["distilled"], accs["alone_aug"])
    )
    assert out["gap_recovered"] == pytest.approx(0.01 / 0.02)
    assert out["param_ratio"] == pytest.approx(61_000 / 585_000)
    assert out["model_latency_ratio_b256"] == pytest.approx(0.1)
    assert out["serving_latency_ratio_b256"] == pytest.approx(0.25)


def test_no_gap_to_recover_gives_no_ratio():
    models = {"Teacher": _model(0.90)}
    for key, acc in (("alone", 0.91), ("alone_aug", 0.905), ("distilled", 0.91)):
        models[bench.student_ids(0)[key]] = _model(acc)
    out = bench.summarize("all", 1.0, [0], models)
    assert out["gap_recovered"] is None and out["distilled_minus_best_alone_se"] is None
