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
# Kubernetes CPU and memory quantities ('4', '500m'; '16Gi').
_CPU = re.compile(r"([0-9]*[.])?[0-9]+m?")
_MEMORY = re.compile(r"[0-9]+(E|Ei|P|Pi|T|Ti|G|Gi|M|Mi|K|Ki)?")


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
            if value and not _CPU.fullmatch(value):
                fail(name, f"expected a CPU quantity such as '4', '0.5' or '500m', got {value!r}")
        for name in ("memory_request", "memory_limit"):
            value = getattr(self, name)
            if value and not _MEMORY.fullmatch(value):
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


# Beam pipeline options the `flink` section sets for every Beam stage; `beam_args` must
# not set them too (a placement's `beam_args` may, to send one component elsewhere).
FLINK_OWNED_BEAM_ARGS = (
    "--runner",
    "--job_endpoint",
    "--artifact_endpoint",
    "--environment_type",
    "--environment_config",
)
# Beam's Flink job server images: apache/beam_flink<major>.<minor>_job_server:<Beam version>.
_JOB_SERVER_IMAGE = re.compile(r"beam_flink(\d+)\.(\d+)_job_server(?::(\S+))?$")
_FLINK_MEMORY = re.compile(r"[0-9]+(\.[0-9]+)?\s*(b|k|kb|m|mb|g|gb|t|tb|Ki|Mi|Gi|Ti)?")


def job_server_flink_version(image: str) -> str:
    """The operator's `flinkVersion` (`v1_19`) a Beam Flink job-server image is built for,
    '' when its name does not say (`apache/beam_flink1.19_job_server:2.72.0` -> `v1_19`)."""
    found = _JOB_SERVER_IMAGE.search(image)
    return f"v{found.group(1)}_{found.group(2)}" if found else ""


def job_server_beam_version(image: str) -> str:
    """The Beam release in a Beam Flink job-server image's tag ('' when it has none)."""
    found = _JOB_SERVER_IMAGE.search(image)
    tag = found.group(3) if found else ""
    return tag if tag and re.fullmatch(r"[0-9]+\.[0-9]+\.[0-9]+", tag) else ""


@section()
class FlinkResources:
    """CPU and memory of a Flink JobManager or TaskManager pod (the operator's `resource`).

    Attributes:
      cpu: Cores (a number).
      memory: Flink memory size, e.g. '2048m' or '4g'.
    """

    cpu: float = 1.0
    memory: str = "2048m"

    @model_validator(mode="after")
    def _check(self) -> Self:
        if self.cpu <= 0:
            fail("cpu", f"expected a number of cores > 0, got {self.cpu}")
        if not _FLINK_MEMORY.fullmatch(self.memory):
            fail(
                "memory",
                f"expected a Flink memory size such as '2048m' or '4g', got {self.memory!r}",
            )
        return self


@section()
class FlinkConfig:
    """The Beam stages of the compiled pipeline on a Flink session cluster on Kubernetes.

    `tfxkit compile` writes, beside the pipeline, the manifests of a session cluster for
    the Flink Kubernetes operator (a `FlinkDeployment` whose TaskManagers each carry a Beam
    Python worker-pool sidecar) and of Beam's Flink job server (a Deployment and its
    Service), and gives every Beam stage the Beam args that submit to that job server
    (`--runner=PortableRunner`, its job and artifact endpoints, the worker environment).
    `kubeflow.pipeline_root` must be shared storage (gs://, s3://): the job server stages
    artifacts there and the workers read and write every artifact there.

    Attributes:
      job_server_image: Beam's Flink job server image, of the Beam release in
        `kubeflow.image` (e.g. `apache/beam_flink1.19_job_server:2.72.0`). Required.
      flink_image: The Flink image of the JobManager and TaskManagers (e.g.
        `flink:1.19`), of the Flink version the job server is built for. Required.
      flink_version: The operator's `flinkVersion` (`v1_19`); '' = read from
        `job_server_image`'s name.
      environment_type: Where Beam's Python SDK workers run: `EXTERNAL` (a worker-pool
        sidecar beside each TaskManager, reached on localhost) or `DOCKER` (the
        TaskManager starts `worker_image` containers; it needs a Docker daemon).
      worker_image: The SDK workers' image: the worker-pool sidecar's under `EXTERNAL`,
        the started container's under `DOCKER`. It needs the product, TFX and the same
        Beam (`kubeflow.image` has them). Required.
      worker_pool_port: The sidecar's port (`EXTERNAL`).
      worker_cpu / worker_memory: The sidecar's requests (Kubernetes quantities).
      task_managers: TaskManager pods.
      task_slots: Slots per TaskManager (`taskmanager.numberOfTaskSlots`), and SDK
        workers per TaskManager (`--sdk_worker_parallelism`).
      parallelism: Default parallelism of a Beam stage (0 = task_managers x task_slots).
      job_manager / task_manager: Their pods' CPU and memory.
      service_account: The Flink pods' service account (the operator's Helm chart makes
        `flink`); it needs access to `pipeline_root`.
      name: The FlinkDeployment's name ('' = `<pipeline name>-flink`); the job server
        is `<name>-job-server`.
      namespace: Where both run ('' = `kubeflow.namespace`, else `default`).
      artifacts_dir: Where the job server stages pipeline artifacts ('' =
        `<pipeline_root>/beam-artifacts`).
    """

    job_server_image: str = ""
    flink_image: str = ""
    flink_version: str = ""
    environment_type: Literal["EXTERNAL", "DOCKER"] = "EXTERNAL"
    worker_image: str = ""
    worker_pool_port: int = 50000
    worker_cpu: str = "1"
    worker_memory: str = "2Gi"
    task_managers: int = 1
    task_slots: int = 2
    parallelism: int = 0
    job_manager: FlinkResources = field(default_factory=FlinkResources)
    task_manager: FlinkResources = field(
        default_factory=lambda: FlinkResources(cpu=2.0, memory="4096m")
    )
    service_account: str = "flink"
    name: str = ""
    namespace: str = ""
    artifacts_dir: str = ""

    @model_validator(mode="after")
    def _check(self) -> Self:
        if not self.job_server_image:
            fail(
                "job_server_image",
                "expected Beam's Flink job server image, of the Beam release in kubeflow.image "
                "(e.g. apache/beam_flink1.19_job_server:2.72.0); the product does not build it",
            )
        if not self.flink_image:
            fail("flink_image", "expected the Flink image of the session cluster (e.g. flink:1.19)")
        derived = job_server_flink_version(self.job_server_image)
        if not self.flink_version and not derived:
            fail(
                "flink_version",
                f"job_server_image {self.job_server_image!r} does not name its Flink version; "
                "set flink_version (e.g. v1_19) to the Flink it is built for",
            )
        if self.flink_version and not re.fullmatch(r"v[0-9]+_[0-9]+", self.flink_version):
            fail(
                "flink_version",
                f"expected the operator's form, e.g. 'v1_19', got {self.flink_version!r}",
            )
        if self.flink_version and derived and self.flink_version != derived:
            fail(
                "flink_version",
                f"{self.flink_version!r} contradicts job_server_image {self.job_server_image!r}, "
                f"built for {derived!r}; drop flink_version or use a matching job server",
            )
        if not self.worker_image:
            needs = (
                "EXTERNAL workers need a Beam worker-pool sidecar beside each TaskManager"
                if self.environment_type == "EXTERNAL"
                else "DOCKER workers need the SDK container image the TaskManagers start"
            )
            fail(
                "worker_image",
                f"{needs}: set worker_image to an image with the product, TFX and the job "
                "server's Beam (kubeflow.image has them)",
            )
        if not 0 < self.worker_pool_port < 65536:
            fail("worker_pool_port", f"expected a port 1-65535, got {self.worker_pool_port}")
        if not _CPU.fullmatch(self.worker_cpu):
            fail(
                "worker_cpu",
                f"expected a CPU quantity such as '1' or '500m', got {self.worker_cpu!r}",
            )
        if not _MEMORY.fullmatch(self.worker_memory):
            fail(
                "worker_memory",
                f"expected a memory quantity such as '2Gi', got {self.worker_memory!r}",
            )
        for name in ("task_managers", "task_slots"):
            if getattr(self, name) < 1:
                fail(name, f"expected an integer >= 1, got {getattr(self, name)}")
        if self.parallelism < 0:
            fail(
                "parallelism",
                f"expected an integer >= 0 (0 = task_managers x task_slots), got {self.parallelism}",
            )
        for name in ("name", "namespace", "service_account"):
            value = getattr(self, name)
            if value and not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", value):
                fail(
                    name,
                    f"expected a Kubernetes name (lowercase letters, digits, '-'), got {value!r}",
                )
        if self.name and len(self.name) > 45:
            fail(
                "name",
                f"expected at most 45 characters ('-job-server' and the operator's suffixes follow), got {len(self.name)}",
            )
        return self


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
      flink: Send the Beam stages to a Flink session cluster on Kubernetes
        (`FlinkConfig`); none: they run in each component's pod, or where
        `beam_args` send them.
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
    flink: FlinkConfig | None = None

    @model_validator(mode="after")
    def _check(self) -> Self:
        if self.flink is not None:
            owned = [a for a in self.beam_args if a.split("=", 1)[0] in FLINK_OWNED_BEAM_ARGS]
            if owned:
                fail(
                    "beam_args",
                    f"{owned} contradict kubeflow.flink, which sets the runner, its endpoints and "
                    "the worker environment of every Beam stage; remove them (a placement's "
                    "beam_args may still send one component elsewhere)",
                )
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
