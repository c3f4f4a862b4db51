"""Teacher-vs-student report of a distillation run: a table and a PNG chart.

`distillation_report` finds the exported models through ML Metadata (`find_models`) and
measures each (`measure_model`) through `serving_default` on the raw eval split: accuracy,
log loss, parameters, size, latency. `verdict` says whether the distilled student beat
the `StudentBaseline`; `format_report` and `write_chart` show the result.
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Any

import numpy as np
import tensorflow as tf

from components.config import PipelineConfig
from components.config.distillation import KD, NOISY_STUDENT
from components.distillation import verdict as verdict_lib
from components.distillation.model import count_params
from components.distiller.executor import MEMBERS_DIR, TEACHER_KEY_PREFIX
from components.training.export import TRANSFORMED_LOGITS_SIGNATURE
from pipelines import roles
from pipelines.summary import artifacts_of, latest_run_executions, open_store

MAX_EVAL_EXAMPLES = 20000
LATENCY_BATCHES = (1, 256)
CHART_FILE = "distillation_report.png"
_REPEATS = {1: 50, 256: 20}
_COLORS = {
    roles.TEACHER: "tab:blue",
    roles.TEACHER_ENSEMBLE: "tab:cyan",
    roles.SCRATCH: "tab:gray",
    roles.BASELINE: "tab:brown",
    roles.ENSEMBLE_STUDENT: "tab:green",
    roles.MEMBER: "tab:olive",
    roles.ROUND: "tab:purple",
    roles.STUDENT: "tab:orange",
}


def find_models(metadata_path: str, pipeline_name: str) -> tuple[list[tuple[str, str, str]], str]:
    """The newest run's models and raw eval data, from ML Metadata.

    Roles come from component types (`pipelines.roles`), so renamed nodes
    are still found. Teachers are ordered as the Distiller consumed them
    (`teacher_model_0` first: the Evaluator's baseline); the eval data is
    what the Evaluator scored.

    Returns:
      `([(role, node, serving_dir), ...], eval_examples_glob)` with teachers
      first, then the scratch baseline and the `EnsembleStudent` if the run
      has them, an M-on-M Distiller's students, Noisy Student's earlier
      rounds in order, and the student last.

    Raises:
      ValueError: if the run has no teacher or no student model.
    """
    from ml_metadata.proto import metadata_store_pb2
    from tfx.utils import path_utils

    store = open_store(metadata_path)
    executions = latest_run_executions(store, pipeline_name)
    found, eval_glob, teacher_order = [], "", {}
    for node, execution in executions.items():
        role = roles.model_role(execution.type)
        if role is not None:
            for _, artifact in artifacts_of(store, execution.id, "Model"):
                found.append((role, node, path_utils.serving_model_path(artifact.uri), artifact.id))
                if role == roles.STUDENT:
                    found.extend(
                        (roles.MEMBER, f"{node}/student_{i}", d, artifact.id)
                        for i, d in enumerate(m_on_m_members(artifact.uri))
                    )
        if role == roles.STUDENT:
            for event, artifact in artifacts_of(
                store, execution.id, "Model", (metadata_store_pb2.Event.INPUT,)
            ):
                key = event.path.steps[0].key if event.path.steps else ""
                if key.startswith(TEACHER_KEY_PREFIX):
                    teacher_order[artifact.id] = int(key[len(TEACHER_KEY_PREFIX) :])
        elif execution.type == roles.EVALUATOR_TYPE:
            for _, artifact in artifacts_of(
                store, execution.id, "Examples", (metadata_store_pb2.Event.INPUT,)
            ):
                eval_glob = os.path.join(artifact.uri, "Split-eval", "*")
    rank = {
        roles.TEACHER: 0,
        roles.SCRATCH: 1,
        roles.BASELINE: 2,
        roles.ENSEMBLE_STUDENT: 3,
        roles.MEMBER: 4,
        roles.ROUND: 5,
        roles.STUDENT: 6,
    }

    def order(model):
        role, node, _, artifact_id = model
        # Noisy Student rounds in round order (Round_2 before Round_10).
        number = int(node.rsplit("_", 1)[-1]) if role == roles.ROUND else 0
        consumed = teacher_order.get(artifact_id, len(teacher_order))
        return rank[role], consumed if role == roles.TEACHER else 0, number, node

    found.sort(key=order)
    models = [(role, node, serving_dir) for role, node, serving_dir, _ in found]
    if not {roles.TEACHER, roles.STUDENT} <= {role for role, _, _ in models}:
        raise ValueError(
            f"report: the newest run of {pipeline_name!r} has no teacher and student models (found {models})"
        )
    return models, eval_glob


def m_on_m_members(model_uri: str) -> list[str]:
    """Serving directories of an M-on-M Distiller's students, in teacher order ([] for kd)."""
    root = os.path.join(model_uri, MEMBERS_DIR)
    if not tf.io.gfile.isdir(root):
        return []
    names = sorted((n.rstrip("/") for n in tf.io.gfile.listdir(root)), key=int)
    return [os.path.join(root, n) for n in names]


def _compression(path: str) -> str:
    return "GZIP" if path.endswith(".gz") else ""


def read_eval_examples(
    eval_glob: str, label_key: str, limit: int = MAX_EVAL_EXAMPLES
) -> tuple[np.ndarray, np.ndarray]:
    """Serialized raw eval examples (label removed) and their labels."""
    files = sorted(tf.io.gfile.glob(eval_glob))
    if not files:
        raise ValueError(f"report: no eval examples match {eval_glob!r}")
    records = tf.data.TFRecordDataset(files, compression_type=_compression(files[0])).take(limit)
    serialized = np.array([r.numpy() for r in records], dtype=object)
    parsed = tf.io.parse_example(
        serialized, {label_key: tf.io.FixedLenFeature([], tf.int64, default_value=-1)}
    )
    return serialized, parsed[label_key].numpy()


def _dir_bytes(path: str) -> int:
    total = 0
    for root, _, files in tf.io.gfile.walk(path):
        for name in files:
            total += tf.io.gfile.stat(os.path.join(root, name)).length
    return total


def _median_seconds(fn, batch, repeats: int) -> float:
    fn(batch)  # trace / warm caches
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn(batch)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def probabilities(serve, serialized: np.ndarray) -> np.ndarray:
    """`serving_default`'s class probabilities of every serialized example, 1,024 at a time."""
    return np.concatenate(
        [
            serve(examples=tf.constant(serialized[i : i + 1024]))["probabilities"].numpy()
            for i in range(0, len(serialized), 1024)
        ]
    )


def scores(probs: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    """Accuracy and log loss of class probabilities on the labeled examples."""
    known = labels >= 0
    picked = probs[known, labels[known]]
    return {
        "accuracy": float(np.mean(np.argmax(probs[known], axis=1) == labels[known])),
        "log_loss": float(-np.mean(np.log(np.clip(picked, 1e-7, 1.0)))),
        "eval_examples": int(known.sum()),
    }


def measure_model(serving_dir: str, serialized: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    """Accuracy, log loss, size, parameters and latency of one serving model."""
    loaded = tf.saved_model.load(serving_dir)
    serve = loaded.signatures["serving_default"]
    result = {
        **scores(probabilities(serve, serialized), labels),
        "params": count_params(loaded.trainable_variables),
        "saved_model_bytes": _dir_bytes(serving_dir),
    }
    transform = loaded.signatures["transform_features"]
    model_only = loaded.signatures[TRANSFORMED_LOGITS_SIGNATURE]
    model_inputs = set(model_only.structured_input_signature[1])
    for size in LATENCY_BATCHES:
        batch = tf.constant(np.resize(serialized, size))
        result[f"latency_ms_b{size}"] = 1000.0 * _median_seconds(
            lambda b: serve(examples=b), batch, _REPEATS[size]
        )
        # The model alone, on already transformed features: what the two
        # models cost apart from the parsing and transform graph they share.
        features = {k: v for k, v in transform(examples=batch).items() if k in model_inputs}
        result[f"model_latency_ms_b{size}"] = 1000.0 * _median_seconds(
            lambda f: model_only(**f), features, _REPEATS[size]
        )
    return result


def teacher_ensemble_row(
    teachers: list[dict[str, Any]], serialized: np.ndarray, labels: np.ndarray
) -> dict[str, Any]:
    """The teachers served together: their mean probabilities scored; parameters, size and
    latencies the sums of theirs (one after the other, as a server running each would)."""
    probs = np.mean(
        [
            probabilities(
                tf.saved_model.load(t["serving_dir"]).signatures["serving_default"], serialized
            )
            for t in teachers
        ],
        axis=0,
    )
    summed = ["params", "saved_model_bytes"]
    summed += [f"{p}latency_ms_b{b}" for p in ("", "model_") for b in LATENCY_BATCHES]
    return {
        "role": roles.TEACHER_ENSEMBLE,
        "node": f"{len(teachers)} teachers",
        "serving_dir": "",
        **scores(probs, labels),
        **{k: sum(t[k] for t in teachers) for k in summed},
    }


def _ratios(rows: list[dict[str, Any]]) -> dict[str, float]:
    teacher = next(r for r in rows if r["role"] == "teacher")
    student = next(r for r in rows if r["role"] == "student")
    keys = [
        "accuracy",
        "params",
        "saved_model_bytes",
        *(f"latency_ms_b{b}" for b in LATENCY_BATCHES),
        *(f"model_latency_ms_b{b}" for b in LATENCY_BATCHES),
    ]
    return {k: student[k] / teacher[k] if teacher[k] else float("nan") for k in keys}


def verdict(rows: list[dict[str, Any]], method: str = KD) -> dict[str, Any]:
    """Whether the run's method paid (`components.distillation.verdict`).

    kd: the student against the first teacher (the Evaluator's baseline)
    and, when the run has them, the scratch baseline and the best of every
    model trained alone (`distillation.baselines`); M-on-M: the ensemble
    against its students, the one student and the best model trained alone
    (baselines, scratch) at its serving cost; Noisy Student: each round,
    the last against the network alone and the first teacher.
    """

    def accuracy(role):
        return next((r["accuracy"] for r in rows if r["role"] == role), None)

    members = [r["accuracy"] for r in rows if r["role"] == roles.MEMBER]
    student = next(r for r in rows if r["role"] == roles.STUDENT)
    if method == NOISY_STUDENT:
        rounds = [r["accuracy"] for r in rows if r["role"] in (roles.ROUND, roles.STUDENT)]
        return verdict_lib.noisy_student_verdict(
            accuracy(roles.TEACHER), rounds, accuracy(roles.SCRATCH)
        )
    if members:
        # The served ensemble's row: its parameters are its students' summed.
        return verdict_lib.m_on_m_verdict(
            accuracy(roles.TEACHER_ENSEMBLE),
            student["accuracy"],
            members,
            accuracy(roles.ENSEMBLE_STUDENT),
            _trained_alone(rows, roles.SCRATCH, roles.BASELINE),
            student.get("params"),
            [r["accuracy"] for r in rows if r["role"] == roles.TEACHER],
        )
    return verdict_lib.verdict(
        accuracy(roles.TEACHER),
        student["accuracy"],
        accuracy(roles.SCRATCH),
        _trained_alone(rows, roles.BASELINE),
        student.get("params"),
        scratch_name=next((r["node"] for r in rows if r["role"] == roles.SCRATCH), ""),
    )


def _trained_alone(rows: list[dict[str, Any]], *kinds: str) -> list[dict[str, Any]]:
    """The verdict's models trained alone: `name` (node), `accuracy`, `params` of the rows of `kinds`."""
    return [
        {"name": r["node"], "accuracy": r["accuracy"], "params": r.get("params")}
        for r in rows
        if r["role"] in kinds
    ]


def write_chart(rows: list[dict[str, Any]], path: str) -> str:
    """Accuracy against parameters and against batch-256 latency, one point per model."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    panels = [
        ("params", "trainable parameters (log scale)"),
        ("latency_ms_b256", "serving latency, batch 256 (ms)"),
    ]
    for ax, (key, label) in zip(axes, panels, strict=True):
        for row in rows:
            color = _COLORS.get(row["role"], "tab:gray")
            ax.scatter(row[key], row["accuracy"], s=60, color=color, label=row["role"])
            ax.annotate(
                row["node"],
                (row[key], row["accuracy"]),
                textcoords="offset points",
                xytext=(5, 5),
                fontsize=8,
            )
        if key == "params":
            ax.set_xscale("log")
        # Room around the points so labels and the legend do not cover them.
        ax.margins(x=0.25, y=0.25)
        ax.set_xlabel(label)
        ax.set_ylabel("eval accuracy")
        ax.grid(True, alpha=0.3)
        handles, labels = ax.get_legend_handles_labels()
        unique = dict(zip(labels, handles, strict=True))
        ax.legend(unique.values(), unique.keys(), loc="best")
    present = {r["role"] for r in rows}
    fig.suptitle(
        "Teachers, their students and the students' ensemble (M-on-M)"
        if roles.MEMBER in present
        else "Teacher, models trained alone and the distilled student"
        if present & {roles.SCRATCH, roles.BASELINE}
        else "Teacher vs distilled student"
    )
    fig.tight_layout()
    with tf.io.gfile.GFile(path, "wb") as f:
        fig.savefig(f, format="png", dpi=100)
    plt.close(fig)
    return path


def distillation_report(
    metadata_path: str, config: PipelineConfig, output_dir: str
) -> dict[str, Any]:
    """Measures the newest run's teachers and student and writes the chart.

    Returns:
      `{"models": [row, ...], "student_vs_teacher": ratios, "verdict": ...,
      "chart": path}`; the ratios compare the student with the first teacher
      (the Evaluator's baseline); see `verdict`.
    """
    models, eval_glob = find_models(metadata_path, config.name)
    serialized, labels = read_eval_examples(eval_glob, config.data.label.name)
    rows = [
        {"role": role, "node": node, "serving_dir": d, **measure_model(d, serialized, labels)}
        for role, node, d in models
    ]
    if any(r["role"] == roles.MEMBER for r in rows):
        teachers = [r for r in rows if r["role"] == roles.TEACHER]
        rows.insert(len(teachers), teacher_ensemble_row(teachers, serialized, labels))
    chart = write_chart(rows, os.path.join(output_dir, CHART_FILE))
    return {
        "models": rows,
        "student_vs_teacher": _ratios(rows),
        "verdict": verdict(rows, config.distillation.method),
        "calibration": calibration(rows),
        "chart": chart,
    }


def calibration(rows: list[dict[str, Any]]) -> str:
    """One line when the student's log-loss is worse than its network trained alone's
    (the scratch baseline; '' without one or when it is not worse).

    Accuracy can hide it: Noisy Student's pushed student once scored a
    log-loss of 1.17 against 0.53 for the same network trained alone.
    """
    student = next((r for r in rows if r["role"] == roles.STUDENT), None)
    alone = next((r for r in rows if r["role"] == roles.SCRATCH), None)
    if student is None or alone is None or student["log_loss"] <= alone["log_loss"]:
        return ""
    return (
        f"The student's log-loss {student['log_loss']:.4f} is worse than its network "
        f"trained alone ({alone['log_loss']:.4f}): its probabilities are less calibrated."
    )


def format_report(report: dict[str, Any]) -> str:
    """The report as an aligned text table."""
    header = f"  {'model':<11} {'node':<27} {'accuracy':>8} {'log_loss':>8} {'params':>10} {'size_KiB':>9} {'ms@b1':>7} {'ms@b256':>8}"
    lines = ["Teacher vs student (raw eval split, served through serving_default):", header]
    for r in report["models"]:
        lines.append(
            f"  {r['role']:<11} {r['node']:<27} {r['accuracy']:>8.4f} {r['log_loss']:>8.4f} {r['params']:>10,d} "
            f"{r['saved_model_bytes'] / 1024:>9.1f} {r['latency_ms_b1']:>7.2f} {r['latency_ms_b256']:>8.2f}"
        )
    q = report["student_vs_teacher"]
    lines.append(
        f"  {'student/teacher':<39} {q['accuracy']:>8.3f} {'':>8} {q['params']:>10.4f} "
        f"{q['saved_model_bytes']:>9.3f} {q['latency_ms_b1']:>7.3f} {q['latency_ms_b256']:>8.3f}"
    )
    lines.append(report["verdict"]["message"])
    if report.get("calibration"):
        lines.append(report["calibration"])
    lines.append(f"Chart: {report['chart']}")
    return "\n".join(lines)
