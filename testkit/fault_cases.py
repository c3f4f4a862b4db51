"""Faults of a training cluster: a worker, a parameter server or the chief killed mid-job.

`mwms_job` and `ps_job` run the tiny penguins teacher as a `local_cluster` of processes,
SIGKILL tasks (held at a step, at a seeded random moment while steps run, or
inside a backup write), restart them and return an `Outcome`; shared by
`tests/components/training/test_faults.py` and `benchmarks/faults.py`.
"""

from __future__ import annotations

import dataclasses
import os
import random
import re
import time
from collections.abc import Callable

from components.training import peers
from testkit import local_cluster, penguins
from testkit.local_cluster import Launcher, Task

GLOBAL_BATCH = 30
# Steps per pass over the 270 training rows at GLOBAL_BATCH, and the backup interval.
INTERVAL = 9
MWMS_STEPS = 45
MWMS_VICTIM = 1
MWMS_KILL_AT = 22
# `random` kills: after a seeded step in this range, a seeded fraction of a step later.
MWMS_RANDOM_STEPS = (2, 22)
# How many steps past its seeded step a random kill may land: within the backup
# interval (the harness polls the victim's marks every 5 ms and a step takes
# 10-30 ms here; it landed 0-1 steps late in the runs measured, and more only
# when the harness itself waits for the cores).
MWMS_RANDOM_SLACK = INTERVAL - 1
# `in_backup` kills: inside worker 0's second backup write (step 2 * INTERVAL).
MWMS_BACKUP_WRITE = 2
# How long a worker restarted without its peer waits for it (TensorFlow's
# registration timeout, set in the task; the product's bound follows it).
NEVER_BACK_REGISTER_S = 5
# Bounds (2 busy cores): a task reaching its first mark (runtime start, tracing),
# a lost peer becoming an error, a run finishing (training, evaluation, export).
START_BOUND_S = 120
DETECT_BOUND_S = 30
FINISH_BOUND_S = 180

# Parameter-server faults by the coordinator's step: `*_mid_epoch` kills land
# once it marks that epoch end (it is not held there) plus a seeded part of
# its fastest epoch (`ps_job`), so while steps run; the others at held epoch
# ends.
PS_PLANS = {
    "none": {},
    "ps_worker": {18: "kill_worker_mid_epoch", 36: "restart_worker"},
    "ps_server": {18: "kill_ps_mid_epoch"},
    "chief": {18: "kill_chief"},
    # Every parameter-server fault in one job (the tests): one export instead of three.
    "all": {
        18: "kill_worker_mid_epoch",
        36: "restart_worker",
        45: "kill_ps_mid_epoch",
        54: "kill_chief",
    },
}
PS_STEPS = {"all": 63}
PS_STEPS_DEFAULT = 45
# A mid-epoch kill waits this part of the coordinator's fastest epoch so far
# (an epoch takes about 0.2-0.3 s here): from 0.05 to 0.25 of it, by the
# seeded fraction, so that it lands inside the epoch unless that one runs 4x
# faster than any before.
PS_MID_EPOCH = (0.05, 0.2)
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


@dataclasses.dataclass(frozen=True)
class Moment:
    """A seeded random kill moment: once the task marks step `after` (it is not
    held there and runs on), `fraction` of a measured span later (one step's
    time, or under the parameter-server strategy one epoch's)."""

    after: int
    fraction: float


def random_moment(seed: int, first: int, last: int) -> Moment:
    """The kill moment of `seed`: `after` in [first, last], `fraction` in [0, 1)."""
    rng = random.Random(seed)
    return Moment(after=rng.randint(first, last), fraction=round(rng.random(), 3))


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
                steps_run = task.mark(max(marks))["iterations"] - start_step
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
      fault: The scenario (`none`, `mwms_worker` (parked),
        `mwms_worker_random`, `mwms_worker_in_backup`, `ps_worker`,
        `ps_server`, `chief`, `all`).
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
      kill_point: Where the kill landed: its `kind`, the plan (`after`,
        `fraction`, `seed`; `write` for a kill inside a backup write), and
        what the tasks had done by then (`victim_step`, `survivor_step`;
        the backup's files and the checkpoint its state file named).
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
    kill_point: dict | None = None
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


def _reach(task: Task, step: int, bound: float, outcome: Outcome, every: float = 0.05) -> bool:
    """Waits until `task` marks `step`; False (logged) when it exits or overruns first."""
    return _await(task, lambda: task.reached(step), f"at {step}", bound, outcome, every)


def _await(
    task: Task, marked: Callable[[], bool], what: str, bound: float, outcome: Outcome, every=0.05
) -> bool:
    """Waits until `marked()`; False (logged) when `task` exits or overruns first."""
    try:
        local_cluster.wait_for(
            lambda: marked() or task.poll() is not None, bound, f"{task.name} {what}", every=every
        )
    except TimeoutError:
        outcome.hung.append(task.name)
    if marked():
        return True
    outcome.logs[task.name] = task.tail()
    return False


def _shortest_span(task: Task, spans) -> float:
    """The shortest time between the marks of `(earlier, later)` step pairs of `task`."""
    return min(task.mark_time(later) - task.mark_time(earlier) for earlier, later in spans)


def _sleep_past_mark(task: Task, step: int, seconds: float) -> None:
    """Sleeps until `seconds` after `task` marked `step` (not after the harness saw it)."""
    time.sleep(max(0.0, task.mark_time(step) + seconds - time.time()))


# --------------------------------------------------------------------------- #
# Multi-worker mirrored
# --------------------------------------------------------------------------- #


def mwms_job(
    launcher: Launcher,
    data: penguins.Materialized,
    root: str,
    name: str,
    *,
    kill: str | None = "parked",
    seed: int = 0,
    never_back: bool = True,
    export: bool = True,
) -> Outcome:
    """Two workers, one of them SIGKILLed (`kill`), then the group restarts (module docstring).

    Args:
      kill: None (no fault); `parked`: worker 1 held at `MWMS_KILL_AT` and
        killed there; `random`: worker 1 killed while its steps run, at the
        seeded `random_moment(seed, *MWMS_RANDOM_STEPS)` (nothing held);
        `in_backup`: worker 0, which writes the backup, killed inside its
        backup write number `MWMS_BACKUP_WRITE` (`local_cluster._hold_in_backup`).
      never_back: Between the fault and the restart, restart each worker
        alone (the other "never comes back"), each in its own cluster, and
        record how they fail (`Outcome.never_back`).
      export: Export from the final run (`run_fn.run`); False trains only
        (`training.fit`), for a reference that needs only the weights.
    """
    config = mwms_config()
    inputs = penguins.inputs_for(data, root, name, config)
    fault = {None: "none", "parked": "mwms_worker"}.get(kill, f"mwms_worker_{kill}")
    outcome = Outcome(fault, serving_dir=inputs["serving_model_dir"])
    cluster = local_cluster.free_cluster(2)
    victim_index = 0 if kill == "in_backup" else MWMS_VICTIM
    every_step = tuple(range(1, MWMS_STEPS + 1))

    def start(attempt: str, indices, faulty=False, on=cluster, coordination=None) -> list[Task]:
        def fault(i: int) -> dict:
            if not faulty or i != victim_index:
                return {}
            return {
                "parked": {"hold": (MWMS_KILL_AT,)},
                "random": {"marks": every_step},
                "in_backup": {"hold_in_backup": MWMS_BACKUP_WRITE},
            }[kill]

        jobs = {
            i: _job(
                config,
                inputs,
                on,
                "worker",
                i,
                export=export,
                coordination=coordination,
                **fault(i),
            )
            for i in indices
        }
        return [launcher.start(f"{name}.{attempt}.worker{i}", job) for i, job in jobs.items()]

    began, excluded, reached = time.monotonic(), 0.0, 0
    with launcher.scope():
        if kill:
            workers = start("a1", (0, 1), faulty=True)
            survivor, victim = workers[1 - victim_index], workers[victim_index]
            point = _kill_when(kill, victim, seed, inputs, outcome)
            if point is None:
                outcome.attempts.append(Attempt.of(workers[0]))
                return _close(outcome, began)
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
            # Where each worker really was: the victim's last mark, the survivor's own count.
            point["victim_step"] = max(victim.marks(), default=None)
            point["survivor_step"] = Attempt.of(survivor).reached
            outcome.kill_point = point
            outcome.exported_by_failed = os.path.exists(inputs["serving_model_dir"])
            # The steps run: the survivor's own count (a victim held in a backup write marks none).
            reached = point["survivor_step"]
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


def _kill_when(kill: str, victim: Task, seed: int, inputs: dict, outcome: Outcome) -> dict | None:
    """SIGKILLs `victim` at the `kill` point of `mwms_job`; what it knew then, or None
    (logged) when the victim exited or overran its bound first."""
    if kill == "parked":
        if not _reach(victim, MWMS_KILL_AT, START_BOUND_S, outcome):
            return None
        _kill(victim)
        return {"kind": kill, "after": MWMS_KILL_AT}
    if kill == "random":
        moment = random_moment(seed, *MWMS_RANDOM_STEPS)
        if not _reach(victim, moment.after, START_BOUND_S, outcome, every=0.005):
            return None
        # One step's measured time, from the victim's own marks (it runs on
        # meanwhile): the shortest of the last few steps that wrote no backup.
        step_s = _shortest_span(
            victim,
            ((s - 1, s) for s in range(max(2, moment.after - 3), moment.after + 1) if s % INTERVAL),
        )
        _sleep_past_mark(victim, moment.after, moment.fraction * step_s)
        _kill(victim)
        if victim.reached(MWMS_STEPS):
            outcome.logs[victim.name] = "finished before its random kill"
            return None
        return {
            "kind": kill,
            "seed": seed,
            **dataclasses.asdict(moment),
            "step_s": round(step_s, 4),
        }
    # in_backup
    from components.training import backup

    directory = backup.run_dir_location(inputs["model_run_dir"])

    def in_write() -> bool:
        return victim.in_backup(MWMS_BACKUP_WRITE)

    if not _await(victim, in_write, f"in backup write {MWMS_BACKUP_WRITE}", START_BOUND_S, outcome):
        return None
    _kill(victim)
    # The chief's own backup directory (other workers write scratch copies beside it).
    written = os.path.dirname(victim.backup_write(MWMS_BACKUP_WRITE)["save_path"])
    return {
        "kind": kill,
        "write": MWMS_BACKUP_WRITE,
        # The chief's backup as the kill left it: the interrupted write's files,
        # and the checkpoint its state file names (the last complete write's).
        "backup_dir": os.path.relpath(written, directory),
        "backup_files": sorted(os.listdir(written)),
        "backup_recorded": _recorded_checkpoint(written),
    }


def _recorded_checkpoint(directory: str) -> str | None:
    """The checkpoint `directory`'s `checkpoint` state file names (basename), or None."""
    try:
        with open(os.path.join(directory, "checkpoint")) as f:
            found = re.search(r'^model_checkpoint_path: "(.*)"$', f.read(), re.M)
    except OSError:
        return None
    return os.path.basename(found.group(1)) if found else None


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
    launcher: Launcher,
    data: penguins.Materialized,
    root: str,
    name: str,
    plan: str,
    seed: int = 0,
) -> Outcome:
    """A parameter-server job through the faults of `PS_PLANS[plan]` (module docstring).

    A mid-epoch kill's moment is `random_moment(seed + step, step, step)`: it
    lands `PS_MID_EPOCH[0] + PS_MID_EPOCH[1] * fraction` of the
    coordinator's fastest epoch after it marks `step`; `detection`
    records where the coordinator really was then (`landed_after`: its
    newest epoch end) and whether that was mid-epoch.
    """
    steps = PS_STEPS.get(plan, PS_STEPS_DEFAULT)
    actions = PS_PLANS[plan]
    config = ps_config(steps)
    inputs = penguins.inputs_for(data, root, name, config)
    outcome = Outcome(plan, serving_dir=inputs["serving_model_dir"])
    cluster = local_cluster.free_cluster(2, ps=1, chief=True)
    starts = {"n": 0}
    # The coordinator marks every epoch end (the measured epochs), and holds at the parked faults.
    epoch_ends = tuple(range(INTERVAL, steps + 1, INTERVAL))

    def start(task_type: str, index: int, hold=()) -> Task:
        starts["n"] += 1
        job = _job(config, inputs, cluster, task_type, index, hold=sorted(hold), marks=epoch_ends)
        return launcher.start(f"{name}.{starts['n']}.{task_type}{index}", job)

    def held(remaining) -> list[int]:
        return [step for step in remaining if not actions[step].endswith("_mid_epoch")]

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

    def mid_epoch(chief: Task, step: int, victim: Task) -> dict:
        """Kills `victim` a seeded part of an epoch after `chief` marks `step`."""
        moment = random_moment(seed + step, step, step)
        # The fastest epoch this coordinator ran (a hold only lengthens one).
        ends = [e for e in chief.marks() if e <= step]
        spans = zip(ends, ends[1:], strict=False)
        epoch_s = _shortest_span(chief, (p for p in spans if p[1] - p[0] == INTERVAL))
        wait_s = (PS_MID_EPOCH[0] + PS_MID_EPOCH[1] * moment.fraction) * epoch_s
        _sleep_past_mark(chief, step, wait_s)
        running, killed_at = chief.poll() is None, time.time()
        _kill(victim)
        # The newest epoch end at the kill (the coordinator runs on while the victim is reaped).
        landed = max(m for m in chief.marks() if chief.mark_time(m) <= killed_at)
        return {
            "step": step,
            "seed": seed + step,
            "fraction": moment.fraction,
            "epoch_s": round(epoch_s, 3),
            "wait_s": round(wait_s, 3),
            # The coordinator's newest epoch end at the kill, and its real step count there.
            "landed_after": landed,
            "landed_iterations": chief.mark(landed)["iterations"],
            "mid_epoch": running and landed == step,
        }

    began = time.monotonic()
    with launcher.scope():
        servers = {(t, i): start(t, i) for t, i in (("ps", 0), ("worker", 0), ("worker", 1))}
        if not all(serving(*key) for key in servers):
            return _close(outcome, began)
        remaining = sorted(actions)
        chief = start("chief", 0, hold=held(remaining))
        while remaining:
            step = remaining.pop(0)
            if not _reach(chief, step, START_BOUND_S, outcome, every=0.01):
                break
            action = actions[step]
            if action == "kill_worker_mid_epoch":
                outcome.detection.append(
                    {"fault": "ps_worker", **mid_epoch(chief, step, servers[PS_VICTIM])}
                )
            elif action == "restart_worker":
                # Training went on without it: how far, by the coordinator's own
                # count (its optimizer's) from the epoch end before the kill to now.
                lost = outcome.detection[-1]
                lost["steps_without_it"] = (
                    chief.mark(step)["iterations"] - lost["landed_iterations"]
                )
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
            elif action == "kill_ps_mid_epoch":
                point = mid_epoch(chief, step, servers[("ps", 0)])
                killed = time.monotonic()
                code = _finish(chief, DETECT_BOUND_S, outcome)
                outcome.detection.append(
                    {
                        "fault": "ps_server",
                        **point,
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
                chief = start("chief", 0, hold=held(remaining))
            elif action == "kill_chief":
                _kill(chief)
                outcome.detection.append(
                    {"fault": "chief", "step": step, "iterations": chief.mark(step)["iterations"]}
                )
                outcome.attempts.append(Attempt.of(chief))
                outcome.exported_by_failed |= os.path.exists(inputs["serving_model_dir"])
                chief = start("chief", 0, hold=held(remaining))
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
