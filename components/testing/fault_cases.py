"""Faults of a training cluster: a worker, a parameter server or the chief killed mid-job.

`mwms_job` and `ps_job` run the tiny penguins teacher as a `local_cluster` of processes,
SIGKILL tasks at known steps, restart them and return an `Outcome`; shared by
`tests/components/training/test_faults.py` and `benchmarks/faults.py`.
"""

from __future__ import annotations

import dataclasses
import os
import re
import time
from collections.abc import Callable

from components.testing import local_cluster, penguins
from components.testing.local_cluster import Launcher, Task
from components.training import peers

GLOBAL_BATCH = 30
# Steps per pass over the 270 training rows at GLOBAL_BATCH, and the backup interval.
INTERVAL = 9
MWMS_STEPS = 45
MWMS_VICTIM = 1
MWMS_KILL_AT = 22
# How long a worker restarted without its peer waits for it (TensorFlow's
# registration timeout, set in the task; the product's bound follows it).
NEVER_BACK_REGISTER_S = 5
# Bounds (2 busy cores): a task reaching its first mark (runtime start, tracing),
# a lost peer becoming an error, a run finishing (training, evaluation, export).
START_BOUND_S = 120
DETECT_BOUND_S = 30
FINISH_BOUND_S = 180

PS_PLANS = {
    "none": {},
    "ps_worker": {9: "kill_worker", 27: "restart_worker"},
    "ps_server": {18: "kill_ps"},
    "chief": {18: "kill_chief"},
    # Every parameter-server fault in one job (the tests): one export instead of three.
    "all": {9: "kill_worker", 27: "restart_worker", 36: "kill_ps", 45: "kill_chief"},
}
PS_STEPS = {"all": 54}
PS_STEPS_DEFAULT = 45
PS_VICTIM = ("worker", 1)


def base_config(**strategy):
    """The penguins teacher with a pass-aligned backup interval (see the module docstring)."""
    return penguins.penguins_config(
        strategy=strategy,
        ingestion={"batch_size": GLOBAL_BATCH, "eval_batch_size": GLOBAL_BATCH},
        train={
            "train_steps": MWMS_STEPS,
            "steps_per_epoch": MWMS_STEPS,
            "checkpoint_every_steps": INTERVAL,
            "eval_steps": 1,
        },
    )


def mwms_config():
    return base_config(kind="multi_worker_mirrored", workers=2)


def ps_config(steps: int):
    config = base_config(kind="parameter_server", workers=2, parameter_servers=1)
    return penguins.with_sections(config, train={"train_steps": steps, "steps_per_epoch": steps})


@dataclasses.dataclass
class Attempt:
    """One run of the task that trains and exports (worker 0, or the coordinator)."""

    task: str
    exit_code: int | None
    start_step: int | None
    steps_run: int | None
    iterations: int | None
    error: str
    seconds: float

    @property
    def reached(self) -> int:
        """The last step this run completed (for a killed run: the last it marked)."""
        return (self.start_step or 0) + (self.steps_run or 0)

    @classmethod
    def of(cls, task: Task) -> Attempt:
        result = task.result()
        start_step, steps_run = result.get("start_step"), result.get("steps_run")
        if start_step is None:
            # Killed: no result; its log says where it resumed, its marks how far it got.
            found = _RESUMED.search(task.tail(10**7))
            start_step = int(found.group(1) or 0) if found else None
            marks = task.marks()
            if start_step is not None and marks:
                steps_run = max(marks) - start_step
        return cls(
            task=task.name,
            exit_code=task.poll(),
            start_step=start_step,
            steps_run=steps_run,
            iterations=result.get("iterations"),
            error=result.get("error", ""),
            seconds=round(time.monotonic() - task.started, 2),
        )


# `training._ResumeLog`'s line: where a run started.
_RESUMED = re.compile(r"Trainer: (?:resumed from the backup in \S+ at step (\d+)|no backup in)")


@dataclasses.dataclass
class Outcome:
    """What one job went through.

    Attributes:
      fault: The scenario (`none`, `mwms_worker`, `ps_worker`, `ps_server`,
        `chief`, `all`).
      wall_s: From the first task's start to the last attempt's end, minus
        `never_back` (a diagnostic phase, not part of the fault's cost).
      attempts: Every run of the training chief, in order.
      detection: Per fault that fails a task: `seconds` from the kill to
        that task's exit, its `exit_code` and `error`.
      never_back: Worker 0 restarted without worker 1: `exit_code`,
        `seconds`, `message` (its log line naming the missing task).
      rejoined: The parameter-server worker restarted: `seconds` until it
        served, `recovered` (the coordinator's log said it recovered it).
      exported: Serving models under the job's directory at the end.
      exported_by_failed: Whether a failed attempt left a serving model.
      steps_repeated: Steps run again after a resume.
      hung: Tasks that overran a bound (killed).
      weights: The final chief's weights (`.npz`), or None.
      serving_dir: The job's serving model directory.
      logs: Log tails of the failed and final tasks.
    """

    fault: str
    wall_s: float = 0.0
    attempts: list[Attempt] = dataclasses.field(default_factory=list)
    detection: list[dict] = dataclasses.field(default_factory=list)
    never_back: dict | None = None
    rejoined: dict | None = None
    exported: list[str] = dataclasses.field(default_factory=list)
    exported_by_failed: bool = False
    steps_repeated: int = 0
    hung: list[str] = dataclasses.field(default_factory=list)
    weights: str | None = None
    serving_dir: str = ""
    logs: dict[str, str] = dataclasses.field(default_factory=dict)

    @property
    def final(self) -> Attempt | None:
        return self.attempts[-1] if self.attempts else None

    def report(self) -> str:
        """Everything, for an assertion message."""
        logs = "\n".join(f"--- {name}\n{tail}" for name, tail in self.logs.items())
        fields = {k: v for k, v in dataclasses.asdict(self).items() if k != "logs"}
        return f"{fields}\n{logs}"


def saved_models_under(root: str) -> list[str]:
    return sorted(d for d, _, files in os.walk(root) if "saved_model.pb" in files)


def _job(config, inputs: dict, cluster: dict, task_type: str, index: int, **extra) -> dict:
    return {
        "env": {"TF_CONFIG": local_cluster.tf_config(cluster, task_type, index)},
        "config": config.to_json(),
        "inputs": inputs,
        **extra,
    }


def _finish(task: Task, bound: float, outcome: Outcome) -> int | None:
    """Waits for `task` to exit within `bound`; past it, kills it and records a hang."""
    try:
        return task.wait(bound)
    except TimeoutError:
        outcome.hung.append(task.name)
        outcome.logs[task.name] = task.tail()
        _kill(task)
        return None


def _kill(task: Task) -> None:
    """SIGKILL, and wait until it is reaped: a restart on its port must find it free."""
    task.kill()
    task.wait(30)


def _reach(task: Task, step: int, bound: float, outcome: Outcome) -> bool:
    """Waits until `task` marks `step`; False (logged) when it exits or overruns first."""
    try:
        local_cluster.wait_for(
            lambda: task.reached(step) or task.poll() is not None, bound, f"{task.name} at {step}"
        )
    except TimeoutError:
        outcome.hung.append(task.name)
    if task.reached(step):
        return True
    outcome.logs[task.name] = task.tail()
    return False


# --------------------------------------------------------------------------- #
# Multi-worker mirrored
# --------------------------------------------------------------------------- #


def mwms_job(
    launcher: Launcher,
    data: penguins.Materialized,
    root: str,
    name: str,
    *,
    kill: bool = True,
    never_back: bool = True,
    export: bool = True,
) -> Outcome:
    """Two workers; with `kill`, worker 1 SIGKILLed at `MWMS_KILL_AT`, then restarts (module docstring).

    Args:
      never_back: Between the fault and the restart, restart each worker
        alone (the other "never comes back"), each in its own cluster, and
        record how they fail (`Outcome.never_back`).
      export: Export from the final run (`run_fn.run`); False trains only
        (`training.fit`), for a reference that needs only the weights.
    """
    config = mwms_config()
    inputs = penguins.inputs_for(data, root, name, config)
    outcome = Outcome("mwms_worker" if kill else "none", serving_dir=inputs["serving_model_dir"])
    cluster = local_cluster.free_cluster(2)

    def start(attempt: str, indices, hold=(), on=cluster, coordination=None) -> list[Task]:
        jobs = {
            i: _job(
                config,
                inputs,
                on,
                "worker",
                i,
                hold=hold if i == MWMS_VICTIM else (),
                export=export,
                coordination=coordination,
            )
            for i in indices
        }
        return [launcher.start(f"{name}.{attempt}.worker{i}", job) for i, job in jobs.items()]

    began, excluded, reached = time.monotonic(), 0.0, 0
    with launcher.scope():
        if kill:
            workers = start("a1", (0, 1), hold=(MWMS_KILL_AT,))
            survivor, victim = workers[1 - MWMS_VICTIM], workers[MWMS_VICTIM]
            if not _reach(victim, MWMS_KILL_AT, START_BOUND_S, outcome):
                outcome.attempts.append(Attempt.of(workers[0]))
                return _close(outcome, began)
            _kill(victim)
            killed = time.monotonic()
            code = _finish(survivor, DETECT_BOUND_S, outcome)
            outcome.detection.append(
                {
                    "fault": "mwms_worker",
                    "task": survivor.name,
                    "seconds": round(time.monotonic() - killed, 2),
                    "exit_code": code,
                    "error": survivor.result().get("error", ""),
                }
            )
            outcome.logs[survivor.name] = survivor.tail()
            outcome.attempts.append(Attempt.of(workers[0]))
            outcome.exported_by_failed = os.path.exists(inputs["serving_model_dir"])
            reached = outcome.attempts[-1].reached
            if never_back:
                phase = time.monotonic()
                outcome.never_back = _never_back(start, outcome)
                excluded = time.monotonic() - phase
        workers = start("final", (0, 1))
        for task in workers:
            _finish(task, FINISH_BOUND_S, outcome)
        outcome.attempts.append(Attempt.of(workers[0]))
        if kill and outcome.final.start_step is not None:
            outcome.steps_repeated = reached - outcome.final.start_step
        for task in workers:
            if task.poll() != 0:
                outcome.logs[task.name] = task.tail()
        weights = workers[0].path("weights.npz")
        outcome.weights = weights if os.path.exists(weights) else None
    return _close(outcome, began, excluded, root=os.path.join(root, name))


def _never_back(start: Callable, outcome: Outcome) -> dict:
    """Worker 0 (the coordination leader) and worker 1 each restarted without the other.

    Worker 0 in the job's own cluster (worker 1 never comes back), worker 1
    in a fresh one (worker 0 never comes back), at the same time: both wait
    `NEVER_BACK_REGISTER_S` for the other, then must fail naming it.
    """
    bound = {"register_timeout_s": NEVER_BACK_REGISTER_S}
    (leader,) = start("alone", (0,), coordination=bound)
    (other,) = start("alone", (1,), on=local_cluster.free_cluster(2), coordination=bound)
    found = {}
    for task, missing in ((leader, "worker:1"), (other, "worker:0")):
        code = _finish(task, DETECT_BOUND_S, outcome)
        text = task.tail(20000) + task.result().get("error", "")
        named = [
            line for line in text.splitlines() if f"{missing} (" in line and "did not join" in line
        ]
        found[task.name.rsplit(".", 1)[1]] = {
            "missing": missing,
            "exit_code": code,
            "seconds": round(time.monotonic() - task.started, 2),
            "message": named[-1].strip() if named else "",
        }
        outcome.logs[task.name] = task.tail()
    return found


def _close(outcome: Outcome, began: float, excluded: float = 0.0, root: str = "") -> Outcome:
    outcome.wall_s = round(time.monotonic() - began - excluded, 2)
    if root:
        outcome.exported = saved_models_under(root)
    return outcome


# --------------------------------------------------------------------------- #
# Parameter server
# --------------------------------------------------------------------------- #


def ps_job(
    launcher: Launcher, data: penguins.Materialized, root: str, name: str, plan: str
) -> Outcome:
    """A parameter-server job through the faults of `PS_PLANS[plan]` (module docstring)."""
    steps = PS_STEPS.get(plan, PS_STEPS_DEFAULT)
    actions = PS_PLANS[plan]
    config = ps_config(steps)
    inputs = penguins.inputs_for(data, root, name, config)
    outcome = Outcome(plan, serving_dir=inputs["serving_model_dir"])
    cluster = local_cluster.free_cluster(2, ps=1, chief=True)
    starts = {"n": 0}

    def start(task_type: str, index: int, hold=()) -> Task:
        starts["n"] += 1
        job = _job(config, inputs, cluster, task_type, index, hold=sorted(hold))
        return launcher.start(f"{name}.{starts['n']}.{task_type}{index}", job)

    def serving(task_type: str, index: int) -> bool:
        address = cluster[task_type][index]
        try:
            local_cluster.wait_for(
                lambda: peers.reachable(address, timeout=0.5), START_BOUND_S, f"{task_type}:{index}"
            )
            return True
        except TimeoutError:
            outcome.hung.append(f"{task_type}:{index} never served")
            return False

    began = time.monotonic()
    with launcher.scope():
        servers = {(t, i): start(t, i) for t, i in (("ps", 0), ("worker", 0), ("worker", 1))}
        if not all(serving(*key) for key in servers):
            return _close(outcome, began)
        remaining = sorted(actions)
        chief = start("chief", 0, hold=remaining)
        while remaining:
            step = remaining.pop(0)
            if not _reach(chief, step, START_BOUND_S, outcome):
                break
            action = actions[step]
            if action == "kill_worker":
                _kill(servers[PS_VICTIM])
                outcome.detection.append({"fault": "ps_worker", "step": step})
                chief.go(step)
            elif action == "restart_worker":
                # Training went on without it: the chief reached this step meanwhile.
                outcome.detection[-1]["steps_without_it"] = step - outcome.detection[-1]["step"]
                restarted = time.monotonic()
                servers[PS_VICTIM] = start(*PS_VICTIM)
                # The coordinator (held here) reconnects in the background;
                # TensorFlow logs when it has (the chief goes on only then,
                # so that the worker takes part in the rest of the job).
                recovered = _recovered(chief)
                outcome.rejoined = {
                    "recovered": recovered,
                    "seconds": round(time.monotonic() - restarted, 2),
                }
                chief.go(step)
                if not recovered:
                    break
            elif action == "kill_ps":
                _kill(servers[("ps", 0)])
                killed = time.monotonic()
                chief.go(step)
                code = _finish(chief, DETECT_BOUND_S, outcome)
                outcome.detection.append(
                    {
                        "fault": "ps_server",
                        "step": step,
                        "task": chief.name,
                        "seconds": round(time.monotonic() - killed, 2),
                        "exit_code": code,
                        "error": chief.result().get("error", ""),
                    }
                )
                outcome.logs[chief.name] = chief.tail()
                outcome.attempts.append(Attempt.of(chief))
                outcome.exported_by_failed |= os.path.exists(inputs["serving_model_dir"])
                # JobSet recreates every pod; a TFJob recreates the ps and
                # restarts the chief in place. The workers' servers stay up
                # here (as under TFJob): a new coordinator resets them anyway.
                servers[("ps", 0)] = start("ps", 0)
                if not serving("ps", 0):
                    break
                chief = start("chief", 0, hold=remaining)
            elif action == "kill_chief":
                _kill(chief)
                outcome.detection.append({"fault": "chief", "step": step})
                outcome.attempts.append(Attempt.of(chief))
                outcome.exported_by_failed |= os.path.exists(inputs["serving_model_dir"])
                chief = start("chief", 0, hold=remaining)
        _finish(chief, FINISH_BOUND_S, outcome)
        outcome.attempts.append(Attempt.of(chief))
        for earlier, later in zip(outcome.attempts, outcome.attempts[1:], strict=False):
            if later.start_step is not None:
                outcome.steps_repeated += max(0, earlier.reached - later.start_step)
        if outcome.final.exit_code != 0:
            outcome.logs[chief.name] = chief.tail()
        weights = chief.path("weights.npz")
        outcome.weights = weights if os.path.exists(weights) else None
    return _close(outcome, began, root=os.path.join(root, name))


def _recovered(chief: Task) -> bool:
    """Waits until the coordinator logs that it recovered the restarted worker (bounded)."""
    victim = f"/job:{PS_VICTIM[0]}/replica:0/task:{PS_VICTIM[1]}"
    try:
        local_cluster.wait_for(
            lambda: f"Worker {victim} has been recovered" in chief.tail(10**7),
            START_BOUND_S,
            f"{victim} recovered",
            every=0.2,
        )
        return True
    except TimeoutError:
        return False
