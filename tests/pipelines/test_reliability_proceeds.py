"""The catalogue's bad inputs documented to proceed (see reliability_cases): each
runs the whole pipeline on new data against a copy of a run that already pushed
a model, and must push one more model, leaving the earlier one intact. The cases
that change only the CSV's rows run together, as one run (`case_params`). The
other cases are in test_reliability.py; a module of their own lets pytest-xdist
run them beside the rest."""

from __future__ import annotations

import csv
import dataclasses

import pytest

from testkit.reliability_cases import (
    CASES,
    read_taxi_rows,
    shipped_catalogue_pipeline,
    together,
)
from tests.pipelines.reliability_support import assert_behaves_as_documented, case_params


@pytest.mark.e2e
@pytest.mark.parametrize("case", case_params(proceeds=True))
def test_bad_input_behaves_as_documented(case, reliability_baseline, tmp_path):
    assert_behaves_as_documented(case, reliability_baseline, tmp_path)


def _case(name):
    (case,) = [c for c in CASES if c.name == name]
    return case


def test_cases_together_write_every_change_in_one_csv(tmp_path):
    names = ["nan_inf_floats", "new_category", "dropped_excluded_column", "unused_csv_column"]
    case = together([_case(n) for n in names])
    assert (case.name, case.outcome) == ("+".join(names), "proceeds")
    config = case.make(str(tmp_path), shipped_catalogue_pipeline())
    with open(config.data.path) as f:
        reader = csv.DictReader(f)
        rows = list(reader)
    _, clean = read_taxi_rows()
    assert reader.fieldnames[:2] == ["trip_id", "pickup_date"]
    assert "trip_start_timestamp" not in reader.fieldnames
    # Row 0 is in every case's "every n-th row"; row 1 in none of them.
    assert (rows[0]["fare"], rows[0]["trip_miles"]) == ("nan", "inf")
    assert (rows[0]["company"], rows[0]["payment_type"]) == ("Brand New Cab Co", "Crypto")
    assert rows[0]["trip_id"] == "t-00000"
    assert (rows[1]["fare"], rows[1]["company"]) == (clean[1]["fare"], clean[1]["company"])
    assert len(rows) == len(clean)


def test_cases_together_report_each_failed_check_by_case():
    def failing(name, problem):
        return dataclasses.replace(_case(name), check=lambda out, base: problem)

    case = together(
        [
            failing("nan_inf_floats", "NaN kept"),
            failing("dropped_excluded_column", ""),
            failing("new_category", "no OOV bucket"),
        ]
    )
    assert case.check("out", "baseline") == "nan_inf_floats: NaN kept; new_category: no OOV bucket"
    assert together([_case("dropped_excluded_column")]).check is None


def test_the_two_test_modules_run_every_case_of_the_catalogue_once():
    names = [
        name
        for proceeds in (True, False)
        for param in case_params(proceeds)
        for name in param.values[0].name.split("+")
    ]
    assert sorted(names) == sorted(c.name for c in CASES)


@pytest.mark.parametrize("name", ["wrong_type", "bom_csv_beside_readme"])
def test_only_cases_that_proceed_on_changed_rows_go_together(name):
    with pytest.raises(ValueError, match=name):
        together([_case("new_category"), _case(name)])
