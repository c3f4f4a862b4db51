"""Faults of a multi-task Trainer: a worker, a parameter server or the chief killed mid-job.

Real clusters of processes on loopback (free ports), forked by one launcher
process (`components/testing/local_cluster.py`), killed with SIGKILL at known steps
and restarted as the generated manifests make Kubernetes restart them; the
scenarios themselves live in `components/testing/fault_cases.py`, which
`benchmarks/faults.py` times. Every wait there is bounded, a task that
overruns its bound is killed and listed (`Outcome.hung`), and leaving the
module fixture kills the launcher's whole process group.

One module fixture runs, side by side on the launcher: the
multi-worker-mirrored scenario (a worker killed, each worker restarted
alone, the group restarted), and the parameter-server scenario (every fault
in one job: a worker killed and restarted, the ps killed, the coordinator
killed) followed by the unkilled multi-worker run the resumed one is
compared with. The model is the penguins teacher (a few hundred
parameters), 45 and 54 steps.

Tolerance: the resumed run's weights are compared with the unkilled run's
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

from components.testing import fault_cases, local_cluster, penguins
from components.training import peers
from tests.conftest import data_file

ATOL = 1e-6
LOOPBACK_TASK = r"\(127\.0\.0\.1:\d+\)"


@pytest.fixture(scope="module")
def faults(tmp_path_factory):
    """The outcomes of both scenarios and the unkilled multi-worker run."""
    data_file(os.path.basename(penguins.PENGUINS_CSV))
    root = str(tmp_path_factory.mktemp("faults"))
    with local_cluster.Launcher(os.path.join(root, "tasks")) as launcher:
        data = launcher.penguins(os.path.join(root, "data"))

        def mwms():
            return fault_cases.mwms_job(launcher, data, root, "mwms")

        def ps_then_reference():
            ps = fault_cases.ps_job(launcher, data, root, "ps", "all")
            reference = fault_cases.mwms_job(
                launcher, data, root, "reference", kill=False, export=False
            )
            return ps, reference

        with futures.ThreadPoolExecutor(max_workers=2) as pool:
            mwms_run, ps_run = pool.submit(mwms), pool.submit(ps_then_reference)
            outcomes = {"mwms": mwms_run.result()}
            outcomes["ps"], outcomes["reference"] = ps_run.result()
    return outcomes


def settled(outcome: fault_cases.Outcome) -> fault_cases.Outcome:
    """The outcome, once no task overran a bound (every later assertion assumes it)."""
    assert outcome.hung == [], outcome.report()
    return outcome


# --------------------------------------------------------------------------- #
# Multi-worker mirrored: worker 1 killed at step 22 (last backup: 18)
# --------------------------------------------------------------------------- #


@pytest.mark.multiprocess
def test_mwms_survivor_fails_within_the_bound_naming_the_killed_worker(faults):
    outcome = settled(faults["mwms"])
    (lost,) = outcome.detection
    assert lost["exit_code"] == 1, outcome.report()
    assert lost["seconds"] < fault_cases.DETECT_BOUND_S
    assert re.match(
        rf"PeerLost: Trainer: worker:0 of the multi_worker_mirrored cluster lost worker:1 {LOOPBACK_TASK} "
        r"\(UnavailableError: .*heartbeat timeout.*\); the whole group restarts \(kubeflow.max_restarts\) "
        r"and resumes from the last backup in .*/mwms/model_run/backup$",
        lost["error"],
    ), lost["error"]
    failed = outcome.attempts[0]
    assert (failed.start_step, failed.steps_run) == (0, fault_cases.MWMS_KILL_AT)
    assert not outcome.exported_by_failed


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


@pytest.mark.multiprocess
def test_mwms_group_restart_resumes_from_the_backup_and_equals_the_unkilled_run(faults):
    outcome, reference = settled(faults["mwms"]), settled(faults["reference"])
    final = outcome.final
    assert final.exit_code == 0, outcome.report()
    last_backup = fault_cases.MWMS_KILL_AT // fault_cases.INTERVAL * fault_cases.INTERVAL
    assert (final.start_step, final.steps_run) == (
        last_backup,
        fault_cases.MWMS_STEPS - last_backup,
    )
    assert final.iterations == fault_cases.MWMS_STEPS
    assert outcome.steps_repeated == fault_cases.MWMS_KILL_AT - last_backup
    assert reference.final.iterations == fault_cases.MWMS_STEPS, reference.report()
    resumed, unkilled = dict(np.load(outcome.weights)), dict(np.load(reference.weights))
    assert sorted(resumed) == sorted(unkilled)
    for name, value in unkilled.items():
        np.testing.assert_allclose(resumed[name], value, rtol=0, atol=ATOL, err_msg=name)


@pytest.mark.multiprocess
def test_mwms_only_the_chief_exports_and_the_backup_is_gone(faults):
    outcome = settled(faults["mwms"])
    assert outcome.exported == [outcome.serving_dir], outcome.report()
    # The other worker's scratch copy and every backup are removed.
    run_dir = os.path.join(os.path.dirname(outcome.serving_dir), "model_run")
    assert os.listdir(run_dir) == []


# --------------------------------------------------------------------------- #
# Parameter server: worker 1 killed at 9, back at 27; ps killed at 36; chief at 45
# --------------------------------------------------------------------------- #


@pytest.mark.multiprocess
def test_ps_worker_killed_training_goes_on_and_the_restarted_worker_rejoins(faults):
    outcome = settled(faults["ps"])
    lost = outcome.detection[0]
    assert lost["fault"] == "ps_worker"
    # The coordinator trained from step 9 to step 27 on worker 0 alone.
    assert lost["steps_without_it"] == 18, outcome.report()
    assert outcome.rejoined["recovered"], outcome.report()
    assert outcome.final.exit_code == 0 and outcome.final.iterations == 54, outcome.report()


@pytest.mark.multiprocess
def test_ps_server_killed_fails_the_coordinator_naming_it_and_exports_nothing(faults):
    outcome = settled(faults["ps"])
    lost = next(d for d in outcome.detection if d["fault"] == "ps_server")
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
    # The restarted ps and coordinator resume from the backup at the fault.
    assert outcome.attempts[1].start_step == lost["step"], outcome.report()


@pytest.mark.multiprocess
def test_ps_chief_killed_restarts_alone_resumes_from_the_backup_and_only_it_exports(faults):
    outcome = settled(faults["ps"])
    killed = next(d for d in outcome.detection if d["fault"] == "chief")
    assert outcome.attempts[1].exit_code == -9
    final = outcome.final
    assert (final.exit_code, final.start_step, final.iterations) == (0, killed["step"], 54), (
        outcome.report()
    )
    # Faults fall on epoch ends, which are the backups: nothing runs twice.
    assert outcome.steps_repeated == 0
    assert outcome.exported == [outcome.serving_dir]
