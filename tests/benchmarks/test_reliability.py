"""`benchmarks/reliability.py`: what it refuses before any pipeline runs."""

from __future__ import annotations

import pytest

from benchmarks import reliability


def test_an_unknown_case_is_refused_naming_the_cases(capsys):
    with pytest.raises(SystemExit) as raised:
        reliability.main(["no_such_case"])
    assert raised.value.code == 2
    err = capsys.readouterr().err
    assert "unknown case(s) ['no_such_case']" in err and "malformed_csv_row" in err
