"""Reliability summary: runs the bad-input catalogue against a pushed model.

Each case (testkit/reliability_cases.py) starts from a copy of a run
that already pushed a model, breaks one thing and runs the real pipeline.
Prints one JSON line per case, then the summary as the last line:
{"cases", "as_documented", "skipped", "wrongly_pushed", "lost_models"}. A case
this host cannot set up (the full disk needs `unshare` and `mount`) is
`skipped`, with the reason, and counts neither as documented nor as failed:
cases = as_documented + skipped + the rest. A run of the whole catalogue
writes its output to `benchmarks/results/reliability.json`; a run of named
cases writes nothing (it would replace the catalogue's file with a part).

Usage: python benchmarks/reliability.py [CASE ...] [--shared-with TEXT] [--no-results]
    (default: every case)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import warnings

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)
warnings.filterwarnings("ignore", category=FutureWarning)

from pipelines import local_runner  # noqa: E402
from pipelines.configs import load_config  # noqa: E402
from testkit import results as results_lib  # noqa: E402
from testkit.reliability_cases import CASES, baseline_config, run_case  # noqa: E402
from testkit.tiny import tiny  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", metavar="CASE", help="default: every case")
    parser.add_argument(
        "--shared-with", default="", help="what else ran on the cores (default: idle)"
    )
    parser.add_argument("--no-results", action="store_true", help="do not write benchmarks/results")
    args = parser.parse_args(argv)
    names = args.names
    unknown = sorted(set(names) - {c.name for c in CASES})
    if unknown:
        parser.error(f"unknown case(s) {unknown}; the cases: {[c.name for c in CASES]}")
    cases = [c for c in CASES if not names or c.name in names]
    # The same tiny run as the tests: step counts and thresholds that test the
    # promise (fail / proceed, push / no push), not model quality.
    base = tiny(load_config("taxi"))
    with tempfile.TemporaryDirectory(prefix="tfxkit-reliability-") as work:
        config = baseline_config(base, work)
        baseline_dir = os.path.join(work, "baseline")
        with open(os.devnull, "w") as quiet:
            local_runner.run(config, baseline_dir, stream=quiet)
        results, lines = [], []
        for case in cases:
            case_dir = os.path.join(work, case.name)
            start = time.monotonic()
            with open(os.devnull, "w") as quiet:
                stdout, sys.stdout = sys.stdout, quiet
                try:
                    result = run_case(case, baseline_dir, case_dir, config)
                finally:
                    sys.stdout = stdout
            results.append(result)
            lines.append(
                {
                    "case": case.name,
                    "expected": case.outcome,
                    "as_documented": result.as_documented,
                    "skipped": result.skipped or None,
                    "wrongly_pushed": result.wrongly_pushed,
                    "lost_models": result.lost_models,
                    "seconds": round(time.monotonic() - start, 1),
                    "detail": result.detail.splitlines()[0][:200] if result.detail else "",
                }
            )
            print(json.dumps(lines[-1]), flush=True)
    lines.append(
        {
            "cases": len(results),
            "as_documented": sum(r.as_documented for r in results),
            "skipped": sum(bool(r.skipped) for r in results),
            "wrongly_pushed": sum(r.wrongly_pushed for r in results),
            "lost_models": sum(r.lost_models for r in results),
        }
    )
    print(json.dumps(lines[-1]), flush=True)
    if not names and not args.no_results:
        path = results_lib.write(
            "reliability",
            lines,
            shared_with=args.shared_with or None,
            argv=sys.argv[1:] if argv is None else argv,
        )
        print(f"# wrote {os.path.relpath(path, REPO_ROOT)}", file=sys.stderr)


if __name__ == "__main__":
    main()
