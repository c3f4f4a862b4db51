"""Compiles `create_pipeline` for Kubeflow Pipelines (KFP v2) with node-pool placement.

`compile_pipeline` runs TFX's `KubeflowV2DagRunner`, then places each component from the
`kubeflow` section (resources and accelerators in the pipeline spec, node selectors and
tolerations in the kfp-kubernetes platform spec) and writes one YAML file;
`placement_ids` gives every unplaced training step the first teacher's placement.
"""

from __future__ import annotations

import dataclasses
import os
import re
import tempfile
from typing import Any

from google.protobuf import json_format

from components.config import ConfigError, PipelineConfig
from components.config.kubeflow import TFDATA_PLACEMENTS
from components.config.runtime import KUBEFLOW_DISPATCHER
from components.data.sources import FASHION_MNIST_SPLITS, ResolvedInput
from components.kubernetes import backend, flink, jobs
from components.kubernetes import env as tfxkit_env
from components.kubernetes.placement import kubernetes_executor_config, resource_spec
from pipelines import precheck, roles
from pipelines.pipeline import PipelinePaths, create_pipeline


@dataclasses.dataclass(frozen=True)
class CompiledPipeline:
    """A compiled pipeline.

    Attributes:
      path: The YAML file written.
      pipeline_spec: The KFP `PipelineSpec` message.
      platform_spec: The KFP `PlatformSpec` message (kubernetes placement).
      flink_path: With `kubeflow.flink`, the manifests written beside it (the
        Flink session cluster and Beam's job server, to apply first); else ''.
    """

    path: str
    pipeline_spec: Any
    platform_spec: Any
    flink_path: str = ""


def cluster_input(config: PipelineConfig) -> ResolvedInput:
    """ExampleGen's input on the cluster: `kubeflow.data_uri`, else `data.path`.

    Raises:
      ConfigError: built-in data without `kubeflow.data_uri`, or a local path.
    """
    uri = precheck.cluster_data_uri(config)
    if config.data.builtin == "fashion_mnist":
        # The bucket holds the layout `components.data.sources.write_fashion_mnist` writes.
        return ResolvedInput(
            uri.rstrip("/"), "*/*.tfrecord", config.data.format, splits=FASHION_MNIST_SPLITS
        )
    return ResolvedInput(input_base=uri.rstrip("/"), pattern="*", format=config.data.format)


def cluster_paths(config: PipelineConfig) -> PipelinePaths:
    """Pipeline root and push destination on the cluster (no SQLite: KFP owns ML Metadata).

    Raises:
      ConfigError: naming the missing or local URI.
    """
    precheck.check_cluster_paths(config)
    return PipelinePaths(
        pipeline_root=config.kubeflow.pipeline_root, serving_dir=config.kubeflow.serving_dir
    )


def _check_placements(config: PipelineConfig, pipeline) -> None:
    """Every placement names a containerised component of the pipeline; Beam args only on Beam components."""
    from tfx.dsl.components.base import base_component, executor_spec

    nodes = {node.id: node for node in pipeline.components}
    containers = sorted(i for i, n in nodes.items() if isinstance(n, base_component.BaseComponent))
    service_pods = backend.runs_tfdata_service(config.ingestion.service)
    for name, placement in config.kubeflow.placements.items():
        path = f"kubeflow.placements.{name}"
        if name in TFDATA_PLACEMENTS:
            if not service_pods:
                raise ConfigError(
                    f"{path}: places a pod of the tf.data service the training job starts only with "
                    f"ingestion.service.dispatcher: {KUBEFLOW_DISPATCHER!r}; set that or remove the entry"
                )
            continue  # a pod of the training job, not a pipeline component
        if name not in nodes:
            raise ConfigError(
                f"{path}: the pipeline has no component {name!r}; its components are {containers}"
            )
        if name not in containers:
            raise ConfigError(
                f"{path}: {name!r} is a {type(nodes[name]).__name__} that runs inside the orchestrator, not in a pod; remove the entry"
            )
        if placement.beam_args and not isinstance(
            nodes[name].executor_spec, executor_spec.BeamExecutorSpec
        ):
            beam = sorted(
                i
                for i in containers
                if isinstance(nodes[i].executor_spec, executor_spec.BeamExecutorSpec)
            )
            raise ConfigError(
                f"{path}.beam_args: {name!r} runs no Beam pipeline; Beam-based components: {beam}"
            )


def placement_ids(config: PipelineConfig, pipeline) -> dict[str, str]:
    """Component id -> the `kubeflow.placements` key of its placement.

    A component with an entry of its own gets it. A training step without
    one (`roles.trains`: StudentBaseline, the Distiller, teachers after the
    first, later training components) gets the first teacher Trainer's, so
    no student trains on whatever node it lands on. Roles are read from
    component types, never from ids. Components with neither are absent.
    """
    placements = config.kubeflow.placements
    teacher = next((n.id for n in pipeline.components if roles.is_teacher(n)), None)
    out = {}
    for node in pipeline.components:
        if node.id in placements:
            out[node.id] = node.id
        elif roles.trains(node) and teacher in placements:
            out[node.id] = teacher
    return out


def _job_components(config: PipelineConfig, pipeline) -> set[str]:
    """Training steps (the Distiller's included) that submit a training job (their placement goes to the replicas)."""
    if not backend.uses_job(config.strategy, config.ingestion.service):
        return set()
    return {node.id for node in pipeline.components if roles.trains(node)}


def check_output_and_name(config: PipelineConfig, output_path: str) -> None:
    """Refuses an output file that is not YAML and a pipeline name KFP does not accept.

    Raises:
      ConfigError: naming `--output` or `name`.
    """
    if not output_path.endswith((".yaml", ".yml")):
        raise ConfigError(
            f"--output: {output_path!r} must end in .yaml (the platform spec is a second YAML document)"
        )
    if not re.fullmatch(r"[a-z0-9][a-z0-9-]{0,127}", config.name):
        raise ConfigError(
            f"name: Kubeflow pipeline names are lowercase letters, digits and '-' ([a-z0-9][a-z0-9-]*), got {config.name!r}"
        )


def _cluster_pipeline(config: PipelineConfig):
    """`create_pipeline` on the cluster's input and paths, its placements checked and its Beam args set."""
    kf = config.kubeflow
    backend.check_strategy(config.strategy)
    beam_args = list(kf.beam_args)
    if kf.flink is not None:
        import apache_beam

        flink.check_versions(config, apache_beam.__version__)
        # The Flink args first: `kubeflow.beam_args` may add to them (never contradict:
        # the config refuses that), a placement's beam_args come after both.
        beam_args = flink.beam_args(config) + beam_args
    pipeline = create_pipeline(
        config, cluster_input(config), cluster_paths(config), beam_pipeline_args=beam_args
    )
    _check_placements(config, pipeline)
    by_id = {node.id: node for node in pipeline.components}
    for name, placement in kf.placements.items():
        if placement.beam_args:
            by_id[name].with_beam_pipeline_args(list(placement.beam_args))
    return pipeline


def _tfx_pipeline_spec(config: PipelineConfig, pipeline, images: dict[str, str]) -> dict[str, Any]:
    """The pipeline spec `KubeflowV2DagRunner` compiles (a dict), each component in its image."""
    from tfx.orchestration.kubeflow.v2 import kubeflow_v2_dag_runner, pipeline_builder

    kf = config.kubeflow
    runner = kubeflow_v2_dag_runner.KubeflowV2DagRunner(
        config=kubeflow_v2_dag_runner.KubeflowV2DagRunnerConfig(
            default_image={**images, pipeline_builder.DEFAULT_IMAGE_PATH_KEY: kf.image},
            use_pipeline_spec_2_1=True,
        ),
        output_dir=tempfile.gettempdir(),
    )
    spec_dict = runner.run(pipeline, write_out=False)["pipelineSpec"]
    # KFP reads the root from the pipeline spec; TFX writes it only into the
    # (Vertex) job's runtime config.
    spec_dict["defaultPipelineRoot"] = kf.pipeline_root
    return spec_dict


def _check_training_jobs(config: PipelineConfig, launchers: set[str], keys: dict[str, str]) -> None:
    """Builds each training job now, so what the cluster would refuse fails the compile.

    Raises:
      ConfigError: naming the entry the job cannot be built from.
    """
    kf = config.kubeflow
    for component_id in sorted(launchers):
        jobs.build_manifest(
            config,
            name=jobs.job_name(config.name, component_id, "compile"),
            namespace=kf.namespace or "default",
            component_id=component_id,
            invocation_uri=f"{kf.pipeline_root.rstrip('/')}/{jobs.INVOCATION_FILE}",
            placement_id=keys.get(component_id, ""),
        )


def _place(
    spec_dict: dict[str, Any],
    pipeline,
    keys: dict[str, str],
    placed: dict[str, Any],
    launchers: set[str],
) -> dict[str, Any]:
    """Gives each container its step env and resources; returns the kubernetes platform executors.

    Args:
      spec_dict: The pipeline spec (a dict), changed in place: every
        container's `env`, and its `resources` when its placement sets any.
      pipeline: The TFX pipeline compiled into `spec_dict`.
      keys: Component id -> its `kubeflow.placements` key (`placement_ids`).
      placed: Component id -> its placement.
      launchers: Components that submit a training job (`_job_components`).

    Returns:
      Executor label -> `KubernetesExecutorConfig` (a dict): node selectors
      and tolerations, for the executors whose placement sets them.
    """
    executors = spec_dict["deploymentSpec"]["executors"]
    platform: dict[str, Any] = {}
    for node in pipeline.components:
        label = spec_dict["components"].get(node.id, {}).get("executorLabel")
        container = executors.get(label, {}).get("container") if label else None
        if container is None:
            continue
        placement_key = keys.get(node.id, "") if roles.trains(node) else ""
        container["env"] = [
            {"name": k, "value": v} for k, v in tfxkit_env.step_env(node.id, placement_key).items()
        ]
        placement = placed.get(node.id)
        if placement is None or node.id in launchers:
            # A job launcher only submits and watches: its replicas get the
            # placement (components.kubernetes.jobs.build_manifest), the step does not.
            continue
        resources = resource_spec(placement)
        if resources.ByteSize():
            container["resources"] = json_format.MessageToDict(resources)
        k8s = kubernetes_executor_config(placement)
        if k8s.ByteSize():
            platform[label] = json_format.MessageToDict(k8s)
    return platform


def _write(
    config: PipelineConfig, spec_dict: dict[str, Any], platform: dict[str, Any], output_path: str
) -> CompiledPipeline:
    """Writes the pipeline spec and its kubernetes platform spec into one YAML file."""
    from kfp.compiler import pipeline_spec_builder
    from kfp.pipeline_spec import pipeline_spec_pb2

    pipeline_spec = pipeline_spec_pb2.PipelineSpec()
    json_format.ParseDict(spec_dict, pipeline_spec)
    platform_spec = pipeline_spec_pb2.PlatformSpec()
    if platform:
        json_format.ParseDict(
            {"platforms": {"kubernetes": {"deploymentSpec": {"executors": platform}}}},
            platform_spec,
        )
    directory = os.path.dirname(os.path.abspath(output_path))
    os.makedirs(directory, exist_ok=True)
    pipeline_spec_builder.write_pipeline_spec_to_file(
        pipeline_spec,
        f"tfxkit pipeline {config.name!r} compiled from create_pipeline by KubeflowV2DagRunner",
        platform_spec,
        output_path,
    )
    return CompiledPipeline(output_path, pipeline_spec, platform_spec)


def compile_pipeline(config: PipelineConfig, output_path: str) -> CompiledPipeline:
    """Compiles `create_pipeline(config)` into a KFP v2 YAML file with placement.

    Args:
      config: A validated config with a `kubeflow` section.
      output_path: The `.yaml` file to write (directories are created).

    Returns:
      The compiled pipeline.

    Raises:
      ConfigError: naming the config entry that cannot be compiled.
    """
    check_output_and_name(config, output_path)
    pipeline = _cluster_pipeline(config)
    # Each component's placement: its own entry, or a training step's fallback.
    keys = placement_ids(config, pipeline)
    placed = {node_id: config.kubeflow.placements[key] for node_id, key in keys.items()}
    images = {name: p.image for name, p in placed.items() if p.image}
    spec_dict = _tfx_pipeline_spec(config, pipeline, images)
    launchers = _job_components(config, pipeline)
    _check_training_jobs(config, launchers, keys)
    platform = _place(spec_dict, pipeline, keys, placed, launchers)
    compiled = _write(config, spec_dict, platform, output_path)
    if config.kubeflow.flink is None:
        return compiled
    return dataclasses.replace(compiled, flink_path=write_flink_manifests(config, output_path))


def flink_manifests_path(output_path: str) -> str:
    """Where the Flink manifests of a pipeline compiled to `output_path` go: `X.flink.yaml`."""
    return f"{os.path.splitext(output_path)[0]}.flink.yaml"


def write_flink_manifests(config: PipelineConfig, output_path: str) -> str:
    """Writes `flink.manifests(config)` as one multi-document YAML beside the pipeline."""
    import yaml

    path = flink_manifests_path(output_path)
    name, server, namespace = flink.names(config)
    header = (
        f"# The Flink session cluster {name!r} and Beam's job server {server!r} (namespace "
        f"{namespace!r}) that the Beam stages of pipeline {config.name!r} submit to.\n"
        "# Apply before running the pipeline (needs the Flink Kubernetes operator):\n"
        f"#   kubectl apply -f {os.path.basename(path)}\n"
    )
    with open(path, "w") as f:
        f.write(header)
        yaml.safe_dump_all(flink.manifests(config), f, sort_keys=False)
    return path
