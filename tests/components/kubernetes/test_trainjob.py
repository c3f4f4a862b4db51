"""TrainJob and runtime manifests against Kubeflow Trainer v2.3.0's CRD schemas, the
shipped runtimes and RBAC, and the submit / wait / fail / timeout / delete paths
through the real `kubernetes` client against a local fake API server.
"""

from __future__ import annotations

import dataclasses
import os
import re

import jsonschema
import pytest
import yaml

from components.config import (
    ConfigError,
    Placement,
    StrategyConfig,
    Toleration,
    from_dict,
    to_dict,
)
from components.kubernetes import env, jobs, trainjob
from tests.components.kubernetes.kube_api import (
    FakeKubernetes,
    api_client,
    condition,
    crd_schema,
    pod,
    run_to_failure,
    unknown_fields,
)
from tests.conftest import DATA

CRD_DIR = os.path.join(DATA, "kubeflow", "trainer-v2.3.0")
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
INVOCATION_URI = "gs://bucket/root/Trainer/model_run/7/tfjob_invocation.json"
TRAINJOBS = "/apis/trainer.kubeflow.org/v1alpha1/namespaces/team-a/trainjobs"

GPU_PLACEMENT = Placement(
    image="registry/tfxkit:0.1.0",
    cpu_request="4",
    memory_request="16Gi",
    accelerator_type="nvidia-l4",
    accelerator_count=1,
    node_selector={"cloud.google.com/gke-nodepool": "gpu-l4"},
    tolerations=(Toleration(key="nvidia.com/gpu"),),
)
TPU_PLACEMENT = Placement(
    accelerator_type="tpu-v5-lite-podslice",
    accelerator_count=4,
    tpu_topology="2x2",
    tolerations=(Toleration(key="google.com/tpu"),),
)
PS_PLACEMENT = Placement(
    cpu_request="2", memory_request="8Gi", node_selector={"cloud.google.com/gke-nodepool": "cpu"}
)


def _crd(name):
    path = os.path.join(CRD_DIR, f"trainer.kubeflow.org_{name}.yaml")
    return path


@pytest.fixture(scope="module")
def schemas():
    out = {}
    for kind, plural in (("TrainJob", "trainjobs"), *trainjob.RUNTIME_KINDS.items()):
        path = _crd(plural)
        out[kind] = crd_schema(path, trainjob.GROUP, trainjob.VERSION, plural)
    with open(_crd("trainjobs")) as f:
        crd = yaml.safe_load(f)
    # The CRD's CEL rules on the name (jsonschema does not run CEL).
    rules = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["x-kubernetes-validations"]
    (pattern,) = [
        re.search(r"matches\('(.*)'\)", r["rule"]).group(1) for r in rules if "matches" in r["rule"]
    ]
    out["name_pattern"] = pattern
    return out


def assert_valid(manifest, schemas):
    schema = schemas[manifest["kind"]]
    jsonschema.Draft7Validator(schema).validate(manifest)
    assert unknown_fields(manifest, schema) == []
    if manifest["kind"] == "TrainJob":
        name = manifest["metadata"]["name"]
        assert re.fullmatch(schemas["name_pattern"], name) and len(name) <= 63


def _config(taxi_config, placement=GPU_PLACEMENT, ps_placement=None, **strategy):
    kubeflow = dataclasses.replace(
        taxi_config.kubeflow,
        placements={"Trainer": placement},
        tfjob_ps_placement=ps_placement,
        tfjob_timeout_seconds=900,
    )
    return dataclasses.replace(
        taxi_config,
        strategy=dataclasses.replace(taxi_config.strategy, **strategy),
        kubeflow=kubeflow,
    )


def _manifest(config, name="taxi-trainer-abc", component_id="Trainer"):
    return trainjob.build_manifest(
        config,
        name=name,
        namespace="team-a",
        component_id=component_id,
        invocation_uri=INVOCATION_URI,
    )


def _patches(manifest):
    spec = manifest["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]
    return {p["name"]: p["template"]["spec"]["template"] for p in spec["replicatedJobs"]}


MW = dict(kind="multi_worker_mirrored", workers=3)
PS = dict(kind="parameter_server", workers=2, parameter_servers=2)


# --------------------------------------------------------------------------- #
# Manifests
# --------------------------------------------------------------------------- #


def test_default_backend_is_trainjob_and_namespace_default_is_the_pods(taxi_config):
    assert taxi_config.kubeflow.job_backend == "trainjob"
    # Documented as "the namespace of the pipeline step's pod".
    assert taxi_config.kubeflow.namespace == ""


def test_multi_worker_gpu_trainjob_validates_and_places_the_workers(taxi_config, schemas):
    manifest = _manifest(_config(taxi_config, **MW))
    assert_valid(manifest, schemas)
    spec = manifest["spec"]
    assert spec["runtimeRef"] == {
        "apiGroup": "trainer.kubeflow.org",
        "kind": "ClusterTrainingRuntime",
        "name": "tfxkit-tensorflow-multi-worker",
    }
    assert spec["activeDeadlineSeconds"] == 900
    trainer = spec["trainer"]
    assert trainer["numNodes"] == 3 and trainer["image"] == "registry/tfxkit:0.1.0"
    assert trainer["resourcesPerNode"] == {
        "requests": {"cpu": "4", "memory": "16Gi"},
        "limits": {"nvidia.com/gpu": "1"},
    }
    assert {"name": env.TFJOB_INVOCATION, "value": INVOCATION_URI} in trainer["env"]
    assert {"name": env.REPLICAS, "value": "node=3"} in trainer["env"]
    (node,) = _patches(manifest).values()
    assert node["spec"]["nodeSelector"] == {
        "cloud.google.com/gke-accelerator": "nvidia-l4",
        "cloud.google.com/gke-nodepool": "gpu-l4",
    }
    assert node["spec"]["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    ]


def test_parameter_server_tpu_trainjob_validates_and_every_role_gets_the_env(taxi_config, schemas):
    config = _config(taxi_config, placement=TPU_PLACEMENT, ps_placement=PS_PLACEMENT, **PS)
    config = dataclasses.replace(
        config,
        kubeflow=dataclasses.replace(
            config.kubeflow,
            trainjob_runtime="team.tf-ps",
            trainjob_runtime_kind="TrainingRuntime",
            tfjob_service_account="trainer-sa",
        ),
    )
    manifest = _manifest(config)
    assert_valid(manifest, schemas)
    assert manifest["spec"]["runtimeRef"]["kind"] == "TrainingRuntime"
    assert manifest["spec"]["runtimeRef"]["name"] == "team.tf-ps"
    trainer = manifest["spec"]["trainer"]
    assert trainer["numNodes"] == 2
    # A TPU placement without CPU / memory still requests them.
    assert trainer["resourcesPerNode"] == {
        "requests": {"cpu": "1", "memory": "2Gi"},
        "limits": {"google.com/tpu": "4"},
    }
    patches = _patches(manifest)
    assert list(patches) == ["chief", "node", "ps"]
    assert patches["node"]["spec"]["nodeSelector"] == {
        "cloud.google.com/gke-tpu-accelerator": "tpu-v5-lite-podslice",
        "cloud.google.com/gke-tpu-topology": "2x2",
    }
    assert patches["ps"]["spec"]["nodeSelector"] == {"cloud.google.com/gke-nodepool": "cpu"}
    for job in ("chief", "ps"):
        (container,) = patches[job]["spec"]["containers"]
        assert container["name"] == "node" and container["env"] == trainer["env"]
    for job in patches:
        assert patches[job]["spec"]["serviceAccountName"] == "trainer-sa"
    assert {"name": env.REPLICAS, "value": "chief=1,node=2,ps=2"} in trainer["env"]


def test_a_misspelled_field_is_caught_by_the_schema_check(taxi_config, schemas):
    # Guards the checker: the API server would prune this field silently.
    manifest = _manifest(_config(taxi_config, **MW))
    manifest["spec"]["trainer"]["numnodes"] = 3
    assert unknown_fields(manifest, schemas["TrainJob"]) == [".spec.trainer.numnodes"]
    manifest["spec"]["trainer"]["numNodes"] = "three"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft7Validator(schemas["TrainJob"]).validate(manifest)


@pytest.mark.parametrize("kind", list(trainjob.RUNTIME_KINDS))
@pytest.mark.parametrize("strategy", [MW, PS], ids=["multi_worker", "parameter_server"])
def test_runtimes_validate_against_their_crds(taxi_config, schemas, kind, strategy):
    config = _config(taxi_config, ps_placement=PS_PLACEMENT, **strategy)
    runtime = trainjob.runtime_manifest(config.strategy, config.kubeflow, kind)
    assert_valid(runtime, schemas)
    jobs_ = runtime["spec"]["template"]["spec"]["replicatedJobs"]
    by_name = {j["name"]: j for j in jobs_}
    assert by_name["node"]["template"]["metadata"]["labels"] == {
        "trainer.kubeflow.org/trainjob-ancestor-step": "trainer"
    }
    for job in jobs_:
        (container,) = job["template"]["spec"]["template"]["spec"]["containers"]
        names = {e["name"] for e in container["env"]}
        assert {env.JOBSET_NAME, env.REPLICATED_JOB, env.COMPLETION_INDEX} <= names
        assert container["resources"]["requests"]  # no BestEffort replica
    if strategy is PS:
        ps = by_name["ps"]["template"]["spec"]
        assert ps["parallelism"] == ps["completions"] == 2
        (container,) = ps["template"]["spec"]["containers"]
        assert container["resources"] == {"requests": {"cpu": "2", "memory": "8Gi"}}
        assert {"name": env.RUNTIME_PODS, "value": "2"} in container["env"]
        assert runtime["spec"]["template"]["spec"]["successPolicy"]["targetReplicatedJobs"] == [
            "chief"
        ]


@pytest.mark.parametrize(
    "strategy, backoff_limits",
    [(MW, {"node": 0}), (PS, {"chief": 0, "node": 5, "ps": 0})],
    ids=["multi_worker", "parameter_server"],
)
def test_restart_budgets_come_from_max_restarts(taxi_config, schemas, strategy, backoff_limits):
    config = _config(taxi_config, **strategy)
    config = dataclasses.replace(
        config, kubeflow=dataclasses.replace(config.kubeflow, max_restarts=5)
    )
    runtime = trainjob.runtime_manifest(config.strategy, config.kubeflow)
    assert_valid(runtime, schemas)
    spec = runtime["spec"]["template"]["spec"]
    # Any Job that fails restarts the whole JobSet, at most 5 times.
    assert spec["failurePolicy"] == {"maxRestarts": 5}
    found = {j["name"]: j["template"]["spec"]["backoffLimit"] for j in spec["replicatedJobs"]}
    # Only parameter-server workers are recreated one by one by their Job.
    assert found == backoff_limits
    for job in spec["replicatedJobs"]:
        assert job["template"]["spec"]["template"]["spec"]["restartPolicy"] == "Never"


@pytest.mark.parametrize(
    "strategy, tfdata, decides",
    [
        (MW, False, None),
        (MW, True, ["node"]),
        (PS, False, ["chief"]),
        (PS, True, ["chief"]),
        (dict(kind="mirrored", workers=1), True, ["node"]),
    ],
    ids=["multi_worker", "multi_worker_tfdata", "ps", "ps_tfdata", "one_pod_tfdata"],
)
def test_success_policy_names_the_job_whose_completion_decides(strategy, tfdata, decides):
    policy = trainjob.success_policy(StrategyConfig(**strategy), tfdata)
    if decides is None:
        assert policy is None  # every job completes: JobSet's default
    else:
        assert policy == {"operator": "All", "targetReplicatedJobs": decides}


def test_shipped_runtimes_and_rbac_are_what_the_code_generates(schemas):
    for name, text in trainjob.shipped_files().items():
        path = os.path.join(REPO_ROOT, "kubeflow", name)
        with open(path) as f:
            assert f.read() == text, (
                f"kubeflow/{name} is stale: python -m components.kubernetes.trainjob --write-shipped kubeflow"
            )
        for document in yaml.safe_load_all(text):
            if document["kind"] in schemas:
                assert_valid(document, schemas)


def test_distiller_replicas_without_a_placement_request_resources(taxi_config, schemas):
    config = _config(taxi_config, **MW)
    manifest = _manifest(config, component_id="Distiller")
    assert_valid(manifest, schemas)
    assert manifest["spec"]["trainer"]["resourcesPerNode"] == {
        "requests": {"cpu": "1", "memory": "2Gi"}
    }
    assert manifest["metadata"]["labels"]["tfxkit/component"] == "Distiller"


def test_a_limit_alone_is_not_overridden_by_default_requests(taxi_config):
    placement = Placement(cpu_limit="500m", node_selector={"pool": "small"})
    manifest = _manifest(_config(taxi_config, placement=placement, **MW))
    # A request above the limit would be refused; Kubernetes requests the limit.
    assert manifest["spec"]["trainer"]["resourcesPerNode"] == {
        "requests": {"memory": "2Gi"},
        "limits": {"cpu": "500m"},
    }


# --------------------------------------------------------------------------- #
# Bad input
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("pipeline_name", ["2024taxi", "_x", "taxi", "A" * 80, "9"])
def test_any_pipeline_name_gives_a_dns_1035_job_name(taxi_config, schemas, pipeline_name):
    name = jobs.job_name(pipeline_name, "Trainer_teacher_1", "ab12")
    assert re.fullmatch(schemas["name_pattern"], name) and len(name) <= 45
    assert name == jobs.job_name(pipeline_name, "Trainer_teacher_1", "ab12")  # deterministic
    assert_valid(_manifest(_config(taxi_config, **MW), name=name), schemas)
    assert jobs.job_name("2024taxi", "Trainer", "ab12") == "tfxkit-2024taxi-trainer-ab12"


@pytest.mark.parametrize(
    "strategy, match",
    [
        (
            dict(kind="multi_worker_mirrored", workers=1),
            r"^strategy\.workers: kind 'multi_worker_mirrored' on Kubeflow needs workers >= 2",
        ),
        (
            dict(kind="multi_worker_mirrored", workers=2, parameter_servers=1),
            r"^strategy\.parameter_servers: kind 'multi_worker_mirrored' runs no parameter servers",
        ),
        (dict(kind="mirrored"), r"^strategy\.kind: 'mirrored' trains in one pod; a TrainJob"),
    ],
    ids=["one_replica", "ps_count_disagrees", "single_pod_kind"],
)
def test_strategies_that_cannot_form_a_trainjob_are_rejected(taxi_config, strategy, match):
    with pytest.raises(ConfigError, match=match):
        _manifest(_config(taxi_config, **strategy))


@pytest.mark.parametrize(
    "field, value, match",
    [
        ("trainjob_runtime", "TF_Runtime", r"^kubeflow\.trainjob_runtime: expected a Kubernetes"),
        ("job_backend", "mpijob", r"^kubeflow\.job_backend: "),
        ("trainjob_runtime_kind", "Runtime", r"^kubeflow\.trainjob_runtime_kind: "),
        ("tfjob_service_account", "My SA", r"^kubeflow\.tfjob_service_account: expected"),
        ("image", "", r"^kubeflow\.image: expected the default container image"),
    ],
)
def test_bad_kubeflow_fields_fail_when_the_config_loads(taxi_config, field, value, match):
    data = to_dict(taxi_config)
    data["kubeflow"][field] = value
    with pytest.raises(ConfigError, match=match):
        from_dict(data)


# --------------------------------------------------------------------------- #
# Submit, wait, fail, time out, delete
# --------------------------------------------------------------------------- #


def _trainjob_status(*conditions, **jobs_status):
    return {
        "conditions": list(conditions),
        "jobsStatus": [
            {"name": name, "active": 0, "ready": 0, "succeeded": 0, "failed": 0, "suspended": 0}
            | counts
            for name, counts in jobs_status.items()
        ],
    }


def _run(manifest, fake, timeout_seconds=30, poll_seconds=0.01, log=None):
    return jobs.run(
        manifest,
        api_client(fake.host),
        timeout_seconds=timeout_seconds,
        poll_seconds=poll_seconds,
        log=log or (lambda _: None),
    )


@pytest.fixture
def mw_manifest(taxi_config):
    return _manifest(_config(taxi_config, kind="multi_worker_mirrored", workers=2))


def test_success_submits_waits_and_deletes(mw_manifest, schemas):
    states = [
        None,
        _trainjob_status(condition("Created", reason="JobSetCreated")),
        _trainjob_status(condition("Created", reason="JobSetCreated"), node={"active": 1}),
        _trainjob_status(
            condition("Complete", "jobset completed", "JobSetCompleted"), node={"succeeded": 1}
        ),
    ]
    lines = []
    with FakeKubernetes(states) as fake:
        status = _run(mw_manifest, fake, log=lines.append)
    assert status.outcome == "Succeeded" and status.phase == "Complete"
    assert status.replicas == {"node": {"active": 0, "ready": 0, "succeeded": 1, "failed": 0}}
    job = f"{TRAINJOBS}/taxi-trainer-abc"
    jobset = "/apis/jobset.x-k8s.io/v1alpha2/namespaces/team-a/jobsets/taxi-trainer-abc"
    # Every poll reads the JobSet's restarts too (here: not found, which is no error).
    assert fake.calls() == [("POST", TRAINJOBS)] + [("GET", job), ("GET", jobset)] * 4 + [
        ("DELETE", job)
    ]
    assert fake.requests[0]["body"] == mw_manifest
    assert fake.requests[-1]["body"]["propagationPolicy"] == "Background"
    assert lines[0] == (
        "TrainJob team-a/taxi-trainer-abc: submitted "
        "(node x2 on ClusterTrainingRuntime tfxkit-tensorflow-multi-worker)"
    )
    assert (
        "TrainJob team-a/taxi-trainer-abc: Pending (not yet seen by the Kubeflow Trainer controller)"
        in lines
    )
    assert lines[-1] == "TrainJob team-a/taxi-trainer-abc: deleted"


def test_failure_names_the_failed_replica_and_its_reason_and_keeps_the_job(mw_manifest):
    states = [
        _trainjob_status(condition("Created"), node={"active": 1}),
        _trainjob_status(
            condition(
                "Failed", "jobset failed: job taxi-trainer-abc-node-0 failed", "JobSetFailed"
            ),
            node={"failed": 1},
        ),
    ]
    pods = [
        pod(
            "taxi-trainer-abc-node-0-1-x7k2p",
            "Failed",
            terminated={"exitCode": 137, "reason": "OOMKilled"},
            container="node",
        ),
        pod("taxi-trainer-abc-node-0-0-a9f3c", "Running", container="node"),
    ]
    with FakeKubernetes(states, pods) as fake:
        with pytest.raises(jobs.JobFailed) as err:
            _run(mw_manifest, fake)
    message = str(err.value)
    assert "TrainJob team-a/taxi-trainer-abc failed: Failed (jobset failed" in message
    assert "node: 0 active, 0 ready, 0 succeeded, 1 failed" in message
    assert (
        "pod taxi-trainer-abc-node-0-1-x7k2p (Failed): node terminated: OOMKilled (exit code 137)"
        in message
    )
    assert "node-0-0" not in message
    assert "kubectl -n team-a describe trainjob taxi-trainer-abc" in message
    assert all(method != "DELETE" for method, _ in fake.calls())
    (pods_call,) = [r for r in fake.requests if r["path"] == "/api/v1/namespaces/team-a/pods"]
    assert pods_call["query"]["labelSelector"] == [
        "jobset.sigs.k8s.io/jobset-name=taxi-trainer-abc"
    ]


def test_restarts_are_logged_as_they_happen_and_the_failure_names_the_replica(mw_manifest):
    running = _trainjob_status(condition("Created", reason="JobSetCreated"), node={"active": 1})
    states = [
        running,
        running,
        running,
        _trainjob_status(
            condition(
                "Failed", "jobset failed due to reaching max number of restarts", "JobSetFailed"
            ),
            node={"failed": 1},
        ),
    ]
    # The JobSet counts restarts; a poll may miss one (1 -> 3).
    jobsets = [{"restarts": 0}, {"restarts": 1}, {"restarts": 1}, {"restarts": 3}]
    pods = [
        pod(
            "taxi-trainer-abc-node-0-1-x7k2p",
            "Failed",
            terminated={
                "exitCode": 1,
                "reason": "Error",
                # FallbackToLogsOnError: the log's tail; its last line is reported.
                "message": 'Traceback (most recent call last):\n  File "x.py", line 1\n'
                "tensorflow.python.framework.errors_impl.UnavailableError: cluster check "
                "alive failed, /job:worker/replica:0/task:0 is down\n",
            },
            container="node",
            labels={
                "jobset.sigs.k8s.io/replicatedjob-name": "node",
                "batch.kubernetes.io/job-completion-index": "1",
            },
        ),
    ]
    lines = []
    with FakeKubernetes(states, pods, jobsets=jobsets) as fake:
        failure = run_to_failure(
            mw_manifest,
            fake,
            log=lines.append,
            max_restarts=3,
        )
    restarts = [line for line in lines if ": restart " in line]
    assert restarts == [
        "TrainJob team-a/taxi-trainer-abc: restart 1 (kubeflow.max_restarts: 3): the JobSet "
        "recreated every pod after a replicated job failed; training resumes from the last backup",
        "TrainJob team-a/taxi-trainer-abc: restart 3 (kubeflow.max_restarts: 3): the JobSet "
        "recreated every pod after a replicated job failed; training resumes from the last backup",
    ]
    message = str(failure)
    assert message.startswith(
        "TrainJob team-a/taxi-trainer-abc failed after 3 restart(s) (kubeflow.max_restarts: 3): "
        "Failed (jobset failed due to reaching max number of restarts)"
    )
    assert (
        "\n  pod taxi-trainer-abc-node-0-1-x7k2p (node 1, Failed): node terminated: Error "
        "(exit code 1): tensorflow.python.framework.errors_impl.UnavailableError: cluster check "
        "alive failed, /job:worker/replica:0/task:0 is down\n"
    ) in message


def test_timeout_deletes_the_job_and_says_why_it_waited(mw_manifest):
    states = [_trainjob_status(condition("Created"), node={"active": 1})]
    pods = [
        pod(
            "taxi-trainer-abc-node-0-0-a9f3c",
            "Pending",
            unschedulable="0/3 nodes are available: 3 Insufficient nvidia.com/gpu.",
        )
    ]
    with FakeKubernetes(states, pods) as fake:
        with pytest.raises(jobs.JobTimeout) as err:
            _run(mw_manifest, fake, timeout_seconds=0.3, poll_seconds=0.05)
    message = str(err.value)
    assert "did not finish within kubeflow.tfjob_timeout_seconds=0.3" in message
    assert "unschedulable: 0/3 nodes are available: 3 Insufficient nvidia.com/gpu." in message
    assert fake.calls()[-1] == ("DELETE", f"{TRAINJOBS}/taxi-trainer-abc")
    gets = [c for c in fake.calls() if c[0] == "GET" and "trainjobs" in c[1]]
    assert 2 <= len(gets) <= 20  # polled, and the wait was bounded


@pytest.mark.parametrize(
    "code, hint",
    [
        (
            403,
            "needs create/get/delete on trainjobs.trainer.kubeflow.org (kubeflow/trainjob-rbac.yaml)",
        ),
        (
            404,
            "is Kubeflow Trainer v2 (TrainJob CRD) installed? On a cluster with the Training Operator v1 use kubeflow.job_backend: tfjob",
        ),
    ],
)
def test_refused_submission_names_the_cause(mw_manifest, code, hint):
    with FakeKubernetes([None], create_error=(code, "refused")) as fake:
        with pytest.raises(jobs.JobError, match="submission refused") as err:
            _run(mw_manifest, fake)
    assert hint in str(err.value)
    assert fake.calls() == [("POST", TRAINJOBS)]


def test_launch_picks_the_configured_backend_and_the_pods_namespace(taxi_config, tmp_path):
    config = _config(taxi_config, **MW)
    states = [_trainjob_status(condition("Complete"), node={"succeeded": 1})]
    namespace_file = tmp_path / "namespace"
    namespace_file.write_text("team-a\n")
    assert jobs.current_namespace(config, str(namespace_file)) == "team-a"
    with pytest.raises(ConfigError, match=r"^kubeflow\.namespace: empty and this pod has no"):
        jobs.current_namespace(config, str(tmp_path / "absent"))
    with FakeKubernetes(states) as fake:
        status = jobs.launch(
            dataclasses.replace(
                config, kubeflow=dataclasses.replace(config.kubeflow, namespace="team-a")
            ),
            {"exec_properties": {}},
            str(tmp_path / "model_run"),
            {env.ORCHESTRATOR: env.KUBEFLOW, env.COMPONENT_ID: "Trainer"},
            api_client(fake.host),
            poll_seconds=0.01,
            log=lambda _: None,
        )
    assert status.outcome == "Succeeded"
    assert fake.requests[0]["path"] == TRAINJOBS
    assert fake.requests[0]["body"]["metadata"]["name"].startswith("taxi-trainer-")
