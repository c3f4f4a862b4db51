"""Runs killed part-way, and a concurrent run, against copies of a run that
already pushed a model (the `reliability_baseline` fixture)."""

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
from ml_metadata.proto import metadata_store_pb2

from pipelines import local_runner
from pipelines.summary import latest_run_executions, open_store
from testkit.reliability_cases import run_in_child, serving_versions

LOCK_WAIT_SECONDS = 120


@pytest.mark.e2e
@pytest.mark.multiprocess
def test_concurrent_run_on_same_root_is_refused_and_metadata_stays_intact(
    reliability_baseline, tmp_path
):
    baseline_dir, config = reliability_baseline
    out = str(tmp_path / "out")
    shutil.copytree(baseline_dir, out)
    before = serving_versions(local_runner.paths_for(config, out).serving_dir)
    # A second process holds the run lock, as a concurrently started run does
    # (the lock `local_runner.run` takes, imported without TensorFlow).
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                f"""
                import sys, time
                from pipelines.rundir import exclusive_run
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
    reliability_baseline, tmp_path, taxi_config
):
    baseline_dir, config = reliability_baseline
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
def test_trainer_killed_after_a_backup_resumes_on_rerun(reliability_baseline, tmp_path):
    baseline_dir, config = reliability_baseline
    # Enough steps that the Trainer is still running after its first backup:
    # the 550 steps after it take about 8 s on two idle cores (15 ms a step,
    # backups included) and took 14 s on busy ones; the watcher below looks
    # every 0.2 s. The re-run trains those steps again, so more only cost
    # time (3,000 steps took about 40 s longer).
    config = dataclasses.replace(
        config,
        train=dataclasses.replace(
            config.train, train_steps=600, steps_per_epoch=50, checkpoint_every_steps=50
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
