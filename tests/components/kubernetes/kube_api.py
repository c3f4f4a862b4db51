"""A Kubernetes API server for the training-job tests, and a CRD schema check.

The `kubernetes` client talks HTTP to a local server on a free port that
speaks the API for custom resources and pods (the transport boundary); the
server records every request and answers from a scripted sequence of job
states.
"""

from __future__ import annotations

import json

import yaml
from kubernetes import client as k8s_client

from tests.fake_http import FakeJsonApi

# --------------------------------------------------------------------------- #
# A Kubernetes API server speaking custom resources and pods
# --------------------------------------------------------------------------- #


def condition(kind, message="", reason=""):
    return {"type": kind, "status": "True", "reason": reason or f"TFJob{kind}", "message": message}


def tfjob_status(*conditions, **replicas):
    return {"conditions": list(conditions), "replicaStatuses": replicas}


def pod(
    name,
    phase,
    terminated=None,
    unschedulable=None,
    container="tensorflow",
    labels=None,
    waiting=None,
    restarts=0,
    last_terminated=None,
):
    if terminated:
        state = {"terminated": terminated}
    else:
        state = {"waiting": waiting or {"reason": "ContainerCreating"}}
    container_status = {
        "name": container,
        "ready": False,
        "restartCount": restarts,
        "image": "img",
        "imageID": "",
        "state": state,
    }
    if last_terminated:
        container_status["lastState"] = {"terminated": last_terminated}
    status = {"phase": phase, "containerStatuses": [container_status]}
    if unschedulable:
        status = {
            "phase": phase,
            "conditions": [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": unschedulable,
                }
            ],
        }
    return {"metadata": {"name": name, "labels": labels or {}}, "status": status}


class FakeKubernetes(FakeJsonApi):
    """Records requests; answers job reads from `states` (the last one repeats)."""

    def __init__(self, states, pods=(), create_error=None, read_errors=(), jobsets=None):
        super().__init__()
        self.states = list(states)
        # The JobSet behind a TrainJob: its states (the last one repeats), or None = not found.
        self.jobsets = None if jobsets is None else list(jobsets)
        self.pods = list(pods)
        self.create_error = create_error
        self.read_errors = list(read_errors)
        self.job = None

    def describe(self, headers, raw):
        return {"body": json.loads(raw) if raw else None, "auth": headers.get("Authorization")}

    def answer(self, method, path, record):
        body = record["body"]
        if path.endswith("/pods"):
            return 200, {"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": self.pods}
        if "/jobsets/" in path:
            if not self.jobsets:
                return 404, {"kind": "Status", "message": "not found", "code": 404}
            state = self.jobsets.pop(0) if len(self.jobsets) > 1 else self.jobsets[0]
            return 200, {
                "apiVersion": "jobset.x-k8s.io/v1alpha2",
                "kind": "JobSet",
                "status": state,
            }
        if method == "POST":
            if self.create_error:
                code, message = self.create_error
                return code, {
                    "kind": "Status",
                    "apiVersion": "v1",
                    "status": "Failure",
                    "message": message,
                    "code": code,
                }
            self.job = body
            return 201, body
        if method == "GET":
            if self.read_errors:
                return self.read_errors.pop(0), {"kind": "Status", "message": "etcd is busy"}
            state = self.states.pop(0) if len(self.states) > 1 else self.states[0]
            return 200, {**self.job, **({"status": state} if state is not None else {})}
        if method == "DELETE":
            return 200, {"kind": "Status", "apiVersion": "v1", "status": "Success"}
        return 404, {"kind": "Status", "message": "not found"}

    def calls(self):
        return [(r["method"], r["path"]) for r in self.requests]


def api_client(host):
    configuration = k8s_client.Configuration()
    configuration.host = host
    return k8s_client.ApiClient(configuration)


# --------------------------------------------------------------------------- #
# CRD schemas
# --------------------------------------------------------------------------- #


def crd_schema(path, group, version, plural):
    """The `openAPIV3Schema` of `version` of the CRD in `path` (checked to be `plural.group`)."""
    with open(path) as f:
        crd = yaml.safe_load(f)
    (found,) = [v for v in crd["spec"]["versions"] if v["name"] == version]
    assert crd["spec"]["group"] == group and crd["spec"]["names"]["plural"] == plural
    return found["schema"]["openAPIV3Schema"]


def unknown_fields(obj, schema, path=""):
    """Fields the API server would silently prune (not declared in the structural schema)."""
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return []
    out = []
    if isinstance(obj, dict):
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        for key, value in obj.items():
            if props is not None and key in props:
                out += unknown_fields(value, props[key], f"{path}.{key}")
            elif isinstance(extra, dict):
                out += unknown_fields(value, extra, f"{path}.{key}")
            elif props is not None:
                out.append(f"{path}.{key}")
    elif isinstance(obj, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(obj):
            out += unknown_fields(item, schema["items"], f"{path}[{i}]")
    return out


def run_to_failure(manifest, fake, *, error=None, poll_seconds=0.01, log=lambda _: None, **kwargs):
    """Runs `jobs.run` against the fake API server, as the Trainer step does (30 s
    timeout, short polls unless given); returns the `error` it raised (default
    `jobs.JobFailed`; the test fails if it raised none)."""
    import pytest

    from components.kubernetes import jobs

    with pytest.raises(error or jobs.JobFailed) as err:
        jobs.run(
            manifest,
            api_client(fake.host),
            timeout_seconds=30,
            poll_seconds=poll_seconds,
            log=log,
            **kwargs,
        )
    return err.value
