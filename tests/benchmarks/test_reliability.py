"""`benchmarks/reliability.py`: what it refuses before any pipeline runs."""

from __future__ import annotations

import pytest

from benchmarks import reliability
from testkit import reliability_cases


def test_an_unknown_case_is_refused_naming_the_cases(capsys):
    with pytest.raises(SystemExit) as raised:
        reliability.main(["no_such_case"])
    assert raised.value.code == 2
    err = capsys.readouterr().err
    assert "unknown case(s) ['no_such_case']" in err and "malformed_csv_row" in err


def _catalogue_run(monkeypatch, tmp_path, argv):
    """`main(argv)` over two cases whose pipeline runs are replaced by their results (what
    is under test is which run writes a results file)."""
    cases = [
        reliability_cases.Case("first", "a first case", "fails", "", "", lambda w, c: c),
        reliability_cases.Case("second", "a second case", "proceeds", "", "", lambda w, c: c),
    ]
    written = []

    def write(name, lines, **kwargs):
        written.append((name, lines))
        return str(tmp_path / f"{name}.json")

    monkeypatch.setattr(reliability, "CASES", cases)
    monkeypatch.setattr(reliability.local_runner, "run", lambda *args, **kwargs: None)
    monkeypatch.setattr(
        reliability,
        "run_case",
        lambda case, *args: reliability_cases.Result(case.name, True, 0, 0, "as documented"),
    )
    monkeypatch.setattr(reliability.results_lib, "write", write)
    reliability.main(argv)
    return written


def test_the_whole_catalogue_writes_its_results_file(monkeypatch, tmp_path):
    ((name, lines),) = _catalogue_run(monkeypatch, tmp_path, [])
    assert name == "reliability"
    assert [line.get("case") for line in lines[:-1]] == ["first", "second"]
    assert lines[-1] == {
        "cases": 2,
        "as_documented": 2,
        "skipped": 0,
        "wrongly_pushed": 0,
        "lost_models": 0,
    }


def test_named_cases_write_no_results_file(monkeypatch, tmp_path):
    # A part of the catalogue must not replace the whole catalogue's file.
    assert _catalogue_run(monkeypatch, tmp_path, ["second"]) == []
