"""`benchmarks/revision.py`: the key of a long benchmark's saved runs, and when its
results may be written."""

from __future__ import annotations

import subprocess

from benchmarks import revision


def _git(root, *args):
    subprocess.run(["git", *args], cwd=root, check=True, capture_output=True)


def _commit(root, message):
    _git(root, "add", "-A")
    _git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", message)
    return subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=root, check=True, capture_output=True, text=True
    ).stdout.strip()


def test_a_clean_tree_is_keyed_by_its_commit_and_uncommitted_code_by_a_new_name(tmp_path):
    root = tmp_path / "repo"
    (root / "components").mkdir(parents=True)
    (root / "components" / "core.py").write_text("X = 1\n")
    _git(root, "init", "-q")
    head = _commit(root, "code")
    assert revision.run_key(str(root)) == head[:12]
    # Results files and docs are not code; a change to the product is.
    (root / "README.md").write_text("notes\n")
    assert revision.run_key(str(root)) == head[:12]
    (root / "components" / "core.py").write_text("X = 2\n")
    first, second = revision.run_key(str(root)), revision.run_key(str(root))
    assert first.startswith("dirty-") and second.startswith("dirty-") and first != second
    committed = _commit(root, "change")
    assert revision.run_key(str(root)) == committed[:12]


def test_results_are_written_only_for_a_run_one_clean_commit_trained():
    assert revision.why_unwritable("f79c2c8212f2", "f79c2c8212f2") == ""
    assert revision.why_unwritable("f79c2c8212f2", "58aaa9e00000") == (
        "HEAD moved from f79c2c8212f2 to 58aaa9e00000 during the run"
    )
    assert "uncommitted" in revision.why_unwritable("dirty-1", "dirty-2")
