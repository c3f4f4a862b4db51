"""The job backend registry: `kubeflow.job_backend` and manifest kinds to backends."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import typing

import pytest

from components.config import ConfigError, KubeflowConfig
from components.kubernetes import jobs, tfjob, trainjob
from components.kubernetes.backend import Restart


def _multi_worker(config, job_backend):
    return dataclasses.replace(
        config,
        strategy=dataclasses.replace(config.strategy, kind="multi_worker_mirrored", workers=2),
        kubeflow=dataclasses.replace(config.kubeflow, job_backend=job_backend),
    )


def test_every_configurable_backend_is_registered():
    configurable = typing.get_args(typing.get_type_hints(KubeflowConfig)["job_backend"])
    assert set(jobs.BACKENDS) == set(configurable) == {"trainjob", "tfjob"}
    for name, backend in jobs.BACKENDS.items():
        assert backend.name == name


@pytest.mark.parametrize(
    "name, module, kind", [("trainjob", trainjob, "TrainJob"), ("tfjob", tfjob, "TFJob")]
)
def test_known_backends_resolve_by_name_and_by_manifest_kind(taxi_config, name, module, kind):
    backend = jobs.backend_named(name)
    assert backend is module.BACKEND
    assert backend.kind == kind
    manifest = jobs.build_manifest(
        _multi_worker(taxi_config, name),
        name="taxi-trainer-abc",
        namespace="team-a",
        component_id="Trainer",
        invocation_uri="gs://bucket/root/Trainer/model_run/7/tfjob_invocation.json",
    )
    assert manifest["kind"] == kind
    assert jobs.backend_of(manifest) is backend


def test_unknown_backend_is_refused_naming_the_field():
    with pytest.raises(
        ConfigError,
        match=r"^kubeflow\.job_backend: expected one of \['trainjob', 'tfjob'\], got 'mpijob'$",
    ):
        jobs.backend_named("mpijob")


@pytest.mark.parametrize("manifest", [{"kind": "Deployment"}, {}])
def test_a_manifest_of_no_backend_is_refused(manifest):
    with pytest.raises(ValueError, match=r"^not a training job manifest: kind "):
        jobs.backend_of(manifest)


def test_backends_do_not_import_the_job_runner():
    # The registry imports the backends; a backend reaching back into `jobs`
    # would make the two a circle again.
    code = (
        "import sys\n"
        "import components.kubernetes.tfjob, components.kubernetes.trainjob\n"
        "print('components.kubernetes.jobs' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    ).stdout
    assert out.strip() == "False"


# A TFJob's restarts carry a marker but no count; a TrainJob's JobSet counts them.
@pytest.mark.parametrize(
    "previous, latest, seen, expected",
    [
        (Restart(), Restart(), 0, None),
        (Restart("t1", "restarting"), Restart("t1", "restarting"), 1, None),
        (Restart(), Restart("t1", "restarting"), 0, 1),
        (Restart("t1", "restarting"), Restart("t2", "restarting"), 1, 2),
        # A poll may miss restarts the controller counted: its count wins.
        (Restart("1", "recreated", 1), Restart("3", "recreated", 3), 1, 3),
    ],
    ids=["none", "same_marker", "first", "next_uncounted", "counted"],
)
def test_restarts_after_counts_only_a_new_marker(previous, latest, seen, expected):
    assert jobs.restarts_after(previous, latest, seen) == expected


def test_submission_hint_says_what_to_install_or_grant():
    backend = trainjob.BACKEND
    assert jobs.submission_hint(backend, 404) == f"; {backend.missing_hint}"
    assert jobs.submission_hint(backend, 403) == (
        "; the step's service account needs create/get/delete on "
        "trainjobs.trainer.kubeflow.org (kubeflow/trainjob-rbac.yaml)"
    )
    assert jobs.submission_hint(backend, 422) == ""
