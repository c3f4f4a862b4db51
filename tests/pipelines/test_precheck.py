"""`pipelines.precheck`: a Beam runner that cannot start is refused before any
component runs, naming the argument; a config the cluster cannot run is refused
before compiling, naming the field."""

from __future__ import annotations

import contextlib
import http.server
import os
import threading
import zipfile
from collections.abc import Iterator

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


@contextlib.contextmanager
def _answering(found, asked: list | None = None) -> Iterator[str]:
    """An HTTP server on loopback answering a HEAD 200 where `found(path)`, else 404;
    yields its base URL and records each path asked in `asked`."""

    class Files(http.server.BaseHTTPRequestHandler):
        def do_HEAD(self):
            if asked is not None:
                asked.append(self.path)
            self.send_response(200 if found(self.path) else 404)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Files)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _no_cached_jar(runner: str, args=()) -> str:
    from apache_beam.utils.subprocess_server import JavaJarServer

    url = precheck.job_server_jar_url(runner, list(args))
    if os.path.isfile(os.path.join(JavaJarServer.JAR_CACHE, os.path.basename(url))):
        pytest.skip("Beam's cache holds the job server jar: the runner starts without a download")
    return url


@pytest.mark.parametrize(
    "runner, jar_option",
    [("FlinkRunner", "--flink_job_server_jar"), ("SparkRunner", "--spark_job_server_jar")],
)
def test_a_portable_runner_whose_job_server_cannot_be_fetched_is_refused_naming_the_jar(
    monkeypatch, runner, jar_option
):
    _unreachable(monkeypatch)
    url = _no_cached_jar(runner)
    assert url.startswith("https://repo.maven.apache.org/maven2/org/apache/beam/beam-runners-")
    with pytest.raises(ConfigError) as e:
        precheck.check_beam_args(["--direct_num_workers=1", f"--runner={runner}"])
    message = str(e.value)
    assert message.startswith(
        f"beam_args[1]: --runner={runner} would download its job server {url} when the first "
        "Beam component starts, which this machine cannot do ("
    )
    assert message.endswith(
        f"give {jar_option}=<path of the job server jar> or --job_endpoint=HOST:PORT of a "
        "running job server"
    )


def test_a_portable_runner_whose_job_server_can_be_fetched_passes(monkeypatch):
    """Where Beam's Maven repository answers (served here on loopback), Beam's own download
    goes ahead: nothing is refused."""
    from apache_beam.utils.subprocess_server import JavaJarServer

    wanted = []
    with _answering(lambda path: path.endswith(".jar"), wanted) as base:
        for name in ("https_proxy", "HTTPS_PROXY", "http_proxy", "HTTP_PROXY"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setattr(JavaJarServer, "MAVEN_CENTRAL_REPOSITORY", f"{base}/maven2")
        url = _no_cached_jar("FlinkRunner", ["--flink_version=1.19"])
        # The download check alone: a host without Java is refused after it, for Java.
        args = ["--runner=FlinkRunner", "--flink_version=1.19"]
        precheck.check_job_server_download(
            "FlinkRunner", args, "beam_args[0]", "--flink_job_server_jar"
        )
    assert wanted == [url.removeprefix(base)]
    assert "beam-runners-flink-1.19-job-server" in wanted[0]


@pytest.mark.parametrize(
    "runner", ["DaskRunner", "apache_beam.runners.dask.dask_runner.DaskRunner"]
)
def test_the_dask_runner_is_refused_naming_what_it_breaks(runner):
    with pytest.raises(ConfigError) as e:
        precheck.check_beam_args([f"--runner={runner}"])
    message = str(e.value)
    assert message.startswith(f"beam_args[0]: --runner={runner}: Beam's DaskRunner gives TFX's")
    for defect in ("tagged outputs mixed", "finish_bundle output dropped", "0 records"):
        assert defect in message


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


# A port on the loopback interface nothing listens on: a proxy there refuses
# every connection at once, as a machine without the internet would.
CLOSED_PROXY = "http://127.0.0.1:9"


def _unreachable(monkeypatch):
    """Every HTTP(S) request of this process goes to a proxy that refuses it."""
    for name in ("https_proxy", "HTTPS_PROXY", "http_proxy", "HTTP_PROXY"):
        monkeypatch.setenv(name, CLOSED_PROXY)
    for name in ("no_proxy", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)


def test_the_prism_url_is_the_one_beam_downloads():
    import platform

    from apache_beam.runners.portability.prism_runner import PrismJobServer
    from apache_beam.version import __version__ as beam_version

    for version in (f"v{beam_version}", "v2.66.0rc2"):
        assert precheck.prism_download_url(version) == PrismJobServer._construct_download_url(
            version, version, platform.system(), platform.machine()
        )
    assert precheck.prism_download_url() == precheck.prism_download_url(f"v{beam_version}")


def test_prism_without_its_location_is_refused_when_the_download_is_unreachable(monkeypatch):
    _unreachable(monkeypatch)
    url = precheck.prism_download_url()
    if os.path.isfile(os.path.join(precheck.PRISM_CACHE, os.path.basename(url))):
        pytest.skip("Beam's cache holds the Prism download: the runner starts without it")
    with pytest.raises(ConfigError) as e:
        precheck.check_beam_args(["--direct_num_workers=1", "--runner=PrismRunner"])
    message = str(e.value)
    assert message.startswith(
        f"beam_args[1]: --runner=PrismRunner without --prism_location downloads Prism from {url} "
        "when the first Beam component starts, which this machine cannot do ("
    )
    assert message.endswith(
        f"build Prism with `{precheck.PRISM_BUILD}` and give --prism_location=<its path> "
        "(by default $(go env GOPATH)/bin/prism)"
    )


def test_a_reachable_url_answers_and_a_missing_one_says_its_status():
    with _answering(lambda path: path == "/prism.zip") as base:
        assert precheck.reachable(f"{base}/prism.zip") is None
        assert precheck.reachable(f"{base}/other.zip") == "HTTP 404"


def test_a_prism_location_that_is_not_there_or_not_executable_is_named(tmp_path):
    missing = str(tmp_path / "prism")
    with pytest.raises(ConfigError) as e:
        precheck.check_beam_args(["--runner=PrismRunner", f"--prism_location={missing}"])
    assert str(e.value).startswith(
        f"beam_args[1]: --prism_location: no such file {missing!r}; build Prism with "
        f"`{precheck.PRISM_BUILD}`"
    )
    text = tmp_path / "prism.txt"
    text.write_text("not a binary")
    text.chmod(0o644)
    with pytest.raises(ConfigError) as e:
        precheck.check_beam_args(["--runner=PrismRunner", "--prism_location", str(text)])
    assert str(e.value).startswith(
        f"beam_args[1]: --prism_location: {str(text)!r} is not an executable file (nor a zip of one)"
    )
    assert f"chmod +x {text}" in str(e.value)


def _fake_prism(path, version: str | None) -> str:
    """An executable holding the build info `go install` writes for Beam's module at
    `version` (none: no build info), amid other bytes, as a real binary holds it."""
    info = b"" if version is None else b"mod\tgithub.com/apache/beam/sdks/v2\t" + version.encode()
    path.write_bytes(b"#!/bin/sh\n" + b"\0" * 4096 + info + b"\th1:abc=\n" + b"\0" * 4096)
    path.chmod(0o755)
    return str(path)


def test_an_executable_or_zipped_prism_passes_without_the_network(tmp_path, monkeypatch):
    _unreachable(monkeypatch)
    binary = _fake_prism(tmp_path / "prism", precheck.PRISM_VERSION)
    zipped = tmp_path / "prism.zip"
    with zipfile.ZipFile(zipped, "w") as z:
        z.write(binary, "prism")
    newer = _fake_prism(tmp_path / "prism-next", "v9.0.0")
    for location in (binary, str(zipped), newer):
        precheck.check_beam_args(["--runner=PrismRunner", f"--prism_location={location}"])
    assert precheck.prism_build_version(binary) == precheck.PRISM_VERSION


def test_a_prism_of_an_older_release_or_no_prism_at_all_is_refused_naming_the_build(tmp_path):
    older = _fake_prism(tmp_path / "prism-old", "v2.73.0")
    with pytest.raises(ConfigError) as refused:
        precheck.check_beam_args(["--runner=PrismRunner", f"--prism_location={older}"])
    assert str(refused.value) == (
        f"beam_args[1]: --prism_location: {older!r} is Prism v2.73.0, older than "
        f"{precheck.PRISM_VERSION}: at v2.73.0 a Transform's sharded write failed in one of two "
        f"runs (Beam issue 36563); build Prism with `{precheck.PRISM_BUILD}`"
    )
    other = _fake_prism(tmp_path / "not-prism", None)
    with pytest.raises(ConfigError, match=r"is not a Prism binary \(no Go build info of"):
        precheck.check_beam_args(["--runner=PrismRunner", f"--prism_location={other}"])
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    empty.chmod(0o755)
    assert precheck.prism_build_version(str(empty)) is None


def test_prism_with_a_missing_location_is_refused_before_any_component(tmp_path, taxi_config):
    import dataclasses
    import io
    import json

    from pipelines import local_runner
    from testkit.tiny import tiny

    missing = str(tmp_path / "bin" / "prism")
    config = dataclasses.replace(
        tiny(taxi_config), beam_args=("--runner=PrismRunner", f"--prism_location={missing}")
    )
    with pytest.raises(ConfigError, match=r"^beam_args\[1\]: --prism_location: no such file"):
        local_runner.run(config, str(tmp_path / "out"), stream=io.StringIO())
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["components"] == {}
    assert f"--prism_location: no such file {missing!r}" in summary["error"]
