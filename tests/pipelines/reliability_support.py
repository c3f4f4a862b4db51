"""What the reliability test modules share.

The bad-input catalogue (pipelines/testing/reliability_cases.py) runs in two
modules, so that pytest-xdist (`--dist loadscope`, one module per worker)
can place them on different workers: test_reliability_proceeds.py holds the
cases documented to proceed (whole runs that push a model), and
test_reliability.py every other case. test_reliability_kills.py kills runs
part-way. All of them start from copies of the one pushed run of the
`reliability_baseline` fixture (tests/conftest.py), built once per test run.
"""

from __future__ import annotations

import pytest

from pipelines.testing.reliability_cases import CASES, Case, run_case


def case_params(proceeds: bool) -> list:
    """The catalogue's cases documented to proceed (`proceeds=True`: each runs
    the whole pipeline on new data and pushes a model), or all the others, as
    `pytest.param`s named by case: the two calls split the catalogue."""
    return [
        # A case with its own `execute` starts processes (a child run, the full disk's helper).
        pytest.param(c, marks=[pytest.mark.multiprocess] if c.execute else [], id=c.name)
        for c in CASES
        if (c.outcome == "proceeds") == proceeds
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
