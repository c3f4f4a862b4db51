"""Checks of a config against where it runs that need no TensorFlow.

The console script runs these before its heavy imports (TensorFlow and TFX
take about half a minute to import on a busy machine), so a wrong data path
or a local path in a Kubeflow config is reported at once. The runners call
the same functions, so the rules live here once.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from collections.abc import Sequence
from importlib import metadata

from components.config import ConfigError, PipelineConfig
from components.config.runtime import KUBEFLOW_DISPATCHER


def cluster_data_uri(config: PipelineConfig) -> str:
    """ExampleGen's input directory on the cluster: `kubeflow.data_uri`, else `data.path`.

    Raises:
      ConfigError: no data section, built-in data without `kubeflow.data_uri`,
        or a local path.
    """
    config.require_data("the tfxkit pipeline")
    uri = config.kubeflow.data_uri
    if not uri:
        if config.data.builtin:
            raise ConfigError(
                f"kubeflow.data_uri: data.builtin {config.data.builtin!r} lives on the machine that compiles; "
                "copy it to a bucket (kubeflow/README.md, step 1) and set kubeflow.data_uri to that directory"
            )
        uri = config.data.path
    if "://" not in uri:
        raise ConfigError(
            f"kubeflow.data_uri: {uri!r} is a local path, which pods on the cluster cannot read; "
            "use a directory URI such as gs://<bucket>/data/<name>"
        )
    return uri


def check_cluster_paths(config: PipelineConfig) -> None:
    """`kubeflow.pipeline_root` and `kubeflow.serving_dir` are URIs every pod can reach.

    Raises:
      ConfigError: naming the missing or local URI.
    """
    kf = config.kubeflow
    for name in ("pipeline_root", "serving_dir"):
        value = getattr(kf, name)
        if "://" not in value:
            got = f"got {value!r}" if value else "it is empty"
            raise ConfigError(
                f"kubeflow.{name}: expected a URI every pod can reach, such as gs://<bucket>/{config.name}/"
                f"{'root' if name == 'pipeline_root' else 'serving'} ({got})"
            )


def check_cluster_service(config: PipelineConfig) -> None:
    """No `ingestion.service.local_workers` on the cluster: those are a local run's processes.

    Raises:
      ConfigError: naming the field and `dispatcher: kubeflow`, the job's own service.
    """
    workers = config.ingestion.service.local_workers
    if workers:
        raise ConfigError(
            f"ingestion.service.local_workers: {workers} starts a tf.data service on the machine of a "
            "local run (tfxkit run), not on the cluster; for Kubeflow set local_workers: 0 and "
            "dispatcher: kubeflow (the training job starts the dispatcher and workers beside its "
            "trainers; kubeflow.placements.tfdata_workers.replicas sets how many workers)"
        )


def check_for_cluster(config: PipelineConfig) -> None:
    """Everything `tfxkit compile` can refuse before building the pipeline.

    Raises:
      ConfigError: naming the field.
    """
    check_cluster_service(config)
    cluster_data_uri(config)
    check_cluster_paths(config)


# Beam runners that run in this process or in local worker processes, with
# nothing to start or fetch.
_IN_PROCESS_RUNNERS = {
    "DirectRunner",
    "SwitchingDirectRunner",
    "BundleBasedDirectRunner",
    "FnApiRunner",
}
# Portable runners: they submit to a job server, which Beam otherwise starts
# from a jar it downloads at run time (unreachable here), then runs the SDK
# workers in Docker unless told otherwise.
_JOB_SERVER_JARS = {
    "FlinkRunner": "--flink_job_server_jar",
    "SparkRunner": "--spark_job_server_jar",
    "PortableRunner": None,
}
_WORKER_ENVIRONMENTS = ("LOOPBACK", "PROCESS", "EXTERNAL")


def _beam_options(args: Sequence[str]) -> dict[str, tuple[int, str]]:
    """`--name=value` and `--name value` forms: option -> (index in args, value)."""
    options: dict[str, tuple[int, str]] = {}
    for i, arg in enumerate(args):
        if not arg.startswith("--"):
            continue
        name, sep, value = arg.partition("=")
        if not sep and i + 1 < len(args) and not args[i + 1].startswith("--"):
            value = args[i + 1]
        options[name] = (i, value)
    return options


def check_beam_args(args: Sequence[str], field: str = "beam_args") -> None:
    """Refuses a Beam runner that cannot start from this machine, before any component runs.

    Beam would otherwise fail only in the first Beam component, after the
    pipeline started: a portable runner (Flink, Spark) tries to download its
    job server and to start Docker workers, Prism downloads its binary
    (`check_prism`), Dataflow needs its project, region and a bucket.

    Raises:
      ConfigError: naming `field[i]` (the argument), what was found and the fix.
    """
    options = _beam_options(args)
    if "--runner" not in options:
        return
    index, runner = options["--runner"]
    where = f"{field}[{index}]"
    name = runner.rsplit(".", 1)[-1]
    if name in _IN_PROCESS_RUNNERS:
        return
    if name == "PrismRunner":
        check_prism(options, where, field)
        return
    if name == "DaskRunner":
        raise ConfigError(
            f"{where}: --runner={runner}: Beam's DaskRunner gives TFX's components wrong output "
            "without failing (measured with Beam 2.72 on a real scheduler: tagged outputs mixed, "
            "finish_bundle output dropped, only the last sink computed, no translation of Read or "
            "Impulse, WindowInto ignored; CsvExampleGen 'succeeded' with 0 records); use the "
            "in-process runner (no --runner), --direct_running_mode=multi_processing, "
            "PrismRunner, FlinkRunner or DataflowRunner"
        )
    if name in _JOB_SERVER_JARS:
        jar_option = _JOB_SERVER_JARS[name]
        if "--job_endpoint" not in options:
            if jar_option is None:
                raise ConfigError(
                    f"{where}: --runner={runner} needs --job_endpoint=HOST:PORT of a running job server"
                )
            jar = options.get(jar_option, (None, ""))[1]
            if not jar:
                check_job_server_download(name, args, where, jar_option)
            elif not os.path.isfile(jar):
                raise ConfigError(f"{field}: {jar_option}: no such file {jar!r}")
            if shutil.which("java") is None:
                raise ConfigError(
                    f"{where}: --runner={runner} starts its job server with Java, and no `java` is "
                    "on PATH; install a JDK (17) or give --job_endpoint of a running job server"
                )
        environment = options.get("--environment_type", (None, "DOCKER"))[1].upper()
        if environment not in _WORKER_ENVIRONMENTS and shutil.which("docker") is None:
            raise ConfigError(
                f"{where}: --runner={runner} runs its SDK workers in Docker "
                f"(--environment_type={environment}), and no `docker` is on PATH; give "
                "--environment_type=LOOPBACK (workers in this process) or PROCESS / EXTERNAL"
            )
        return
    if name in ("DataflowRunner", "TestDataflowRunner"):
        missing = [o for o in ("--project", "--region", "--temp_location") if o not in options]
        if missing:
            raise ConfigError(
                f"{where}: --runner={runner} needs {', '.join(missing)}; give them in {field}"
            )
        return
    known = sorted(_IN_PROCESS_RUNNERS | set(_JOB_SERVER_JARS) | {"DataflowRunner", "PrismRunner"})
    raise ConfigError(f"{where}: unknown Beam runner {runner!r}; expected one of {known}")


def job_server_jar_url(runner: str, args: Sequence[str]) -> str:
    """The URL of the job-server jar Beam's FlinkRunner / SparkRunner downloads when given none,
    as Beam builds it (`FlinkJarJobServer.path_to_jar`, `SparkJarJobServer.path_to_jar`)."""
    from apache_beam.options.pipeline_options import FlinkRunnerOptions, PipelineOptions
    from apache_beam.utils.subprocess_server import JavaJarServer

    if runner == "FlinkRunner":
        version = PipelineOptions(list(args)).view_as(FlinkRunnerOptions).flink_version
        target = f":runners:flink:{version}:job-server:shadowJar"
    else:
        target = ":runners:spark:3:job-server:shadowJar"
    return JavaJarServer.path_to_beam_jar(target)


def check_job_server_download(
    runner: str, args: Sequence[str], where: str, jar_option: str
) -> None:
    """FlinkRunner / SparkRunner without a jar or endpoint: Beam downloads the job server's jar
    when the first Beam component starts. Passes when Beam's cache holds it or a HEAD of its
    URL answers within `REACH_TIMEOUT_SECONDS`; refuses otherwise, naming the jar and
    the two ways round it.

    Raises:
      ConfigError: naming `where`, the jar's URL and why it cannot be fetched.
    """
    from apache_beam.utils.subprocess_server import JavaJarServer

    url = job_server_jar_url(runner, args)
    cached = os.path.join(JavaJarServer.JAR_CACHE, os.path.basename(url))
    if os.path.isfile(url) or os.path.isfile(cached):
        return
    problem = reachable(url)
    if problem is None:
        return
    raise ConfigError(
        f"{where}: --runner={runner} would download its job server {url} when the first Beam "
        f"component starts, which this machine cannot do ({problem}); give "
        f"{jar_option}=<path of the job server jar> or --job_endpoint=HOST:PORT of a running "
        "job server"
    )


# Where Beam's PrismRunner downloads its binary (apache_beam/runners/portability/
# prism_runner.py, `PrismJobServer._construct_download_url`), and where it keeps
# the downloaded zip (`PrismJobServer.BIN_CACHE`), which it uses when present.
PRISM_DOWNLOAD_PREFIX = "https://github.com/apache/beam/releases/download/"
PRISM_CACHE = os.path.expanduser("~/.apache_beam/cache/prism/bin")
# Bounds the look at the download: long enough for a slow link to answer a
# HEAD, short enough that a machine without the internet hears it at once.
REACH_TIMEOUT_SECONDS = 3.0
# The Prism release to build (the Makefile's `make prism` builds the same): at v2.73.0 the
# Transform's sharded write failed in one of two runs here, its file sink's
# initialisation side input read empty (Beam issue 36563); v2.77.0 wrote what the
# in-process runner writes (tests/pipelines/test_prism.py).
PRISM_VERSION = "v2.77.0"
PRISM_BUILD = (
    f"GOFLAGS=-mod=mod go install github.com/apache/beam/sdks/v2/go/cmd/prism@{PRISM_VERSION}"
)
_ARCHES = {"amd64": "amd64", "x86_64": "amd64", "x86-64": "amd64", "x64": "amd64"}
_ARCHES.update(dict.fromkeys(("arm64", "aarch64_be", "aarch64", "armv8b", "armv8l"), "arm64"))


def prism_download_url(version: str | None = None) -> str | None:
    """The URL PrismRunner downloads Prism from without `--prism_location`, as Beam builds it.

    Args:
      version: Beam's release tag (`--prism_beam_version_override`); default:
        `v` + the installed apache-beam's version.

    Returns:
      The URL, or None where Beam downloads nothing (a development version,
      which it builds with Go, or a system or machine it has no binary for).
    """
    version = version or f"v{metadata.version('apache-beam')}"
    opsys, arch = platform.system().lower(), _ARCHES.get(platform.machine().lower())
    if ".dev" in version or opsys not in ("linux", "windows", "darwin") or arch is None:
        return None
    tag = "-RC".join(version.split("rc"))
    version = version.split("rc")[0]
    return f"{PRISM_DOWNLOAD_PREFIX}{tag}/apache_beam-{version}-prism-{opsys}-{arch}.zip"


def reachable(url: str, timeout: float = REACH_TIMEOUT_SECONDS) -> str | None:
    """None when a HEAD of `url` answers below 400 within `timeout` seconds, else why not.

    The proxies of the environment apply, as they do to Beam's download.
    """
    request = urllib.request.Request(url, method="HEAD")
    try:
        with urllib.request.build_opener().open(request, timeout=timeout) as response:
            status = response.status
    except urllib.error.HTTPError as e:
        return f"HTTP {e.code}"
    except (urllib.error.URLError, OSError, ValueError) as e:
        return str(getattr(e, "reason", None) or e)
    return None if status < 400 else f"HTTP {status}"


# What `go install` writes into a binary's build info for the module it built from.
_BEAM_MODULE = b"mod\tgithub.com/apache/beam/sdks/v2\t"


def prism_build_version(path: str) -> str | None:
    """The Beam release a Prism binary was built from (`v2.77.0`), read from the build
    info the Go toolchain embeds; None when the file holds none (not a Prism built from
    Beam's Go module)."""
    import mmap

    with open(path, "rb") as f:
        try:
            data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError:  # an empty file
            return None
        with data:
            start = data.find(_BEAM_MODULE)
            if start < 0:
                return None
            end = start + len(_BEAM_MODULE)
            version = data[end : end + 64].split(b"\t", 1)[0].split(b"\n", 1)[0]
    return version.decode("ascii", "replace") or None


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version.split("-")[0])[:3])


def _check_prism_version(location: str, at: str) -> None:
    """Refuses a binary that is not Beam's Prism, or a Prism older than `PRISM_VERSION`."""
    version = prism_build_version(location)
    if version is None:
        raise ConfigError(
            f"{at}: --prism_location: {location!r} is not a Prism binary (no Go build info of "
            f"github.com/apache/beam/sdks/v2 in it); build Prism with `{PRISM_BUILD}`"
        )
    if _release(version) < _release(PRISM_VERSION):
        raise ConfigError(
            f"{at}: --prism_location: {location!r} is Prism {version}, older than "
            f"{PRISM_VERSION}: at v2.73.0 a Transform's sharded write failed in one of two "
            f"runs (Beam issue 36563); build Prism with `{PRISM_BUILD}`"
        )


def check_prism(options: dict[str, tuple[int, str]], where: str, field: str) -> None:
    """PrismRunner has a Prism binary to start: `--prism_location`, or a download it can reach.

    Without `--prism_location` Beam downloads Prism's release zip when the
    first Beam component starts (ExampleGen), about 20 s into a run on a
    machine that cannot reach it; a cached download (Beam's `PRISM_CACHE`)
    or a HEAD of the URL answered within `REACH_TIMEOUT_SECONDS` lets
    the run go on. A local `--prism_location` must be an executable file or
    a zip of one (Beam unzips those); a URL is left to Beam.

    Raises:
      ConfigError: naming the argument, the flag and how to build Prism.
    """
    index, location = options.get("--prism_location", (None, ""))
    if location:
        at = f"{field}[{index}]"
        if urllib.parse.urlparse(location).scheme:
            return
        if not os.path.exists(location):
            raise ConfigError(
                f"{at}: --prism_location: no such file {location!r}; build Prism with "
                f"`{PRISM_BUILD}` and give the binary's path (by default $(go env GOPATH)/bin/prism)"
            )
        if not os.path.isfile(location) or not (
            os.access(location, os.X_OK) or zipfile.is_zipfile(location)
        ):
            raise ConfigError(
                f"{at}: --prism_location: {location!r} is not an executable file (nor a zip of "
                f"one); give the Prism binary (`{PRISM_BUILD}` builds it), or `chmod +x {location}`"
            )
        if not zipfile.is_zipfile(location):
            _check_prism_version(location, at)
        return
    version = options.get("--prism_beam_version_override", (None, ""))[1] or None
    url = prism_download_url(version)
    if url and os.path.isfile(os.path.join(PRISM_CACHE, os.path.basename(url))):
        return
    why = reachable(url) if url else "Beam has no Prism binary to download for this machine"
    if why is None:
        return
    raise ConfigError(
        f"{where}: --runner=PrismRunner without --prism_location downloads Prism from "
        f"{url or 'nowhere'} when the first Beam component starts, which this machine cannot do "
        f"({why}); build Prism with `{PRISM_BUILD}` and give "
        "--prism_location=<its path> (by default $(go env GOPATH)/bin/prism)"
    )


def check_service_ready(config: PipelineConfig) -> None:
    """The tf.data service a config names answers and has a worker that answers.

    Run before the first component, so a dispatcher that is down, or up with
    no worker, is reported in seconds rather than when the Trainer starts,
    after ExampleGen and Transform. Bounded by `connect_timeout_seconds` and
    `worker_wait_seconds`. The Kubeflow job's dispatcher is checked where it
    runs; a run's own service (`local_workers`) is started by the run.

    Raises:
      IngestionError: naming the dispatcher (and the workers it registered).
    """
    service = config.ingestion.service
    if not service.dispatcher or service.dispatcher == KUBEFLOW_DISPATCHER:
        return
    from components.data import service as tfdata_service  # imports TensorFlow

    address = tfdata_service.resolve_address(service)
    tfdata_service.check_reachable(address, service.connect_timeout_seconds)
    tfdata_service.wait_for_workers(address, service.worker_wait_seconds)
