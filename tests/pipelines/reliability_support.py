"""What the reliability test modules share.

The bad-input catalogue (testkit/reliability_cases.py) runs in two
modules, so that pytest-xdist (`--dist loadscope`, one module per worker)
can place them on different workers: test_reliability_proceeds.py holds the
cases documented to proceed (whole runs that push a model), and
test_reliability.py every other case. test_reliability_kills.py kills runs
part-way. All of them start from copies of the one pushed run of the
`reliability_baseline` fixture (tests/conftest.py), built once per test run.
"""

from __future__ import annotations

import pytest

from testkit.reliability_cases import CASES, Case, CsvRows, run_case, together


def case_params(proceeds: bool) -> list:
    """The catalogue's cases documented to proceed (`proceeds=True`: each a whole
    run on new data that pushes a model), or all the others, as `pytest.param`s
    named by case: the two calls split the catalogue.

    The cases that proceed on changed CSV rows run as one case (`together`): one
    whole run with every change, each case's check on it. benchmarks/reliability.py
    shows each of them proceeding on its own; here each whole run costs about a
    minute, and a regression in any of them still fails the run or its check.
    """
    cases = [c for c in CASES if (c.outcome == "proceeds") == proceeds]
    if proceeds:
        rows = [c for c in cases if isinstance(c.make, CsvRows)]
        cases = [together(rows), *(c for c in cases if c not in rows)]
    return [
        # A case with its own `execute` starts processes (a child run, the full disk's helper).
        pytest.param(c, marks=[pytest.mark.multiprocess] if c.execute else [], id=c.name)
        for c in cases
    ]


def assert_behaves_as_documented(case: Case, baseline, tmp_path) -> None:
    """Runs `case` against a copy of the baseline run (`(output dir, config)`)
    and checks the catalogue's promise; skips a case this host cannot set up."""
    baseline_dir, config = baseline
    result = run_case(case, baseline_dir, str(tmp_path), config)
    if result.skipped:
        pytest.skip(f"{case.name}: {result.skipped}")
    assert result.wrongly_pushed == 0, result
    assert result.lost_models == 0, result
    assert result.as_documented, result
