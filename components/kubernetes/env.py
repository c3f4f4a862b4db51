"""Environment variables between the compiled pipeline, the Trainer step and its job replicas.

Declares every name (`ORCHESTRATOR`, `PLACEMENT_ID`, `TFJOB_INVOCATION`, the JobSet
variables, ...) and who sets it: `step_env` (compiler to step), `replica_env` (step to
replica), `jobset_env` (TrainJob runtime to replica); `on_kubeflow` and the other readers
read them. Pure (standard library only), so the compiler reads it without the job code.
"""

from __future__ import annotations

from collections.abc import Mapping

ORCHESTRATOR = "TFXKIT_ORCHESTRATOR"
"""Orchestrator of the step: `KUBEFLOW`, set by the compiler on every step
container. Read by the Trainer executor: a Trainer step with a multi-worker
strategy submits a job instead of training. Replicas and local runs lack it."""

KUBEFLOW = "kubeflow"
"""The value of `ORCHESTRATOR` on Kubeflow Pipelines."""

COMPONENT_ID = "TFXKIT_COMPONENT_ID"
"""The step's pipeline component id (`Trainer`, `Trainer_teacher_1`), set by the
compiler on every step container. Read by the Trainer step when it launches a
job: part of the job's name and labels, and its placement key when
`PLACEMENT_ID` is unset."""

PLACEMENT_ID = "TFXKIT_PLACEMENT_ID"
"""The `kubeflow.placements` key of a training step's placement (its own entry,
else the teacher Trainer's), set by the compiler on every training step that
has one: the compiler decides by component type, which the step cannot see.
Read by the step when it launches a job: its replicas get that placement."""

TFJOB_INVOCATION = "TFXKIT_TFJOB_INVOCATION"
"""URI of the step's invocation (input and output artifacts, exec properties),
written by the Trainer step next to its model run and set on every TFJob
replica. Read by the replica's entry point (`python -m
components.trainer.executor`), which trains on it."""

PYTHONUNBUFFERED = "PYTHONUNBUFFERED"
"""Set to 1 on replicas so their logs reach `kubectl logs` as they are written."""


REPLICAS = "TFXKIT_REPLICAS"
"""Pods per replicated job of a TrainJob, `chief=1,node=3,ps=2`, set by the
Trainer step on every replica (the step alone knows the node count it asked
for). Replicated job `node` holds the TensorFlow workers (worker 0 is the
chief unless a `chief` job exists), `chief` the coordinator, `ps` the
parameter servers."""

JOBSET_NAME = "TFXKIT_JOBSET_NAME"
"""The JobSet's (= the TrainJob's) name: the pods' DNS subdomain."""

REPLICATED_JOB = "TFXKIT_REPLICATED_JOB"
"""The replicated job this pod belongs to (`node`, `chief`, `ps`)."""

JOB_INDEX = "TFXKIT_JOB_INDEX"
"""The index of this pod's Job within its replicated job (tfxkit runtimes
run one Job per replicated job, so always 0)."""

COMPLETION_INDEX = "TFXKIT_COMPLETION_INDEX"
"""This pod's completion index within its Indexed Job: its task index."""

TF_PORT = "TFXKIT_TF_PORT"
"""The port every replica's TensorFlow server listens on (2222)."""

RUNTIME_PODS = "TFXKIT_RUNTIME_PODS"
"""Pods the runtime gives this replicated job (`chief` and `ps`; the node
count is the TrainJob's). A replica compares it with `REPLICAS`, so a
runtime generated for another shape fails at start instead of hanging."""

TFDATA_DISPATCHER = "TFXKIT_TFDATA_DISPATCHER"
"""`host:port` of the tf.data service dispatcher a TrainJob runs beside its
trainers (`ingestion.service.dispatcher: kubeflow`): `<job>-dispatcher-0-0.<job>:5050`,
set by the Trainer step on every trainer replica. Read by
`components.data.service` (there `components.config.runtime.DISPATCHER_ENV`)."""

TFDATA_WORK_DIR = "TFXKIT_TFDATA_WORK_DIR"
"""The tf.data service dispatcher's journal directory (fault-tolerant mode),
set by the Trainer step on the TrainJob's dispatcher pod; the runtime passes
it to the dispatcher as `--work_dir`."""

HOST_ALIASES = "TFXKIT_HOST_ALIASES"
"""Optional JSON object `{"<derived host:port>": "<host:port>"}` that replaces
derived task addresses: rehearsing a JobSet cluster with local processes."""

# The JobSet pod labels and the Job annotation the downward API exposes.
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
REPLICATED_JOB_LABEL = "jobset.sigs.k8s.io/replicatedjob-name"
JOB_INDEX_LABEL = "jobset.sigs.k8s.io/job-index"
COMPLETION_INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"


def jobset_env() -> list[dict]:
    """The downward-API env entries (Kubernetes `EnvVar` dicts) a runtime puts on every container."""
    fields = (
        (JOBSET_NAME, f"metadata.labels['{JOBSET_NAME_LABEL}']"),
        (REPLICATED_JOB, f"metadata.labels['{REPLICATED_JOB_LABEL}']"),
        (JOB_INDEX, f"metadata.labels['{JOB_INDEX_LABEL}']"),
        (COMPLETION_INDEX, f"metadata.annotations['{COMPLETION_INDEX_ANNOTATION}']"),
    )
    return [{"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}} for name, path in fields]


def jobset_host(jobset: str, replicated_job: str, index: int | str) -> str:
    """DNS name of pod `index` of `replicated_job` in JobSet `jobset`: `S-R-0-i.S`.

    JobSet names pod `i` of Job `j` `S-R-j-i`, reachable through the JobSet's
    headless service `S`; tfxkit runtimes run one Job per replicated job.
    `jobset` and `index` may be `$(VAR)` references a container's command expands.
    """
    return f"{jobset}-{replicated_job}-0-{index}.{jobset}"


def format_replicas(counts: Mapping[str, int]) -> str:
    """`{"chief": 1, "node": 2}` -> `chief=1,node=2` (the value of `REPLICAS`)."""
    return ",".join(f"{job}={n}" for job, n in counts.items())


def step_env(component_id: str, placement_id: str = "") -> dict[str, str]:
    """What the compiler sets on the container of step `component_id` (in this order).

    `placement_id` ('' = none) is the training step's placement key.
    """
    out = {ORCHESTRATOR: KUBEFLOW, COMPONENT_ID: component_id}
    if placement_id:
        out[PLACEMENT_ID] = placement_id
    return out


def replica_env(invocation_uri: str) -> dict[str, str]:
    """What a job launcher sets on every replica container."""
    return {TFJOB_INVOCATION: invocation_uri, PYTHONUNBUFFERED: "1"}


def on_kubeflow(environ: Mapping[str, str]) -> bool:
    """Whether this process is a pipeline step on Kubeflow (not a replica, not a local run)."""
    return environ.get(ORCHESTRATOR) == KUBEFLOW


def component_id(environ: Mapping[str, str], default: str = "Trainer") -> str:
    """The step's component id, or `default` when the compiler set none."""
    return environ.get(COMPONENT_ID) or default


def placement_id(environ: Mapping[str, str]) -> str:
    """The step's placement key, or '' when the compiler set none (its own id applies)."""
    return environ.get(PLACEMENT_ID, "")


def invocation_uri(environ: Mapping[str, str]) -> str:
    """The invocation URI of a replica.

    Raises:
      KeyError: naming `TFJOB_INVOCATION` when this process is no replica.
    """
    return environ[TFJOB_INVOCATION]
