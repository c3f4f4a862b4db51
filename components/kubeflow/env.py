"""Environment variables between the compiled pipeline, the Trainer step and its job replicas.

Who sets what, who reads it:

  compiler (`pipelines.kubeflow_runner`) -> every step container:
      `ORCHESTRATOR`, `COMPONENT_ID` (`step_env`).
  Trainer step (`components.kubeflow.tfjob.launch`) -> every job replica:
      `TFJOB_INVOCATION` (`replica_env`).
  Trainer executor (`components.trainer.executor`) reads them: a step on
      Kubeflow submits a job (`on_kubeflow`); a replica, which has no
      `ORCHESTRATOR`, trains on the invocation at `TFJOB_INVOCATION`.

`TF_CONFIG` is not ours: the training operator sets it on every replica and
TensorFlow's cluster resolver reads it.

Pure (standard library only), so the compiler reads it without the job code.
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
job: the key of its placement in `kubeflow.placements` and part of the job name."""

TFJOB_INVOCATION = "TFXKIT_TFJOB_INVOCATION"
"""URI of the step's invocation (input and output artifacts, exec properties),
written by the Trainer step next to its model run and set on every TFJob
replica. Read by the replica's entry point (`python -m
components.trainer.executor`), which trains on it."""

PYTHONUNBUFFERED = "PYTHONUNBUFFERED"
"""Set to 1 on replicas so their logs reach `kubectl logs` as they are written."""


def step_env(component_id: str) -> dict[str, str]:
    """What the compiler sets on the container of step `component_id` (in this order)."""
    return {ORCHESTRATOR: KUBEFLOW, COMPONENT_ID: component_id}


def replica_env(invocation_uri: str) -> dict[str, str]:
    """What a job launcher sets on every replica container."""
    return {TFJOB_INVOCATION: invocation_uri, PYTHONUNBUFFERED: "1"}


def on_kubeflow(environ: Mapping[str, str]) -> bool:
    """Whether this process is a pipeline step on Kubeflow (not a replica, not a local run)."""
    return environ.get(ORCHESTRATOR) == KUBEFLOW


def component_id(environ: Mapping[str, str], default: str = "Trainer") -> str:
    """The step's component id, or `default` when the compiler set none."""
    return environ.get(COMPONENT_ID) or default


def invocation_uri(environ: Mapping[str, str]) -> str:
    """The invocation URI of a replica.

    Raises:
      KeyError: naming `TFJOB_INVOCATION` when this process is no replica.
    """
    return environ[TFJOB_INVOCATION]
