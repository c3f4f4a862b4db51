"""TFJob manifests against the operator's CRD schema, and the submit / wait /
fail / timeout / delete paths through the real `kubernetes` client.

The client talks HTTP to a local server on a free port that speaks the
Kubernetes API for TFJobs and pods (the transport boundary); the server
records every request and answers from a scripted sequence of job states.
"""

from __future__ import annotations

import dataclasses
import json
import os

import jsonschema
import pytest
import yaml

from components.config import ConfigError, Placement, StrategyConfig, Toleration
from components.config.payload import CONFIG_KEY
from components.kubernetes import backend, env, jobs, tfjob
from tests.components.kubernetes.kube_api import (
    FakeKubernetes,
    api_client,
    condition,
    crd_schema,
    pod,
    run_to_failure,
    tfjob_status,
    unknown_fields,
)
from tests.conftest import data_file

CRD_NAME = "tfjob-crd-v1.9.0.yaml"
TFJOBS = "/apis/kubeflow.org/v1/namespaces/{ns}/tfjobs"
INVOCATION_URI = "gs://bucket/root/Trainer/model_run/7/tfjob_invocation.json"


# --------------------------------------------------------------------------- #
# Manifests
# --------------------------------------------------------------------------- #


@pytest.fixture(scope="module")
def tfjob_schema():
    return crd_schema(data_file("kubeflow", CRD_NAME), tfjob.GROUP, tfjob.VERSION, tfjob.PLURAL)


GPU_PLACEMENT = Placement(
    image="registry/tfxkit:0.1.0",
    cpu_request="4",
    memory_request="16Gi",
    accelerator_type="nvidia-l4",
    accelerator_count=1,
    node_selector={"cloud.google.com/gke-nodepool": "gpu-l4"},
    tolerations=(Toleration(key="nvidia.com/gpu"),),
)


def _config(taxi_config, **strategy):
    kubeflow = dataclasses.replace(
        taxi_config.kubeflow,
        placements={"Trainer": GPU_PLACEMENT},
        tfjob_timeout_seconds=900,
        job_backend="tfjob",
    )
    return dataclasses.replace(
        taxi_config,
        strategy=dataclasses.replace(taxi_config.strategy, **strategy),
        kubeflow=kubeflow,
    )


def _manifest(config, name="taxi-trainer-abc"):
    return tfjob.build_manifest(
        config, name=name, namespace="team-a", component_id="Trainer", invocation_uri=INVOCATION_URI
    )


def _containers(manifest, rtype):
    return manifest["spec"]["tfReplicaSpecs"][rtype]["template"]["spec"]["containers"]


@pytest.mark.parametrize(
    "strategy, shape",
    [
        (dict(kind="multi_worker_mirrored", workers=3), {"Worker": 3}),
        (
            dict(kind="parameter_server", workers=2, parameter_servers=1),
            {"Chief": 1, "Worker": 2, "PS": 1},
        ),
    ],
    ids=["multi_worker", "parameter_server"],
)
def test_manifest_validates_against_the_tfjob_crd(taxi_config, tfjob_schema, strategy, shape):
    manifest = _manifest(_config(taxi_config, **strategy))
    jsonschema.Draft7Validator(tfjob_schema).validate(manifest)
    assert unknown_fields(manifest, tfjob_schema) == []
    specs = manifest["spec"]["tfReplicaSpecs"]
    assert {rtype: spec["replicas"] for rtype, spec in specs.items()} == shape
    assert manifest["spec"]["runPolicy"]["activeDeadlineSeconds"] == 900
    for rtype in shape:
        (container,) = _containers(manifest, rtype)
        assert container["name"] == "tensorflow"
        assert container["command"] == ["python", "-m", "components.trainer.executor"]
        assert {"name": env.TFJOB_INVOCATION, "value": INVOCATION_URI} in container["env"]
    # Chief and workers get the Trainer's GPU pool; parameter servers the default pool.
    for rtype in set(shape) - {"PS"}:
        (container,) = _containers(manifest, rtype)
        pod = specs[rtype]["template"]["spec"]
        assert container["image"] == "registry/tfxkit:0.1.0"
        assert container["resources"] == {
            "requests": {"cpu": "4", "memory": "16Gi"},
            "limits": {"nvidia.com/gpu": "1"},
        }
        assert pod["nodeSelector"] == {
            "cloud.google.com/gke-accelerator": "nvidia-l4",
            "cloud.google.com/gke-nodepool": "gpu-l4",
        }
        assert pod["tolerations"] == [
            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
        ]
    if "PS" in shape:
        # Without a PS placement: the Trainer's image on the default pool, and
        # default requests (never a BestEffort pod).
        (container,) = _containers(manifest, "PS")
        assert container["image"] == "registry/tfxkit:0.1.0"
        assert container["resources"] == {"requests": {"cpu": "1", "memory": "2Gi"}}
        assert "nodeSelector" not in specs["PS"]["template"]["spec"]


@pytest.mark.parametrize(
    "strategy, policies",
    [
        (dict(kind="multi_worker_mirrored", workers=3), {"Worker": "OnFailure"}),
        (
            dict(kind="parameter_server", workers=2, parameter_servers=1),
            {"Chief": "OnFailure", "Worker": "ExitCode", "PS": "ExitCode"},
        ),
    ],
    ids=["multi_worker", "parameter_server"],
)
def test_restart_policies_and_budget_come_from_the_strategy_and_max_restarts(
    taxi_config, tfjob_schema, strategy, policies
):
    config = _config(taxi_config, **strategy)
    config = dataclasses.replace(
        config, kubeflow=dataclasses.replace(config.kubeflow, max_restarts=5)
    )
    manifest = _manifest(config)
    jsonschema.Draft7Validator(tfjob_schema).validate(manifest)
    specs = manifest["spec"]["tfReplicaSpecs"]
    assert {rtype: spec["restartPolicy"] for rtype, spec in specs.items()} == policies
    assert manifest["spec"]["runPolicy"]["backoffLimit"] == 5


def test_manifest_with_a_misspelled_field_is_caught_by_the_schema_check(taxi_config, tfjob_schema):
    # Guards the checker itself: the API server would prune this field silently.
    manifest = _manifest(_config(taxi_config, kind="multi_worker_mirrored", workers=2))
    manifest["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]["nodeselector"] = {"a": "b"}
    assert unknown_fields(manifest, tfjob_schema) == [
        ".spec.tfReplicaSpecs.Worker.template.spec.nodeselector"
    ]
    manifest["spec"]["tfReplicaSpecs"]["Worker"]["replicas"] = "two"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft7Validator(tfjob_schema).validate(manifest)


def test_ps_placement_and_tpu_workers(taxi_config, tfjob_schema):
    tpu = Placement(
        accelerator_type="tpu-v5-lite-podslice",
        accelerator_count=4,
        tpu_topology="2x2",
        tolerations=(Toleration(key="google.com/tpu"),),
    )
    ps = Placement(
        cpu_request="2",
        memory_request="8Gi",
        node_selector={"cloud.google.com/gke-nodepool": "cpu-pool"},
    )
    config = _config(taxi_config, kind="parameter_server", workers=2, parameter_servers=2)
    config = dataclasses.replace(
        config,
        kubeflow=dataclasses.replace(
            config.kubeflow, placements={"Trainer": tpu}, tfjob_ps_placement=ps
        ),
    )
    manifest = _manifest(config)
    jsonschema.Draft7Validator(tfjob_schema).validate(manifest)
    worker = manifest["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]
    assert worker["nodeSelector"] == {
        "cloud.google.com/gke-tpu-accelerator": "tpu-v5-lite-podslice",
        "cloud.google.com/gke-tpu-topology": "2x2",
    }
    assert worker["containers"][0]["resources"] == {
        "requests": {"cpu": "1", "memory": "2Gi"},
        "limits": {"google.com/tpu": "4"},
    }
    ps_pod = manifest["spec"]["tfReplicaSpecs"]["PS"]["template"]["spec"]
    assert ps_pod["nodeSelector"] == {"cloud.google.com/gke-nodepool": "cpu-pool"}
    assert manifest["spec"]["tfReplicaSpecs"]["PS"]["replicas"] == 2


@pytest.mark.parametrize(
    "strategy, match",
    [
        (
            dict(kind="multi_worker_mirrored", workers=1),
            r"^strategy\.workers: kind 'multi_worker_mirrored' on Kubeflow needs workers >= 2",
        ),
        (
            dict(kind="parameter_server", workers=1, parameter_servers=0),
            r"^strategy\.parameter_servers: kind 'parameter_server' on Kubeflow needs >= 1",
        ),
        (dict(kind="mirrored"), r"^strategy\.kind: 'mirrored' trains in one pod"),
    ],
)
def test_strategies_that_cannot_form_a_cluster_are_rejected(taxi_config, strategy, match):
    with pytest.raises(ConfigError, match=match):
        _manifest(_config(taxi_config, **strategy))


def test_which_strategies_use_a_tfjob():
    assert backend.uses_job(StrategyConfig(kind="multi_worker_mirrored", workers=2))
    assert backend.uses_job(StrategyConfig(kind="parameter_server", workers=1, parameter_servers=1))
    assert not backend.uses_job(StrategyConfig(kind="multi_worker_mirrored", workers=1))
    assert not backend.uses_job(StrategyConfig(kind="mirrored", workers=4))


def test_job_names_are_dns_labels_short_enough_for_replica_services():
    assert jobs.job_name("taxi", "Trainer", "ab12") == "taxi-trainer-ab12"
    long = jobs.job_name("My_Pipeline" * 10, "Trainer")
    # The operator names services <job>-worker-<i>; Kubernetes caps them at 63.
    assert len(long) <= 45 and long == long.lower() and "_" not in long


def test_only_a_step_on_kubeflow_launches(taxi_config):
    config = _config(taxi_config, kind="multi_worker_mirrored", workers=2)
    assert jobs.should_launch(config, {env.ORCHESTRATOR: env.KUBEFLOW})
    # A replica (no orchestrator variable) and a local run train in-process.
    assert not jobs.should_launch(config, {})
    assert not jobs.should_launch(
        _config(taxi_config, kind="mirrored"), {env.ORCHESTRATOR: env.KUBEFLOW}
    )


# --------------------------------------------------------------------------- #
# Submit, wait, fail, time out, delete
# --------------------------------------------------------------------------- #


@pytest.fixture
def mw_manifest(taxi_config):
    return _manifest(_config(taxi_config, kind="multi_worker_mirrored", workers=2))


JOB = TFJOBS.format(ns="team-a")


def test_success_submits_waits_and_deletes(mw_manifest):
    states = [
        None,
        tfjob_status(condition("Created")),
        tfjob_status(condition("Created"), condition("Running"), Worker={"active": 2}),
        tfjob_status(
            condition("Created"),
            condition("Succeeded", "TFJob taxi-trainer-abc successfully completed."),
            Worker={"succeeded": 2},
        ),
    ]
    lines = []
    with FakeKubernetes(states) as fake:
        status = jobs.run(
            mw_manifest,
            api_client(fake.host),
            timeout_seconds=30,
            poll_seconds=0.01,
            log=lines.append,
        )
    assert status.phase == "Succeeded" and status.replicas == {
        "Worker": {"active": 0, "succeeded": 2, "failed": 0}
    }
    assert fake.calls() == [("POST", JOB)] + [("GET", f"{JOB}/taxi-trainer-abc")] * 4 + [
        ("DELETE", f"{JOB}/taxi-trainer-abc")
    ]
    assert fake.requests[0]["body"] == mw_manifest
    assert fake.requests[-1]["body"]["propagationPolicy"] == "Background"
    assert (
        "TFJob team-a/taxi-trainer-abc: Running; Worker: 2 active, 0 succeeded, 0 failed" in lines
    )
    assert lines[-1] == "TFJob team-a/taxi-trainer-abc: deleted"


def test_failure_surfaces_replica_status_and_pod_reasons_and_keeps_the_job(mw_manifest):
    states = [
        tfjob_status(condition("Running"), Worker={"active": 2}),
        tfjob_status(
            condition(
                "Failed", "TFJob taxi-trainer-abc has failed because 1 Worker replica(s) failed."
            ),
            Worker={"active": 1, "failed": 1},
        ),
    ]
    pods = [
        pod(
            "taxi-trainer-abc-worker-1",
            "Failed",
            terminated={"exitCode": 137, "reason": "OOMKilled"},
        ),
        pod("taxi-trainer-abc-worker-0", "Running"),
    ]
    with FakeKubernetes(states, pods) as fake:
        failure = run_to_failure(
            mw_manifest,
            fake,
            log=lambda _: None,
        )
    message = str(failure)
    assert "failed because 1 Worker replica(s) failed" in message
    assert "Worker: 1 active, 0 succeeded, 1 failed" in message
    assert (
        "pod taxi-trainer-abc-worker-1 (Failed): tensorflow terminated: OOMKilled (exit code 137)"
        in message
    )
    assert "worker-0" not in message
    assert "kept for inspection" in message
    assert ("DELETE", f"{JOB}/taxi-trainer-abc") not in fake.calls()
    (pods_call,) = [r for r in fake.requests if r["path"] == "/api/v1/namespaces/team-a/pods"]
    assert pods_call["query"]["labelSelector"] == [
        "training.kubeflow.org/job-name=taxi-trainer-abc"
    ]


def _conditions(*conditions):
    return [
        {"type": kind, "status": status, "reason": f"TFJob{kind}", "message": message}
        | ({"lastTransitionTime": at} if at else {})
        for kind, status, message, at in conditions
    ]


def test_restarts_are_logged_as_they_happen_and_the_failure_names_the_replica(mw_manifest):
    restarting = "TFJob team-a/taxi-trainer-abc is restarting because 1 Worker replica(s) failed."
    states = [
        {"conditions": _conditions(("Running", "True", "", "t0")), "replicaStatuses": {}},
        {
            "conditions": _conditions(
                ("Running", "False", "", "t1"), ("Restarting", "True", restarting, "t1")
            )
        },
        # The same restart on the next poll is not a new one.
        {
            "conditions": _conditions(
                ("Running", "False", "", "t1"), ("Restarting", "True", restarting, "t1")
            )
        },
        {
            "conditions": _conditions(
                ("Running", "False", "", "t1"), ("Restarting", "True", restarting, "t2")
            )
        },
        {
            "conditions": _conditions(
                ("Restarting", "False", restarting, "t2"),
                (
                    "Failed",
                    "True",
                    "TFJob team-a/taxi-trainer-abc has failed because it has "
                    "reached the specified backoff limit",
                    "t3",
                ),
            ),
            "replicaStatuses": {"Worker": {"active": 1, "failed": 1}},
        },
    ]
    pods = [
        pod(
            "taxi-trainer-abc-worker-1",
            "Running",
            waiting={"reason": "CrashLoopBackOff", "message": "back-off 40s"},
            restarts=3,
            last_terminated={
                "exitCode": 1,
                "reason": "Error",
                "message": "tensorflow.python.framework.errors_impl.DeadlineExceededError: "
                "Collective ops timed out after 600 seconds",
            },
            labels={
                "training.kubeflow.org/replica-type": "worker",
                "training.kubeflow.org/replica-index": "1",
            },
        ),
    ]
    lines = []
    with FakeKubernetes(states, pods) as fake:
        failure = run_to_failure(
            mw_manifest,
            fake,
            log=lines.append,
            max_restarts=3,
        )
    assert [line for line in lines if ": restart " in line] == [
        f"TFJob team-a/taxi-trainer-abc: restart 1 (kubeflow.max_restarts: 3): {restarting}",
        f"TFJob team-a/taxi-trainer-abc: restart 2 (kubeflow.max_restarts: 3): {restarting}",
    ]
    message = str(failure)
    assert message.startswith(
        "TFJob team-a/taxi-trainer-abc failed after 2 restart(s) (kubeflow.max_restarts: 3): "
        "Failed (TFJob team-a/taxi-trainer-abc has failed because it has reached the specified "
        "backoff limit); Worker: 1 active, 0 succeeded, 1 failed"
    )
    assert (
        "\n  pod taxi-trainer-abc-worker-1 (Worker 1, Running): tensorflow waiting: "
        "CrashLoopBackOff: back-off 40s; tensorflow restarted 3 time(s), last: Error (exit code "
        "1): tensorflow.python.framework.errors_impl.DeadlineExceededError: Collective ops timed "
        "out after 600 seconds\n"
    ) in message


class _FakeClock:
    """Monotonic seconds that advance only when the code under test sleeps."""

    def __init__(self):
        self.now = 0.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def test_timeout_deletes_the_job_and_says_why_it_waited(mw_manifest):
    states = [tfjob_status(condition("Created"), Worker={"active": 0})]
    pods = [
        pod(
            "taxi-trainer-abc-worker-0",
            "Pending",
            unschedulable="0/3 nodes are available: 3 Insufficient nvidia.com/gpu.",
        )
    ]
    clock = _FakeClock()
    with FakeKubernetes(states, pods) as fake:
        timeout = run_to_failure(
            mw_manifest,
            fake,
            error=jobs.JobTimeout,
            poll_seconds=5,
            clock=clock,
            sleep=clock.sleep,
        )
    message = str(timeout)
    assert "did not finish within kubeflow.tfjob_timeout_seconds=30" in message
    assert "unschedulable: 0/3 nodes are available: 3 Insufficient nvidia.com/gpu." in message
    assert fake.calls()[-1] == ("DELETE", f"{JOB}/taxi-trainer-abc")
    # Polled at t = 0, 5, ..., 30 of the injected clock, then gave up: the wait
    # is bounded by the timeout, not by how fast this host answers.
    assert clock.sleeps == [5] * 6
    gets = [c for c in fake.calls() if c[0] == "GET" and "tfjobs" in c[1]]
    assert len(gets) == 7


def test_transient_read_errors_are_retried(mw_manifest):
    states = [tfjob_status(condition("Succeeded"), Worker={"succeeded": 2})]
    lines = []
    with FakeKubernetes(states, read_errors=[503]) as fake:
        status = jobs.run(
            mw_manifest,
            api_client(fake.host),
            timeout_seconds=30,
            poll_seconds=0.01,
            log=lines.append,
        )
    assert status.phase == "Succeeded"
    assert any("status read failed (503" in line for line in lines)


@pytest.mark.parametrize(
    "code, hint",
    [
        (403, "needs create/get/delete on tfjobs.kubeflow.org"),
        (404, "is the Kubeflow Training Operator (TFJob CRD) installed?"),
    ],
)
def test_refused_submission_names_the_cause(mw_manifest, code, hint):
    with FakeKubernetes([None], create_error=(code, "tfjobs.kubeflow.org is forbidden")) as fake:
        with pytest.raises(jobs.JobError, match="submission refused") as err:
            jobs.run(
                mw_manifest,
                api_client(fake.host),
                timeout_seconds=30,
                poll_seconds=0.01,
                log=lambda _: None,
            )
    assert hint in str(err.value)
    assert fake.calls() == [("POST", JOB)]


# --------------------------------------------------------------------------- #
# The Trainer step on Kubeflow
# --------------------------------------------------------------------------- #


def test_trainer_step_on_kubeflow_submits_a_tfjob_instead_of_training(
    taxi_config, tmp_path, monkeypatch
):
    from tfx.types import artifact_utils, standard_artifacts

    from components.trainer.executor import Executor
    from testkit.artifacts import local_artifact, trainer_artifacts

    inputs, outputs = trainer_artifacts(tmp_path)
    inputs["transform_graph"] = [
        local_artifact(standard_artifacts.TransformGraph, tmp_path, "transform_graph")
    ]
    inputs["schema"] = [local_artifact(standard_artifacts.Schema, tmp_path, "schema")]
    config = _config(taxi_config, kind="multi_worker_mirrored", workers=2)
    config = dataclasses.replace(
        config, kubeflow=dataclasses.replace(config.kubeflow, namespace="team-a")
    )
    exec_properties = {
        "custom_config": json.dumps({CONFIG_KEY: config.to_json()}),
        "train_args": '{"num_steps": 20, "splits": ["train"]}',
        "run_fn": "components.trainer.run_fn.run_fn",
    }
    states = [tfjob_status(condition("Succeeded"), Worker={"succeeded": 2})]
    with FakeKubernetes(states) as fake:
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "fake", "cluster": {"server": fake.host}}],
                    "users": [{"name": "step", "user": {"token": "step-token"}}],
                    "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "step"}}],
                    "current-context": "fake",
                }
            )
        )
        # Outside a pod the client falls back to the kubeconfig (in-cluster config is absent).
        monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
        monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
        monkeypatch.setenv(env.ORCHESTRATOR, env.KUBEFLOW)
        monkeypatch.setenv(env.COMPONENT_ID, "Trainer")
        Executor().Do(inputs, outputs, exec_properties)

    assert [c[0] for c in fake.calls()] == ["POST", "GET", "DELETE"]
    assert fake.requests[0]["auth"] == "Bearer step-token"
    job = fake.requests[0]["body"]
    assert job["metadata"]["namespace"] == "team-a" and job["metadata"]["name"].startswith(
        "taxi-trainer-"
    )
    assert job["spec"]["tfReplicaSpecs"]["Worker"]["replicas"] == 2
    invocation_uri = os.path.join(outputs["model_run"][0].uri, jobs.INVOCATION_FILE)
    (container,) = _containers(job, "Worker")
    assert {"name": env.TFJOB_INVOCATION, "value": invocation_uri} in container["env"]
    # The replicas get the step's exact artifacts and properties back.
    invocation = jobs.read_invocation(invocation_uri)
    assert invocation["exec_properties"] == exec_properties
    replica_inputs = artifact_utils.parse_artifact_dict(invocation["input_dict"])
    replica_outputs = artifact_utils.parse_artifact_dict(invocation["output_dict"])
    assert {k: [a.uri for a in v] for k, v in replica_inputs.items()} == {
        k: [a.uri for a in v] for k, v in inputs.items()
    }
    assert {k: [a.uri for a in v] for k, v in replica_outputs.items()} == {
        k: [a.uri for a in v] for k, v in outputs.items()
    }
    assert replica_inputs["examples"][0].split_names == inputs["examples"][0].split_names
    # The step itself trained nothing.
    assert os.listdir(outputs["model"][0].uri) == []
