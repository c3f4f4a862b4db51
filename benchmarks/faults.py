"""What each fault of a multi-task Trainer costs: a worker, a parameter server or the chief killed.

    .venv/bin/python benchmarks/faults.py [--repeats 3] [--workdir DIR]

Runs every fault kind of `components/testing/fault_cases.py` on its own (the same
scenarios the fault tests run, on the same launcher machinery), each beside
the unkilled run of the same job, on the tiny penguins teacher, `--repeats`
passes over all of them (the machine is shared: medians). Prints one JSON
line per fault:

- `fault`: `mwms_worker` (a multi-worker-mirrored worker killed),
  `ps_worker` (a parameter-server worker killed, restarted later),
  `ps_server` (the parameter server killed), `chief` (the
  parameter-server coordinator killed);
- `as_specified`: in every pass the job did what the issue specifies for
  this fault, checked item by item (`checks`; `checks_failed` lists any
  that failed);
- `survived`: in every pass the job finished its configured steps and
  exported, after restarts where the fault needs them;
- `seconds_lost`: median over the passes of the wall time of the job with
  the fault minus the unkilled job's in the same pass (restarts here are
  immediate; recreating pods on a cluster adds its own time);
- `steps_repeated`: steps run again after resuming from the backup (the
  most in any pass);
- `final_equals_unkilled`: in every pass the final weights equal the
  unkilled run's within 1e-6 (see `tests/components/training/test_faults.py`
  for the tolerance). Parameter-server training is asynchronous, so
  `unkilled_runs_equal` says whether two unkilled runs agree even.

The last line: `exported_by_failed` (failed attempts that left a serving
model a Pusher could push), `hangs` (tasks that overran a bound and were
killed), the counts of faults survived and as specified, and the machine's
load average before and after (the runs share two cores with whatever else
runs).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from components.testing import fault_cases, local_cluster

ATOL = 1e-6


def same_weights(a: str | None, b: str | None) -> bool:
    import numpy as np

    if not a or not b:
        return False
    left, right = dict(np.load(a)), dict(np.load(b))
    return sorted(left) == sorted(right) and all(
        np.allclose(left[k], right[k], rtol=0, atol=ATOL) for k in left
    )


def finished(outcome: fault_cases.Outcome, steps: int) -> bool:
    final = outcome.final
    return bool(
        final
        and final.exit_code == 0
        and final.iterations == steps
        and outcome.exported == [outcome.serving_dir]
    )


def checks(fault: str, outcome: fault_cases.Outcome, steps: int) -> dict[str, bool]:
    """The specified behaviour of each fault, item by item."""
    failing = [d for d in outcome.detection if "exit_code" in d]
    named = {"mwms_worker": "lost worker:1 (", "ps_server": "lost ps:0 ("}.get(fault)
    out = {
        "no_hang": not outcome.hung,
        "finished": finished(outcome, steps),
        "nothing_exported_by_a_failed_attempt": not outcome.exported_by_failed,
    }
    if named:
        out["failed_within_bound_naming_it"] = bool(failing) and all(
            d["exit_code"] == 1
            and d["seconds"] < fault_cases.DETECT_BOUND_S
            and named in d["error"]
            for d in failing
        )
        killed_at = (
            fault_cases.MWMS_KILL_AT if fault == "mwms_worker" else outcome.detection[-1]["step"]
        )
        backup = killed_at // fault_cases.INTERVAL * fault_cases.INTERVAL
        out["resumed_from_the_last_backup"] = outcome.final.start_step == backup
    if fault == "mwms_worker":
        alone = outcome.never_back or {}
        out["worker_never_back_fails_naming_it"] = bool(alone) and all(
            a["exit_code"] in (1, -9) and a["missing"] in a["message"] for a in alone.values()
        )
    if fault == "ps_worker":
        out["trained_on_without_it"] = outcome.detection[0].get("steps_without_it", 0) > 0
        out["rejoined"] = bool(outcome.rejoined and outcome.rejoined.get("recovered"))
        out["coordinator_never_failed"] = len(outcome.attempts) == 1
    if fault == "chief":
        killed_at = outcome.detection[-1]["step"]
        out["resumed_from_the_last_backup"] = outcome.final.start_step == killed_at
    return out


def jobs(launcher, data, root: str, repeat: int) -> list[tuple[str, object]]:
    """One pass: each fault beside its unkilled job (keys `<job>.<repeat>`)."""

    def mwms(name, **kwargs):
        return lambda: fault_cases.mwms_job(launcher, data, root, f"{name}.{repeat}", **kwargs)

    def ps(name, plan):
        return lambda: fault_cases.ps_job(launcher, data, root, f"{name}.{repeat}", plan)

    return [
        ("mwms_none", mwms("mwms_none", kill=False)),
        ("mwms_worker", mwms("mwms_worker")),
        ("ps_none", ps("ps_none", "none")),
        *((plan, ps(plan, plan)) for plan in ("ps_worker", "ps_server", "chief")),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", default="")
    parser.add_argument(
        "--repeats", type=int, default=3, help="passes over every job (medians are reported)"
    )
    args = parser.parse_args()
    load_before = os.getloadavg()
    runs: dict[str, list[fault_cases.Outcome]] = {}
    with tempfile.TemporaryDirectory(prefix="tfxkit-faults-") as tmp:
        root = args.workdir or tmp
        with local_cluster.Launcher(os.path.join(root, "tasks")) as launcher:
            data = launcher.penguins(os.path.join(root, "data"))
            for repeat in range(max(2, args.repeats)):
                # Two passes at least: the unkilled parameter-server job twice.
                todo = jobs(launcher, data, root, repeat)
                if repeat >= args.repeats:
                    todo = [job for job in todo if job[0] == "ps_none"]
                for key, run in todo:
                    started = time.monotonic()
                    runs.setdefault(key, []).append(run())
                    print(
                        f"# {key} pass {repeat}: {time.monotonic() - started:.1f} s",
                        file=sys.stderr,
                        flush=True,
                    )
        # Before the work directory goes: the weights are compared.
        report(runs, load_before)


def report(runs: dict[str, list[fault_cases.Outcome]], load_before: tuple) -> None:
    """Prints the JSON lines (see the module docstring)."""
    unkilled_ps = runs["ps_none"]
    unkilled_ps_equal = same_weights(unkilled_ps[0].weights, unkilled_ps[1].weights)
    lines = []
    for fault in ("mwms_worker", "ps_worker", "ps_server", "chief"):
        mwms = fault == "mwms_worker"
        pairs = list(zip(runs[fault], runs["mwms_none" if mwms else "ps_none"], strict=False))
        steps = fault_cases.MWMS_STEPS if mwms else fault_cases.PS_STEPS_DEFAULT
        items = [checks(fault, outcome, steps) for outcome, _ in pairs]
        lost = [round(outcome.wall_s - unkilled.wall_s, 1) for outcome, unkilled in pairs]
        line = {
            "fault": fault,
            "as_specified": all(all(i.values()) for i in items),
            "survived": all(finished(outcome, steps) for outcome, _ in pairs),
            "seconds_lost": statistics.median(lost),
            "steps_repeated": max(outcome.steps_repeated for outcome, _ in pairs),
            "final_equals_unkilled": all(
                same_weights(outcome.weights, unkilled.weights) for outcome, unkilled in pairs
            ),
            "passes": len(pairs),
            "seconds_lost_each": lost,
            "wall_s_each": [outcome.wall_s for outcome, _ in pairs],
            "unkilled_wall_s_each": [unkilled.wall_s for _, unkilled in pairs],
            "restarts": len(pairs[0][0].attempts) - 1,
            "detected_s_each": [
                d["seconds"] for outcome, _ in pairs for d in outcome.detection if "seconds" in d
            ],
            "checks_failed": sorted({k for i in items for k, ok in i.items() if not ok}),
        }
        if mwms:
            line["never_back_s_each"] = [
                {k: v["seconds"] for k, v in (outcome.never_back or {}).items()}
                for outcome, _ in pairs
            ]
        else:
            line["unkilled_runs_equal"] = unkilled_ps_equal
        if fault == "ps_worker":
            line["rejoined_after_s_each"] = [
                (outcome.rejoined or {}).get("seconds") for outcome, _ in pairs
            ]
        lines.append(line)
        print(json.dumps(line), flush=True)
    every = [outcome for outcomes in runs.values() for outcome in outcomes]
    print(
        json.dumps(
            {
                "faults": len(lines),
                "survived": sum(line["survived"] for line in lines),
                "as_specified": sum(line["as_specified"] for line in lines),
                "exported_by_failed": sum(o.exported_by_failed for o in every),
                "hangs": sum(len(o.hung) for o in every),
                "jobs_run": len(every),
                "load_average_before": round(load_before[0], 2),
                "load_average_after": round(os.getloadavg()[0], 2),
                "cpus": os.cpu_count(),
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
