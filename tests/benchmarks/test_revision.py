"""`benchmarks/revision.py`: the key of a long benchmark's saved runs, and when its
results may be written."""

from __future__ import annotations

import subprocess

import pytest

from benchmarks import revision
from testkit import results as results_lib


def _git(root, *args):
    subprocess.run(["git", *args], cwd=root, check=True, capture_output=True)


def _commit(root, message):
    _git(root, "add", "-A")
    _git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", message)


@pytest.fixture
def repo(tmp_path):
    root = tmp_path / "repo"
    (root / "components" / "testing").mkdir(parents=True)
    (root / "components" / "core.py").write_text("X = 1\n")
    (root / "components" / "testing" / "helper.py").write_text("H = 1\n")
    (root / "requirements.lock").write_text("tensorflow==2.16.2\n")
    _git(root, "init", "-q")
    _commit(root, "code")
    return root


CODE = revision.Code(
    ("components", "requirements.lock"),
    not_training=("components/testing",),
    files=("requirements.lock",),
)


def test_the_key_follows_the_code_not_the_commit_and_uncommitted_code_gets_a_new_name(repo):
    trees = CODE.trees(str(repo))
    assert set(trees) == {"components/core.py", "requirements.lock"}
    key = revision.revision_key(trees, dirty=False)
    assert "-dirty-" not in key
    # Docs and test helpers are not code the models depend on: same key.
    (repo / "README.md").write_text("notes\n")
    (repo / "components" / "testing" / "helper.py").write_text("H = 2\n")
    assert CODE.changes(str(repo)) == []
    _commit(repo, "docs and a helper")
    assert CODE.trees(str(repo)) == trees
    # A change to the product, uncommitted, then committed.
    (repo / "components" / "core.py").write_text("X = 2\n")
    assert CODE.changes(str(repo)) == ["components/core.py"]
    first, second = (revision.revision_key(trees, dirty=True) for _ in range(2))
    assert first.startswith(key + "-dirty-") and first != second
    _commit(repo, "product")
    assert revision.revision_key(CODE.trees(str(repo)), dirty=False) != key
    assert "-dirty-" in revision.revision_key({"components": None}, dirty=False)


def test_results_are_written_only_for_a_run_begun_on_committed_code_left_unchanged(repo):
    started, trees = results_lib.commit(str(repo)), CODE.trees(str(repo))
    key = revision.revision_key(trees, dirty=False)
    revision.check_writable(key, started, trees, CODE, str(repo))  # unchanged: written
    dirty = revision.revision_key(trees, dirty=True)
    with pytest.raises(revision.CodeChanged, match="uncommitted changes when the benchmark"):
        revision.check_writable(dirty, started, trees, CODE, str(repo))
    # HEAD moved during the run (the code too).
    (repo / "components" / "core.py").write_text("X = 3\n")
    _commit(repo, "moved on")
    with pytest.raises(revision.CodeChanged, match=r"started at [0-9a-f]{40}\); nothing is"):
        revision.check_writable(key, started, trees, CODE, str(repo))


def test_runs_resume_across_commits_that_keep_the_code_and_never_reuse_other_code():
    trees = {"components/config": "a" * 40, "requirements.lock": "b" * 40}
    key = revision.revision_key(trees, dirty=False)
    assert revision.revision_key(dict(trees), dirty=False) == key
    changed = revision.revision_key({**trees, "components/config": "c" * 40}, dirty=False)
    assert changed != key
    first, second = (
        revision.revision_key(trees, dirty=True),
        revision.revision_key(trees, dirty=True),
    )
    assert first.startswith(key + "-dirty-") and first != second
    assert "-dirty-" in revision.revision_key({**trees, "requirements.lock": None}, dirty=False)
    assert "-dirty-" in revision.revision_key({}, dirty=False)


def test_results_are_refused_when_the_code_changed_during_the_run():
    started = {"commit": "a" * 40, "dirty": False, "dirty_files": []}
    trees = {"components/config": "b" * 40}
    revision.check_unchanged(started, trees, dict(started), dict(trees))
    for now, now_trees in (
        ({**started, "commit": "c" * 40}, trees),
        ({**started, "dirty": True, "dirty_files": ["benchmarks/other.py"]}, trees),
        (started, {"components/config": "d" * 40}),
    ):
        with pytest.raises(revision.CodeChanged, match=r"started at a{40}\); nothing is written"):
            revision.check_unchanged(started, trees, now, now_trees)
