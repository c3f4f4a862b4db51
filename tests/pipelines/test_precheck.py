"""`pipelines.precheck`: a Beam runner that cannot start is refused before any
component runs, naming the argument; a config the cluster cannot run is refused
before compiling, naming the field."""

from __future__ import annotations

import pytest

from components.config import ConfigError, from_dict, to_dict
from pipelines import precheck
from pipelines.configs import load_config


@pytest.mark.parametrize(
    "args",
    [
        (),
        ("--direct_num_workers=2",),
        ("--runner=DirectRunner", "--direct_running_mode=multi_processing"),
        ("--runner", "DirectRunner"),
        ("--runner=apache_beam.runners.direct.direct_runner.DirectRunner",),
        ("--runner=FlinkRunner", "--job_endpoint=localhost:8099", "--environment_type=LOOPBACK"),
        (
            "--runner=DataflowRunner",
            "--project=p",
            "--region=europe-west4",
            "--temp_location=gs://b/tmp",
        ),
    ],
)
def test_runners_that_can_start_pass(args):
    precheck.check_beam_args(list(args))


def test_a_portable_runner_without_a_job_server_is_refused_naming_the_argument():
    with pytest.raises(ConfigError) as e:
        precheck.check_beam_args(["--direct_num_workers=1", "--runner=FlinkRunner"])
    assert str(e.value) == (
        "beam_args[1]: --runner=FlinkRunner would download its job server at run time, which this "
        "machine cannot reach; give --flink_job_server_jar=<path of the job server jar> or "
        "--job_endpoint=HOST:PORT of a running job server"
    )


def test_a_job_server_jar_that_is_not_there_is_named(tmp_path):
    missing = str(tmp_path / "beam-runners-spark-job-server.jar")
    with pytest.raises(ConfigError, match=r"^beam_args: --spark_job_server_jar: no such file"):
        precheck.check_beam_args(["--runner=SparkRunner", f"--spark_job_server_jar={missing}"])


def test_docker_workers_without_docker_are_refused(tmp_path, monkeypatch):
    jar = tmp_path / "job-server.jar"
    jar.write_bytes(b"")
    real_which = precheck.shutil.which
    monkeypatch.setattr(
        precheck.shutil, "which", lambda name: None if name == "docker" else real_which(name)
    )
    if real_which("java") is None:
        pytest.skip("needs java on PATH to reach the worker check")
    with pytest.raises(ConfigError, match=r"--environment_type=DOCKER.*no `docker` is on PATH"):
        precheck.check_beam_args(["--runner=FlinkRunner", f"--flink_job_server_jar={jar}"])


def test_dataflow_without_its_settings_is_refused_naming_them():
    with pytest.raises(
        ConfigError,
        match=r"^beam_args\[0\]: --runner=DataflowRunner needs --region, --temp_location",
    ):
        precheck.check_beam_args(["--runner=DataflowRunner", "--project=p"])


def test_an_unknown_runner_is_refused():
    with pytest.raises(ConfigError, match=r"^beam_args\[0\]: unknown Beam runner 'FlinkRuner'"):
        precheck.check_beam_args(["--runner=FlinkRuner"])


def test_local_workers_are_refused_for_kubeflow_naming_the_field_and_the_fix():
    data = to_dict(load_config("taxi"))
    data["ingestion"]["service"] = {"local_workers": 1}
    with pytest.raises(ConfigError) as e:
        precheck.check_for_cluster(from_dict(data))
    assert str(e.value).startswith(
        "ingestion.service.local_workers: 1 starts a tf.data service on the machine of a local run"
    )
    assert "set local_workers: 0 and dispatcher: kubeflow" in str(e.value)


@pytest.mark.multiprocess
def test_a_dispatcher_without_workers_is_refused_before_any_component(tmp_path, taxi_config):
    import dataclasses
    import json

    from components.data.layout import IngestionError
    from pipelines import local_runner
    from pipelines.rundir import INPUT_CHECK_STAGE
    from testkit.data_service import LocalService
    from testkit.tiny import tiny

    config = tiny(taxi_config)
    with LocalService(str(tmp_path / "service"), workers=0) as service:
        ingestion = dataclasses.replace(
            config.ingestion,
            deterministic=False,
            service=dataclasses.replace(
                config.ingestion.service, dispatcher=service.address, worker_wait_seconds=2
            ),
        )
        config = dataclasses.replace(config, ingestion=ingestion)
        with pytest.raises(IngestionError, match="has no worker that answers after 2 s"):
            local_runner.run(config, str(tmp_path / "out"), runner="beam")
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["pushed_model"] is None
    assert summary["stage"] == INPUT_CHECK_STAGE and summary["components"] == {}
    assert f"grpc://{service.address} has no worker" in summary["error"]
