"""Run summary read back from ML Metadata (what actually ran, not what we hoped).

`summarize_run` looks up the newest pipeline run in the store and reports,
per component, its state (`succeeded`, `cached`, `failed`, `running`) and
seconds, the Evaluator's overall-slice metrics and blessing, and where the
Pusher put the model.
"""

from __future__ import annotations

import json
import os
from typing import Any

import tensorflow as tf
from ml_metadata import metadata_store
from ml_metadata.proto import metadata_store_pb2

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
    blessed = None
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
            metrics = read_metrics(artifact.uri)
        for _, artifact in artifacts_of(store, execution.id, "ModelBlessing"):
            props = artifact.custom_properties
            blessed = bool(props["blessed"].int_value) if "blessed" in props else None
        for _, artifact in artifacts_of(store, execution.id, "PushedModel"):
            props = artifact.custom_properties
            if "pushed" in props and props["pushed"].int_value == 1:
                pushed_model = props["pushed_destination"].string_value
    failed = any(c["status"] in ("failed", "running", "unknown") for c in components.values())
    return {
        "status": "failed" if failed or not components else "succeeded",
        "components": components,
        "metrics": metrics,
        "blessed": blessed,
        "pushed_model": pushed_model,
    }


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
    if summary.get("blessed") is not None:
        lines.append(f"Blessed: {summary['blessed']}")
    lines.append(f"Pushed model: {summary['pushed_model'] or 'none'}")
    if summary.get("stage"):
        lines.append(f"Failed at: {summary['stage']}")
    if summary.get("error"):
        lines.append(f"Error: {summary['error']}")
    return "\n".join(lines)
