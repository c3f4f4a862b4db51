"""The `kubeflow` section: compilation for Kubeflow Pipelines, per-component
`Placement`s and the training-job backend.

The GKE accelerator facts come from the neutral `components.config.accelerators`;
nothing here imports the Kubernetes rendering (`components.kubernetes`), which
reads these classes.
"""

from __future__ import annotations

import math
import re
from dataclasses import field
from typing import Literal, Self

from pydantic import model_validator

from components.config.accelerators import TPU_TOPOLOGY_DIMS, accelerator_node_labels, is_tpu
from components.config.validation import fail, section

# `kubeflow.placements` keys of the tf.data service pods a TrainJob runs
# beside its trainers (`ingestion.service.dispatcher: kubeflow`); they are no
# pipeline components.
TFDATA_DISPATCHER_PLACEMENT = "tfdata_dispatcher"
TFDATA_WORKERS_PLACEMENT = "tfdata_workers"
TFDATA_PLACEMENTS = (TFDATA_DISPATCHER_PLACEMENT, TFDATA_WORKERS_PLACEMENT)


@section()
class Toleration:
    """A Kubernetes toleration."""

    key: str
    operator: Literal["Equal", "Exists"] = "Exists"
    value: str = ""
    effect: Literal["", "NoSchedule", "PreferNoSchedule", "NoExecute"] = "NoSchedule"

    @model_validator(mode="after")
    def _check(self) -> Self:
        if not self.key:
            fail("key", "expected a non-empty toleration key")
        if self.operator == "Exists" and self.value:
            fail("value", "operator 'Exists' takes no value; use operator 'Equal'")
        return self


@section()
class Placement:
    """Where and with what one component runs on Kubernetes.

    Attributes:
      image: Container image ('' = `kubeflow.image`).
      cpu_request / cpu_limit: CPU as a Kubernetes quantity ('4', '500m').
      memory_request / memory_limit: Memory quantity ('16Gi').
      accelerator_type: e.g. `nvidia-l4`, `nvidia-tesla-a100`, `tpu-v5-lite-podslice`.
      accelerator_count: Accelerators per replica.
      tpu_topology: TPU slice topology such as `2x4` (TPU only).
      node_selector: Node labels the pod requires. The GKE accelerator
        labels (`cloud.google.com/gke-accelerator`,
        `cloud.google.com/gke-tpu-accelerator`, `cloud.google.com/gke-tpu-topology`)
        are derived from the accelerator fields and need not be repeated.
      tolerations: Taints the pod tolerates.
      beam_args: Extra Beam pipeline args for this component only (Beam-based
        components such as Transform and StatisticsGen), appended to
        `kubeflow.beam_args`, e.g. to run it on Dataflow.
      replicas: Pods of the tf.data service workers, on the
        `tfdata_workers` entry only (0 = 1); every other pod count comes from
        `strategy`.
    """

    image: str = ""
    cpu_request: str = ""
    cpu_limit: str = ""
    memory_request: str = ""
    memory_limit: str = ""
    accelerator_type: str = ""
    accelerator_count: int = 0
    tpu_topology: str = ""
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: tuple[Toleration, ...] = ()
    beam_args: tuple[str, ...] = ()
    replicas: int = 0

    @model_validator(mode="after")
    def _check(self) -> Self:
        if self.replicas < 0:
            fail("replicas", f"expected an integer >= 0 (0 = 1 worker), got {self.replicas}")
        for name in ("cpu_request", "cpu_limit"):
            value = getattr(self, name)
            if value and not re.fullmatch(r"([0-9]*[.])?[0-9]+m?", value):
                fail(name, f"expected a CPU quantity such as '4', '0.5' or '500m', got {value!r}")
        for name in ("memory_request", "memory_limit"):
            value = getattr(self, name)
            if value and not re.fullmatch(r"[0-9]+(E|Ei|P|Pi|T|Ti|G|Gi|M|Mi|K|Ki)?", value):
                fail(name, f"expected a memory quantity such as '16Gi' or '512Mi', got {value!r}")
        if self.accelerator_count < 0:
            fail("accelerator_count", f"expected an integer >= 0, got {self.accelerator_count}")
        if self.accelerator_count and not self.accelerator_type:
            fail(
                "accelerator_type",
                "accelerator_count is set but accelerator_type is empty; name the accelerator (e.g. nvidia-l4)",
            )
        if self.accelerator_type:
            self._check_accelerator()
        elif self.tpu_topology:
            fail(
                "tpu_topology",
                "tpu_topology is set but accelerator_type is empty; name the TPU (e.g. tpu-v5-lite-podslice)",
            )
        if self.tolerations and not self.node_selector and not self.accelerator_type:
            fail(
                "",
                "the tolerations let the pod onto a tainted node pool, but neither node_selector nor "
                "accelerator_type selects a pool; add node_selector (e.g. cloud.google.com/gke-nodepool: <pool>) "
                "or accelerator_type",
            )
        for key, value in self.node_selector.items():
            if not key or not value:
                fail(
                    "node_selector",
                    f"expected non-empty label keys and values, got {key!r}: {value!r}",
                )
        return self

    def _check_accelerator(self) -> None:
        kind = self.accelerator_type
        if self.accelerator_count < 1:
            fail(
                "accelerator_count",
                f"expected an integer >= 1 with accelerator_type {kind!r}, got {self.accelerator_count}",
            )
        if not is_tpu(kind):
            if not kind.startswith("nvidia-"):
                fail(
                    "accelerator_type",
                    f"expected a GKE accelerator name: nvidia-* for GPUs (e.g. nvidia-l4) or one of {sorted(TPU_TOPOLOGY_DIMS)}, got {kind!r}",
                )
            if self.tpu_topology:
                fail(
                    "tpu_topology",
                    f"tpu_topology is for TPU accelerators only, but accelerator_type is the GPU {kind!r}",
                )
        else:
            if kind not in TPU_TOPOLOGY_DIMS:
                fail(
                    "accelerator_type",
                    f"unknown TPU {kind!r}; expected one of {sorted(TPU_TOPOLOGY_DIMS)}",
                )
            dims = TPU_TOPOLOGY_DIMS[kind]
            example = "2x4" if dims == 2 else "2x2x2"
            if not self.tpu_topology:
                fail(
                    "tpu_topology",
                    f"a TPU slice needs its topology (GKE schedules {kind} by it), e.g. {example!r}",
                )
            if not re.fullmatch(r"[1-9][0-9]*(x[1-9][0-9]*)*", self.tpu_topology):
                fail(
                    "tpu_topology",
                    f"expected a topology such as {example!r}, got {self.tpu_topology!r}",
                )
            sizes = [int(s) for s in self.tpu_topology.split("x")]
            if len(sizes) != dims:
                fail(
                    "tpu_topology",
                    f"{self.tpu_topology!r} does not match {kind}: its slices have a {dims}-D topology (e.g. {example!r})",
                )
            chips = math.prod(sizes)
            if self.accelerator_count > chips or chips % self.accelerator_count:
                fail(
                    "accelerator_count",
                    f"{self.accelerator_count} chips per pod does not divide the {chips} chips of topology {self.tpu_topology!r}",
                )
        derived = accelerator_node_labels(kind, self.tpu_topology)
        for key, value in self.node_selector.items():
            if key in derived and value != derived[key]:
                fail(
                    f"node_selector.{key}",
                    f"{value!r} contradicts the accelerator fields, which select {derived[key]!r}; drop the label",
                )


def _check_not_empty(placement: Placement, path: str) -> None:
    # `Placement()` itself is valid: it is what a component without an entry gets.
    if placement == Placement():
        fail(
            path,
            "empty placement: it names no node pool (node_selector or accelerator_type) and no image or resources; "
            "fill it in or remove the entry",
        )


def _check_tfdata(name: str, placement: Placement) -> None:
    """`replicas` only on `tfdata_workers`; the tf.data service pods run on CPU nodes, without Beam."""
    path = f"placements.{name}"
    if placement.replicas and name != TFDATA_WORKERS_PLACEMENT:
        fail(
            f"{path}.replicas",
            f"only the tf.data service workers' entry ({TFDATA_WORKERS_PLACEMENT}) takes replicas; "
            "remove it (a component runs one pod, a training job's counts come from strategy)",
        )
    if name not in TFDATA_PLACEMENTS:
        return
    if placement.accelerator_type:
        fail(
            f"{path}.accelerator_type",
            "the tf.data service dispatcher and workers run on CPU nodes; remove the accelerator "
            "(select a CPU pool with node_selector)",
        )
    if placement.beam_args:
        fail(f"{path}.beam_args", "the tf.data service runs no Beam pipeline; remove beam_args")


@section("kubeflow")
class KubeflowConfig:
    """Kubeflow Pipelines compilation and placement.

    Attributes:
      image: Default container image of every component.
      pipeline_root: Pipeline root URI on the cluster (e.g. gs://bucket/root);
        every pod (and every TFJob replica) reads and writes artifacts there.
      serving_dir: Push destination URI on the cluster.
      data_uri: Directory URI of the input files on the cluster (all files in
        it are ExampleGen's input). Required for built-in data, which lives
        on the machine that compiles; defaults to `data.path` otherwise.
      placements: Component id -> Placement. Every training step (teacher
        Trainers `Trainer`, `Trainer_1`, ..., `StudentBaseline`, the
        `Distiller`) without an entry of its own gets the teacher Trainer's
        (`Trainer`) placement: resources, accelerator, node selector,
        tolerations and image. An entry of its own replaces it whole (e.g. a
        smaller GPU for the `Distiller`). When a training step trains across
        pods (strategy `multi_worker_mirrored` or `parameter_server` with
        more than one replica) its placement applies to the training job's
        workers (and, for `tfjob`, its chief); the pipeline step that
        submits and watches the job keeps only the image and runs on the
        default pool. Every job replica without CPU or memory in its
        placement requests 1 CPU and 2Gi. Two keys are no components:
        `tfdata_dispatcher` and `tfdata_workers` place the tf.data service
        dispatcher and workers a `trainjob` runs beside its trainers under
        `ingestion.service.dispatcher: kubeflow` (CPU pods: no accelerator;
        `tfdata_workers.replicas` sets the worker count, default 1).
      beam_args: Beam pipeline args for Beam-based components on the cluster.
      job_backend: What runs multi-pod training: `trainjob` (Kubeflow Trainer
        v2 `TrainJob` on the runtime `trainjob_runtime`; the product derives
        each replica's `TF_CONFIG`) or `tfjob` (the end-of-life Training
        Operator v1 `TFJob`, for clusters that still run it).
      trainjob_runtime: Name of the TensorFlow training runtime TrainJobs
        reference ('' = the shipped `tfxkit-tensorflow-multi-worker` or
        `tfxkit-tensorflow-parameter-server`, by strategy kind).
      trainjob_runtime_kind: `ClusterTrainingRuntime` (cluster-wide) or
        `TrainingRuntime` (in the job's namespace).
      tfjob_timeout_seconds: Bound on the wait for a multi-worker training job
        of either backend (also its `activeDeadlineSeconds`); the job is
        deleted when it passes.
      max_restarts: Restarts a multi-worker training job may make after
        faults before it fails, either backend (0 = fail at the first one).
        `trainjob`: restarts of the whole JobSet (`failurePolicy.maxRestarts`
        of the generated runtime), and under `parameter_server` also the
        worker pods its Job may recreate (`backoffLimit`); `tfjob`:
        `runPolicy.backoffLimit`. Restarted replicas resume from the last
        `BackupAndRestore` backup (`train.checkpoint_every_steps`).
      tfjob_ps_placement: Placement of parameter-server replicas, either
        backend (default: the default node pool with the Trainer's image).
      tfjob_service_account: Service account of training-job replicas, either
        backend ('' = the namespace default); it needs access to
        `pipeline_root`.
      namespace: Kubernetes namespace of training jobs ('' = the namespace of
        the pipeline step's pod).
    """

    image: str = "tfxkit:0.1.0"
    pipeline_root: str = ""
    serving_dir: str = ""
    data_uri: str = ""
    placements: dict[str, Placement] = field(default_factory=dict)
    beam_args: tuple[str, ...] = ()
    job_backend: Literal["trainjob", "tfjob"] = "trainjob"
    trainjob_runtime: str = ""
    trainjob_runtime_kind: Literal["ClusterTrainingRuntime", "TrainingRuntime"] = (
        "ClusterTrainingRuntime"
    )
    tfjob_timeout_seconds: int = 3600
    max_restarts: int = 3
    tfjob_ps_placement: Placement | None = None
    tfjob_service_account: str = ""
    namespace: str = ""

    @model_validator(mode="after")
    def _check(self) -> Self:
        if not self.image:
            fail(
                "image",
                "expected the default container image (e.g. us-docker.pkg.dev/<project>/tfxkit/tfxkit:0.1.0)",
            )
        for name, placement in self.placements.items():
            if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
                fail(
                    f"placements.{name}", "expected a component id (letters, digits, '_', '.', '-')"
                )
            _check_not_empty(placement, f"placements.{name}")
            _check_tfdata(name, placement)
        if self.tfjob_ps_placement is not None:
            _check_not_empty(self.tfjob_ps_placement, "tfjob_ps_placement")
            if self.tfjob_ps_placement.beam_args:
                fail(
                    "tfjob_ps_placement.beam_args",
                    "parameter servers run no Beam pipeline; remove beam_args",
                )
            if self.tfjob_ps_placement.replicas:
                fail(
                    "tfjob_ps_placement.replicas",
                    "strategy.parameter_servers counts the parameter servers; remove replicas",
                )
        if self.tfjob_timeout_seconds < 1:
            fail(
                "tfjob_timeout_seconds",
                f"expected an integer >= 1, got {self.tfjob_timeout_seconds}",
            )
        if self.max_restarts < 0:
            fail(
                "max_restarts",
                f"expected an integer >= 0 (0 = no restart: the job fails at its first fault), "
                f"got {self.max_restarts}",
            )
        if self.trainjob_runtime and not (
            len(self.trainjob_runtime) <= 253
            and re.fullmatch(
                r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*",
                self.trainjob_runtime,
            )
        ):
            fail(
                "trainjob_runtime",
                "expected a Kubernetes object name (lowercase letters, digits, '-' and '.', starting and "
                f"ending with a letter or digit, at most 253), got {self.trainjob_runtime!r}; "
                "'' picks the shipped runtime",
            )
        if self.tfjob_service_account and not re.fullmatch(
            r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*",
            self.tfjob_service_account,
        ):
            fail(
                "tfjob_service_account",
                f"expected a Kubernetes service account name, got {self.tfjob_service_account!r}",
            )
        if self.namespace and not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", self.namespace):
            fail(
                "namespace",
                f"expected a Kubernetes namespace name (lowercase letters, digits, '-'), got {self.namespace!r}",
            )
        return self
