"""The output directory of a run: checked before use, locked, and logging to its file."""

from __future__ import annotations

import os
import tempfile

import pytest

from pipelines import rundir

# Root writes through directory permissions; the check then runs as this user.
NOBODY = 65534


def test_output_that_is_a_file_is_refused_naming_it(tmp_path):
    path = tmp_path / "results.txt"
    path.write_text("keep me")
    with pytest.raises(
        rundir.OutputDirError,
        match=rf"--output: '{path}' is a file, not a directory; pass --output a directory",
    ):
        rundir.check_output_dir(str(path))
    assert path.read_text() == "keep me"


def test_output_under_a_file_is_refused_naming_the_file(tmp_path):
    blocker = tmp_path / "runs"
    blocker.write_text("keep me")
    with pytest.raises(
        rundir.OutputDirError,
        match=rf"--output: cannot create '{blocker}/taxi/today': '{blocker}' is a file",
    ):
        rundir.check_output_dir(str(blocker / "taxi" / "today"))
    assert blocker.read_text() == "keep me"


def test_missing_output_is_created(tmp_path):
    path = tmp_path / "a" / "b"
    assert rundir.check_output_dir(str(path)) == str(path)
    assert path.is_dir() and list(path.iterdir()) == []


def _check_as_unprivileged(path: str) -> str:
    """`check_output_dir(path)`'s error in a forked child that cannot bypass
    permissions (it drops to `nobody` when the tests run as root)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: plain system calls only, then _exit
        os.close(read)
        try:
            if os.geteuid() == 0:
                os.setgid(NOBODY)
                os.setuid(NOBODY)
            rundir.check_output_dir(path)
            message = "no error"
        except BaseException as e:  # noqa: BLE001 - reported to the parent
            message = f"{type(e).__name__}: {e}"
        os.write(write, message.encode())
        os._exit(0)
    os.close(write)
    try:
        with os.fdopen(read, "rb") as f:
            return f.read().decode()
    finally:
        os.waitpid(pid, 0)


@pytest.mark.multiprocess
def test_unwritable_output_is_refused_naming_it_and_the_reason(tmp_path):
    # Reachable by the unprivileged child: pytest's base temp dir is 0700.
    top = tempfile.mkdtemp(prefix="tfxkit-ro-")
    readonly = os.path.join(top, "out")
    try:
        os.chmod(top, 0o755)
        os.mkdir(readonly)
        os.chmod(readonly, 0o555)
        message = _check_as_unprivileged(os.path.join(readonly, "run"))
    finally:
        os.chmod(readonly, 0o755)
        os.rmdir(readonly)
        os.rmdir(top)
    assert message.startswith(
        f"OutputDirError: --output: cannot write to '{readonly}/run' (permission denied"
    ), message
    assert message.endswith("pass --output a directory you can write to (it is created if missing)")


def test_log_to_file_takes_file_descriptors_and_gives_them_back(tmp_path, capfd):
    with rundir.log_to_file(str(tmp_path)) as run_log:
        os.write(1, b"library noise on stdout\n")
        os.write(2, b"library noise on stderr\n")
        print("progress line", file=run_log.out)
        print("a warning that matters", file=run_log.err)
        with rundir.log_to_file(str(tmp_path / "inner")) as inner:
            assert inner is run_log  # nested runs share the outer log
    os.write(1, b"after\n")
    captured = capfd.readouterr()
    assert captured.out == "progress line\nafter\n"
    assert captured.err == "a warning that matters\n"
    log = (tmp_path / rundir.LOG_NAME).read_text()
    assert "library noise on stdout\n" in log and "library noise on stderr\n" in log
    assert "progress line" not in log
    assert run_log.path == str(tmp_path / rundir.LOG_NAME)


def test_log_to_file_starts_a_new_log_each_run(tmp_path):
    for text in (b"first run\n", b"second run\n"):
        with rundir.log_to_file(str(tmp_path)):
            os.write(2, text)
    assert (tmp_path / rundir.LOG_NAME).read_text() == "second run\n"


def test_exclusive_run_is_reentrant_in_one_process(tmp_path):
    with rundir.exclusive_run(str(tmp_path)):
        with rundir.exclusive_run(str(tmp_path)):
            pass
        # Still held by the outer context after the inner one ended.
        assert str(tmp_path) in rundir._HELD
    assert str(tmp_path) not in rundir._HELD


def test_a_full_disk_is_named_with_the_component_the_path_and_the_fix(tmp_path):
    # As the Beam runner re-raises TensorFlow's error from a Transform worker.
    path = tmp_path / "pipeline_root" / "Transform" / "transform_graph" / "7" / "saved_model.pb"
    error = RuntimeError(
        f"tensorflow.python.framework.errors_impl.ResourceExhaustedError: {path}; "
        "No space left on device [while running 'Analyze/CreateSavedModel']"
    )
    message = rundir.disk_full_error(error, "Transform", str(tmp_path / "Transform"))
    assert message.startswith(
        f"Transform ran out of disk space (No space left on device) writing '{path}'; "
    )
    assert " free on that file system now. " in message
    assert message.endswith(
        "Free space on that file system, or pass --output a directory on a file system with "
        "room, and run again"
    )


def test_a_full_disk_from_python_os_error_in_the_cause_chain_is_named(tmp_path):
    try:
        try:
            raise OSError(28, "No space left on device", str(tmp_path / "part-0"))
        except OSError as e:
            raise RuntimeError("pipeline step failed") from e
    except RuntimeError as e:
        error = e
    message = rundir.disk_full_error(error, "Trainer", str(tmp_path))
    assert (
        f"Trainer ran out of disk space (No space left on device) writing '{tmp_path / 'part-0'}'"
        in message
    )
    # Without a path in the error, the component's output root is named.
    message = rundir.disk_full_error(OSError(28, "No space left on device"), None, str(tmp_path))
    assert message.startswith(
        f"the run ran out of disk space (No space left on device) (its outputs go under '{tmp_path}')"
    )


def test_other_failures_are_not_called_a_full_disk(tmp_path):
    error = RuntimeError("ValueError: label 'big_tipper' takes values in [0, 2]")
    assert rundir.disk_full_error(error, "DataGate", str(tmp_path)) is None


@pytest.mark.parametrize(
    "n, text",
    [
        (0, "0 B"),
        (1023, "1023 B"),
        (1024, "1.0 KiB"),
        (128 * 1024, "128.0 KiB"),
        (3 * 1024**2 // 2, "1.5 MiB"),
        (5 * 1024**3, "5.0 GiB"),
        (2048 * 1024**3, "2048.0 GiB"),
    ],
)
def test_free_space_reads_in_the_largest_unit_below_1024(n, text):
    assert rundir._human_bytes(n) == text


@pytest.fixture
def source_tree(tmp_path):
    """A git work tree shaped like the product's checkout: `runs/` ignored."""
    import subprocess

    tree = tmp_path / "checkout"
    (tree / "components").mkdir(parents=True)
    (tree / ".gitignore").write_text("runs/\n")
    subprocess.run(["git", "init", "-q", str(tree)], check=True)
    return tree


def test_an_output_inside_the_source_tree_is_refused_unless_git_ignores_it(source_tree, tmp_path):
    inside = source_tree / "components" / "out"
    with pytest.raises(
        rundir.OutputDirError,
        match=rf"^--output: '{inside}' is inside the tfxkit source tree '{source_tree}' and not "
        r"ignored by git: .*; use the default runs/ or a directory outside the source tree$",
    ):
        rundir._refuse_the_source_tree(str(inside), str(source_tree))
    assert not inside.exists()
    # The ignored runs/ (make run's default) and any directory outside are fine.
    rundir._refuse_the_source_tree(str(source_tree / "runs" / "taxi"), str(source_tree))
    rundir._refuse_the_source_tree(str(tmp_path / "elsewhere"), str(source_tree))


def test_the_real_checkout_refuses_its_sources_and_takes_runs():
    if not os.path.exists(os.path.join(rundir.SOURCE_TREE, ".git")):
        pytest.skip("not running from a git checkout of tfxkit")
    with pytest.raises(rundir.OutputDirError, match="inside the tfxkit source tree"):
        rundir.check_output_dir(os.path.join(rundir.SOURCE_TREE, "components", "no-such-run"))
    assert not os.path.exists(os.path.join(rundir.SOURCE_TREE, "components", "no-such-run"))
    rundir._refuse_the_source_tree(os.path.join(rundir.SOURCE_TREE, "runs", "x"))
