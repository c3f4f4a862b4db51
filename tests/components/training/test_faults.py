"""Faults of a multi-task Trainer: a worker, a parameter server or the chief killed mid-job.

Real clusters of processes on loopback (free ports), forked by one launcher
process (`testkit/local_cluster.py`), killed with SIGKILL and
restarted as the generated manifests make Kubernetes restart them; the
scenarios themselves live in `testkit/fault_cases.py`, which
`benchmarks/faults.py` times. Every wait there is bounded, a task that
overruns its bound is killed and listed (`Outcome.hung`), and leaving the
module fixture kills the launcher's whole process group.

One module fixture runs, side by side on the launcher:
- multi-worker mirrored, worker 1 killed at a seeded random moment while
  its steps run (`SEED`), each worker then restarted alone, then the group;
  then worker 0 killed inside its second backup write;
- parameter server, every fault in one job: a worker killed mid-epoch and
  restarted, the ps killed mid-epoch, the coordinator killed at an epoch
  end; then the unkilled multi-worker run the resumed ones are compared with.
The model is the penguins teacher (a few hundred parameters), 45 and 63 steps.

Tolerance: the resumed runs' weights are compared with the unkilled run's
within `ATOL` = 1e-6. Both see the same batches in the same order (backups
fall on pass boundaries, see `fault_cases`), the backup restores float32
values exactly and the all-reduce adds in the same order: they are
observed bitwise equal. 1e-6 admits a reordered float sum in a threaded
kernel, while one step more or less moves these weights by 1e-3 or more
(Adam at a learning rate of 0.01).
"""

from __future__ import annotations

import os
import re
from concurrent import futures

import numpy as np
import pytest

from components.training import peers
from testkit import fault_cases, local_cluster, penguins
from tests.conftest import data_file

ATOL = 1e-6
# The multi-worker random kill's seed: fault_cases.random_moment(SEED, 2, 22) is
# step 12, 0.948 of a step later (test_random_kill_moments_are_seeded).
SEED = 7
LOOPBACK_TASK = r"\(127\.0\.0\.1:\d+\)"


@pytest.fixture(scope="module")
def faults(tmp_path_factory):
    """The outcomes of both scenarios and the unkilled multi-worker run."""
    data_file(os.path.basename(penguins.PENGUINS_CSV))
    root = str(tmp_path_factory.mktemp("faults"))
    with local_cluster.Launcher(os.path.join(root, "tasks")) as launcher:
        data = launcher.penguins(os.path.join(root, "data"))

        def mwms():
            random_kill = fault_cases.mwms_job(
                launcher, data, root, "mwms", kill="random", seed=SEED
            )
            in_backup = fault_cases.mwms_job(
                launcher, data, root, "in_backup", kill="in_backup", never_back=False
            )
            return random_kill, in_backup

        def ps_then_reference():
            ps = fault_cases.ps_job(launcher, data, root, "ps", "all")
            reference = fault_cases.mwms_job(
                launcher, data, root, "reference", kill=None, export=False
            )
            return ps, reference

        with futures.ThreadPoolExecutor(max_workers=2) as pool:
            mwms_run, ps_run = pool.submit(mwms), pool.submit(ps_then_reference)
            outcomes = dict(zip(("mwms", "in_backup"), mwms_run.result(), strict=True))
            outcomes["ps"], outcomes["reference"] = ps_run.result()
    return outcomes


def settled(outcome: fault_cases.Outcome) -> fault_cases.Outcome:
    """The outcome, once no task overran a bound (every later assertion assumes it)."""
    assert outcome.hung == [], outcome.report()
    return outcome


def test_random_kill_moments_are_seeded():
    # Values written by hand from Python's Mersenne Twister (random.Random(seed):
    # randint(first, last), then random()), the same on every host.
    assert fault_cases.random_moment(7, 2, 22) == fault_cases.Moment(after=12, fraction=0.948)
    assert fault_cases.random_moment(0, 2, 22) == fault_cases.Moment(after=14, fraction=0.758)
    assert fault_cases.random_moment(63, 45, 45).after == 45
    moments = {fault_cases.random_moment(seed, 2, 22) for seed in range(50)}
    assert all(2 <= m.after <= 22 and 0 <= m.fraction < 1 for m in moments)
    assert len({m.after for m in moments}) > 10


# --------------------------------------------------------------------------- #
# Multi-worker mirrored: worker 1 killed at a seeded moment while steps run
# --------------------------------------------------------------------------- #


@pytest.mark.multiprocess
def test_mwms_survivor_fails_within_the_bound_naming_the_killed_worker(faults):
    outcome = settled(faults["mwms"])
    (lost,) = outcome.detection
    assert lost["exit_code"] == 1, outcome.report()
    assert lost["seconds"] < fault_cases.DETECT_BOUND_S
    assert re.match(
        rf"PeerLost: Trainer: worker:0 of the multi_worker_mirrored cluster lost worker:1 {LOOPBACK_TASK} "
        r"\(UnavailableError: .*\); the whole group restarts \(kubeflow.max_restarts\) "
        r"and resumes from the last backup in .*/mwms/model_run/backup$",
        lost["error"],
    ), lost["error"]
    assert not outcome.exported_by_failed


@pytest.mark.multiprocess
def test_mwms_random_kill_lands_while_steps_run(faults):
    outcome = settled(faults["mwms"])
    point = outcome.kill_point
    assert (point["after"], point["fraction"]) == (12, 0.948), point
    # Not parked, and near its seeded moment: the victim ran on past the seeded
    # step and was killed within a few steps of it; the survivor's real count
    # of steps (its optimizer's) is where the victim was, give or take the
    # step in flight.
    assert point["victim_step"] - point["after"] <= fault_cases.MWMS_RANDOM_SLACK, point
    assert abs(point["survivor_step"] - point["victim_step"]) <= 1, point
    assert outcome.attempts[0].start_step == 0, outcome.report()


@pytest.mark.multiprocess
def test_a_worker_that_never_comes_back_fails_the_restart_within_the_bound_naming_it(faults):
    outcome = settled(faults["mwms"])
    bound = fault_cases.NEVER_BACK_REGISTER_S + peers.FORMATION_GRACE_S
    leader, other = outcome.never_back["worker0"], outcome.never_back["worker1"]
    # Worker 0 leads the coordination service, where TensorFlow waits without
    # end: the product's watchdog ends it (SIGKILL, TensorFlow takes SIGTERM
    # as a preemption notice), naming the missing worker.
    assert leader["exit_code"] == -9, outcome.report()
    assert bound <= leader["seconds"] < bound + fault_cases.DETECT_BOUND_S
    assert re.fullmatch(
        rf"Strategy: worker:1 {LOOPBACK_TASK} did not join the multi_worker_mirrored cluster of worker:0 "
        rf"within {fault_cases.NEVER_BACK_REGISTER_S:g} s \(the coordination service's "
        r"cluster_register_timeout_in_ms\); "
        r"ending worker:0 \(SIGKILL, exit status 137\) .*",
        leader["message"],
    ), leader["message"]
    # Worker 1 gets TensorFlow's registration timeout, re-raised naming worker 0,
    # unless the watchdog, whose clock started before TensorFlow's, ends it first.
    assert other["exit_code"] in (1, -9), outcome.report()
    assert other["seconds"] < bound + fault_cases.DETECT_BOUND_S
    assert re.search(
        rf"Strategy: worker:0 {LOOPBACK_TASK} did not join the multi_worker_mirrored cluster of worker:1 "
        r"(\(DeadlineExceededError: Deadline Exceeded\)|within)",
        other["message"],
    ), other["message"]


def assert_resumed_and_equals_unkilled(outcome, reference, last_backup: int) -> None:
    final = outcome.final
    assert final.exit_code == 0, outcome.report()
    assert (final.start_step, final.steps_run) == (
        last_backup,
        fault_cases.MWMS_STEPS - last_backup,
    ), outcome.report()
    assert final.iterations == fault_cases.MWMS_STEPS
    assert reference.final.iterations == fault_cases.MWMS_STEPS, reference.report()
    resumed, unkilled = dict(np.load(outcome.weights)), dict(np.load(reference.weights))
    assert sorted(resumed) == sorted(unkilled)
    for name, value in unkilled.items():
        np.testing.assert_allclose(resumed[name], value, rtol=0, atol=ATOL, err_msg=name)


@pytest.mark.multiprocess
def test_mwms_group_restart_resumes_from_the_backup_and_equals_the_unkilled_run(faults):
    outcome, reference = settled(faults["mwms"]), settled(faults["reference"])
    # The newest backup at or before the survivor's real step (its backup
    # callback runs before its step counts).
    reached = outcome.kill_point["survivor_step"]
    last_backup = reached // fault_cases.INTERVAL * fault_cases.INTERVAL
    assert_resumed_and_equals_unkilled(outcome, reference, last_backup)


@pytest.mark.multiprocess
def test_mwms_only_the_chief_exports_and_the_backup_is_gone(faults):
    outcome = settled(faults["mwms"])
    assert outcome.exported == [outcome.serving_dir], outcome.report()
    # The other worker's scratch copy and every backup are removed.
    run_dir = os.path.join(os.path.dirname(outcome.serving_dir), "model_run")
    assert os.listdir(run_dir) == []


# --------------------------------------------------------------------------- #
# Multi-worker mirrored: worker 0 killed inside its second backup write (step 18)
# --------------------------------------------------------------------------- #


@pytest.mark.multiprocess
def test_kill_inside_a_backup_write_resumes_from_the_backup_before_it(faults):
    outcome, reference = settled(faults["in_backup"]), settled(faults["reference"])
    point = outcome.kill_point
    # The kill landed inside the write: the second checkpoint's files were
    # written, the state file still named the first.
    write = fault_cases.MWMS_BACKUP_WRITE
    assert point["backup_recorded"] == f"ckpt-{write - 1}", point
    assert {f"ckpt-{write - 1}.index", f"ckpt-{write}.index"} <= set(point["backup_files"]), point
    (lost,) = outcome.detection
    assert lost["exit_code"] == 1 and "lost worker:0 (" in lost["error"], outcome.report()
    assert not outcome.exported_by_failed
    # The unrecorded write is not read: the restart resumes from the first backup.
    assert_resumed_and_equals_unkilled(outcome, reference, (write - 1) * fault_cases.INTERVAL)
    # The kill came in the write at step 18: the survivor had run its 17 or 18 steps.
    assert point["survivor_step"] >= write * fault_cases.INTERVAL - 1, outcome.report()
    assert outcome.exported == [outcome.serving_dir]


# --------------------------------------------------------------------------- #
# Parameter server: worker 1 killed mid-epoch after 18, back at 36; ps killed
# mid-epoch after 45; the coordinator at 54
# --------------------------------------------------------------------------- #


@pytest.mark.multiprocess
def test_ps_worker_killed_training_goes_on_and_the_restarted_worker_rejoins(faults):
    outcome = settled(faults["ps"])
    lost = outcome.detection[0]
    assert lost["fault"] == "ps_worker" and lost["mid_epoch"], lost
    # From the epoch end before the kill to the restart (held at epoch end 36)
    # the coordinator ran, by its own count of steps (worker 0 alone after the
    # kill), at least those epochs' steps and at most one more (the killed
    # worker's step in flight, run again elsewhere after it may have been
    # applied: the coordinator runs a step at least once).
    nominal = 36 - lost["landed_after"]
    assert nominal <= lost["steps_without_it"] <= nominal + 1, lost
    assert outcome.rejoined["recovered"], outcome.report()
    steps = fault_cases.PS_STEPS["all"]
    assert outcome.final.exit_code == 0, outcome.report()
    assert steps <= outcome.final.iterations <= steps + 1, outcome.report()


@pytest.mark.multiprocess
def test_ps_server_killed_mid_epoch_fails_the_coordinator_naming_it_and_exports_nothing(faults):
    outcome = settled(faults["ps"])
    lost = next(d for d in outcome.detection if d["fault"] == "ps_server")
    assert lost["mid_epoch"], lost
    assert lost["exit_code"] == 1, outcome.report()
    assert lost["seconds"] < fault_cases.DETECT_BOUND_S
    assert re.match(
        rf"PeerLost: Trainer: chief:0 of the parameter_server cluster lost ps:0 {LOOPBACK_TASK} "
        r"\(UnavailableError: .*\); the parameter server's variables are gone with it: the job "
        r"restarts \(kubeflow.max_restarts\) and the coordinator resumes from the last backup in "
        r".*/ps/model_run/backup$",
        lost["error"],
    ), lost["error"]
    assert not outcome.exported_by_failed
    # The restarted ps and coordinator resume from the backup at the epoch end before the fault.
    assert outcome.attempts[1].start_step == lost["landed_iterations"], outcome.report()


@pytest.mark.multiprocess
def test_ps_chief_killed_restarts_alone_resumes_from_the_backup_and_only_it_exports(faults):
    outcome = settled(faults["ps"])
    killed = next(d for d in outcome.detection if d["fault"] == "chief")
    assert outcome.attempts[1].exit_code == -9
    final = outcome.final
    assert (final.exit_code, final.start_step) == (0, killed["iterations"]), outcome.report()
    # Every attempt started from the newest backup, at the epoch end before its fault.
    lost_ps = next(d for d in outcome.detection if d["fault"] == "ps_server")
    starts = [a.start_step for a in outcome.attempts]
    assert starts == [0, lost_ps["landed_iterations"], killed["iterations"]], outcome.report()
    assert outcome.exported == [outcome.serving_dir]
