"""`ingestion.service.local_workers`: a local run starts its own tf.data service and
stops it on every path (success, failure, SIGINT), leaving no server process.

Real processes on free ports; every wait is bounded. Whether a server is left is
checked by pid, over every process whose command line names the run's directory.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import yaml

from components.config import PipelineConfig, to_dict
from pipelines import local_runner, local_service
from testkit.reliability_cases import baseline_config
from testkit.tiny import tiny

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORKERS = 2
# Bounds: the servers' exit after the run (they get SIGTERM, then SIGKILL at
# 15 s); a run's start until its servers listen (TensorFlow imports on 2 busy
# cores); the interrupted run's exit.
GONE_TIMEOUT_S = 30
SERVICE_UP_TIMEOUT_S = 300
INTERRUPTED_EXIT_TIMEOUT_S = 120

pytestmark = pytest.mark.multiprocess


def service_pids(directory: str) -> list[int]:
    """Live `components.data.service` processes whose command line names `directory`."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read().decode(errors="replace")
            with open(f"/proc/{entry}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:  # gone meanwhile
            continue
        if "components.data.service" in cmdline and directory in cmdline and state != "Z":
            pids.append(int(entry))
    return pids


def assert_no_service_left(directory: str, pids=()) -> None:
    """Within `GONE_TIMEOUT_S`, no server of `directory` runs, and none of `pids`
    (any left are killed, then reported)."""
    deadline = time.monotonic() + GONE_TIMEOUT_S
    while True:
        left = set(service_pids(directory)) | {p for p in pids if _alive(p)}
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    for pid in left:  # this test's leak is not the next test's machine
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    assert not left, f"tf.data service processes left: {sorted(left)}"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def with_local_workers(config: PipelineConfig, workers: int = WORKERS) -> PipelineConfig:
    service = dataclasses.replace(config.ingestion.service, local_workers=workers)
    return dataclasses.replace(
        config, ingestion=dataclasses.replace(config.ingestion, service=service)
    )


@pytest.fixture(scope="module")
def tiny_config(tmp_path_factory, taxi_config) -> PipelineConfig:
    """The tiny taxi pipeline (`tiny_taxi_run`'s) with a local service of two workers."""
    work = str(tmp_path_factory.mktemp("local_service_data"))
    return with_local_workers(baseline_config(tiny(taxi_config), work))


@pytest.mark.e2e
def test_a_run_with_local_workers_trains_through_them_and_leaves_none(tmp_path, tiny_config):
    console = io.StringIO()
    out = str(tmp_path / "out")
    summary = local_runner.run(tiny_config, out, stream=console)

    assert summary["status"] == "succeeded" and summary["pushed_model"], summary
    record = summary["tfdata_service"]
    service_dir = os.path.join(out, local_service.SERVICE_DIR)
    assert record["workers"] == WORKERS and len(record["worker_addresses"]) == WORKERS
    assert record["stopped"] is True
    assert record["logs"] == [os.path.join(service_dir, "dispatcher.log")] + [
        os.path.join(service_dir, f"worker-{i}.log") for i in range(WORKERS)
    ]
    assert all(os.path.isfile(log) for log in record["logs"])
    with open(os.path.join(out, "summary.json")) as f:
        assert json.load(f)["tfdata_service"] == record
    # The Trainer read its training data through the started dispatcher.
    with open(summary["log"], errors="replace") as f:
        log = f.read()
    assert f"runs on the tf.data service at grpc://{record['dispatcher']}" in log
    text = console.getvalue()
    assert (
        f"tf.data service: started a dispatcher at {record['dispatcher']} and 2 worker(s)" in text
    )
    assert "tf.data service: stopped the dispatcher and 2 worker(s)" in text
    assert text.index("tf.data service: stopped") < text.index("Pipeline succeeded")
    assert_no_service_left(out, record["pids"])


def test_a_run_failing_after_its_service_started_leaves_none(tmp_path, tiny_config, monkeypatch):
    from tfx.orchestration.beam.beam_dag_runner import BeamDagRunner

    out = str(tmp_path / "out")
    seen = {}

    def fail(self, pipeline):
        # The servers run now: record them, then fail as a component would.
        seen["pids"] = service_pids(out)
        raise RuntimeError("a component failed")

    monkeypatch.setattr(BeamDagRunner, "run", fail)
    with pytest.raises(RuntimeError, match="a component failed"):
        local_runner.run(tiny_config, out, stream=io.StringIO())
    assert len(seen["pids"]) == 1 + WORKERS
    with open(os.path.join(out, "summary.json")) as f:
        summary = json.load(f)
    assert summary["status"] == "failed" and summary["tfdata_service"]["stopped"] is True
    assert sorted(summary["tfdata_service"]["pids"]) == sorted(seen["pids"])
    assert_no_service_left(out, seen["pids"])


@pytest.mark.parametrize("when", ["service up", "inside a Beam stage"])
def test_sigint_to_a_cli_run_stops_its_service(tmp_path, tiny_config, when):
    config_path = tmp_path / "tiny_taxi.yaml"
    config_path.write_text(yaml.safe_dump(to_dict(tiny_config)))
    out = str(tmp_path / "out")
    ready = [
        os.path.join(out, local_service.SERVICE_DIR, f"worker-{i}.log.address")
        for i in range(WORKERS)
    ]
    log = open(tmp_path / "cli.log", "wb")  # noqa: SIM115 - closed in finally
    child = subprocess.Popen(
        [sys.executable, "-m", "pipelines.cli", "run", "--config", str(config_path)]
        + ["--output", out],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": REPO},
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + SERVICE_UP_TIMEOUT_S
        while not all(os.path.exists(r) for r in ready):
            assert child.poll() is None, (tmp_path / "cli.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the run's tf.data workers did not start"
            time.sleep(0.2)
        pids = service_pids(out)
        assert len(pids) == 1 + WORKERS
        if when == "inside a Beam stage":
            # Beam wraps a KeyboardInterrupt raised in a step as a RuntimeError.
            while "> StatisticsGen started" not in (tmp_path / "cli.log").read_text():
                assert child.poll() is None, (tmp_path / "cli.log").read_text()[-3000:]
                assert time.monotonic() < deadline, "StatisticsGen did not start"
                time.sleep(0.05)
        child.send_signal(signal.SIGINT)
        code = child.wait(timeout=INTERRUPTED_EXIT_TIMEOUT_S)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        log.close()
    console = (tmp_path / "cli.log").read_text()
    assert code == 130, console[-3000:]
    assert "tfxkit: interrupted" in console
    assert "tf.data service: stopped the dispatcher and 2 worker(s)" in console
    assert_no_service_left(out, pids)
    with open(os.path.join(out, "summary.json")) as f:
        summary = json.load(f)
    assert summary["status"] == "failed" and "KeyboardInterrupt" in summary["error"]
    assert summary["tfdata_service"]["stopped"] is True


def test_servers_end_when_the_process_that_started_them_is_killed(tmp_path):
    # SIGKILL runs no cleanup: the kernel's parent-death signal ends them.
    directory = str(tmp_path / "service")
    script = (
        "import sys, time\n"
        "from pipelines.local_service import LocalService\n"
        "service = LocalService(sys.argv[1], workers=1)\n"
        "service.start()\n"
        "print('up', flush=True)\n"
        "time.sleep(600)\n"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", script, directory],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": REPO},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        # The first line comes once both servers listen (start is bounded).
        assert parent.stdout.readline() == "up\n"
        pids = service_pids(directory)
        assert len(pids) == 2
        parent.kill()
        parent.wait(timeout=GONE_TIMEOUT_S)
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        parent.stdout.close()
    assert_no_service_left(directory, pids)
