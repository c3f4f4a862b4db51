"""Kubeflow compilation: the shipped pipelines compiled into KFP v2 YAML,
loaded with the kfp SDK's own loader, their placement read back through the
kfp-kubernetes protos, and their DAG compared with the local pipeline's.
"""

from __future__ import annotations

import dataclasses
import json

import jsonschema
import pytest
import yaml
from google.protobuf import json_format
from kfp import components as kfp_components
from kfp.kubernetes import kubernetes_executor_config_pb2 as k8s_pb2

from components.config import ConfigError, PipelineConfig, from_dict
from components.kubernetes import jobs, tfjob, trainjob
from pipelines import cli, kubeflow_runner, local_runner
from pipelines.configs import SHIPPED_CONFIG_DIR, load_config
from pipelines.pipeline import create_pipeline
from tests.components.kubernetes.kube_api import (
    FakeKubernetes,
    api_client,
    condition,
    crd_schema,
    unknown_fields,
)
from tests.conftest import COMPILED_CONFIGS, data_file

NAMES = list(COMPILED_CONFIGS)
# The steps that train, per shipped config (digits distils, with a scratch baseline).
TRAINING_TASKS = {
    "taxi": {"Trainer"},
    "digits": {"Trainer", "StudentBaseline", "Distiller"},
    "fashion_mnist": {"Trainer", "StudentBaseline", "Baseline_views", "Distiller"},
}


def _compile_with_cli(name, directory, capsys):
    path = str(directory / f"{name}.yaml")
    assert cli.main(["compile", "--config", name, "--output", path]) == 0
    assert f"wrote {path}" in capsys.readouterr().out
    return path


def _executor_label(component, task_id):
    spec = component.pipeline_spec
    return spec.components[spec.root.dag.tasks[task_id].component_ref.name].executor_label


def _executor(component, task_id):
    deployment = json_format.MessageToDict(component.pipeline_spec.deployment_spec)
    return deployment["executors"][_executor_label(component, task_id)]


def _container(component, task_id):
    return _executor(component, task_id)["container"]


def _k8s_config(component, task_id):
    """The task's `KubernetesExecutorConfig`, parsed with kfp-kubernetes' proto (None if absent)."""
    platforms = component.platform_spec.platforms
    if "kubernetes" not in platforms:
        return None
    executors = platforms["kubernetes"].deployment_spec.executors
    label = _executor_label(component, task_id)
    if label not in executors:
        return None
    msg = k8s_pb2.KubernetesExecutorConfig()
    json_format.ParseDict(json_format.MessageToDict(executors[label]), msg)
    return msg


# --------------------------------------------------------------------------- #
# Shipped pipelines
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("name", NAMES)
def test_cli_compile_writes_a_file_kfp_loads(name, tmp_path, capsys):
    path = _compile_with_cli(name, tmp_path, capsys)
    with open(path) as f:
        pipeline_doc, platform_doc = yaml.safe_load_all(f)
    component = kfp_components.load_component_from_file(path)
    assert component.name == name
    assert pipeline_doc["defaultPipelineRoot"] == load_config(name).kubeflow.pipeline_root
    assert set(platform_doc["platforms"]) == {"kubernetes"}


# A gibibyte in the gigabytes KFP's container resources count memory in.
GIB = 2**30 / 1e9
GPU_TOLERATION = ("nvidia.com/gpu", "Exists", "", "NoSchedule")
L4_NODES = {"cloud.google.com/gke-accelerator": "nvidia-l4"}
CPU_POOL = {"cloud.google.com/gke-nodepool": "cpu-pool"}
ONE_GPU = {"type": "nvidia.com/gpu", "count": "1"}

# What each shipped config's placements must compile to, written out from the
# YAML in pipelines/configs/ (not computed by the placement code under test):
# task -> (container resources, node selector, tolerations). Every other
# task with a container runs on the pipeline image with no resources and no
# Kubernetes config.
DIGITS_TRAINER = (
    {"cpuRequest": 4.0, "memoryRequest": 16 * GIB, "accelerator": ONE_GPU},
    L4_NODES,
    [GPU_TOLERATION],
)
PLACED = {
    "taxi": {
        "Trainer": (
            {
                "cpuRequest": 6.0,
                "memoryRequest": 24 * GIB,
                "memoryLimit": 24 * GIB,
                "accelerator": ONE_GPU,
            },
            L4_NODES,
            [GPU_TOLERATION],
        ),
        "Transform": ({"cpuRequest": 1.0, "memoryRequest": 4 * GIB}, CPU_POOL, []),
        "StatisticsGen": ({"cpuRequest": 4.0, "memoryRequest": 8 * GIB}, CPU_POOL, []),
        "Evaluator": ({"cpuRequest": 4.0, "memoryRequest": 16 * GIB}, CPU_POOL, []),
    },
    "digits": {
        "Trainer": DIGITS_TRAINER,
        "Transform": ({"cpuRequest": 2.0, "memoryRequest": 4 * GIB}, {}, []),
        # Training steps without an entry of their own are placed as the Trainer.
        "StudentBaseline": DIGITS_TRAINER,
        "Distiller": DIGITS_TRAINER,
    },
}
# The entries each shipped YAML writes (the rest of PLACED is the Trainer's default).
CONFIGURED = {
    "taxi": {"Trainer", "Transform", "StatisticsGen", "Evaluator"},
    "digits": {"Trainer", "Transform"},
}
IMAGE = "us-docker.pkg.dev/tfxkit-demo/tfxkit/tfxkit:0.1.0"


@pytest.mark.parametrize("name", NAMES)
def test_each_configured_component_is_placed(compiled, name):
    config, component, _ = compiled[name]
    kf = config.kubeflow
    assert set(kf.placements) == CONFIGURED[name], "the tables above follow the shipped YAML"
    placed = set()
    for task_id in component.pipeline_spec.root.dag.tasks:
        container = _executor(component, task_id).get("container")
        if container is None:  # a resolver runs inside the orchestrator
            assert task_id not in PLACED[name]
            continue
        k8s = _k8s_config(component, task_id)
        expected_env = {"TFXKIT_ORCHESTRATOR": "kubeflow", "TFXKIT_COMPONENT_ID": task_id}
        if task_id in TRAINING_TASKS[name]:
            # Whose placement the step (and its training job's replicas) carries.
            expected_env["TFXKIT_PLACEMENT_ID"] = (
                task_id if task_id in CONFIGURED[name] else "Trainer"
            )
        assert {e["name"]: e["value"] for e in container["env"]} == expected_env
        assert container["image"] == IMAGE
        if task_id not in PLACED[name]:
            assert "resources" not in container and k8s is None, task_id
            continue
            continue
        placed.add(task_id)
        resources, selector, tolerations = PLACED[name][task_id]
        got = dict(container["resources"])
        assert got.pop("accelerator", None) == resources.get("accelerator"), task_id
        assert got == pytest.approx({k: v for k, v in resources.items() if k != "accelerator"}), (
            task_id
        )
        assert (dict(k8s.node_selector.labels) if k8s else {}) == selector, task_id
        assert [
            (t.key, t.operator, t.value, t.effect) for t in (k8s.tolerations if k8s else [])
        ] == tolerations, task_id
    assert placed == set(PLACED[name])


def test_taxi_trainer_is_on_one_l4_with_the_gpu_toleration(compiled):
    _, component, _ = compiled["taxi"]
    resources = _container(component, "Trainer")["resources"]
    assert resources["accelerator"] == {"type": "nvidia.com/gpu", "count": "1"}
    assert resources["cpuRequest"] == 6.0
    assert resources["memoryRequest"] == pytest.approx(24 * 2**30 / 1e9)
    k8s = _k8s_config(component, "Trainer")
    assert dict(k8s.node_selector.labels) == {"cloud.google.com/gke-accelerator": "nvidia-l4"}
    (toleration,) = k8s.tolerations
    assert (toleration.key, toleration.operator, toleration.effect) == (
        "nvidia.com/gpu",
        "Exists",
        "NoSchedule",
    )
    # ExampleGen ignores TFX's with_platform_config (TFX issue 6146); the
    # compiler's placement reaches every container, ExampleGen included.
    assert "CsvExampleGen" in component.pipeline_spec.root.dag.tasks


def test_beam_args_pipeline_wide_and_per_component(compiled):
    config, component, _ = compiled["taxi"]
    pipeline_wide = list(config.kubeflow.beam_args)
    transform_args = _container(component, "Transform")["args"]
    stats_args = _container(component, "StatisticsGen")["args"]
    own = list(config.kubeflow.placements["Transform"].beam_args)
    assert transform_args[-(len(pipeline_wide) + len(own)) :] == pipeline_wide + own
    assert "--runner=DataflowRunner" in transform_args
    assert (
        stats_args[-len(pipeline_wide) :] == pipeline_wide
        and "--runner=DataflowRunner" not in stats_args
    )


def _tasks_of(node_id, tasks):
    """The compiled tasks of one node, the one its consumers read last: TFX compiles a
    `LatestBlessedModelStrategy` Resolver (the served model's) into two, a query of
    the blessings, then one of the model a blessing names."""
    split = [f"{node_id}-model-blessing-resolver", f"{node_id}-model-resolver"]
    return split if set(split) <= set(tasks) else [node_id]


@pytest.mark.parametrize("name", NAMES)
def test_dag_equals_the_local_pipeline(compiled, name, tmp_path):
    """Same components, wiring and parameters; only data location, push destination and placement differ."""
    from tfx import v1 as tfx

    from components.data.sources import resolve_input

    config, component, _ = compiled[name]
    local = create_pipeline(
        config,
        resolve_input(config.data, str(tmp_path / "data")),
        local_runner.paths_for(config, str(tmp_path)),
    )
    local_spec = tfx.orchestration.experimental.KubeflowV2DagRunner(
        config=tfx.orchestration.experimental.KubeflowV2DagRunnerConfig(use_pipeline_spec_2_1=True),
        output_dir=str(tmp_path),
    ).run(local, write_out=False)["pipelineSpec"]
    tasks = json_format.MessageToDict(component.pipeline_spec)["root"]["dag"]["tasks"]
    assert set(tasks) == {t for node in local.components for t in _tasks_of(node.id, tasks)}
    for node in local.components:
        if node.id in tasks:
            assert set(tasks[node.id].get("dependentTasks", [])) == {
                _tasks_of(n.id, tasks)[-1] for n in node.upstream_nodes
            }
    gen = next(t for t in ("CsvExampleGen", "ImportExampleGen") if t in tasks)
    where = {(gen, "input_base"), (gen, "input_config"), ("Pusher", "push_destination")}
    differing = set()
    for task_id, task in local_spec["root"]["dag"]["tasks"].items():
        # The served model's blessing query is a task without inputs.
        inputs = task.get("inputs", {})
        assert tasks[task_id].get("inputs", {}).get("artifacts") == inputs.get("artifacts")
        assert set(tasks[task_id].get("inputs", {}).get("parameters", {})) == set(
            inputs.get("parameters", {})
        )
        for key, value in inputs.get("parameters", {}).items():
            if tasks[task_id]["inputs"]["parameters"][key] != value:
                differing.add((task_id, key))
    assert differing <= where and (gen, "input_base") in differing

    def constant(params, key):
        return params[key]["runtimeValue"]["constant"]

    cluster, here = (
        tasks[gen]["inputs"]["parameters"],
        local_spec["root"]["dag"]["tasks"][gen]["inputs"]["parameters"],
    )
    assert constant(cluster, "input_base") == config.kubeflow.data_uri
    # The input config differs in the file pattern only (all files of the
    # cluster directory vs. the local file); the split names are the same.
    cluster_splits, local_splits = (
        json.loads(constant(cluster, "input_config")),
        json.loads(constant(here, "input_config")),
    )
    assert [s["name"] for s in cluster_splits["splits"]] == [
        s["name"] for s in local_splits["splits"]
    ]
    assert cluster_splits["splits"][0]["pattern"] == "*"
    assert config.kubeflow.serving_dir in constant(
        tasks["Pusher"]["inputs"]["parameters"], "push_destination"
    )


# --------------------------------------------------------------------------- #
# TPU and multi-worker placements (test configs)
# --------------------------------------------------------------------------- #


def _compiled(config, path):
    """The KFP component `compile_pipeline` writes for `config` at `path`."""
    return kfp_components.load_component_from_file(
        kubeflow_runner.compile_pipeline(config, str(path)).path
    )


def _trainer_job(backend, config) -> dict:
    """The training job (`tfjob` or `jobs`) the Trainer step would submit."""
    return backend.build_manifest(
        config,
        name="taxi-trainer-x",
        namespace="kubeflow",
        component_id="Trainer",
        invocation_uri="gs://b/i.json",
    )


def _taxi(**kubeflow_and_strategy):
    data = yaml.safe_load((SHIPPED_CONFIG_DIR / "taxi.yaml").read_text())
    data["kubeflow"].update(kubeflow_and_strategy.pop("kubeflow", {}))
    data.update(kubeflow_and_strategy)
    return data


TPU_TRAINER = {
    "accelerator_type": "tpu-v5-lite-podslice",
    "accelerator_count": 8,
    "tpu_topology": "2x4",
    "tolerations": [{"key": "google.com/tpu", "operator": "Exists", "effect": "NoSchedule"}],
}


def test_tpu_slice_placement(tmp_path):
    config = from_dict(
        _taxi(strategy={"kind": "tpu"}, kubeflow={"placements": {"Trainer": TPU_TRAINER}})
    )
    component = _compiled(config, tmp_path / "tpu.yaml")
    assert _container(component, "Trainer")["resources"] == {
        "accelerator": {"type": "google.com/tpu", "count": "8"}
    }
    k8s = _k8s_config(component, "Trainer")
    assert dict(k8s.node_selector.labels) == {
        "cloud.google.com/gke-tpu-accelerator": "tpu-v5-lite-podslice",
        "cloud.google.com/gke-tpu-topology": "2x4",
    }
    assert [t.key for t in k8s.tolerations] == ["google.com/tpu"]


def test_multi_worker_trainer_step_leaves_the_gpu_to_its_tfjob_replicas(tmp_path):
    config = from_dict(_taxi(strategy={"kind": "multi_worker_mirrored", "workers": 2}))
    component = _compiled(config, tmp_path / "mw.yaml")
    trainer = _container(component, "Trainer")
    assert "resources" not in trainer and _k8s_config(component, "Trainer") is None
    assert trainer["image"] == config.kubeflow.image
    assert {"name": "TFXKIT_ORCHESTRATOR", "value": "kubeflow"} in trainer["env"]
    assert _container(component, "Transform")["resources"]["cpuRequest"] == 1.0
    # The replicas the step will submit carry the Trainer's placement instead.
    manifest = _trainer_job(tfjob, config)
    worker = manifest["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]
    assert worker["containers"][0]["resources"]["limits"] == {
        "nvidia.com/gpu": "1",
        "memory": "24Gi",
    }
    assert worker["nodeSelector"] == {"cloud.google.com/gke-accelerator": "nvidia-l4"}
    # The default backend, a TrainJob, carries the same placement.
    assert config.kubeflow.job_backend == "trainjob"
    job = _trainer_job(jobs, config)
    assert job["kind"] == "TrainJob"
    assert job["spec"]["trainer"]["resourcesPerNode"]["limits"] == {
        "nvidia.com/gpu": "1",
        "memory": "24Gi",
    }


# --------------------------------------------------------------------------- #
# Every training step is placed: the teacher Trainer's placement by default
# --------------------------------------------------------------------------- #

# digits.yaml's `kubeflow.placements.Trainer` (4 CPUs, 16Gi, one L4, the GPU
# taint tolerated), as the compiled pipeline spec and platform spec hold it.
DIGITS_TRAINER_RESOURCES = {
    "cpuRequest": 4.0,
    "memoryRequest": pytest.approx(17.179869184),  # 16Gi in GB
    "accelerator": {"type": "nvidia.com/gpu", "count": "1"},
}
L4_SELECTOR = {"cloud.google.com/gke-accelerator": "nvidia-l4"}
GPU_TOLERATION = [("nvidia.com/gpu", "Exists", "", "NoSchedule")]
# A Distiller entry of its own: a T4 pool.
T4_DISTILLER = {
    "cpu_request": "2",
    "memory_request": "8Gi",
    "accelerator_type": "nvidia-tesla-t4",
    "accelerator_count": 1,
    "node_selector": {"cloud.google.com/gke-nodepool": "t4-pool"},
    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
}


def _digits(**changes):
    data = yaml.safe_load((SHIPPED_CONFIG_DIR / "digits.yaml").read_text())
    data["kubeflow"]["placements"].update(changes.pop("placements", {}))
    data["kubeflow"].update(changes.pop("kubeflow", {}))
    data.update(changes)
    return from_dict(data)


def _tolerations(k8s):
    return [(t.key, t.operator, t.value, t.effect) for t in k8s.tolerations]


def _env(container):
    return {e["name"]: e["value"] for e in container["env"]}


def _assert_valid_job(manifest):
    """The job against its CRD's schema, as the cluster's API server would check it."""
    from tests.components.kubernetes import test_tfjob, test_trainjob

    if manifest["kind"] == "TrainJob":
        schema = crd_schema(
            test_trainjob._crd("trainjobs"), trainjob.GROUP, trainjob.VERSION, "trainjobs"
        )
    else:
        schema = crd_schema(
            data_file("kubeflow", test_tfjob.CRD_NAME), tfjob.GROUP, tfjob.VERSION, tfjob.PLURAL
        )
    jsonschema.Draft7Validator(schema).validate(manifest)
    assert unknown_fields(manifest, schema) == []


def test_student_steps_get_the_trainers_placement(compiled):
    config, component, _ = compiled["digits"]
    assert set(config.kubeflow.placements) == {"Transform", "Trainer"}
    for task_id in ("Trainer", "StudentBaseline", "Distiller"):
        container = _container(component, task_id)
        assert container["resources"] == DIGITS_TRAINER_RESOURCES, task_id
        k8s = _k8s_config(component, task_id)
        assert dict(k8s.node_selector.labels) == L4_SELECTOR, task_id
        assert _tolerations(k8s) == GPU_TOLERATION, task_id
        assert _env(container)["TFXKIT_PLACEMENT_ID"] == "Trainer"
    # Components that do not train keep their own (or no) placement.
    assert _container(component, "Transform")["resources"] == {
        "cpuRequest": 2.0,
        "memoryRequest": pytest.approx(4.294967296),
    }
    assert "resources" not in _container(component, "Evaluator")
    assert "TFXKIT_PLACEMENT_ID" not in _env(_container(component, "Evaluator"))


def test_every_further_teacher_gets_the_trainers_placement(tmp_path):
    """Teachers are found by component type: `Trainer_1` trains, so it is placed as `Trainer`."""
    config = _digits()
    config = dataclasses.replace(
        config, distillation=dataclasses.replace(config.distillation, num_teachers=2)
    )
    component = _compiled(config, tmp_path / "two.yaml")
    for task_id in ("Trainer_1", "StudentBaseline", "Distiller"):
        assert _container(component, task_id)["resources"] == DIGITS_TRAINER_RESOURCES, task_id
        assert _env(_container(component, task_id))["TFXKIT_PLACEMENT_ID"] == "Trainer"


def test_m_on_m_places_its_ensemble_student_as_the_trainer(tmp_path):
    config = _digits()
    config = dataclasses.replace(
        config,
        distillation=dataclasses.replace(config.distillation, num_teachers=2, method="m_on_m"),
    )
    component = _compiled(config, tmp_path / "m_on_m.yaml")
    for task_id in ("Trainer_1", "EnsembleStudent", "Distiller"):
        assert _container(component, task_id)["resources"] == DIGITS_TRAINER_RESOURCES, task_id
        assert _env(_container(component, task_id))["TFXKIT_PLACEMENT_ID"] == "Trainer"


def test_noisy_student_rounds_are_chained_and_placed_as_the_trainer(tmp_path):
    digits = yaml.safe_load((SHIPPED_CONFIG_DIR / "digits.yaml").read_text())
    distillation = {
        **digits["distillation"],
        "method": "noisy_student",
        "cache_teacher_logits": False,
        "noisy_student": {"rounds": 3},
    }
    config = _digits(data={**digits["data"], "labeled_fraction": 0.1}, distillation=distillation)
    component = _compiled(config, tmp_path / "noisy.yaml")
    for task_id in ("Round_1", "Round_2", "Distiller"):
        assert _container(component, task_id)["resources"] == DIGITS_TRAINER_RESOURCES, task_id
        assert _env(_container(component, task_id))["TFXKIT_PLACEMENT_ID"] == "Trainer"


def test_a_distiller_entry_overrides_the_trainers_placement(tmp_path):
    config = _digits(placements={"Distiller": T4_DISTILLER})
    component = _compiled(config, tmp_path / "t4.yaml")
    distiller = _container(component, "Distiller")
    assert distiller["resources"] == {
        "cpuRequest": 2.0,
        "memoryRequest": pytest.approx(8.589934592),  # 8Gi in GB
        "accelerator": {"type": "nvidia.com/gpu", "count": "1"},
    }
    k8s = _k8s_config(component, "Distiller")
    assert dict(k8s.node_selector.labels) == {
        "cloud.google.com/gke-accelerator": "nvidia-tesla-t4",
        "cloud.google.com/gke-nodepool": "t4-pool",
    }
    assert _tolerations(k8s) == GPU_TOLERATION
    assert _env(distiller)["TFXKIT_PLACEMENT_ID"] == "Distiller"
    # The scratch baseline has no entry: still the Trainer's.
    assert _container(component, "StudentBaseline")["resources"] == DIGITS_TRAINER_RESOURCES
    assert dict(_k8s_config(component, "StudentBaseline").node_selector.labels) == L4_SELECTOR


@pytest.mark.parametrize("job_backend", ["trainjob", "tfjob"])
def test_a_distiller_job_places_its_replicas_as_the_trainer(tmp_path, job_backend):
    """The compiled Distiller step launches its job from its own environment: the replicas get the Trainer's GPU."""
    config = _digits(
        strategy={"kind": "multi_worker_mirrored", "workers": 2},
        kubeflow={"namespace": "team-a", "job_backend": job_backend},
    )
    component = _compiled(config, tmp_path / "mw.yaml")
    manifests = {}
    for task_id in ("StudentBaseline", "Distiller"):
        step = _container(component, task_id)
        # The step submits and watches only; the replicas carry the placement.
        assert "resources" not in step and _k8s_config(component, task_id) is None
        done = (
            {"conditions": [condition("Complete")]}
            if job_backend == "trainjob"
            else {"conditions": [condition("Succeeded")], "replicaStatuses": {}}
        )
        with FakeKubernetes([done]) as fake:
            jobs.launch(
                config,
                {"exec_properties": {}},
                str(tmp_path / task_id / "model_run"),
                _env(step),
                api_client(fake.host),
                poll_seconds=0.01,
                log=lambda _: None,
            )
        manifests[task_id] = fake.requests[0]["body"]
    for task_id, manifest in manifests.items():
        _assert_valid_job(manifest)
        assert manifest["metadata"]["labels"]["tfxkit/component"] == task_id
        if job_backend == "trainjob":
            assert manifest["spec"]["trainer"]["resourcesPerNode"] == {
                "requests": {"cpu": "4", "memory": "16Gi"},
                "limits": {"nvidia.com/gpu": "1"},
            }
            spec = manifest["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]
            (node,) = [j for j in spec["replicatedJobs"] if j["name"] == "node"]
            pod = node["template"]["spec"]["template"]["spec"]
        else:
            pod = manifest["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]
            assert pod["containers"][0]["resources"] == {
                "requests": {"cpu": "4", "memory": "16Gi"},
                "limits": {"nvidia.com/gpu": "1"},
            }
        assert pod["nodeSelector"] == L4_SELECTOR
        assert pod["tolerations"] == [
            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
        ]


# --------------------------------------------------------------------------- #
# Bad input: each fails at compile time naming the entry
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize(
    "placement, match",
    [
        (
            {"accelerator_count": 2},
            r"^kubeflow\.placements\.Trainer\.accelerator_type: accelerator_count is set but accelerator_type is empty",
        ),
        (
            {**TPU_TRAINER, "tpu_topology": "2x2x2"},
            r"^kubeflow\.placements\.Trainer\.tpu_topology: '2x2x2' does not match tpu-v5-lite-podslice: its slices have a 2-D topology",
        ),
        (
            {**TPU_TRAINER, "accelerator_type": "tpu-v4-podslice", "accelerator_count": 4},
            r"^kubeflow\.placements\.Trainer\.tpu_topology: '2x4' does not match tpu-v4-podslice: its slices have a 3-D",
        ),
        (
            {**TPU_TRAINER, "accelerator_count": 3},
            r"^kubeflow\.placements\.Trainer\.accelerator_count: 3 chips per pod does not divide the 8 chips",
        ),
        (
            {"accelerator_type": "tpu-v5-lite-podslice", "accelerator_count": 4},
            r"^kubeflow\.placements\.Trainer\.tpu_topology: a TPU slice needs its topology",
        ),
        (
            {"accelerator_type": "nvidia-l4", "accelerator_count": 1, "tpu_topology": "2x2"},
            r"^kubeflow\.placements\.Trainer\.tpu_topology: tpu_topology is for TPU accelerators only",
        ),
        (
            {
                "accelerator_type": "nvidia-l4",
                "accelerator_count": 1,
                "node_selector": {"cloud.google.com/gke-accelerator": "nvidia-tesla-t4"},
            },
            r"^kubeflow\.placements\.Trainer\.node_selector\.cloud\.google\.com/gke-accelerator: 'nvidia-tesla-t4' contradicts",
        ),
        (
            {"tolerations": [{"key": "nvidia.com/gpu"}]},
            r"^kubeflow\.placements\.Trainer: the tolerations let the pod onto a tainted node pool, but neither node_selector nor accelerator_type selects a pool",
        ),
        (
            {},
            r"^kubeflow\.placements\.Trainer: empty placement: it names no node pool \(node_selector or accelerator_type\)",
        ),
        (
            {"accelerator_type": "a100", "accelerator_count": 1},
            r"^kubeflow\.placements\.Trainer\.accelerator_type: expected a GKE accelerator name: nvidia-\*",
        ),
        (
            {"memory_request": "16GB"},
            r"^kubeflow\.placements\.Trainer\.memory_request: expected a memory quantity",
        ),
    ],
    ids=[
        "count_without_type",
        "topology_dims_v5e",
        "topology_dims_v4",
        "count_vs_topology",
        "tpu_without_topology",
        "topology_on_gpu",
        "selector_contradicts",
        "tolerations_without_pool",
        "empty",
        "unknown_accelerator",
        "memory_unit",
    ],
)
def test_bad_placements_name_the_entry(tmp_path, capsys, placement, match):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(_taxi(kubeflow={"placements": {"Trainer": placement}})))
    assert cli.main(["compile", "--config", str(path), "--output", str(tmp_path / "out.yaml")]) == 2
    err = capsys.readouterr().err
    with pytest.raises(ConfigError, match=match):
        from_dict(yaml.safe_load(path.read_text()))
    assert "kubeflow.placements.Trainer" in err
    assert not (tmp_path / "out.yaml").exists()


@pytest.mark.parametrize(
    "changes, match",
    [
        (
            {"kubeflow": {"placements": {"Tuner": {"cpu_request": "2"}}}},
            r"^kubeflow\.placements\.Tuner: the pipeline has no component 'Tuner'; its components are \[.*'Trainer'",
        ),
        (
            {"kubeflow": {"placements": {"latest_validated_schema": {"cpu_request": "2"}}}},
            r"^kubeflow\.placements\.latest_validated_schema: .* runs inside the orchestrator, not in a pod",
        ),
        (
            {
                "kubeflow": {
                    "placements": {
                        "Trainer": {"cpu_request": "2", "beam_args": ["--runner=DataflowRunner"]}
                    }
                }
            },
            r"^kubeflow\.placements\.Trainer\.beam_args: 'Trainer' runs no Beam pipeline; Beam-based components: \[.*'Transform'",
        ),
        (
            {"strategy": {"kind": "multi_worker_mirrored", "workers": 1}},
            r"^strategy\.workers: kind 'multi_worker_mirrored' on Kubeflow needs workers >= 2",
        ),
        (
            {"strategy": {"kind": "parameter_server", "workers": 1, "parameter_servers": 0}},
            r"^strategy\.parameter_servers: kind 'parameter_server' on Kubeflow needs >= 1",
        ),
        (
            {"strategy": {"kind": "multi_worker_mirrored", "workers": 2, "parameter_servers": 1}},
            r"^strategy\.parameter_servers: kind 'multi_worker_mirrored' runs no parameter servers",
        ),
        (
            {"kubeflow": {"data_uri": ""}},
            r"^kubeflow\.data_uri: data\.builtin 'taxi' lives on the machine that compiles",
        ),
        (
            {"kubeflow": {"data_uri": "/data/taxi"}},
            r"^kubeflow\.data_uri: '/data/taxi' is a local path",
        ),
        (
            {"kubeflow": {"pipeline_root": "/tmp/root"}},
            r"^kubeflow\.pipeline_root: expected a URI every pod can reach",
        ),
        (
            {"kubeflow": {"serving_dir": ""}},
            r"^kubeflow\.serving_dir: expected a URI every pod can reach, .*\(it is empty\)",
        ),
        (
            {"name": "Taxi_v2"},
            r"^name: Kubeflow pipeline names are lowercase letters, digits and '-'",
        ),
    ],
    ids=[
        "unknown_component",
        "resolver_node",
        "beam_args_on_trainer",
        "one_worker",
        "no_ps",
        "ps_count_disagrees",
        "builtin_without_uri",
        "local_data",
        "local_root",
        "no_serving_dir",
        "pipeline_name",
    ],
)
def test_compile_rejects_what_the_cluster_cannot_run(tmp_path, changes, match):
    data = _taxi(**changes)
    if "placements" in changes.get("kubeflow", {}):
        data["kubeflow"]["placements"] = changes["kubeflow"]["placements"]
    with pytest.raises(ConfigError, match=match):
        kubeflow_runner.compile_pipeline(from_dict(data), str(tmp_path / "out.yaml"))
    assert not (tmp_path / "out.yaml").exists()


def test_a_config_without_data_is_refused_naming_it(tmp_path):
    # Such a config serves only a user's own module (components.config.stock_args).
    with pytest.raises(
        ConfigError, match=r"^data: the tfxkit pipeline needs the data section: set exactly one of"
    ):
        kubeflow_runner.compile_pipeline(PipelineConfig(name="mine"), str(tmp_path / "out.yaml"))
    assert not (tmp_path / "out.yaml").exists()


def test_json_output_is_refused(taxi_config, tmp_path):
    with pytest.raises(ConfigError, match=r"^--output: .*must end in \.yaml"):
        kubeflow_runner.compile_pipeline(taxi_config, str(tmp_path / "p.json"))


@pytest.mark.parametrize(
    "kubeflow, match",
    [
        (
            {"tfjob_ps_placement": {"cpu_request": "1", "beam_args": ["--x"]}},
            r"^kubeflow\.tfjob_ps_placement\.beam_args: parameter servers run no Beam",
        ),
        ({"namespace": "Team_A"}, r"^kubeflow\.namespace: expected a Kubernetes namespace name"),
        (
            {"max_restarts": -1},
            r"^kubeflow\.max_restarts: expected an integer >= 0 \(0 = no restart: the job fails "
            r"at its first fault\), got -1$",
        ),
        ({"image": ""}, r"^kubeflow\.image: expected the default container image"),
    ],
)
def test_other_kubeflow_fields_are_checked(kubeflow, match):
    with pytest.raises(ConfigError, match=match):
        from_dict(_taxi(kubeflow=kubeflow))


def test_fashion_mnist_keeps_its_official_splits_on_the_cluster(tmp_path):
    """Pre-split data stays split on Kubeflow: the test set is the eval split there too."""
    config = load_config("fashion_mnist")
    compiled_fashion = kubeflow_runner.compile_pipeline(config, str(tmp_path / "fashion.yaml"))
    tasks = json_format.MessageToDict(compiled_fashion.pipeline_spec)["root"]["dag"]["tasks"]
    params = tasks["ImportExampleGen"]["inputs"]["parameters"]
    input_config = json.loads(params["input_config"]["runtimeValue"]["constant"])
    assert input_config["splits"] == [
        {"name": "train", "pattern": "train/*.tfrecord"},
        {"name": "eval", "pattern": "eval/*.tfrecord"},
    ]
    assert params["input_base"]["runtimeValue"]["constant"] == config.kubeflow.data_uri
    # No hash split of its own: the output splits are the input's.
    output_config = json.loads(params["output_config"]["runtimeValue"]["constant"] or "{}")
    assert "hashBuckets" not in json.dumps(output_config)


SERVICE = {"tfdata_workers": {"cpu_request": "4", "replicas": 3}}


def test_a_one_pod_trainer_with_the_service_launches_a_job_with_service_pods(tmp_path):
    config = from_dict(
        _taxi(ingestion={"service": {"dispatcher": "kubeflow"}}, kubeflow={"placements": SERVICE})
    )
    component = _compiled(config, tmp_path / "svc.yaml")
    # The step only launches the job: the GPU goes to the job's trainer pod.
    trainer = _container(component, "Trainer")
    assert "resources" not in trainer and _k8s_config(component, "Trainer") is None
    job = _trainer_job(jobs, config)
    assert job["kind"] == "TrainJob"


def test_service_placements_without_the_service_are_refused(tmp_path):
    config = from_dict(_taxi(kubeflow={"placements": SERVICE}))
    with pytest.raises(ConfigError, match="kubeflow.placements.tfdata_workers: places a pod"):
        kubeflow_runner.compile_pipeline(config, str(tmp_path / "x.yaml"))


def test_a_flink_section_sends_every_beam_stage_to_the_job_server(tmp_path, capsys):
    import apache_beam
    from tfx.dsl.components.base import executor_spec

    from components.kubernetes import flink

    flink_section = {
        "job_server_image": f"apache/beam_flink1.19_job_server:{apache_beam.__version__}",
        "flink_image": "flink:1.19",
        "worker_image": "us-docker.pkg.dev/tfxkit-demo/tfxkit/tfxkit:0.1.0",
    }
    data = _taxi(kubeflow={"flink": flink_section})
    config_path = tmp_path / "taxi-flink.yaml"
    config_path.write_text(yaml.safe_dump(data))
    output = tmp_path / "taxi.yaml"
    assert cli.main(["compile", "--config", str(config_path), "--output", str(output)]) == 0
    printed = capsys.readouterr().out
    manifests_path = tmp_path / "taxi.flink.yaml"
    assert f"wrote {manifests_path}" in printed and "kubectl apply it first" in printed
    config = from_dict(data)
    component = kfp_components.load_component_from_file(str(output))
    wanted = flink.beam_args(config)
    beam_nodes = [
        node.id
        for node in kubeflow_runner._cluster_pipeline(config).components
        if isinstance(node.executor_spec, executor_spec.BeamExecutorSpec)
    ]
    assert {"StatisticsGen", "Transform", "Evaluator"} <= set(beam_nodes)
    for node_id in beam_nodes:
        args = _container(component, node_id)["args"]
        assert all(arg in args for arg in wanted), node_id
        # The Flink args first: kubeflow.beam_args, then the placement's own, come after.
        assert args.index(wanted[0]) < args.index(config.kubeflow.beam_args[0])
    # The Transform's own placement still sends it to Dataflow (its args come last).
    transform_args = _container(component, "Transform")["args"]
    runners = [a for a in transform_args if a.startswith("--runner=")]
    assert runners[-1] == "--runner=DataflowRunner"
    with open(manifests_path) as f:
        documents = list(yaml.safe_load_all(f))
    assert [d["kind"] for d in documents] == ["FlinkDeployment", "Deployment", "Service"]
    assert documents == flink.manifests(config)


def test_a_flink_job_server_of_another_beam_is_refused_at_compile(tmp_path, capsys):
    flink_section = {
        "job_server_image": "apache/beam_flink1.19_job_server:2.1.0",
        "flink_image": "flink:1.19",
        "worker_image": "tfxkit:0.1.0",
    }
    config_path = tmp_path / "taxi-flink.yaml"
    config_path.write_text(yaml.safe_dump(_taxi(kubeflow={"flink": flink_section})))
    output = tmp_path / "taxi.yaml"
    assert cli.main(["compile", "--config", str(config_path), "--output", str(output)]) == 2
    err = capsys.readouterr().err
    assert "kubeflow.flink.job_server_image" in err and "is Beam 2.1.0" in err
    assert not output.exists() and not (tmp_path / "taxi.flink.yaml").exists()
