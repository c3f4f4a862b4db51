"""Bad inputs against a pipeline that already pushed a model (see reliability_cases)."""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import tensorflow as tf
from ml_metadata.proto import metadata_store_pb2

from benchmarks import full_disk as full_disk_module
from benchmarks.full_disk import FullDiskUnavailable, full_disk
from benchmarks.reliability_cases import (
    CASES,
    Case,
    CaseUnavailable,
    baseline_config,
    read_taxi_rows,
    run_case,
    run_in_child,
    serving_versions,
    taxi_serving_example,
)
from benchmarks.tiny import tiny
from pipelines import local_runner
from pipelines.summary import latest_run_executions, open_store

LOCK_WAIT_SECONDS = 120


@pytest.fixture(scope="module")
def baseline(tmp_path_factory, taxi_config):
    """A finished run with one pushed model; each case runs against a copy."""
    work = str(tmp_path_factory.mktemp("baseline"))
    config = baseline_config(tiny(taxi_config), work)
    out = os.path.join(work, "out")
    summary = local_runner.run(config, out)
    assert summary["pushed_model"], summary
    return out, config


@pytest.mark.e2e
@pytest.mark.parametrize(
    "case",
    # A case with its own `execute` starts processes (a child run, the full disk's helper).
    [pytest.param(c, marks=[pytest.mark.multiprocess] if c.execute else []) for c in CASES],
    ids=[c.name for c in CASES],
)
def test_bad_input_behaves_as_documented(case, baseline, tmp_path):
    baseline_dir, config = baseline
    result = run_case(case, baseline_dir, str(tmp_path), config)
    if result.skipped:
        pytest.skip(f"{case.name}: {result.skipped}")
    assert result.wrongly_pushed == 0, result
    assert result.lost_models == 0, result
    assert result.as_documented, result


@pytest.mark.e2e
@pytest.mark.multiprocess
def test_concurrent_run_on_same_root_is_refused_and_metadata_stays_intact(baseline, tmp_path):
    baseline_dir, config = baseline
    out = str(tmp_path / "out")
    shutil.copytree(baseline_dir, out)
    before = serving_versions(local_runner.paths_for(config, out).serving_dir)
    # A second process holds the run lock, as a concurrently started run does.
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                f"""
                import sys, time
                from pipelines.local_runner import exclusive_run
                with exclusive_run({out!r}):
                    print("locked", flush=True)
                    time.sleep({LOCK_WAIT_SECONDS})
                """
            ),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(
            local_runner.ConcurrentRunError,
            match=rf"another tfxkit run \(pid {holder.pid}\) is using {out}",
        ):
            local_runner.run(config, out)
    finally:
        holder.kill()
        holder.wait(timeout=LOCK_WAIT_SECONDS)
    # The refused run touched nothing; once the holder is gone, runs work again.
    assert serving_versions(local_runner.paths_for(config, out).serving_dir) == before
    summary = local_runner.run(config, out)
    assert summary["status"] == "succeeded"


@pytest.mark.e2e
@pytest.mark.multiprocess
def test_transform_killed_mid_run_then_rerun_consumes_no_partial_artifact(
    baseline, tmp_path, taxi_config
):
    baseline_dir, config = baseline
    # A changed Transform config so Transform really executes (no cache hit);
    # the components before it are served from the copied run's cache.
    config = dataclasses.replace(
        config, transform=dataclasses.replace(config.transform, compression="none")
    )
    out = str(tmp_path / "out")
    shutil.copytree(baseline_dir, out)
    serving = local_runner.paths_for(config, out).serving_dir
    before = serving_versions(serving)
    # Killed once Transform's execution has created its output directory,
    # i.e. while its executor (the Beam job) runs.
    outcome, detail = run_in_child(config, out, kill_in=("Transform", "transformed_examples"))
    assert outcome == "killed", detail

    store = open_store(os.path.join(out, "metadata.sqlite"))
    killed = latest_run_executions(store, config.name)["Transform"]
    assert killed.last_known_state == metadata_store_pb2.Execution.RUNNING
    assert serving_versions(serving) == before

    _assert_rerun_recomputes_transform(config, out, killed.id)


def _assert_rerun_recomputes_transform(config, out, broken_id):
    """A re-run succeeds, and its Trainer reads only what a new, completed
    Transform execution published, never execution `broken_id`'s output."""
    summary = local_runner.run(config, out)
    assert summary["status"] == "succeeded" and summary["pushed_model"]
    store = open_store(os.path.join(out, "metadata.sqlite"))
    executions = latest_run_executions(store, config.name)
    transform, trainer = executions["Transform"], executions["Trainer"]
    assert transform.id != broken_id
    assert transform.last_known_state == metadata_store_pb2.Execution.COMPLETE
    events = store.get_events_by_execution_ids([trainer.id])
    inputs = {e.artifact_id for e in events if e.type == metadata_store_pb2.Event.INPUT}
    producers = {
        e.execution_id
        for e in store.get_events_by_artifact_ids(list(inputs))
        if e.type == metadata_store_pb2.Event.OUTPUT
    }
    assert broken_id not in producers
    assert transform.id in producers


class _Capture(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


@pytest.mark.e2e
@pytest.mark.multiprocess
def test_trainer_killed_after_a_backup_resumes_on_rerun(baseline, tmp_path):
    baseline_dir, config = baseline
    # Enough steps that the Trainer is still running after its first backup.
    config = dataclasses.replace(
        config,
        train=dataclasses.replace(
            config.train, train_steps=3000, steps_per_epoch=50, checkpoint_every_steps=50
        ),
    )
    # The copied run's cache serves everything before the Trainer.
    out = str(tmp_path / "out")
    shutil.copytree(baseline_dir, out)
    serving = local_runner.paths_for(config, out).serving_dir
    before = serving_versions(serving)
    script = textwrap.dedent(
        f"""
        from components.config import PipelineConfig
        from pipelines import local_runner
        local_runner.run(PipelineConfig.from_json({config.to_json()!r}), {out!r})
        """
    )
    backups = os.path.join(out, "pipeline_root", "Trainer", "backups")
    proc = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None:
            if any("checkpoint" in files for _, _, files in os.walk(backups)):
                break
            time.sleep(0.2)
        assert proc.poll() is None, "the run ended before the Trainer's first backup"
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=60)
    assert serving_versions(serving) == before

    capture = _Capture()
    logging.getLogger("absl").addHandler(capture)
    try:
        summary = local_runner.run(config, out)
    finally:
        logging.getLogger("absl").removeHandler(capture)
    assert summary["status"] == "succeeded" and summary["pushed_model"]
    resumed = [m for m in capture.messages if "resumed from the backup" in m]
    assert resumed, "the re-run trained from step 0"
    step = int(resumed[0].rsplit(" ", 1)[-1])
    assert step > 0
    # The backup is removed once the model is exported.
    assert not any("checkpoint" in files for _, _, files in os.walk(backups))


@pytest.mark.e2e
def test_serving_input_types_follow_the_configured_kinds(baseline):
    # trip_seconds is `kind: float` but every value in the CSV is a whole
    # number, which CSV type inference alone reads as int64.
    baseline_dir, config = baseline
    _, rows = read_taxi_rows(1)
    assert rows[0]["trip_seconds"].isdigit()
    versions = serving_versions(local_runner.paths_for(config, baseline_dir).serving_dir)
    model_dir = os.path.join(
        local_runner.paths_for(config, baseline_dir).serving_dir, max(versions)
    )
    serve = tf.saved_model.load(model_dir).signatures["serving_default"]
    example = taxi_serving_example(config)
    assert example.features.feature["trip_seconds"].float_list.value
    # No excluded column (tips, trip_start_timestamp) is part of the serving contract either.
    probabilities = serve(examples=tf.constant([example.SerializeToString()]))["probabilities"]
    assert probabilities.shape == (1, config.data.label.num_classes)


def test_full_disk_refuses_writes_past_its_margin_and_leaves_nothing_mounted(tmp_path):
    directory = tmp_path / "root"
    directory.mkdir()
    (directory / "kept.txt").write_text("before")
    work = tmp_path / "work"
    work.mkdir()
    try:
        with full_disk(str(directory), 64, str(work)) as size_kib:
            assert (directory / "kept.txt").read_text() == "before"
            with pytest.raises(OSError, match="No space left on device"):
                with open(directory / "big", "wb") as f:
                    f.write(b"x" * (size_kib + 64) * 1024)
    except FullDiskUnavailable as e:
        pytest.skip(str(e))
    # Back on the host's disk, with what the writer left; nothing mounted here.
    assert directory.is_dir() and not directory.is_symlink()
    assert (directory / "kept.txt").read_text() == "before"
    assert 0 < (directory / "big").stat().st_size < (size_kib + 64) * 1024
    with open("/proc/self/mounts") as f:
        assert str(work) not in f.read()
    assert os.listdir(work) == []


@pytest.mark.parametrize(
    "command, fstype, reason",
    [
        (["/nonexistent/unshare"], "tmpfs", r"cannot start '/nonexistent/unshare'"),
        # Mounting refused (as without user namespaces): an unknown file system type.
        (
            None,
            "tfxkit-no-such-fs",
            r"`unshare[^`]*` then `mount -t tfxkit-no-such-fs` \(a private mount namespace\) "
            r"failed \(exit \d+\): .+",
        ),
    ],
    ids=["no_unshare", "mount_refused"],
)
def test_full_disk_unavailable_names_what_failed_and_changes_nothing(
    tmp_path, monkeypatch, command, fstype, reason
):
    if command is not None:
        monkeypatch.setattr(full_disk_module, "namespace_command", lambda: command)
    monkeypatch.setattr(full_disk_module, "FSTYPE", fstype)
    directory = tmp_path / "root"
    directory.mkdir()
    (directory / "kept.txt").write_text("before")
    with pytest.raises(FullDiskUnavailable, match=reason):
        with full_disk(str(directory), 64, str(tmp_path)):
            pytest.fail("the body ran without a file system")
    assert (directory / "kept.txt").read_text() == "before"


def test_a_case_this_host_cannot_set_up_is_reported_skipped(tmp_path, taxi_config):
    def cannot(config, out):
        raise CaseUnavailable("needs a size-limited file system: mount refused")

    baseline_dir = tmp_path / "baseline"
    baseline_dir.mkdir()
    case = Case("x", "x", "fails", "x", "x", lambda work, base: base, execute=cannot)
    result = run_case(case, str(baseline_dir), str(tmp_path / "work"), taxi_config)
    assert result.skipped == "needs a size-limited file system: mount refused"
    assert not result.as_documented
    assert (result.wrongly_pushed, result.lost_models) == (0, 0)
