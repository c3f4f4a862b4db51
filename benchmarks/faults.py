"""What each fault of a multi-task Trainer costs: a worker, a parameter server or the chief killed.

    .venv/bin/python benchmarks/faults.py [--repeats 3] [--workdir DIR] [--shared-with WHAT]

Runs every fault kind of `testkit/fault_cases.py` on its own (the same
scenarios the fault tests run, on the same launcher machinery), each beside
the unkilled run of the same job, on the tiny penguins teacher, `--repeats`
passes over all of them; a pass runs its jobs in the reverse order of the
pass before (so with an even number of passes each fault runs before and
after its unkilled job equally often), and pass r seeds the random kill
moments with r. Prints one JSON
line per fault:

- `fault`: `mwms_worker` (a multi-worker-mirrored worker killed at a seeded
  random moment while steps run), `mwms_in_backup` (worker 0, which writes
  the backup, killed inside a backup write), `ps_worker` (a
  parameter-server worker killed mid-epoch, restarted an epoch or more
  later), `ps_server` (the parameter server killed mid-epoch), `chief`
  (the parameter-server coordinator killed at an epoch end);
- `as_specified`: in every pass the job did what the issue specifies for
  this fault, checked item by item (`checks`; `checks_failed` lists any
  that failed);
- `survived`: in every pass the job finished its configured steps and
  exported, after restarts where the fault needs them;
- `seconds_lost`: the mean over passes of the wall time of the job with
  the fault minus the unkilled job's in the same pass, with its 95% t
  interval (`seconds_lost_ci95`; restarts here are immediate; recreating
  pods on a cluster adds its own time);
- `steps_repeated_each`: steps run again after resuming from the backup,
  per pass (the multi-worker jobs count every step; the parameter-server
  coordinator counts epoch ends only, so the part of an epoch lost
  mid-epoch is not in it);
- `final_equals_unkilled`: in every pass the final weights equal the
  unkilled run's within 1e-6 (see `tests/components/training/test_faults.py`
  for the tolerance). Parameter-server training is asynchronous, so
  `unkilled_runs_equal` says whether two unkilled runs agree even.

The last line: `exported_by_failed` (failed attempts that left a serving
model a Pusher could push), `hangs` (tasks that overran a bound and were
killed), the counts of faults survived and as specified, and the machine's
load average before and after. The lines go to `benchmarks/results/faults.json`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from testkit import fault_cases, local_cluster, results, stats

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAULTS = ("mwms_worker", "mwms_in_backup", "ps_worker", "ps_server", "chief")

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
    """Exit 0, one export, and the configured steps: one more when a parameter-server
    worker died with a step in flight (run again elsewhere: at least once)."""
    final = outcome.final
    again = 1 if outcome.fault == "ps_worker" else 0
    return bool(
        final
        and final.exit_code == 0
        and final.iterations is not None
        and steps <= final.iterations <= steps + again
        and outcome.exported == [outcome.serving_dir]
    )


def checks(fault: str, outcome: fault_cases.Outcome, steps: int) -> dict[str, bool]:
    """The specified behaviour of each fault, item by item."""
    failing = [d for d in outcome.detection if "exit_code" in d]
    named = {
        "mwms_worker": "lost worker:1 (",
        "mwms_in_backup": "lost worker:0 (",
        "ps_server": "lost ps:0 (",
    }.get(fault)
    point = outcome.kill_point or {}
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
    if fault == "mwms_worker":
        reached = point.get("survivor_step", -1)
        out["landed_near_its_moment"] = (
            0
            <= point.get("victim_step", -99) - point.get("after", 0)
            <= fault_cases.MWMS_RANDOM_SLACK
        )
        out["resumed_from_the_last_backup"] = (
            outcome.final.start_step == reached // fault_cases.INTERVAL * fault_cases.INTERVAL
        )
        alone = outcome.never_back or {}
        out["worker_never_back_fails_naming_it"] = bool(alone) and all(
            a["exit_code"] in (1, -9) and a["missing"] in a["message"] for a in alone.values()
        )
    if fault == "mwms_in_backup":
        write = fault_cases.MWMS_BACKUP_WRITE
        out["killed_inside_the_write"] = point.get("backup_recorded") == f"ckpt-{write - 1}" and (
            f"ckpt-{write}.index" in point.get("backup_files", ())
        )
        out["resumed_from_the_backup_before_it"] = (
            outcome.final.start_step == (write - 1) * fault_cases.INTERVAL
        )
    if fault in ("ps_worker", "ps_server"):
        kills = [d for d in outcome.detection if d["fault"] == fault]
        out["landed_mid_epoch"] = bool(kills) and all(d["mid_epoch"] for d in kills)
    if fault == "ps_worker":
        lost = outcome.detection[0] if outcome.detection else {}
        out["trained_on_without_it"] = lost.get("steps_without_it", 0) >= fault_cases.INTERVAL
        out["rejoined"] = bool(outcome.rejoined and outcome.rejoined.get("recovered"))
        out["coordinator_never_failed"] = len(outcome.attempts) == 1
    if fault == "ps_server":
        lost = outcome.detection[-1] if outcome.detection else {}
        out["resumed_from_the_last_backup"] = outcome.final.start_step == lost.get(
            "landed_iterations", -1
        )
    if fault == "chief":
        killed = outcome.detection[-1] if outcome.detection else {}
        out["resumed_from_the_last_backup"] = outcome.final.start_step == killed.get(
            "iterations", -1
        )
    return out


def jobs(launcher, data, root: str, repeat: int) -> list[tuple[str, object]]:
    """One pass: each fault beside its unkilled job (keys `<job>.<repeat>`), the
    random kills seeded with `repeat`, in the reverse order of the pass before."""

    def mwms(name, **kwargs):
        return lambda: fault_cases.mwms_job(launcher, data, root, f"{name}.{repeat}", **kwargs)

    def ps(name, plan):
        return lambda: fault_cases.ps_job(
            launcher, data, root, f"{name}.{repeat}", plan, seed=repeat
        )

    todo = [
        ("mwms_none", mwms("mwms_none", kill=None)),
        ("mwms_worker", mwms("mwms_worker", kill="random", seed=repeat)),
        ("mwms_in_backup", mwms("mwms_in_backup", kill="in_backup", never_back=False)),
        ("ps_none", ps("ps_none", "none")),
        *((plan, ps(plan, plan)) for plan in ("ps_worker", "ps_server", "chief")),
    ]
    return todo[::-1] if repeat % 2 else todo


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", default="")
    parser.add_argument(
        "--repeats", type=int, default=3, help="passes over every job (at least 2: intervals)"
    )
    parser.add_argument(
        "--shared-with", default=None, help="what else ran on the cores (default: idle)"
    )
    parser.add_argument("--no-results", action="store_true", help="do not write benchmarks/results")
    args = parser.parse_args()
    if args.repeats < 2:
        parser.error(f"--repeats {args.repeats}: an interval needs 2 passes or more")
    load_before = os.getloadavg()
    runs: dict[str, list[fault_cases.Outcome]] = {}
    with tempfile.TemporaryDirectory(prefix="tfxkit-faults-") as tmp:
        root = args.workdir or tmp
        with local_cluster.Launcher(os.path.join(root, "tasks")) as launcher:
            data = launcher.penguins(os.path.join(root, "data"))
            for repeat in range(args.repeats):
                for key, run in jobs(launcher, data, root, repeat):
                    started = time.monotonic()
                    runs.setdefault(key, []).append(run())
                    print(
                        f"# {key} pass {repeat}: {time.monotonic() - started:.1f} s",
                        file=sys.stderr,
                        flush=True,
                    )
        # Before the work directory goes: the weights are compared.
        lines = report(runs, load_before)
    if not args.no_results:
        path = results.write("faults", lines, shared_with=args.shared_with, argv=sys.argv[1:])
        print(f"results: {os.path.relpath(path, REPO_ROOT)}", file=sys.stderr)


def report(runs: dict[str, list[fault_cases.Outcome]], load_before: tuple) -> list[dict]:
    """Prints the JSON lines (see the module docstring) and returns them."""
    unkilled_ps = runs["ps_none"]
    unkilled_ps_equal = same_weights(unkilled_ps[0].weights, unkilled_ps[1].weights)
    lines = []
    for fault in FAULTS:
        mwms = fault.startswith("mwms")
        pairs = list(zip(runs[fault], runs["mwms_none" if mwms else "ps_none"], strict=True))
        steps = fault_cases.MWMS_STEPS if mwms else fault_cases.PS_STEPS_DEFAULT
        items = [checks(fault, outcome, steps) for outcome, _ in pairs]
        lost = [round(outcome.wall_s - unkilled.wall_s, 2) for outcome, unkilled in pairs]
        mean, low, high = stats.t_interval(lost)
        line = {
            "fault": fault,
            "as_specified": all(all(i.values()) for i in items),
            "survived": all(finished(outcome, steps) for outcome, _ in pairs),
            "seconds_lost": round(mean, 2),
            "seconds_lost_ci95": [round(low, 2), round(high, 2)],
            "steps_repeated_each": [outcome.steps_repeated for outcome, _ in pairs],
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
            # Where each pass's kills landed (parameter-server jobs: their detection records).
            "kill_points": [
                outcome.kill_point
                or [{k: v for k, v in d.items() if k != "error"} for d in outcome.detection]
                for outcome, _ in pairs
            ],
            "checks_failed": sorted({k for i in items for k, ok in i.items() if not ok}),
        }
        if fault == "mwms_worker":
            line["never_back_s_each"] = [
                {k: v["seconds"] for k, v in (outcome.never_back or {}).items()}
                for outcome, _ in pairs
            ]
        if not mwms:
            line["unkilled_runs_equal"] = unkilled_ps_equal
        if fault == "ps_worker":
            line["steps_run_twice_each"] = [
                (outcome.final.iterations or 0) - steps for outcome, _ in pairs
            ]
            line["steps_without_it_each"] = [
                outcome.detection[0].get("steps_without_it") if outcome.detection else None
                for outcome, _ in pairs
            ]
            line["rejoined_after_s_each"] = [
                (outcome.rejoined or {}).get("seconds") for outcome, _ in pairs
            ]
        lines.append(line)
        print(json.dumps(line), flush=True)
    every = [outcome for outcomes in runs.values() for outcome in outcomes]
    lines.append(
        {
            "faults": len(lines),
            "survived": sum(line["survived"] for line in lines),
            "as_specified": sum(line["as_specified"] for line in lines),
            "exported_by_failed": sum(o.exported_by_failed for o in every),
            "hangs": sum(len(o.hung) for o in every),
            "jobs_run": len(every),
            "seconds_lost": {line["fault"]: line["seconds_lost"] for line in lines},
            "load_average_before": round(load_before[0], 2),
            "load_average_after": round(os.getloadavg()[0], 2),
            "cpus": os.cpu_count(),
        }
    )
    print(json.dumps(lines[-1]), flush=True)
    return lines


if __name__ == "__main__":
    main()
