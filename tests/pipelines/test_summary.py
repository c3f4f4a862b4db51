"""The console summary of the gates: each model's figures, why a candidate was not
pushed, and a pushed model worse calibrated than the one it replaces."""

from __future__ import annotations

from pipelines.summary import SERVED, format_summary, gate_kinds, worse_calibrated


def _summary(**extra):
    return {"status": "succeeded", "components": {}, "metrics": {}, "pushed_model": None, **extra}


def _served_gate(accuracy, loss, served_accuracy, served_loss, blessed):
    return {
        "against": SERVED,
        "accuracy": accuracy,
        "loss": loss,
        "baseline_accuracy": served_accuracy,
        "baseline_loss": served_loss,
        "refused": [],
        "blessed": blessed,
    }


def test_which_evaluator_compares_with_the_served_model_follows_the_node_ids():
    assert gate_kinds(["Evaluator", "latest_served_model"]) == {"Evaluator": "served"}
    assert gate_kinds(["Evaluator", "ServedEvaluator", "latest_served_model"]) == {
        "Evaluator": "teacher",
        "ServedEvaluator": "served",
    }
    assert gate_kinds(["Evaluator"]) == {}  # evaluation.against_served: false


def test_a_refused_candidate_shows_both_models_and_why_it_was_not_pushed():
    why = "accuracy 0.8842 is below the served model's 0.8936 (evaluation.change_threshold 0.0)"
    text = format_summary(
        _summary(
            blessed=False,
            gates={"Evaluator": _served_gate(0.8842, 0.3301, 0.8936, 0.3100, False)},
            not_pushed=why,
        )
    ).splitlines()
    assert text[1:] == [
        "Gates (eval split, TFMA):",
        "  gate             model      accuracy log_loss  blessed",
        "  Evaluator        candidate    0.8842   0.3301  no",
        "  Evaluator        served       0.8936   0.3100",
        "Blessed: False",
        f"Not pushed: {why}",
        "Pushed model: none",
    ]


def test_a_first_run_has_no_served_model_to_show():
    gate = _served_gate(0.89, 0.33, None, None, True)
    text = format_summary(_summary(blessed=True, gates={"Evaluator": gate}))
    assert "Gates" not in text and "Not pushed" not in text


def test_a_pushed_model_worse_calibrated_than_the_served_one_is_told_so():
    gates = {"Evaluator": _served_gate(0.90, 0.41, 0.89, 0.38, True)}
    assert worse_calibrated(gates, "/serving/2") == (
        "The pushed model's log-loss 0.4100 is worse than the served model's 0.3800: "
        "its probabilities are less calibrated."
    )
    assert worse_calibrated(gates, None) == ""  # not pushed: nothing replaced
    gates["Evaluator"]["loss"] = 0.30
    assert worse_calibrated(gates, "/serving/2") == ""
