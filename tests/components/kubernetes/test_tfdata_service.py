"""The tf.data service in a TrainJob (`ingestion.service.dispatcher: kubeflow`): the
runtime's `dispatcher` and `data-worker` jobs, the TrainJob's patches and the trainers'
dispatcher address, against Kubeflow Trainer v2.3.0's CRD schemas; the refusals.
"""

from __future__ import annotations

import dataclasses
import re

import pytest
import yaml

from components.config import (
    ConfigError,
    Placement,
    ServiceConfig,
    StrategyConfig,
    Toleration,
    from_dict,
    to_dict,
)
from components.config.runtime import DISPATCHER_ENV, check_dispatcher_address
from components.kubernetes import backend, env, jobs, trainjob
from components.training import cluster, strategies
from tests.components.kubernetes import test_trainjob
from tests.components.kubernetes.test_trainjob import INVOCATION_URI, assert_valid

# The Trainer v2.3.0 CRD schemas (a module fixture), as the TrainJob tests validate with.
schemas = test_trainjob.schemas

NAME = "taxi-trainer-abc"
GPU = Placement(
    image="registry/tfxkit-gpu:0.1.0",
    cpu_request="4",
    memory_request="16Gi",
    accelerator_type="nvidia-l4",
    accelerator_count=1,
    tolerations=(Toleration(key="nvidia.com/gpu"),),
)
CPU_POOL = {"cloud.google.com/gke-nodepool": "cpu-pool"}
DISPATCHER = Placement(cpu_request="2", memory_request="4Gi", node_selector=CPU_POOL)
WORKERS = Placement(
    replicas=4,
    cpu_request="8",
    memory_request="16Gi",
    node_selector=CPU_POOL,
    tolerations=(Toleration(key="dedicated", operator="Equal", value="data"),),
)
MW = dict(kind="multi_worker_mirrored", workers=2)
PS = dict(kind="parameter_server", workers=2, parameter_servers=1)
ONE_POD = dict(kind="mirrored", workers=1)


def _config(taxi_config, service=None, placements=None, **strategy):
    placements = (
        {"Trainer": GPU, "tfdata_dispatcher": DISPATCHER, "tfdata_workers": WORKERS}
        if placements is None
        else placements
    )
    return dataclasses.replace(
        taxi_config,
        strategy=dataclasses.replace(taxi_config.strategy, **(strategy or ONE_POD)),
        ingestion=dataclasses.replace(
            taxi_config.ingestion, service=service or ServiceConfig(dispatcher="kubeflow")
        ),
        kubeflow=dataclasses.replace(
            taxi_config.kubeflow, placements=placements, tfjob_service_account="trainer-sa"
        ),
    )


def _manifest(config, name=NAME):
    return jobs.build_manifest(
        config,
        name=name,
        namespace="team-a",
        component_id="Trainer",
        invocation_uri=INVOCATION_URI,
    )


def _runtime(config, kind="ClusterTrainingRuntime"):
    return trainjob.runtime_manifest(
        config.strategy, config.kubeflow, kind, service=config.ingestion.service
    )


def _runtime_jobs(runtime):
    return {j["name"]: j for j in runtime["spec"]["template"]["spec"]["replicatedJobs"]}


def _pod(job):
    return job["template"]["spec"]["template"]["spec"]


def _patches(manifest):
    spec = manifest["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]
    return {p["name"]: p["template"]["spec"]["template"] for p in spec["replicatedJobs"]}


def _env(entries):
    return {e["name"]: e.get("value") for e in entries}


def _expand(args, environ):
    # What the kubelet does to `$(VAR)` in a container's command.
    return [re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: environ[m[1]], a) for a in args]


# --------------------------------------------------------------------------- #
# The runtime
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("kind", list(trainjob.RUNTIME_KINDS))
@pytest.mark.parametrize("strategy", [ONE_POD, MW, PS], ids=["one_pod", "multi_worker", "ps"])
def test_runtime_runs_a_dispatcher_and_data_workers_on_the_cpu_pool(
    taxi_config, schemas, kind, strategy
):
    config = _config(taxi_config, **strategy)
    runtime = _runtime(config, kind)
    assert_valid(runtime, schemas)
    by_name = _runtime_jobs(runtime)
    names = list(by_name)
    # The dispatcher first; every other job is created once it is ready.
    assert names[0] == "dispatcher" and names[-1] == "data-worker"
    assert "dependsOn" not in by_name["dispatcher"]
    for name in names[1:]:
        assert by_name[name]["dependsOn"] == [{"name": "dispatcher", "status": "Ready"}]
    assert set(names[1:-1]) == set(trainjob.replicated_jobs(config.strategy))

    dispatcher, workers = by_name["dispatcher"], by_name["data-worker"]
    assert dispatcher["template"]["spec"]["parallelism"] == 1
    assert workers["template"]["spec"]["parallelism"] == 4
    assert workers["template"]["spec"]["completions"] == 4
    # A lost service pod is recreated alone (same host name) up to max_restarts.
    for job in (dispatcher, workers):
        assert job["template"]["spec"]["backoffLimit"] == config.kubeflow.max_restarts
        assert job["template"]["spec"]["completionMode"] == "Indexed"

    (server,) = _pod(dispatcher)["containers"]
    assert server["name"] == "dispatcher"
    # The Trainer's image (its placement's), CPU resources, no accelerator.
    assert server["image"] == "registry/tfxkit-gpu:0.1.0"
    assert server["resources"] == {"requests": {"cpu": "2", "memory": "4Gi"}}
    assert server["command"] == [
        "python",
        "-m",
        "components.data.service",
        "dispatcher",
        "--port",
        "5050",
        "--work_dir",
        "$(TFXKIT_TFDATA_WORK_DIR)",
    ]
    assert server["ports"] == [{"name": "tfdata-port", "containerPort": 5050}]
    assert _pod(dispatcher)["nodeSelector"] == CPU_POOL

    (worker,) = _pod(workers)["containers"]
    assert worker["resources"] == {"requests": {"cpu": "8", "memory": "16Gi"}}
    assert _pod(workers)["nodeSelector"] == CPU_POOL
    assert _pod(workers)["tolerations"] == [
        {"key": "dedicated", "operator": "Equal", "value": "data", "effect": "NoSchedule"}
    ]
    for pod in (_pod(dispatcher), _pod(workers)):
        assert pod["restartPolicy"] == "Never"
        assert not any("nvidia.com/gpu" in str(c) for c in pod["containers"])

    success = runtime["spec"]["template"]["spec"]["successPolicy"]
    # The servers never exit: the trainers' completion decides the job.
    target = "chief" if strategy is PS else "node"
    assert success == {"operator": "All", "targetReplicatedJobs": [target]}


def test_a_worker_names_itself_and_the_dispatcher_by_jobset_pod_dns(taxi_config):
    runtime = _runtime(_config(taxi_config))
    (worker,) = _pod(_runtime_jobs(runtime)["data-worker"])["containers"]
    downward = {e["name"] for e in worker["env"] if "valueFrom" in e}
    assert {env.JOBSET_NAME, env.COMPLETION_INDEX} <= downward
    # As the kubelet expands it in pod 2 of the JobSet `NAME`.
    args = _expand(worker["command"], {env.JOBSET_NAME: NAME, env.COMPLETION_INDEX: "2"})
    assert args[3:] == [
        "worker",
        "--port",
        "5051",
        "--dispatcher",
        f"{NAME}-dispatcher-0-0.{NAME}:5050",
        "--worker_address",
        f"{NAME}-data-worker-0-2.{NAME}:5051",
    ]
    assert check_dispatcher_address(args[7]) is None
    assert check_dispatcher_address(args[9]) is None


def test_service_pods_run_the_default_image_and_requests_without_placements(taxi_config):
    config = _config(taxi_config, placements={})
    by_name = _runtime_jobs(_runtime(config))
    assert by_name["data-worker"]["template"]["spec"]["parallelism"] == 1
    for job in ("dispatcher", "data-worker"):
        (server,) = _pod(by_name[job])["containers"]
        assert server["image"] == config.kubeflow.image
        assert server["resources"] == {"requests": {"cpu": "1", "memory": "2Gi"}}
        assert "nodeSelector" not in _pod(by_name[job])
    own_image = Placement(image="registry/data:1", replicas=2)
    config = _config(taxi_config, placements={"Trainer": GPU, "tfdata_workers": own_image})
    (worker,) = _pod(_runtime_jobs(_runtime(config))["data-worker"])["containers"]
    assert worker["image"] == "registry/data:1"


def test_without_the_service_the_runtimes_are_unchanged(taxi_config):
    for strategy in (MW, PS):
        config = _config(taxi_config, service=ServiceConfig(), **strategy)
        with_none = trainjob.runtime_manifest(config.strategy, config.kubeflow)
        assert _runtime(config) == with_none
        assert "dispatcher" not in _runtime_jobs(with_none)
    config = _config(taxi_config, service=ServiceConfig(dispatcher="grpc://data:5050"), **MW)
    assert "successPolicy" not in _runtime(config)["spec"]["template"]["spec"]
    assert _runtime(config)["metadata"]["name"] == "tfxkit-tensorflow-multi-worker"


@pytest.mark.parametrize(
    "strategy, name",
    [
        (ONE_POD, "tfxkit-tensorflow-single-pod-tfdata"),
        (MW, "tfxkit-tensorflow-multi-worker-tfdata"),
        (PS, "tfxkit-tensorflow-parameter-server-tfdata"),
    ],
)
def test_runtime_names_with_the_service_are_not_the_shipped_ones(taxi_config, strategy, name):
    config = _config(taxi_config, **strategy)
    assert _runtime(config)["metadata"]["name"] == name
    assert _manifest(config)["spec"]["runtimeRef"]["name"] == name
    shipped = "".join(trainjob.shipped_files().values())
    assert name not in shipped
    config = dataclasses.replace(
        config, kubeflow=dataclasses.replace(config.kubeflow, trainjob_runtime="team-tf-data")
    )
    assert _manifest(config)["spec"]["runtimeRef"]["name"] == "team-tf-data"


def test_the_cli_prints_the_runtime_with_the_service(taxi_config, tmp_path, capsys):
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(to_dict(_config(taxi_config, **MW))))
    assert trainjob.main(["--config", str(path)]) == 0
    (runtime,) = yaml.safe_load_all(capsys.readouterr().out)
    assert list(_runtime_jobs(runtime)) == ["dispatcher", "node", "data-worker"]


# --------------------------------------------------------------------------- #
# The TrainJob
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("strategy", [ONE_POD, MW, PS], ids=["one_pod", "multi_worker", "ps"])
def test_trainjob_gives_trainers_the_dispatcher_and_places_the_service(
    taxi_config, schemas, strategy
):
    config = _config(taxi_config, **strategy)
    manifest = _manifest(config)
    assert_valid(manifest, schemas)
    trainer = manifest["spec"]["trainer"]
    trainer_env = _env(trainer["env"])
    assert trainer_env[DISPATCHER_ENV] == f"{NAME}-dispatcher-0-0.{NAME}:5050"
    # The replica count the trainers derive TF_CONFIG from names trainers only.
    shape = trainjob.replicated_jobs(config.strategy)
    assert trainer_env[env.REPLICAS] == env.format_replicas(shape)
    assert trainer["numNodes"] == shape["node"]
    assert trainer["resourcesPerNode"]["limits"] == {"nvidia.com/gpu": "1"}

    patches = _patches(manifest)
    assert list(patches) == [*shape, "dispatcher", "data-worker"]
    for job in shape:
        if job != "node":
            (container,) = patches[job]["spec"]["containers"]
            assert container["env"] == trainer["env"]
    (dispatcher,) = patches["dispatcher"]["spec"]["containers"]
    assert dispatcher == {
        "name": "dispatcher",
        "env": [
            {
                "name": env.TFDATA_WORK_DIR,
                "value": f"gs://tfxkit-demo/taxi/root/tfdata_service/{NAME}",
            }
        ],
    }
    assert patches["dispatcher"]["spec"]["nodeSelector"] == CPU_POOL
    assert patches["data-worker"]["spec"]["nodeSelector"] == CPU_POOL
    assert patches["data-worker"]["spec"]["tolerations"] == [
        {"key": "dedicated", "operator": "Equal", "value": "data", "effect": "NoSchedule"}
    ]
    assert "containers" not in patches["data-worker"]["spec"]
    for patch in patches.values():
        assert patch["spec"]["serviceAccountName"] == "trainer-sa"
        assert patch["metadata"]["labels"]["tfxkit/component"] == "Trainer"
    assert trainjob.BACKEND.shape(manifest).startswith(
        ", ".join(f"{job} x{n}" for job, n in shape.items()) + ", dispatcher x1, data-worker"
    )


def test_the_dispatcher_address_is_the_dns_name_tf_config_uses(taxi_config, monkeypatch):
    from components.data import service

    config = _config(taxi_config)
    trainer_env = _env(_manifest(config)["spec"]["trainer"]["env"])
    # A one-pod trainer derives a one-worker cluster: it trains as configured.
    pod_env = {
        env.JOBSET_NAME: NAME,
        env.REPLICATED_JOB: "node",
        env.COMPLETION_INDEX: "0",
        **trainer_env,
    }
    tf_config = cluster.read_tf_config(pod_env)
    (address,) = tf_config.cluster["worker"]
    assert address == f"{env.jobset_host(NAME, 'node', 0)}:2222"
    assert tf_config.is_chief
    resolution = strategies.resolve_kind(config.strategy, tf_config, num_gpus_visible=1)
    assert resolution.kind == "mirrored"
    # The trainer's service client reads the address the step set.
    monkeypatch.setenv(DISPATCHER_ENV, trainer_env[env.TFDATA_DISPATCHER])
    assert env.TFDATA_DISPATCHER == DISPATCHER_ENV
    assert service.resolve_address(config.ingestion.service) == (
        f"grpc://{NAME}-dispatcher-0-0.{NAME}:5050"
    )


def test_work_dir_given_in_the_config_is_the_dispatchers(taxi_config):
    config = _config(
        taxi_config, service=ServiceConfig(dispatcher="kubeflow", work_dir="gs://b/journal")
    )
    (dispatcher,) = _patches(_manifest(config))["dispatcher"]["spec"]["containers"]
    assert _env(dispatcher["env"]) == {env.TFDATA_WORK_DIR: "gs://b/journal"}


def test_one_trainer_with_the_service_launches_a_trainjob(taxi_config):
    on_kubeflow = {env.ORCHESTRATOR: env.KUBEFLOW}
    config = _config(taxi_config)
    assert backend.uses_job(config.strategy, config.ingestion.service)
    assert jobs.should_launch(config, on_kubeflow)
    assert not jobs.should_launch(config, {})  # a replica trains
    for service in (ServiceConfig(), ServiceConfig(dispatcher="data:5050")):
        assert not jobs.should_launch(_config(taxi_config, service=service), on_kubeflow)
    assert not backend.uses_job(StrategyConfig(kind="mirrored"))


# --------------------------------------------------------------------------- #
# Refusals
# --------------------------------------------------------------------------- #


def _with(config, **kubeflow):
    return dataclasses.replace(config, kubeflow=dataclasses.replace(config.kubeflow, **kubeflow))


@pytest.mark.parametrize("strategy", [ONE_POD, MW], ids=["one_pod", "multi_worker"])
def test_tfjob_backend_refuses_the_service_naming_job_backend(taxi_config, strategy):
    config = _with(_config(taxi_config, **strategy), job_backend="tfjob")
    with pytest.raises(
        ConfigError,
        match=r"^kubeflow\.job_backend: 'tfjob' cannot run the tf\.data service .* set "
        r"kubeflow\.job_backend: trainjob",
    ):
        _manifest(config)


@pytest.mark.parametrize(
    "service, pipeline_root, match",
    [
        (ServiceConfig(dispatcher="kubeflow"), "", r"^kubeflow\.pipeline_root: .*\(it is empty\)"),
        (
            ServiceConfig(dispatcher="kubeflow"),
            "/local/root",
            r"^kubeflow\.pipeline_root: .*got '/local/root'.*ingestion\.service\.work_dir",
        ),
        (
            ServiceConfig(dispatcher="kubeflow", work_dir="/tmp/journal"),
            "gs://b/root",
            r"^ingestion\.service\.work_dir: .*got '/tmp/journal'",
        ),
    ],
    ids=["no_root", "local_root", "local_work_dir"],
)
def test_a_journal_no_pod_reaches_is_refused(taxi_config, service, pipeline_root, match):
    config = _with(_config(taxi_config, service=service), pipeline_root=pipeline_root)
    with pytest.raises(ConfigError, match=match):
        _manifest(config)


def test_work_dir_under_a_local_root_is_fine_when_given(taxi_config):
    service = ServiceConfig(dispatcher="kubeflow", work_dir="gs://b/journal")
    _manifest(_with(_config(taxi_config, service=service), pipeline_root=""))


def test_a_multi_worker_strategy_of_one_worker_is_still_refused(taxi_config):
    config = _config(taxi_config, kind="multi_worker_mirrored", workers=1)
    with pytest.raises(ConfigError, match=r"^strategy\.workers: .*use kind 'mirrored'"):
        _manifest(config)


def test_too_many_workers_for_pod_host_names_are_refused(taxi_config):
    # The longest job name (jobs.job_name) leaves room for 1000 workers.
    name = jobs.job_name("p" * 80, "Trainer")
    assert len(name) == 45
    for replicas in (1000, 1001):
        many = dataclasses.replace(WORKERS, replicas=replicas)
        config = _config(taxi_config, placements={"tfdata_workers": many})
        if replicas == 1000:
            _manifest(config, name=name)
            continue
        with pytest.raises(
            ConfigError, match=r"^kubeflow\.placements\.tfdata_workers\.replicas: 1001 workers"
        ):
            _manifest(config, name=name)


def test_data_worker_hosts_are_checked_at_63_characters():
    # `<job>-data-worker-0-<index>`: 45 + 15 + a 3-digit index (999) is 63; index 1000 is one too many.
    name = "j" * 45
    trainjob.check_data_worker_hosts(name, 1000)
    with pytest.raises(
        ConfigError, match=r"^kubeflow\.placements\.tfdata_workers\.replicas: 1001 workers"
    ):
        trainjob.check_data_worker_hosts(name, 1001)


@pytest.mark.parametrize("strategy", [ONE_POD, MW, PS], ids=["one_pod", "multi_worker", "ps"])
def test_runtime_jobs_start_with_the_dispatcher_and_end_with_the_data_workers(
    taxi_config, strategy
):
    config = _config(taxi_config, **strategy)
    jobs_ = trainjob.runtime_replicated_jobs(
        config.strategy, config.kubeflow, config.ingestion.service
    )
    names = [j["name"] for j in jobs_]
    training = list(trainjob.replicated_jobs(config.strategy))
    assert names == ["dispatcher", *training, "data-worker"]
    # Every job but the dispatcher waits for it to be ready.
    assert "dependsOn" not in jobs_[0]
    for job in jobs_[1:]:
        assert job["dependsOn"] == [{"name": "dispatcher", "status": "Ready"}]


@pytest.mark.parametrize(
    "placements, match",
    [
        (
            {"tfdata_workers": {"accelerator_type": "nvidia-l4", "accelerator_count": 1}},
            r"^kubeflow\.placements\.tfdata_workers\.accelerator_type: the tf\.data service",
        ),
        (
            {"tfdata_dispatcher": {"replicas": 2}},
            r"^kubeflow\.placements\.tfdata_dispatcher\.replicas: only the tf\.data service "
            r"workers' entry \(tfdata_workers\)",
        ),
    ],
)
def test_bad_service_placements_fail_when_the_config_loads(taxi_config, placements, match):
    data = to_dict(taxi_config)
    data["kubeflow"]["placements"] = placements
    with pytest.raises(ConfigError, match=match):
        from_dict(data)
