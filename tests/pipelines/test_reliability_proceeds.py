"""The catalogue's bad inputs documented to proceed (see reliability_cases): each
runs the whole pipeline on new data against a copy of a run that already pushed
a model, and must push one more model, leaving the earlier one intact. The
other cases are in test_reliability.py; a module of their own lets
pytest-xdist run them beside the rest."""

from __future__ import annotations

import pytest

from tests.pipelines.reliability_support import assert_behaves_as_documented, case_params


@pytest.mark.e2e
@pytest.mark.parametrize("case", case_params(proceeds=True))
def test_bad_input_behaves_as_documented(case, reliability_baseline, tmp_path):
    assert_behaves_as_documented(case, reliability_baseline, tmp_path)
