"""`testkit/fresh_process.py`: a child's result read back, and a failed child named."""

from __future__ import annotations

import pytest

from testkit import fresh_process


def test_the_last_result_line_is_returned_and_other_output_ignored():
    child = (
        "from testkit import fresh_process; print('building a wheel'); "
        "fresh_process.print_result({'a': 0}); fresh_process.print_result({'a': 1, 'b': [2]})"
    )
    assert fresh_process.run(["-c", child], "the child") == {"a": 1, "b": [2]}


@pytest.mark.parametrize(
    "child, exit_code",
    [("import sys; sys.exit(3)", 3), ("print('no result')", 0)],
)
def test_a_failed_or_silent_child_is_named(child, exit_code):
    with pytest.raises(SystemExit, match=rf"stock run 2 failed \(exit {exit_code}\)"):
        fresh_process.run(["-c", child], "stock run 2")
