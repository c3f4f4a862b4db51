"""Training clusters of real processes on loopback, whose tasks can be killed and restarted.

A `Launcher` imports TensorFlow and the Trainer once and forks each `Task` of a cluster
from it; a task runs the product's training task with step marks and short coordination
timeouts added, and every wait (`Task.wait`, `wait_for`) has a deadline.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Bound on the launcher's imports (TensorFlow, TFT, the Trainer) on 2 busy cores.
LAUNCHER_START_TIMEOUT_S = 180
# How long a task held at a step waits for its go file (or its kill).
HOLD_TIMEOUT_S = 120
# Tasks see no GPU: the clusters here are CPU processes on one host.
CPU_ONLY = {"CUDA_VISIBLE_DEVICES": ""}


def free_cluster(workers: int, ps: int = 0, chief: bool = False) -> dict[str, list[str]]:
    """A `TF_CONFIG` cluster of loopback addresses on free ports."""
    import portpicker

    def addresses(n: int) -> list[str]:
        return [f"127.0.0.1:{portpicker.pick_unused_port()}" for _ in range(n)]

    cluster = {"worker": addresses(workers)}
    if chief:
        cluster["chief"] = addresses(1)
    if ps:
        cluster["ps"] = addresses(ps)
    return cluster


def tf_config(cluster: dict, task_type: str, index: int = 0) -> str:
    return json.dumps({"cluster": cluster, "task": {"type": task_type, "index": index}})


def wait_for(condition: Callable[[], bool], timeout: float, what: str, every: float = 0.05):
    """Polls `condition` until it holds; `TimeoutError` naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout:.0f} s")
        time.sleep(every)


# --------------------------------------------------------------------------- #
# The harness side
# --------------------------------------------------------------------------- #


@dataclasses.dataclass
class Task:
    """One forked task: its pid, its files and its exit code once reaped."""

    name: str
    pid: int
    workdir: str
    started: float

    def path(self, suffix: str) -> str:
        return os.path.join(self.workdir, f"{self.name}.{suffix}")

    @property
    def log(self) -> str:
        return self.path("log")

    def _exit(self) -> dict:
        try:
            with open(self.path("exit")) as f:
                return json.load(f)
        except (OSError, ValueError):
            return {}

    def poll(self) -> int | None:
        """The exit code (negative: killed by that signal), or None while it runs."""
        return self._exit().get("code")

    @property
    def cpu_s(self) -> float | None:
        """CPU seconds the task used (user + system), once it exited."""
        return self._exit().get("cpu_s")

    def wait(self, timeout: float) -> int:
        wait_for(lambda: self.poll() is not None, timeout, f"task {self.name} to exit")
        return self.poll()

    def kill(self) -> None:
        """SIGKILL (a pod evicted or OOM-killed gets no chance to clean up either)."""
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)

    def reached(self, step: int) -> bool:
        return os.path.exists(self.path(f"at{step}"))

    def mark(self, step: int) -> dict:
        """What the task wrote when it marked `step`: `time` (`time.time()`) and
        `iterations` (its optimizer's real count then; see `_step_marks`)."""
        with open(self.path(f"at{step}")) as f:
            return json.load(f)

    def mark_time(self, step: int) -> float:
        return self.mark(step)["time"]

    def in_backup(self, nth: int) -> bool:
        """Whether the task is (or was) held inside its `nth` backup write."""
        return os.path.exists(self.path(f"inbackup{nth}"))

    def backup_write(self, nth: int) -> dict:
        """What the task wrote when held inside its `nth` backup write: `time`, and
        `save_path` (the checkpoint being written)."""
        with open(self.path(f"inbackup{nth}")) as f:
            return json.load(f)

    def marks(self) -> list[int]:
        """The steps this task marked."""
        prefix = f"{self.name}.at"
        return sorted(
            int(f[len(prefix) :])
            for f in os.listdir(self.workdir)
            if f.startswith(prefix) and f[len(prefix) :].isdigit()
        )

    def go(self, step: int) -> None:
        """Releases the task held at `step`."""
        with open(self.path(f"go{step}"), "w") as f:
            f.write("go")

    def result(self) -> dict:
        try:
            with open(self.path("result.json")) as f:
                return json.load(f)
        except (OSError, ValueError):
            return {}

    def tail(self, chars: int = 3000) -> str:
        try:
            with open(self.log, errors="replace") as f:
                return f.read()[-chars:]
        except OSError as e:
            return f"<no log: {e}>"


class Launcher:
    """The launcher process and the tasks it forks (see the module docstring).

    Use as a context manager: leaving it kills the launcher's whole process
    group, so no task outlives the block, whatever happened in it. The
    launcher imports in the background: the first `start` waits for it
    (bounded), so the caller can prepare data meanwhile.
    """

    def __init__(self, workdir: str):
        self.workdir = workdir
        self.tasks: list[Task] = []
        # Scenarios may run side by side: one request and its reply at a time,
        # and each thread's `scope` holds the tasks that thread started.
        self._lock = threading.Lock()
        self._scopes = threading.local()
        os.makedirs(workdir, exist_ok=True)
        self._stderr = open(os.path.join(workdir, "launcher.log"), "w")
        self._process = subprocess.Popen(
            [sys.executable, "-m", "testkit.local_cluster", workdir],
            cwd=REPO_ROOT,
            env={**os.environ, **CPU_ONLY, "PYTHONPATH": REPO_ROOT},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
            # Its own process group, which every forked task inherits.
            start_new_session=True,
        )
        self._ready = False

    def _reply(self, timeout: float) -> dict:
        ready, _, _ = select.select([self._process.stdout], [], [], timeout)
        line = self._process.stdout.readline() if ready else ""
        if not line:
            raise RuntimeError(
                f"launcher: no reply within {timeout:.0f} s (exit {self._process.poll()}); "
                f"see {self._stderr.name}"
            )
        return json.loads(line)

    def start(self, name: str, job: dict) -> Task:
        """Forks task `name` running `job` (see `run_task`)."""
        for suffix in ("exit", "result.json", "log"):
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.path.join(self.workdir, f"{name}.{suffix}"))
        with self._lock:
            if not self._ready:
                self._reply(LAUNCHER_START_TIMEOUT_S)
                self._ready = True
            self._process.stdin.write(json.dumps({"name": name, "job": job}) + "\n")
            self._process.stdin.flush()
            reply = self._reply(30)
            task = Task(name, reply["pid"], self.workdir, time.monotonic())
            self.tasks.append(task)
        for started in getattr(self._scopes, "stack", []):
            started.append(task)
        return task

    @contextlib.contextmanager
    def scope(self) -> Iterator[list[Task]]:
        """SIGKILLs every task this thread started in the block that still runs when it ends."""
        started: list[Task] = []
        stack = self._scopes.__dict__.setdefault("stack", [])
        stack.append(started)
        try:
            yield started
        finally:
            stack.remove(started)
            for task in started:
                task.kill()
            for task in started:
                with contextlib.suppress(TimeoutError):
                    task.wait(30)

    def penguins(self, out_dir: str, timeout: float = LAUNCHER_START_TIMEOUT_S):
        """The penguins training inputs (`testkit.penguins`), written by a task."""
        from testkit import penguins

        task = self.start("penguins", {"kind": "penguins", "out_dir": out_dir})
        if task.wait(timeout) != 0:
            raise RuntimeError(f"writing the penguins inputs failed:\n{task.tail()}")
        fields = task.result()
        return penguins.Materialized(
            fields["transform_output"], tuple(fields["train_files"]), tuple(fields["eval_files"])
        )

    def close(self) -> None:
        """Kills the launcher and every task it forked (one process group)."""
        if self._process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._process.wait(timeout=30)
        self._stderr.close()

    def __enter__(self) -> Launcher:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# --------------------------------------------------------------------------- #
# The launcher process
# --------------------------------------------------------------------------- #


def _serve(workdir: str) -> None:
    """Imports once, then forks one task per request line; reaps them into `<name>.exit`."""
    from absl import logging

    import components.trainer.run_fn  # noqa: F401 - imported once, before any fork
    import components.training.task  # noqa: F401

    logging.set_verbosity(logging.INFO)
    print(json.dumps({"ready": True}), flush=True)
    names: dict[int, str] = {}
    while True:
        ready, _, _ = select.select([sys.stdin], [], [], 0.1)
        if ready:
            line = sys.stdin.readline()
            if not line:
                # The harness is gone: take every task with it.
                os.killpg(os.getpgrp(), signal.SIGKILL)
            request = json.loads(line)
            pid = os.fork()
            if pid == 0:
                _child(workdir, request["name"], request["job"])
            names[pid] = request["name"]
            print(json.dumps({"pid": pid}), flush=True)
        while names:
            pid, status, usage = os.wait4(-1, os.WNOHANG)
            if pid == 0:
                break
            path = os.path.join(workdir, f"{names.pop(pid)}.exit")
            with open(path + ".tmp", "w") as f:
                json.dump(
                    {
                        "code": os.waitstatus_to_exitcode(status),
                        "cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
                    },
                    f,
                )
            os.replace(path + ".tmp", path)


def _child(workdir: str, name: str, job: dict) -> None:
    code = 1
    try:
        log = os.open(os.path.join(workdir, f"{name}.log"), os.O_WRONLY | os.O_CREAT, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        sys.stdin.close()
        if job.get("netns"):
            # On a host of its own (`testkit.netns`), before any connection is made.
            from testkit import netns

            netns.enter(job["netns"])
        os.environ.update(job.get("env", {}))
        result = run_task(job, lambda suffix: os.path.join(workdir, f"{name}.{suffix}"))
        with open(os.path.join(workdir, f"{name}.result.json"), "w") as f:
            json.dump(result, f)
        # A task whose training failed exits as the Trainer would, with status 1.
        code = 1 if "error" in result else 0
    except BaseException:  # noqa: BLE001 - the log says why; the exit code says that it did
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def run_task(job: dict, path: Callable[[str], str]) -> dict:
    """One task of a training cluster, as the Trainer runs it (TF_CONFIG already set).

    A job of kind `penguins` instead writes the penguins training inputs
    (`testkit.penguins.materialize`) to `out_dir`: TensorFlow Transform is
    imported already, so that takes seconds.

    Args:
      job: `config` (the pipeline config JSON), `inputs` (`TrainingInputs`
        fields), optional `netns` (the network namespace the task runs in,
        `testkit.netns`), `coordination` (`heartbeat_timeout_s`,
        `register_timeout_s`), `marks` (steps to mark), `hold` (steps to
        hold at until released) and `hold_in_backup` (hold inside this
        task's n-th backup write, see `_hold_in_backup`).
      path: Maps a suffix to this task's file.

    Returns:
      What the task did: its role, where training started and how many
      steps it ran, the final step, an error, whether it is the chief.
    """
    if job.get("kind") == "penguins":
        from testkit import penguins

        data = penguins.materialize(penguins.penguins_config(), job["out_dir"])
        return dataclasses.asdict(data)
    import numpy as np
    import tensorflow as tf
    from tensorflow.python.eager import context

    from components.config import PipelineConfig
    from components.trainer import run_fn
    from components.training import fit as training
    from components.training import task as task_lib

    # The coordinator's INFO lines say when a lost worker has been recovered.
    tf.get_logger().setLevel("INFO")
    coordination = job.get("coordination")
    if coordination:
        _configure_coordination(context, coordination)
    config = PipelineConfig.from_json(job["config"])
    trainer = task_lib.start_for(config, "Trainer")
    if trainer is None:
        return {"role": "server"}
    choice = trainer.choice
    probe = _step_marks(
        job.get("marks", ()), job.get("hold", ()), path, per_epoch=choice.uses_coordinator
    )
    out = {"role": "trainer", "is_chief": choice.is_chief}
    if job.get("hold_in_backup"):
        _hold_in_backup(job["hold_in_backup"], path)
    inputs = training.TrainingInputs(**job["inputs"])
    try:
        if job.get("export", True):
            model, _ = run_fn.run(trainer, inputs, callbacks=[probe])
        else:
            model, _ = trainer.fit(inputs, teacher_builder(config, inputs), callbacks=[probe])
    except Exception as e:  # noqa: BLE001 - reported to the harness, which asserts on it
        import traceback

        traceback.print_exc()
        out["error"] = f"{type(e).__name__}: {e}"
        out.update(start_step=probe.start_step, steps_run=probe.steps_run)
        return out
    np.savez(path("weights.npz"), **{v.name: v.numpy() for v in model.trainable_weights})
    out.update(
        start_step=probe.start_step,
        steps_run=probe.steps_run,
        iterations=int(model.optimizer.iterations.numpy()),
    )
    return out


def teacher_builder(config, inputs):
    """`build_and_compile` of the teacher as `run_fn.run` builds it (tests, benchmarks)."""
    import tensorflow_transform as tft

    from components.training import fit as training

    def build_and_compile():
        tft_output = tft.TFTransformOutput(inputs.transform_output)
        model = training.build_model(config, tft_output, config.teacher, "teacher")
        training.compile_classifier(model, config, inputs.train_steps)
        return model

    return build_and_compile


def _configure_coordination(context, settings: dict) -> None:
    """What MultiWorkerMirroredStrategy configures itself, with test-sized timeouts."""
    from components.compat.stack import coordination_config_pb2

    cluster = json.loads(os.environ["TF_CONFIG"])["cluster"]
    jobs = [
        coordination_config_pb2.CoordinatedJob(name=job, num_tasks=len(cluster[job]))
        for job in ("chief", "worker")
        if job in cluster
    ]
    leader = "/job:chief/replica:0/task:0" if "chief" in cluster else "/job:worker/replica:0/task:0"
    context.context().configure_coordination_service(
        service_type="standalone",
        service_leader=leader,
        # 0: TensorFlow's default (10 s without a heartbeat, an hour to register).
        heartbeat_timeout_in_ms=int(settings.get("heartbeat_timeout_s", 0) * 1000),
        cluster_register_timeout_in_ms=int(settings.get("register_timeout_s", 0) * 1000),
        coordinated_jobs=jobs,
    )


def _write_mark(path: str, mark: dict) -> None:
    """Writes a mark whole (a temporary file renamed into place): the harness reads
    it as soon as the name exists."""
    with open(path + ".tmp", "w") as f:
        json.dump(mark, f)
    os.replace(path + ".tmp", path)


def _hold_in_backup(nth: int, path: Callable[[str], str]) -> None:
    """Holds this task inside its `nth` backup write, for a kill to land there.

    The hold is a write callback of the backup's `tf.train.CheckpointManager.save`:
    the checkpoint's data and index files are written, the directory's
    `checkpoint` state file does not name them yet, and the older checkpoint
    is not yet deleted. The task marks `inbackup<nth>` (its time) and waits
    for its kill (or `go` file `goinbackup<nth>`).
    """
    from tensorflow.python.checkpoint import checkpoint_management, checkpoint_options

    save = checkpoint_management.CheckpointManager.save
    count = {"saves": 0}

    def hold(save_path: str) -> None:
        _write_mark(path(f"inbackup{nth}"), {"time": time.time(), "save_path": save_path})
        deadline = time.monotonic() + HOLD_TIMEOUT_S
        while not os.path.exists(path(f"goinbackup{nth}")):
            if time.monotonic() > deadline:
                raise TimeoutError(f"held in backup write {nth} for {HOLD_TIMEOUT_S} s")
            time.sleep(0.02)

    def save_holding(self, checkpoint_number=None, check_interval=True, options=None):
        if "backup" in str(self.directory):
            count["saves"] += 1
            if count["saves"] == nth:
                # Our callback first: the manager appends its own (the state file) after it.
                options = checkpoint_options.CheckpointOptions(experimental_write_callbacks=[hold])
        return save(self, checkpoint_number, check_interval, options)

    checkpoint_management.CheckpointManager.save = save_holding


def _step_marks(
    marks: Sequence[int], hold: Sequence[int], path: Callable[[str], str], per_epoch: bool
):
    """A Keras callback that marks (and holds at) steps; at epoch ends only when `per_epoch`.

    Keras runs no batch-level callback under the parameter-server strategy,
    so there marks fall on epoch ends (the backup interval, see
    `training.fit`), named by the epoch's nominal last step (epochs times
    steps per epoch): a worker lost mid-step can have its step applied
    twice (the coordinator runs it again elsewhere), so the optimizer's
    count may run ahead of it. Each mark holds the real count.
    """
    import tf_keras as keras

    marked, held = set(marks) | set(hold), set(hold)

    class StepMarks(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.start_step, self.steps_run = None, 0

        def on_train_begin(self, logs=None):
            self.start_step = int(self.model.optimizer.iterations.numpy())

        def _after(self, steps: int, nominal: int | None = None) -> None:
            self.steps_run += steps
            real = self.start_step + self.steps_run
            step = real if nominal is None else nominal
            if step not in marked:
                return
            _write_mark(path(f"at{step}"), {"time": time.time(), "iterations": real})
            if step in held:
                deadline = time.monotonic() + HOLD_TIMEOUT_S
                while not os.path.exists(path(f"go{step}")):
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"held at step {step} for {HOLD_TIMEOUT_S} s")
                    time.sleep(0.02)

    class BatchMarks(StepMarks):
        def on_train_batch_end(self, batch, logs=None):
            self._after(1)

    class EpochMarks(StepMarks):
        def on_epoch_begin(self, epoch, logs=None):
            # A resumed run's first epoch is the rest of the interrupted one.
            self._epoch_start = int(self.model.optimizer.iterations.numpy())

        def on_epoch_end(self, epoch, logs=None):
            real = int(self.model.optimizer.iterations.numpy()) - self._epoch_start
            self._after(real, nominal=(epoch + 1) * self.params["steps"])

    return EpochMarks() if per_epoch else BatchMarks()


if __name__ == "__main__":
    sys.path.insert(0, REPO_ROOT)
    _serve(sys.argv[1])
