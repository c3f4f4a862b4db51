"""Run summary read back from ML Metadata (what actually ran, not what we hoped).

`summarize_run` looks up the newest pipeline run in the store and reports,
per component, its state (`succeeded`, `cached`, `failed`, `running`) and
seconds, the Evaluator's overall-slice metrics and blessing, each gate's
figures (`read_gate`: the candidate against the served model or the teacher),
why a candidate was not pushed, and where the Pusher put the model.
"""

from __future__ import annotations

import json
import os
from typing import Any

import tensorflow as tf
from ml_metadata import metadata_store
from ml_metadata.proto import metadata_store_pb2

from pipelines.roles import EVALUATOR_ID, SERVED_GATE_ID, SERVED_RESOLVER_ID

_STATE = {
    metadata_store_pb2.Execution.COMPLETE: "succeeded",
    metadata_store_pb2.Execution.CACHED: "cached",
    metadata_store_pb2.Execution.FAILED: "failed",
    metadata_store_pb2.Execution.RUNNING: "running",
    metadata_store_pb2.Execution.NEW: "running",
    metadata_store_pb2.Execution.CANCELED: "failed",
}


def open_store(metadata_path: str) -> metadata_store.MetadataStore:
    cfg = metadata_store_pb2.ConnectionConfig()
    cfg.sqlite.filename_uri = metadata_path
    cfg.sqlite.connection_mode = metadata_store_pb2.SqliteMetadataSourceConfig.READONLY
    return metadata_store.MetadataStore(cfg)


def latest_run_executions(
    store: metadata_store.MetadataStore, pipeline_name: str, since_ms: int | None = None
) -> dict[str, Any]:
    """Maps node id -> newest execution of the newest run of `pipeline_name`.

    With `since_ms` (milliseconds since the epoch), a newest run created
    before then belongs to an earlier invocation and yields `{}`.
    """
    runs = [
        c
        for c in store.get_contexts_by_type("pipeline_run")
        if any(p.name == pipeline_name for p in store.get_parent_contexts_by_context(c.id))
    ] or store.get_contexts_by_type("pipeline_run")
    if not runs:
        return {}
    run = max(runs, key=lambda c: c.create_time_since_epoch)
    if since_ms is not None and run.create_time_since_epoch < since_ms:
        return {}
    by_node: dict[str, Any] = {}
    for execution in store.get_executions_by_context(run.id):
        node = next(
            (
                c.name.split(".", 1)[-1]
                for c in store.get_contexts_by_execution(execution.id)
                if c.type == "node" or store.get_context_types_by_id([c.type_id])[0].name == "node"
            ),
            None,
        )
        if node is None:
            continue
        if node not in by_node or execution.id > by_node[node].id:
            by_node[node] = execution
    return by_node


_OUTPUT_EVENTS = (metadata_store_pb2.Event.OUTPUT, metadata_store_pb2.Event.DECLARED_OUTPUT)


def artifacts_of(
    store, execution_id: int, type_name: str, events=_OUTPUT_EVENTS
) -> list[tuple[Any, Any]]:
    """`(event, artifact)` pairs of one execution's artifacts of type `type_name`.

    Args:
      store: The ML Metadata store.
      execution_id: The execution.
      type_name: Artifact type name (`Model`, `Examples`, `ModelBlessing`, ...).
      events: Event types to follow (outputs by default; pass
        `(metadata_store_pb2.Event.INPUT,)` for inputs).
    """
    by_id = {
        e.artifact_id: e
        for e in store.get_events_by_execution_ids([execution_id])
        if e.type in events
    }
    artifacts = store.get_artifacts_by_id(list(by_id)) if by_id else []
    return [
        (by_id[a.id], a)
        for a in artifacts
        if store.get_artifact_types_by_id([a.type_id])[0].name == type_name
    ]


def read_metrics(evaluation_uri: str) -> dict[str, float]:
    """Overall-slice metrics of an Evaluator output (TFMA)."""
    import tensorflow_model_analysis as tfma

    metrics: dict[str, float] = {}
    try:
        result = tfma.load_eval_result(evaluation_uri)
    except (OSError, ValueError, tf.errors.OpError):
        return metrics
    for slice_key, by_output in result.slicing_metrics:
        if slice_key:
            continue
        for _, by_class in by_output.items():
            for _, values in by_class.items():
                for name, value in values.items():
                    if "doubleValue" in value:
                        metrics[name] = float(value["doubleValue"])
    return metrics


# Which model a gate compares the candidate with, and the config field of
# its change threshold.
SERVED, TEACHER = "served", "teacher"
_CHANGE_FIELD = {
    SERVED: "evaluation.change_threshold",
    TEACHER: "evaluation.max_accuracy_drop",
}
_BASELINE_NAME = {SERVED: "the served model's", TEACHER: "the teacher's"}


def gate_kinds(nodes) -> dict[str, str]:
    """Evaluator node -> what its baseline is (`SERVED` or `TEACHER`), from node ids.

    With distillation the `Evaluator` compares the student with the teacher
    and `SERVED_GATE_ID` with the served model; without it the `Evaluator`
    compares with the served model when the run has the served model's
    Resolver (`evaluation.against_served`).
    """
    nodes = set(nodes)
    if SERVED_GATE_ID in nodes:
        return {EVALUATOR_ID: TEACHER, SERVED_GATE_ID: SERVED}
    return {EVALUATOR_ID: SERVED} if SERVED_RESOLVER_ID in nodes else {}


def _model_metrics(evaluation_uri: str) -> dict[str, dict[str, float]]:
    """Model name -> overall-slice metrics (diffs left out) of a TFMA output."""
    import tensorflow_model_analysis as tfma

    by_model: dict[str, dict[str, float]] = {}
    for metrics in tfma.load_metrics(evaluation_uri):
        if metrics.slice_key.single_slice_keys:
            continue
        for kv in metrics.metric_keys_and_values:
            if not kv.key.is_diff and kv.value.HasField("double_value"):
                by_model.setdefault(kv.key.model_name, {})[kv.key.name] = (
                    kv.value.double_value.value
                )
    return by_model


def read_gate(evaluation_uri: str, kind: str | None) -> dict[str, Any]:
    """What one Evaluator decided, and why, from its TFMA output.

    Args:
      evaluation_uri: The Evaluator's `evaluation` artifact.
      kind: What its baseline is (`SERVED`, `TEACHER`, or None: no baseline).

    Returns:
      `{"against": kind, "accuracy", "loss", "baseline_accuracy",
      "baseline_loss" (None without a baseline, as on a pipeline's first
      run), "refused": [message, ...]}`, one message per failed threshold
      with both figures and the config field, e.g. `accuracy 0.8842 is below
      the served model's 0.8936 (evaluation.change_threshold 0.0)`.
    """
    import tensorflow_model_analysis as tfma

    try:
        by_model = _model_metrics(evaluation_uri)
        validation = tfma.load_validation_result(evaluation_uri)
    except (OSError, ValueError, AssertionError, tf.errors.OpError):
        # No readable output (TFMA asserts on a missing validations file).
        return {"against": kind, "refused": []}
    baseline = by_model.get("baseline", {})
    candidate = next((m for name, m in by_model.items() if name != "baseline"), {})
    result: dict[str, Any] = {
        "against": kind,
        "accuracy": candidate.get("accuracy"),
        "loss": candidate.get("loss"),
        "baseline_accuracy": baseline.get("accuracy"),
        "baseline_loss": baseline.get("loss"),
        "refused": [],
    }
    for per_slice in validation.metric_validations_per_slice:
        for failure in per_slice.failures:
            name = failure.metric_key.name
            value = candidate.get(name, failure.metric_value.double_value.value)
            threshold = failure.metric_threshold
            if failure.metric_key.is_diff and kind in _CHANGE_FIELD:
                allowed = -threshold.change_threshold.absolute.value
                result["refused"].append(
                    f"{name} {value:.4f} is below {_BASELINE_NAME[kind]} "
                    f"{baseline.get(name, float('nan')):.4f} ({_CHANGE_FIELD[kind]} {allowed})"
                )
            elif threshold.value_threshold.HasField("lower_bound"):
                bound = threshold.value_threshold.lower_bound.value
                result["refused"].append(
                    f"{name} {value:.4f} is below evaluation.min_{name} {bound}"
                )
            else:
                result["refused"].append(
                    failure.message or f"{name} {value:.4f} failed its threshold"
                )
    return result


def summarize_run(
    metadata_path: str, pipeline_name: str, since_ms: int | None = None
) -> dict[str, Any]:
    """Builds the summary dict of the newest run (see module docstring).

    With `since_ms`, only a run started at or after then counts (see
    `latest_run_executions`); an orchestrator that failed before its first
    node yields no components, never an earlier run's.
    """
    store = open_store(metadata_path) if tf.io.gfile.exists(metadata_path) else None
    executions = latest_run_executions(store, pipeline_name, since_ms) if store else {}
    components: dict[str, Any] = {}
    metrics: dict[str, float] = {}
    blessings: dict[str, bool] = {}
    gates: dict[str, Any] = {}
    kinds = gate_kinds(executions)
    pushed_model = None
    for node, execution in sorted(executions.items(), key=lambda kv: kv[1].id):
        state = _STATE.get(execution.last_known_state, "unknown")
        if execution.type.endswith("Resolver") and state == "failed":
            # A resolver with nothing to resolve (e.g. no baseline on a first
            # run) is recorded as failed, yet its consumers run without it.
            state = "empty"
        seconds = max(
            0.0,
            (execution.last_update_time_since_epoch - execution.create_time_since_epoch) / 1000.0,
        )
        components[node] = {"status": state, "seconds": round(seconds, 2)}
        # Found by artifact type, not node id: a renamed Evaluator or Pusher
        # still reports (see `pipelines.roles`).
        for _, artifact in artifacts_of(store, execution.id, "ModelEvaluation"):
            # The candidate's metrics as the first gate saw them: the served
            # gate beside a teacher gate scores the same candidate.
            if node != SERVED_GATE_ID or not metrics:
                metrics = read_metrics(artifact.uri)
            gates[node] = read_gate(artifact.uri, kinds.get(node))
        for _, artifact in artifacts_of(store, execution.id, "ModelBlessing"):
            props = artifact.custom_properties
            if "blessed" in props:
                blessings[node] = bool(props["blessed"].int_value)
        for _, artifact in artifacts_of(store, execution.id, "PushedModel"):
            props = artifact.custom_properties
            if "pushed" in props and props["pushed"].int_value == 1:
                pushed_model = props["pushed_destination"].string_value
    failed = any(c["status"] in ("failed", "running", "unknown") for c in components.values())
    for node, blessed in blessings.items():
        gates.setdefault(node, {"against": kinds.get(node), "refused": []})["blessed"] = blessed
    summary = {
        "status": "failed" if failed or not components else "succeeded",
        "components": components,
        "metrics": metrics,
        # The Pusher needs every gate's blessing.
        "blessed": all(blessings.values()) if blessings else None,
        "pushed_model": pushed_model,
        "gates": gates,
    }
    # Both gates of a distilled student check min_accuracy: say it once.
    refused = dict.fromkeys(
        m for g in gates.values() if g.get("blessed") is False for m in g["refused"]
    )
    if refused:
        summary["not_pushed"] = "; ".join(refused)
    calibration = worse_calibrated(gates, pushed_model)
    if calibration:
        summary["calibration"] = calibration
    return summary


def worse_calibrated(gates: dict[str, Any], pushed_model: str | None) -> str:
    """One line when the pushed model's log-loss is worse than the served model's ('' if not)."""
    served = next((g for g in gates.values() if g.get("against") == SERVED), None)
    if not pushed_model or not served or served.get("baseline_loss") is None:
        return ""
    if served["loss"] is None or served["loss"] <= served["baseline_loss"]:
        return ""
    return (
        f"The pushed model's log-loss {served['loss']:.4f} is worse than the served "
        f"model's {served['baseline_loss']:.4f}: its probabilities are less calibrated."
    )


def write_summary(summary: dict[str, Any], output_dir: str) -> str:
    path = os.path.join(output_dir, "summary.json")
    tf.io.gfile.makedirs(output_dir)
    with tf.io.gfile.GFile(path, "w") as f:
        f.write(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    return path


def format_summary(summary: dict[str, Any]) -> str:
    lines = [f"Pipeline {summary['status']}"]
    for node, info in summary["components"].items():
        lines.append(f"  {node:<22} {info['status']:<10} {info['seconds']:>8.1f} s")
    if summary.get("metrics"):
        lines.append(
            "Evaluation (eval split): "
            + ", ".join(f"{k}={v:.4f}" for k, v in sorted(summary["metrics"].items()))
        )
    lines.extend(format_gates(summary.get("gates", {})))
    if summary.get("blessed") is not None:
        lines.append(f"Blessed: {summary['blessed']}")
    if summary.get("not_pushed"):
        lines.append(f"Not pushed: {summary['not_pushed']}")
    if summary.get("calibration"):
        lines.append(summary["calibration"])
    lines.append(f"Pushed model: {summary['pushed_model'] or 'none'}")
    if summary.get("stage"):
        lines.append(f"Failed at: {summary['stage']}")
    if summary.get("error"):
        lines.append(f"Error: {summary['error']}")
    return "\n".join(lines)


def format_gates(gates: dict[str, Any]) -> list[str]:
    """A table of the gates that compared the candidate with another model: each
    model's accuracy and log-loss (TFMA's `loss`), and the verdict."""
    compared = {n: g for n, g in gates.items() if g.get("baseline_accuracy") is not None}
    if not compared:
        return []
    lines = [f"  {'gate':<16} {'model':<10} {'accuracy':>8} {'log_loss':>8}  blessed"]
    for node, gate in compared.items():
        baseline = "served" if gate["against"] == SERVED else gate["against"] or "baseline"
        verdict = {True: "yes", False: "no", None: ""}[gate.get("blessed")]
        for model, acc, loss, mark in (
            ("candidate", gate["accuracy"], gate["loss"], verdict),
            (baseline, gate["baseline_accuracy"], gate["baseline_loss"], ""),
        ):
            lines.append(
                f"  {node:<16} {model:<10} {_figure(acc)} {_figure(loss)}  {mark}".rstrip()
            )
    return ["Gates (eval split, TFMA):", *lines]


def _figure(value: float | None) -> str:
    return f"{value:>8.4f}" if value is not None else f"{'-':>8}"
